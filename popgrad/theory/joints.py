r"""Pairwise joints of two positions from the graph, never by enumeration (DESIGN §5).

For positions ``i, j`` of one tree with lowest common ancestor ``c`` at
distances ``d_i, d_j``::

    P[s_j = a, s_i = b | π] = Σ_x μ(x) (π^{d_j})[x, a] (π^{d_i})[x, b]
                            = ((π^{d_j})ᵀ D π^{d_i})[a, b].

Different trees give ``μ ⊗ μ``. The query ``T-1`` is uniform and independent
of everything: a pair involving it is ``marginal ⊗ marginal`` with the query
marginal ``1/S`` (and ``diag(1/S)`` for ``i = j = T-1``).

The distances come from :func:`lca_distances` (one vectorized row per position, ``O(T²)``).
"""
from __future__ import annotations

import numpy as np

from .._validation import is_int
from ..task.graphs import CausalGraph
from .chain import _as_mu, _as_transition

__all__ = ["lca_distances", "pairwise_joint"]


def lca_distances(graph: CausalGraph) -> np.ndarray:
    """Distances from lowest common ancestors, for all pairs, in ``O(T²)``.

    Parameters
    ----------
    graph : CausalGraph

    Returns
    -------
    D : ndarray of int64, shape (T, T)
        ``D[x, y]`` = number of edges from ``LCA(x, y)`` down to ``x``, and
        ``-1`` when ``x`` and ``y`` lie in different trees. So for a pair
        ``(i, j)``: ``d_i = D[i, j]``, ``d_j = D[j, i]`` (as returned by
        :meth:`CausalGraph.lowest_common_ancestor`).

    Notes
    -----
    Row by row: for a non-root ``i`` with parent ``p`` and ``j < i``,
    ``LCA(i, j) = LCA(p, j)`` (``i`` cannot be an ancestor of an earlier
    position), so ``D[i, j] = D[p, j] + 1`` and ``D[j, i] = D[j, p]``.
    """
    if not isinstance(graph, CausalGraph):
        raise ValueError(f"graph must be a popgrad.CausalGraph, got {type(graph).__name__}")
    parents = graph.parents
    T = graph.T
    D = np.full((T, T), -1, dtype=np.int64)
    for i in range(T):
        D[i, i] = 0
        p = int(parents[i])
        if p < 0:
            continue
        row = D[p, :i]
        same = row >= 0
        D[i, :i] = np.where(same, row + 1, -1)
        D[:i, i] = np.where(same, D[:i, p], -1)
    return D


def pairwise_joint(graph: CausalGraph, pi, i: int, j: int, mu=None) -> np.ndarray:
    """Joint ``P[s_j = a, s_i = b | π]`` of two positions, from the graph.

    Parameters
    ----------
    graph : CausalGraph
    pi : array_like, shape (S, S)
        Irreducible transition matrix.
    i, j : int
        Positions in ``0 .. T-1`` (any order; ``i = j`` allowed).
    mu : array_like, shape (S,), optional

    Returns
    -------
    P : ndarray, shape (S, S)
        ``P[a, b] = P[s_j = a, s_i = b]``:
        ``(π^{d_j})ᵀ D π^{d_i}`` in one tree (LCA at distances ``d_i, d_j``),
        ``m_j ⊗ m_i`` otherwise, with marginal ``m = μ`` except the query's
        ``m = 1/S``; ``diag(m_i)`` when ``i = j``.
    """
    if not isinstance(graph, CausalGraph):
        raise ValueError(f"graph must be a popgrad.CausalGraph, got {type(graph).__name__}")
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    T, S = graph.T, pi.shape[0]
    for name, v in (("i", i), ("j", j)):
        if not is_int(v) or not 0 <= v < T:
            raise ValueError(f"{name} = {v!r} must be a position in 0..{T - 1}")
    i, j = int(i), int(j)
    uniform = np.full(S, 1.0 / S)
    m_i = uniform if i == T - 1 else mu
    m_j = uniform if j == T - 1 else mu
    if i == j:
        return np.diag(m_i)
    lca = graph.lowest_common_ancestor(i, j)
    if lca is None:
        return np.outer(m_j, m_i)
    _, d_i, d_j = lca
    return np.linalg.matrix_power(pi, d_j).T @ (mu[:, None] * np.linalg.matrix_power(pi, d_i))
