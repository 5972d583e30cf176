"""The leaves of one parent, grouped: the last layer, readout and loss as small products (DESIGN §18).

The leaves ``s_0 … s_{T-2} q`` of one parent (a node of depth ``T-2``) differ only in their last token: their
rows ``0 … T-2`` are shared, their rows ``T-1`` are not. :func:`_leaf_group` runs them together, the dense
passes over ``Ã`` and ``dÃ`` shared by up to three leaves; both walks call it, the enumeration trie
(:func:`popgrad.engine._kernels.catformer_walk.run_blocks`: the leaf weights from the atoms) and the explicit
rows (:func:`popgrad.engine._kernels.catformer_walk.run_rows`: consecutive sorted rows with one parent). The
workspace, the parameter and gradient vectors and the per-row pieces are those of
:mod:`popgrad.engine._kernels.catformer`.
"""
import numpy as np
from numba import njit

from .catformer import U, _node_backward_inline, _node_forward_inline


@njit(cache=True)
def group_size(S, T, dw, n_heads, d_max, n_slots):
    """Length of the float workspace of :func:`_leaf_group` (the regions of ``Q`` listed in :func:`_leaf_group`)."""
    return S * (2 * dw + n_heads * T + n_heads * d_max + 2 * n_slots * S + 3 * S + 2 * T + d_max)


@njit(cache=True, error_model="numpy", inline="always")
def _axpy_k(F, d0, d1, d2, x0, x1, x2, src, s0, m, k):
    """``F[d_i + b] += x_i · src[s0 + b]`` for ``b < m`` and the first ``k ∈ {1, 2, 3}`` destinations
    (one load of ``src`` for ``k`` destinations)."""
    if k == 3:
        for b in range(m):
            v = src[s0 + b]
            F[d0 + b] += x0 * v
            F[d1 + b] += x1 * v
            F[d2 + b] += x2 * v
    elif k == 2:
        for b in range(m):
            v = src[s0 + b]
            F[d0 + b] += x0 * v
            F[d1 + b] += x1 * v
    else:
        for b in range(m):
            F[d0 + b] += x0 * src[s0 + b]


@njit(cache=True, error_model="numpy", inline="always")
def _gaxpy_k(dst, d, x0, x1, x2, Q, s0, s1, s2, m, k):
    """``dst[d + b] += x_0 Q[s0 + b]``, then ``+= x_1 Q[s1 + b]``, ``+= x_2 Q[s2 + b]`` (the first ``k``; in
    that order, so each entry receives the leaves' terms in leaf order)."""
    if k == 3:
        for b in range(m):
            v = dst[d + b]
            v += x0 * Q[s0 + b]
            v += x1 * Q[s1 + b]
            v += x2 * Q[s2 + b]
            dst[d + b] = v
    elif k == 2:
        for b in range(m):
            v = dst[d + b]
            v += x0 * Q[s0 + b]
            v += x1 * Q[s1 + b]
            dst[d + b] = v
    else:
        for b in range(m):
            dst[d + b] += x0 * Q[s0 + b]


@njit(cache=True, error_model="numpy")
def _leaf_group(q_lo, q_hi, z, s, hinfo, prm, F, gr, Wl, Q, qs, eps, softmax_readout, want_grad):
    """The leaves ``s_0 … s_{T-2} q`` for ``q_lo ≤ q < q_hi`` of one parent, the last layer as products.

    Rows ``0 … T-2`` (the parent's path) are in ``F``; ``Wl[q]`` are the leaves' weights. Per leaf, row
    ``T-1`` of layers ``1 … L-1`` and ``hw[T-1]`` (:func:`_node_forward`) are computed and kept in ``Q``;
    then the last layer, readout and loss of all the leaves together: ``U = H_Q Ã`` (``H_Q`` the leaves'
    rows ``T-1``, up to three leaves per pass over ``Ã``), the scores against the shared rows, and in
    reverse ``dÃ += H_Qᵀ dU``, ``G_Q += dU Ãᵀ`` (one pass over ``dÃ`` / ``Ãᵀ`` for up to three leaves),
    the shared adjoints ``G[j]``, ``Ghw[j]`` of the rows ``j < T-1`` summed over the leaves. Last, each
    leaf's row ``T-1`` is restored and back-propagated (:func:`_node_backward`). Returns the leaves' loss.
    """
    T, S, d0, dw, nh, dmax, nl = z.T, z.S, z.d0, z.dw, z.n_heads, z.d_max, z.n_slots
    dL, nA, dl1, n_inner, last0, n_last = z.dL, z.n_A, z.dl1, z.n_inner, z.n_inner, z.n_last
    Su = S
    oW = U(2) * nA
    oWT = oW + dL * S
    t_ = np.int64(z.T) - 1
    t = T - U(1)
    ht = z.oH + t * dw
    gt = z.oG + t * dw
    # regions of Q (per leaf i < S)
    oHQ = U(0)
    oGQ = oHQ + Su * dw
    oPQ = oGQ + Su * dw
    oUQ = oPQ + Su * nh * T
    ohwQ = oUQ + Su * nh * dmax
    oGhwQ = ohwQ + Su * nl * S
    owQ = oGhwQ + Su * nl * S
    ozQ = owQ + Su * S
    odzQ = ozQ + Su * S
    odPQ = odzQ + Su * S
    odsQ = odPQ + Su * T
    oduQ = odsQ + Su * T
    # forward of the leaves' rows T-1 below the last layer; kept per leaf
    G = 0
    for q in range(q_lo, q_hi):
        alive = False
        for c in range(S):
            if Wl[q, c] > 0.0:
                alive = True
        if not alive:
            continue
        i = U(G)
        s[t_] = q
        _node_forward_inline(t_, z, s, hinfo, prm, F)  # (the input's one-hots in H are never read: not set here)
        for a in range(dw):
            Q[oHQ + i * dw + a] = F[ht + a]
        for g_ in range(n_inner):
            g = U(g_)
            din = U(hinfo[g, 1])
            p0 = z.oPr + (t * nh + g) * T
            u0 = z.oU + (t * nh + g) * dmax
            for j in range(T):
                Q[oPQ + (i * nh + g) * T + j] = F[p0 + j]
            for b in range(din):
                Q[oUQ + (i * nh + g) * dmax + b] = F[u0 + b]
        for xx in range(nl * S):
            Q[ohwQ + i * nl * S + xx] = F[z.ohw + t * nl * S + xx]
            Q[oGhwQ + i * nl * S + xx] = 0.0
        for a in range(dw):
            Q[oGQ + i * dw + a] = 0.0
        for c in range(S):
            Q[owQ + i * S + c] = Wl[q, c]
        qs[G] = q
        G += 1
    if G == 0:
        return 0.0
    Gu = U(G)
    # the last layer's query vectors U_i = H_i Ã and attention rows, every last head
    for k_ in range(n_last):
        g = U(last0 + k_)
        din = U(hinfo[g, 1])
        ao = U(hinfo[g, 3])
        for i in range(Gu):
            u0 = oUQ + (i * nh + g) * dmax
            r1 = ao + U(qs[i]) * din
            r2 = ao + (S + t) * din
            for b in range(din):
                Q[u0 + b] = prm[r1 + b] + prm[r2 + b]
        i = U(0)
        while i < Gu:
            kk = min(Gu - i, U(3))
            i1 = min(i + U(1), Gu - U(1))
            i2 = min(i + U(2), Gu - U(1))
            d0_ = oUQ + (i * nh + g) * dmax
            d1_ = oUQ + (i1 * nh + g) * dmax
            d2_ = oUQ + (i2 * nh + g) * dmax
            for a in range(d0, din):
                _axpy_k(Q, d0_, d1_, d2_, Q[oHQ + i * dw + a], Q[oHQ + i1 * dw + a], Q[oHQ + i2 * dw + a], prm,
                        ao + a * din, din, kk)
            i += kk
        for i in range(Gu):
            u0 = oUQ + (i * nh + g) * dmax
            p0 = oPQ + (i * nh + g) * T
            qi = U(qs[i])
            for j in range(t):
                Q[p0 + j] = Q[u0 + U(s[j])] + Q[u0 + S + j]
            Q[p0 + t] = Q[u0 + qi] + Q[u0 + S + t]
            h_i = oHQ + i * dw
            for a in range(d0, din):
                ua = Q[u0 + a]
                q0 = z.oHt + a * T
                for j in range(t):
                    Q[p0 + j] += ua * F[q0 + j]
                Q[p0 + t] += ua * Q[h_i + a]
            m = Q[p0]
            for j in range(U(1), T):
                if Q[p0 + j] > m:
                    m = Q[p0 + j]
            tot = 0.0
            for j in range(T):
                e = np.exp(Q[p0 + j] - m)
                Q[p0 + j] = e
                tot += e
            inv = 1.0 / tot
            for j in range(T):
                Q[p0 + j] *= inv
    # readout and loss per leaf
    loss = 0.0
    for i in range(Gu):
        qi = U(qs[i])
        h_i = oHQ + i * dw
        z0 = ozQ + i * S
        w0 = owQ + i * S
        dz0 = odzQ + i * S
        for c in range(S):
            Q[z0 + c] = prm[oW + qi * S + c] + prm[oW + (S + t) * S + c]
        for a in range(d0, dl1):
            x = Q[h_i + a]
            for c in range(S):
                Q[z0 + c] += x * prm[oW + a * S + c]
        for k_ in range(n_last):
            k = U(k_)
            p0 = oPQ + (i * nh + U(last0) + k) * T
            for j in range(t):
                p = Q[p0 + j]
                k0 = z.ohw + (j * nl + k) * S
                for c in range(S):
                    Q[z0 + c] += p * F[k0 + c]
            p = Q[p0 + t]
            k0 = ohwQ + (i * nl + k) * S
            for c in range(S):
                Q[z0 + c] += p * Q[k0 + c]
        tot_w = 0.0
        for c in range(S):
            tot_w += Q[w0 + c]
        if softmax_readout:
            m = Q[z0]
            for c in range(U(1), S):
                if Q[z0 + c] > m:
                    m = Q[z0 + c]
            for c in range(S):
                Q[z0 + c] -= m
            tot = 0.0
            for c in range(S):
                tot += np.exp(Q[z0 + c])
            lt = np.log(tot)
            if eps == 0.0:
                for c in range(S):
                    wc = Q[w0 + c]
                    if wc > 0.0:
                        loss -= wc * (Q[z0 + c] - lt)
                    Q[dz0 + c] = np.exp(Q[z0 + c] - lt) * tot_w - wc
            else:
                rbar = 0.0
                for c in range(S):
                    f = np.exp(Q[z0 + c] - lt)
                    wc = Q[w0 + c]
                    if wc > 0.0:
                        loss -= wc * np.log(f + eps)
                        Q[dz0 + c] = -wc / (f + eps)
                    else:
                        Q[dz0 + c] = 0.0
                    rbar += f * Q[dz0 + c]
                for c in range(S):
                    Q[dz0 + c] = np.exp(Q[z0 + c] - lt) * (Q[dz0 + c] - rbar)
        else:
            for c in range(S):
                wc = Q[w0 + c]
                if wc > 0.0:
                    loss -= wc * np.log(Q[z0 + c] + eps)
                    Q[dz0 + c] = -wc / (Q[z0 + c] + eps)
                else:
                    Q[dz0 + c] = 0.0
    if not want_grad:
        return loss
    # readout backward: z = H[T-1] W[:dl1] + Σ_k Σ_j P^k_j hw[j, k]
    for i in range(Gu):
        qi = U(qs[i])
        h_i = oHQ + i * dw
        g_i = oGQ + i * dw
        dz0 = odzQ + i * S
        for c in range(S):
            gr[nA + qi * S + c] += Q[dz0 + c]
            gr[nA + (S + t) * S + c] += Q[dz0 + c]
        for a in range(d0, dl1):
            x = Q[h_i + a]
            for c in range(S):
                gr[nA + a * S + c] += x * Q[dz0 + c]
        for c in range(S):
            gc = Q[dz0 + c]
            w0 = oWT + c * dL
            for a in range(d0, dl1):
                Q[g_i + a] += gc * prm[w0 + a]
    for k_ in range(n_last):
        k = U(k_)
        g = U(last0 + k_)
        din = U(hinfo[g, 1])
        ao = U(hinfo[g, 3])
        for i in range(Gu):
            qi = U(qs[i])
            h_i = oHQ + i * dw
            g_i = oGQ + i * dw
            dz0 = odzQ + i * S
            p0 = oPQ + (i * nh + g) * T
            u0 = oUQ + (i * nh + g) * dmax
            dP0 = odPQ + i * T
            ds0 = odsQ + i * T
            du0 = oduQ + i * dmax
            for j in range(t):
                p = Q[p0 + j]
                k0 = z.ohw + (j * nl + k) * S
                q0 = z.oGhw + (j * nl + k) * S
                v = 0.0
                for c in range(S):
                    v += Q[dz0 + c] * F[k0 + c]
                    F[q0 + c] += p * Q[dz0 + c]
                Q[dP0 + j] = v
            p = Q[p0 + t]
            k0 = ohwQ + (i * nl + k) * S
            q0 = oGhwQ + (i * nl + k) * S
            v = 0.0
            for c in range(S):
                v += Q[dz0 + c] * Q[k0 + c]
                Q[q0 + c] += p * Q[dz0 + c]
            Q[dP0 + t] = v
            mm = 0.0
            for j in range(T):
                mm += Q[p0 + j] * Q[dP0 + j]
            for j in range(T):
                Q[ds0 + j] = Q[p0 + j] * (Q[dP0 + j] - mm)
            for b in range(din):
                Q[du0 + b] = 0.0
            for j in range(t):
                cj = Q[ds0 + j]
                Q[du0 + U(s[j])] += cj
                Q[du0 + S + j] += cj
                if cj != 0.0:
                    hj = z.oH + j * dw
                    gj = z.oG + j * dw
                    for a in range(d0, din):
                        Q[du0 + a] += cj * F[hj + a]
                        F[gj + a] += cj * Q[u0 + a]
            cj = Q[ds0 + t]
            Q[du0 + qi] += cj
            Q[du0 + S + t] += cj
            if cj != 0.0:
                for a in range(d0, din):
                    Q[du0 + a] += cj * Q[h_i + a]
                    Q[g_i + a] += cj * Q[u0 + a]
            r1 = ao + qi * din
            r2 = ao + (S + t) * din
            for b in range(din):
                gr[r1 + b] += Q[du0 + b]
            for b in range(din):
                gr[r2 + b] += Q[du0 + b]
        # dÃ += H_Qᵀ dU (dense rows) and G_Q += dU Ãᵀ, up to three leaves per pass
        i = U(0)
        while i < Gu:
            kk = min(Gu - i, U(3))
            i1 = min(i + U(1), Gu - U(1))
            i2 = min(i + U(2), Gu - U(1))
            e0 = oduQ + i * dmax
            e1 = oduQ + i1 * dmax
            e2 = oduQ + i2 * dmax
            for a in range(d0, din):
                _gaxpy_k(gr, ao + a * din, Q[oHQ + i * dw + a], Q[oHQ + i1 * dw + a], Q[oHQ + i2 * dw + a], Q,
                         e0, e1, e2, din, kk)
            f0 = oGQ + i * dw + d0
            f1 = oGQ + i1 * dw + d0
            f2 = oGQ + i2 * dw + d0
            for b in range(din):
                _axpy_k(Q, f0, f1, f2, Q[e0 + b], Q[e1 + b], Q[e2 + b], prm, nA + ao + b * din + d0, din - d0, kk)
            i += kk
    # each leaf's row T-1 below the last layer, restored and back-propagated
    for i in range(Gu):
        q = qs[i]
        s[t_] = q
        for a in range(dw):
            F[ht + a] = Q[oHQ + i * dw + a]
            F[gt + a] = Q[oGQ + i * dw + a]
        for a in range(d0, dw):
            F[z.oHt + a * T + t] = Q[oHQ + i * dw + a]
        for g_ in range(n_inner):
            g = U(g_)
            din = U(hinfo[g, 1])
            p0 = z.oPr + (t * nh + g) * T
            u0 = z.oU + (t * nh + g) * dmax
            for j in range(T):
                F[p0 + j] = Q[oPQ + (i * nh + g) * T + j]
            for b in range(din):
                F[u0 + b] = Q[oUQ + (i * nh + g) * dmax + b]
        for xx in range(nl * S):
            F[z.ohw + t * nl * S + xx] = Q[ohwQ + i * nl * S + xx]
            F[z.oGhw + t * nl * S + xx] = Q[oGhwQ + i * nl * S + xx]
        _node_backward_inline(t_, z, s, hinfo, prm, F, gr)
    return loss
