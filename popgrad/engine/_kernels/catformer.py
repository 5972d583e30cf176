"""Numba kernels of the disentangled-transformer engine (DESIGN §18): one row at a time, forward and reverse.

Layout (built by :mod:`popgrad.engine.catformer`). Every array below is a
region of one flat float64 workspace ``F`` (named sizes and offsets: :class:`Layout`), the
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

The pieces every walk shares: a node's row ``t`` of layers ``1 … L-1`` and ``hw[t]``
(:func:`_node_forward`), its reverse pass from the adjoints ``G[t]``, ``Ghw[t]`` accumulated by its
subtree (:func:`_node_backward`: a node back-propagates its own row once, after all its children, into
the parameters and the rows above it), and one leaf's last layer, readout and loss (:func:`_leaf`).
Two walks use them: the enumeration trie (:mod:`popgrad.engine._kernels.catformer_walk`) and the explicit
rows of a sample or a weight table (:func:`run_rows`, below: sorted rows share their prefixes).

``cache=True``, no ``fastmath``; :func:`run_rows` (parallel) and :func:`run_rows_serial` (one body,
:func:`popgrad.engine._kernels.twins.twins`) run the same blocks of rows into one slot each;
:func:`sum_slots` adds slots in block order.
"""
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from .twins import twins


#: Index type of the hot loops: numba wraps negative *signed* indices (a compare-and-add per access, which
#: also keeps LLVM from vectorizing); unsigned indices skip that, so every offset below is a uint64.
U = np.uint64


class Layout(NamedTuple):
    """The sizes and the workspace offsets of one model, named (built once per call by :func:`make_sizes`).

    Sizes (uint64 unless noted): ``T``, ``S``, ``d0 = S + T``, ``dw = max(d_{L-1}, d_0)`` (the width of a row of
    ``H``), ``n_heads`` (all layers), ``d_max`` (the widest head input), ``n_slots = max(n_last, 1)``, ``dL``,
    ``n_A`` (the length of the flat ``Ã``), ``dl1 = d_{L-1}``; ``n_inner`` (int64: the heads below the last
    layer, also the global number of the first last-layer head) and ``n_last`` (int64). Offsets (uint64) of
    the regions of the workspace ``F``: ``oH`` rows ``H (T, dw)``, ``oHt`` their transpose, ``oG`` the
    adjoints ``G (T, dw)``, ``oPr`` the attention rows ``(T, n_heads, T)``, ``oU`` the query vectors
    ``(T, n_heads, d_max)``, ``ohw``/``oGhw`` ``hw (T, n_slots, S)`` and its adjoint, then the scratch
    ``odP (T)``, ``odzs (T)``, ``odu (d_max)``, ``oo (d_max)``, ``oz (S)``, ``odz (S)``, ``owv (S)`` (the leaf's
    weights); ``size`` the whole workspace.
    """

    T: np.uint64
    S: np.uint64
    d0: np.uint64
    dw: np.uint64
    n_heads: np.uint64
    d_max: np.uint64
    n_slots: np.uint64
    dL: np.uint64
    n_A: np.uint64
    dl1: np.uint64
    n_inner: np.int64
    n_last: np.int64
    oH: np.uint64
    oHt: np.uint64
    oG: np.uint64
    oPr: np.uint64
    oU: np.uint64
    ohw: np.uint64
    oGhw: np.uint64
    odP: np.uint64
    odzs: np.uint64
    odu: np.uint64
    oo: np.uint64
    oz: np.uint64
    odz: np.uint64
    owv: np.uint64
    size: np.uint64


def make_sizes(T, S, d0, dl1, n_heads, d_max, n_last, dL, n_A, n_inner) -> Layout:
    """The :class:`Layout` of a model (sizes as above); the offsets follow in the order listed there."""
    dw = max(dl1, d0)
    nl = max(n_last, 1)
    off = {}
    o = 0
    for name, size in (("oH", T * dw), ("oHt", dw * T), ("oG", T * dw), ("oPr", T * n_heads * T),
                       ("oU", T * n_heads * d_max), ("ohw", T * nl * S), ("oGhw", T * nl * S), ("odP", T),
                       ("odzs", T), ("odu", d_max), ("oo", d_max), ("oz", S), ("odz", S), ("owv", S)):
        off[name] = U(o)
        o += size
    return Layout(U(T), U(S), U(d0), U(dw), U(n_heads), U(d_max), U(nl), U(dL), U(n_A), U(dl1), np.int64(n_inner),
                  np.int64(n_last), size=U(o), **off)


@njit(cache=True, error_model="numpy", inline="always")
def _row_forward(t_, g_, z, s, hinfo, prm, F, write_out):
    """Row ``t`` of head ``g``: ``u = H[t] Ã``, scores ``z_j = u · H[j]`` (``j ≤ t``), softmax, output.

    The output ``Σ_j P_j H[j, :d_in]`` goes to ``H[t, out : out + d_in]`` and ``Ht`` when ``write_out``.
    """
    T, S, d0, dw, nh, dmax = z.T, z.S, z.d0, z.dw, z.n_heads, z.d_max
    t, g = U(t_), U(g_)
    din = U(hinfo[g, 1])
    out = U(hinfo[g, 2])
    ao = U(hinfo[g, 3])
    u0 = z.oU + (t * nh + g) * dmax
    h0 = z.oH + t * dw
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
    p0 = z.oPr + (t * nh + g) * T
    n = t + U(1)
    for j in range(n):
        F[p0 + j] = F[u0 + U(s[j])] + F[u0 + S + j]
    for a in range(d0, din):
        ua = F[u0 + a]
        q0 = z.oHt + a * T
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
            F[z.oo + a] = 0.0
        for j in range(n):
            p = F[p0 + j]
            F[z.oo + U(s[j])] += p
            F[z.oo + S + j] += p
            hj = z.oH + j * dw
            for a in range(d0, din):
                F[z.oo + a] += p * F[hj + a]
        for a in range(din):
            v = F[z.oo + a]
            F[h0 + out + a] = v
            F[z.oHt + (out + a) * T + t] = v


@njit(cache=True, error_model="numpy", inline="always")
def _softmax_backward(t_, g_, z, F):
    """``dzs_j = P_j (dP_j - Σ_i P_i dP_i)`` for ``j ≤ t``."""
    T, nh = z.T, z.n_heads
    t, g = U(t_), U(g_)
    p0 = z.oPr + (t * nh + g) * T
    n = t + U(1)
    m = 0.0
    for j in range(n):
        m += F[p0 + j] * F[z.odP + j]
    for j in range(n):
        F[z.odzs + j] = F[p0 + j] * (F[z.odP + j] - m)


@njit(cache=True, error_model="numpy", inline="always")
def _scores_backward(t_, g_, z, s, hinfo, prm, F, gr):
    """Adjoint of the scores ``z_j = H[t] Ã H[j]ᵀ`` of row ``t``, head ``g``, given ``dzs[j] = ∂L/∂z_j``.

    ``du = Σ_j dz_j H[j]``; ``dÃ += H[t]ᵀ du``; ``G[t] += Ã du``; ``G[j] += dz_j u`` (coordinates ``≥ d_0``
    only: the input ``x̃`` needs no adjoint).
    """
    T, S, d0, dw, nh, dmax = z.T, z.S, z.d0, z.dw, z.n_heads, z.d_max
    nA = z.n_A
    t, g = U(t_), U(g_)
    din = U(hinfo[g, 1])
    ao = U(hinfo[g, 3])
    u0 = z.oU + (t * nh + g) * dmax
    for b in range(din):
        F[z.odu + b] = 0.0
    for j in range(t + U(1)):
        c = F[z.odzs + j]
        F[z.odu + U(s[j])] += c
        F[z.odu + S + j] += c
        if c != 0.0:
            hj = z.oH + j * dw
            gj = z.oG + j * dw
            for a in range(d0, din):
                F[z.odu + a] += c * F[hj + a]
                F[gj + a] += c * F[u0 + a]
    r1 = ao + U(s[t]) * din
    r2 = ao + (S + t) * din
    for b in range(din):
        gr[r1 + b] += F[z.odu + b]
    for b in range(din):
        gr[r2 + b] += F[z.odu + b]
    h0 = z.oH + t * dw
    for a in range(d0, din):
        x = F[h0 + a]
        if x != 0.0:
            ra = ao + a * din
            for b in range(din):
                gr[ra + b] += x * F[z.odu + b]
    g0 = z.oG + t * dw
    for b in range(din):
        c = F[z.odu + b]
        if c != 0.0:
            rb = nA + ao + b * din
            for a in range(d0, din):
                F[g0 + a] += c * prm[rb + a]


@njit(cache=True, error_model="numpy")
def _node_forward(t_, z, s, hinfo, prm, F):
    """Row ``t`` of layers ``1 … L-1`` (heads ``0 … n_inner-1``) and ``hw[t, k] = H[t] W_k`` of the last heads."""
    T, S, d0, dw, nh, dmax, nl = z.T, z.S, z.d0, z.dw, z.n_heads, z.d_max, z.n_slots
    nA, dl1, n_inner, last0, n_last = z.n_A, z.dl1, z.n_inner, z.n_inner, z.n_last
    for g in range(n_inner):
        _row_forward(t_, g, z, s, hinfo, prm, F, True)
    t = U(t_)
    oW = U(2) * nA
    h0 = z.oH + t * dw
    st = U(s[t])
    for k_ in range(n_last):
        k = U(k_)
        wo = U(hinfo[last0 + k_, 2])
        k0 = z.ohw + (t * nl + k) * S
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
    T, S, d0, dw, nh, dmax, nl = z.T, z.S, z.d0, z.dw, z.n_heads, z.d_max, z.n_slots
    dL, nA, dl1, n_inner, last0, n_last = z.dL, z.n_A, z.dl1, z.n_inner, z.n_inner, z.n_last
    t = U(t_)
    oW = U(2) * nA
    oWT = oW + dL * S
    h0 = z.oH + t * dw
    g0 = z.oG + t * dw
    st = U(s[t])
    n = t + U(1)
    for k_ in range(n_last):
        k = U(k_)
        wo = U(hinfo[last0 + k_, 2])
        k0 = z.oGhw + (t * nl + k) * S
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
            F[z.odP + j] = F[g0 + out + U(s[j])] + F[g0 + out + S + j]
        for a in range(d0, din):
            ga = F[g0 + out + a]
            if ga != 0.0:
                q0 = z.oHt + a * T
                for j in range(n):
                    F[z.odP + j] += ga * F[q0 + j]
        p0 = z.oPr + (t * nh + g) * T
        for j in range(n):
            p = F[p0 + j]
            gj = z.oG + j * dw
            for a in range(d0, din):
                F[gj + a] += p * F[g0 + out + a]
        _softmax_backward(t_, g_, z, F)
        _scores_backward(t_, g_, z, s, hinfo, prm, F, gr)
    for a in range(dw):
        F[g0 + a] = 0.0
    for k_ in range(n_last):
        k0 = z.oGhw + (t * nl + U(k_)) * S
        for c in range(S):
            F[k0 + c] = 0.0


@njit(cache=True, error_model="numpy")
def _leaf(z, s, hinfo, prm, F, gr, eps, softmax_readout, want_grad):
    """Last position: the last layer's row ``T-1``, readout, loss ``-Σ_c w_c log(f_c + ε)``, its backward.

    The leaf's weights ``w(s, ·)`` are in ``F[z.owv:]``. Returns the leaf's loss; the caller back-propagates
    the row ``T-1`` itself (:func:`_node_backward`).
    """
    T, S, d0, dw, nh, dmax, nl = z.T, z.S, z.d0, z.dw, z.n_heads, z.d_max, z.n_slots
    dL, nA, dl1, n_inner, last0, n_last = z.dL, z.n_A, z.dl1, z.n_inner, z.n_inner, z.n_last
    oW = U(2) * nA
    oWT = oW + dL * S
    t_ = np.int64(z.T) - 1
    t = T - U(1)
    h0 = z.oH + t * dw
    g0 = z.oG + t * dw
    st = U(s[t])
    tot_w = 0.0
    for c in range(S):
        tot_w += F[z.owv + c]
    for k in range(n_last):
        _row_forward(t_, last0 + k, z, s, hinfo, prm, F, False)
    for c in range(S):
        F[z.oz + c] = prm[oW + st * S + c] + prm[oW + (S + t) * S + c]
    for a in range(d0, dl1):
        x = F[h0 + a]
        if x != 0.0:
            for c in range(S):
                F[z.oz + c] += x * prm[oW + a * S + c]
    for k_ in range(n_last):
        k = U(k_)
        p0 = z.oPr + (t * nh + U(last0) + k) * T
        for j in range(T):
            p = F[p0 + j]
            k0 = z.ohw + (j * nl + k) * S
            for c in range(S):
                F[z.oz + c] += p * F[k0 + c]
    loss = 0.0
    if softmax_readout:
        m = F[z.oz]
        for c in range(U(1), S):
            if F[z.oz + c] > m:
                m = F[z.oz + c]
        for c in range(S):  # shifted logits z_c - max (exact), so log f_c = (z_c - m) - log Σ e^(z - m)
            F[z.oz + c] -= m
        tot = 0.0
        for c in range(S):
            tot += np.exp(F[z.oz + c])
        lt = np.log(tot)  # in [0, log S]: never added to a large logit, so log f_c cannot round to 0
        if eps == 0.0:  # cross entropy as a log-softmax
            for c in range(S):
                wc = F[z.owv + c]
                if wc > 0.0:
                    loss -= wc * (F[z.oz + c] - lt)
                F[z.odz + c] = np.exp(F[z.oz + c] - lt) * tot_w - wc
        else:
            rbar = 0.0
            for c in range(S):
                f = np.exp(F[z.oz + c] - lt)
                wc = F[z.owv + c]
                if wc > 0.0:
                    loss -= wc * np.log(f + eps)
                    F[z.odz + c] = -wc / (f + eps)
                else:
                    F[z.odz + c] = 0.0
                rbar += f * F[z.odz + c]
            for c in range(S):
                F[z.odz + c] = np.exp(F[z.oz + c] - lt) * (F[z.odz + c] - rbar)
    else:
        for c in range(S):
            wc = F[z.owv + c]
            if wc > 0.0:
                loss -= wc * np.log(F[z.oz + c] + eps)
                F[z.odz + c] = -wc / (F[z.oz + c] + eps)
            else:
                F[z.odz + c] = 0.0
    if not want_grad:
        return loss
    # readout z = H[t] W[:dl1] + Σ_k Σ_j P^k_j hw[j, k]
    for c in range(S):
        gr[nA + st * S + c] += F[z.odz + c]
        gr[nA + (S + t) * S + c] += F[z.odz + c]
    for a in range(d0, dl1):
        x = F[h0 + a]
        if x != 0.0:
            for c in range(S):
                gr[nA + a * S + c] += x * F[z.odz + c]
    for c in range(S):
        gc = F[z.odz + c]
        w0 = oWT + c * dL
        for a in range(d0, dl1):
            F[g0 + a] += gc * prm[w0 + a]
    for k_ in range(n_last):
        k = U(k_)
        g = last0 + k_
        p0 = z.oPr + (t * nh + U(g)) * T
        for j in range(T):
            p = F[p0 + j]
            k0 = z.ohw + (j * nl + k) * S
            q0 = z.oGhw + (j * nl + k) * S
            v = 0.0
            for c in range(S):
                v += F[z.odz + c] * F[k0 + c]
                F[q0 + c] += p * F[z.odz + c]
            F[z.odP + j] = v
        _softmax_backward(t_, g, z, F)
        _scores_backward(t_, g, z, s, hinfo, prm, F, gr)
    return loss


@njit(cache=True)
def sum_slots(loss_out, gr_out):
    """Add the slots in block order into slot 0 (thread-count independent); return the total loss."""
    loss = loss_out[0]
    for b in range(1, loss_out.shape[0]):
        loss += loss_out[b]
        gr_out[0] += gr_out[b]
    loss_out[0] = loss
    return loss


@njit(cache=True)
def sum_loss(loss_out):
    """The slots' losses added in block order."""
    loss = 0.0
    for b in range(loss_out.shape[0]):
        loss += loss_out[b]
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
    T, S, dw = np.int64(z.T), np.int64(z.S), np.int64(z.dw)  # signed: the walk's few accesses
    owv = np.int64(z.owv)
    F = np.zeros(np.int64(z.size))
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


#: The two node passes inlined where they run once per leaf group or per leaf (the walk's loop and
#: :func:`popgrad.engine._kernels.catformer_walk._leaf_group`): a call passes its arrays with atomic
#: reference-count updates, 11 % of a general gradient at ``S = 3, T = 10`` (perf, DESIGN §18); inlined there
#: the walk is 1.09–1.12× faster, bit for bit the same. The other calls (once per block or per inner node going
#: up, the explicit-rows walk) stay calls: each inlined copy adds compile time (the first call of the walk and
#: the rows: 58 → 91 s CPU on a cold cache). Never called from Python, so not cached (their code is compiled
#: into the caller's).
_node_forward_inline = njit(error_model="numpy", inline="always")(_node_forward.py_func)
_node_backward_inline = njit(error_model="numpy", inline="always")(_node_backward.py_func)
