"""Numba kernels. Each has a plain-NumPy reference next to the public API.

Kernels take clean, contiguous float64 / int64 arrays and trust them; the
public functions validate. ``cache=True`` everywhere, never ``fastmath``.

Enumeration order (shared by every kernel): sequence number ``m`` in
``0 .. S**T - 1`` is the base-``S`` numeral ``s_0 s_1 ... s_{T-1}`` with
position ``0`` the most significant digit, so position ``T-1`` (the query)
varies fastest: lexicographic order, ``itertools.product(range(S), repeat=T)``.
"""
import numpy as np
from numba import njit, prange


@njit(cache=True)
def decode_sequence(index, S, T, out):
    """Write the tokens of sequence number ``index`` into ``out[:T]``."""
    for t in range(T - 1, -1, -1):
        out[t] = index % S
        index //= S


@njit(cache=True)
def sequence_weight_row(s, parents, mu, atoms, prior_w, out):
    """``out[c] = w(s, c)`` of DESIGN §2 for one sequence ``s``."""
    K, S, _ = atoms.shape
    T = s.shape[0]
    q = s[T - 1]
    for c in range(S):
        out[c] = 0.0
    for k in range(K):
        p = prior_w[k] / S
        for i in range(T - 1):
            par = parents[i]
            if par < 0:
                p *= mu[k, s[i]]
            else:
                p *= atoms[k, s[par], s[i]]
        if p != 0.0:
            for c in range(S):
                out[c] += p * atoms[k, q, c]


@njit(cache=True, parallel=True)
def chunk_weights(start, parents, mu, atoms, prior_w, seqs, w):
    """Fill ``seqs (n, T)`` and ``w (n, S)`` for sequences ``start .. start+n-1``.

    Parallel over sequences; every output row is written by one thread with
    a fixed summation order, so the result does not depend on the thread
    count.
    """
    n, T = seqs.shape
    S = atoms.shape[1]
    for m in prange(n):
        decode_sequence(start + m, S, T, seqs[m])
        sequence_weight_row(seqs[m], parents, mu, atoms, prior_w, w[m])
