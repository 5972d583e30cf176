"""Numba kernels of the disentangled-transformer engine (DESIGN §14): a trie walk, forward and reverse.

Layout (built by :mod:`popgrad.engine.catformer`):

* ``H[t, :]`` -- row ``t`` of the last layer's input and below, width ``d_{L-1}``
  (every layer concatenates, so row ``t`` of layer ``ℓ`` is ``H[t, :d_ℓ]``).
  Its first ``d_0`` coordinates are the input ``x̃_t = [e_{s_t}, e_t]``: two
  ones, at ``s_t`` and ``S + t``. Every product with a row is written
  *sparse*: the two gathers plus the dense coordinates ``d_0 …``; for layer 1
  (``d_in = d_0``) that is the four gathers of DESIGN §14,
  ``z_tj = Ã[s_t,s_j] + Ã[s_t,S+j] + Ã[S+t,s_j] + Ã[S+t,S+j]``.
* heads in global order ``g`` (layer by layer, heads in order); ``hinfo[g] =
  (layer, d_in, out, aoff)``: the 1-based layer, its input width, the offset
  of its output in ``H`` (``d_in (1 + k)``) and of its matrix in ``Af``
  (row-major ``d_in × d_in``). ``U[t, g, :]`` holds ``u = H[t] Ã_g`` (the
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


@njit(cache=True, error_model="numpy")
def _row_forward(t, s, S, d0, g, hinfo, Af, H, Ht, Pr, U, o, write_out):
    """Row ``t`` of head ``g``: ``u = H[t] Ã``, scores ``z_j = u · H[j]`` (``j ≤ t``), softmax, output.

    The output ``Σ_j P_j H[j, :d_in]`` goes to ``H[t, out : out + d_in]`` and ``Ht`` when ``write_out``.
    (Inner loops run over 1-D views from index 0, so LLVM sees non-negative, contiguous indices.)
    """
    din = hinfo[g, 1]
    oo = hinfo[g, 2]
    ao = hinfo[g, 3]
    nd = din - d0
    u = U[t, g, :din]
    a1 = Af[ao + s[t] * din: ao + s[t] * din + din]
    a2 = Af[ao + (S + t) * din: ao + (S + t) * din + din]
    for b in range(din):
        u[b] = a1[b] + a2[b]
    ht = H[t, d0:din]
    for a in range(nd):
        x = ht[a]
        if x != 0.0:
            ra = ao + (d0 + a) * din
            arow = Af[ra: ra + din]
            for b in range(din):
                u[b] += x * arow[b]
    n = t + 1
    pr = Pr[t, g, :n]
    for j in range(n):
        pr[j] = u[s[j]] + u[S + j]
    ud = u[d0:din]
    for a in range(nd):
        ua = ud[a]
        hta = Ht[d0 + a, :n]
        for j in range(n):
            pr[j] += ua * hta[j]
    m = pr[0]
    for j in range(1, n):
        if pr[j] > m:
            m = pr[j]
    tot = 0.0
    for j in range(n):
        e = np.exp(pr[j] - m)
        pr[j] = e
        tot += e
    inv = 1.0 / tot
    for j in range(n):
        pr[j] *= inv
    if write_out:
        ov = o[:din]
        for a in range(din):
            ov[a] = 0.0
        od = o[d0:din]
        for j in range(n):
            p = pr[j]
            ov[s[j]] += p
            ov[S + j] += p
            hj = H[j, d0:din]
            for a in range(nd):
                od[a] += p * hj[a]
        hout = H[t, oo: oo + din]
        for a in range(din):
            hout[a] = ov[a]
            Ht[oo + a, t] = ov[a]


@njit(cache=True, error_model="numpy")
def _scores_backward(t, s, S, d0, g, hinfo, Af, AfT, H, U, dzs, du, G, dA):
    """Adjoint of the scores ``z_j = H[t] Ã H[j]ᵀ`` of row ``t``, head ``g``, given ``dzs[j] = ∂L/∂z_j``.

    ``du = Σ_j dz_j H[j]``; ``dÃ += H[t]ᵀ du``; ``G[t] += Ã du``; ``G[j] += dz_j u`` (coordinates ``≥ d_0``
    only: the input ``x̃`` needs no adjoint).
    """
    din = hinfo[g, 1]
    ao = hinfo[g, 3]
    nd = din - d0
    ud = U[t, g, d0:din]
    dv = du[:din]
    for b in range(din):
        dv[b] = 0.0
    dd = du[d0:din]
    for j in range(t + 1):
        c = dzs[j]
        dv[s[j]] += c
        dv[S + j] += c
        if c != 0.0:
            hj = H[j, d0:din]
            gj = G[j, d0:din]
            for a in range(nd):
                dd[a] += c * hj[a]
                gj[a] += c * ud[a]
    r1 = ao + s[t] * din
    r2 = ao + (S + t) * din
    d1 = dA[r1: r1 + din]
    for b in range(din):
        d1[b] += dv[b]
    d2 = dA[r2: r2 + din]
    for b in range(din):
        d2[b] += dv[b]
    ht = H[t, d0:din]
    for a in range(nd):
        x = ht[a]
        if x != 0.0:
            ra = ao + (d0 + a) * din
            drow = dA[ra: ra + din]
            for b in range(din):
                drow[b] += x * dv[b]
    gt = G[t, d0:din]
    for b in range(din):
        c = dv[b]
        if c != 0.0:
            rb = ao + b * din + d0
            arow = AfT[rb: rb + nd]
            for a in range(nd):
                gt[a] += c * arow[a]


@njit(cache=True, error_model="numpy")
def _softmax_backward(t, g, Pr, dP, dzs):
    """``dzs_j = P_j (dP_j - Σ_i P_i dP_i)`` for ``j ≤ t``."""
    m = 0.0
    for j in range(t + 1):
        m += Pr[t, g, j] * dP[j]
    for j in range(t + 1):
        dzs[j] = Pr[t, g, j] * (dP[j] - m)


@njit(cache=True, error_model="numpy")
def _node_forward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Ht, Pr, U, hw, o):
    """Row ``t`` of layers ``1 … L-1`` (heads ``0 … n_inner-1``) and ``hw[t, k] = H[t] W_k`` of the last heads."""
    for g in range(n_inner):
        _row_forward(t, s, S, d0, g, hinfo, Af, H, Ht, Pr, U, o, True)
    nS = W.shape[1]
    for k in range(n_last):
        wo = hinfo[last0 + k, 2]
        hk = hw[t, k]
        for c in range(nS):
            hk[c] = W[wo + s[t], c] + W[wo + S + t, c]
        for a in range(d0, dl1):
            x = H[t, a]
            if x != 0.0:
                for c in range(nS):
                    hk[c] += x * W[wo + a, c]


@njit(cache=True, error_model="numpy")
def _node_backward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, AfT, W, WT, H, Ht, Pr, U, G, Ghw, dA, dW,
                   dP, dzs, du):
    """Back-propagate row ``t`` (its ``hw[t]``, then layers ``L-1 … 1``) from the adjoints ``G[t]``, ``Ghw[t]``.

    Adds into ``dA``, ``dW`` and ``G[j]`` for ``j ≤ t``; then zeroes ``G[t]``, ``Ghw[t]`` (for the next sibling).
    """
    nS = W.shape[1]
    gt = G[t]
    for k in range(n_last):
        wo = hinfo[last0 + k, 2]
        gk = Ghw[t, k]
        for c in range(nS):
            dW[wo + s[t], c] += gk[c]
            dW[wo + S + t, c] += gk[c]
        for a in range(d0, dl1):
            x = H[t, a]
            if x != 0.0:
                for c in range(nS):
                    dW[wo + a, c] += x * gk[c]
        for c in range(nS):
            gc = gk[c]
            if gc != 0.0:
                wt = WT[c]
                for a in range(d0, dl1):
                    gt[a] += gc * wt[wo + a]
    for g in range(n_inner - 1, -1, -1):
        din = hinfo[g, 1]
        oo = hinfo[g, 2]
        for j in range(t + 1):
            dP[j] = gt[oo + s[j]] + gt[oo + S + j]
        for a in range(d0, din):
            ga = gt[oo + a]
            if ga != 0.0:
                hta = Ht[a]
                for j in range(t + 1):
                    dP[j] += ga * hta[j]
        pr = Pr[t, g]
        for j in range(t + 1):
            p = pr[j]
            gj = G[j]
            for a in range(d0, din):
                gj[a] += p * gt[oo + a]
        _softmax_backward(t, g, Pr, dP, dzs)
        _scores_backward(t, s, S, d0, g, hinfo, Af, AfT, H, U, dzs, du, G, dA)
    for a in range(gt.shape[0]):
        gt[a] = 0.0
    for k in range(n_last):
        for c in range(nS):
            Ghw[t, k, c] = 0.0


@njit(cache=True, error_model="numpy")
def _enter_weights(t, s, S, npar, par, roff, ftabT, pk):
    """``pk[t+1, k] = pk[t, k] · ftab[k, row_t(s), s_t]``; return whether any product is positive.

    ``ftabT[row, token, k]`` is the factor table with the atoms last (contiguous products).
    """
    r = 0  # the parents' flat row: Σ_h s[par_h] S^{n-1-h}
    for h in range(npar[t]):
        r = r * S + s[par[t, h]]
    f = ftabT[roff[t] + r, s[t]]
    src = pk[t]
    dst = pk[t + 1]
    alive = False
    for k in range(src.shape[0]):
        v = src[k] * f[k]
        dst[k] = v
        if v != 0.0:
            alive = True
    return alive


@njit(cache=True, error_model="numpy")
def _leaf_table(s, S, T, npar, par, roff, ftabT, pk, tnpar, tpar, troff, ttabT, Wl, coef):
    """``Wl[q, c] = w(s_0 … s_{T-2} q, c)`` for every last token ``q`` (once per parent of leaves).

    ``Wl[q, c] = Σ_k pk[T-1, k] ftab[k, row_{T-1}, q] ttab[k, r_tp(q), c]`` with the tables atoms-last
    (``ftabT``, ``ttabT``); the sum over atoms in two interleaved partial sums.
    """
    t = T - 1
    r = 0
    for h in range(npar[t]):
        r = r * S + s[par[t, h]]
    row = roff[t] + r
    K = pk.shape[1]
    nS = Wl.shape[1]
    src = pk[t]
    for q in range(S):
        rt = 0
        for h in range(tnpar):
            tok = q if tpar[h] == t else s[tpar[h]]
            rt = rt * S + tok
        f = ftabT[row, q]
        for k in range(K):
            coef[k] = src[k] * f[k]
        for c in range(nS):
            tt = ttabT[troff + rt, c]
            a0 = 0.0
            a1 = 0.0
            k = 0
            while k + 1 < K:
                a0 += coef[k] * tt[k]
                a1 += coef[k + 1] * tt[k + 1]
                k += 2
            if k < K:
                a0 += coef[k] * tt[k]
            Wl[q, c] = a0 + a1


@njit(cache=True, error_model="numpy")
def _leaf(s, S, T, d0, dl1, last0, n_last, hinfo, Af, AfT, W, WT, H, Ht, Pr, U, hw, G, Ghw, wv, eps,
          softmax_readout, want_grad, dA, dW, z, dz, dP, dzs, du, o):
    """Last position: the last layer's row ``T-1``, readout, loss ``-Σ_c w_c log(f_c + ε)``, its backward.

    ``wv`` holds the leaf's weights ``w(s, ·)``. Returns the leaf's loss; the caller back-propagates the
    row ``T-1`` itself (:func:`_node_backward`).
    """
    t = T - 1
    nS = W.shape[1]
    tot_w = 0.0
    for c in range(nS):
        tot_w += wv[c]
    for k in range(n_last):
        _row_forward(t, s, S, d0, last0 + k, hinfo, Af, H, Ht, Pr, U, o, False)
    for c in range(nS):
        z[c] = W[s[t], c] + W[S + t, c]
    for a in range(d0, dl1):
        x = H[t, a]
        if x != 0.0:
            for c in range(nS):
                z[c] += x * W[a, c]
    for k in range(n_last):
        pr = Pr[t, last0 + k]
        for j in range(T):
            p = pr[j]
            hj = hw[j, k]
            for c in range(nS):
                z[c] += p * hj[c]
    loss = 0.0
    if softmax_readout:
        m = z[0]
        for c in range(1, nS):
            if z[c] > m:
                m = z[c]
        tot = 0.0
        for c in range(nS):
            tot += np.exp(z[c] - m)
        lse = m + np.log(tot)
        if eps == 0.0:  # cross entropy as a log-softmax
            for c in range(nS):
                if wv[c] > 0.0:
                    loss -= wv[c] * (z[c] - lse)
            for c in range(nS):
                dz[c] = np.exp(z[c] - lse) * tot_w - wv[c]
        else:
            rbar = 0.0
            for c in range(nS):
                f = np.exp(z[c] - lse)
                if wv[c] > 0.0:
                    loss -= wv[c] * np.log(f + eps)
                    dz[c] = -wv[c] / (f + eps)
                else:
                    dz[c] = 0.0
                rbar += f * dz[c]
            for c in range(nS):
                dz[c] = np.exp(z[c] - lse) * (dz[c] - rbar)
    else:
        for c in range(nS):
            if wv[c] > 0.0:
                loss -= wv[c] * np.log(z[c] + eps)
                dz[c] = -wv[c] / (z[c] + eps)
            else:
                dz[c] = 0.0
    if not want_grad:
        return loss
    # readout z = H[t] W[:dl1] + Σ_k Σ_j P^k_j hw[j, k]
    for c in range(nS):
        dW[s[t], c] += dz[c]
        dW[S + t, c] += dz[c]
    for a in range(d0, dl1):
        x = H[t, a]
        if x != 0.0:
            for c in range(nS):
                dW[a, c] += x * dz[c]
    gt = G[t]
    for c in range(nS):
        gc = dz[c]
        wt = WT[c]
        for a in range(d0, dl1):
            gt[a] += gc * wt[a]
    for k in range(n_last):
        g = last0 + k
        pr = Pr[t, g]
        for j in range(T):
            p = pr[j]
            hj = hw[j, k]
            gj = Ghw[j, k]
            v = 0.0
            for c in range(nS):
                v += dz[c] * hj[c]
                gj[c] += p * dz[c]
            dP[j] = v
        _softmax_backward(t, g, Pr, dP, dzs)
        _scores_backward(t, s, S, d0, g, hinfo, Af, AfT, H, U, dzs, du, G, dA)
    return loss


@njit(cache=True, error_model="numpy")
def _block(b, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, AfT, W, WT, npar, par, roff, ftabT, pk0,
           tnpar, tpar, troff, ttabT, eps, softmax_readout, want_grad, dA, dW):
    """Block ``b``: every sequence whose first ``n_fixed`` tokens are the base-``S`` digits of ``b``; its loss.

    Adds the block's gradient into ``dA`` (flat, the layout of ``Af``) and ``dW``.
    """
    nh = hinfo.shape[0]
    dmax = 1
    for g in range(nh):
        if hinfo[g, 1] > dmax:
            dmax = hinfo[g, 1]
    nS = W.shape[1]
    K = pk0.shape[0]
    dw = max(dl1, d0)
    s = np.zeros(T, dtype=np.int64)
    H = np.zeros((T, dw))
    Ht = np.zeros((dw, T))
    G = np.zeros((T, dw))
    Pr = np.zeros((T, nh, T))
    U = np.zeros((T, nh, dmax))
    hw = np.zeros((T, max(n_last, 1), nS))
    Ghw = np.zeros((T, max(n_last, 1), nS))
    pk = np.zeros((T + 1, K))
    Wl = np.zeros((S, nS))
    coef = np.zeros(K)
    z = np.zeros(nS)
    dz = np.zeros(nS)
    dP = np.zeros(T)
    dzs = np.zeros(T)
    du = np.zeros(dmax)
    o = np.zeros(dmax)
    for k in range(K):
        pk[0, k] = pk0[k]
    rem = b
    for t in range(n_fixed - 1, -1, -1):
        s[t] = rem % S
        rem //= S
    for t in range(T):  # x̃_t: the position one-hot is fixed; the token one-hot moves with the walk
        H[t, S + t] = 1.0
    loss = 0.0
    for t in range(n_fixed):
        H[t, s[t]] = 1.0
        if t < T - 1:
            alive = _enter_weights(t, s, S, npar, par, roff, ftabT, pk)
        else:
            _leaf_table(s, S, T, npar, par, roff, ftabT, pk, tnpar, tpar, troff, ttabT, Wl, coef)
            alive = False
            for c in range(nS):
                if Wl[s[t], c] > 0.0:
                    alive = True
        if not alive:
            return 0.0
        _node_forward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Ht, Pr, U, hw, o)
    if n_fixed == T:  # the block is one sequence
        loss = _leaf(s, S, T, d0, dl1, last0, n_last, hinfo, Af, AfT, W, WT, H, Ht, Pr, U, hw, G, Ghw,
                     Wl[s[T - 1]], eps, softmax_readout, want_grad, dA, dW, z, dz, dP, dzs, du, o)
    else:
        t = n_fixed
        s[t] = 0
        while True:
            H[t, s[t]] = 1.0
            if t < T - 1:
                ok = _enter_weights(t, s, S, npar, par, roff, ftabT, pk)
            else:
                if s[t] == 0:
                    _leaf_table(s, S, T, npar, par, roff, ftabT, pk, tnpar, tpar, troff, ttabT, Wl, coef)
                ok = False
                for c in range(nS):
                    if Wl[s[t], c] > 0.0:
                        ok = True
            if ok:
                _node_forward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Ht, Pr, U, hw, o)
                if t < T - 1:
                    t += 1
                    s[t] = 0
                    continue
                loss += _leaf(s, S, T, d0, dl1, last0, n_last, hinfo, Af, AfT, W, WT, H, Ht, Pr, U, hw, G, Ghw,
                              Wl[s[t]], eps, softmax_readout, want_grad, dA, dW, z, dz, dP, dzs, du, o)
                if want_grad:
                    _node_backward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, AfT, W, WT, H, Ht, Pr, U,
                                   G, Ghw, dA, dW, dP, dzs, du)
            # next node: the next sibling, or up (a parent is back-propagated after its last child)
            done = False
            while True:
                H[t, s[t]] = 0.0
                s[t] += 1
                if s[t] < S:
                    break
                s[t] = 0
                t -= 1
                if t < n_fixed:
                    done = True
                    break
                if want_grad:
                    _node_backward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, AfT, W, WT, H, Ht, Pr,
                                   U, G, Ghw, dA, dW, dP, dzs, du)
            if done:
                break
    if want_grad:
        for t in range(n_fixed - 1, -1, -1):
            _node_backward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, AfT, W, WT, H, Ht, Pr, U, G, Ghw,
                           dA, dW, dP, dzs, du)
    return loss


@njit(cache=True, parallel=True, error_model="numpy")
def run_blocks(lo, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, AfT, W, WT, npar, par, roff, ftabT,
               pk0, tnpar, tpar, troff, ttabT, eps, softmax_readout, want_grad, loss_out, dA_out, dW_out):
    """Blocks ``lo … lo + len(loss_out) - 1`` into slots ``0 …`` (``loss_out[b]``, ``dA_out[b]``, ``dW_out[b]``)."""
    for b in prange(loss_out.shape[0]):
        loss_out[b] = _block(lo + b, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, AfT, W, WT, npar, par, roff,
                             ftabT, pk0, tnpar, tpar, troff, ttabT, eps, softmax_readout, want_grad, dA_out[b],
                             dW_out[b])


@njit(cache=True, error_model="numpy")
def run_blocks_serial(lo, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, AfT, W, WT, npar, par, roff,
                      ftabT, pk0, tnpar, tpar, troff, ttabT, eps, softmax_readout, want_grad, loss_out, dA_out, dW_out):
    """:func:`run_blocks` on the calling thread (same blocks, same bits)."""
    for b in range(loss_out.shape[0]):
        loss_out[b] = _block(lo + b, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, AfT, W, WT, npar, par, roff,
                             ftabT, pk0, tnpar, tpar, troff, ttabT, eps, softmax_readout, want_grad, dA_out[b],
                             dW_out[b])


@njit(cache=True)
def sum_slots(loss_out, dA_out, dW_out):
    """Add the slots in block order into slot 0 (thread-count independent); return the total loss."""
    loss = loss_out[0]
    for b in range(1, loss_out.shape[0]):
        loss += loss_out[b]
        dA_out[0] += dA_out[b]
        dW_out[0] += dW_out[b]
    loss_out[0] = loss
    return loss
