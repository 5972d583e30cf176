"""Single-parent causal graphs (DESIGN §1, §3).

A causal graph on positions ``0, ..., T-1`` is an int array ``parents`` of
length ``T`` with ``parents[i] = -1`` (a root) or ``0 <= parents[i] < i``.
The last position ``T-1`` is the **query**: it is always a root and its token
is uniform on ``[S]``.

The graph splits into disjoint trees, one per root (the query is a tree of
its own with one leaf).  With ``L_k`` the number of leaves of tree ``k``,
the effective sequence length is (paper "Knowl 1")::

    T_eff = T / max_k L_k

Builders return a :class:`CausalGraph` whose last position is the query:

* :func:`chain` -- positions ``0..T-2`` form one Markov chain (the
  induction-head task);
* :func:`icl_pairs` -- pairs ``0->1, 2->3, ...`` (in-context function
  learning);
* :func:`random_tree` -- every position ``1..T-2`` is a root with
  probability ``root_prob`` and otherwise picks a uniform earlier parent.

The compact text form ``"-1,0,0,1,2,-1"`` (:meth:`CausalGraph.to_string`,
:meth:`CausalGraph.from_string`) round-trips exactly.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "CausalGraph",
    "Tree",
    "chain",
    "icl_pairs",
    "random_tree",
]


class Tree(NamedTuple):
    """One tree of a causal graph.

    Attributes
    ----------
    root : int
        The root position.
    nodes : tuple of int
        All positions of the tree, increasing.
    leaves : tuple of int
        Positions of the tree with no child (an isolated root is its own leaf).
    """

    root: int
    nodes: tuple
    leaves: tuple


class CausalGraph:
    """A single-parent causal DAG whose last position is the query.

    Parameters
    ----------
    parents : array_like of int, shape (T,)
        ``parents[i] = -1`` for a root, else ``0 <= parents[i] < i``.
        ``parents[T-1]`` must be ``-1`` (the query is a root).

    Raises
    ------
    ValueError
        If ``parents`` is not a 1-D integer array of length ``T >= 2`` or an
        entry violates the rules above; the message names the index and the
        fix.
    """

    __slots__ = ("_parents", "_trees", "_children")

    def __init__(self, parents):
        self._parents = _validate_parents(parents)
        self._trees = None
        self._children = None

    # ------------------------------------------------------------------ basics
    @property
    def parents(self) -> np.ndarray:
        """Read-only int64 array ``(T,)``; ``-1`` marks a root."""
        return self._parents

    @property
    def T(self) -> int:
        """Number of positions, the query included."""
        return int(self._parents.shape[0])

    @property
    def roots(self) -> np.ndarray:
        """Increasing int64 array of root positions (always contains ``T-1``)."""
        return np.flatnonzero(self._parents < 0)

    @property
    def non_roots(self) -> np.ndarray:
        """Increasing int64 array of positions that have a parent."""
        return np.flatnonzero(self._parents >= 0)

    @property
    def root_fraction(self) -> float:
        """``|R| / T`` (paper assumption: at most ``1 - gamma``)."""
        return len(self.roots) / self.T

    def adjacency(self) -> np.ndarray:
        """The ``(T, T)`` 0/1 float64 matrix with ``adj[i, parents[i]] = 1``.

        Rows are children, so ``adj`` is strictly lower triangular; root rows
        are zero.
        """
        adj = np.zeros((self.T, self.T))
        nr = self.non_roots
        adj[nr, self._parents[nr]] = 1.0
        return adj

    def children(self, i: int) -> tuple:
        """Positions whose parent is ``i``, increasing."""
        if self._children is None:
            ch = [[] for _ in range(self.T)]
            for j, p in enumerate(self._parents):
                if p >= 0:
                    ch[p].append(j)
            self._children = tuple(tuple(c) for c in ch)
        return self._children[i]

    def root_of(self, i: int) -> int:
        """The root of the tree that contains position ``i``."""
        while self._parents[i] >= 0:
            i = int(self._parents[i])
        return int(i)

    def depth(self, i: int) -> int:
        """Number of edges from the root of ``i``'s tree down to ``i``."""
        d = 0
        while self._parents[i] >= 0:
            i = int(self._parents[i])
            d += 1
        return d

    def lowest_common_ancestor(self, i: int, j: int):
        """Lowest common ancestor of ``i`` and ``j`` with both distances.

        Returns
        -------
        (c, d_i, d_j) or None
            ``c`` is the deepest common ancestor (a node is its own ancestor),
            ``d_i``/``d_j`` the number of edges from ``c`` down to ``i``/``j``.
            ``None`` when ``i`` and ``j`` lie in different trees.
        """
        dist_i = {}
        node, d = int(i), 0
        while True:
            dist_i[node] = d
            p = int(self._parents[node])
            if p < 0:
                break
            node, d = p, d + 1
        node, d = int(j), 0
        while True:
            if node in dist_i:
                return node, dist_i[node], d
            p = int(self._parents[node])
            if p < 0:
                return None
            node, d = p, d + 1

    # ------------------------------------------------------------------- trees
    def trees(self) -> tuple:
        """The disjoint trees of the graph, one per root, ordered by root."""
        if self._trees is None:
            members = {int(r): [] for r in self.roots}
            for i in range(self.T):
                members[self.root_of(i)].append(i)
            out = []
            for r in sorted(members):
                nodes = tuple(members[r])
                leaves = tuple(n for n in nodes if not self.children(n))
                out.append(Tree(r, nodes, leaves))
            self._trees = tuple(out)
        return self._trees

    @property
    def max_leaves(self) -> int:
        """``max_k L_k`` over the trees of the graph."""
        return max(len(t.leaves) for t in self.trees())

    @property
    def t_eff(self) -> float:
        """Effective sequence length ``T / max_k L_k`` (DESIGN §3)."""
        return self.T / self.max_leaves

    # ------------------------------------------------------------- text form
    def to_string(self) -> str:
        """Compact text form, e.g. ``"-1,0,0,1,2,-1"`` (round-trips)."""
        return ",".join(str(int(p)) for p in self._parents)

    @classmethod
    def from_string(cls, text: str) -> "CausalGraph":
        """Parse the compact text form produced by :meth:`to_string`.

        Raises
        ------
        ValueError
            If ``text`` is not a comma-separated list of integers or the
            parents it lists are invalid.
        """
        if not isinstance(text, str):
            raise ValueError(
                f"graph text must be a string such as '-1,0,1,-1', got {type(text).__name__}"
            )
        parts = [p.strip() for p in text.strip().split(",")]
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise ValueError(
                f"cannot parse graph {text!r}: expected comma-separated integers "
                "such as '-1,0,0,1,-1' (-1 marks a root, the last entry is the query and must be -1)"
            ) from None
        return cls(values)

    # ------------------------------------------------------------ dunder
    def __eq__(self, other):
        if not isinstance(other, CausalGraph):
            return NotImplemented
        return np.array_equal(self._parents, other._parents)

    def __hash__(self):
        return hash(self._parents.tobytes())

    def __repr__(self):
        return f"CausalGraph('{self.to_string()}')"

    def summary(self) -> str:
        """A few human-readable lines: T, roots, trees, T_eff."""
        return (
            f"CausalGraph T={self.T} parents=[{self.to_string()}]\n"
            f"  roots={len(self.roots)} (fraction {self.root_fraction:.3f}), "
            f"trees={len(self.trees())}, max leaves={self.max_leaves}, "
            f"T_eff={self.t_eff:.3f}"
        )


# ---------------------------------------------------------------- validation
def _validate_parents(parents) -> np.ndarray:
    arr = np.asarray(parents)
    if arr.ndim != 1:
        raise ValueError(f"parents must be a 1-D array of length T, got shape {arr.shape}")
    if arr.shape[0] < 2:
        raise ValueError(
            f"parents must have length T >= 2 (at least one context position and the query), "
            f"got length {arr.shape[0]}"
        )
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError("parents must be integers (-1 for a root), got non-integer values")
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"parents must be integers (-1 for a root), got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    T = arr.shape[0]
    for i, p in enumerate(arr):
        if p < -1:
            raise ValueError(f"parents[{i}] = {p} is invalid: use -1 for a root or a parent index in 0..{i - 1}")
        if p >= i and p != -1:
            raise ValueError(
                f"parents[{i}] = {p} must be < {i}: a parent comes strictly before its child "
                f"(use -1 for a root)"
            )
    if arr[T - 1] != -1:
        raise ValueError(
            f"parents[{T - 1}] = {arr[T - 1]} must be -1: the last position is the query and is always a root"
        )
    arr.setflags(write=False)
    return arr


def _check_T(T, minimum=2) -> int:
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)):
        raise ValueError(f"T must be an integer >= {minimum}, got {T!r}")
    if T < minimum:
        raise ValueError(f"T must be >= {minimum} (context positions plus the query), got {T}")
    return int(T)


# ------------------------------------------------------------------ builders
def chain(T: int) -> CausalGraph:
    """Markov chain on positions ``0..T-2`` plus the query (induction head).

    ``parents = [-1, 0, 1, ..., T-3, -1]``.
    """
    T = _check_T(T)
    parents = np.arange(-1, T - 1, dtype=np.int64)
    parents[T - 1] = -1
    return CausalGraph(parents)


def icl_pairs(T: int) -> CausalGraph:
    """In-context function learning: pairs ``0->1, 2->3, ...`` plus the query.

    Position ``2m+1`` has parent ``2m`` whenever ``2m+1 <= T-2``; every
    other position is a root (a lone last context position when ``T`` is
    even, and the query).
    """
    T = _check_T(T)
    parents = np.full(T, -1, dtype=np.int64)
    for i in range(1, T - 1, 2):
        parents[i] = i - 1
    return CausalGraph(parents)


def random_tree(T: int, seed: int, root_prob: float = 0.1) -> CausalGraph:
    """A random forest on positions ``0..T-2`` plus the query.

    Position 0 is a root; each position ``1..T-2`` is a root with
    probability ``root_prob`` and otherwise draws a uniform parent in
    ``0..i-1``. Deterministic given ``seed`` (``numpy.random.default_rng``).
    """
    T = _check_T(T)
    if not (0.0 <= float(root_prob) <= 1.0):
        raise ValueError(f"root_prob must be in [0, 1], got {root_prob}")
    rng = np.random.default_rng(seed)
    parents = np.full(T, -1, dtype=np.int64)
    for i in range(1, T - 1):
        if rng.random() >= root_prob:
            parents[i] = rng.integers(0, i)
    return CausalGraph(parents)


def official_random_tree(T: int, seed: int) -> CausalGraph:
    """The official Figure 2 "random" graph (``single_parent.py``, ``dag="random"``).

    Each position ``i = 0 … T-2`` draws its parent uniformly from ``{none, 0, …, i-1}``
    (a root with probability ``1/(i+1)``; position 0 is always a root); the query ``T-1``
    is a root. The distribution of the official ``randint(minval=-1, maxval=arange(T-1))``;
    deterministic given ``seed`` (``numpy.random.default_rng``, not JAX's stream).
    (Figure 9's generator, ``many_graphs.ipynb``'s ``get_random_DAG(p=0.5)``, is
    :func:`random_tree` with ``root_prob=0.5``.)
    """
    T = _check_T(T)
    rng = np.random.default_rng(seed)
    parents = np.full(T, -1, dtype=np.int64)
    for i in range(1, T - 1):
        parents[i] = rng.integers(-1, i)
    return CausalGraph(parents)
