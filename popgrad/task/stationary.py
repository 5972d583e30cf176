"""Stationary distributions of transition matrices (DESIGN §1, §6).

A transition matrix ``pi`` is row-stochastic, ``pi[a, b] = π(b | a)``. Its
stationary distribution ``mu`` (``mu @ pi = mu``) is computed with the
Grassmann-Taksar-Heyman (GTH) elimination, which uses no subtraction and so
stays non-negative and accurate even for nearly reducible chains.
"""
from __future__ import annotations

import numpy as np

__all__ = ["stationary_distribution", "STOCHASTIC_ATOL"]


def stationary_distribution(pi) -> np.ndarray:
    """Stationary distribution of a row-stochastic matrix by GTH elimination.

    Parameters
    ----------
    pi : array_like, shape (S, S) or (K, S, S)
        Row-stochastic matrix (or stack of them), ``pi[a, b] = π(b | a)``.

    Returns
    -------
    mu : ndarray, shape (S,) or (K, S)
        Non-negative, sums to one, ``mu @ pi = mu``. For a reducible chain
        the GTH elimination returns one stationary distribution (supported on
        a closed class).

    Raises
    ------
    TypeError
        ``pi`` is not an array of real numbers.
    ValueError
        ``pi`` is not square, or not row-stochastic: an entry is negative or
        not finite, or a row does not sum to one (within ``1e-9``).

    Examples
    --------
    >>> import popgrad as pg
    >>> pg.stationary_distribution([[0.9, 0.1], [0.2, 0.8]]).round(6).tolist()
    [0.666667, 0.333333]
    """
    pi = _as_stochastic(pi)
    if pi.ndim == 3:
        return np.stack([_gth(p) for p in pi]) if len(pi) else np.zeros((0, pi.shape[-1]))
    return _gth(pi)


#: How far a row of a transition matrix may sum from one (rounding of the caller's arithmetic).
STOCHASTIC_ATOL = 1e-9


def _as_stochastic(pi) -> np.ndarray:
    """``pi`` as float64 row-stochastic matrices of shape (S, S) or (K, S, S), or a one-line error."""
    from .._validation import as_heads, as_square

    arr = np.asarray(pi) if not isinstance(pi, np.ndarray) else pi
    if arr.ndim == 3:
        pi = as_heads(arr, "pi")
    else:
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
            raise ValueError(f"transition matrix must be square (S, S), got shape {arr.shape}")
        pi = as_square(arr, "pi")
    if pi.size and pi.min() < 0:
        idx = tuple(int(x) for x in np.argwhere(pi < 0)[0])
        raise ValueError(f"pi[{', '.join(map(str, idx))}] = {pi[idx]!r} is negative: a transition matrix holds "
                         "probabilities pi[a, b] = π(b | a) >= 0")
    sums = pi.sum(axis=-1)
    bad = np.abs(sums - 1.0) > STOCHASTIC_ATOL
    if np.any(bad):
        idx = tuple(int(x) for x in np.argwhere(bad)[0])
        raise ValueError(f"row {', '.join(map(str, idx))} of pi sums to {sums[idx]!r}, not 1: a transition matrix "
                         "is row-stochastic (normalize each row)")
    return pi


def _gth(p: np.ndarray) -> np.ndarray:
    A = np.array(p, dtype=np.float64)
    n = A.shape[0]
    # Forward elimination (QuantEcon's gth_solve): only additions,
    # multiplications and divisions by positive sums.
    m = n
    for k in range(n - 1):
        scale = A[k, k + 1 : m].sum()
        if scale <= 0.0:
            # States k+1.. are unreachable from k: {0..k} holds a closed class.
            m = k + 1
            break
        A[k + 1 : m, k] /= scale
        A[k + 1 : m, k + 1 : m] += np.outer(A[k + 1 : m, k], A[k, k + 1 : m])
    x = np.zeros(n)
    x[m - 1] = 1.0
    for k in range(m - 2, -1, -1):
        x[k] = x[k + 1 : m] @ A[k + 1 : m, k]
    return x / x.sum()
