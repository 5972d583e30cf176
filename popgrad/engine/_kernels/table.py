"""Numba kernels that read the task's weight table (DESIGN §20): the k-head model on given rows.

:func:`loss_grad_multi_rows` is the per-sequence form of
:func:`popgrad.engine._kernels.multi._multi_block` (same equations, DESIGN §9 /
:mod:`popgrad.engine.multi`) with the weights ``w (n, S)`` given instead of
carried per atom: ``O(k·T²·S)`` per sequence. The forward and backward of a
sequence are the prefix engine's own (:func:`popgrad.engine._kernels.numeric.head_forward`,
:func:`~popgrad.engine._kernels.numeric.head_backward`), so the two engines share their
arithmetic, the stable log of an underflowing token mass included. Block ``b`` covers rows
``b·block_size …``; one slot per block, summed in block order by the caller
(independent of the thread count). ``cache=True``, never ``fastmath``.
"""
import numpy as np
from numba import njit, prange

from .numeric import has_weight, head_backward, head_forward, head_scratch, head_sums


@njit(cache=True, error_model="numpy")
def _multi_rows_block(blk, seqs, w, P, A2, eps, block_size, want_grad, G, dA2):
    k = P.shape[0]
    T = P.shape[1]
    S = A2.shape[1]
    n = seqs.shape[0]
    H4 = np.empty((1, k, T, S))  # H^h_i = H[h, i]: one array for head_forward / head_backward (step 0)
    H = H4[0]
    Q, kap, u, a, f, r, dl, eta, zeta = head_scratch(k, T, S)
    loss = 0.0
    for m in range(blk * block_size, min((blk + 1) * block_size, n)):
        s = seqs[m]
        wm = w[m]
        if not has_weight(wm):
            continue
        head_sums(s, P, H)
        loss, rbar = head_forward(loss, s, H4, 0, A2, wm, eps, Q, kap, u, a, f, r)
        if want_grad:
            head_backward(s, a, r, rbar, H4, 0, Q, A2, dl, eta, dA2, zeta)
            # G^h[i, j] += Y^h[i, s_j],  Y^h[i, c] = δ_i κ^h[c] + [i = T-1] ζ^h[c]
            for h in range(k):
                for i in range(T):
                    di = dl[i]
                    for j in range(i + 1):
                        y = di * kap[h, s[j]]
                        if i == T - 1:
                            y += zeta[h, s[j]]
                        G[h, i, j] += y
    return loss


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_multi_rows(seqs, w, P, A2, eps, block_size, want_grad, loss_out, G_out, dA2_out):
    """Blocks ``0 … len(loss_out)-1`` of the rows ``seqs (n, T)`` with weights ``w (n, S)``: one slot each."""
    for blk in prange(loss_out.shape[0]):
        loss_out[blk] = _multi_rows_block(blk, seqs, w, P, A2, eps, block_size, want_grad, G_out[blk], dA2_out[blk])
