"""Numba kernels. Each has a plain-NumPy reference next to the public API.

Kernels take clean, contiguous float64 / int64 arrays and trust them; the
public functions validate. ``cache=True`` everywhere, never ``fastmath``;
``error_model="numpy"`` where a division by zero must give ``inf`` (the
``ε = 0`` loss) instead of raising.

Contents: the exact weights (:func:`decode_sequence`,
:func:`sequence_weight_row`, :func:`chunk_weights`; reference
:func:`popgrad.task.sequence_weights_numpy`) and the exact loss and gradient
(:func:`loss_grad_prefix`, :func:`loss_grad_direct`, their ``_serial``
twins and :func:`sum_slots`; reference
:func:`popgrad.exact.exact_loss_and_grad_numpy`). Why two engines and why
no BLAS: see :mod:`popgrad.exact`.

Hot loops are written out inline rather than as calls to helper functions:
numba reference-counts every array argument of a call (atomic operations),
which here cost several times the arithmetic (measured: a 30-flop prefix
update took 85 ns as a call, 10 ns inline).

Towards ``k`` first-layer heads (multi-parent graphs, DESIGN §9): the
prefix engine only needs, per prefix, running products
``Π_j exp(score contribution of key j)`` and running sums over positions.
With heads the score of position ``i`` becomes a sum over heads of
``P_h[i, j]``-weighted token matches, which is still a sum over keys ``j``
of per-key terms, so the ``X`` table gains a head product and the "query"
index ``q`` becomes the tuple of the query position's copied parents
(``S**k`` values instead of ``S``); the block/slot structure, the weight
batching and the backward accumulation per subtree are unchanged.

Enumeration order (shared by every kernel): sequence number ``m`` in
``0 .. S**T - 1`` is the base-``S`` numeral ``s_0 s_1 ... s_{T-1}`` with
position ``0`` the most significant digit, so position ``T-1`` (the query)
varies fastest: lexicographic order, ``itertools.product(range(S), repeat=T)``.
"""
import numpy as np
from numba import njit, prange


@njit(cache=True)
def decode_sequence(index, S, T, out):
    """Write the tokens of sequence number ``index`` into ``out[:T]``."""
    for t in range(T - 1, -1, -1):
        out[t] = index % S
        index //= S


@njit(cache=True)
def sequence_weight_row(s, parents, mu, atoms, prior_w, out):
    """``out[c] = w(s, c)`` of DESIGN §2 for one sequence ``s``."""
    K, S, _ = atoms.shape
    T = s.shape[0]
    q = s[T - 1]
    for c in range(S):
        out[c] = 0.0
    for k in range(K):
        p = prior_w[k] / S
        for i in range(T - 1):
            par = parents[i]
            if par < 0:
                p *= mu[k, s[i]]
            else:
                p *= atoms[k, s[par], s[i]]
        if p != 0.0:
            for c in range(S):
                out[c] += p * atoms[k, q, c]


@njit(cache=True, parallel=True)
def chunk_weights(start, parents, mu, atoms, prior_w, seqs, w):
    """Fill ``seqs (n, T)`` and ``w (n, S)`` for sequences ``start .. start+n-1``.

    Parallel over sequences; every output row is written by one thread with
    a fixed summation order, so the result does not depend on the thread
    count.
    """
    n, T = seqs.shape
    S = atoms.shape[1]
    for m in prange(n):
        decode_sequence(start + m, S, T, seqs[m])
        sequence_weight_row(seqs[m], parents, mu, atoms, prior_w, w[m])


# ===========================================================================
# Exact population loss and gradient (DESIGN §3, §4, §10)
# ===========================================================================
#
# Two engines compute the same sums; ``popgrad.exact`` picks one and documents
# the choice. Both split the enumeration into a FIXED number of blocks (it
# depends on S and T only, never on the thread count), write each block's
# partial sums into its own slot, and :func:`sum_slots` adds the slots in
# block order: results are bit-identical for any ``NUMBA_NUM_THREADS``, and
# the ``_serial`` twins (same blocks, one thread, no thread-pool wake-up)
# give the same bits.
#
# Both return ``G = ∂L/∂P`` (the softmax Jacobian of layer 1 is applied once,
# by the caller, after summing), ``dA2`` and the loss.


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


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_direct(parents, mu, atoms, prior_w, P, A2, eps, block_size, want_grad,
                     loss_out, G_out, dA2_out):
    """Per-sequence fused forward/backward, ``O(T²)`` work per sequence.

    Block ``b`` covers sequence numbers ``b·block_size …`` (lexicographic);
    sequences and weights are decoded on the fly (:func:`decode_sequence`,
    :func:`sequence_weight_row`), nothing is materialized. The layer-2
    softmax is shifted by the per-sequence maximum, so any finite ``A2``
    is safe. Per sequence (DESIGN §3–§4)::

        u_i = Σ_{j≤i} P[i,j] A2[q,s_j],  a = softmax(u),  f_c = Σ_i a_i [s_i = c]
        loss   += -Σ_c w_c log(f_c + ε)            (terms with w_c = 0 skipped)
        r_c     = -w_c / (f_c + ε),  r̄ = Σ_c f_c r_c,  δ_i = a_i (r_{s_i} - r̄)
        G[i,j] += δ_i A2[q, s_j]   (j ≤ i)
        dA2[q, s_j] += Σ_{i≥j} δ_i P[i, j]

    Outputs (one slot per block, zero on entry): ``loss_out (n_blocks,)``,
    ``G_out (n_blocks, T, T)``, ``dA2_out (n_blocks, S, S)``.
    """
    n_blocks = loss_out.shape[0]
    for blk in prange(n_blocks):
        loss_out[blk] = _direct_block(blk, parents, mu, atoms, prior_w, P, A2, eps, block_size, want_grad,
                                      G_out[blk], dA2_out[blk])


@njit(cache=True, error_model="numpy")
def loss_grad_direct_serial(parents, mu, atoms, prior_w, P, A2, eps, block_size, want_grad,
                            loss_out, G_out, dA2_out):
    """:func:`loss_grad_direct` on the calling thread (same blocks, same bits)."""
    for blk in range(loss_out.shape[0]):
        loss_out[blk] = _direct_block(blk, parents, mu, atoms, prior_w, P, A2, eps, block_size, want_grad,
                                      G_out[blk], dA2_out[blk])


@njit(cache=True, error_model="numpy")
def _direct_block(blk, parents, mu, atoms, prior_w, P, A2, eps, block_size, want_grad, G, dA2):
    """One block of :func:`loss_grad_direct`; returns its loss, fills ``G``, ``dA2``."""
    T = P.shape[0]
    S = A2.shape[0]
    n_total = S**T
    start = blk * block_size
    stop = min(start + block_size, n_total)
    s = np.empty(T, dtype=np.int64)
    w = np.empty(S)
    V = np.empty(T)
    u = np.empty(T)
    a = np.empty(T)
    f = np.empty(S)
    r = np.empty(S)
    dl = np.empty(T)
    loss = 0.0
    for m in range(start, stop):
        decode_sequence(m, S, T, s)
        sequence_weight_row(s, parents, mu, atoms, prior_w, w)
        total = 0.0
        for c in range(S):
            total += w[c]
        if total == 0.0:
            continue
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
        Z = 0.0
        for i in range(T):
            a[i] = np.exp(u[i] - umax)
            Z += a[i]
        for c in range(S):
            f[c] = 0.0
        for i in range(T):
            a[i] = a[i] / Z
            f[s[i]] += a[i]
        rbar = 0.0
        for c in range(S):
            if w[c] != 0.0:
                fe = f[c] + eps
                loss -= w[c] * np.log(fe)
                r[c] = -w[c] / fe
            else:
                r[c] = 0.0
            rbar += f[c] * r[c]
        if want_grad:
            for i in range(T):
                dl[i] = a[i] * (r[s[i]] - rbar)
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
def loss_grad_prefix(parents, fac, pk0, wtab, Q, ctx_pos, X, P, A2, eps, n_fixed, want_grad,
                     loss_out, G_out, dA2_out):
    """Prefix-sharing forward/backward: ``O(S + K)`` work per sequence.

    Enumerates the tree of prefixes depth first (position 0 outermost, the
    query ``T-1`` innermost). Block ``b`` fixes positions ``0 … n_fixed-1``
    to the base-``S`` digits of ``b``; ``loss_out.shape[0] = S**n_fixed``.
    Everything that depends on a prefix ``s_0 … s_d`` only is computed once
    per prefix, when ``s_d`` is set:

    * per-atom prefix products of the weights,
      ``p_k ← p_k · fac[d, s_{p(d)}, s_d, k]``;
    * the layer-2 exponentials as running products over keys,
      ``e[q, i] = exp(u_i(q) - m_q) = Π_{j≤i} X[j, s_j, q, i]`` with
      ``X[j, b, q, i] = exp(P[i, j] (A2[q, b] - m_q))`` and
      ``m_q = max_b A2[q, b]``; so ``e ∈ [exp(-range_q), 1]`` and no ``exp``
      runs in the loop (the caller keeps ``range_q ≤ 500``);
    * running sums ``Z_d[q] = Σ_{i≤d} e[q, i]`` and
      ``F_d[q, c] = Σ_{i≤d} e[q, i] [s_i = c]``.

    The weights ``w(s, c) = Σ_k p_k(s) π_k(c | q)`` of all ``S**h`` leaf
    groups below a node at depth ``T-2-h`` are computed together
    (:func:`_prefix_batch_weights`) as one small matrix product with a
    precomputed table ``Q`` of the last ``h`` positions' weight factors; its
    inner loop runs over the groups and vectorizes. The sum over atoms
    ``k`` runs in increasing ``k`` as in :func:`sequence_weight_row`.

    A leaf group (the ``S`` queries of one prefix ``s_0 … s_{T-2}``) then
    costs ``O(S)`` per sequence. The backward pass never forms ``δ`` for
    every position: for a node at depth ``d`` and rows ``i ≤ d``,
    ``Σ_subtree δ_i = e[q, i] · B_d[q, s_i]`` with
    ``B_d[q, c] = Σ_subtree (r_c - r̄)/Z`` (``S²`` numbers), and only rows
    ``i > d`` are kept in full (``R_d[q, i]``). When a node is complete it
    adds ``Σ_subtree δ_i`` to ``H[i, d, q, s_d]``,
    where ``H[i, j, q, b] = Σ_s δ_i(s) [s_{T-1} = q][s_j = b]``; at the end
    of the block ``G[i, j] = Σ_{q,b} A2[q, b] H[i, j, q, b]`` and
    ``dA2[q, b] = Σ_{j≤i} P[i, j] H[i, j, q, b]``: DESIGN §4, summed.

    Parameters
    ----------
    parents : int64 (T,)
    fac : float64 (T-1, S, S, K)
        ``fac[d, a, b, k]`` = ``μ_k(b)`` if ``d`` is a root, else ``π_k(b | a)``.
    pk0 : float64 (K,)
        ``prior_w / S``.
    wtab : float64 (K, S·S)
        ``wtab[k, q·S + c] = π_k(c | q)``.
    Q : float64 (S**n_ctx, K, S**h)
        Weight factors of the ``h`` batched positions ``T-1-h … T-2``:
        ``Q[ctx, k, g] = Π_t fac[T-1-h+t, a_t, g_t, k]`` (``g_t`` the digits of
        ``g``, ``a_t`` the parent's token, from ``g`` or from ``ctx``).
    ctx_pos : int64 (n_ctx,)
        Prefix positions (``< T-1-h``) that are parents of batched positions;
        their tokens, as a base-``S`` number, index ``Q``.
    X : float64 (T, S, S, T)
        As above (entries with ``i < j`` unused).
    P : float64 (T, T)
    A2 : float64 (S, S)
    eps : float
    n_fixed : int
        Leading positions fixed per block (``≤ T-1-h``).
    want_grad : bool
        ``False``: forward only (the loss).
    loss_out, G_out, dA2_out : float64 (n_blocks,), (n_blocks, T, T), (n_blocks, S, S)
        Zero on entry; one slot per block.
    """
    n_blocks = loss_out.shape[0]
    for blk in prange(n_blocks):
        loss_out[blk] = _prefix_block(blk, parents, fac, pk0, wtab, Q, ctx_pos, X, P, A2, eps, n_fixed,
                                      want_grad, G_out[blk], dA2_out[blk])


@njit(cache=True, error_model="numpy")
def loss_grad_prefix_serial(parents, fac, pk0, wtab, Q, ctx_pos, X, P, A2, eps, n_fixed, want_grad,
                            loss_out, G_out, dA2_out):
    """:func:`loss_grad_prefix` on the calling thread (same blocks, same bits)."""
    for blk in range(loss_out.shape[0]):
        loss_out[blk] = _prefix_block(blk, parents, fac, pk0, wtab, Q, ctx_pos, X, P, A2, eps, n_fixed,
                                      want_grad, G_out[blk], dA2_out[blk])


@njit(cache=True, error_model="numpy")
def _prefix_block(blk, parents, fac, pk0, wtab, Q, ctx_pos, X, P, A2, eps, D, want_grad, G, dA2):
    """One block of :func:`loss_grad_prefix`; returns its loss, fills ``G``, ``dA2``.

    The per-prefix state update and the subtree finalization are written
    inline (not as calls): numba reference-counts array arguments of every
    call, which costs more than the arithmetic here.
    """
    T = P.shape[0]
    S = A2.shape[0]
    K = pk0.shape[0]
    L = T - 1  # non-query positions 0 .. L-1; state index d+1 holds depth d
    n_groups = Q.shape[2]
    h = 0
    while S**h < n_groups:
        h += 1
    Lh = L - h  # first batched position
    s = np.zeros(T, dtype=np.int64)
    idx = blk
    for t in range(D - 1, -1, -1):
        s[t] = idx % S
        idx //= S
    # prefix state, index d+1 = after setting s_d
    pk = np.empty((Lh + 1, K))  # per-atom weight prefix products
    ep = np.empty((L + 1, S, T))  # ep[d+1, q, i] = Π_{j≤d} X[j, s_j, q, i]  (row i final once d ≥ i)
    Zp = np.zeros((L + 1, S))  # Σ_{i≤d} e[q, i]
    Fp = np.zeros((L + 1, S, S))  # Σ_{i≤d} e[q, i] [s_i = c]
    for k in range(K):
        pk[0, k] = pk0[k]
    ep[0, :, :] = 1.0
    # backward accumulators per depth: B[d, q, c], R[d, q, i] (rows i > d), H[i, j, q, b]
    B = np.zeros((L, S, S))
    R = np.zeros((L, S, T))
    H = np.zeros((T, T, S, S))
    W = np.empty((S * S, n_groups))
    r = np.empty(S)
    loss = 0.0
    g = 0
    d_set = 0  # first depth whose state must be (re)computed
    first = True
    while True:
        # ---- prefix state for depths d_set .. L-1
        for d in range(d_set, L):
            b = s[d]
            if d < Lh:
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
        if first or d_set < Lh:
            _prefix_batch_weights(S, Lh, s, ctx_pos, pk, wtab, Q, W)
            g = 0
            first = False
        else:
            g += 1
        # ---- leaf group g: prefix s_0 .. s_{T-2} fixed, all S queries
        for q in range(S):
            El = ep[L, q, T - 1] * X[T - 1, q, q, T - 1]
            Z = Zp[L, q] + El
            invZ = 1.0 / Z
            rbar = 0.0
            for c in range(S):
                num = Fp[L, q, c]
                if c == q:
                    num += El
                f = num * invZ
                wc = W[q * S + c, g]
                if wc != 0.0:
                    fe = f + eps
                    loss -= wc * np.log(fe)
                    r[c] = -wc / fe
                else:
                    r[c] = 0.0
                rbar += f * r[c]
            if want_grad:
                for c in range(S):
                    B[L - 1, q, c] = (r[c] - rbar) * invZ
                dl = El * B[L - 1, q, q]
                R[L - 1, q, T - 1] = dl
                H[T - 1, T - 1, q, q] += dl
        # ---- advance the odometer over positions D .. L-1
        d_set = L - 1
        while d_set >= D and s[d_set] == S - 1:
            d_set -= 1
        done = d_set < D
        if want_grad:
            # close the completed nodes (all of them, ancestors too, when the block is done)
            stop = 0 if done else d_set
            for d in range(L - 1, stop - 1, -1):
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
        for d in range(d_set + 1, L):
            s[d] = 0
    if want_grad:
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
def _prefix_batch_weights(S, Lh, s, ctx_pos, pk, wtab, Q, W):
    """Weights of the ``S**h`` leaf groups below the current node at depth ``Lh-1``.

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
        Qk = Q[ctx, k]
        for qc in range(S2):
            p = wtab[k, qc] * pkk
            out = W[qc]
            for gi in range(n_groups):
                out[gi] += p * Qk[gi]
