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
(:func:`_node_forward`) and its reverse pass from the adjoints ``G[t]``, ``Ghw[t]`` accumulated by its
subtree (:func:`_node_backward`: a node back-propagates its own row once, after all its children, into
the parameters and the rows above it). The leaves of one parent run together
(:mod:`popgrad.engine._kernels.catformer_leaves`); two walks use both: the enumeration trie and the
explicit rows of a sample or a weight table (:mod:`popgrad.engine._kernels.catformer_walk`).

``cache=True``, no ``fastmath``; :func:`sum_slots` adds a walk's slots in block order.
"""
from typing import NamedTuple

import numpy as np
from numba import njit


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
    ``odP (T)``, ``odzs (T)`` (a row's attention adjoints), ``odu (d_max)``, ``oo (d_max)``; ``size`` the whole
    workspace (a leaf's own scratch is :func:`popgrad.engine._kernels.catformer_leaves._leaf_group`'s).
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
    size: np.uint64


def make_sizes(T, S, d0, dl1, n_heads, d_max, n_last, dL, n_A, n_inner) -> Layout:
    """The :class:`Layout` of a model (sizes as above); the offsets follow in the order listed there."""
    dw = max(dl1, d0)
    nl = max(n_last, 1)
    off = {}
    o = 0
    for name, size in (("oH", T * dw), ("oHt", dw * T), ("oG", T * dw), ("oPr", T * n_heads * T),
                       ("oU", T * n_heads * d_max), ("ohw", T * nl * S), ("oGhw", T * nl * S), ("odP", T),
                       ("odzs", T), ("odu", d_max), ("oo", d_max)):
        off[name] = U(o)
        o += size
    return Layout(U(T), U(S), U(d0), U(dw), U(n_heads), U(d_max), U(nl), U(dL), U(n_A), U(dl1), np.int64(n_inner),
                  np.int64(n_last), size=U(o), **off)


@njit(cache=True, error_model="numpy", inline="always")
def _row_forward(t_, g_, z, s, hinfo, prm, F):
    """Row ``t`` of head ``g`` below the last layer: ``u = H[t] Ã``, scores ``z_j = u · H[j]`` (``j ≤ t``),
    softmax, and the output ``Σ_j P_j H[j, :d_in]`` into ``H[t, out : out + d_in]`` and ``Ht``."""
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
        _row_forward(t_, g, z, s, hinfo, prm, F)
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




#: The two node passes inlined where they run once per leaf group or per leaf (the walk's loop and
#: :func:`popgrad.engine._kernels.catformer_walk._leaf_group`): a call passes its arrays with atomic
#: reference-count updates, 11 % of a general gradient at ``S = 3, T = 10`` (perf, DESIGN §18); inlined there
#: the walk is 1.09–1.12× faster, bit for bit the same. The other calls (once per block or per inner node going
#: up, the explicit-rows walk) stay calls: each inlined copy adds compile time (the first call of the walk and
#: the rows: 58 → 91 s CPU on a cold cache). Never called from Python, so not cached (their code is compiled
#: into the caller's).
_node_forward_inline = njit(error_model="numpy", inline="always")(_node_forward.py_func)
_node_backward_inline = njit(error_model="numpy", inline="always")(_node_backward.py_func)
