"""Numba kernel of the S >= 3 stationary-root Monte-Carlo weights (:mod:`popgrad.task.dirichlet`)."""
import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def mc_moments(n, r, logpi, logmu, s1, s2):
    """``s1[m] = Σ_k v_mk``, ``s2[m] = Σ_k v_mk²`` with ``v_mk = exp(n_m · log π_k + r_m · log μ_k)``.

    ``n (M, S*S)``, ``r (M, S)`` counts; ``logpi (K, S*S)``, ``logmu (K, S)``; a zero count times
    ``log 0 = -inf`` counts as 0. One thread per statistic, atoms in order: independent of the thread count.
    """
    M = n.shape[0]
    K = logpi.shape[0]
    E = n.shape[1]
    S = r.shape[1]
    for m in prange(M):
        a = 0.0
        b = 0.0
        for k in range(K):
            x = 0.0
            for e in range(E):
                if n[m, e] != 0:
                    x += n[m, e] * logpi[k, e]
            for c in range(S):
                if r[m, c] != 0:
                    x += r[m, c] * logmu[k, c]
            v = np.exp(x)
            a += v
            b += v * v
        s1[m] = a
        s2[m] = b


@njit(cache=True, inline="always")
def _pairwise_sum(a, lo, hi):
    """``a[lo:hi].sum()`` with NumPy's own order (its pairwise sum of a contiguous run: below 8 terms one
    sequential sum from 0; up to 128 terms eight interleaved partial sums, combined as a tree, then the rest)."""
    n = hi - lo
    if n < 8:
        res = 0.0
        for i in range(lo, hi):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = lo + 8
    stop = hi - n % 8
    while i < stop:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < hi:
        res += a[i]
        i += 1
    return res


@njit(cache=True)
def gth_batch(pi, x, stuck):
    """Stationary distributions of ``pi (N, S, S)`` into ``x (N, S)`` by GTH, one chain at a time, with the
    operations (and roundings) of :func:`popgrad.task.dirichlet._gth_batch`'s vectorized NumPy in the same
    order, so the same bits (``S <= 128``). A zero pivot sets ``stuck[i]`` (the caller replaces that row)."""
    N, S = pi.shape[0], pi.shape[1]
    A = np.empty((S, S))
    for i in range(N):
        for r in range(S):
            for c in range(S):
                A[r, c] = pi[i, r, c]
        stuck[i] = False
        for k in range(S - 1):
            sc = _pairwise_sum(A[k], k + 1, S)
            if sc <= 0.0:
                stuck[i] = True
                break
            for r in range(k + 1, S):
                A[r, k] /= sc
            for r in range(k + 1, S):
                ark = A[r, k]
                for c in range(k + 1, S):
                    A[r, c] += ark * A[k, c]
        for c in range(S):
            x[i, c] = 0.0
        if stuck[i]:
            continue
        x[i, S - 1] = 1.0
        for k in range(S - 2, -1, -1):
            acc = 0.0
            for j in range(k + 1, S):
                acc += x[i, j] * A[j, k]
            x[i, k] = acc
        tot = _pairwise_sum(x[i], 0, S)
        for c in range(S):
            x[i, c] /= tot


@njit(cache=True)
def normalize_rows(g, out):
    """``out = g / g.sum(axis=-1, keepdims=True)`` for ``g (N, R, S)`` with NumPy's summation order (its
    pairwise sum of a contiguous row, ``S <= 128``): the same bits as the NumPy expression."""
    N, R, S = g.shape
    for i in range(N):
        for r in range(R):
            tot = _pairwise_sum(g[i, r], 0, S)
            for c in range(S):
                out[i, r, c] = g[i, r, c] / tot


@njit(cache=True)
def sample_tokens(pis, mu_cdf, parents, u, seqs):
    """Positions ``0 … T-2`` of ``seqs (n, T)`` from the uniforms ``u (T-1, n)``: a root's token from ``mu_cdf[m]``,
    a non-root's from the row ``pis[m, s_{p(i)}]`` -- the count of the row's cumulative sums ``≤ u`` (capped at
    ``S - 1``), the cumulative sum taken as ``numpy.cumsum`` takes it (sequential), so the same tokens as the
    NumPy loop of :meth:`popgrad.Task.sample` over ``numpy.cumsum(pis, axis=2)``."""
    n, S = mu_cdf.shape
    Tm1 = u.shape[0]
    for m in range(n):
        for i in range(Tm1):
            x = u[i, m]
            cnt = 0
            if parents[i] < 0:
                for c in range(S):
                    if x >= mu_cdf[m, c]:
                        cnt += 1
            else:
                q = seqs[m, parents[i]]
                acc = 0.0
                for c in range(S):
                    acc += pis[m, q, c]
                    if x >= acc:
                        cnt += 1
            seqs[m, i] = min(cnt, S - 1)
