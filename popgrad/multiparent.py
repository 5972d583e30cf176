"""Multi-parent causal graphs, transition-tensor priors and their task (DESIGN §9, "Knowl 9").

Graphs
------
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

Priors over transition tensors
------------------------------
A transition tensor holds ``π(c | a_1, ..., a_k)``. popgrad stores a finite
prior's atoms **flat**, shape ``(K, S**k, S)``::

    atoms[m, r, c] = π_m(c | a_1, ..., a_k),   r = a_1 S^{k-1} + a_2 S^{k-2} + ... + a_k

(the base-``S`` numeral of the parent tuple, first parent most significant,
i.e. ``numpy.ravel_multi_index`` of the tensor form). The tensor form
``(K,) + (S,)*k + (S,)`` is accepted on input and returned by
:attr:`TensorPrior.tensors`. Every row ``atoms[m, r, :]`` is a probability
distribution. :func:`dirichlet_tensor_prior` draws every row from
Dirichlet(α) with a fixed seed; ``symmetrize=True`` closes the atom set under
all ``S!`` relabelings ``π^σ(σc | σa_1 .. σa_k) = π(c | a_1 .. a_k)``.

The process popgrad states (and computes exactly)
-------------------------------------------------
Given ``π``: every root draws ``s_i ~ Unif([S])`` (the last position too,
when it is a root); a non-root draws ``s_i ~ π(· | s_{p(i)_1}, ..., s_{p(i)_k})``;
the target is the whole distribution ``π(· | s_{tp_1}, ..., s_{tp_k})``
with ``tp = target_parents`` (a soft label). So::

    w(s, c) = Σ_m weights[m] · S^{-|R|} · Π_{non-roots i} π_m(s_i | s_{p(i)}) · π_m(c | s_tp)

and ``Σ_{s,c} w(s, c) = 1``. Roots draw **uniformly** on purpose: a
``k``-parent process has no single stationary vector to draw them from.
The paper's released code (``InContextDAG``) draws roots from an extra
Dirichlet(α) vector per sequence (its ``pi[0] = uniform`` is overwritten by
the loop over parent counts, which includes 0), and its Bayes baseline is
the add-α count rule, the posterior mean for *its* continuous Dirichlet
prior estimated on sampled sequences (its single-parent rule also ignores
what stationary roots reveal about ``π``); popgrad therefore states its own
process, above, and computes the exact Bayes loss for its finite prior
(:func:`popgrad.bayes_loss_multi`).

Enumeration order and size guard are those of :class:`popgrad.Task`:
lexicographic, position ``0`` slowest, position ``T-1`` fastest;
``S**T ≤ max_sequences`` (default :data:`popgrad.DEFAULT_MAX_SEQUENCES`)
or :class:`popgrad.TaskTooLargeError`.
"""
from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

from . import _kernels_multi
from .graphs import CausalGraph
from .priors import MAX_CLOSURE_ATOMS, ROW_SUM_TOL, FinitePrior, validated_weights
from .task import DEFAULT_MAX_SEQUENCES, ExactTask, Sample

__all__ = [
    "MultiParentGraph",
    "ngram",
    "two_parent",
    "random_multi_parent",
    "TensorPrior",
    "TensorPriorDiagnostics",
    "dirichlet_tensor_prior",
    "relabel_tensor",
    "MultiParentTask",
    "sequence_weights_multi_numpy",
    "parent_rows",
]



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
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not 0 <= h < self.k:
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


def _check_int(x, name, minimum) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {x!r}")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return int(x)


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
    n = _check_int(n, "n", 2)
    T = _check_int(T, "T", 2)
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
    T = _check_int(T, "T", 2)
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
    T = _check_int(T, "T", 2)
    k = _check_int(k, "k", 1)
    if T < k:
        raise ValueError(f"random_multi_parent(T={T}, k={k}): the target needs k parents, use T >= k")
    try:
        root_prob = float(root_prob)
    except (TypeError, ValueError):
        raise ValueError(f"root_prob must be a number in [0, 1], got {root_prob!r}") from None
    if not 0.0 <= root_prob <= 1.0:
        raise ValueError(f"root_prob must be in [0, 1], got {root_prob}")
    rng = np.random.default_rng(seed)
    parents = np.full((T, k), -1, dtype=np.int64)
    for i in range(k, T):
        if rng.random() >= root_prob:
            parents[i] = np.sort(rng.choice(i, size=k, replace=False))
    target = np.sort(rng.choice(T, size=k, replace=False))
    return MultiParentGraph(parents, target)


# =================================================================== priors
def relabel_tensor(pi, perm) -> np.ndarray:
    """Relabel tokens of a transition tensor: ``out[σa_1, ..., σa_k, σc] = pi[a_1, ..., a_k, c]``.

    Parameters
    ----------
    pi : array_like, shape (S,)*k + (S,) or (S**k, S) (flat)
    perm : array_like of int, shape (S,)
        ``σ`` as ``perm[a] = σ(a)``.

    Returns
    -------
    ndarray of the same shape as ``pi``. For ``k = 1`` this is
    :func:`popgrad.relabel`.
    """
    pi = np.asarray(pi, dtype=np.float64)
    perm = np.asarray(perm)
    S = perm.shape[0]
    ten = pi.reshape((S,) * (_log_int(pi.shape[0], S) + 1)) if pi.ndim == 2 else pi
    out = np.empty_like(ten)
    out[np.ix_(*([perm] * ten.ndim))] = ten
    return out.reshape(pi.shape)


class TensorPriorDiagnostics(NamedTuple):
    """What can be measured of a transition-tensor prior (the k-parent analogue of "Knowl 10").

    Attributes
    ----------
    gamma : float
        ``S · min π`` over atoms, parent tuples and tokens.
    symmetric : bool or None
        Whether the weighted atom set is closed under all relabelings
        (``None`` when ``S > 6``: not checked).
    uniform_mean_error : float
        ``max |E[π] - 1/S|``.
    uniform_mean : bool
        ``uniform_mean_error ≤ 1e-12``.
    """

    gamma: float
    symmetric: object
    uniform_mean_error: float
    uniform_mean: bool

    def summary(self) -> str:
        sym = "not checked (S > 6)" if self.symmetric is None else str(self.symmetric)
        return (
            f"gamma={self.gamma:.4g} (min pi = gamma/S), relabeling-symmetric={sym}, "
            f"uniform mean={self.uniform_mean} (max |E[pi]-1/S| = {self.uniform_mean_error:.3g})"
        )


class TensorPrior:
    """A finite prior over ``k``-parent transition tensors ``π(c | a_1, ..., a_k)``.

    Parameters
    ----------
    atoms : array_like
        Flat ``(K, S**k, S)``, tensor ``(K,) + (S,)*k + (S,)``, or a single
        atom ``(S**k, S)`` / ``(S,)*(k+1)``. ``atoms[m, r, c] = π_m(c | a)``
        with ``r`` the base-``S`` numeral of ``a = (a_1, ..., a_k)``.
        Finite, non-negative, every row summing to one within ``1e-12``.
    weights : array_like, shape (K,), optional
        Non-negative, summing to one. Default uniform.
    k : int, optional
        Parents per tuple; inferred when omitted: a 2-D array is one flat
        atom, a 3-D array a stack of flat atoms (so ``(S, S, S)`` means ``S``
        single-parent atoms: pass ``k=2`` for one two-parent tensor), and
        ``d ≥ 4`` dimensions a stack of tensors with ``k = d - 2``.

    Raises
    ------
    ValueError
        Naming the offending atom/row and the fix.
    """

    __slots__ = ("_atoms", "_weights", "_k", "_symmetric")

    def __init__(self, atoms, weights=None, k=None):
        try:
            a = np.array(atoms, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("atoms must be a real array of transition tensors") from None
        a = _flat_atoms(a, k)
        K, R, S = a.shape
        kk = _log_int(R, S)
        if not np.all(np.isfinite(a)):
            m = int(np.argwhere(~np.isfinite(a))[0, 0])
            raise ValueError(f"atoms[{m}] has non-finite entries: transition probabilities must be finite")
        if np.any(a < 0):
            m, r, c = (int(x) for x in np.argwhere(a < 0)[0])
            raise ValueError(
                f"atoms[{m}] row {_tuple_str(r, S, kk)} token {c} is {a[m, r, c]:.3g} < 0: "
                "transition probabilities must be >= 0"
            )
        rows = a.sum(axis=2)
        bad = np.abs(rows - 1.0) > ROW_SUM_TOL
        if np.any(bad):
            m, r = (int(x) for x in np.argwhere(bad)[0])
            raise ValueError(
                f"row π(· | {_tuple_str(r, S, kk)}) of atoms[{m}] sums to {float(rows[m, r])!r}, not 1 (tolerance "
                f"{ROW_SUM_TOL}): every row must be a probability distribution (divide rows by their sums)"
            )
        weights = validated_weights(weights, K)
        a.setflags(write=False)
        weights.setflags(write=False)
        self._atoms = a
        self._weights = weights
        self._k = kk
        self._symmetric = None

    @classmethod
    def from_finite(cls, prior: FinitePrior) -> "TensorPrior":
        """The ``k = 1`` tensor prior with the atoms and weights of a :class:`FinitePrior`."""
        return cls(prior.atoms, prior.weights, k=1)

    # ---------------------------------------------------------- properties
    @property
    def atoms(self) -> np.ndarray:
        """Read-only flat atoms ``(K, S**k, S)``."""
        return self._atoms

    @property
    def tensors(self) -> np.ndarray:
        """The atoms in tensor form ``(K,) + (S,)*k + (S,)`` (a read-only view)."""
        return self._atoms.reshape((self.K,) + (self.S,) * (self.k + 1))

    @property
    def weights(self) -> np.ndarray:
        """Read-only ``(K,)`` prior weights."""
        return self._weights

    @property
    def K(self) -> int:
        """Number of atoms."""
        return int(self._atoms.shape[0])

    @property
    def S(self) -> int:
        """Alphabet size."""
        return int(self._atoms.shape[2])

    @property
    def k(self) -> int:
        """Parents per tuple."""
        return self._k

    def mean(self) -> np.ndarray:
        """``E[π]``, flat shape ``(S**k, S)``."""
        return np.einsum("m,mrc->rc", self._weights, self._atoms)

    # --------------------------------------------------------- diagnostics
    def is_relabeling_closed(self, tol: float = 1e-10):
        """Whether the weighted atom set is invariant under every relabeling (``None`` for ``S > 6``)."""
        if self.S > 6:
            return None
        if self._symmetric is None:
            self._symmetric = _closed_under_relabeling(self._atoms, self._weights, self.S, tol)
        return self._symmetric

    def diagnostics(self) -> TensorPriorDiagnostics:
        """``γ``, relabeling symmetry and uniform mean of this prior."""
        S = self.S
        err = float(np.abs(self.mean() - 1.0 / S).max())
        return TensorPriorDiagnostics(
            gamma=float(S * self._atoms.min()),
            symmetric=self.is_relabeling_closed(),
            uniform_mean_error=err,
            uniform_mean=bool(err <= 1e-12),
        )

    def summary(self) -> str:
        return f"TensorPrior S={self.S} k={self.k} K={self.K} atoms\n  " + self.diagnostics().summary()

    def __repr__(self):
        return f"TensorPrior(S={self.S}, k={self.k}, K={self.K})"


def _log_int(R, S) -> int:
    k, p = 0, 1
    while p < R:
        p *= S
        k += 1
    if p != R or k < 1:
        raise ValueError(f"flat atoms need S**k rows (k >= 1 parent-tuple rows for S = {S} tokens), got {R} rows")
    return k


def _flat_atoms(a, k):
    """Bring atoms to the flat ``(K, S**k, S)`` form (see :class:`TensorPrior`).

    Without ``k``: 2-D is one flat atom, 3-D a stack of flat atoms (so
    ``(S, S, S)`` is ``S`` single-parent atoms: pass ``k=2`` for one
    two-parent tensor), ``d ≥ 4`` dimensions a stack of tensors with
    ``k = d - 2``.
    """
    if a.ndim < 2:
        raise ValueError(f"atoms must have shape (K, S**k, S) or (K,)+(S,)*(k+1), got shape {a.shape}")
    S = a.shape[-1]
    if S < 2:
        raise ValueError(f"the alphabet needs S >= 2 tokens, got S = {S}")
    if k is not None:
        k = _check_int(k, "k", 1)
        if a.shape == (S**k, S) or a.shape == (S,) * (k + 1):
            return a.reshape(1, S**k, S)
        if a.shape[1:] == (S**k, S) or a.shape[1:] == (S,) * (k + 1):
            return a.reshape(a.shape[0], S**k, S)
        raise ValueError(
            f"atoms of shape {a.shape} do not hold k = {k} parent transition tensors over S = {S} tokens: "
            f"expected (K, {S**k}, {S}) or (K,)+({S},)*{k + 1}"
        )
    if a.ndim == 2:
        _log_int(a.shape[0], S)
        return a[None]
    if a.ndim == 3:
        _log_int(a.shape[1], S)
        return a
    if any(d != S for d in a.shape[1:]):
        raise ValueError(f"tensor atoms must have shape (K,)+(S,)*(k+1) with S = {S}, got shape {a.shape}")
    return a.reshape(a.shape[0], -1, S)


def _tuple_str(r, S, k) -> str:
    digits = []
    for _ in range(k):
        digits.append(r % S)
        r //= S
    return ", ".join(str(d) for d in reversed(digits))


def _closed_under_relabeling(atoms, weights, S, tol) -> bool:
    K = atoms.shape[0]
    flat = atoms.reshape(K, -1)
    rep, rep_w = [], []
    for m in range(K):
        for r_i, r in enumerate(rep):
            if np.abs(flat[m] - flat[r]).max() <= tol:
                rep_w[r_i] += weights[m]
                break
        else:
            rep.append(m)
            rep_w.append(float(weights[m]))
    reps = flat[rep]
    rep_w = np.array(rep_w)
    for perm in itertools.permutations(range(S)):
        moved = np.stack([relabel_tensor(atoms[r], perm).reshape(-1) for r in rep])
        match = np.abs(moved[:, None, :] - reps[None, :, :]).max(axis=2) <= tol
        if not np.all(match.any(axis=1)):
            return False
        if np.abs(rep_w[match.argmax(axis=1)] - rep_w).max() > 1e-12:
            return False
    return True


def dirichlet_tensor_prior(S: int, k: int, alpha: float, n_atoms: int, seed, symmetrize=True) -> TensorPrior:
    """A finite prior of ``k``-parent transition tensors with Dirichlet(α) rows.

    Every row ``π(· | a_1..a_k)`` of every atom is an independent
    Dirichlet(α) draw from ``numpy.random.default_rng(seed)`` (rows in the
    flat order of :class:`TensorPrior`). For ``k = 1`` the draws equal
    :func:`popgrad.dirichlet_prior`'s.

    ``symmetrize`` closes the finite set under symmetries of the i.i.d.
    Dirichlet prior it stands for (equally weighted atoms):

    * ``True`` / ``"relabel"``: all ``S!`` relabelings
      ``π^σ(σc | σa_1..σa_k) = π(c | a_1..a_k)`` (``n_atoms · S!`` atoms):
      exact permutation symmetry, but ``E[π]`` is uniform only up to the
      sampling error of ``n_atoms`` draws (``E[π(c | a)]`` still depends on
      which of ``c, a_1, …, a_k`` coincide);
    * ``"full"``: independent relabelings of the parent tokens and of the
      predicted token, ``π'(τc | σa_1..σa_k) = π(c | a_1..a_k)``
      (``n_atoms · S!²`` atoms): contains the relabelings and makes
      ``E[π] = 11ᵀ/S`` exact (the symmetric Dirichlet prior is invariant
      under both), so finite-sample "copy the token" biases of the prior
      disappear;
    * ``False``: the raw draws.

    Parameters
    ----------
    S : int
        Alphabet size ``≥ 2``.
    k : int
        Parents per tuple ``≥ 1``.
    alpha : float
        Dirichlet concentration ``> 0``.
    n_atoms : int
        Draws ``≥ 1``.
    seed : int
    symmetrize : bool, default True
    """
    S = _check_int(S, "S", 2)
    k = _check_int(k, "k", 1)
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a positive number, got {alpha!r}") from None
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite Dirichlet concentration, got {alpha}")
    n_atoms = _check_int(n_atoms, "n_atoms", 1)
    rng = np.random.default_rng(seed)
    atoms = rng.dirichlet(np.full(S, alpha), size=(n_atoms, S**k))
    atoms = atoms / atoms.sum(axis=2, keepdims=True)
    if not np.all(np.isfinite(atoms)):
        raise ValueError(f"Dirichlet draws with alpha={alpha} underflowed to NaN; use a larger alpha")
    if symmetrize is False:
        return TensorPrior(atoms, k=k)
    if symmetrize not in (True, "relabel", "full"):
        raise ValueError(f"symmetrize must be True, False, 'relabel' or 'full', got {symmetrize!r}")
    perms = list(itertools.permutations(range(S)))
    outs = perms if symmetrize == "full" else [None]
    n_out = n_atoms * len(perms) * len(outs)
    if n_out > MAX_CLOSURE_ATOMS:
        raise ValueError(
            f"closing {n_atoms} atoms under {symmetrize!r} symmetry would create {n_out} atoms "
            f"(limit {MAX_CLOSURE_ATOMS}): use symmetrize=False, fewer atoms, or a smaller S"
        )
    out = np.empty((n_out, S**k, S))
    j = 0
    for m in range(n_atoms):
        for tau in outs:
            base = atoms[m] if tau is None else atoms[m][:, np.argsort(tau)]  # base[:, τc] = atoms[m][:, c]
            for perm in perms:
                out[j] = relabel_tensor(base, perm)
                j += 1
    return TensorPrior(out, np.full(n_out, 1.0 / n_out), k=k)


# ===================================================================== task
def parent_rows(seqs, parent_positions, S) -> np.ndarray:
    """Flat row index ``r = Σ_h s[p_h] S^{k-1-h}`` of given parent positions, shape ``(n,)``."""
    powers = S ** np.arange(len(parent_positions) - 1, -1, -1, dtype=np.int64)
    return np.asarray(seqs)[:, np.asarray(parent_positions)] @ powers


def sequence_weights_multi_numpy(seqs, parents, target_parents, atoms, prior_w) -> np.ndarray:
    """NumPy reference for ``w(s, c)`` of the multi-parent process (module docstring).

    Parameters
    ----------
    seqs : int array (n, T)
    parents : int array (T, k)
    target_parents : int array (k,)
    atoms : float64 (K, S**k, S)
    prior_w : float64 (K,)

    Returns
    -------
    w : float64 (n, S)
    """
    seqs = np.asarray(seqs)
    K, _, S = atoms.shape
    n, T = seqs.shape
    n_roots = int(np.sum(parents[:, 0] < 0))
    p = np.tile((prior_w * float(S) ** -n_roots)[:, None], (1, n))  # (K, n)
    for i in range(T):
        if parents[i, 0] >= 0:
            p = p * atoms[:, parent_rows(seqs, parents[i], S), seqs[:, i]]
    rt = parent_rows(seqs, target_parents, S)
    return np.einsum("kn,knc->nc", p, atoms[:, rt, :])


class MultiParentTask(ExactTask):
    """A multi-parent task: a :class:`MultiParentGraph` and a :class:`TensorPrior` with the same ``k``.

    Parameters
    ----------
    graph : MultiParentGraph
    prior : TensorPrior
        (A :class:`popgrad.FinitePrior` is accepted when ``k = 1``.)
    max_sequences : int, optional
        Largest ``S**T`` exact enumeration accepts (default
        :data:`popgrad.DEFAULT_MAX_SEQUENCES`, the same guard as
        :class:`popgrad.Task`).
    """

    __slots__ = ()

    def __init__(self, graph: MultiParentGraph, prior, max_sequences: int = DEFAULT_MAX_SEQUENCES):
        if isinstance(graph, CausalGraph):
            graph = MultiParentGraph.from_single(graph)
        if not isinstance(graph, MultiParentGraph):
            raise ValueError(f"graph must be a popgrad.MultiParentGraph, got {type(graph).__name__}")
        if isinstance(prior, FinitePrior):
            prior = TensorPrior.from_finite(prior)
        if not isinstance(prior, TensorPrior):
            raise ValueError(f"prior must be a popgrad.TensorPrior, got {type(prior).__name__}")
        if prior.k != graph.k:
            raise ValueError(
                f"the prior's tensors have k = {prior.k} parents but the graph has k = {graph.k}: "
                f"use a prior with k = {graph.k} (e.g. dirichlet_tensor_prior(S, {graph.k}, ...))"
            )
        self._init_common(graph, prior, max_sequences)

    # ---------------------------------------------------------- properties
    @property
    def k(self) -> int:
        """Parents per non-root = heads of the model."""
        return self._graph.k

    def kernel_arrays(self):
        """Contiguous arrays the kernels take.

        Returns
        -------
        parents : int64 (T, k)
        target_parents : int64 (k,)
        atoms : float64 (K, S**k, S)
        pk0 : float64 (K,)
            ``weights · S^{-|R|}`` (the roots' uniform factors folded in).
        """
        n_roots = len(self._graph.roots)
        return (
            np.ascontiguousarray(self._graph.parents, dtype=np.int64),
            np.ascontiguousarray(self._graph.target_parents, dtype=np.int64),
            np.ascontiguousarray(self._prior.atoms, dtype=np.float64),
            np.ascontiguousarray(self._prior.weights * float(self.S) ** -n_roots, dtype=np.float64),
        )

    def _fill_chunk(self, start, arrays, seqs, w) -> None:
        parents, tp, atoms, pk0 = arrays
        _kernels_multi.chunk_weights_multi(start, parents, tp, atoms, atoms, pk0, seqs, w)

    # ------------------------------------------------------------- sampling
    def sample(self, n: int, seed) -> Sample:
        """Draw ``n`` sequences and their soft labels from the process (deterministic given ``seed``).

        Returns a :class:`popgrad.Sample` with ``targets[m] = π(· | s_tp)``.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        rng = np.random.default_rng(seed)
        prior, S, T = self._prior, self.S, self.T
        parents = self._graph.parents
        m = rng.choice(prior.K, size=n, p=prior.weights)
        seqs = np.empty((n, T), dtype=np.int64)
        cdf = np.cumsum(prior.atoms, axis=2)
        for i in range(T):
            u = rng.random(n)[:, None]
            if parents[i, 0] < 0:
                seqs[:, i] = np.minimum((u * S).astype(np.int64)[:, 0], S - 1)
            else:
                rows = parent_rows(seqs, parents[i], S)
                seqs[:, i] = np.minimum((u >= cdf[m, rows]).sum(axis=1), S - 1)
        targets = prior.atoms[m, parent_rows(seqs, self._graph.target_parents, S)]
        return Sample(seqs, targets, m.astype(np.int64))

    def summary(self) -> str:
        """Graph, prior diagnostics, sizes."""
        return (
            f"MultiParentTask S={self.S} T={self.T} k={self.k} sequences S**T={self.n_sequences:,} "
            f"(limit {self._max_sequences:,})\n{self._graph.summary()}\n{self._prior.summary()}"
        )

