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
def _row_forward(t, s, S, d0, g, hinfo, Af, H, Pr, U, write_out):
    """Row ``t`` of head ``g``: ``u = H[t] Ã``, scores ``z_j = u · H[j]`` (``j ≤ t``), softmax, output."""
    din = hinfo[g, 1]
    oo = hinfo[g, 2]
    ao = hinfo[g, 3]
    st = s[t]
    r1 = ao + st * din
    r2 = ao + (S + t) * din
    for b in range(din):
        U[t, g, b] = Af[r1 + b] + Af[r2 + b]
    for a in range(d0, din):
        x = H[t, a]
        if x != 0.0:
            ra = ao + a * din
            for b in range(din):
                U[t, g, b] += x * Af[ra + b]
    m = -np.inf
    for j in range(t + 1):
        z = U[t, g, s[j]] + U[t, g, S + j]
        for a in range(d0, din):
            z += U[t, g, a] * H[j, a]
        Pr[t, g, j] = z
        if z > m:
            m = z
    tot = 0.0
    for j in range(t + 1):
        e = np.exp(Pr[t, g, j] - m)
        Pr[t, g, j] = e
        tot += e
    inv = 1.0 / tot
    for j in range(t + 1):
        Pr[t, g, j] *= inv
    if write_out:
        for a in range(din):
            H[t, oo + a] = 0.0
        for j in range(t + 1):
            p = Pr[t, g, j]
            H[t, oo + s[j]] += p
            H[t, oo + S + j] += p
            for a in range(d0, din):
                H[t, oo + a] += p * H[j, a]


@njit(cache=True, error_model="numpy")
def _scores_backward(t, s, S, d0, g, hinfo, Af, H, U, dzs, du, G, dA):
    """Adjoint of the scores ``z_j = H[t] Ã H[j]ᵀ`` of row ``t``, head ``g``, given ``dzs[j] = ∂L/∂z_j``.

    ``du = Σ_j dz_j H[j]``; ``dÃ += H[t]ᵀ du``; ``G[t] += Ã du``; ``G[j] += dz_j u`` (coordinates ``≥ d_0``:
    the input ``x̃`` needs no adjoint).
    """
    din = hinfo[g, 1]
    ao = hinfo[g, 3]
    for b in range(din):
        du[b] = 0.0
    for j in range(t + 1):
        c = dzs[j]
        du[s[j]] += c
        du[S + j] += c
        for a in range(d0, din):
            du[a] += c * H[j, a]
            G[j, a] += c * U[t, g, a]
    r1 = ao + s[t] * din
    r2 = ao + (S + t) * din
    for b in range(din):
        dA[r1 + b] += du[b]
        dA[r2 + b] += du[b]
    for a in range(d0, din):
        x = H[t, a]
        ra = ao + a * din
        acc = 0.0
        for b in range(din):
            dA[ra + b] += x * du[b]
            acc += Af[ra + b] * du[b]
        G[t, a] += acc


@njit(cache=True, error_model="numpy")
def _softmax_backward(t, g, Pr, dP, dzs):
    """``dzs_j = P_j (dP_j - Σ_i P_i dP_i)`` for ``j ≤ t``."""
    m = 0.0
    for j in range(t + 1):
        m += Pr[t, g, j] * dP[j]
    for j in range(t + 1):
        dzs[j] = Pr[t, g, j] * (dP[j] - m)


@njit(cache=True, error_model="numpy")
def _node_forward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, hw):
    """Row ``t`` of layers ``1 … L-1`` (heads ``0 … n_inner-1``) and ``hw[t, k] = H[t] W_k`` of the last heads."""
    for g in range(n_inner):
        _row_forward(t, s, S, d0, g, hinfo, Af, H, Pr, U, True)
    nS = W.shape[1]
    for k in range(n_last):
        wo = hinfo[last0 + k, 2]
        for c in range(nS):
            v = W[wo + s[t], c] + W[wo + S + t, c]
            for a in range(d0, dl1):
                v += H[t, a] * W[wo + a, c]
            hw[t, k, c] = v


@njit(cache=True, error_model="numpy")
def _node_backward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, G, Ghw, dA, dW, dP, dzs, du):
    """Back-propagate row ``t`` (its ``hw[t]``, then layers ``L-1 … 1``) from the adjoints ``G[t]``, ``Ghw[t]``.

    Adds into ``dA``, ``dW`` and ``G[j]`` for ``j ≤ t``; then zeroes ``G[t]``, ``Ghw[t]`` (the next sibling).
    """
    nS = W.shape[1]
    for k in range(n_last):
        wo = hinfo[last0 + k, 2]
        for c in range(nS):
            gc = Ghw[t, k, c]
            dW[wo + s[t], c] += gc
            dW[wo + S + t, c] += gc
            for a in range(d0, dl1):
                dW[wo + a, c] += H[t, a] * gc
        for a in range(d0, dl1):
            acc = 0.0
            for c in range(nS):
                acc += W[wo + a, c] * Ghw[t, k, c]
            G[t, a] += acc
    for g in range(n_inner - 1, -1, -1):
        din = hinfo[g, 1]
        oo = hinfo[g, 2]
        for j in range(t + 1):
            v = G[t, oo + s[j]] + G[t, oo + S + j]
            for a in range(d0, din):
                v += G[t, oo + a] * H[j, a]
            dP[j] = v
            p = Pr[t, g, j]
            for a in range(d0, din):
                G[j, a] += p * G[t, oo + a]
        _softmax_backward(t, g, Pr, dP, dzs)
        _scores_backward(t, s, S, d0, g, hinfo, Af, H, U, dzs, du, G, dA)
    for a in range(G.shape[1]):
        G[t, a] = 0.0
    for k in range(n_last):
        for c in range(nS):
            Ghw[t, k, c] = 0.0


@njit(cache=True, error_model="numpy")
def _enter_weights(t, s, S, npar, par, roff, ftab, pk):
    """``pk[t+1, k] = pk[t, k] · ftab[k, row_t(s), s_t]``; return whether any product is positive."""
    r = 0  # the parents' flat row: Σ_h s[par_h] S^{n-1-h}
    for h in range(npar[t]):
        r = r * S + s[par[t, h]]
    row = roff[t] + r
    alive = False
    for k in range(pk.shape[1]):
        v = pk[t, k] * ftab[k, row, s[t]]
        pk[t + 1, k] = v
        if v != 0.0:
            alive = True
    return alive


@njit(cache=True, error_model="numpy")
def _leaf(s, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, hw, G, Ghw, pk, tnpar, tpar, troff,
          ttab, eps, softmax_readout, want_grad, dA, dW, z, wv, dz, dP, dzs, du):
    """Last position: the last layer's row ``T-1``, readout, loss ``-Σ_c w_c log(f_c + ε)``, its backward."""
    t = T - 1
    nS = W.shape[1]
    r = 0
    for h in range(tnpar):
        r = r * S + s[tpar[h]]
    r += troff
    tot_w = 0.0
    for c in range(nS):
        v = 0.0
        for k in range(pk.shape[1]):
            v += pk[T, k] * ttab[k, r, c]
        wv[c] = v
        tot_w += v
    if tot_w == 0.0:
        return 0.0
    for k in range(n_last):
        _row_forward(t, s, S, d0, last0 + k, hinfo, Af, H, Pr, U, False)
    for c in range(nS):
        v = W[s[t], c] + W[S + t, c]
        for a in range(d0, dl1):
            v += H[t, a] * W[a, c]
        for k in range(n_last):
            for j in range(T):
                v += Pr[t, last0 + k, j] * hw[j, k, c]
        z[c] = v
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
        if eps == 0.0:
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
    # readout: z = H[t] W[:dl1] + Σ_k Σ_j P^k_j hw[j, k]
    for c in range(nS):
        dW[s[t], c] += dz[c]
        dW[S + t, c] += dz[c]
        for a in range(d0, dl1):
            dW[a, c] += H[t, a] * dz[c]
    for a in range(d0, dl1):
        acc = 0.0
        for c in range(nS):
            acc += W[a, c] * dz[c]
        G[t, a] += acc
    for k in range(n_last):
        g = last0 + k
        for j in range(T):
            v = 0.0
            p = Pr[t, g, j]
            for c in range(nS):
                v += dz[c] * hw[j, k, c]
                Ghw[j, k, c] += p * dz[c]
            dP[j] = v
        _softmax_backward(t, g, Pr, dP, dzs)
        _scores_backward(t, s, S, d0, g, hinfo, Af, H, U, dzs, du, G, dA)
    return loss


@njit(cache=True, error_model="numpy")
def _block(b, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, npar, par, roff, ftab, pk0, tnpar, tpar,
           troff, ttab, eps, softmax_readout, want_grad, dA, dW):
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
    s = np.zeros(T, dtype=np.int64)
    H = np.zeros((T, max(dl1, d0)))
    G = np.zeros((T, max(dl1, d0)))
    Pr = np.zeros((T, nh, T))
    U = np.zeros((T, nh, dmax))
    hw = np.zeros((T, max(n_last, 1), nS))
    Ghw = np.zeros((T, max(n_last, 1), nS))
    pk = np.zeros((T + 1, K))
    z = np.zeros(nS)
    wv = np.zeros(nS)
    dz = np.zeros(nS)
    dP = np.zeros(T)
    dzs = np.zeros(T)
    du = np.zeros(dmax)
    for k in range(K):
        pk[0, k] = pk0[k]
    rem = b
    for t in range(n_fixed - 1, -1, -1):
        s[t] = rem % S
        rem //= S
    for t in range(T):  # the input rows x̃_t are written once; their token coordinate as the walk moves
        H[t, S + t] = 1.0
    loss = 0.0
    alive = True
    for t in range(n_fixed):
        H[t, s[t]] = 1.0
        if not _enter_weights(t, s, S, npar, par, roff, ftab, pk):
            alive = False
            break
        _node_forward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, hw)
    if not alive:
        return 0.0
    if n_fixed == T:  # the block is one sequence
        loss = _leaf(s, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, hw, G, Ghw, pk, tnpar,
                     tpar, troff, ttab, eps, softmax_readout, want_grad, dA, dW, z, wv, dz, dP, dzs, du)
    else:
        t = n_fixed
        s[t] = 0
        while True:
            H[t, s[t]] = 1.0
            ok = _enter_weights(t, s, S, npar, par, roff, ftab, pk)
            if ok:
                _node_forward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, hw)
                if t < T - 1:
                    t += 1
                    s[t] = 0
                    continue
                loss += _leaf(s, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, hw, G, Ghw, pk,
                              tnpar, tpar, troff, ttab, eps, softmax_readout, want_grad, dA, dW, z, wv, dz, dP,
                              dzs, du)
            if want_grad and ok:
                _node_backward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, G, Ghw, dA, dW,
                               dP, dzs, du)
            # next node: the next sibling, or up (each parent back-propagated after its last child)
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
                    _node_backward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, G, Ghw,
                                   dA, dW, dP, dzs, du)
            if done:
                break
    if want_grad:
        for t in range(n_fixed - 1, -1, -1):
            _node_backward(t, s, S, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, H, Pr, U, G, Ghw, dA, dW,
                           dP, dzs, du)
    return loss


@njit(cache=True, parallel=True, error_model="numpy")
def run_blocks(lo, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, npar, par, roff, ftab, pk0,
               tnpar, tpar, troff, ttab, eps, softmax_readout, want_grad, loss_out, dA_out, dW_out):
    """Blocks ``lo … lo + len(loss_out) - 1`` into slots ``0 …`` (``loss_out[b]``, ``dA_out[b]``, ``dW_out[b]``)."""
    for b in prange(loss_out.shape[0]):
        loss_out[b] = _block(lo + b, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, npar, par, roff,
                             ftab, pk0, tnpar, tpar, troff, ttab, eps, softmax_readout, want_grad, dA_out[b],
                             dW_out[b])


@njit(cache=True, error_model="numpy")
def run_blocks_serial(lo, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, npar, par, roff, ftab, pk0,
                      tnpar, tpar, troff, ttab, eps, softmax_readout, want_grad, loss_out, dA_out, dW_out):
    """:func:`run_blocks` on the calling thread (same blocks, same bits)."""
    for b in range(loss_out.shape[0]):
        loss_out[b] = _block(lo + b, n_fixed, S, T, d0, dl1, n_inner, last0, n_last, hinfo, Af, W, npar, par, roff,
                             ftab, pk0, tnpar, tpar, troff, ttab, eps, softmax_readout, want_grad, dA_out[b],
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
