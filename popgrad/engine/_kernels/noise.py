"""Numba kernels of the per-sample gradient's exact moments (:mod:`popgrad.engine.noise`).

A sample is ``(π, s)`` with the soft label ``y = π(·|q)``; its gradient is
``∇ℓ = Σ_c y_c ∇ℓ_c(s)`` with ``ℓ_c = -log(f_c(s) + ε)``. Per sequence the
kernels need the weights ``w(s, c) = Σ_k ρ_k p_k(s) π_k(c|q)`` and the
second-moment matrix ``Y2(s)[c, c'] = Σ_k ρ_k p_k(s) π_k(c|q) π_k(c'|q)``;
then, summed over all ``S**T`` sequences::

    E[∇ℓ]      = Σ_s Σ_c  w(s,c)       ∇ℓ_c(s)
    E[∇ℓ ∇ℓᵀ]  = Σ_s Σ_cc' Y2(s)[c,c'] ∇ℓ_c(s) ∇ℓ_c'(s)ᵀ
    E[ℓ²]      = Σ_s Σ_cc' Y2(s)[c,c'] ℓ_c(s) ℓ_c'(s)

Per token ``c`` the backward pass of DESIGN §4 with a one-hot weight gives
``δ^c_i = -a_i([s_i = c] - f_c)/(f_c + ε)`` and, for one sample,
``∂ℓ_c/∂A1[i,j] = δ^c_i Z_ij`` with ``Z_ij = P_ij (V_j - u_i)`` (the softmax
Jacobian of row ``i`` applied to ``G[i, :] = δ_i V``), ``V_j = A2[q, s_j]``;
``∂ℓ_c/∂A2[q, b] = Σ_{j: s_j = b} Σ_i δ^c_i P_ij`` (only row ``q`` moves).
The k-head kernel uses the backward pass of :mod:`popgrad.engine.multi`
per token, the softmax Jacobian applied per sample.

Blocks of consecutive sequence numbers, one slot per block, summed in block
order: the result does not depend on the thread count (parallel and ``_serial``
entries compiled from one body, :func:`popgrad.engine._kernels.twins.twins`). The per-sequence pieces (weights,
forward pass, ``δ^c``) are small helpers shared by the block kernels, inlined by numba. ``cache=True``, no
``fastmath``. NumPy reference: :func:`popgrad.engine.noise.gradient_noise_numpy`.
"""
import math

import numpy as np
from numba import njit, prange

from ...task._weights import atom_path_weight, atom_path_weight_multi, decode_sequence, target_row
from .numeric import has_weight, head_kappa, head_sums, log_token_mass
from .twins import twins


@njit(cache=True)
def _token_weights(s, parents, mu, atoms, prior_w, w, Y2, pc):
    """``w[c]`` and ``Y2[c, c']`` of one sequence (single-parent process, DESIGN §2)."""
    K, S, _ = atoms.shape
    T = s.shape[0]
    q = s[T - 1]
    _zero_weights(w, Y2)
    for k in range(K):
        p = atom_path_weight(k, s, parents, mu, atoms, prior_w)
        if p != 0.0:
            for c in range(S):
                pc[c] = p * atoms[k, q, c]
            _add_component(pc, atoms[k, q], w, Y2)


@njit(cache=True)
def _token_weights_multi(s, parents, tp, atoms, pk0, w, Y2, pc):
    """``w[c]`` and ``Y2[c, c']`` of one sequence (k-parent process, DESIGN §9)."""
    K = atoms.shape[0]
    S = atoms.shape[2]
    rt = target_row(s, tp, S)
    _zero_weights(w, Y2)
    for m in range(K):
        p = atom_path_weight_multi(m, s, parents, atoms, pk0)
        if p != 0.0:
            for c in range(S):
                pc[c] = p * atoms[m, rt, c]
            _add_component(pc, atoms[m, rt], w, Y2)


@njit(cache=True, inline="always")
def _table_weights(r, wtab, y2tab, w, Y2):
    """``w[c] = wtab[r, c]``, ``Y2[c, c'] = y2tab[r, c, c']``: row ``r`` of the task's weight tables (DESIGN §20)."""
    S = w.shape[0]
    for c in range(S):
        w[c] = wtab[r, c]
        for d in range(S):
            Y2[c, d] = y2tab[r, c, d]


@njit(cache=True)
def _scratch(S, T):
    """One block's per-sequence scratch: ``s (T,)`` int64, ``w (S,)``, ``Y2 (S, S)``, ``pc (S,)``,
    ``u (T,)``, ``a (T,)``, ``f (S,)``."""
    return (np.empty(T, dtype=np.int64), np.empty(S), np.empty((S, S)), np.empty(S),
            np.empty(T), np.empty(T), np.empty(S))


@njit(cache=True)
def _token_scratch(S, T, n):
    """Per-token scratch of the moment blocks: ``ℓ_c`` ``(S,)``, compressed gradients and
    :func:`_accumulate`'s work array ``(S, n)`` each, ``δ (T,)``."""
    return np.empty(S), np.empty((S, n)), np.empty((S, n)), np.empty(T)


@njit(cache=True, inline="always")
def _zero_weights(w, Y2):
    """``w = 0``, ``Y2 = 0``."""
    S = w.shape[0]
    for c in range(S):
        w[c] = 0.0
        for d in range(S):
            Y2[c, d] = 0.0


@njit(cache=True, inline="always")
def _add_component(pc, pi, w, Y2):
    """``w += pc``, ``Y2[c, d] += pc[c] π[d]`` (``pc = ρ p π``, the component's weights)."""
    S = w.shape[0]
    for c in range(S):
        w[c] += pc[c]
        for d in range(S):
            Y2[c, d] += pc[c] * pi[d]


@njit(cache=True, inline="always")
def _softmax_tokens(s, u, a, f):
    """``a = softmax(u)`` (shifted by ``max u``) and ``f[c] = Σ_{i: s_i = c} a_i``."""
    T = s.shape[0]
    umax = -np.inf
    for i in range(T):
        if u[i] > umax:
            umax = u[i]
    z = 0.0
    for i in range(T):
        a[i] = math.exp(u[i] - umax)
        z += a[i]
    for c in range(f.shape[0]):
        f[c] = 0.0
    for i in range(T):
        a[i] /= z
        f[s[i]] += a[i]


@njit(cache=True, inline="always")
def _forward_single(s, P, A2, V, u, a, f):
    """Single-head forward pass: ``V_j = A2[q, s_j]``, ``u = P V``, then :func:`_softmax_tokens`."""
    T = P.shape[0]
    q = s[T - 1]
    for j in range(T):
        V[j] = A2[q, s[j]]
    for i in range(T):
        acc = 0.0
        for j in range(i + 1):
            acc += P[i, j] * V[j]
        u[i] = acc
    _softmax_tokens(s, u, a, f)


@njit(cache=True, inline="always")
def _single_sequence(m, parents, mu, atoms, prior_w, wtab, y2tab, row0, P, A2, s, w, Y2, pc, V, u, a, f):
    """Sequence number ``m`` into ``s``, its ``w``, ``Y2`` (row ``m - row0`` of the tables when they are given,
    ``wtab.shape[0] > 0``; else :func:`_token_weights` over the atoms) and, when it carries weight,
    :func:`_forward_single`; False (nothing to add) when ``Σ_c w[c] = 0``."""
    decode_sequence(m, A2.shape[0], s.shape[0], s)
    if wtab.shape[0] > 0:
        _table_weights(m - row0, wtab, y2tab, w, Y2)
    else:
        _token_weights(s, parents, mu, atoms, prior_w, w, Y2, pc)
    if not has_weight(w):
        return False
    _forward_single(s, P, A2, V, u, a, f)
    return True


@njit(cache=True, inline="always")
def _delta(c, s, a, f, inv, out):
    """``out[i] = δ^c_i = -a_i([s_i = c] - f_c)·inv`` (``inv = 1/(f_c + ε)``)."""
    for i in range(s.shape[0]):
        out[i] = -a[i] * ((1.0 if s[i] == c else 0.0) - f[c]) * inv


@njit(cache=True, inline="always")
def _token_loss_delta(c, s, u, a, f, w, eps, g, lc, delta):
    """Zero ``g[c]``; ``lc[c] = ℓ_c``, ``delta = δ^c`` and True -- or ``lc[c] = 0`` and False when
    ``w[c] = 0`` (then ``Y2[c, c] = Σ ρ p π(c|q)² = 0`` too: token ``c`` never carries weight)."""
    for a_ in range(g.shape[1]):
        g[c, a_] = 0.0
    if w[c] == 0.0:
        lc[c] = 0.0
        return False
    fe = f[c] + eps
    lc[c] = -(math.log(fe) if fe != 0.0 else log_token_mass(c, s, u, s.shape[0]))  # no underflow to inf
    _delta(c, s, a, f, 1.0 / fe, delta)
    return True


@njit(cache=True)
def _accumulate(g, idx, w, Y2, lc, mean, M2, h, moments):
    """Add one sequence's moments: ``mean += Σ w_c g_c``, ``M2 += Σ Y2 g_c g_c'ᵀ`` (compressed ``g``
    with global coordinates ``idx``), ``moments[0] += Σ w ℓ``, ``moments[1] += Σ Y2 ℓℓ``."""
    S, n = g.shape
    for c in range(S):
        if w[c] != 0.0:
            moments[0] += w[c] * lc[c]
            for a in range(n):
                mean[idx[a]] += w[c] * g[c, a]
        for d in range(S):
            moments[1] += Y2[c, d] * lc[c] * lc[d]
    for c in range(S):
        for a in range(n):
            acc = 0.0
            for d in range(S):
                acc += Y2[c, d] * g[d, a]
            h[c, a] = acc
    for c in range(S):
        for a in range(n):
            ga = g[c, a]
            if ga != 0.0:
                ia = idx[a]
                for b in range(n):
                    M2[ia, idx[b]] += ga * h[c, b]


@njit(cache=True, error_model="numpy")
def _single_block(b, block, parents, mu, atoms, prior_w, wtab, y2tab, row0, P, A2, eps, mean, M2, moments):
    """Moments of the sequences ``b·block … min((b+1)·block, S**T) - 1`` (single-parent model)."""
    S = A2.shape[0]
    T = P.shape[0]
    D1 = T * (T + 1) // 2
    n = D1 + S
    s, w, Y2, pc, u, a, f = _scratch(S, T)
    V = np.empty(T)
    lc, g, h, delta = _token_scratch(S, T, n)
    idx = np.empty(n, dtype=np.int64)
    for a_ in range(D1):
        idx[a_] = a_
    for m in range(b * block, min((b + 1) * block, S**T)):
        if not _single_sequence(m, parents, mu, atoms, prior_w, wtab, y2tab, row0, P, A2, s, w, Y2, pc, V, u, a, f):
            continue
        q = s[T - 1]
        for c in range(S):
            idx[D1 + c] = D1 + q * S + c
        for c in range(S):
            if not _token_loss_delta(c, s, u, a, f, w, eps, g, lc, delta):
                continue
            r = 0
            for i in range(T):
                di = delta[i]
                for j in range(i + 1):
                    g[c, r] = di * P[i, j] * (V[j] - u[i])
                    r += 1
            for j in range(T):
                e = 0.0
                for i in range(j, T):
                    e += delta[i] * P[i, j]
                g[c, D1 + s[j]] += e
        _accumulate(g, idx, w, Y2, lc, mean, M2, h, moments)


def _moments_single_body(lo, parents, mu, atoms, prior_w, wtab, y2tab, row0, P, A2, eps, block, mean_s, M2_s,
                         moments_s):
    """Per-block first and second moments of the per-sample gradient (single-parent), blocks ``lo …``.

    Slot ``b`` holds block ``lo + b``'s sums: ``mean_s (n, D)``, ``M2_s (n, D, D)``,
    ``moments_s (n, 2)`` (``Σ w ℓ``, ``Σ Y2 ℓℓ``); ``D = T(T+1)/2 + S²``. The weights of sequence ``m`` are
    rows ``m - row0`` of ``wtab (n, S)``, ``y2tab (n, S, S)`` when ``wtab`` has rows (the table path,
    DESIGN §20; the atom arrays are then not read), else the per-atom sums over ``atoms`` (``wtab`` empty).
    """
    for b in prange(mean_s.shape[0]):
        _single_block(lo + b, block, parents, mu, atoms, prior_w, wtab, y2tab, row0, P, A2, eps, mean_s[b], M2_s[b],
                      moments_s[b])


moments_single, moments_single_serial = twins(_moments_single_body)


@njit(cache=True, error_model="numpy")
def _multi_block(b, block, parents, tp, atoms, pk0, wtab, y2tab, row0, P, A2, eps, mean, M2, moments):
    """Moments of one block of sequences (k-head model of :mod:`popgrad.engine.multi`)."""
    k, S, _ = A2.shape
    T = P.shape[1]
    D1 = T * (T + 1) // 2
    n = k * (D1 + S * S)
    s, w, Y2, pc, u, a, f = _scratch(S, T)
    H = np.empty((k, T, S))
    kap = np.empty((k, S))
    lc, g, hh, delta = _token_scratch(S, T, n)
    idx = np.arange(n)
    eta = np.empty(S)
    zeta = np.empty(S)
    Grow = np.empty(T)
    for m in range(b * block, min((b + 1) * block, S**T)):
        decode_sequence(m, S, T, s)
        if wtab.shape[0] > 0:
            _table_weights(m - row0, wtab, y2tab, w, Y2)
        else:
            _token_weights_multi(s, parents, tp, atoms, pk0, w, Y2, pc)
        if not has_weight(w):
            continue
        head_sums(s, P, H)
        head_kappa(H[:, T - 1, :], A2, kap)
        for i in range(T):
            acc = 0.0
            for hd in range(k):
                for c in range(S):
                    acc += H[hd, i, c] * kap[hd, c]
            u[i] = acc
        _softmax_tokens(s, u, a, f)
        for c in range(S):
            if not _token_loss_delta(c, s, u, a, f, w, eps, g, lc, delta):
                continue
            for hd in range(k):
                for bb in range(S):
                    acc = 0.0
                    for i in range(T):
                        acc += delta[i] * H[hd, i, bb]
                    eta[bb] = acc
                for bp in range(S):
                    acc = 0.0
                    for bb in range(S):
                        acc += A2[hd, bp, bb] * eta[bb]
                    zeta[bp] = acc
                r = hd * D1
                for i in range(T):
                    dot = 0.0
                    for j in range(i + 1):
                        Grow[j] = delta[i] * kap[hd, s[j]] + (zeta[s[j]] if i == T - 1 else 0.0)
                        dot += P[hd, i, j] * Grow[j]
                    for j in range(i + 1):
                        g[c, r] = P[hd, i, j] * (Grow[j] - dot)
                        r += 1
                o = k * D1 + hd * S * S
                for bp in range(S):
                    qb = H[hd, T - 1, bp]
                    for bb in range(S):
                        g[c, o + bp * S + bb] = qb * eta[bb]
        _accumulate(g, idx, w, Y2, lc, mean, M2, hh, moments)


def _moments_multi_body(lo, parents, tp, atoms, pk0, wtab, y2tab, row0, P, A2, eps, block, mean_s, M2_s, moments_s):
    """:func:`moments_single` for the k-head model; ``D = k·T(T+1)/2 + k·S²``."""
    for b in prange(mean_s.shape[0]):
        _multi_block(lo + b, block, parents, tp, atoms, pk0, wtab, y2tab, row0, P, A2, eps, mean_s[b], M2_s[b],
                     moments_s[b])


moments_multi, moments_multi_serial = twins(_moments_multi_body)


@njit(cache=True, error_model="numpy")
def _rows_block(b, block, parents, mu, atoms, prior_w, wtab, y2tab, row0, P, A2, eps, mean, R):
    """Mean ``dA1`` and per-row second moments ``R[i, j, j']`` of one block (single-parent).

    Per sequence ``R[i] += m_i(s) Z_i Z_iᵀ`` with ``m_i = Σ_cc' Y2[c,c'] δ^c_i δ^c'_i``.
    """
    S = A2.shape[0]
    T = P.shape[0]
    s, w, Y2, pc, u, a, f = _scratch(S, T)
    V = np.empty(T)
    dl = np.empty((S, T))
    Z = np.empty(T)
    for m in range(b * block, min((b + 1) * block, S**T)):
        if not _single_sequence(m, parents, mu, atoms, prior_w, wtab, y2tab, row0, P, A2, s, w, Y2, pc, V, u, a, f):
            continue
        for c in range(S):
            _delta(c, s, a, f, 0.0 if w[c] == 0.0 else 1.0 / (f[c] + eps), dl[c])
        for i in range(T):
            d1 = 0.0
            m2 = 0.0
            for c in range(S):
                d1 += w[c] * dl[c, i]
                for d in range(S):
                    m2 += Y2[c, d] * dl[c, i] * dl[d, i]
            for j in range(i + 1):
                Z[j] = P[i, j] * (V[j] - u[i])
                mean[i, j] += d1 * Z[j]
            if m2 != 0.0:
                for j in range(i + 1):
                    mz = m2 * Z[j]
                    for jj in range(i + 1):
                        R[i, j, jj] += mz * Z[jj]


def _row_moments_single_body(lo, parents, mu, atoms, prior_w, wtab, y2tab, row0, P, A2, eps, block, mean_s, R_s):
    """Per-block mean ``dA1`` (``mean_s (n, T, T)``) and per-row second moments (``R_s (n, T, T, T)``) of
    blocks ``lo …`` (weights as in :func:`moments_single`). Work ``O(T³)`` per sequence."""
    for b in prange(mean_s.shape[0]):
        _rows_block(lo + b, block, parents, mu, atoms, prior_w, wtab, y2tab, row0, P, A2, eps, mean_s[b], R_s[b])


row_moments_single, row_moments_single_serial = twins(_row_moments_single_body)


@njit(cache=True)
def second_moment_table(start, parents, mu, atoms, prior_w, y2_out):
    """Rows ``start …`` of a single-parent task's second-moment table: ``y2_out[r] = Y2(s)`` of sequence
    ``start + r`` (:func:`_token_weights`, the per-atom path's own arithmetic: the same bits)."""
    S = atoms.shape[1]
    T = parents.shape[0]
    s = np.empty(T, dtype=np.int64)
    pc = np.empty(S)
    w = np.empty(S)
    for r in range(y2_out.shape[0]):
        decode_sequence(start + r, S, T, s)
        _token_weights(s, parents, mu, atoms, prior_w, w, y2_out[r], pc)


@njit(cache=True)
def second_moment_table_multi(start, parents, tp, atoms, pk0, y2_out):
    """:func:`second_moment_table` of a k-parent task (:func:`_token_weights_multi`)."""
    S = atoms.shape[2]
    T = parents.shape[0]
    s = np.empty(T, dtype=np.int64)
    pc = np.empty(S)
    w = np.empty(S)
    for r in range(y2_out.shape[0]):
        decode_sequence(start + r, S, T, s)
        _token_weights_multi(s, parents, tp, atoms, pk0, w, y2_out[r], pc)


@njit(cache=True)
def sum_blocks(x):
    """``x[0] + x[1] + …`` in block order (fixed, thread-independent), returned."""
    out = x[0].copy()
    for b in range(1, x.shape[0]):
        out += x[b]
    return out
