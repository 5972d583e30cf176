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
