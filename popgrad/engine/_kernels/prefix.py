"""Numba kernels of the prefix engine, the default exact engine of single-parent tasks (DESIGN §4, §10).

:func:`loss_grad_prefix` (+ ``_serial`` twin, one body) enumerates the tree of prefixes
depth first and computes what depends on ``s_0 … s_d`` once per prefix; the
algorithm, its block/slot structure and why it is fused are described in
:mod:`popgrad.engine.single`. :func:`exp_tables` builds its per-call
exponential tables. The per-block slots are summed in block order by
:func:`popgrad.engine._kernels.single.sum_slots` (thread-count independent).
``cache=True``, never ``fastmath``; hot loops written out inline.
"""
import numpy as np
from numba import njit, prange

from .numeric import TINY, fast_log
from .twins import twins


# ---------------------------------------------------------------------------
# The prefix engine
# ---------------------------------------------------------------------------
@njit(cache=True, error_model="numpy")
def exp_tables(P, A2, dig, X, Xg):
    """Fill the layer-2 exponential tables of :func:`loss_grad_prefix`.

    ``X[j, b, q, i] = exp(P[i, j] (A2[q, b] - m_q))`` with ``m_q = max_b A2[q, b]``
    (entries ``j > i`` are 1), and for the ``h = dig.shape[0]`` batched
    positions ``Lh … T-2`` (``Lh = T-1-h``) and each leaf group ``g < S**h`` (the
    base-``S`` digits ``dig[:, g]`` of those positions)::

        Xg[q, t, g] = Π_{t' ≤ min(t, h-1)} X[Lh+t', dig[t', g], q, Lh+t]   (t < h: row Lh+t)
        Xg[q, h, g] = Π_{t' < h} X[Lh+t', dig[t', g], q, T-1] · X[T-1, q, q, T-1]   (the query row)

    products in increasing ``t'``. Padding groups ``g ≥ S**h`` get
    ``Xg = 0`` except ``Xg[q, h, g] = 1`` (a positive softmax normaliser;
    their weights are zero).
    """
    T = P.shape[0]
    S = A2.shape[0]
    h = dig.shape[0]
    n_valid = S**h
    NG = Xg.shape[2]
    Lh = T - 1 - h
    for q in range(S):
        m = A2[q, 0]
        for b in range(1, S):
            if A2[q, b] > m:
                m = A2[q, b]
        for j in range(T):
            for b in range(S):
                d = A2[q, b] - m
                for i in range(T):
                    X[j, b, q, i] = np.exp(P[i, j] * d) if j <= i else 1.0
    for q in range(S):
        for t in range(h + 1):
            i = Lh + t
            for g in range(NG):
                if g >= n_valid:
                    Xg[q, t, g] = 1.0 if t == h else 0.0
                    continue
                prod = 1.0
                for t2 in range(min(t, h - 1) + 1):
                    prod *= X[Lh + t2, dig[t2, g], q, i]
                if t == h:
                    prod *= X[T - 1, q, q, T - 1]
                Xg[q, t, g] = prod


def _loss_grad_prefix_body(parents, fac, pk0, wtab, Q, ctx_pos, X, Xg, mask, dig, ofac, P, A2, eps, prefixes, order,
                     sym, Wc, bstart, wmode, want_grad, loss_out, G_out, dA2_out):
    """Prefix-sharing forward/backward with vectorized leaf batches: ``O(S + K)`` work per sequence.

    Enumerates the tree of prefixes depth first (position 0 outermost).
    Block ``b`` fixes positions ``0 … D-1`` to ``prefixes[b]``
    (``D = prefixes.shape[1]``); blocks run in the order ``order`` (a
    permutation balancing the threads; each block writes its own slot, so
    the order never changes a bit). The last ``h`` non-query positions
    ``Lh … T-2`` and the query are not enumerated one by one: below each node
    at depth ``Lh-1`` (a *batch node*) all ``NG ≥ S**h`` leaf groups ``g``
    and all queries are processed together in loops over ``g`` that LLVM
    vectorizes.

    Prefix part (positions ``< Lh``), once per prefix, when ``s_d`` is set:

    * per-atom weight products ``p_k ← p_k · fac[d, s_{p(d)}, s_d, k]``;
    * the layer-2 exponentials as running products over keys,
      ``e[q, i] = exp(u_i(q) - m_q) = Π_{j≤i} X[j, s_j, q, i]``, so
      ``e ∈ [exp(-range_q), 1]`` and no ``exp`` runs in the loop (the caller
      keeps ``range_q ≤ 500``);
    * running sums ``Z_d[q] = Σ_{i≤d} e[q, i]`` and
      ``F_d[q, c] = Σ_{i≤d} e[q, i] [s_i = c]``.

    Batch node (:func:`_batch_leaves`): the weights of its leaf groups,
    ``W[q·S+c, g] = Σ_k p_k · Q[ctx, k, g] · π_k(c | q)``
    (:func:`_prefix_batch_weights`; times ``ofac[m, q, g]`` when ``sym``),
    the exponentials of the batched rows ``E[q, t, g] = e[q, Lh+t] ·
    Xg[q, t, g]`` (:func:`exp_tables`), then per leaf ``Z``, ``f``, the
    loss, ``r_c``, ``r̄`` and ``B[q, c, g] = (r_c - r̄)/Z``, and the
    per-row sums ``δ_i = E · B[q, s_i]`` of the batched rows
    (``mask[t, c, g] = [s_{Lh+t} = c]``, and ``s_{T-1} = q``), accumulated per group into
    ``Dacc`` and contracted once per block into ``H``.

    Backward for the prefix rows: for a node at depth ``d`` and rows ``i ≤ d``,
    ``Σ_subtree δ_i = e[q, i] · B_d[q, s_i]`` with ``B_d[q, c] = Σ_subtree
    (r_c - r̄)/Z`` (``S²`` numbers), and rows ``i > d`` are kept in full
    (``R_d[q, i]``). When a node is complete it adds ``Σ_subtree δ_i`` to
    ``H[i, d, q, s_d]``, where ``H[i, j, q, b] = Σ_s δ_i(s) [s_{T-1} = q][s_j = b]``;
    at the end of the block ``G[i, j] = Σ_{q,b} A2[q, b] H[i, j, q, b]`` and
    ``dA2[q, b] = Σ_{j≤i} P[i, j] H[i, j, q, b]``: DESIGN §4, summed.

    ``sym``: the odometer over positions ``D … Lh-1`` only visits canonical
    prefixes (``s_d ≤ 1 + max(s_0 … s_{d-1})``), and the leaf weights are
    multiplied by ``ofac[m, q, g]`` = the orbit size ``S!/(S-m')!`` of the
    whole sequence (``m'`` distinct tokens), or 0 if it is not canonical
    (``m`` = distinct tokens of the prefix ``s_0 … s_{Lh-1}``).

    Parameters
    ----------
    parents : int64 (T,)
    fac : float64 (T-1, S, S, K)
        ``fac[d, a, b, k]`` = ``μ_k(b)`` if ``d`` is a root, else ``π_k(b | a)``.
    pk0 : float64 (K,)
        ``prior_w / S``.
    wtab : float64 (K, S·S)
        ``wtab[k, q·S + c] = π_k(c | q)``.
    Q : float64 (S**n_ctx, K, NG)
        Weight factors of the batched positions:
        ``Q[ctx, k, g] = Π_t fac[Lh+t, a_t, g_t, k]`` (``g_t`` the digits of
        ``g``, ``a_t`` the parent's token, from ``g`` or from ``ctx``); zero
        for padding groups ``g ≥ S**h``.
    ctx_pos : int64 (n_ctx,)
        Prefix positions (``< Lh``) that are parents of batched positions;
        their tokens, as a base-``S`` number, index ``Q``.
    X : float64 (T, S, S, T), Xg : float64 (S, h+1, NG)
        From :func:`exp_tables`.
    mask : float64 (h, S, NG)
        ``mask[t, c, g] = [digit t of g = c]``; zero for padding groups.
    dig : int64 (h, NG)
        ``dig[t, g]`` = digit ``t`` of ``g`` (most significant first); 0 for padding groups.
    ofac : float64 (S+1, S, NG)
        Orbit factors (used when ``sym``).
    P : float64 (T, T)
    A2 : float64 (S, S)
    eps : float
    prefixes : int64 (n_blocks, D)
    order : int64 (n_blocks,)
    sym : bool
    Wc : float64 (n_batch, S·S, NG)
        Weight cache: the ``W`` of every batch node, in visiting order
        (block ``b`` starts at ``bstart[b]``). ``wmode`` 0: compute ``W``
        (``Wc`` unused), 1: compute and store it, 2: read it. The weights do
        not depend on ``A1``, ``A2``, so a training loop computes them once.
    bstart : int64 (n_blocks,)
    wmode : int
    want_grad : bool
    loss_out, G_out, dA2_out : float64 (n_blocks,), (n_blocks, T, T), (n_blocks, S, S)
        Zero on entry; one slot per block.
    """
    for t in prange(order.shape[0]):
        blk = order[t]
        loss_out[blk] = _prefix_block(blk, parents, fac, pk0, wtab, Q, ctx_pos, X, Xg, mask, dig, ofac, P, A2,
                                      eps, prefixes, sym, Wc, bstart, wmode, want_grad, G_out[blk], dA2_out[blk])


loss_grad_prefix, loss_grad_prefix_serial = twins(_loss_grad_prefix_body)


@njit(cache=True, error_model="numpy")
def _prefix_block(blk, parents, fac, pk0, wtab, Q, ctx_pos, X, Xg, mask, dig, ofac, P, A2, eps, prefixes, sym,
                  Wc, bstart, wmode, want_grad, G, dA2):
    """One block of :func:`loss_grad_prefix`; returns its loss, fills ``G``, ``dA2``.

    The per-prefix state update and the subtree closure are written inline
    (not as calls): numba reference-counts array arguments of every call,
    which costs more than the arithmetic there.
    """
    T = P.shape[0]
    S = A2.shape[0]
    K = pk0.shape[0]
    L = T - 1
    h1 = Xg.shape[1]
    NG = Xg.shape[2]
    h = h1 - 1
    Lh = L - h  # first batched position; prefix positions are 0 .. Lh-1
    D = prefixes.shape[1]
    s = np.zeros(T, dtype=np.int64)
    for t in range(D):
        s[t] = prefixes[blk, t]
    # prefix state, index d+1 = after setting s_d
    pm = np.empty(Lh + 1, dtype=np.int64)  # pm[d] = max(s_0 .. s_{d-1}), -1 for d = 0
    pm[0] = -1
    pk = np.empty((Lh + 1, K))
    ep = np.empty((Lh + 1, S, T))
    Zp = np.zeros((Lh + 1, S))
    Fp = np.zeros((Lh + 1, S, S))
    for k in range(K):
        pk[0, k] = pk0[k]
    ep[0, :, :] = 1.0
    nb = max(Lh, 1)
    B = np.zeros((nb, S, S))
    R = np.zeros((nb, S, T))
    H = np.zeros((T, T, S, S))
    # batch work arrays
    Wb = np.empty((S * S, NG))
    bi = bstart[blk]  # index of the next batch node in the weight cache Wc
    work = np.empty((h1 + 3 * S + 4, NG))
    lacc = np.zeros(NG)
    Dacc = np.zeros((S, h1, NG))
    d_set = 0
    while True:
        # ---- prefix state for depths d_set .. Lh-1
        for d in range(d_set, Lh):
            b = s[d]
            pm[d + 1] = pm[d] if pm[d] >= b else b
            par = parents[d]
            a = s[par] if par >= 0 else 0
            for k in range(K):
                pk[d + 1, k] = pk[d, k] * fac[d, a, b, k]
            for q in range(S):
                for i in range(d, T):
                    ep[d + 1, q, i] = ep[d, q, i] * X[d, b, q, i]
                e = ep[d + 1, q, d]
                Zp[d + 1, q] = Zp[d, q] + e
                for c in range(S):
                    Fp[d + 1, q, c] = Fp[d, q, c]
                Fp[d + 1, q, b] += e
        # ---- the batch node: all leaf groups and queries below s_0 .. s_{Lh-1}
        if wmode == 2:  # weights cached by an earlier call (they depend on the task only)
            W = Wc[bi]
        else:
            W = Wb
            _prefix_batch_weights(S, Lh, s, ctx_pos, pk, wtab, Q, W)
            if sym:
                m = pm[Lh] + 1
                for qc in range(S * S):
                    q = qc // S
                    for g in range(NG):
                        W[qc, g] *= ofac[m, q, g]
            if wmode == 1:
                Wc[bi, :, :] = W
        bi += 1
        _batch_leaves(S, Lh, eps, want_grad, ep, Zp, Fp, W, Xg, mask, dig, work, lacc, Dacc, B, R)
        # ---- advance the odometer over positions D .. Lh-1
        d_set = Lh - 1
        while d_set >= D:
            lim = S - 1
            if sym and pm[d_set] + 1 < lim:
                lim = pm[d_set] + 1
            if s[d_set] < lim:
                break
            d_set -= 1
        done = d_set < D
        if want_grad:
            # close the completed nodes (all of them, ancestors too, when the block is done)
            stop = 0 if done else d_set
            for d in range(Lh - 1, stop - 1, -1):
                b = s[d]
                for q in range(S):
                    y = ep[d + 1, q, d] * B[d, q, b]
                    H[d, d, q, b] += y
                    for i in range(d + 1, T):
                        H[i, d, q, b] += R[d, q, i]
                    if d >= 1:
                        R[d - 1, q, d] += y
                        for i in range(d + 1, T):
                            R[d - 1, q, i] += R[d, q, i]
                        for c in range(S):
                            B[d - 1, q, c] += B[d, q, c]
                    for c in range(S):
                        B[d, q, c] = 0.0
                    for i in range(d + 1, T):
                        R[d, q, i] = 0.0
        if done:
            break
        s[d_set] += 1
        for d in range(d_set + 1, Lh):
            s[d] = 0
    loss = 0.0
    for g in range(NG):
        loss += lacc[g]
    if want_grad:
        # rows and columns of the batched positions, from the per-group sums Dacc
        n_valid = S**h
        for q in range(S):
            for t in range(h1):
                i = Lh + t
                for t2 in range(min(t, h - 1) + 1):
                    j = Lh + t2
                    for g in range(n_valid):
                        H[i, j, q, dig[t2, g]] += Dacc[q, t, g]
            tot = 0.0
            for g in range(NG):
                tot += Dacc[q, h, g]
            H[T - 1, T - 1, q, q] += tot
        # contract H into G = ∂L/∂P and dA2
        for i in range(T):
            for j in range(i + 1):
                gij = 0.0
                pij = P[i, j]
                for q in range(S):
                    for b in range(S):
                        hv = H[i, j, q, b]
                        gij += A2[q, b] * hv
                        dA2[q, b] += pij * hv
                G[i, j] = gij
    return loss


@njit(cache=True, error_model="numpy")
def _batch_leaves(S, Lh, eps, want_grad, ep, Zp, Fp, W, Xg, mask, dig, work, lacc, Dacc, B, R):
    """Forward and backward of every leaf below one batch node (see :func:`loss_grad_prefix`).

    Loops run over the group axis ``g`` (length ``NG``, a multiple of
    :data:`LANES`) with element-wise bodies, so LLVM vectorizes them; sums
    over ``g`` use :data:`LANES` accumulators added pairwise at the end (a
    fixed order). Adds the loss to ``lacc[g]``, the batched rows' ``δ`` to
    ``Dacc[q, t, g]``, and writes ``B[Lh-1]`` and ``R[Lh-1, :, Lh:]`` for
    the closure of the batch node (when ``Lh ≥ 1``).
    """
    h1 = Xg.shape[1]
    NG = Xg.shape[2]
    h = h1 - 1
    fast = eps >= TINY
    E = work[0:h1]
    Fg = work[h1:h1 + S]
    Rg = work[h1 + S:h1 + 2 * S]
    Xe = work[h1 + 2 * S:h1 + 3 * S]
    Zg = work[h1 + 3 * S]
    invZ = work[h1 + 3 * S + 1]
    rbar = work[h1 + 3 * S + 2]
    tmp = work[h1 + 3 * S + 3]
    for q in range(S):
        # forward: exponentials of the batched rows, normaliser, output numerators
        for t in range(h1):
            ev = ep[Lh, q, Lh + t]
            for g in range(NG):
                E[t, g] = ev * Xg[q, t, g]
        z0 = Zp[Lh, q]
        for g in range(NG):
            Zg[g] = z0
        for t in range(h1):
            for g in range(NG):
                Zg[g] += E[t, g]
        for g in range(NG):
            invZ[g] = 1.0 / Zg[g]
            rbar[g] = 0.0
        for c in range(S):
            f0 = Fp[Lh, q, c]
            for g in range(NG):
                Fg[c, g] = f0
            for t in range(h):
                for g in range(NG):
                    Fg[c, g] += E[t, g] * mask[t, c, g]
            if c == q:  # the query position holds token q
                for g in range(NG):
                    Fg[c, g] += E[h, g]
            qc = q * S + c
            for g in range(NG):
                f = Fg[c, g] * invZ[g]
                Fg[c, g] = f
                Xe[c, g] = f + eps
            if fast:  # f + ε is a positive normal number: no branch, fast_log
                for g in range(NG):
                    x = Xe[c, g]
                    w = W[qc, g]
                    lacc[g] -= w * fast_log(x)
                    rr = -w / x
                    Rg[c, g] = rr
                    rbar[g] += Fg[c, g] * rr
            else:  # ε = 0 (or subnormal): terms with w = 0 skipped, log 0 = -inf
                for g in range(NG):
                    x = Xe[c, g]
                    w = W[qc, g]
                    if w != 0.0:
                        lacc[g] -= w * np.log(x)
                        rr = -w / x
                    else:
                        rr = 0.0
                    Rg[c, g] = rr
                    rbar[g] += Fg[c, g] * rr
        if not want_grad:
            continue
        # backward: B[c, g] = (r_c - r̄) / Z, summed over g for the batch node
        for c in range(S):
            for g in range(NG):
                Rg[c, g] = (Rg[c, g] - rbar[g]) * invZ[g]
            if Lh > 0:
                B[Lh - 1, q, c] = _sum_lanes(Rg[c])
        # δ of the batched rows: E[t, g] · B[s_{Lh+t}, g]
        for t in range(h1):
            if t < h:  # gather B at the token of position Lh+t
                for g in range(NG):
                    tmp[g] = E[t, g] * Rg[dig[t, g], g]
            else:  # the query row: token q
                for g in range(NG):
                    tmp[g] = E[t, g] * Rg[q, g]
            for g in range(NG):
                Dacc[q, t, g] += tmp[g]
            if Lh > 0:
                R[Lh - 1, q, Lh + t] = _sum_lanes(tmp)


@njit(cache=True, inline="always")
def _sum_lanes(x):
    """``Σ x`` over a length that is a multiple of 8, in a fixed order: 8 running sums (one per
    SIMD lane, so the loop vectorizes without reassociation) added pairwise at the end."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    for g0 in range(0, x.shape[0], 8):
        a0 += x[g0]
        a1 += x[g0 + 1]
        a2 += x[g0 + 2]
        a3 += x[g0 + 3]
        a4 += x[g0 + 4]
        a5 += x[g0 + 5]
        a6 += x[g0 + 6]
        a7 += x[g0 + 7]
    return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))


@njit(cache=True, error_model="numpy")
def _prefix_batch_weights(S, Lh, s, ctx_pos, pk, wtab, Q, W):
    """Weights of the leaf groups below the current node at depth ``Lh-1``.

    ``W[q·S + c, g] = Σ_k p_k(s_0 … s_{Lh-1}) · Q[ctx, k, g] · π_k(c | q)``
    (atoms in increasing ``k``), where leaf group ``g`` sets positions
    ``Lh … T-2`` to the base-``S`` digits of ``g`` and ``Q[ctx, k, g]`` is
    the product of their weight factors given the tokens ``ctx`` at the
    prefix positions ``ctx_pos`` that are parents of batched positions. The
    inner loop runs over ``g`` and vectorizes.
    """
    S2, n_groups = W.shape
    ctx = 0
    for m in range(ctx_pos.shape[0]):
        ctx = ctx * S + s[ctx_pos[m]]
    for qc in range(S2):
        for gi in range(n_groups):
            W[qc, gi] = 0.0
    for k in range(pk.shape[1]):
        pkk = pk[Lh, k]
        for qc in range(S2):
            p = wtab[k, qc] * pkk
            for gi in range(n_groups):
                W[qc, gi] += p * Q[ctx, k, gi]
