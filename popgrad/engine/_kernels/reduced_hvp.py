"""Exact Hessian-vector products of the reduced models: one tangent sweep per sequence (DESIGN §22).

Forward-over-reverse in real arithmetic along ``(V1, V2)``: the first layer's attention ``P = softmax(A1)``
(masked rows) and its tangent ``Ṗ = P ⊙ (V1 − rowsum(P ⊙ V1))`` are the same for every sequence and come in;
per sequence the forward pass, the second layer's readout and the reverse pass of DESIGN §4 (single head) and
§9 (k heads) carry their tangents. The kernels return, summed over the block's rows, the first layer's
pre-softmax adjoint ``G`` and its tangent ``Ġ`` (the caller applies ``dA1 = P ⊙ (G − <P, G>)`` and its
tangent once) and the tangent of ``dA2`` (that part of ``H v``).

Single head (``q = s_{T-1}``, ``V_j = A2[q, s_j]``, ``u = P V``): ``u̇ = Ṗ V + P V̇``, ``a = softmax(u)``,
``ȧ = a ⊙ (u̇ − a·u̇)``, ``f_c = Σ_{s_i = c} a_i``, ``r_c = −w_c/(f_c + ε)``, ``ṙ_c = w_c ḟ_c/(f_c + ε)²``,
``δ_i = a_i (r_{s_i} − r̄)``, ``δ̇_i = ȧ_i (r_{s_i} − r̄) + a_i (ṙ_{s_i} − ṙ̄)``; ``Ġ[i, j] += δ̇_i V_j + δ_i V̇_j``,
``d(dA2)[q, s_j] += Σ_i δ̇_i P[i, j] + δ_i Ṗ[i, j]``.

k heads (``H^h = P^h X``, ``Q^h = H^h_{T-1}``, ``κ^h = Q^h A2^h``, ``u = Σ_h H^h κ^h``): the same with
``η^h = Σ_i δ_i H^h_i``, ``dA2^h = Q^h ⊗ η^h``, ``dH^h_i = δ_i κ^h (+ A2^h η^h at i = T-1)``,
``G^h[i, j] = dH^h[i, s_j]``, each with its tangent.

Block ``b`` is rows ``b·per …`` into slot ``b``; the caller adds the slots in block order. ``cache=True``, no
``fastmath``.
"""
import numpy as np
from numba import njit, prange

from .twins import twins


@njit(cache=True, error_model="numpy")
def _single_block(lo, hi, seqs, w, P, Pd, A2, V2, eps, G, Gd, HA2):
    T = P.shape[0]
    S = A2.shape[0]
    V = np.zeros(T)
    Vd = np.zeros(T)
    u = np.zeros(T)
    ud = np.zeros(T)
    f = np.zeros(S)
    fd = np.zeros(S)
    r = np.zeros(S)
    rd = np.zeros(S)
    dl = np.zeros(T)
    dld = np.zeros(T)
    loss = 0.0
    for row in range(lo, hi):
        alive = False
        for c in range(S):
            if w[row, c] != 0.0:
                alive = True
        if not alive:
            continue
        q = seqs[row, T - 1]
        for j in range(T):
            V[j] = A2[q, seqs[row, j]]
            Vd[j] = V2[q, seqs[row, j]]
        m = -np.inf
        for i in range(T):
            x = 0.0
            xd = 0.0
            for j in range(i + 1):
                x += P[i, j] * V[j]
                xd += Pd[i, j] * V[j] + P[i, j] * Vd[j]
            u[i] = x
            ud[i] = xd
            if x > m:
                m = x
        tot = 0.0
        for i in range(T):
            u[i] = np.exp(u[i] - m)
            tot += u[i]
        mu = 0.0
        for i in range(T):
            u[i] /= tot  # now a_i
            mu += u[i] * ud[i]
        for c in range(S):
            f[c] = 0.0
            fd[c] = 0.0
        for i in range(T):
            ud[i] = u[i] * (ud[i] - mu)  # now ȧ_i
            f[seqs[row, i]] += u[i]
            fd[seqs[row, i]] += ud[i]
        rbar = 0.0
        rbard = 0.0
        for c in range(S):
            wc = w[row, c]
            if wc > 0.0:
                fe = f[c] + eps
                loss -= wc * np.log(fe)
                r[c] = -wc / fe
                rd[c] = wc * fd[c] / (fe * fe)
            else:
                r[c] = 0.0
                rd[c] = 0.0
            rbar += f[c] * r[c]
            rbard += fd[c] * r[c] + f[c] * rd[c]
        for i in range(T):
            si = seqs[row, i]
            dl[i] = u[i] * (r[si] - rbar)
            dld[i] = ud[i] * (r[si] - rbar) + u[i] * (rd[si] - rbard)
        for i in range(T):
            d = dl[i]
            dd = dld[i]
            for j in range(i + 1):
                G[i, j] += d * V[j]
                Gd[i, j] += dd * V[j] + d * Vd[j]
        for j in range(T):
            e = 0.0
            for i in range(j, T):
                e += dld[i] * P[i, j] + dl[i] * Pd[i, j]
            HA2[q, seqs[row, j]] += e
    return loss


@njit(cache=True, error_model="numpy")
def _multi_block(lo, hi, seqs, w, P, Pd, A2, V2, eps, G, Gd, HA2):
    k = P.shape[0]
    T = P.shape[1]
    S = A2.shape[1]
    Hh = np.zeros((k, T, S))
    Hdh = np.zeros((k, T, S))
    kap = np.zeros((k, S))
    kapd = np.zeros((k, S))
    eta = np.zeros((k, S))
    etad = np.zeros((k, S))
    zeta = np.zeros(S)
    zetad = np.zeros(S)
    u = np.zeros(T)
    ud = np.zeros(T)
    f = np.zeros(S)
    fd = np.zeros(S)
    r = np.zeros(S)
    rd = np.zeros(S)
    dl = np.zeros(T)
    dld = np.zeros(T)
    loss = 0.0
    for row in range(lo, hi):
        alive = False
        for c in range(S):
            if w[row, c] != 0.0:
                alive = True
        if not alive:
            continue
        for h in range(k):
            for i in range(T):
                for c in range(S):
                    Hh[h, i, c] = 0.0
                    Hdh[h, i, c] = 0.0
                for j in range(i + 1):
                    sj = seqs[row, j]
                    Hh[h, i, sj] += P[h, i, j]
                    Hdh[h, i, sj] += Pd[h, i, j]
            for c in range(S):
                x = 0.0
                xd = 0.0
                for b in range(S):
                    x += Hh[h, T - 1, b] * A2[h, b, c]
                    xd += Hdh[h, T - 1, b] * A2[h, b, c] + Hh[h, T - 1, b] * V2[h, b, c]
                kap[h, c] = x
                kapd[h, c] = xd
        m = -np.inf
        for i in range(T):
            x = 0.0
            xd = 0.0
            for h in range(k):
                for c in range(S):
                    x += Hh[h, i, c] * kap[h, c]
                    xd += Hdh[h, i, c] * kap[h, c] + Hh[h, i, c] * kapd[h, c]
            u[i] = x
            ud[i] = xd
            if x > m:
                m = x
        tot = 0.0
        for i in range(T):
            u[i] = np.exp(u[i] - m)
            tot += u[i]
        mu = 0.0
        for i in range(T):
            u[i] /= tot
            mu += u[i] * ud[i]
        for c in range(S):
            f[c] = 0.0
            fd[c] = 0.0
        for i in range(T):
            ud[i] = u[i] * (ud[i] - mu)
            f[seqs[row, i]] += u[i]
            fd[seqs[row, i]] += ud[i]
        rbar = 0.0
        rbard = 0.0
        for c in range(S):
            wc = w[row, c]
            if wc > 0.0:
                fe = f[c] + eps
                loss -= wc * np.log(fe)
                r[c] = -wc / fe
                rd[c] = wc * fd[c] / (fe * fe)
            else:
                r[c] = 0.0
                rd[c] = 0.0
            rbar += f[c] * r[c]
            rbard += fd[c] * r[c] + f[c] * rd[c]
        for i in range(T):
            si = seqs[row, i]
            dl[i] = u[i] * (r[si] - rbar)
            dld[i] = ud[i] * (r[si] - rbar) + u[i] * (rd[si] - rbard)
        for h in range(k):
            for c in range(S):
                x = 0.0
                xd = 0.0
                for i in range(T):
                    x += dl[i] * Hh[h, i, c]
                    xd += dld[i] * Hh[h, i, c] + dl[i] * Hdh[h, i, c]
                eta[h, c] = x
                etad[h, c] = xd
            for b in range(S):
                qb = Hh[h, T - 1, b]
                qdb = Hdh[h, T - 1, b]
                x = 0.0
                xd = 0.0
                for c in range(S):
                    HA2[h, b, c] += qdb * eta[h, c] + qb * etad[h, c]
                    x += A2[h, b, c] * eta[h, c]
                    xd += V2[h, b, c] * eta[h, c] + A2[h, b, c] * etad[h, c]
                zeta[b] = x
                zetad[b] = xd
            for i in range(T):
                d = dl[i]
                dd = dld[i]
                for j in range(i + 1):
                    sj = seqs[row, j]
                    g = d * kap[h, sj]
                    gd = dd * kap[h, sj] + d * kapd[h, sj]
                    if i == T - 1:
                        g += zeta[sj]
                        gd += zetad[sj]
                    G[h, i, j] += g
                    Gd[h, i, j] += gd
    return loss


def _run_single_body(seqs, w, per, P, Pd, A2, V2, eps, loss_out, G_out, Gd_out, HA2_out):
    n = seqs.shape[0]
    for b in prange(loss_out.shape[0]):
        lo = b * per
        hi = min(n, lo + per)
        loss_out[b] = _single_block(lo, hi, seqs, w, P, Pd, A2, V2, eps, G_out[b], Gd_out[b], HA2_out[b])


def _run_multi_body(seqs, w, per, P, Pd, A2, V2, eps, loss_out, G_out, Gd_out, HA2_out):
    n = seqs.shape[0]
    for b in prange(loss_out.shape[0]):
        lo = b * per
        hi = min(n, lo + per)
        loss_out[b] = _multi_block(lo, hi, seqs, w, P, Pd, A2, V2, eps, G_out[b], Gd_out[b], HA2_out[b])


run_single, run_single_serial = twins(_run_single_body)
run_multi, run_multi_serial = twins(_run_multi_body)


@njit(cache=True)
def sum_reduced_slots(loss_out, G_out, Gd_out, HA2_out):
    """Add the slots in block order into slot 0 (sequential: thread-count independent); return the loss."""
    loss = loss_out[0]
    for b in range(1, loss_out.shape[0]):
        loss += loss_out[b]
        G_out[0] += G_out[b]
        Gd_out[0] += Gd_out[b]
        HA2_out[0] += HA2_out[b]
    loss_out[0] = loss
    return loss
