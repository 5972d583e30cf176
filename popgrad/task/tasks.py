"""Tasks: a causal graph + a prior, and their exact sequence weights (DESIGN §2, §9).

:class:`Task` (single-parent graph, finite prior over transition matrices) and
:class:`MultiParentTask` (k-parent graph, prior over transition tensors) share
:class:`ExactTask`: sizes, the size guard, chunked enumeration, the fingerprint.

Given ``π``: roots other than the query draw ``s_i ~ μ_π``; a non-root draws
``s_i ~ π(· | s_{p(i)})``; the query draws ``s_{T-1} ~ Unif([S])``; the
target is the whole distribution ``π(· | s_{T-1})`` (a soft label). For each
sequence ``s ∈ [S]^T`` and token ``c`` the exact joint weight is::

    w(s, c) = Σ_k weights[k] · P(s | π_k) · π_k(c | s_{T-1}),
    P(s | π) = (1/S) · Π_{roots i < T-1} μ_π(s_i) · Π_{non-roots i} π(s_i | s_{p(i)})

and ``Σ_{s,c} w(s, c) = 1``.

Enumeration order: lexicographic with position ``0`` slowest and the query
position ``T-1`` fastest, i.e. the order of
``itertools.product(range(S), repeat=T)``; sequence number ``m`` is the
base-``S`` numeral ``s_0 s_1 … s_{T-1}``.
"""
from __future__ import annotations

import hashlib
import math
from typing import Iterator, NamedTuple

import numpy as np

from .._validation import ArgumentTypeError, as_int, as_rng, count_text
from . import _weights
from .graphs import CausalGraph
from .multigraphs import MultiParentGraph
from . import dirichlet as _dirichlet
from .dirichlet import DirichletPrior, DirichletTensorPrior, WeightAccuracy, is_continuous
from .priors import MAX_CLOSURE_ATOMS, FinitePrior
from .tensor_priors import TensorPrior

__all__ = [
    "ExactTask", "Task", "MultiParentTask", "Sample", "TaskTooLargeError", "DEFAULT_MAX_SEQUENCES",
    "sequence_weights_numpy", "sequence_weights_multi_numpy", "parent_rows", "decode_sequences", "check_task",
]

#: Default limit on ``S**T`` for exact enumeration (about 3 s per exact
#: loss-and-gradient evaluation at 10M sequences per second).
DEFAULT_MAX_SEQUENCES = 2**25
#: Nominal throughput used to estimate enumeration time in error messages.
_NOMINAL_SEQ_PER_S = 1e7
#: Largest weight table (with its sequences) a task keeps in memory; past it the table is recomputed in
#: chunks of ``TABLE_CHUNK`` sequences whenever it is read.
TABLE_BUDGET_BYTES = 512 * 2**20
#: Sequences per chunk when a table is computed (or streamed past the budget).
TABLE_CHUNK = 2**16


class TaskTooLargeError(ValueError):
    """Raised when exact enumeration of ``S**T`` sequences exceeds the limit."""


class Sample(NamedTuple):
    """Monte-Carlo draws from the task's generative process.

    Attributes
    ----------
    seqs : ndarray of int64, shape (n, T)
        Sampled sequences (query token last).
    targets : ndarray of float64, shape (n, S)
        The soft label ``π(· | s_{T-1})`` of each draw's transition matrix.
    atoms : ndarray of int64, shape (n,)
        Index of the prior atom each draw used.
    """

    seqs: np.ndarray
    targets: np.ndarray
    atoms: np.ndarray


class ExactTask:
    """What every enumerable task shares: sizes, the size guard, chunked enumeration.

    Subclasses (:class:`Task`, :class:`popgrad.MultiParentTask`)
    set ``_graph``, ``_prior`` and ``_max_sequences`` through
    :meth:`_init_common` and implement :meth:`_fill_chunk` (the exact weights
    of a block of sequences), :meth:`sample` and :meth:`summary`.
    """

    __slots__ = ("_graph", "_prior", "_max_sequences", "_fingerprint", "_table", "_accuracy")
    #: Extra "way out" named by the size-guard error.
    _size_guard_hint = ""

    def _init_common(self, graph, prior, max_sequences) -> None:
        max_sequences = as_int(max_sequences, "max_sequences", minimum=1)
        self._graph = graph
        self._prior = prior
        self._max_sequences = int(max_sequences)
        self._fingerprint = None
        self._table = None
        self._accuracy = None

    # ------------------------------------------------------------ properties
    @property
    def graph(self):
        return self._graph

    @property
    def prior(self):
        return self._prior

    @property
    def S(self) -> int:
        """Alphabet size."""
        return self._prior.S

    @property
    def T(self) -> int:
        """Sequence length, the query included."""
        return self._graph.T

    @property
    def n_sequences(self) -> int:
        """``S**T``, the number of sequences exact enumeration visits."""
        return self.S**self.T

    @property
    def max_sequences(self) -> int:
        """The enumeration size limit of this task."""
        return self._max_sequences

    @property
    def t_eff(self) -> float:
        """The graph's effective length (``T / max_k L_k`` for single-parent graphs)."""
        return self._graph.t_eff

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the graph and the prior's atoms and weights: equal tasks, equal fingerprints.

        Keys the engine's plan and weight caches (:func:`popgrad.clear_caches`) and ties a
        checkpoint to its task. Graphs and priors are immutable, so it is computed once.
        """
        if self._fingerprint is None:
            h = hashlib.sha256()
            h.update(self._prior.fingerprint_bytes())
            h.update(self._graph.to_string().encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    @property
    def default_eps(self) -> float:
        """The loss perturbation ``T_eff ** -0.5`` (DESIGN §3)."""
        return self._graph.t_eff ** -0.5

    # ----------------------------------------------------------- enumeration
    @property
    def continuous(self) -> bool:
        """True when the prior is continuous (:class:`popgrad.DirichletPrior`, :class:`popgrad.DirichletTensorPrior`):
        no atoms, the engines read :meth:`weight_table`."""
        return is_continuous(self._prior)

    @property
    def enumerable(self) -> bool:
        """Whether exact enumeration is possible: ``S**T`` within the limit and the prior's atoms listable
        (an implicit relabeling closure of more than ``MAX_CLOSURE_ATOMS`` atoms is not)."""
        if self.continuous:
            return self.n_sequences <= self._max_sequences
        return self.n_sequences <= self._max_sequences and self._prior.K <= MAX_CLOSURE_ATOMS

    def check_size(self) -> None:
        """Raise :class:`TaskTooLargeError` if ``S**T`` exceeds the limit or the prior's atoms cannot be listed."""
        if not self.continuous and self._prior.K > MAX_CLOSURE_ATOMS:
            b = self._prior.base
            raise TaskTooLargeError(
                f"exact enumeration needs every atom of the prior, but its {b.K} draws closed under all "
                f"{self.S}! relabelings are {self._prior.K:,} atoms (limit {MAX_CLOSURE_ATOMS:,}): use the "
                "Stage-1 field and a sampled Stage 2 (popgrad run --gradient field --stage2 sampled; "
                "train_two_stage(gradient='field', stage2='sampled')), fewer atoms, or a smaller S"
            )
        n = self.n_sequences
        if n > self._max_sequences:
            S, T = self.S, self.T
            if n < 10**15:
                count, seconds = f"{n:,}", f"{n / _NOMINAL_SEQ_PER_S:,.1f}"
            else:  # too large for a float: give orders of magnitude
                count = f"about 10^{T * math.log10(S):.0f}"
                seconds = f"about 10^{T * math.log10(S) - math.log10(_NOMINAL_SEQ_PER_S):.0f}"
            raise TaskTooLargeError(
                f"exact enumeration of S**T = {S}**{T} = {count} sequences exceeds the limit "
                f"max_sequences = {self._max_sequences:,} (estimated {seconds} s "
                f"per exact loss-and-gradient evaluation at ~{_NOMINAL_SEQ_PER_S:.0e} sequences/s; "
                f"memory stays bounded by the chunk size). Ways out: use a smaller S or T, raise the "
                f"limit with {type(self).__name__}(graph, prior, max_sequences=...){self._size_guard_hint}."
            )

    def enumerate(self, chunk_size: int = 2**16) -> Iterator[tuple]:
        """Yield every sequence with its exact weights, in chunks.

        Parameters
        ----------
        chunk_size : int
            Largest number of sequences per chunk; memory is
            ``O(chunk_size · (T + S))``.

        Yields
        ------
        seqs : ndarray of int64, shape (n, T)
            Sequences in lexicographic order (query position fastest).
        w : ndarray of float64, shape (n, S)
            ``w[m, c] = w(seqs[m], c)``; over all chunks ``Σ w = 1``.

        Raises
        ------
        TaskTooLargeError
            If ``S**T`` exceeds :attr:`max_sequences`.

        Examples
        --------
        >>> import popgrad as pg
        >>> task = pg.Task(pg.chain(4), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=2, seed=0))
        >>> [(seqs.shape, w.shape) for seqs, w in task.enumerate(chunk_size=10)]
        [((10, 4), (10, 2)), ((6, 4), (6, 2))]
        >>> round(float(sum(w.sum() for _, w in task.enumerate())), 12)
        1.0
        """
        chunk_size = as_int(chunk_size, "chunk_size", minimum=1)
        self.check_size()
        n_total, T, S = self.n_sequences, self.T, self.S
        if self.continuous:  # from the weight table (computed once)
            for start in range(0, n_total, int(chunk_size)):
                stop = min(n_total, start + int(chunk_size))
                yield decode_sequences(start, stop, S, T), self.weight_rows(start, stop)
            return
        arrays = self.kernel_arrays()
        for start in range(0, n_total, int(chunk_size)):
            n = min(int(chunk_size), n_total - start)
            seqs = np.empty((n, T), dtype=np.int64)
            w = np.empty((n, S), dtype=np.float64)
            self._fill_chunk(start, arrays, seqs, w)
            yield seqs, w

    def _fill_chunk(self, start, arrays, seqs, w) -> None:
        raise NotImplementedError

    def kernel_arrays(self):
        raise NotImplementedError

    def _no_atoms(self, what="this computation"):
        """The one-line refusal of a computation that needs the prior's atoms, for a continuous prior."""
        return ValueError(
            f"{what} needs the prior's atoms, but {self._prior!r} is continuous (a fresh pi per sequence): "
            "use a computation that reads the task's weight table (the exact engines, the references, "
            "task.enumerate) or a finite stand-in (popgrad.dirichlet_prior(S, alpha, n_atoms, seed))")

    # ----------------------------------------------------------- the weight table (DESIGN §20)
    def _table_rows(self, start, stop):
        """``(w (n, S), WeightAccuracy)`` for sequences ``start … stop-1``, computed (never cached)."""
        S, T = self.S, self.T
        if self.continuous:
            return self._continuous_rows(decode_sequences(start, stop, S, T))
        seqs = np.empty((stop - start, T), dtype=np.int64)
        w = np.empty((stop - start, S), dtype=np.float64)
        self._fill_chunk(start, self.kernel_arrays(), seqs, w)
        return w, WeightAccuracy(True, 0.0, "sum over the finite prior's atoms")

    def _continuous_rows(self, seqs):
        raise NotImplementedError

    @property
    def table_cached(self) -> bool:
        """Whether :meth:`weight_table` fits in :data:`TABLE_BUDGET_BYTES` (then it is computed once and kept)."""
        return self.n_sequences * (self.S + self.T) * 8 <= TABLE_BUDGET_BYTES

    def weight_table(self) -> np.ndarray:
        """``w[m, c] = w(s_m, c)`` for every sequence in enumeration order, ``(S**T, S)`` float64, read-only.

        Computed once per task and kept (when it fits in :data:`TABLE_BUDGET_BYTES`; otherwise
        ``ValueError``: read it in chunks with :meth:`weight_rows`). For a continuous prior the weights come
        from the sufficient statistics (DESIGN §20; :attr:`weight_accuracy` says how exact they are); for a
        finite prior they are the per-atom sums of DESIGN §2.
        """
        self.check_size()
        if self._table is None:
            if not self.table_cached:
                raise ValueError(
                    f"the weight table of S**T = {self.n_sequences:,} sequences needs more than "
                    f"{TABLE_BUDGET_BYTES / 2**20:.0f} MB: read it in chunks with task.weight_rows(start, stop)")
            n = self.n_sequences
            w = np.empty((n, self.S))
            acc = []
            chunk = 2**20 if self.continuous else TABLE_CHUNK  # continuous: fewer repeated statistics
            for start in range(0, n, chunk):
                stop = min(n, start + chunk)
                w[start:stop], a = self._table_rows(start, stop)
                acc.append(a)
            w.setflags(write=False)
            self._accuracy = _merge_accuracy(acc)
            self._table = w
        return self._table

    def weight_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start … stop-1`` of :meth:`weight_table` (from the kept table, or computed past the budget)."""
        if self.table_cached:
            return self.weight_table()[start:stop]
        w, a = self._table_rows(start, stop)
        self._accuracy = a if self._accuracy is None else _merge_accuracy([self._accuracy, a])
        return w

    @property
    def weight_accuracy(self) -> WeightAccuracy:
        """How exact the weights are (:class:`popgrad.task.dirichlet.WeightAccuracy`): exact to rounding for a
        finite prior and for uniform roots; a quadrature bound for stationary roots (computes the table)."""
        if self._accuracy is None:
            if not self.continuous:
                return WeightAccuracy(True, 0.0, "sum over the finite prior's atoms")
            if self._prior.roots == "uniform":
                return WeightAccuracy(True, 0.0, "Dirichlet-multinomial closed form")
            if self.table_cached:
                self.weight_table()
            else:
                for start in range(0, self.n_sequences, TABLE_CHUNK):
                    self.weight_rows(start, min(self.n_sequences, start + TABLE_CHUNK))
        return self._accuracy

    def _weights_summary(self) -> str:
        if not self.continuous:
            return ""
        if not self.enumerable:
            return "\n  weights: not computed (S**T beyond the enumeration limit)"
        return "\n  " + self.weight_accuracy.summary()

    def all_sequences(self):
        """``(seqs, w)`` for every sequence in one pair of arrays (small tasks)."""
        return next(iter(self.enumerate(chunk_size=max(1, self.n_sequences))))

    def __repr__(self):
        return f"{type(self).__name__}(graph={self._graph!r}, prior={self._prior!r})"


class Task(ExactTask):
    """A causal-structure task: a :class:`CausalGraph` and a :class:`FinitePrior`.

    Parameters
    ----------
    graph : CausalGraph
    prior : FinitePrior
    max_sequences : int, optional
        Largest ``S**T`` that :meth:`enumerate` (and every exact computation)
        accepts. Default :data:`DEFAULT_MAX_SEQUENCES`. Constructing a task
        never enumerates, so large ``T`` is fine for polynomial-cost
        quantities (the idealized gradient).
    """

    __slots__ = ()
    _size_guard_hint = (
        ", or use the idealized gradient (popgrad.idealized_gradient), whose cost is polynomial in T"
    )

    def __init__(self, graph: CausalGraph, prior: FinitePrior, max_sequences: int = DEFAULT_MAX_SEQUENCES):
        if not isinstance(graph, CausalGraph):
            raise ValueError(f"graph must be a popgrad.CausalGraph, got {type(graph).__name__}")
        if not isinstance(prior, (FinitePrior, DirichletPrior)):
            raise ValueError(f"prior must be a popgrad.FinitePrior or popgrad.DirichletPrior, got {type(prior).__name__}")
        self._init_common(graph, prior, max_sequences)

    def _continuous_rows(self, seqs):
        return _dirichlet.weight_table_single(self._prior, self._graph.parents, seqs)

    def kernel_arrays(self):
        """Contiguous arrays the numba kernels take.

        Returns
        -------
        parents : int64 (T,)
        mu : float64 (K, S)
            Stationary distribution of every atom.
        atoms : float64 (K, S, S)
        prior_w : float64 (K,)
        """
        if self.continuous:
            raise self._no_atoms("kernel_arrays (the per-atom weights)")
        atoms, weights = self._prior.expand()  # the enumeration needs every atom
        return (
            np.ascontiguousarray(self._graph.parents, dtype=np.int64),
            np.ascontiguousarray(self._prior.stationary, dtype=np.float64),
            np.ascontiguousarray(atoms, dtype=np.float64),
            np.ascontiguousarray(weights, dtype=np.float64),
        )

    def _fill_chunk(self, start, arrays, seqs, w) -> None:
        _weights.chunk_weights(start, *arrays, seqs, w)

    # -------------------------------------------------------------- sampling
    def sample(self, n: int, seed) -> Sample:
        """Draw ``n`` sequences and their soft labels from the generative process.

        An atom ``k`` is drawn with probability ``weights[k]``; positions are
        filled in increasing order (parents come first): non-query roots from
        ``μ_k``, non-roots from ``π_k(· | s_{p(i)})``, the query uniformly.
        Deterministic given ``seed``.
        """
        n = as_int(n, "n", minimum=1)
        rng = as_rng(seed, "seed")
        prior = self._prior
        S, T = self.S, self.T
        parents = self._graph.parents
        if self.continuous:
            return self._sample_continuous(n, rng)
        if prior.implicit_closure and prior.K > MAX_CLOSURE_ATOMS:
            return self._sample_relabeled(n, rng)
        atoms, weights = prior.expand()
        k = rng.choice(prior.K, size=n, p=weights)
        seqs = np.empty((n, T), dtype=np.int64)
        mu_cdf = np.cumsum(prior.stationary, axis=1)
        pi_cdf = np.cumsum(atoms, axis=2)
        for i in range(T - 1):
            u = rng.random(n)[:, None]
            cdf = mu_cdf[k] if parents[i] < 0 else pi_cdf[k, seqs[:, parents[i]]]
            seqs[:, i] = np.minimum((u >= cdf).sum(axis=1), S - 1)
        seqs[:, T - 1] = rng.integers(0, S, size=n)
        targets = atoms[k, seqs[:, T - 1]]
        return Sample(seqs, targets, k.astype(np.int64))

    def _sample_continuous(self, n, rng) -> Sample:
        """:meth:`sample` for a :class:`popgrad.DirichletPrior`: a fresh ``π`` per sequence (rows
        ``Dirichlet(α1)``), non-query roots from ``μ_π`` (GTH) or uniform, the query uniform, the soft label
        ``π(· | s_{T-1})``. ``atoms`` is ``-1`` (no atom)."""
        S, T = self.S, self.T
        parents = self._graph.parents
        pis = self._prior.draw(n, rng)
        rows = np.arange(n)
        if self._prior.roots == "stationary":
            mu_cdf = np.cumsum(_dirichlet._gth_batch(pis), axis=1)
        else:
            mu_cdf = np.broadcast_to(np.arange(1, S + 1) / S, (n, S))
        seqs = np.empty((n, T), dtype=np.int64)
        # position i's uniforms are row i of one draw (the stream of T-1 draws of n); the tokens by a numba loop
        # over the rows' cumulative sums, the same numbers as the NumPy loop over np.cumsum(pis, axis=2)
        from ._dirichlet_kernels import sample_tokens

        u = rng.random((T - 1, n))
        sample_tokens(pis, np.ascontiguousarray(mu_cdf), np.asarray(parents, dtype=np.int64), u, seqs)
        seqs[:, T - 1] = rng.integers(0, S, size=n)
        return Sample(seqs, pis[rows, seqs[:, T - 1]], np.full(n, -1, dtype=np.int64))

    def _sample_relabeled(self, n, rng) -> Sample:
        """:meth:`sample` for an implicit relabeling closure too large to list (``K_base · S!`` atoms).

        A draw picks a base atom ``b`` (base weights) and a uniform relabeling
        ``σ``: the atom ``π^σ`` (``π^σ(σy | σx) = π_b(y | x)``, ``μ^σ(σx) = μ_b(x)``).
        The sequence is drawn from ``π_b`` and its tokens are mapped through ``σ``
        (the image of the ``π_b`` process under ``σ`` is the ``π^σ`` process; the
        query stays uniform); the label is ``π^σ(c | q) = π_b(σ⁻¹c | σ⁻¹q)``.
        ``atoms`` holds ``b · S! + rank(σ)``, the atom's index in the order of
        :func:`popgrad.relabel_closure`.
        """
        base = self._prior.base
        S, T = self.S, self.T
        parents = self._graph.parents
        b = rng.choice(base.K, size=n, p=base.weights)
        sigma = rng.permuted(np.tile(np.arange(S), (n, 1)), axis=1)
        inv = np.argsort(sigma, axis=1)
        raw = np.empty((n, T), dtype=np.int64)
        mu_cdf = np.cumsum(base.stationary, axis=1)
        pi_cdf = np.cumsum(base.atoms, axis=2)
        for i in range(T - 1):
            u = rng.random(n)[:, None]
            cdf = mu_cdf[b] if parents[i] < 0 else pi_cdf[b, raw[:, parents[i]]]
            raw[:, i] = np.minimum((u >= cdf).sum(axis=1), S - 1)
        q = rng.integers(0, S, size=n)
        raw[:, T - 1] = np.take_along_axis(inv, q[:, None], axis=1)[:, 0]  # σ⁻¹q: the query stays uniform
        seqs = np.take_along_axis(sigma, raw, axis=1)
        targets = np.take_along_axis(base.atoms[b, raw[:, T - 1]], inv, axis=1)
        return Sample(seqs, targets, b.astype(np.int64) * math.factorial(S) + _perm_rank(sigma))

    # --------------------------------------------------------------- summary
    def summary(self) -> str:
        """Human-readable description: graph, prior diagnostics, sizes."""
        return (
            f"Task S={self.S} T={self.T} sequences S**T={count_text(self.n_sequences)} "
            f"(limit {self._max_sequences:,})\n{self._graph.summary()}\n{self._prior.summary()}"
            + self._weights_summary()
        )


def _perm_rank(perms) -> np.ndarray:
    """Lexicographic rank of each row of ``perms`` (``(n, S)`` permutations) among all ``S!`` (Lehmer code)."""
    perms = np.asarray(perms)
    n, S = perms.shape
    rank = np.zeros(n, dtype=np.int64)
    for i in range(S):
        smaller_after = (perms[:, i + 1:] < perms[:, i:i + 1]).sum(axis=1)
        rank += smaller_after * math.factorial(S - 1 - i)
    return rank


def decode_sequences(start: int, stop: int, S: int, T: int) -> np.ndarray:
    """Sequences number ``start .. stop-1`` of the enumeration order, shape ``(stop-start, T)``, int64.

    The NumPy form of the one decoder (:func:`popgrad.task._weights.decode_sequence`):
    sequence ``m`` is the base-``S`` numeral ``s_0 … s_{T-1}``, position 0 most significant.
    """
    powers = S ** np.arange(T - 1, -1, -1, dtype=np.int64)
    return (np.arange(start, stop, dtype=np.int64)[:, None] // powers) % S


def sequence_weights_numpy(seqs, parents, mu, atoms, prior_w) -> np.ndarray:
    """NumPy reference for the exact weights ``w(s, c)`` of given sequences.

    Parameters
    ----------
    seqs : int array (n, T)
    parents : int array (T,)
    mu : float64 (K, S)
    atoms : float64 (K, S, S)
    prior_w : float64 (K,)

    Returns
    -------
    w : float64 (n, S)
    """
    seqs = np.asarray(seqs)
    K, S, _ = atoms.shape
    n, T = seqs.shape
    p = np.tile((prior_w / S)[:, None], (1, n))  # (K, n)
    for i in range(T - 1):
        par = parents[i]
        if par < 0:
            p = p * mu[:, seqs[:, i]]
        else:
            p = p * atoms[:, seqs[:, par], seqs[:, i]]
    return np.einsum("kn,knc->nc", p, atoms[:, seqs[:, T - 1], :])


# ===================================================== k-parent task (DESIGN §9)
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
        if isinstance(prior, DirichletPrior):
            if prior.roots != "uniform":
                raise ValueError("a MultiParentTask draws roots uniformly (InContextDAG): use "
                                 "DirichletPrior(S, alpha, roots='uniform') or DirichletTensorPrior(S, k, alpha)")
            prior = DirichletTensorPrior(prior.S, 1, prior.alpha)
        if not isinstance(prior, (TensorPrior, DirichletTensorPrior)):
            raise ValueError(f"prior must be a popgrad.TensorPrior or popgrad.DirichletTensorPrior, "
                             f"got {type(prior).__name__}")
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
        if self.continuous:
            raise self._no_atoms("kernel_arrays (the per-atom weights)")
        n_roots = len(self._graph.roots)
        return (
            np.ascontiguousarray(self._graph.parents, dtype=np.int64),
            np.ascontiguousarray(self._graph.target_parents, dtype=np.int64),
            np.ascontiguousarray(self._prior.atoms, dtype=np.float64),
            np.ascontiguousarray(self._prior.weights * float(self.S) ** -n_roots, dtype=np.float64),
        )

    def _continuous_rows(self, seqs):
        return _dirichlet.weight_table_multi(self._prior, self._graph.parents, self._graph.target_parents, seqs)

    def _fill_chunk(self, start, arrays, seqs, w) -> None:
        parents, tp, atoms, pk0 = arrays
        _weights.chunk_weights_multi(start, parents, tp, atoms, atoms, pk0, seqs, w)

    # ------------------------------------------------------------- sampling
    def sample(self, n: int, seed) -> Sample:
        """Draw ``n`` sequences and their soft labels from the process (deterministic given ``seed``).

        Returns a :class:`popgrad.Sample` with ``targets[m] = π(· | s_tp)``.
        """
        n = as_int(n, "n", minimum=1)
        rng = as_rng(seed, "seed")
        prior, S, T = self._prior, self.S, self.T
        parents = self._graph.parents
        if self.continuous:  # a fresh π per sequence
            tabs = prior.draw(n, rng)
            m = np.arange(n)
            cdf = np.cumsum(tabs, axis=2)
        else:
            tabs = prior.atoms
            m = rng.choice(prior.K, size=n, p=prior.weights)
            cdf = np.cumsum(prior.atoms, axis=2)
        seqs = np.empty((n, T), dtype=np.int64)
        for i in range(T):
            u = rng.random(n)[:, None]
            if parents[i, 0] < 0:
                seqs[:, i] = np.minimum((u * S).astype(np.int64)[:, 0], S - 1)
            else:
                rows = parent_rows(seqs, parents[i], S)
                seqs[:, i] = np.minimum((u >= cdf[m, rows]).sum(axis=1), S - 1)
        targets = tabs[m, parent_rows(seqs, self._graph.target_parents, S)]
        return Sample(seqs, targets, np.full(n, -1, dtype=np.int64) if self.continuous else m.astype(np.int64))

    def summary(self) -> str:
        """Graph, prior diagnostics, sizes."""
        return (
            f"MultiParentTask S={self.S} T={self.T} k={self.k} sequences S**T={count_text(self.n_sequences)} "
            f"(limit {self._max_sequences:,})\n{self._graph.summary()}\n{self._prior.summary()}"
            + self._weights_summary()
        )


def _merge_accuracy(parts) -> WeightAccuracy:
    """One :class:`WeightAccuracy` for a table computed in chunks (the worst bound)."""
    return WeightAccuracy(all(a.exact for a in parts), max((a.bound for a in parts), default=0.0),
                          parts[0].method if parts else "", any(a.statistical for a in parts))


# ------------------------------------------------------------ the task validator
_TASK_KINDS = {
    ExactTask: "popgrad.Task or popgrad.MultiParentTask (graph + prior)",
    Task: "popgrad.Task (graph + prior)",
    MultiParentTask: "popgrad.MultiParentTask (multi-parent graph + tensor prior)",
}


def check_task(task, kind=ExactTask, purpose=None):
    """``task`` if it is a ``kind`` (:class:`ExactTask`: either kind; :class:`Task`; :class:`MultiParentTask`).

    The one task validator of every public function: anything else raises
    :class:`popgrad._validation.ArgumentTypeError` (a ``TypeError``, and a
    ``ValueError`` for popgrad 0.1 callers) naming the kind wanted and the type given,
    e.g. ``"task must be a popgrad.Task (graph + prior) for the Stage-1 field, got MultiParentTask"``.

    Parameters
    ----------
    task : object
    kind : type, default ExactTask
        :class:`ExactTask`, :class:`Task` or :class:`MultiParentTask`.
    purpose : str, optional
        What needs that kind (appended to the message as ``"for <purpose>"``).
    """
    if isinstance(task, kind):
        return task
    why = f" for {purpose}" if purpose else ""
    raise ArgumentTypeError(f"task must be a {_TASK_KINDS[kind]}{why}, got {type(task).__name__}")
