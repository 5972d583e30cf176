"""The enumeration walk of the disentangled-transformer engine (DESIGN §18, §21): a trie, forward and reverse.

The workspace, the parameter and gradient vectors and the per-row pieces (:func:`_node_forward`,
:func:`_node_backward`) are those of :mod:`popgrad.engine._kernels.catformer`.

Walk: block ``b`` fixes positions ``0 … D-1`` to the base-``S`` digits of
``b``; below them a depth-first odometer. Entering node ``(t, s_t)``
multiplies the per-atom weight products ``pk[t] = pk[t-1] · ftab[:, row_t, s_t]``
(a subtree whose products are all zero contributes nothing and is skipped) and
computes row ``t`` of layers ``1 … L-1`` and ``hw[t]``; the ``S`` leaves (``t = T-1``) of a node of
depth ``T-2`` run together (:func:`_leaf_group`): their rows ``T-1``, then the last layer's row ``T-1``,
the readout and the loss of all of them, the dense passes over ``Ã`` and ``dÃ`` shared by up to three
leaves. ``canon`` restricts the walk to the canonical sequences (the orbit reduction, DESIGN §21). Reverse
mode over the same tree: adjoints ``G[j]`` (of ``H[j]``) and ``Ghw[j]`` of the
rows ``j`` on the current path accumulate over the subtree; a node
back-propagates its own row once, after all its children
(:func:`_node_backward`), into the parameters and the rows above it. A
block ends with the backward pass of its fixed rows ``D-1 … 0``, so each
block's slot is its exact partial gradient.

``cache=True``, no ``fastmath``; :func:`run_blocks` (parallel) and
:func:`run_blocks_serial` (one body, :func:`popgrad.engine._kernels.twins.twins`) run the same blocks into
one slot each.
"""
import numpy as np
from numba import njit, prange

from .catformer import U, _node_backward, _node_backward_inline, _node_forward, _node_forward_inline
from .twins import twins


@njit(cache=True, error_model="numpy", inline="always")
def _enter_weights(t, s, S, npar, par, roff, ff, K, pf):
    """``pk[t+1, k] = pk[t, k] · ftab[k, row_t(s), s_t]``; return whether any product is positive.

    ``ff`` is the factor table ``ftab[row, token, k]`` with the atoms last (contiguous products), flat;
    ``pf`` the products ``pk (T + 1, K)``, flat (no views in the walk: each costs reference counts).
    """
    r = 0  # the parents' flat row: Σ_h s[par_h] S^{n-1-h}
    for h in range(npar[t]):
        r = r * S + s[par[t, h]]
    fo = (U(roff[t] + r) * U(S) + U(s[t])) * K
    src = U(t) * K
    dst = src + K
    alive = False
    for k in range(K):
        v = pf[src + k] * ff[fo + k]
        pf[dst + k] = v
        if v != 0.0:
            alive = True
    return alive


@njit(cache=True, error_model="numpy", inline="always")
def _leaf_table(s, S, T, npar, par, roff, ff, K, pf, tnpar, tpar, troff, tt, Wl, coef):
    """``Wl[q, c] = w(s_0 … s_{T-2} q, c)`` for every last token ``q`` (once per parent of leaves).

    ``Wl[q, c] = Σ_k pk[T-1, k] ftab[k, row_{T-1}, q] ttab[k, r_tp(q), c]`` with the tables atoms-last
    (``ff``, ``tt``, flat, as the products ``pf``); the sum over atoms in four interleaved partial sums.
    """
    t = T - 1
    r = 0
    for h in range(npar[t]):
        r = r * S + s[par[t, h]]
    row = U(roff[t] + r)
    nS = U(Wl.shape[1])
    Su = U(S)
    src = U(t) * K
    for q_ in range(S):
        q = U(q_)
        rt = 0
        for h in range(tnpar):
            tok = q_ if tpar[h] == t else s[tpar[h]]
            rt = rt * S + tok
        fo = (row * Su + q) * K
        for k in range(K):
            coef[k] = pf[src + k] * ff[fo + k]
        rr = U(troff + rt)
        for c in range(nS):
            to = (rr * nS + c) * K
            a0 = 0.0
            a1 = 0.0
            a2 = 0.0
            a3 = 0.0
            k = U(0)
            while k + U(3) < K:
                a0 += coef[k] * tt[to + k]
                a1 += coef[k + U(1)] * tt[to + k + U(1)]
                a2 += coef[k + U(2)] * tt[to + k + U(2)]
                a3 += coef[k + U(3)] * tt[to + k + U(3)]
                k += U(4)
            while k < K:
                a0 += coef[k] * tt[to + k]
                k += U(1)
            Wl[q, c] = (a0 + a1) + (a2 + a3)


# ====================================================================== the leaves of one parent, grouped
@njit(cache=True)
def group_size(S, T, dw, n_heads, d_max, n_slots):
    """Length of the float workspace of :func:`_leaf_group` (the regions of :func:`_group_offsets`)."""
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


@njit(cache=True, error_model="numpy")
def _orbit_weights(M, S, orbit, Wl):
    """``Wl[q] *= orbit[m]``, ``m = max(M, q) + 1`` the distinct tokens of the canonical leaf ``… q`` whose
    prefix has maximum ``M`` (the leaves ``q ≤ M + 1``)."""
    for q in range(min(S, M + 2)):
        f = orbit[max(M, q) + 1]
        for c in range(S):
            Wl[q, c] *= f


@njit(cache=True, error_model="numpy")
def _block(b, n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT, eps, softmax_readout,
           want_grad, canon, orbit, gr):
    """Block ``b``: every sequence whose first ``n_fixed`` tokens are the base-``S`` digits of ``b``; its loss.

    Adds the block's gradient into ``gr = [dA (flat, the layout of Af) | dW (flat)]``. One float workspace
    ``F`` holds the rows ``H``, their transpose ``Ht``, the adjoints ``G``, the attention rows ``Pr``, the
    query vectors ``U``, ``hw`` and its adjoint and the leaf scratch (:class:`Layout`): the helpers take
    a handful of arrays and index them flat (no views in the loops: every view or array argument costs
    an atomic reference-count update). The walk visits the nodes of depth ``< T-1``; the leaves of a
    node of depth ``T-2`` run together (:func:`_leaf_group`, workspace ``Q``).

    ``canon``: the orbit reduction (DESIGN §21) -- only the canonical sequences (first occurrences in the
    order ``0, 1, …``: token ``s_t ≤ max(s_0 … s_{t-1}) + 1``, a sub-trie), each leaf's weights times its
    orbit size ``orbit[m]`` (``m`` distinct tokens); a block whose fixed tokens are not canonical is empty.
    """
    T, S, dw = np.int64(z.T), np.int64(z.S), np.int64(z.dw)  # signed: the walk's few accesses
    K = pk0.shape[0]
    Ku = U(K)
    ff = ftabT.reshape(-1)  # flat once per block: the walk creates no views
    tt = ttabT.reshape(-1)
    oH = 0
    F = np.zeros(np.int64(z.size))
    Q = np.zeros(group_size(S, T, dw, np.int64(z.n_heads), np.int64(z.d_max), np.int64(z.n_slots)))
    qs = np.zeros(S, dtype=np.int64)
    s = np.zeros(T, dtype=np.int64)
    pk = np.zeros((T + 1) * K)  # pk[t, k] at t·K + k
    Wl = np.zeros((S, S))
    coef = np.zeros(K)
    for k in range(K):
        pk[k] = pk0[k]
    rem = b
    for t in range(n_fixed - 1, -1, -1):
        s[t] = rem % S
        rem //= S
    mx = np.full(T + 1, -1, dtype=np.int64)  # mx[t] = max(s_0 … s_{t-1}) (-1 for t = 0)
    for t in range(n_fixed):
        if canon and s[t] > mx[t] + 1:
            return 0.0
        mx[t + 1] = max(mx[t], s[t])
    for t in range(T):  # x̃_t: the position one-hot is fixed; the token one-hot moves with the walk
        F[oH + t * dw + S + t] = 1.0
    n_inner_fixed = min(n_fixed, T - 1)  # fixed nodes above the leaves
    for t in range(n_inner_fixed):
        F[oH + t * dw + s[t]] = 1.0
        if not _enter_weights(t, s, S, npar, par, roff, ff, Ku, pk):
            return 0.0
        _node_forward(t, z, s, hinfo, prm, F)
    loss = 0.0
    if n_fixed >= T - 1:  # the block is (part of) one parent's leaves
        _leaf_table(s, S, T, npar, par, roff, ff, Ku, pk, tnpar, tpar, troff, tt, Wl, coef)
        if canon:
            _orbit_weights(mx[T - 1], S, orbit, Wl)
        q_lo, q_hi = (s[T - 1], s[T - 1] + 1) if n_fixed == T else (0, min(S, mx[T - 1] + 2) if canon else S)
        loss = _leaf_group(q_lo, q_hi, z, s, hinfo, prm, F, gr, Wl, Q, qs, eps, softmax_readout, want_grad)
    else:
        t = n_fixed
        s[t] = 0
        while True:
            F[oH + t * dw + s[t]] = 1.0
            mx[t + 1] = max(mx[t], s[t])
            if _enter_weights(t, s, S, npar, par, roff, ff, Ku, pk):
                _node_forward_inline(t, z, s, hinfo, prm, F)
                if t < T - 2:
                    t += 1
                    s[t] = 0
                    continue
                # a parent of leaves: its leaves together, then its own row (after all its children)
                _leaf_table(s, S, T, npar, par, roff, ff, Ku, pk, tnpar, tpar, troff, tt, Wl, coef)
                q_hi = S
                if canon:
                    _orbit_weights(mx[T - 1], S, orbit, Wl)
                    q_hi = min(S, mx[T - 1] + 2)
                loss += _leaf_group(0, q_hi, z, s, hinfo, prm, F, gr, Wl, Q, qs, eps, softmax_readout, want_grad)
                if want_grad:
                    _node_backward_inline(t, z, s, hinfo, prm, F, gr)
            # next node: the next sibling, or up (a parent is back-propagated after its last child)
            done = False
            while True:
                F[oH + t * dw + s[t]] = 0.0
                s[t] += 1
                if s[t] < (min(S, mx[t] + 2) if canon else S):
                    break
                s[t] = 0
                t -= 1
                if t < n_fixed:
                    done = True
                    break
                if want_grad:
                    _node_backward(t, z, s, hinfo, prm, F, gr)
            if done:
                break
    if want_grad:
        for t in range(n_inner_fixed - 1, -1, -1):
            _node_backward(t, z, s, hinfo, prm, F, gr)
    return loss


def _run_blocks_body(lo, ids, n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT, eps,
                     softmax_readout, want_grad, canon, orbit, loss_out, gr_out):
    """Blocks ``ids[lo] … ids[lo + len(loss_out) - 1]`` into slots ``0 …`` (``loss_out[b]``, ``gr_out[b] = [dA | dW]``;
    ``ids`` every block in order, or the canonical ones only)."""
    for b in prange(loss_out.shape[0]):
        loss_out[b] = _block(ids[lo + b], n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff,
                             ttabT, eps, softmax_readout, want_grad, canon, orbit, gr_out[b])


run_blocks, run_blocks_serial = twins(_run_blocks_body)
