"""Numba kernels of the out-of-distribution check (:func:`popgrad.checks.check_ood`).

Bit-identical to the NumPy code they replace (the tests compare):
:func:`atom_prefix_probs`, :func:`sup_error_rows`, :func:`stable_argsort`,
:func:`weighted_quantile`. ``cache=True``, never ``fastmath``.
"""
import numpy as np
from numba import njit

from ..engine._kernels.numeric import _f64_bits



@njit(cache=True)
def atom_prefix_probs(seqs, parents, mu, atoms, p):
    """``p[k, m] = (1/S) Π_{roots i<T-1} μ_k(s_i) Π_{non-roots i} π_k(s_i | s_{p(i)})`` for each atom alone.

    The probability of ``seqs[m]`` under atom ``k`` (query uniform),
    multiplied in increasing position order exactly as
    :func:`popgrad.task.sequence_weights_numpy` does for a one-atom prior
    with weight 1 (bit-identical).
    """
    K, S, _ = atoms.shape
    n, T = seqs.shape
    for m in range(n):
        for k in range(K):
            v = 1.0 / S
            for i in range(T - 1):
                par = parents[i]
                if par < 0:
                    v = v * mu[k, seqs[m, i]]
                else:
                    v = v * atoms[k, seqs[m, par], seqs[m, i]]
            p[k, m] = v


@njit(cache=True)
def sup_error_rows(f, q, atoms, p, atom_weights, errs, probs):
    """Per atom ``k`` and sequence ``m``: ``errs[k, m] = max_c |f[m, c] - π_k(c | q_m)|`` and
    ``probs[k, m] = atom_weights[k] · Σ_c p[k, m] π_k(c | q_m)``.

    The sum over ``c`` runs in increasing ``c`` from 0, which is what
    NumPy's ``(p[k][:, None] * atoms[k][q]).sum(axis=1)`` does for rows of
    fewer than 8 entries (bit-identical; callers use NumPy for ``S ≥ 8``).
    A NaN in ``f`` propagates to ``errs`` as in ``np.max``.
    """
    K, S, _ = atoms.shape
    n = f.shape[0]
    for k in range(K):
        wk = atom_weights[k]
        for m in range(n):
            qm = q[m]
            mx = abs(f[m, 0] - atoms[k, qm, 0])
            acc = 0.0
            for c in range(S):
                a = atoms[k, qm, c]
                v = abs(f[m, c] - a)
                if v > mx or v != v:
                    mx = v
                acc += p[k, m] * a
            errs[k, m] = mx
            probs[k, m] = wk * acc


@njit(cache=True)
def stable_argsort(values):
    """The permutation of ``np.argsort(values, kind="stable")`` for float64, by LSD radix sort.

    Keys are the IEEE bit patterns made order-preserving (``-0.0`` counts as
    ``+0.0``; every NaN sorts last, in index order, as in NumPy); 11-bit
    digits (cache-friendly buckets), passes over digits all keys share are skipped. ``O(n)``.
    """
    n = values.shape[0]
    keys = np.empty(n, dtype=np.uint64)
    top = np.uint64(1) << np.uint64(63)
    nan_key = np.uint64(0xFFFFFFFFFFFFFFFF)
    for i in range(n):
        x = values[i]
        if x != x:
            keys[i] = nan_key
            continue
        b = np.uint64(_f64_bits(x + 0.0))
        keys[i] = (~b) if (b & top) else (b | top)
    order = np.arange(n)
    tmp = np.empty(n, dtype=np.int64)
    ktmp = np.empty(n, dtype=np.uint64)
    count = np.empty(2049, dtype=np.int64)
    mask = np.uint64(0x7FF)
    for shift in range(0, 64, 11):
        sh = np.uint64(shift)
        count[:] = 0
        for i in range(n):
            count[np.int64((keys[i] >> sh) & mask) + 1] += 1
        if n == 0 or count[np.int64((keys[0] >> sh) & mask) + 1] == n:
            continue  # every key has this digit: the pass would not move anything
        for d in range(2048):
            count[d + 1] += count[d]
        for i in range(n):
            kv = keys[i]
            d = np.int64((kv >> sh) & mask)
            c = count[d]
            tmp[c] = order[i]
            ktmp[c] = kv
            count[d] = c + 1
        order, tmp = tmp, order
        keys, ktmp = ktmp, keys
    return order


@njit(cache=True)
def weighted_quantile(values, weights, q):
    """The ``q``-quantile of ``values`` under ``weights``, exactly as

    ``order = argsort(values, kind="stable"); cw = cumsum(weights[order]);
    values[order][min(searchsorted(cw, q·cw[-1], "left"), n-1)]``

    (the same sequential sums, so the same bits) without the ``n``-long
    temporaries: :func:`stable_argsort`, one pass for the total, one pass to
    the first running sum ``≥ q·total``.
    """
    order = stable_argsort(values)
    n = order.shape[0]
    total = 0.0
    for i in range(n):
        total += weights[order[i]]
    target = q * total
    acc = 0.0
    for i in range(n):
        acc += weights[order[i]]
        if acc >= target:
            return values[order[i]]
    return values[order[n - 1]]
