"""Numba kernels that read the task's weight table (DESIGN §20): the k-head model on given rows.

:func:`loss_grad_multi_rows` is the per-sequence form of
:func:`popgrad.engine._kernels.multi._multi_block` (same equations, DESIGN §9 /
:mod:`popgrad.engine.multi`) with the weights ``w (n, S)`` given instead of
carried per atom: ``O(k·T²·S)`` per sequence. Block ``b`` covers rows
``b·block_size …``; one slot per block, summed in block order by the caller
(independent of the thread count). ``cache=True``, never ``fastmath``.
"""
import numpy as np
from numba import njit, prange


@njit(cache=True, error_model="numpy")
def _multi_rows_block(blk, seqs, w, P, A2, eps, block_size, want_grad, G, dA2):
    k = P.shape[0]
    T = P.shape[1]
    S = A2.shape[1]
    n = seqs.shape[0]
    H = np.empty((k, T, S))
    Q = np.empty((k, S))
    kap = np.empty((k, S))
    u = np.empty(T)
    a = np.empty(T)
    f = np.empty(S)
    r = np.empty(S)
    dl = np.empty(T)
    eta = np.empty((k, S))
    zeta = np.empty((k, S))
    loss = 0.0
    for m in range(blk * block_size, min((blk + 1) * block_size, n)):
        s = seqs[m]
        wm = w[m]
        total = 0.0
        for c in range(S):
            total += wm[c]
        if total == 0.0:
            continue
        for h in range(k):
            for i in range(T):
                for c in range(S):
                    H[h, i, c] = 0.0
                for j in range(i + 1):
                    H[h, i, s[j]] += P[h, i, j]
        for h in range(k):
            for c in range(S):
                Q[h, c] = H[h, T - 1, c]
        for h in range(k):
            for c in range(S):
                acc = 0.0
                for b2 in range(S):
                    acc += Q[h, b2] * A2[h, b2, c]
                kap[h, c] = acc
        umax = -np.inf
        for i in range(T):
            acc = 0.0
            for h in range(k):
                for c in range(S):
                    acc += kap[h, c] * H[h, i, c]
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
            if wm[c] != 0.0:
                fe = f[c] + eps
                loss -= wm[c] * np.log(fe)
                r[c] = -wm[c] / fe
            else:
                r[c] = 0.0
            rbar += f[c] * r[c]
        if want_grad:
            for i in range(T):
                dl[i] = a[i] * (r[s[i]] - rbar)
            for h in range(k):
                for c in range(S):
                    acc = 0.0
                    for i in range(T):
                        acc += dl[i] * H[h, i, c]
                    eta[h, c] = acc
                for b2 in range(S):
                    qb = Q[h, b2]
                    acc = 0.0
                    for c in range(S):
                        dA2[h, b2, c] += qb * eta[h, c]
                        acc += A2[h, b2, c] * eta[h, c]
                    zeta[h, b2] = acc
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
