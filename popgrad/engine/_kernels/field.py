"""Numba kernels of the Stage-1 field (DESIGN §12); the public API is :mod:`popgrad.engine.field`.

Kernels take clean contiguous arrays and trust them (the public functions
validate). ``cache=True`` everywhere, never ``fastmath``. Every parallel
loop writes disjoint outputs and every output entry is accumulated by one
thread in a fixed order, so results are bit-identical for any thread count.

Notation (per prior atom ``π`` with stationary law ``μ``): ``C = T - 1``
context positions ``0 .. C-1``; for a marked symbol ``c`` and a grid point
``x = x_k = exp(2πik/N)`` (``N = T``, ``k = 0 .. N//2``),
``D(x)[y] = x`` if ``y = c`` else ``1``. Generating functions count
``m_c``, the number of context positions holding ``c``.

* :func:`field_enumerate` -- the field by one pass over all ``S**T`` sequences;
* :func:`tree_prepass`, :func:`tree_pairs` -- any single-parent forest:
  inside / outside vectors, then one clamped pass per row ``i``;
* :func:`chain_prepass`, :func:`chain_pairs` -- the context is one Markov
  chain ``0 → 1 → … → C-1``: Toeplitz structure of the path products;
* :func:`assemble` -- contraction of the per-(c, k) pieces with the FFT
  coefficients into the ``T×T`` field.

Every parallel kernel ``name`` has a serial twin ``name_serial``, both compiled
by :func:`twins` from one Python body (``prange`` is ``range`` in the serial
compilation): same iterations, same bits. Each takes the range of its outer
work it does in this call (``lo, hi``: blocks, or ``(c, k)`` pairs as
``c·NH + k``), so that the caller (:mod:`popgrad.engine.field`) can return to
Python often enough for Ctrl-C and SIGTERM to act (issue 32); the pieces of
one output entry are still summed by one thread in the same order, so the
result does not depend on how the range is cut.
"""
import types

import numpy as np
from numba import njit, prange

from ...task._weights import decode_sequence, sequence_weight_row


def _renamed(body, name):
    """A copy of the plain Python function ``body`` called ``name`` (its own numba cache file)."""
    code = body.__code__.replace(co_name=name, co_qualname=name)
    fn = types.FunctionType(code, body.__globals__, name, body.__defaults__, body.__closure__)
    fn.__qualname__ = name
    fn.__doc__ = body.__doc__
    fn.__module__ = body.__module__
    return fn


def twins(body, name):
    """``(parallel, serial)``: ``body`` compiled as ``numba.njit(cache=True, parallel=True)`` under ``name``
    and as ``numba.njit(cache=True)`` under ``name + "_serial"`` (one source, two compilations; each
    its own name, so each has its own entry in numba's on-disk cache)."""
    return (njit(cache=True, parallel=True)(_renamed(body, name)),
            njit(cache=True)(_renamed(body, name + "_serial")))


# ===========================================================================
# Enumeration (exact weights of popgrad.task._weights)
# ===========================================================================
@njit(cache=True)
def _field_enumerate_one(bk, block, n_total, T, eps, parents, mu, atoms, prior_w, slots):
    """One iteration of :func:`field_enumerate`."""
    S = atoms.shape[1]
    n_blocks = slots.shape[0]
    s = np.empty(T, dtype=np.int64)
    w = np.empty(S)
    cnt = np.empty(S)
    r = np.empty(S)
    acc = slots[bk]
    for i in range(T):
        for j in range(T):
            acc[i, j] = 0.0
    start = bk * block
    stop = min(n_total, start + block)
    for m in range(start, stop):
        decode_sequence(m, S, T, s)
        sequence_weight_row(s, parents, mu, atoms, prior_w, w)
        tot = 0.0
        for c in range(S):
            tot += w[c]
            cnt[c] = 0.0
        if tot == 0.0:
            continue
        for t in range(T):
            cnt[s[t]] += 1.0
        rbar = 0.0
        for c in range(S):
            f = cnt[c] / T
            r[c] = w[c] / (f + eps)
            rbar += r[c] * f
        q = s[T - 1]
        for i in range(T):
            v = r[s[i]] - rbar
            for j in range(i + 1):
                if s[j] == q:
                    acc[i, j] += v


def _field_enumerate(lo, hi, block, n_total, T, eps, parents, mu, atoms, prior_w, slots):
    """``slots[b]`` = the field summed over sequences ``b·block .. (b+1)·block - 1``, for blocks ``lo <= b < hi``.

    Per sequence ``s`` with weights ``w(s, c)`` (:func:`sequence_weight_row`)
    and counts ``n_c`` over all ``T`` positions: ``r_c = w(s,c)/(n_c/T + ε)``,
    ``r̄ = Σ_c r_c n_c/T``; ``M[i, j] += r_{s_i} - r̄`` for ``j ≤ i`` with
    ``s_j = s_{T-1}``. The block count is fixed by the caller (it depends
    on ``S**T`` only), each block is summed by one thread in sequence order.
    """
    for bk in prange(lo, hi):
        _field_enumerate_one(bk, block, n_total, T, eps, parents, mu, atoms, prior_w, slots)


field_enumerate, field_enumerate_serial = twins(_field_enumerate, "field_enumerate")


@njit(cache=True)
def sum_slots(slots, out):
    """``out = Σ_b slots[b]`` in block order."""
    n, T, _ = slots.shape
    for i in range(T):
        for j in range(T):
            out[i, j] = 0.0
    for b in range(n):
        for i in range(T):
            for j in range(T):
                out[i, j] += slots[b, i, j]


# ===========================================================================
# Forests: inside / outside vectors (unclamped)
# ===========================================================================
@njit(cache=True)
def _tree_prepass_one(ck, parents, ch_ptr, ch_idx, roots, pi, mu, xs, U, PU, EX, O, Zt, ER, Z):
    """One iteration of :func:`tree_prepass`."""
    S = pi.shape[0]
    NH = xs.shape[0]
    C = parents.shape[0]
    nr = roots.shape[0]
    c = ck // NH
    k = ck % NH
    x = xs[k]
    u = U[c, k]
    pu = PU[c, k]
    ex = EX[c, k]
    o = O[c, k]
    zt = Zt[c, k]
    er = ER[c, k]
    tmp = np.empty(S, dtype=np.complex128)
    for v in range(C - 1, -1, -1):
        for y in range(S):
            val = 1.0 + 0.0j
            for t in range(ch_ptr[v], ch_ptr[v + 1]):
                val *= pu[ch_idx[t], y]
            if y == c:
                val *= x
            u[v, y] = val
        if parents[v] >= 0:
            for y in range(S):
                acc = 0.0 + 0.0j
                for z in range(S):
                    acc += pi[y, z] * u[v, z]
                pu[v, y] = acc
        else:
            acc = 0.0 + 0.0j
            for z in range(S):
                acc += mu[z] * u[v, z]
            zt[v] = acc
    for v in range(C):
        a = ch_ptr[v]
        b = ch_ptr[v + 1]
        for y in range(S):
            pre = 1.0 + 0.0j
            for t in range(a, b):
                ex[ch_idx[t], y] = pre
                pre *= pu[ch_idx[t], y]
            suf = 1.0 + 0.0j
            for t in range(b - 1, a - 1, -1):
                ex[ch_idx[t], y] *= suf
                suf *= pu[ch_idx[t], y]
    pre = 1.0 + 0.0j
    for t in range(nr):
        er[roots[t]] = pre
        pre *= zt[roots[t]]
    Z[c, k] = pre
    suf = 1.0 + 0.0j
    for t in range(nr - 1, -1, -1):
        er[roots[t]] *= suf
        suf *= zt[roots[t]]
    for v in range(C):
        p = parents[v]
        if p < 0:
            for z in range(S):
                o[v, z] = mu[z] * er[v]
        else:
            for y in range(S):
                val = o[p, y] * ex[v, y]
                if y == c:
                    val *= x
                tmp[y] = val
            for z in range(S):
                acc = 0.0 + 0.0j
                for y in range(S):
                    acc += tmp[y] * pi[y, z]
                o[v, z] = acc


def _tree_prepass(lo, hi, parents, ch_ptr, ch_idx, roots, pi, mu, xs, U, PU, EX, O, Zt, ER, Z):
    """Inside/outside vectors of the context forest, for the ``(c, k)`` with ``lo <= c·NH + k < hi``.

    For each marked symbol ``c`` and grid point ``x = xs[k]`` (arrays
    indexed ``[c, k, v, y]``, context nodes ``v`` in index order, which is
    topological since parents precede children):

    * ``U[v, y] = E[x^{m_c(subtree v)} | s_v = y] = D[y] Π_{h ∈ ch(v)} PU[h, y]``;
    * ``PU[h, y] = Σ_z π(z|y) U[h, z]`` (the message of child ``h`` to its parent);
    * ``Zt[r] = Σ_z μ(z) U[r, z]`` for a root ``r`` (its tree's generating function);
    * ``EX[h, y] = Π_{siblings h' ≠ h} PU[h', y]`` (prefix/suffix products, no division);
    * ``ER[r] = Π_{roots r' ≠ r} Zt[r']``;
    * ``O[v, y] = E[[s_v = y] x^{m_c(all context outside subtree v)}]``:
      ``μ(y) ER[v]`` for a root, ``Σ_y' O[p, y'] D[y'] EX[v, y'] π(y|y')`` below;
    * ``Z = Π_roots Zt = E[x^{m_c}]``.

    Products of polynomials with non-negative coefficients evaluated on the
    unit circle: no cancellation, no division (a factor may vanish at a
    root of unity).
    """
    for ck in prange(lo, hi):
        _tree_prepass_one(ck, parents, ch_ptr, ch_idx, roots, pi, mu, xs, U, PU, EX, O, Zt, ER, Z)


tree_prepass, tree_prepass_serial = twins(_tree_prepass, "tree_prepass")


@njit(cache=True)
def _tree_pairs_one(it, lo, hi, parents, ch_ptr, ch_idx, roots, pi, mu, xs, U, PU, EX, Zt, phi, X):
    """One iteration of :func:`tree_pairs`: rows ``it`` and ``C-1-it``, the ``(c, k)`` in ``lo .. hi-1``."""
    S = pi.shape[0]
    NH = xs.shape[0]
    C = parents.shape[0]
    nr = roots.shape[0]
    n_it = (C + 1) // 2
    Up = np.empty((C, S), dtype=np.complex128)
    PUp = np.empty((C, S), dtype=np.complex128)
    EXp = np.empty((C, S), dtype=np.complex128)
    Op = np.empty((C, S), dtype=np.complex128)
    ERp = np.empty(C, dtype=np.complex128)
    onpath = np.zeros(C, dtype=np.int64)
    exmod = np.zeros(C, dtype=np.int64)
    tmp = np.empty(S, dtype=np.complex128)
    stamp = 0
    for half in range(2):
        i0 = np.int64(it)
        i = i0 if half == 0 else C - 1 - i0
        if half == 1 and i == i0:
            break
        row = X[i]
        if lo == 0:
            for j in range(C):
                row[j] = 0.0
        for ck in range(lo, hi):
            c = ck // NH
            k = ck % NH
            stamp += 1
            x = xs[k]
            u = U[c, k]
            pu = PU[c, k]
            ex = EX[c, k]
            zt = Zt[c, k]
            # clamp and climb
            for y in range(S):
                Up[i, y] = 0.0
            Up[i, c] = u[i, c]
            onpath[i] = stamp
            v = i
            while parents[v] >= 0:
                p = parents[v]
                for y in range(S):
                    acc = 0.0 + 0.0j
                    for z in range(S):
                        acc += pi[y, z] * Up[v, z]
                    PUp[v, y] = acc
                # siblings of v: products with PUp[v] substituted
                a = ch_ptr[p]
                b = ch_ptr[p + 1]
                if b - a > 1:
                    for y in range(S):
                        pre = 1.0 + 0.0j
                        for t in range(a, b):
                            h = ch_idx[t]
                            EXp[h, y] = pre
                            pre *= PUp[h, y] if h == v else pu[h, y]
                        suf = 1.0 + 0.0j
                        for t in range(b - 1, a - 1, -1):
                            h = ch_idx[t]
                            EXp[h, y] *= suf
                            suf *= PUp[h, y] if h == v else pu[h, y]
                    for t in range(a, b):
                        h = ch_idx[t]
                        if h != v:
                            exmod[h] = stamp
                for y in range(S):
                    val = ex[v, y] * PUp[v, y]
                    if y == c:
                        val *= x
                    Up[p, y] = val
                onpath[p] = stamp
                v = p
            rt = v
            zc = 0.0 + 0.0j
            for z in range(S):
                zc += mu[z] * Up[rt, z]
            pre = 1.0 + 0.0j
            for t in range(nr):
                r = roots[t]
                ERp[r] = pre
                pre *= zc if r == rt else zt[r]
            suf = 1.0 + 0.0j
            for t in range(nr - 1, -1, -1):
                r = roots[t]
                ERp[r] *= suf
                suf *= zc if r == rt else zt[r]
            # outside pass over 0 .. i, then contract
            ph = phi[c, k]
            for w in range(i + 1):
                p = parents[w]
                if p < 0:
                    e = ERp[w]
                    for z in range(S):
                        Op[w, z] = mu[z] * e
                else:
                    if exmod[w] == stamp:
                        for y in range(S):
                            tmp[y] = Op[p, y] * EXp[w, y]
                    else:
                        for y in range(S):
                            tmp[y] = Op[p, y] * ex[w, y]
                    tmp[c] *= x
                    for z in range(S):
                        acc = 0.0 + 0.0j
                        for y in range(S):
                            acc += tmp[y] * pi[y, z]
                        Op[w, z] = acc
                tot = 0.0
                if onpath[w] == stamp:
                    for bb in range(S):
                        tot += (ph[bb] * Op[w, bb] * Up[w, bb]).real
                else:
                    for bb in range(S):
                        tot += (ph[bb] * Op[w, bb] * u[w, bb]).real
                row[w] += tot


def _tree_pairs(lo, hi, parents, ch_ptr, ch_idx, roots, pi, mu, xs, U, PU, EX, Zt, phi, X):
    """``X[i, j] = Re Σ_{c,k} Σ_b φ[c,k,b] E[[s_i = c][s_j = b] x_k^{m_c}]`` for context ``j ≤ i``.

    One clamped pass per row ``i`` and ``(c, k)``: clamp ``s_i = c``
    (``U'[i] = e_c U[i, c]``), recompute the inside vectors on the path from
    ``i`` up to its root (``U'[p] = D ⊙ EX[v] ⊙ π U'[v]``), the sibling
    products of the path's siblings and the root products ``ER'`` with the
    changed factor substituted (prefix/suffix, no division), then the
    outside vectors ``O'`` of nodes ``0 .. i``; then
    ``E[[s_i=c][s_j=b] x^{m_c}] = O'[j, b] U'[j, b]``. Cost per row and
    ``(c, k)``: ``O((i + depth) S² + Σ_path deg · S + #roots)``.
    Rows are processed in pairs ``(r, C-1-r)`` (equal work per iteration).
    This call adds the ``(c, k)`` with ``lo <= c·NH + k < hi`` (``lo = 0`` starts the rows at 0).
    """
    C = parents.shape[0]
    n_it = (C + 1) // 2
    for it in prange(n_it):
        _tree_pairs_one(it, lo, hi, parents, ch_ptr, ch_idx, roots, pi, mu, xs, U, PU, EX, Zt, phi, X)


tree_pairs, tree_pairs_serial = twins(_tree_pairs, "tree_pairs")


@njit(cache=True)
def tree_marginals(O, U, V):
    """``V[c, k, v, y] = O[c, k, v, y] U[c, k, v, y] = E[[s_v = y] x_k^{m_c}]``."""
    S, NH, C, _ = O.shape
    for c in range(S):
        for k in range(NH):
            for v in range(C):
                for y in range(S):
                    V[c, k, v, y] = O[c, k, v, y] * U[c, k, v, y]


# ===========================================================================
# Chains: Toeplitz path products
# ===========================================================================
@njit(cache=True)
def _chain_prepass_one(ck, pi, mu, xs, phi, V, Z, Gr, Gi, Pm, Br, Bi):
    """One iteration of :func:`chain_prepass`."""
    S = pi.shape[0]
    NH = xs.shape[0]
    C = V.shape[2]
    c = ck // NH
    k = ck % NH
    x = xs[k]
    al = np.empty((C, S), dtype=np.complex128)
    be = np.empty((C, S), dtype=np.complex128)
    for y in range(S):
        al[0, y] = mu[y] * (x if y == c else 1.0)
    for j in range(1, C):
        for z in range(S):
            acc = 0.0 + 0.0j
            for y in range(S):
                acc += al[j - 1, y] * pi[y, z]
            if z == c:
                acc *= x
            al[j, z] = acc
    for y in range(S):
        be[C - 1, y] = 1.0
    for i in range(C - 2, -1, -1):
        for y in range(S):
            acc = 0.0 + 0.0j
            for z in range(S):
                val = pi[y, z] * be[i + 1, z]
                if z == c:
                    val *= x
                acc += val
            be[i, y] = acc
    zz = 0.0 + 0.0j
    for b in range(S):
        zz += al[C - 1, b]
    Z[c, k] = zz
    for j in range(C):
        for b in range(S):
            V[c, k, j, b] = al[j, b] * be[j, b]
            g = phi[c, k, b] * al[j, b]
            Gr[c, k, b, j] = g.real
            Gi[c, k, b, j] = g.imag
        Br[c, k, j] = be[j, c].real
        Bi[c, k, j] = be[j, c].imag
    for b in range(S):
        Pm[c, k, 0, b] = 1.0 if b == c else 0.0
    for d in range(1, C):
        for y in range(S):
            acc = 0.0 + 0.0j
            for z in range(S):
                val = pi[y, z] * Pm[c, k, d - 1, z]
                if z == c:
                    val *= x
                acc += val
            Pm[c, k, d, y] = acc


def _chain_prepass(lo, hi, pi, mu, xs, phi, V, Z, Gr, Gi, Pm, Br, Bi):
    """Forward/backward vectors of the context chain ``0 → 1 → … → C-1``, ``lo <= c·NH + k < hi``.

    With ``A = π D(x)``: ``α_0 = μ ⊙ D``, ``α_{j+1} = α_j A``
    (``α_j[b] = E[[s_j=b] x^{m_c(0..j)}]``); ``β_{C-1} = 1``,
    ``β_i = A β_{i+1}`` (``β_i[y] = E[x^{m_c(i+1..C-1)} | s_i = y]``);
    ``P_d = A^d e_c`` (column ``c`` of ``A^d``). Outputs
    ``V[c,k,j,b] = α_j[b] β_j[b]``, ``Z[c,k] = Σ_b α_{C-1}[b]``,
    ``G = φ[c,k,b] α_j[b]`` (real/imaginary parts ``Gr, Gi`` indexed
    ``[c,k,b,j]``), ``Pm[c,k,d,b] = P_d[b]``, ``B = β_i[c]`` (``Br, Bi``
    indexed ``[c,k,i]``).
    """
    for ck in prange(lo, hi):
        _chain_prepass_one(ck, pi, mu, xs, phi, V, Z, Gr, Gi, Pm, Br, Bi)


chain_prepass, chain_prepass_serial = twins(_chain_prepass, "chain_prepass")


@njit(cache=True)
def _chain_pairs_one(it, lo, hi, Gr, Gi, Pr, Pi, Br, Bi, dblock, Y):
    """One iteration of :func:`chain_pairs`: two row blocks, the ``(c, k)`` in ``lo .. hi-1``."""
    S, NH, _, C = Gr.shape
    nblk = (C + dblock - 1) // dblock
    n_it = (nblk + 1) // 2
    tr = np.empty(C)
    ti = np.empty(C)
    for half in range(2):
        b0 = np.int64(it)
        blk = b0 if half == 0 else nblk - 1 - b0
        if half == 1 and blk == b0:
            break
        d0 = blk * dblock
        d1 = min(C, d0 + dblock)
        if lo == 0:
            for d in range(d0, d1):
                for j in range(C - d):
                    Y[d, j] = 0.0
        for ck in range(lo, hi):
            c = ck // NH
            k = ck % NH
            gr = Gr[c, k]
            gi = Gi[c, k]
            br = Br[c, k]
            bi = Bi[c, k]
            for d in range(d0, d1):
                L = C - d
                for j in range(L):
                    tr[j] = 0.0
                    ti[j] = 0.0
                for b in range(S):
                    pr = Pr[c, k, d, b]
                    pim = Pi[c, k, d, b]
                    grb = gr[b]
                    gib = gi[b]
                    for j in range(L):
                        tr[j] += pr * grb[j] - pim * gib[j]
                        ti[j] += pr * gib[j] + pim * grb[j]
                yd = Y[d]
                for j in range(L):
                    yd[j] += tr[j] * br[j + d] - ti[j] * bi[j + d]


def _chain_pairs(lo, hi, Gr, Gi, Pr, Pi, Br, Bi, dblock, Y):
    """``Y[d, j] = Re Σ_{c,k} β_{j+d}[c] Σ_b φ[c,k,b] α_j[b] (A^d)[b, c]``: the chain's pair term.

    ``E[[s_j=b][s_{j+d}=c] x^{m_c}] = α_j[b] (A^d)[b,c] β_{j+d}[c]``, so row
    ``d`` of ``Y`` is an elementwise product of shifted vectors over ``j``:
    inner loops run over ``j`` on real/imaginary parts stored separately
    (vectorizable, no reduction). ``d`` is processed in blocks of
    ``dblock`` rows sharing each ``(c, k)`` slice (cache reuse); blocks are
    paired ``(b, last-b)`` for equal work per parallel iteration. This call adds the ``(c, k)``
    with ``lo <= c·NH + k < hi`` (``lo = 0`` starts ``Y`` at 0).
    """
    C = Gr.shape[3]
    nblk = (C + dblock - 1) // dblock
    n_it = (nblk + 1) // 2
    for it in prange(n_it):
        _chain_pairs_one(it, lo, hi, Gr, Gi, Pr, Pi, Br, Bi, dblock, Y)


chain_pairs, chain_pairs_serial = twins(_chain_pairs, "chain_pairs")


@njit(cache=True)
def chain_unskew(Y, X):
    """``X[j + d, j] = Y[d, j]`` (lower triangle of the context block)."""
    C = Y.shape[0]
    for d in range(C):
        for j in range(C - d):
            X[j + d, j] = Y[d, j]


# ===========================================================================
# Assembly
# ===========================================================================
@njit(cache=True)
def assemble(X, V, Z, psi, chi, out):
    """The ``T×T`` field of one atom from its pair term ``X`` and marginals ``V, Z``.

    ``T2[j] = Re Σ_{c,k,b} ψ[c,k,b] V[c,k,j,b]`` (the ``b_q`` part, row-independent),
    ``Q1[j] = Re Σ_{c,k} χ[c,k] V[c,k,j,c]`` (query row),
    ``out[i, j] = X[i, j] - T2[j]`` for context ``j ≤ i``,
    ``out[T-1, j] = Q1[j] - T2[j]``,
    ``out[T-1, T-1] = Re Σ_{c,k} (χ[c,k] - Σ_b ψ[c,k,b]) Z[c,k]``.
    """
    S, NH, C, _ = V.shape
    T = C + 1
    t2 = np.zeros(C)
    q1 = np.zeros(C)
    for j in range(C):
        a = 0.0
        b1 = 0.0
        for c in range(S):
            for k in range(NH):
                for b in range(S):
                    a += (psi[c, k, b] * V[c, k, j, b]).real
                b1 += (chi[c, k] * V[c, k, j, c]).real
        t2[j] = a
        q1[j] = b1
    for i in range(T):
        for j in range(T):
            out[i, j] = 0.0
    for i in range(C):
        for j in range(i + 1):
            out[i, j] = X[i, j] - t2[j]
    for j in range(C):
        out[C, j] = q1[j] - t2[j]
    qd = 0.0
    for c in range(S):
        for k in range(NH):
            sp = 0.0 + 0.0j
            for b in range(S):
                sp += psi[c, k, b]
            qd += ((chi[c, k] - sp) * Z[c, k]).real
    out[C, C] = qd
