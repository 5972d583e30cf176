"""Numba kernels. Each has a plain-NumPy reference next to the public API.

Kernels take clean, contiguous float64 / int64 arrays and trust them; the
public functions validate. ``cache=True`` everywhere, never ``fastmath``;
``error_model="numpy"`` where a division by zero must give ``inf`` (the
``ε = 0`` loss) instead of raising -- and in every hot loop, because the
``"python"`` error model's zero-divisor check keeps LLVM from vectorizing a
loop that divides.

Contents

* exact weights live with the task (:mod:`popgrad.task._weights`);
* exact loss and gradient: the prefix engine (the default) is in
  :mod:`popgrad.engine._kernels.prefix`; here the direct engine's block
  :func:`_direct_block` (the fallback; its range entries are in
  :mod:`popgrad.engine._kernels.ranges`), :func:`sum_slots` and the per-call helpers
  :func:`attention`, :func:`finish_grad`, :func:`symmetrize_span`,
  :func:`span_kind`, :func:`row_range`, :func:`all_finite` (reference
  :func:`popgrad.engine.exact_loss_and_grad_numpy`). Why these engines and
  not BLAS: see :mod:`popgrad.engine`;
* :func:`loss_grad_rows`: the same per-sequence loss on given rows, for
  Monte-Carlo estimates (reference :func:`popgrad.engine._rows_loss_and_grad_numpy`);
* :func:`popgrad.engine._kernels.numeric.fast_log`: a vectorizable natural logarithm.

Both loss engines accept ``sym=True``: they then visit only the canonical
sequences of the token-relabeling orbits (first occurrences in the order
``0, 1, 2, …``) and multiply their weights by the orbit size
``S!/(S-m)!`` (``m`` distinct tokens); :mod:`popgrad.engine` decides when
that is exact (DESIGN §10) and symmetrizes ``dA2``.

Hot loops are written out inline rather than as calls to helper functions
taking arrays: numba reference-counts every array argument of a call
(atomic operations), which costs more than a few flops.

Enumeration order (shared by every kernel): sequence number ``m`` in
``0 .. S**T - 1`` is the base-``S`` numeral ``s_0 s_1 ... s_{T-1}`` with
position ``0`` the most significant digit, so position ``T-1`` (the query)
varies fastest: lexicographic order, ``itertools.product(range(S), repeat=T)``.

Towards ``k`` first-layer heads (multi-parent graphs, DESIGN §9): see
:mod:`popgrad.engine._kernels.multi` for why that engine needs a different prefix
decomposition; the block/slot structure and :func:`sum_slots` are shared.
"""
import numpy as np
from numba import njit, prange

from ...task._weights import decode_sequence, sequence_weight_row
from .numeric import mix_loss


@njit(cache=True)
def sum_slots(loss_out, G_out, dA2_out):
    """Sum the per-block slots in block order into slot 0; return the total loss.

    Sequential and in a fixed order, so the totals do not depend on which
    thread computed which block.
    """
    loss = loss_out[0]
    for b in range(1, loss_out.shape[0]):
        loss += loss_out[b]
        G_out[0] += G_out[b]
        dA2_out[0] += dA2_out[b]
    loss_out[0] = loss
    return loss


@njit(cache=True, inline="always")
def _sequence_scratch(S, T):
    """Scratch of :func:`_sequence_loss_grad`: ``V, u, a (T), f, r (S), dl (T)``."""
    return np.empty(T), np.empty(T), np.empty(T), np.empty(S), np.empty(S), np.empty(T)


@njit(cache=True, error_model="numpy")
def _direct_block(blk, parents, mu, atoms, prior_w, P, A2, eps, block_size, sym, orbit, want_grad, G, dA2):
    """One block of the direct engine (:func:`popgrad.engine._kernels.ranges.loss_grad_direct_range`);
    returns its loss, fills ``G``, ``dA2``."""
    T = P.shape[0]
    S = A2.shape[0]
    n_total = S**T
    start = blk * block_size
    stop = min(start + block_size, n_total)
    s = np.empty(T, dtype=np.int64)
    w = np.empty(S)
    V, u, a, f, r, dl = _sequence_scratch(S, T)
    loss = 0.0
    for m in range(start, stop):
        decode_sequence(m, S, T, s)
        mult = 1.0
        if sym:
            mx = -1
            canonical = True
            for t in range(T):
                if s[t] > mx + 1:
                    canonical = False
                    break
                if s[t] == mx + 1:
                    mx += 1
            if not canonical:
                continue
            mult = orbit[mx + 1]
        sequence_weight_row(s, parents, mu, atoms, prior_w, w)
        for c in range(S):
            w[c] *= mult
        loss += _sequence_loss_grad(s, w, P, A2, eps, want_grad, V, u, a, f, r, dl, G, dA2)
    return loss


@njit(cache=True, error_model="numpy", inline="always")
def _sequence_loss_grad(s, w, P, A2, eps, want_grad, V, u, a, f, r, dl, G, dA2):
    """Loss of one sequence ``s`` with target weights ``w`` (DESIGN §3–§4); adds its ``G``, ``dA2``.

    ``V, u, a, f, r, dl`` are scratch vectors (``T, T, T, S, S, T``). The
    layer-2 softmax is shifted by the per-sequence maximum (any finite
    ``A2``); terms with ``w_c = 0`` are skipped; a zero total weight adds
    nothing. ``want_grad``: false (loss only), true / 1 (``G`` and ``dA2``),
    2 (``dA2`` only: Stage 2, where ``A1`` is frozen).
    """
    T = P.shape[0]
    S = A2.shape[0]
    total = 0.0
    for c in range(S):
        total += w[c]
    if total == 0.0:
        return 0.0
    q = s[T - 1]
    for j in range(T):
        V[j] = A2[q, s[j]]
    umax = -np.inf
    for i in range(T):
        acc = 0.0
        for j in range(i + 1):
            acc += P[i, j] * V[j]
        u[i] = acc
        if acc > umax:
            umax = acc
    loss, rbar = mix_loss(0.0, s, u, umax, w, eps, a, f, r)
    if want_grad:
        for i in range(T):
            dl[i] = a[i] * (r[s[i]] - rbar)
        if want_grad != 2:
            for i in range(T):
                for j in range(i + 1):
                    G[i, j] += dl[i] * V[j]
        for j in range(T):
            e = 0.0
            for i in range(j, T):
                e += dl[i] * P[i, j]
            dA2[q, s[j]] += e
    return loss


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_rows(seqs, w, P, A2, eps, block_size, want_grad, loss_out, G_out, dA2_out):
    """The direct engine's per-sequence loss and gradient on given sequences ``seqs (n, T)`` with weights ``w (n, S)``.

    For Monte-Carlo estimates (:func:`popgrad.sampled_loss_and_grad`):
    block ``b`` covers rows ``b·block_size …``; one slot per block, summed in
    order by :func:`sum_slots` (independent of the thread count).
    """
    n_blocks = loss_out.shape[0]
    T = P.shape[0]
    S = A2.shape[0]
    n = seqs.shape[0]
    for blk in prange(n_blocks):
        V, u, a, f, r, dl = _sequence_scratch(S, T)
        loss = 0.0
        G = G_out[blk]
        dA2 = dA2_out[blk]
        for m in range(blk * block_size, min((blk + 1) * block_size, n)):
            loss += _sequence_loss_grad(seqs[m], w[m], P, A2, eps, want_grad, V, u, a, f, r, dl, G, dA2)
        loss_out[blk] = loss


@njit(cache=True, parallel=True, error_model="numpy")
def loss_rows_each(seqs, w, P, A2, eps, out):
    """``out[m]`` = the loss of sequence ``m`` alone (forward pass; one thread writes each entry)."""
    T = P.shape[0]
    S = A2.shape[0]
    n = seqs.shape[0]
    G = np.zeros((1, 1))
    dA2 = np.zeros((1, 1))
    for m in prange(n):
        V, u, a, f, r, dl = _sequence_scratch(S, T)
        out[m] = _sequence_loss_grad(seqs[m], w[m], P, A2, eps, 0, V, u, a, f, r, dl, G, dA2)


# ---------------------------------------------------------------------------
# Small per-call helpers (one call each instead of a dozen NumPy calls)
# ---------------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def attention(A1, P):
    """``P = softmax_rows(MASK(A1))`` (DESIGN §3) into ``P``.

    Reference :func:`popgrad.model.reduced.first_layer_attention`.
    """
    T = A1.shape[0]
    for i in range(T):
        m = A1[i, 0]
        for j in range(1, i + 1):
            if A1[i, j] > m:
                m = A1[i, j]
        z = 0.0
        for j in range(i + 1):
            e = np.exp(A1[i, j] - m)
            P[i, j] = e
            z += e
        for j in range(i + 1):
            P[i, j] = P[i, j] / z
        for j in range(i + 1, T):
            P[i, j] = 0.0


@njit(cache=True)
def finish_grad(G, P, dA1):
    """Layer-1 softmax Jacobian, once after the sum.

    ``dA1[i, j] = P[i, j] (G[i, j] - Σ_{k≤i} P[i, k] G[i, k])`` for ``j ≤ i``, else 0.
    """
    T = G.shape[0]
    for i in range(T):
        dot = 0.0
        for k in range(i + 1):
            dot += P[i, k] * G[i, k]
        for j in range(i + 1):
            dA1[i, j] = P[i, j] * (G[i, j] - dot)
        for j in range(i + 1, T):
            dA1[i, j] = 0.0


@njit(cache=True)
def symmetrize_span(D, out):
    """The average of ``σ D σᵀ`` over all relabelings ``σ``.

    ``out = (tr D / S) I + (Σ_{a≠b} D[a, b] / (S(S-1))) (11ᵀ - I)``.
    """
    S = D.shape[0]
    tr = 0.0
    off = 0.0
    for a in range(S):
        for b in range(S):
            if a == b:
                tr += D[a, b]
            else:
                off += D[a, b]
    d = tr / S
    o = off / (S * (S - 1))
    for a in range(S):
        for b in range(S):
            out[a, b] = d if a == b else o


@njit(cache=True)
def all_finite(M):
    """Whether every entry of the 2-D array ``M`` is finite."""
    for i in range(M.shape[0]):
        for j in range(M.shape[1]):
            if not np.isfinite(M[i, j]):
                return False
    return True


@njit(cache=True)
def row_range(A2):
    """``max_q (max_b A2[q, b] - min_b A2[q, b])``."""
    S = A2.shape[0]
    r = 0.0
    for q in range(S):
        lo = A2[q, 0]
        hi = A2[q, 0]
        for b in range(1, S):
            v = A2[q, b]
            if v < lo:
                lo = v
            if v > hi:
                hi = v
        if hi - lo > r:
            r = hi - lo
    return r


@njit(cache=True)
def span_kind(A2, rtol):
    """Whether ``A2 ∈ span{I, 11ᵀ}``: 0 no; 1 exactly; 2 within ``rtol · max|A2|``.

    (Equal diagonal entries and equal off-diagonal entries.)
    """
    S = A2.shape[0]
    d0 = A2[0, 0]
    o0 = A2[0, 1]
    exact = True
    dev = 0.0
    scale = 0.0
    for a in range(S):
        for b in range(S):
            v = A2[a, b]
            ref = d0 if a == b else o0
            if v != ref:
                exact = False
            dv = abs(v - ref)
            if dv > dev:
                dev = dv
            if abs(v) > scale:
                scale = abs(v)
    if exact:
        return 1
    return 2 if dev <= rtol * scale else 0
