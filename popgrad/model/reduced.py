"""The reduced two-layer transformer of the paper (§3.3, "Knowl 6"), in NumPy.

This is the *reference* forward pass (DESIGN §3). The exact engine
(:mod:`popgrad.engine`) computes the same quantities
summed over every sequence; tests compare the two.

Parameters are ``A1`` (``T×T``; only the lower triangle, diagonal included,
is used) and ``A2`` (``S×S``). For a sequence ``s`` of length ``T`` with query
token ``q = s_{T-1}``::

    P    = softmax_rows(MASK(A1))        # T×T, row-stochastic, P[i, j] = 0 for j > i
    x_i  = Σ_j P[i, j] · e_{s_j}          # layer-1 output at position i (a point of the simplex)
    u_i  = Σ_j P[i, j] · A2[q, s_j]       # = <A2[q, :], x_i>, layer-2 scores
    a    = softmax(u)                    # over all T positions
    f_c  = Σ_i a_i · [s_i = c]           # output distribution over [S]

``P`` depends on ``A1`` only, never on the sequence. Causality: ``x_i``
depends on ``s_0 … s_i`` only (``P[i, j] = 0`` for ``j > i``); ``u_i`` also
depends on the query token.
"""
from __future__ import annotations

import numpy as np

from .._validation import as_seqs as _check_seqs, as_square as _check_square

__all__ = [
    "softmax",
    "first_layer_attention",
    "layer1_output",
    "second_layer_scores",
    "predict",
]


# ------------------------------------------------------------------ softmax
def softmax(x, axis=-1) -> np.ndarray:
    """Numerically stable softmax along ``axis``: ``exp(x - max) / Σ exp(x - max)``.

    Parameters
    ----------
    x : array_like of float
        Finite scores; entries equal to ``-inf`` get probability 0 (at least
        one entry per slice must be finite).
    axis : int
        The axis that sums to one.

    Returns
    -------
    ndarray of float64, same shape as ``x``.
    """
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def first_layer_attention(A1) -> np.ndarray:
    """Causal first-layer attention ``P = softmax_rows(MASK(A1))``.

    Parameters
    ----------
    A1 : array_like, shape (T, T)
        Finite first-layer position-position scores; entries above the
        diagonal are ignored (masked to ``-inf``).

    Returns
    -------
    P : ndarray of float64, shape (T, T)
        Row-stochastic, lower triangular (``P[i, j] = 0`` for ``j > i``);
        ``P[i, j] = exp(A1[i, j]) / Σ_{j' ≤ i} exp(A1[i, j'])`` for ``j ≤ i``.
    """
    A1 = _check_square(A1, "A1")
    T = A1.shape[0]
    masked = np.where(np.tri(T, dtype=bool), A1, -np.inf)
    P = softmax(masked, axis=1)
    P[~np.tri(T, dtype=bool)] = 0.0
    return P


def layer1_output(A1, seqs, S=None) -> np.ndarray:
    """Layer-1 output ``x_i = Σ_j P[i, j] e_{s_j}`` of every position.

    Parameters
    ----------
    A1 : array_like, shape (T, T)
    seqs : array_like of int, shape (n, T) or (T,)
        Tokens in ``0 … S-1``.
    S : int, optional
        Alphabet size; default ``seqs.max() + 1``.

    Returns
    -------
    x : ndarray of float64, shape (n, T, S)
        ``x[m, i, c] = Σ_{j ≤ i} P[i, j] [s_j = c]``: depends on
        ``s_0 … s_i`` only (the causal mask).
    """
    P = first_layer_attention(A1)
    seqs = _check_seqs(seqs, P.shape[0], S)
    if S is None:
        S = int(seqs.max()) + 1
    onehot = (seqs[:, :, None] == np.arange(S)).astype(np.float64)  # (n, T, S)
    return np.einsum("ij,njc->nic", P, onehot)


def second_layer_scores(A1, A2, seqs) -> np.ndarray:
    """Layer-2 scores ``u_i = Σ_j P[i, j] A2[q, s_j]`` with ``q = s_{T-1}``.

    Parameters
    ----------
    A1 : array_like, shape (T, T)
    A2 : array_like, shape (S, S)
    seqs : array_like of int, shape (n, T) or (T,)

    Returns
    -------
    u : ndarray of float64, shape (n, T)
    """
    A2 = _check_square(A2, "A2")
    P = first_layer_attention(A1)
    seqs = _check_seqs(seqs, P.shape[0], A2.shape[0])
    return _scores(P, A2, seqs)


def predict(A1, A2, seqs) -> np.ndarray:
    """Output distributions ``f(s)`` of the reduced model for a batch of sequences.

    Implements DESIGN §3 exactly: ``P = softmax_rows(MASK(A1))``,
    ``u_i = Σ_j P[i, j] A2[q, s_j]`` with ``q = s_{T-1}``, ``a = softmax(u)``,
    ``f_c = Σ_i a_i [s_i = c]``.

    Parameters
    ----------
    A1 : array_like, shape (T, T)
        First-layer scores (upper triangle ignored). Finite.
    A2 : array_like, shape (S, S)
        Second-layer token-token scores; row ``q`` scores keys for query ``q``.
        Finite.
    seqs : array_like of int, shape (n, T) or (T,)
        Sequences, query token last, tokens in ``0 … S-1``. A single
        sequence of shape ``(T,)`` is treated as ``n = 1``.

    Returns
    -------
    f : ndarray of float64, shape (n, S)
        Rows are probability distributions over ``[S]``.

    Raises
    ------
    ValueError
        On a shape mismatch, non-finite parameters or tokens outside ``[S]``.
    """
    A2 = _check_square(A2, "A2")
    P = first_layer_attention(A1)
    S = A2.shape[0]
    seqs = _check_seqs(seqs, P.shape[0], S)
    return _predict(P, A2, seqs)


# ---------------------------------------------------------- private helpers
def _scores(P, A2, seqs):
    """``u = V Pᵀ`` with ``V[m, j] = A2[q_m, s_{m, j}]``; ``(n, T)``."""
    V = A2[seqs[:, -1:], seqs]
    return V @ P.T


def _predict(P, A2, seqs):
    """Forward pass on clean arrays: ``(n, S)`` output distributions."""
    S = A2.shape[0]
    a = softmax(_scores(P, A2, seqs), axis=1)
    f = np.empty((seqs.shape[0], S))
    for c in range(S):
        f[:, c] = np.sum(a * (seqs == c), axis=1)
    return f
