"""Numba kernels of the disentangled-transformer engine (DESIGN §18): a trie walk, forward and reverse.

Layout (built by :mod:`popgrad.engine.catformer`). Every array below is a
region of one flat float64 workspace ``F`` (offsets: :func:`_offsets`), the
parameters are one flat vector ``prm = [Ã (all heads) | Ãᵀ | W | Wᵀ]`` and the
gradient one flat ``gr = [dÃ | dW]``, indexed with integer offsets: numba
updates an atomic reference count for every array argument and every view, so
the hot path passes a handful of arrays and creates no views.

* ``H[t, :]`` -- row ``t`` of the last layer's input and below, width ``d_{L-1}``
  (every layer concatenates, so row ``t`` of layer ``ℓ`` is ``H[t, :d_ℓ]``).
  Its first ``d_0`` coordinates are the input ``x̃_t = [e_{s_t}, e_t]``: two
  ones, at ``s_t`` and ``S + t``. Every product with a row is written
  *sparse*: the two gathers plus the dense coordinates ``d_0 …``; for layer 1
  (``d_in = d_0``) that is the four gathers of DESIGN §18,
  ``z_tj = Ã[s_t,s_j] + Ã[s_t,S+j] + Ã[S+t,s_j] + Ã[S+t,S+j]``.
* heads in global order ``g`` (layer by layer, heads in order); ``hinfo[g] =
  (layer, d_in, out, aoff)``: the 1-based layer, its input width, the offset
  of its output in ``H`` (``d_in (1 + k)``) and of its matrix in ``Af``
  (row-major ``d_in × d_in``; ``Ht`` is ``H`` transposed, for contiguous score
  loops). ``U[t, g, :]`` holds ``u = H[t] Ã_g`` (the
  query side of the scores, kept for the backward pass), ``Pr[t, g, :t+1]`` the
  attention row.
* the readout ``W (d_L, S)``: ``z = H[T-1] W[:d_{L-1}] + Σ_k Σ_j P^k_j hw[j, k]``
  with ``hw[j, k] = H[j] W[d_{L-1}(1+k) : d_{L-1}(2+k)]`` (``S`` numbers per
  row and last-layer head, computed once per prefix node).

Walk: block ``b`` fixes positions ``0 … D-1`` to the base-``S`` digits of
``b``; below them a depth-first odometer. Entering node ``(t, s_t)``
multiplies the per-atom weight products ``pk[t] = pk[t-1] · ftab[:, row_t, s_t]``
(a subtree whose products are all zero contributes nothing and is skipped) and
computes row ``t`` of layers ``1 … L-1`` and ``hw[t]``; a leaf (``t = T-1``)
also computes the last layer's row ``T-1``, the readout and the loss. Reverse
mode over the same tree: adjoints ``G[j]`` (of ``H[j]``) and ``Ghw[j]`` of the
rows ``j`` on the current path accumulate over the subtree; a node
back-propagates its own row once, after all its children
(:func:`_node_backward`), into the parameters and the rows above it. A
block ends with the backward pass of its fixed rows ``D-1 … 0``, so each
block's slot is its exact partial gradient.

``cache=True``, no ``fastmath``; :func:`run_blocks` (parallel) and
:func:`run_blocks_serial` run the same blocks into one slot each.
"""
import numpy as np
from numba import njit, prange

from .twins import twins


#: Index type of the hot loops: numba wraps negative *signed* indices (a compare-and-add per access, which
#: also keeps LLVM from vectorizing); unsigned indices skip that, so every offset below is a uint64.
U = np.uint64


@njit(cache=True, error_model="numpy", inline="always")
def _offsets(z):
    """Offsets (uint64) of the workspace ``F`` (see :func:`_block`) from the size tuple ``z``."""
    T, S, dw, nh, dmax, nl = U(z[0]), U(z[1]), U(z[3]), U(z[4]), U(z[5]), U(z[6])
    oH = U(0)
    oHt = oH + T * dw
    oG = oHt + dw * T
    oPr = oG + T * dw
    oU = oPr + T * nh * T
    ohw = oU + T * nh * dmax
    oGhw = ohw + T * nl * S
    odP = oGhw + T * nl * S
    odzs = odP + T
    odu = odzs + T
    oo = odu + dmax
    oz = oo + dmax
    odz = oz + S
    owv = odz + S
    return oH, oHt, oG, oPr, oU, ohw, oGhw, odP, odzs, odu, oo, oz, odz, owv, owv + S


@njit(cache=True, error_model="numpy", inline="always")
def _row_forward(t_, g_, z, s, hinfo, prm, F, write_out):
    """Row ``t`` of head ``g``: ``u = H[t] Ã``, scores ``z_j = u · H[j]`` (``j ≤ t``), softmax, output.

    The output ``Σ_j P_j H[j, :d_in]`` goes to ``H[t, out : out + d_in]`` and ``Ht`` when ``write_out``.
    """
    T, S, d0, dw, nh, dmax = U(z[0]), U(z[1]), U(z[2]), U(z[3]), U(z[4]), U(z[5])
    oH, oHt, oG, oPr, oU, ohw, oGhw, odP, odzs, odu, oo, oz, odz, owv, _ = _offsets(z)
    t, g = U(t_), U(g_)
    din = U(hinfo[g, 1])
    out = U(hinfo[g, 2])
    ao = U(hinfo[g, 3])
    u0 = oU + (t * nh + g) * dmax
    h0 = oH + t * dw
    r1 = ao + U(s[t]) * din
    r2 = ao + (S + t) * din
    for b in range(din):
        F[u0 + b] = prm[r1 + b] + prm[r2 + b]
    for a in range(d0, din):
        x = F[h0 + a]
        if x != 0.0:
            ra = ao + a * din
            for b in range(din):
                F[u0 + b] += x * prm[ra + b]
    p0 = oPr + (t * nh + g) * T
    n = t + U(1)
    for j in range(n):
        F[p0 + j] = F[u0 + U(s[j])] + F[u0 + S + j]
    for a in range(d0, din):
        ua = F[u0 + a]
        q0 = oHt + a * T
        for j in range(n):
            F[p0 + j] += ua * F[q0 + j]
    m = F[p0]
    for j in range(U(1), n):
        if F[p0 + j] > m:
            m = F[p0 + j]
    tot = 0.0
    for j in range(n):
        e = np.exp(F[p0 + j] - m)
        F[p0 + j] = e
        tot += e
    inv = 1.0 / tot
    for j in range(n):
        F[p0 + j] *= inv
    if write_out:
        for a in range(din):
            F[oo + a] = 0.0
        for j in range(n):
            p = F[p0 + j]
            F[oo + U(s[j])] += p
            F[oo + S + j] += p
            hj = oH + j * dw
            for a in range(d0, din):
                F[oo + a] += p * F[hj + a]
        for a in range(din):
            v = F[oo + a]
            F[h0 + out + a] = v
            F[oHt + (out + a) * T + t] = v


@njit(cache=True, error_model="numpy", inline="always")
def _softmax_backward(t_, g_, z, F):
    """``dzs_j = P_j (dP_j - Σ_i P_i dP_i)`` for ``j ≤ t``."""
    T, nh = U(z[0]), U(z[4])
    oH, oHt, oG, oPr, oU, ohw, oGhw, odP, odzs, odu, oo, oz, odz, owv, _ = _offsets(z)
    t, g = U(t_), U(g_)
    p0 = oPr + (t * nh + g) * T
    n = t + U(1)
    m = 0.0
    for j in range(n):
        m += F[p0 + j] * F[odP + j]
    for j in range(n):
        F[odzs + j] = F[p0 + j] * (F[odP + j] - m)


@njit(cache=True, error_model="numpy", inline="always")
def _scores_backward(t_, g_, z, s, hinfo, prm, F, gr):
    """Adjoint of the scores ``z_j = H[t] Ã H[j]ᵀ`` of row ``t``, head ``g``, given ``dzs[j] = ∂L/∂z_j``.

    ``du = Σ_j dz_j H[j]``; ``dÃ += H[t]ᵀ du``; ``G[t] += Ã du``; ``G[j] += dz_j u`` (coordinates ``≥ d_0``
    only: the input ``x̃`` needs no adjoint).
    """
    T, S, d0, dw, nh, dmax = U(z[0]), U(z[1]), U(z[2]), U(z[3]), U(z[4]), U(z[5])
    nA = U(z[8])
    oH, oHt, oG, oPr, oU, ohw, oGhw, odP, odzs, odu, oo, oz, odz, owv, _ = _offsets(z)
    t, g = U(t_), U(g_)
    din = U(hinfo[g, 1])
    ao = U(hinfo[g, 3])
    u0 = oU + (t * nh + g) * dmax
    for b in range(din):
        F[odu + b] = 0.0
    for j in range(t + U(1)):
        c = F[odzs + j]
        F[odu + U(s[j])] += c
        F[odu + S + j] += c
        if c != 0.0:
            hj = oH + j * dw
            gj = oG + j * dw
            for a in range(d0, din):
                F[odu + a] += c * F[hj + a]
                F[gj + a] += c * F[u0 + a]
    r1 = ao + U(s[t]) * din
    r2 = ao + (S + t) * din
    for b in range(din):
        gr[r1 + b] += F[odu + b]
    for b in range(din):
        gr[r2 + b] += F[odu + b]
    h0 = oH + t * dw
    for a in range(d0, din):
        x = F[h0 + a]
        if x != 0.0:
            ra = ao + a * din
            for b in range(din):
                gr[ra + b] += x * F[odu + b]
    g0 = oG + t * dw
    for b in range(din):
        c = F[odu + b]
        if c != 0.0:
            rb = nA + ao + b * din
            for a in range(d0, din):
                F[g0 + a] += c * prm[rb + a]


@njit(cache=True, error_model="numpy")
def _node_forward(t_, z, s, hinfo, prm, F):
    """Row ``t`` of layers ``1 … L-1`` (heads ``0 … n_inner-1``) and ``hw[t, k] = H[t] W_k`` of the last heads."""
    T, S, d0, dw, nh, dmax, nl = U(z[0]), U(z[1]), U(z[2]), U(z[3]), U(z[4]), U(z[5]), U(z[6])
    nA, dl1, n_inner, last0, n_last = U(z[8]), U(z[9]), z[10], z[11], z[12]
    oH, oHt, oG, oPr, oU, ohw, oGhw, odP, odzs, odu, oo, oz, odz, owv, _ = _offsets(z)
    for g in range(n_inner):
        _row_forward(t_, g, z, s, hinfo, prm, F, True)
    t = U(t_)
    oW = U(2) * nA
    h0 = oH + t * dw
    st = U(s[t])
    for k_ in range(n_last):
        k = U(k_)
        wo = U(hinfo[last0 + k_, 2])
        k0 = ohw + (t * nl + k) * S
        for c in range(S):
            F[k0 + c] = prm[oW + (wo + st) * S + c] + prm[oW + (wo + S + t) * S + c]
        for a in range(d0, dl1):
            x = F[h0 + a]
            if x != 0.0:
                w0 = oW + (wo + a) * S
                for c in range(S):
                    F[k0 + c] += x * prm[w0 + c]


@njit(cache=True, error_model="numpy")
def _node_backward(t_, z, s, hinfo, prm, F, gr):
    """Back-propagate row ``t`` (its ``hw[t]``, then layers ``L-1 … 1``) from the adjoints ``G[t]``, ``Ghw[t]``.

    Adds into ``dA``, ``dW`` and ``G[j]`` for ``j ≤ t``; then zeroes ``G[t]``, ``Ghw[t]`` (for the next sibling).
    """
    T, S, d0, dw, nh, dmax, nl = U(z[0]), U(z[1]), U(z[2]), U(z[3]), U(z[4]), U(z[5]), U(z[6])
    dL, nA, dl1, n_inner, last0, n_last = U(z[7]), U(z[8]), U(z[9]), z[10], z[11], z[12]
    oH, oHt, oG, oPr, oU, ohw, oGhw, odP, odzs, odu, oo, oz, odz, owv, _ = _offsets(z)
    t = U(t_)
    oW = U(2) * nA
    oWT = oW + dL * S
    h0 = oH + t * dw
    g0 = oG + t * dw
    st = U(s[t])
    n = t + U(1)
    for k_ in range(n_last):
        k = U(k_)
        wo = U(hinfo[last0 + k_, 2])
        k0 = oGhw + (t * nl + k) * S
        for c in range(S):
            gr[nA + (wo + st) * S + c] += F[k0 + c]
            gr[nA + (wo + S + t) * S + c] += F[k0 + c]
        for a in range(d0, dl1):
            x = F[h0 + a]
            if x != 0.0:
                w0 = nA + (wo + a) * S
                for c in range(S):
                    gr[w0 + c] += x * F[k0 + c]
        for c in range(S):
            gc = F[k0 + c]
            if gc != 0.0:
                w0 = oWT + c * dL + wo
                for a in range(d0, dl1):
                    F[g0 + a] += gc * prm[w0 + a]
    for g_ in range(n_inner - 1, -1, -1):
        g = U(g_)
        din = U(hinfo[g, 1])
        out = U(hinfo[g, 2])
        for j in range(n):
            F[odP + j] = F[g0 + out + U(s[j])] + F[g0 + out + S + j]
        for a in range(d0, din):
            ga = F[g0 + out + a]
            if ga != 0.0:
                q0 = oHt + a * T
                for j in range(n):
                    F[odP + j] += ga * F[q0 + j]
        p0 = oPr + (t * nh + g) * T
        for j in range(n):
            p = F[p0 + j]
            gj = oG + j * dw
            for a in range(d0, din):
                F[gj + a] += p * F[g0 + out + a]
        _softmax_backward(t_, g_, z, F)
        _scores_backward(t_, g_, z, s, hinfo, prm, F, gr)
    for a in range(dw):
        F[g0 + a] = 0.0
    for k_ in range(n_last):
        k0 = oGhw + (t * nl + U(k_)) * S
        for c in range(S):
            F[k0 + c] = 0.0


@njit(cache=True, error_model="numpy")
def _enter_weights(t, s, S, npar, par, roff, ftabT, pk):
    """``pk[t+1, k] = pk[t, k] · ftab[k, row_t(s), s_t]``; return whether any product is positive.

    ``ftabT[row, token, k]`` is the factor table with the atoms last (contiguous products).
    """
    r = 0  # the parents' flat row: Σ_h s[par_h] S^{n-1-h}
    for h in range(npar[t]):
        r = r * S + s[par[t, h]]
    K = U(pk.shape[1])
    fo = (U(roff[t] + r) * U(S) + U(s[t])) * K
    ff = ftabT.reshape(-1)
    pf = pk.reshape(-1)
    src = U(t) * K
    dst = src + K
    alive = False
    for k in range(K):
        v = pf[src + k] * ff[fo + k]
        pf[dst + k] = v
        if v != 0.0:
            alive = True
    return alive


@njit(cache=True, error_model="numpy")
def _leaf_table(s, S, T, npar, par, roff, ftabT, pk, tnpar, tpar, troff, ttabT, Wl, coef):
    """``Wl[q, c] = w(s_0 … s_{T-2} q, c)`` for every last token ``q`` (once per parent of leaves).

    ``Wl[q, c] = Σ_k pk[T-1, k] ftab[k, row_{T-1}, q] ttab[k, r_tp(q), c]`` with the tables atoms-last
    (``ftabT``, ``ttabT``); the sum over atoms in four interleaved partial sums.
    """
    t = T - 1
    r = 0
    for h in range(npar[t]):
        r = r * S + s[par[t, h]]
    row = U(roff[t] + r)
    K = U(pk.shape[1])
    nS = U(Wl.shape[1])
    Su = U(S)
    ff = ftabT.reshape(-1)
    tt = ttabT.reshape(-1)
    pf = pk.reshape(-1)
    Wf = Wl.reshape(-1)
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
            Wf[q * nS + c] = (a0 + a1) + (a2 + a3)


@njit(cache=True, error_model="numpy")
def _leaf(z, s, hinfo, prm, F, gr, eps, softmax_readout, want_grad):
    """Last position: the last layer's row ``T-1``, readout, loss ``-Σ_c w_c log(f_c + ε)``, its backward.

    The leaf's weights ``w(s, ·)`` are in ``F[owv:]``. Returns the leaf's loss; the caller back-propagates
    the row ``T-1`` itself (:func:`_node_backward`).
    """
    T, S, d0, dw, nh, dmax, nl = U(z[0]), U(z[1]), U(z[2]), U(z[3]), U(z[4]), U(z[5]), U(z[6])
    dL, nA, dl1, n_inner, last0, n_last = U(z[7]), U(z[8]), U(z[9]), z[10], z[11], z[12]
    oH, oHt, oG, oPr, oU, ohw, oGhw, odP, odzs, odu, oo, oz, odz, owv, _ = _offsets(z)
    oW = U(2) * nA
    oWT = oW + dL * S
    t_ = z[0] - 1
    t = T - U(1)
    h0 = oH + t * dw
    g0 = oG + t * dw
    st = U(s[t])
    tot_w = 0.0
    for c in range(S):
        tot_w += F[owv + c]
    for k in range(n_last):
        _row_forward(t_, last0 + k, z, s, hinfo, prm, F, False)
    for c in range(S):
        F[oz + c] = prm[oW + st * S + c] + prm[oW + (S + t) * S + c]
    for a in range(d0, dl1):
        x = F[h0 + a]
        if x != 0.0:
            for c in range(S):
                F[oz + c] += x * prm[oW + a * S + c]
    for k_ in range(n_last):
        k = U(k_)
        p0 = oPr + (t * nh + U(last0) + k) * T
        for j in range(T):
            p = F[p0 + j]
            k0 = ohw + (j * nl + k) * S
            for c in range(S):
                F[oz + c] += p * F[k0 + c]
    loss = 0.0
    if softmax_readout:
        m = F[oz]
        for c in range(U(1), S):
            if F[oz + c] > m:
                m = F[oz + c]
        tot = 0.0
        for c in range(S):
            tot += np.exp(F[oz + c] - m)
        lse = m + np.log(tot)
        if eps == 0.0:  # cross entropy as a log-softmax
            for c in range(S):
                wc = F[owv + c]
                if wc > 0.0:
                    loss -= wc * (F[oz + c] - lse)
                F[odz + c] = np.exp(F[oz + c] - lse) * tot_w - wc
        else:
            rbar = 0.0
            for c in range(S):
                f = np.exp(F[oz + c] - lse)
                wc = F[owv + c]
                if wc > 0.0:
                    loss -= wc * np.log(f + eps)
                    F[odz + c] = -wc / (f + eps)
                else:
                    F[odz + c] = 0.0
                rbar += f * F[odz + c]
            for c in range(S):
                F[odz + c] = np.exp(F[oz + c] - lse) * (F[odz + c] - rbar)
    else:
        for c in range(S):
            wc = F[owv + c]
            if wc > 0.0:
                loss -= wc * np.log(F[oz + c] + eps)
                F[odz + c] = -wc / (F[oz + c] + eps)
            else:
                F[odz + c] = 0.0
    if not want_grad:
        return loss
    # readout z = H[t] W[:dl1] + Σ_k Σ_j P^k_j hw[j, k]
    for c in range(S):
        gr[nA + st * S + c] += F[odz + c]
        gr[nA + (S + t) * S + c] += F[odz + c]
    for a in range(d0, dl1):
        x = F[h0 + a]
        if x != 0.0:
            for c in range(S):
                gr[nA + a * S + c] += x * F[odz + c]
    for c in range(S):
        gc = F[odz + c]
        w0 = oWT + c * dL
        for a in range(d0, dl1):
            F[g0 + a] += gc * prm[w0 + a]
    for k_ in range(n_last):
        k = U(k_)
        g = last0 + k_
        p0 = oPr + (t * nh + U(g)) * T
        for j in range(T):
            p = F[p0 + j]
            k0 = ohw + (j * nl + k) * S
            q0 = oGhw + (j * nl + k) * S
            v = 0.0
            for c in range(S):
                v += F[odz + c] * F[k0 + c]
                F[q0 + c] += p * F[odz + c]
            F[odP + j] = v
        _softmax_backward(t_, g, z, F)
        _scores_backward(t_, g, z, s, hinfo, prm, F, gr)
    return loss


@njit(cache=True, error_model="numpy")
def _block(b, n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT, eps, softmax_readout,
           want_grad, gr):
    """Block ``b``: every sequence whose first ``n_fixed`` tokens are the base-``S`` digits of ``b``; its loss.

    Adds the block's gradient into ``gr = [dA (flat, the layout of Af) | dW (flat)]``. One float workspace
    ``F`` holds the rows ``H``, their transpose ``Ht``, the adjoints ``G``, the attention rows ``Pr``, the
    query vectors ``U``, ``hw`` and its adjoint and the leaf scratch (:func:`_offsets`): the helpers take
    a handful of arrays and index them flat (no views in the loops: every view or array argument costs
    an atomic reference-count update).
    """
    T, S = z[0], z[1]
    K = pk0.shape[0]
    oH, oHt, oG, oPr, oU, ohw, oGhw, odP, odzs, odu, oo, oz, odz, owv, size = _offsets(z)
    oH, owv, dw = z[3] * 0, int(owv), z[3]  # signed offsets for the walk's few accesses
    F = np.zeros(int(size))
    s = np.zeros(T, dtype=np.int64)
    pk = np.zeros((T + 1, K))
    Wl = np.zeros((S, S))
    coef = np.zeros(K)
    for k in range(K):
        pk[0, k] = pk0[k]
    rem = b
    for t in range(n_fixed - 1, -1, -1):
        s[t] = rem % S
        rem //= S
    for t in range(T):  # x̃_t: the position one-hot is fixed; the token one-hot moves with the walk
        F[oH + t * dw + S + t] = 1.0
    loss = 0.0
    for t in range(n_fixed):
        F[oH + t * dw + s[t]] = 1.0
        if t < T - 1:
            alive = _enter_weights(t, s, S, npar, par, roff, ftabT, pk)
        else:
            _leaf_table(s, S, T, npar, par, roff, ftabT, pk, tnpar, tpar, troff, ttabT, Wl, coef)
            alive = False
            for c in range(S):
                F[owv + c] = Wl[s[t], c]
                if Wl[s[t], c] > 0.0:
                    alive = True
        if not alive:
            return 0.0
        _node_forward(t, z, s, hinfo, prm, F)
    if n_fixed == T:  # the block is one sequence
        loss = _leaf(z, s, hinfo, prm, F, gr, eps, softmax_readout, want_grad)
    else:
        t = n_fixed
        s[t] = 0
        while True:
            F[oH + t * dw + s[t]] = 1.0
            if t < T - 1:
                ok = _enter_weights(t, s, S, npar, par, roff, ftabT, pk)
            else:
                if s[t] == 0:
                    _leaf_table(s, S, T, npar, par, roff, ftabT, pk, tnpar, tpar, troff, ttabT, Wl, coef)
                ok = False
                q = s[t]
                for c in range(S):
                    F[owv + c] = Wl[q, c]
                    if Wl[q, c] > 0.0:
                        ok = True
            if ok:
                _node_forward(t, z, s, hinfo, prm, F)
                if t < T - 1:
                    t += 1
                    s[t] = 0
                    continue
                loss += _leaf(z, s, hinfo, prm, F, gr, eps, softmax_readout, want_grad)
                if want_grad:
                    _node_backward(t, z, s, hinfo, prm, F, gr)
            # next node: the next sibling, or up (a parent is back-propagated after its last child)
            done = False
            while True:
                F[oH + t * dw + s[t]] = 0.0
                s[t] += 1
                if s[t] < S:
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
        for t in range(n_fixed - 1, -1, -1):
            _node_backward(t, z, s, hinfo, prm, F, gr)
    return loss


@njit(cache=True, parallel=True, error_model="numpy")
def run_blocks(lo, n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT, eps,
               softmax_readout, want_grad, loss_out, gr_out):
    """Blocks ``lo … lo + len(loss_out) - 1`` into slots ``0 …`` (``loss_out[b]``, ``gr_out[b] = [dA | dW]``)."""
    for b in prange(loss_out.shape[0]):
        loss_out[b] = _block(lo + b, n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT,
                             eps, softmax_readout, want_grad, gr_out[b])


@njit(cache=True, error_model="numpy")
def run_blocks_serial(lo, n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT, eps,
                      softmax_readout, want_grad, loss_out, gr_out):
    """:func:`run_blocks` on the calling thread (same blocks, same bits)."""
    for b in range(loss_out.shape[0]):
        loss_out[b] = _block(lo + b, n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT,
                             eps, softmax_readout, want_grad, gr_out[b])


@njit(cache=True)
def sum_slots(loss_out, gr_out):
    """Add the slots in block order into slot 0 (thread-count independent); return the total loss."""
    loss = loss_out[0]
    for b in range(1, loss_out.shape[0]):
        loss += loss_out[b]
        gr_out[0] += gr_out[b]
    loss_out[0] = loss
    return loss


# ====================================================================== explicit rows (sampled, weight tables)
@njit(cache=True, error_model="numpy")
def _rows_block(lo, hi, seqs, w, z, hinfo, prm, eps, softmax_readout, want_grad, gr):
    """Rows ``lo … hi-1`` of ``seqs`` with weights ``w``: their loss; adds their gradient into ``gr``.

    The rows are walked as the paths of a trie: a row that shares its first ``p`` tokens with the
    previous one reuses that row's forward rows ``0 … p-1`` (rows ``≥ p`` of the previous path are
    back-propagated first, a node always after all its children), so sorted rows cost what the
    trie of their prefixes costs. A row whose weights are all zero contributes nothing and is skipped.
    """
    T, S = z[0], z[1]
    dw = z[3]
    owv = int(_offsets(z)[13])
    size = _offsets(z)[14]
    F = np.zeros(int(size))
    s = np.zeros(T, dtype=np.int64)
    for t in range(T):  # x̃_t: the position one-hot is fixed
        F[t * dw + S + t] = 1.0
    loss = 0.0
    depth = 0  # positions 0 … depth-1 of s hold a path whose rows are computed (and not yet back-propagated)
    for r in range(lo, hi):
        alive = False
        for c in range(S):
            if w[r, c] != 0.0:
                alive = True
        if not alive:
            continue
        p = 0
        while p < depth and p < T - 1 and seqs[r, p] == s[p]:
            p += 1
        for t in range(depth - 1, p - 1, -1):  # leave the previous path down to the shared prefix
            if want_grad and t < T - 1:  # row T-1 was back-propagated right after its leaf
                _node_backward(t, z, s, hinfo, prm, F, gr)
            F[t * dw + s[t]] = 0.0
        for t in range(p, T):
            s[t] = seqs[r, t]
            F[t * dw + s[t]] = 1.0
            _node_forward(t, z, s, hinfo, prm, F)
        depth = T
        for c in range(S):
            F[owv + c] = w[r, c]
        loss += _leaf(z, s, hinfo, prm, F, gr, eps, softmax_readout, want_grad)
        if want_grad:
            _node_backward(T - 1, z, s, hinfo, prm, F, gr)
    if want_grad:
        for t in range(min(depth, T - 1) - 1, -1, -1):
            _node_backward(t, z, s, hinfo, prm, F, gr)
    return loss


def _run_rows_body(seqs, w, rows_per_block, z, hinfo, prm, eps, softmax_readout, want_grad, loss_out, gr_out):
    """Block ``b`` = rows ``b·rows_per_block …`` into slot ``b`` (``loss_out[b]``, ``gr_out[b] = [dA | dW]``)."""
    n = seqs.shape[0]
    for b in prange(loss_out.shape[0]):
        lo = b * rows_per_block
        hi = min(n, lo + rows_per_block)
        loss_out[b] = _rows_block(lo, hi, seqs, w, z, hinfo, prm, eps, softmax_readout, want_grad, gr_out[b])


run_rows, run_rows_serial = twins(_run_rows_body)
