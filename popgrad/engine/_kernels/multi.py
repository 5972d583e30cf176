"""Numba kernels of the multi-parent task and the k-head model (DESIGN §9).

Kernels take clean, contiguous float64 / int64 arrays and trust them; the
public functions (:mod:`popgrad.task.tasks`, :mod:`popgrad.engine.multi`)
validate. ``cache=True`` everywhere, never ``fastmath``;
``error_model="numpy"`` where ``ε = 0`` may divide by zero (the loss is then
``inf``, not an exception). The enumeration order, the sequence decoder
(:func:`popgrad.engine._kernels.single.decode_sequence`) and the in-order slot sum
(:func:`popgrad.engine._kernels.single.sum_slots`) are shared with the single-parent engine.

Contents
--------
* the exact weights ``w(s, c)`` live with the task: :func:`popgrad.task._weights.sequence_weight_row_multi`,
  :func:`popgrad.task._weights.chunk_weights_multi` (reference:
  :func:`popgrad.task.tasks.sequence_weights_multi_numpy`).
* :func:`_multi_block`, one block of the exact loss, ``G^h = ∂L/∂P^h``
  and ``∂L/∂A2^h`` of the k-head model (its range entries are in
  :mod:`popgrad.engine._kernels.ranges`) (reference:
  :func:`popgrad.engine.reference.exact_loss_and_grad_numpy`; the equations
  are in :mod:`popgrad.engine.multi`).

Why this engine is a prefix engine, and not the single-parent one with a
tuple-valued query: in the k-head model the query of head ``h`` is the
*soft* vector ``Q^h = P^h[T-1,:] X`` (the last position's layer-1 output),
which depends on every token; the single-parent engine's trick of running
products of ``exp(P[i,j] A2[q, s_j])`` over keys for each of ``S`` discrete
queries needs a discrete query known before the leaf. What *is* shared by
all sequences below a prefix ``s_0 … s_d`` is

* the per-atom weight products ``p_m(s_0 … s_d)``;
* the layer-1 outputs ``H^h_i = Σ_{j≤i} P^h[i,j] e_{s_j}`` of rows
  ``i ≤ d`` (final) and the partial sums of rows ``i > d``;
* in the backward pass, the column ``d`` of ``G^h``: with
  ``Y^h[i, b] = δ_i κ^h[b] + [i = T-1] ζ^h[b]`` (per sequence, see
  :mod:`popgrad.engine.multi`), ``G^h[i, d] = Σ_s Y^h[i, s_d]``, so a node at
  depth ``d`` adds ``R_d[h, i, s_d]`` where ``R_d = Σ_{subtree} Y`` is
  accumulated bottom-up (``R_{d-1} += R_d`` when the node completes).

So a sequence (a leaf) costs ``O(k·T·S + K·S)``: the scores
``u_i = Σ_h <κ^h, H^h_i>``, one softmax, ``η^h = Σ_i δ_i H^h_i``, ``Y`` into
``R``, and its weights from the prefix products. The per-sequence max shift
of the layer-2 softmax makes any finite ``A2`` safe (no range limit).

Determinism: the enumeration is split into ``S**n_fixed`` blocks (positions
``0 … n_fixed-1`` fixed per block; ``n_fixed`` depends on ``S`` and ``T``
only), each block writes its own slot, and
:func:`popgrad.engine._kernels.single.sum_slots` adds the slots in block order: the bits
do not depend on the number of threads.
"""
import numpy as np
from numba import njit


from .numeric import has_weight, head_backward, head_forward, head_scratch
from .single import sum_slots  # noqa: F401  (re-exported for the callers)


# ======================================================== loss and gradient
@njit(cache=True, error_model="numpy")
def _multi_block(blk, parents, tp, atoms, pk0, P, A2, eps, D, want_grad, G, dA2):
    """One block of the k-head engine (:func:`popgrad.engine._kernels.ranges.loss_grad_multi_range`): returns its loss, fills ``G (k, T, T)`` and ``dA2 (k, S, S)``.

    Depth-first odometer over positions ``D … T-1`` (``T-1`` innermost);
    state index ``d+1`` holds the state after setting ``s_d``:

    * ``pk[d+1, m] = p_m(s_0 … s_d)`` (weight prefix products);
    * ``Hr[d+1, h, i, c] = Σ_{j≤d} P^h[i, j] [s_j = c]`` for rows ``i ≥ d``
      (row ``d`` is then the final ``H^h_d``);
    * ``R[d, h, i, c]``: ``Σ Y^h[i, c]`` over the finished leaves of the
      current node at depth ``d`` (all rows ``i``: its ancestors need them).

    The atoms are read through a transposed copy ``(S**k, S, K)`` so that the
    loops over atoms run over contiguous memory; the sums over atoms run in
    increasing ``m`` as in :func:`sequence_weight_row_multi` (same bits).
    """
    k = P.shape[0]
    T = P.shape[1]
    S = A2.shape[1]
    K = atoms.shape[0]
    atT = np.ascontiguousarray(atoms.transpose(1, 2, 0))  # (S**k, S, K): atoms innermost
    s = np.zeros(T, dtype=np.int64)
    idx = blk
    for t in range(D - 1, -1, -1):
        s[t] = idx % S
        idx //= S
    pk = np.empty((T + 1, K))
    Hr = np.zeros((T + 1, k, T, S))
    if want_grad:
        R = np.zeros((T, k, T, S))
    else:
        R = np.zeros((1, 1, 1, 1))
    w = np.empty(S)
    Q, kap, u, a, f, r, dl, eta, zeta = head_scratch(k, T, S)
    for m in range(K):
        pk[0, m] = pk0[m]
    loss = 0.0
    d_set = 0
    while True:
        # ---- prefix state for depths d_set .. T-1
        for d in range(d_set, T):
            b = s[d]
            if parents[d, 0] < 0:
                for m in range(K):
                    pk[d + 1, m] = pk[d, m]
            else:
                row = 0
                for h in range(k):
                    row = row * S + s[parents[d, h]]
                at = atT[row, b]
                for m in range(K):
                    pk[d + 1, m] = pk[d, m] * at[m]
            for h in range(k):
                for i in range(d, T):
                    for c in range(S):
                        Hr[d + 1, h, i, c] = Hr[d, h, i, c]
                    Hr[d + 1, h, i, b] += P[h, i, d]
        # ---- the leaf: weights w[c] = Σ_m p_m(s) π_m(c | s_tp), atoms innermost (contiguous, vectorizes)
        rt = 0
        for h in range(k):
            rt = rt * S + s[tp[h]]
        pkT = pk[T]
        for c in range(S):
            at = atT[rt, c]
            acc = 0.0
            for m in range(K):
                acc += pkT[m] * at[m]
            w[c] = acc
        if has_weight(w):
            # ---- forward: Q^h = H^h_{T-1}, κ^h = A2^hᵀ Q^h, u_i = Σ_h <κ^h, H^h_i> (H^h_i = Hr[i+1, h, i])
            loss, rbar = head_forward(loss, s, Hr, 1, A2, w, eps, Q, kap, u, a, f, r)
            if want_grad:
                # ---- backward: δ, η^h = Σ_i δ_i H^h_i, dA2^h += Q^h η^hᵀ, ζ^h = A2^h η^h
                head_backward(s, a, r, rbar, Hr, 1, Q, A2, dl, eta, dA2, zeta)
                # ---- Y^h[i, c] = δ_i κ^h[c] + [i = T-1] ζ^h[c]: the leaf's own column, then into R_{T-2}
                bl = s[T - 1]
                for h in range(k):
                    G[h, T - 1, T - 1] += dl[T - 1] * kap[h, bl] + zeta[h, bl]
                    for i in range(T - 1):
                        di = dl[i]
                        for c in range(S):
                            R[T - 2, h, i, c] += di * kap[h, c]
                    for c in range(S):
                        R[T - 2, h, T - 1, c] += dl[T - 1] * kap[h, c] + zeta[h, c]
        # ---- advance the odometer over positions D .. T-1
        d_set = T - 1
        while d_set >= D and s[d_set] == S - 1:
            d_set -= 1
        done = d_set < D
        if want_grad:
            # close the completed nodes (the ancestors too, when the block is done)
            stop = 0 if done else d_set
            for d in range(T - 2, stop - 1, -1):
                b = s[d]
                for h in range(k):
                    for i in range(d, T):
                        G[h, i, d] += R[d, h, i, b]
                    if d >= 1:
                        for i in range(T):
                            for c in range(S):
                                R[d - 1, h, i, c] += R[d, h, i, c]
                    for i in range(T):
                        for c in range(S):
                            R[d, h, i, c] = 0.0
        if done:
            break
        s[d_set] += 1
        for d in range(d_set + 1, T):
            s[d] = 0
    return loss
