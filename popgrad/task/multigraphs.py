"""Multi-parent causal graphs (DESIGN §9, "Knowl 9").

A multi-parent graph on positions ``0, ..., T-1`` is an int array ``parents``
of shape ``(T, k)``: row ``i`` is either all ``-1`` (a root) or ``k``
distinct, strictly increasing, strictly earlier positions
``p(i)_1 < ... < p(i)_k < i`` (the paper's ordered parents). The graph also
names ``target_parents``, the ``k`` parents of the target that follows the
last position (strictly increasing, in ``0 .. T-1``). Unlike the
single-parent task the last position is not necessarily a root: in an
n-gram it is an ordinary non-root and the target's parents are the last
``n-1`` positions.

Builders: :func:`ngram` (``p(i) = (i-n+1, ..., i-1)``), :func:`two_parent`
(the paper's released experiment, ``p(i) = ((i-1)//2, i-1)``),
:func:`random_multi_parent` (``k`` distinct earlier positions drawn from a
seed) and the manual form :class:`MultiParentGraph`. A single-parent
:class:`popgrad.CausalGraph` is the ``k = 1`` graph
``MultiParentGraph.from_single(g)`` (target parent ``T-1``, the query).

Effective length. The paper defines ``T_eff = T / max_k L_k`` for forests
only (DESIGN §3). popgrad extends it unchanged in form: split the DAG on
``0 .. T-1`` into its weakly connected components (edges from every
non-root to each of its ``k`` parents; the target is not a position) and let
``L_k`` be the number of sinks (positions that are nobody's parent) of
component ``k``; ``T_eff = T / max_k L_k``. For ``k = 1`` components are the
trees and sinks the leaves, so this *is* DESIGN §3; for ``k > 1`` it is a
popgrad convention (a heuristic: an n-gram or the two-parent graph has one
sink, ``T_eff = T``). The loss perturbation is ``ε = T_eff^{-1/2}`` as before.
"""
from __future__ import annotations

import numpy as np

from .._validation import as_int, as_rng, is_int
from .graphs import CausalGraph

__all__ = ["MultiParentGraph", "ngram", "two_parent", "random_multi_parent"]


# =================================================================== graphs
class MultiParentGraph:
    """A causal DAG whose non-roots have exactly ``k`` ordered parents.

    Parameters
    ----------
    parents : array_like of int, shape (T, k)
        Row ``i`` is ``[-1]*k`` for a root, otherwise ``k`` distinct,
        strictly increasing positions ``< i`` (``p(i)_1 < ... < p(i)_k``).
    target_parents : array_like of int, shape (k,)
        The parents of the target that follows position ``T-1``: distinct,
        strictly increasing, in ``0 .. T-1``.

    Raises
    ------
    ValueError
        On a wrong shape or dtype, or a row that breaks the rules; the
        message names the index and the fix.

    Notes
    -----
    Head ``h`` of the ``k``-head model should learn :meth:`adjacency` ``(h)``:
    row ``i < T-1`` attends to ``p(i)_h`` (uniform for roots), the last row
    to ``target_parents[h]`` (the last position carries the target's parents
    into layer 2, whatever its own parents are).
    """

    __slots__ = ("_parents", "_target", "_sinks", "_components")

    def __init__(self, parents, target_parents):
        self._parents, self._target = _validate_multi(parents, target_parents)
        self._sinks = None
        self._components = None

    @classmethod
    def from_single(cls, graph: CausalGraph) -> "MultiParentGraph":
        """The ``k = 1`` graph of a single-parent :class:`CausalGraph` (target parent: the query ``T-1``)."""
        if not isinstance(graph, CausalGraph):
            raise ValueError(f"graph must be a popgrad.CausalGraph, got {type(graph).__name__}")
        return cls(np.asarray(graph.parents).reshape(-1, 1), [graph.T - 1])

    # ------------------------------------------------------------- basics
    @property
    def parents(self) -> np.ndarray:
        """Read-only int64 array ``(T, k)``; root rows are ``-1``."""
        return self._parents

    @property
    def target_parents(self) -> np.ndarray:
        """Read-only int64 array ``(k,)``: the target's parents, increasing."""
        return self._target

    @property
    def T(self) -> int:
        """Number of positions."""
        return int(self._parents.shape[0])

    @property
    def k(self) -> int:
        """Parents per non-root (= heads of the model)."""
        return int(self._parents.shape[1])

    @property
    def roots(self) -> np.ndarray:
        """Increasing int64 array of root positions."""
        return np.flatnonzero(self._parents[:, 0] < 0)

    @property
    def non_roots(self) -> np.ndarray:
        """Increasing int64 array of positions with ``k`` parents."""
        return np.flatnonzero(self._parents[:, 0] >= 0)

    @property
    def root_fraction(self) -> float:
        """``|R| / T``."""
        return len(self.roots) / self.T

    def slot_parents(self, h: int) -> np.ndarray:
        """Parent of slot ``h`` of every position the model's head ``h`` should copy, shape ``(T,)``.

        ``out[i] = p(i)_h`` for ``i < T-1`` (``-1`` for roots) and
        ``out[T-1] = target_parents[h]``.
        """
        h = self._check_slot(h)
        out = self._parents[:, h].copy()
        out[-1] = self._target[h]
        return out

    def adjacency(self, h: int) -> np.ndarray:
        """What head ``h`` should attend to: a ``(T, T)`` 0/1 float64 matrix.

        ``adj[i, p(i)_h] = 1`` for non-root ``i < T-1`` (root rows zero: the
        construction leaves them uniform) and ``adj[T-1, target_parents[h]] = 1``.
        ``A1^h = β1 · adjacency(h)`` is the construction of "Knowl 9".
        """
        par = self.slot_parents(h)
        adj = np.zeros((self.T, self.T))
        rows = np.flatnonzero(par >= 0)
        adj[rows, par[rows]] = 1.0
        return adj

    def edge_adjacency(self) -> np.ndarray:
        """The DAG itself: ``(T, T)`` 0/1 matrix with ``adj[i, j] = 1`` iff ``j ∈ p(i)``."""
        adj = np.zeros((self.T, self.T))
        for i in self.non_roots:
            adj[i, self._parents[i]] = 1.0
        return adj

    def _check_slot(self, h) -> int:
        if not is_int(h) or not 0 <= h < self.k:
            raise ValueError(f"parent slot h must be an integer in 0..{self.k - 1}, got {h!r}")
        return int(h)

    # --------------------------------------------------------------- T_eff
    def components(self) -> tuple:
        """Weakly connected components of the DAG on ``0..T-1``: tuples of positions, by smallest member."""
        if self._components is None:
            T = self.T
            root = list(range(T))

            def find(x):
                while root[x] != x:
                    root[x] = root[root[x]]
                    x = root[x]
                return x

            for i in self.non_roots:
                for p in self._parents[i]:
                    a, b = find(int(i)), find(int(p))
                    if a != b:
                        root[max(a, b)] = min(a, b)
            groups = {}
            for i in range(T):
                groups.setdefault(find(i), []).append(i)
            self._components = tuple(tuple(g) for _, g in sorted(groups.items()))
        return self._components

    @property
    def sinks(self) -> np.ndarray:
        """Positions that are nobody's parent (the leaves, for ``k = 1``)."""
        if self._sinks is None:
            is_parent = np.zeros(self.T, dtype=bool)
            nr = self.non_roots
            is_parent[self._parents[nr].ravel()] = True
            self._sinks = np.flatnonzero(~is_parent)
        return self._sinks

    @property
    def max_sinks(self) -> int:
        """``max_k L_k``: the most sinks in one weakly connected component."""
        sink = set(int(x) for x in self.sinks)
        return max(sum(1 for i in comp if i in sink) for comp in self.components())

    @property
    def t_eff(self) -> float:
        """``T / max_k L_k`` (module docstring; DESIGN §3 when ``k = 1``)."""
        return self.T / self.max_sinks

    # ------------------------------------------------------------ text form
    def to_string(self) -> str:
        """Compact text form, e.g. ``"-;-;0,1;1,2;1,3>2,4"`` (round-trips).

        Rows separated by ``;`` (``-`` for a root), the target's parents after ``>``.
        """
        rows = ["-" if p[0] < 0 else ",".join(str(int(x)) for x in p) for p in self._parents]
        return ";".join(rows) + ">" + ",".join(str(int(x)) for x in self._target)

    @classmethod
    def from_string(cls, text: str) -> "MultiParentGraph":
        """Parse :meth:`to_string`'s form; ``ValueError`` on anything else."""
        if not isinstance(text, str) or text.count(">") != 1:
            raise ValueError(
                f"multi-parent graph text must look like '-;-;0,1;1,2>1,3' (rows by ';', '-' for a root, "
                f"the target's parents after '>'), got {text!r}"
            )
        body, target = text.strip().split(">")
        try:
            tp = [int(x) for x in target.split(",")]
            k = len(tp)
            rows = [[-1] * k if r.strip() == "-" else [int(x) for x in r.split(",")] for r in body.split(";")]
        except ValueError:
            raise ValueError(f"cannot parse multi-parent graph {text!r}: expected integers, '-', ',', ';' and '>'") from None
        if any(len(r) != k for r in rows):
            raise ValueError(f"multi-parent graph {text!r}: every non-root row needs k = {k} parents (as many as the target)")
        return cls(np.array(rows, dtype=np.int64).reshape(-1, k), tp)

    # ---------------------------------------------------------------- dunder
    def __eq__(self, other):
        if not isinstance(other, MultiParentGraph):
            return NotImplemented
        return np.array_equal(self._parents, other._parents) and np.array_equal(self._target, other._target)

    def __hash__(self):
        return hash((self._parents.tobytes(), self._target.tobytes(), self.k))

    def __repr__(self):
        return f"MultiParentGraph('{self.to_string()}')"

    def summary(self) -> str:
        """A few human-readable lines: T, k, roots, target parents, T_eff."""
        return (
            f"MultiParentGraph T={self.T} k={self.k} parents=[{self.to_string()}]\n"
            f"  roots={len(self.roots)} (fraction {self.root_fraction:.3f}), target parents="
            f"{tuple(int(x) for x in self._target)}, components={len(self.components())}, "
            f"max sinks={self.max_sinks}, T_eff={self.t_eff:.3f}"
        )


def _as_int_array(x, name) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer array") from None
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} must hold integers (-1 marks a root), got non-integer values")
    elif arr.dtype.kind not in "iu" and arr.size:
        raise ValueError(f"{name} must hold integers (-1 marks a root), got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _validate_multi(parents, target_parents):
    par = _as_int_array(parents, "parents")
    if par.ndim == 1:
        raise ValueError(
            f"parents must have shape (T, k), got a 1-D array of length {par.shape[0]}: for k = 1 pass "
            "parents.reshape(-1, 1) or use MultiParentGraph.from_single(CausalGraph(...))"
        )
    if par.ndim != 2 or par.shape[1] < 1:
        raise ValueError(f"parents must have shape (T, k) with k >= 1 (one row per position), got shape {par.shape}")
    T, k = par.shape
    if T < 2:
        raise ValueError(f"a multi-parent graph needs T >= 2 positions, got T = {T}")
    if T < k:
        raise ValueError(f"the target needs k = {k} distinct parents among T = {T} positions: use T >= k")
    for i in range(T):
        row = par[i]
        if np.all(row == -1):
            continue
        listed = "[" + ", ".join(str(int(x)) for x in row) + "]"
        if np.any(row < 0):
            raise ValueError(
                f"parents[{i}] = {listed} mixes -1 with parents: a row is either all -1 (a root) or "
                f"k = {k} distinct earlier positions"
            )
        if np.any(row >= i):
            bad = int(row[row >= i][0])
            raise ValueError(
                f"parents[{i}] = {listed}: parent {bad} must be < {i} (a parent comes strictly before its "
                f"child; use all -1 for a root{'; positions < k can only be roots' if i < k else ''})"
            )
        if len(set(row.tolist())) < k:
            raise ValueError(f"parents[{i}] = {listed} repeats a position: the k = {k} parents must be distinct")
        if np.any(np.diff(row) <= 0):
            raise ValueError(
                f"parents[{i}] = {listed} must be strictly increasing (ordered parents p_1 < ... < p_k): "
                "sort the row (and permute the transition tensor's parent axes to match)"
            )
    tp = _as_int_array(target_parents, "target_parents").reshape(-1) if np.ndim(target_parents) <= 1 else None
    if tp is None or tp.shape != (k,):
        shape = np.shape(target_parents)
        raise ValueError(f"target_parents must have shape (k,) = ({k},) to match parents, got shape {shape}")
    listed = "[" + ", ".join(str(int(x)) for x in tp) + "]"
    for h, p in enumerate(tp):
        if not 0 <= p < T:
            raise ValueError(
                f"target_parents[{h}] = {int(p)} is out of range: the target's parents are positions 0..{T - 1}"
            )
    if len(set(tp.tolist())) < k:
        raise ValueError(f"target_parents = {listed} repeats a position: the k = {k} parents must be distinct")
    if np.any(np.diff(tp) <= 0):
        raise ValueError(f"target_parents = {listed} must be strictly increasing: sort it")
    par.setflags(write=False)
    tp.setflags(write=False)
    return par, tp


def ngram(T: int, n: int) -> MultiParentGraph:
    """The n-gram graph: ``k = n-1`` parents ``p(i) = (i-k, ..., i-1)`` for ``i ≥ k``.

    Positions ``0 .. k-1`` are roots; the target's parents are the last
    ``k`` positions ``(T-k, ..., T-1)``. ``n = 2`` is a Markov chain whose
    last position is an ordinary non-root.

    Parameters
    ----------
    T : int
        Positions, ``T ≥ max(2, n-1)``.
    n : int
        ``n ≥ 2``.
    """
    n = as_int(n, "n", minimum=2)
    T = as_int(T, "T", minimum=2)
    k = n - 1
    if T < k:
        raise ValueError(f"ngram(T={T}, n={n}): the target needs n-1 = {k} parents, use T >= {k}")
    parents = np.full((T, k), -1, dtype=np.int64)
    for i in range(k, T):
        parents[i] = np.arange(i - k, i)
    return MultiParentGraph(parents, np.arange(T - k, T))


def two_parent(T: int) -> MultiParentGraph:
    """The paper's two-parent graph: ``p(i) = ((i-1)//2, i-1)`` for ``i ≥ 2``.

    Positions 0 and 1 are roots; the target (position ``T``) has parents
    ``((T-1)//2, T-1)``. This is the ``dag`` of the released
    ``multi_parent.ipynb``, ``[[], []] + [[(i-1)//2, i-1] for i in range(2, T+1)]``.
    """
    T = as_int(T, "T", minimum=2)
    parents = np.full((T, 2), -1, dtype=np.int64)
    for i in range(2, T):
        parents[i] = ((i - 1) // 2, i - 1)
    return MultiParentGraph(parents, [(T - 1) // 2, T - 1])


def random_multi_parent(T: int, k: int, seed, root_prob: float = 0.0) -> MultiParentGraph:
    """A random ``k``-parent DAG, deterministic given ``seed``.

    Positions ``0 .. k-1`` are roots; each later position is a root with
    probability ``root_prob`` and otherwise draws ``k`` distinct earlier
    positions uniformly (sorted). The target draws ``k`` distinct positions
    of ``0 .. T-1`` (the paper's commented-out random DAG, with roots).
    Uses ``numpy.random.default_rng(seed)``.
    """
    T = as_int(T, "T", minimum=2)
    k = as_int(k, "k", minimum=1)
    if T < k:
        raise ValueError(f"random_multi_parent(T={T}, k={k}): the target needs k parents, use T >= k")
    try:
        root_prob = float(root_prob)
    except (TypeError, ValueError):
        raise ValueError(f"root_prob must be a number in [0, 1], got {root_prob!r}") from None
    if not 0.0 <= root_prob <= 1.0:
        raise ValueError(f"root_prob must be in [0, 1], got {root_prob}")
    rng = as_rng(seed, "seed")
    parents = np.full((T, k), -1, dtype=np.int64)
    for i in range(k, T):
        if rng.random() >= root_prob:
            parents[i] = np.sort(rng.choice(i, size=k, replace=False))
    target = np.sort(rng.choice(T, size=k, replace=False))
    return MultiParentGraph(parents, target)
