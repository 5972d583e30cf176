"""Exact population loss and gradients, and the exact reference losses.

Everything here is a finite sum over all ``S**T`` sequences with their exact
weights ``w(s, c)`` (DESIGN §2): no sampling. The population is exact *for
the task's finite prior*.

Loss and gradient (DESIGN §3–§4), with ``q = s_{T-1}``::

    P    = softmax_rows(MASK(A1)),  u_i = Σ_j P[i,j] A2[q, s_j],  a = softmax(u)
    f_c  = Σ_i a_i [s_i = c]
    L    = -Σ_s Σ_c w(s,c) log(f_c(s) + ε)                 ε = T_eff^(-1/2) by default
    r_c  = -w(s,c) / (f_c + ε),  r̄ = Σ_c f_c r_c,  δ_i = a_i (r_{s_i} - r̄)
    G[i,j]      = Σ_s δ_i A2[q, s_j]                       (j ≤ i; G = ∂L/∂P)
    dA2[q, b]   = Σ_s Σ_j [s_j = b] Σ_i δ_i P[i, j]
    dA1[i, :]   = P[i,:] ⊙ (G[i,:] - <P[i,:], G[i,:]>)      (softmax Jacobian, once, after the sum)

Terms with ``w(s, c) = 0`` contribute nothing (``0 · log 0 = 0``).

Engines
-------
``exact_loss_and_grad`` runs a numba kernel (:mod:`popgrad._kernels`):

* ``"prefix"`` (default): enumerates the tree of prefixes depth first (the
  query, fastest in the enumeration order, innermost) and computes what
  depends on ``s_0 … s_d`` once per prefix: the per-atom weight products
  (``p_k ← p_k · π_k(s_d | s_{p(d)})``: *incremental weights*, one multiply
  per atom per prefix, never a product over the whole sequence), the
  layer-2 exponentials as running products of a precomputed table
  ``exp(P[i,j] (A2[q,b] - max_b A2[q,b]))`` (no ``exp`` in the loop), the
  softmax normaliser and the output numerators as running sums. The last
  ``h`` positions (``S**h ≥ 64`` leaf groups) and the query are processed
  per *batch node* in loops over the leaf groups that LLVM vectorizes
  (AVX-512 on the benchmark machine): the leaf weights are one small matrix
  product ``W = Σ_k p_k Q[k, g] π_k(c | q)`` per batch node, the
  exponentials of the batched rows one multiply by a per-call table, the
  logarithm a vectorizable fdlibm ``log`` (:func:`popgrad._kernels.fast_log`,
  < 1 ulp). The backward pass is accumulated per subtree (``S²`` numbers
  per depth for the rows already fixed, per-group sums for the batched
  rows), so a sequence costs ``O(S + K)`` (``O(S)`` with cached weights)
  instead of ``O(T² + K·T)``. It needs the exponentials of the row ranges
  of ``A2`` far from underflow: used when
  ``max_q (max_b A2[q,b] - min_b A2[q,b]) ≤ A2_RANGE_LIMIT = 500``.
* ``"direct"``: one fused per-sequence loop with ``T``-vectors (``O(T²)`` per
  sequence, weights from :func:`popgrad._kernels.sequence_weight_row`) and
  the per-sequence max shift of the softmax: safe for any finite ``A2``;
  used when the range exceeds 500 (e.g. the Knowl-8 construction at large
  ``β2``).

*Weight cache*: the leaf weights ``W`` of every batch node depend on the
task only, not on ``A1, A2``; the first call on a task computes and keeps
them (when they fit in ``WEIGHT_CACHE_BYTES`` = 64 MB, e.g. S=3, T=12: 14
MB, S=4, T=10: 34 MB; at most ``WEIGHT_CACHE_TOTAL`` = 128 MB over all
tasks, least recently used dropped first), later calls read them. A
training loop calls the engine hundreds of times on the same task; the
cache changes no bit.

*Orbit reduction* (DESIGN §10, ``symmetry="auto"``): when the prior is
exactly closed under token relabeling (:func:`symmetry_applies`; atoms bit
for bit, stationary distributions to 1e-12) and ``A2 ∈ span{I, 11ᵀ}``, the
loss and ``dA1`` are invariant and ``dA2`` is equivariant under relabeling
``σ`` of the tokens, because ``w(σs, σc) = w(s, c)`` and
``f_{σc}(σs) = f_c(s)``. Both engines then visit only the *canonical*
sequences (first occurrences in the order ``0, 1, 2, …``: one per orbit,
``Σ_{m≤S} Stirling2(T, m)`` of them, about ``S!`` fewer) with their weights
multiplied by the orbit size ``S!/(S-m)!`` (``m`` distinct tokens), and
``dA2`` is averaged over relabelings: its mean diagonal on the diagonal,
its mean off-diagonal elsewhere (the average of ``σ D σᵀ``). The result
equals the full enumeration up to rounding (tests: 1e-12) and ``dA2`` lies
*exactly* in the span, so a Stage-2 step keeps ``A2`` in it bit for bit and
the reduction stays on for the whole of Algorithm 1 (Stage 1 has
``A2 = β0·I``). An ``A2`` within ``SPAN_RTOL = 1e-15`` of the span is
projected onto it.

Why a fused kernel and not BLAS (``python benchmarks/run.py``, engines
table; 2-core AMD EPYC, AVX-512, S=3, T=12, K=48 atoms, 531,441 sequences,
one exact loss and gradient, full enumeration): ``"prefix"`` ≈ 140 M
sequences/s (32 M/s with one leaf group at a time, before issue 6), the
fused per-sequence ``"direct"`` kernel ≈ 2.6 M/s, BLAS per chunk (numba
weights, then ``V Pᵀ``, ``Δᵀ V``, ``Δ P`` by NumPy/BLAS on chunks of 65,536
sequences) ≈ 1.7 M/s, the NumPy reference ≈ 0.6 M/s, a jitted JAX
``value_and_grad`` over precomputed sequences and weights ≈ 3.4 M/s (≈ 40×
slower). BLAS loses because the products are ``N×T`` by ``T×T`` with
``T ≤ 20``: too thin to amortise materialising ``Δ`` and ``V`` and the
elementwise passes over them (threaded BLAS is slower still); the fused
loop avoids that traffic, and the prefix engine removes most of the
arithmetic: about 55× over the fused per-sequence loop. With the orbit
reduction the same call takes ≈ 0.7 ms (≈ 760 M sequence-equivalents
``S**T`` per second).

Determinism: both kernels split the enumeration into a fixed set of blocks
(whole subtrees; canonical prefixes with the reduction) that depends on
``S``, ``T`` and the mode only; each block writes its own slot and the slots
are summed in block order. Results are bit-identical for any thread count
(``NUMBA_NUM_THREADS``) and between calls. Tasks below
``PARALLEL_MIN_SEQUENCES`` (visited sequences) run the same blocks on the
calling thread (waking the thread pool costs more than it saves there).
With the reduction, blocks differ in size: they run in an order that
balances numba's contiguous per-thread chunks (heaviest and lightest
alternate), which never changes a bit.

Monte-Carlo comparison: :func:`sampled_loss_and_grad` is the same model
summed over ``task.sample(n, seed)`` with soft labels (unbiased).

Reference losses (DESIGN §7)
----------------------------
* :func:`optimal_loss` ``L* = -E_π[(1/S) Σ_{a,b} π(b|a) log π(b|a)]`` (knows π);
* :func:`bayes_loss` ``H(y | s) = -Σ_s Σ_c w log(w / Σ_c' w)``;
* :func:`count_estimator_loss`: the in-context transition-count estimator of
  "Knowl 8", and :func:`construction_loss`: the model's exact loss at
  ``A1 = β1·adjacency``, ``A2 = β2·I``.

``L* ≤ L_Bayes ≤ L(A1, A2)`` when ``ε = 0``.
"""
from __future__ import annotations

import itertools
import math
import os
import sys
import warnings
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from . import _kernels
from .model import _check_square, first_layer_attention, softmax
from .task import Task, sequence_weights_numpy

__all__ = [
    "LossAndGrad",
    "exact_loss_and_grad",
    "exact_loss",
    "exact_loss_and_grad_numpy",
    "sampled_loss_and_grad",
    "symmetry_applies",
    "canonical_count",
    "canonical_sequences",
    "optimal_loss",
    "bayes_loss",
    "count_estimator_loss",
    "count_estimator_predict",
    "construction_loss",
]

#: The prefix engine is used while every row of ``A2`` spans at most this
#: range: its exponentials stay ``≥ exp(-500) ≈ 7e-218`` (far from
#: underflow) and its backward intermediates ``(r_c - r̄)/Z`` stay
#: ``≤ 2·exp(500)`` when ``ε = 0`` (``≤ 2·exp(500)/ε`` otherwise).
A2_RANGE_LIMIT = 500.0
#: Smallest number of sequences per block of the prefix engine (blocks are
#: whole subtrees, so they hold ``S**m`` sequences for some ``m``).
PREFIX_BLOCK_SEQUENCES = 4096
#: Leaf groups (prefixes ``s_0 … s_{T-2}``) whose weights the prefix engine
#: computes in one batch (a power of ``S`` at least this large, if the block allows).
PREFIX_BATCH_GROUPS = 64
#: Largest factor table ``Q`` of the prefix engine, in float64 entries (2 MB).
PREFIX_TABLE_MAX = 2**18
#: Smaller tasks run on the calling thread: waking the thread pool costs
#: more than it saves (and a scheduler tick when other processes compete).
PARALLEL_MIN_SEQUENCES = 2**15
#: The prefix engine keeps the leaf weights of every batch node (they depend on the task only,
#: not on ``A1, A2``) when they fit in this many bytes: later calls read them instead of
#: recomputing ``K·S²`` products per leaf group (the first call computes and stores them).
WEIGHT_CACHE_BYTES = 2**26
#: Total bytes of leaf weights kept over all tasks; the least recently used tasks' weights go first.
WEIGHT_CACHE_TOTAL = 2**27
#: Smallest number of sequences per block of the direct engine.
DIRECT_BLOCK_SEQUENCES = 4096
#: Largest number of blocks (one ``T×T`` slot each) of either engine.
MAX_BLOCKS = 1024
#: Sequences per chunk of the NumPy reference and the reference losses.
NUMPY_CHUNK = 2**14
#: Values of the ``symmetry`` argument: ``"auto"`` uses the orbit reduction when it is exact,
#: ``"off"`` never, ``"on"`` requires it (``ValueError`` otherwise).
SYMMETRY_MODES = ("auto", "on", "off")
#: ``A2`` counts as in ``span{I, 11ᵀ}`` when its diagonal entries, and its off-diagonal
#: entries, agree to this relative tolerance (it is then projected onto the span).
SPAN_RTOL = 1e-15
#: Relative tolerance on the stationary distributions of relabeled atoms (see ``_exactly_closed``).
MU_RTOL = 1e-12
#: Largest alphabet for the orbit reduction (``S!`` relabelings are checked once per prior).
MAX_SYMMETRY_S = 8
#: With the orbit reduction, the prefix engine fixes more leading positions until there are
#: at least this many blocks (canonical prefixes), for load balance across threads.
SYM_MIN_BLOCKS = 32


class LossAndGrad(NamedTuple):
    """Exact population loss and its gradients (immutable).

    Attributes
    ----------
    loss : float
        ``L = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)``; ``inf`` when ``ε = 0`` and a
        token with positive weight gets zero predicted mass.
    dA1 : ndarray of float64, shape (T, T)
        ``∂L/∂A1``; zero above the diagonal, every row sums to 0.
    dA2 : ndarray of float64, shape (S, S)
        ``∂L/∂A2``; every row sums to 0.
    """

    loss: float
    dA1: np.ndarray
    dA2: np.ndarray


# ================================================================ public API
def exact_loss_and_grad(task, A1, A2, eps=None, symmetry="auto") -> LossAndGrad:
    """Exact population loss and gradients of the reduced model (DESIGN §3–§4).

    Parameters
    ----------
    task : Task
        Graph and finite prior; ``S**T`` must pass ``task.check_size()``.
    A1 : array_like, shape (T, T)
        First-layer scores; only the lower triangle (diagonal included) is
        used. Finite.
    A2 : array_like, shape (S, S)
        Second-layer scores. Finite.
    eps : float, optional
        Loss perturbation ``ε ≥ 0``; default ``task.default_eps``
        (``T_eff ** -0.5``). With ``ε = 0`` a token with zero predicted mass
        and positive weight makes the loss ``inf`` (a ``RuntimeWarning`` is
        issued and ``dA1``, ``dA2`` are NaN: the gradient is undefined).
    symmetry : {"auto", "off", "on"}, default "auto"
        Exact relabeling-orbit reduction (DESIGN §10): when the prior is
        exactly closed under token relabeling and ``A2 ∈ span{I, 11ᵀ}``
        (:func:`symmetry_applies`), only one canonical sequence per orbit is
        enumerated (about ``S!`` fewer), weighted by its orbit size, and
        ``dA2`` is symmetrized back; the result equals the full enumeration
        up to rounding (and ``dA2`` lies exactly in the span). ``"auto"``
        uses it when it applies, ``"off"`` never, ``"on"`` raises
        ``ValueError`` when it does not apply.

    Returns
    -------
    LossAndGrad
        ``loss`` (float), ``dA1`` (T×T, zero above the diagonal), ``dA2`` (S×S).

    Raises
    ------
    ValueError
        On a wrong shape, a non-finite entry or an invalid ``eps``.
    TaskTooLargeError
        If ``S**T`` exceeds ``task.max_sequences`` (raised before any work).
    """
    A1, A2, eps = _validate(task, A1, A2, eps)
    return _exact(task, A1, A2, eps, want_grad=True, symmetry=symmetry)


def exact_loss(task, A1, A2, eps=None, symmetry="auto") -> float:
    """Exact population loss only (forward pass; cheaper than :func:`exact_loss_and_grad`).

    Same parameters, conventions and errors as :func:`exact_loss_and_grad`.

    Returns
    -------
    float
        ``L = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)``.
    """
    A1, A2, eps = _validate(task, A1, A2, eps)
    return _exact(task, A1, A2, eps, want_grad=False, symmetry=symmetry).loss


def exact_loss_and_grad_numpy(task, A1, A2, eps=None, symmetry="off") -> LossAndGrad:
    """Plain-NumPy reference of :func:`exact_loss_and_grad` (same result, slower).

    Enumerates sequences in chunks of :data:`NUMPY_CHUNK` with weights from
    :func:`popgrad.task.sequence_weights_numpy` and implements DESIGN §3–§4
    literally with whole-chunk arrays: ``V[n, j] = A2[q_n, s_{n,j}]``,
    ``u = V Pᵀ``, ``a = softmax(u)``, ``G += Δᵀ V``, ``E = Δ P`` scattered
    into ``dA2[q, s_j]``, and the softmax Jacobian once at the end.
    Independent of the numba kernels; the tests compare the two.

    ``symmetry`` defaults to ``"off"`` (every sequence); with ``"auto"`` or
    ``"on"`` it sums over :func:`canonical_sequences` with orbit weights and
    symmetrizes ``dA2`` (the reference of the orbit reduction).
    """
    A1, A2, eps = _validate(task, A1, A2, eps)
    task.check_size()
    if symmetry not in SYMMETRY_MODES:
        raise ValueError(f"symmetry must be one of {SYMMETRY_MODES}, got {symmetry!r}")
    sym = False
    if symmetry != "off":
        sym, A2s = _symmetry_check(task, A2)
        if symmetry == "on" and not sym:
            raise ValueError("symmetry='on' needs a relabeling-closed prior and A2 in span{I, 11^T}")
        A2 = A2s if sym else A2
    P = first_layer_attention(A1)
    loss, G, dA2 = _numpy_sums(task, P, A2, eps, canonical=sym)
    return _finish(loss, G, _symmetrize_dA2(dA2) if sym else dA2, P)


def sampled_loss_and_grad(task, A1, A2, n, seed, eps=None) -> LossAndGrad:
    """Monte-Carlo estimate of :func:`exact_loss_and_grad` from ``n`` draws (soft labels).

    ``task.sample(n, seed)`` draws sequences ``s_m`` and their soft labels
    ``y_m = π_m(· | s_{m,T-1})``; the estimate is the same model loss and
    gradient summed with weights ``w(s_m, c) = y_m[c] / n``: unbiased, since
    ``E[Σ_m y_m[c] [s_m = s]] / n = w(s, c)``. This is what a training loop
    on sampled batches sees (the paper's code uses ``n = 1024``); the
    benchmark compares its error and cost with the exact sum. Uses the
    fused per-sequence kernel (:func:`popgrad._kernels.loss_grad_rows`),
    blocks of :data:`DIRECT_BLOCK_SEQUENCES` rows (thread-count independent).

    Parameters
    ----------
    task : Task
    A1, A2 : array_like
        As in :func:`exact_loss_and_grad`.
    n : int
        Number of draws.
    seed : int or numpy Generator seed
        Passed to ``task.sample``.
    eps : float, optional
        Default ``task.default_eps``.

    Returns
    -------
    LossAndGrad
        The estimates of the loss, ``dA1``, ``dA2``.
    """
    A1, A2, eps = _validate(task, A1, A2, eps)
    sample = task.sample(n, seed)
    return _rows_loss_and_grad(sample.seqs, sample.targets / n, A1, A2, eps)


def _rows_loss_and_grad(seqs, w, A1, A2, eps) -> LossAndGrad:
    """Loss and gradient summed over given sequences ``seqs (n, T)`` with weights ``w (n, S)`` (numba)."""
    T, S = A1.shape[0], A2.shape[0]
    seqs = np.ascontiguousarray(seqs, dtype=np.int64)
    w = np.ascontiguousarray(w, dtype=np.float64)
    P = np.empty((T, T))
    _kernels.attention(np.ascontiguousarray(A1, dtype=np.float64), P)
    n = len(seqs)
    n_blocks = max(1, -(-n // DIRECT_BLOCK_SEQUENCES))
    loss_s, G_s, dA2_s = _slots(n_blocks, T, S)
    _kernels.loss_grad_rows(seqs, w, P, np.ascontiguousarray(A2, dtype=np.float64), float(eps),
                            DIRECT_BLOCK_SEQUENCES, True, loss_s, G_s, dA2_s)
    loss = float(_kernels.sum_slots(loss_s, G_s, dA2_s))
    dA1 = np.empty((T, T))
    _kernels.finish_grad(G_s[0], P, dA1)
    return LossAndGrad(loss, dA1, dA2_s[0].copy())


def _rows_loss_and_grad_numpy(seqs, w, A1, A2, eps) -> LossAndGrad:
    """NumPy reference of :func:`_rows_loss_and_grad` (DESIGN §3–§4 with whole-array products)."""
    P = first_layer_attention(A1)
    loss, G, dA2 = _numpy_chunk_sums(np.asarray(seqs), np.asarray(w, dtype=float), P, np.asarray(A2, float), eps)
    return _finish(loss, np.tril(G), dA2.reshape(A2.shape), P)


def optimal_loss(task, eps=0.0) -> float:
    """``L* = -E_π[(1/S) Σ_{a,b} π(b|a) log π(b|a)]``: the loss of a predictor that knows π.

    Exact for the finite prior (a sum over atoms, ``0 log 0 = 0``); no
    enumeration.

    Parameters
    ----------
    task : Task
    eps : float, default 0
        ``0`` gives ``L*`` of DESIGN §7. ``ε > 0`` gives the perturbed loss
        ``-E_π[(1/S) Σ_{a,b} π(b|a) log(π(b|a) + ε)]`` of the same oracle
        predictor, to compare with a model loss at the same ``ε`` (it is
        then not a lower bound). ``None`` means ``task.default_eps``.

    Returns
    -------
    float
    """
    _check_task(task)
    eps = _check_eps(task, eps)
    atoms = task.prior.atoms
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(atoms > 0, atoms * np.log(np.where(atoms > 0, atoms, 1.0) + eps), 0.0)
    return float(-np.dot(task.prior.weights, plogp.sum(axis=(1, 2))) / task.S)


def bayes_loss(task, eps=0.0, symmetry="auto") -> float:
    """Bayes loss ``H(y | s) = -Σ_s Σ_c w(s,c) log(w(s,c) / Σ_c' w(s,c'))``.

    The conditional entropy of the target given the sequence under the
    finite prior: the smallest loss any predictor of ``s`` can reach
    (``ε = 0``). Terms with ``w = 0`` are 0.

    Parameters
    ----------
    task : Task
    eps : float, default 0
        ``0`` gives ``H(y | s)`` of DESIGN §7. ``ε > 0`` gives the perturbed
        loss ``-Σ w log(w/Σ_c' w + ε)`` of the same (posterior-predictive)
        predictor, to compare with a model loss at the same ``ε`` (it is
        then not a lower bound). ``None`` means ``task.default_eps``.
    symmetry : {"auto", "off"}, default "auto"
        With a prior exactly closed under relabeling the sum is invariant
        under relabeling ``(s, c) → (σs, σc)``: ``"auto"`` sums over one
        canonical sequence per orbit, times the orbit size (about ``S!``
        fewer terms; equal up to rounding).

    Returns
    -------
    float

    Raises
    ------
    TaskTooLargeError
        If ``S**T`` exceeds ``task.max_sequences``.
    """
    _check_task(task)
    eps = _check_eps(task, eps)
    task.check_size()
    total = 0.0
    for _, w, mult in _weighted_sequences(task, symmetry):
        ws = w.sum(axis=1, keepdims=True)
        pos = w > 0
        if mult is None:
            total -= float(np.sum(w[pos] * np.log((w / np.where(ws > 0, ws, 1.0))[pos] + eps)))
        else:
            terms = np.where(pos, w * np.log(np.where(pos, w / np.where(ws > 0, ws, 1.0), 1.0) + eps), 0.0)
            total -= float(terms.sum(axis=1) @ mult)
    return total


def count_estimator_predict(graph, seqs, S, model_limit=False) -> np.ndarray:
    """The in-context transition-count estimator of "Knowl 8" for given sequences.

    With ``q = s_{T-1}`` and the graph's edges ``j → i`` (``j = p(i)``)::

        f_c = #{edges j→i : s_j = q, s_i = c} / #{edges j→i : s_j = q}

    When no edge starts at a ``q`` (zero denominator) the estimator is
    replaced by the limit of the model itself (below), so that ``f`` is
    always a distribution.

    **The model limit** (``model_limit=True`` for every sequence): the
    reduced model at ``A1 = β1·adjacency`` (root rows zero) and
    ``A2 = β2·I`` converges, as ``β1, β2 → ∞`` with ``β2·exp(-β1) → 0``, to
    uniform attention over the positions of maximal score, where a non-root
    ``i`` scores ``[s_{p(i)} = q]`` (layer 1 copies the parent) and a root
    ``i`` (its layer 1 averages ``s_0 … s_i``) scores
    ``ρ_i = #{j ≤ i : s_j = q} / (i + 1)``. When some edge matches, that set
    is the matching children *plus* every root whose whole prefix
    ``s_0 … s_i`` equals ``q`` (position 0 whenever ``s_0 = q``): an
    ``O(1/#matches)`` difference from the count estimator that the reduced
    model cannot avoid (``u_0 = A2[q, s_0]`` for every ``A1``). Otherwise the
    set is the roots of largest ``ρ_i`` (the query position is a root with
    ``ρ > 0``).

    Parameters
    ----------
    graph : CausalGraph
    seqs : int array, shape (n, T)
    S : int
        Alphabet size.
    model_limit : bool, default False
        Return the model limit for every sequence instead of the estimator.

    Returns
    -------
    f : ndarray of float64, shape (n, S)
    """
    parents = np.asarray(graph.parents)
    seqs = np.asarray(seqs, dtype=np.int64)
    n, T = seqs.shape
    q = seqs[:, T - 1]
    nr = np.flatnonzero(parents >= 0)
    roots = np.flatnonzero(parents < 0)
    match = seqs[:, parents[nr]] == q[:, None]  # (n, |nr|)
    is_q = seqs == q[:, None]
    rho = np.cumsum(is_q, axis=1)[:, roots] / (roots + 1.0)  # exact order: distinct rationals, denominators ≤ T
    score = np.zeros((n, T))
    score[:, nr] = match
    score[:, roots] = rho
    top = score == score.max(axis=1, keepdims=True)
    onehot = seqs[:, :, None] == np.arange(S)
    f_limit = np.einsum("ni,nic->nc", top.astype(np.float64), onehot) / top.sum(axis=1)[:, None]
    if model_limit:
        return f_limit
    den = match.sum(axis=1)
    num = np.einsum("ni,nic->nc", match.astype(np.float64), onehot[:, nr, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        f = num / den[:, None]
    empty = den == 0
    f[empty] = f_limit[empty]
    return f


def count_estimator_loss(task, eps=None, model_limit=False, symmetry="auto") -> float:
    """Exact loss of the in-context transition-count estimator ("Knowl 8").

    ``L = -Σ_s Σ_c w(s,c) log(f̂_c(s) + ε)`` with ``f̂`` from
    :func:`count_estimator_predict` (the estimator; on sequences where no
    edge starts at the query token, the model's ``β → ∞`` limit). The
    perturbed loss with the same ``ε`` as the model is used so the two are
    comparable: the estimator often predicts 0 for a possible token, so
    with ``ε = 0`` this loss is usually ``inf`` (RuntimeWarning).

    Parameters
    ----------
    task : Task
    eps : float, optional
        Default ``task.default_eps``.
    model_limit : bool, default False
        Score the model's ``β1, β2 → ∞`` limit on every sequence instead:
        this is the limit of :func:`construction_loss`.
    symmetry : {"auto", "off"}, default "auto"
        The estimator is equivariant under token relabeling, so with a prior
        exactly closed under relabeling ``"auto"`` sums over one canonical
        sequence per orbit times the orbit size (equal up to rounding).

    Returns
    -------
    float
    """
    _check_task(task)
    eps = _check_eps(task, eps)
    task.check_size()
    total = 0.0
    S = task.S
    for seqs, w, mult in _weighted_sequences(task, symmetry):
        f = count_estimator_predict(task.graph, seqs, S, model_limit=model_limit)
        pos = w > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            if mult is None:
                total -= float(np.sum(w[pos] * np.log(f[pos] + eps)))
            else:
                terms = np.where(pos, w * np.log(np.where(pos, f, 1.0) + eps), 0.0)
                total -= float(terms.sum(axis=1) @ mult)
    if math.isinf(total):
        _warn_inf("count_estimator_loss")
    return total


def construction_loss(task, beta1, beta2, eps=None) -> float:
    """Exact loss of the model at the "Knowl 8" construction.

    ``A1 = β1 · adjacency`` (``A1[i, p(i)] = β1``, root rows zero) and
    ``A2 = β2 · I``. As ``β1, β2 → ∞`` with ``β2·exp(-β1) → 0`` it converges
    to ``count_estimator_loss(task, eps, model_limit=True)``.

    Parameters
    ----------
    task : Task
    beta1, beta2 : float
        Finite scales.
    eps : float, optional
        Default ``task.default_eps``.

    Returns
    -------
    float
    """
    _check_task(task)
    b1 = _check_real(beta1, "beta1")
    b2 = _check_real(beta2, "beta2")
    A1 = b1 * task.graph.adjacency()
    A2 = b2 * np.eye(task.S)
    return exact_loss(task, A1, A2, eps)


# ============================================================ implementation
class _Plan(NamedTuple):
    """Everything the prefix engine needs that depends on the task (and mode) only, not on ``A1, A2``."""

    parents: np.ndarray
    fac: np.ndarray
    pk0: np.ndarray
    wtab: np.ndarray
    Q: np.ndarray
    ctx_pos: np.ndarray
    mask: np.ndarray
    dig: np.ndarray
    ofac: np.ndarray
    prefixes: np.ndarray
    order: np.ndarray
    n_groups: int  # NG: S**h padded to a multiple of _kernels.LANES
    sequences: int  # sequences the engine visits (canonical ones with symmetry)
    parallel: bool
    bstart: np.ndarray  # first batch node of each block in the weight cache
    wcache: list  # [] until the first call fills it with the (n_batch, S*S, NG) weights (if small enough)
    n_batch: int


_NO_CACHE = np.zeros((0, 0, 0))
_PLANS = OrderedDict()  # (id(task), sym, tunables) -> (task, plan); the task is kept alive so its id stays valid
_PLAN_CACHE_SIZE = 16
_CLOSED = OrderedDict()  # id(prior) -> (prior, bool)


def _exact(task, A1, A2, eps, want_grad, engine=None, symmetry="auto") -> LossAndGrad:
    """Run a numba engine on validated input.

    ``engine`` in {None, "prefix", "direct"}; ``symmetry`` in {"auto", "on", "off"}.
    Kept lean: the training loop calls it thousands of times on small tasks.
    """
    task.check_size()
    if symmetry not in SYMMETRY_MODES:
        raise ValueError(f"symmetry must be one of {SYMMETRY_MODES}, got {symmetry!r}")
    S, T = task.S, task.T
    A2 = np.ascontiguousarray(A2, dtype=np.float64)
    sym = False
    if symmetry != "off":
        sym, A2s = _symmetry_check(task, A2)
        if symmetry == "on" and not sym:
            raise ValueError(
                "symmetry='on' needs a prior closed under token relabeling (exactly) and A2 in "
                "span{I, 11^T} (equal diagonal entries, equal off-diagonal entries); use symmetry='auto'"
            )
        if sym:
            A2 = A2s
    P = np.empty((T, T))
    _kernels.attention(np.ascontiguousarray(A1, dtype=np.float64), P)
    if engine is None:
        engine = "prefix" if _kernels.row_range(A2) <= A2_RANGE_LIMIT else "direct"
    if engine == "prefix":
        plan = _prefix_plan(task, sym)
        X = np.empty((T, S, S, T))
        Xg = np.empty((S, plan.dig.shape[0] + 1, plan.n_groups))
        _kernels.exp_tables(P, A2, plan.dig, X, Xg)
        n_blocks = plan.prefixes.shape[0]
        loss_s, G_s, dA2_s = _slots(n_blocks, T, S)
        if plan.wcache:
            Wc, wmode = plan.wcache[0], 2
        elif plan.n_batch * S * S * plan.n_groups * 8 <= WEIGHT_CACHE_BYTES:
            _make_room(plan.n_batch * S * S * plan.n_groups * 8)
            Wc, wmode = np.empty((plan.n_batch, S * S, plan.n_groups)), 1
        else:
            Wc, wmode = _NO_CACHE, 0
        kernel = _kernels.loss_grad_prefix if plan.parallel else _kernels.loss_grad_prefix_serial
        kernel(plan.parents, plan.fac, plan.pk0, plan.wtab, plan.Q, plan.ctx_pos, X, Xg, plan.mask, plan.dig,
               plan.ofac, P, A2, float(eps), plan.prefixes, plan.order, sym, Wc, plan.bstart, wmode,
               bool(want_grad), loss_s, G_s, dA2_s)
        if wmode == 1:
            plan.wcache.append(Wc)
    elif engine == "direct":
        parents, mu, atoms, prior_w = task.kernel_arrays()
        n_total = S**T
        block_size = max(DIRECT_BLOCK_SEQUENCES, -(-n_total // MAX_BLOCKS))
        n_blocks = -(-n_total // block_size)
        loss_s, G_s, dA2_s = _slots(n_blocks, T, S)
        kernel = _kernels.loss_grad_direct if _parallel(n_blocks, n_total) else _kernels.loss_grad_direct_serial
        kernel(parents, mu, atoms, prior_w, P, A2, float(eps), block_size, sym, _orbit_sizes(S), bool(want_grad),
               loss_s, G_s, dA2_s)
    else:
        raise ValueError(f"engine must be 'prefix' or 'direct', got {engine!r}")
    loss = float(_kernels.sum_slots(loss_s, G_s, dA2_s))  # in block order; totals land in slot 0
    if not want_grad:
        if math.isinf(loss):
            _warn_inf("exact_loss")
        return LossAndGrad(loss, None, None)
    dA1 = np.empty((T, T))
    _kernels.finish_grad(G_s[0], P, dA1)
    if sym:
        dA2 = np.empty((S, S))
        _kernels.symmetrize_span(dA2_s[0], dA2)
    else:
        dA2 = dA2_s[0].copy()
    if math.isinf(loss):
        _warn_inf("exact_loss_and_grad")
        dA1[:] = np.nan
        dA2[:] = np.nan
    return LossAndGrad(loss, dA1, dA2)


def _make_room(nbytes):
    """Drop the cached leaf weights of the least recently used plans until ``nbytes`` more fit in the budget."""
    held = [p for _, p in _PLANS.values() if p.wcache]  # oldest first
    total = sum(p.wcache[0].nbytes for p in held)
    for p in held:
        if total + nbytes <= WEIGHT_CACHE_TOTAL:
            break
        total -= p.wcache[0].nbytes
        p.wcache.clear()


def _parallel(n_blocks, n_sequences) -> bool:
    """Use the thread pool only when there is enough work (the blocks, hence the bits, are the same)."""
    return n_blocks > 1 and n_sequences >= PARALLEL_MIN_SEQUENCES


# ------------------------------------------------------------ symmetry
def symmetry_applies(task, A2) -> bool:
    """Whether the exact engine uses the relabeling-orbit reduction for ``(task, A2)`` (DESIGN §10).

    True when the prior is *exactly* closed under all ``S!`` token
    relabelings (every relabeled atom equals an atom bit for bit, with the
    same merged weight to ``1e-14`` relative) and ``A2 ∈ span{I, 11ᵀ}``
    (equal diagonal entries and equal off-diagonal entries, exactly or to
    ``SPAN_RTOL = 1e-15`` relative to ``max|A2|``). ``S ≤ MAX_SYMMETRY_S``.
    """
    _check_task(task)
    A2 = _check_square(A2, "A2")
    if A2.shape != (task.S, task.S):
        raise ValueError(f"A2 must have shape (S, S) = ({task.S}, {task.S}) for this task, got {A2.shape}")
    return _symmetry_check(task, A2)[0]


def _symmetry_check(task, A2):
    """``(applies, A2 projected onto span{I, 11ᵀ})``."""
    S = task.S
    if S > MAX_SYMMETRY_S or not _exactly_closed(task.prior):
        return False, A2
    kind = _kernels.span_kind(A2, SPAN_RTOL)
    if kind == 1:
        return True, A2
    if kind == 2:
        eye = np.eye(S, dtype=bool)
        return True, np.where(eye, np.diagonal(A2).mean(), A2[~eye].mean())
    return False, A2


def _exactly_closed(prior) -> bool:
    """Exact closure of the weighted atom set under relabeling (cached per prior).

    The weights ``w(s, c)`` use each atom ``π_k`` *and* its stationary
    distribution ``μ_k`` (for the roots). Atoms are compared bit for bit
    (merged when identical, ``-0.0`` counts as ``0.0``): the prior is closed
    when every relabeling ``σ π σ⁻¹`` of every merged atom is a merged atom
    of the same weight (to ``1e-14`` relative) whose ``μ`` is ``μ ∘ σ⁻¹``
    entrywise to ``MU_RTOL = 1e-12`` relative (GTH is entrywise accurate,
    but not bit-equivariant). Comparing ``μ`` matters for reducible atoms,
    whose stationary distribution is not unique: for the identity matrix
    GTH returns ``μ = e_0``, which is not relabeling-equivariant. Only the
    two generators of the symmetric group are tried (the transposition
    ``(0 1)`` and the cycle ``(0 1 … S-1)``): a set invariant under both is
    invariant under every relabeling. Cost ``O(K · S²)`` with hashing (S=5,
    960 atoms: a few ms; ``prior.is_relabeling_closed()`` tries all ``S!``
    relabelings pairwise, 15 s there). This implies
    ``prior.is_relabeling_closed()`` (atoms only, to ``1e-10``).
    """
    key = id(prior)
    hit = _CLOSED.get(key)
    if hit is not None and hit[0] is prior:
        return hit[1]
    S = prior.S
    table = {}  # atom bytes -> [weight, mu]
    for a, mu, wk in zip(np.ascontiguousarray(prior.atoms) + 0.0, prior.stationary, prior.weights):
        entry = table.setdefault(a.tobytes(), [0.0, mu])
        entry[0] += float(wk)
        if np.any(np.abs(entry[1] - mu) > MU_RTOL * np.abs(mu)):
            table[a.tobytes()][1] = np.full(S, np.nan)  # identical atoms, different mu: never matches
    wmax = max(e[0] for e in table.values())
    closed = True
    generators = [np.array([1, 0] + list(range(2, S))), np.roll(np.arange(S), -1)]
    for perm in generators:
        for k, (wk, mu) in table.items():
            moved = np.empty((S, S))
            moved[np.ix_(perm, perm)] = np.frombuffer(k).reshape(S, S)
            hit2 = table.get(moved.tobytes())
            if hit2 is None or abs(hit2[0] - wk) > 1e-14 * wmax:
                closed = False
                break
            mu_moved = np.empty(S)
            mu_moved[perm] = mu
            if not np.all(np.abs(hit2[1] - mu_moved) <= MU_RTOL * np.abs(mu_moved)):
                closed = False
                break
        if not closed:
            break
    _CLOSED[key] = (prior, closed)
    while len(_CLOSED) > _PLAN_CACHE_SIZE:
        _CLOSED.popitem(last=False)
    return closed


def _symmetrize_dA2(D) -> np.ndarray:
    """Average of ``σ D σᵀ`` over all relabelings: mean diagonal on the diagonal, mean off-diagonal elsewhere.

    For ``A2 ∈ span{I, 11ᵀ}`` and a closed prior the full ``dA2`` is this
    average of the canonical-sequence sum ``D`` (DESIGN §10), and it lies
    exactly in the span (so a Stage-2 step keeps ``A2`` in it bit for bit).
    """
    S = D.shape[0]
    eye = np.eye(S, dtype=bool)
    return np.where(eye, np.trace(D) / S, D[~eye].sum() / (S * (S - 1)))


def _orbit_sizes(S) -> np.ndarray:
    """``orbit[m] = S!/(S-m)!``: relabelings of a sequence with ``m`` distinct tokens (``m = 0 … S``)."""
    return np.array([math.perm(S, m) for m in range(S + 1)], dtype=np.float64)


def canonical_count(S, n) -> int:
    """Number of canonical sequences of length ``n`` over ``[S]`` (first occurrences in order ``0, 1, …``).

    ``Σ_{m ≤ S} Stirling2(n, m)``: one per relabeling orbit; ``Σ`` over them of
    the orbit sizes ``S!/(S-m)!`` is ``S**n``.
    """
    row = [1] + [0] * S  # row[m]: sequences of the current length with m distinct tokens
    for _ in range(n):
        row = [0] + [row[m] * m + row[m - 1] for m in range(1, S + 1)]
        row[0] = 0
    return int(sum(row)) if n > 0 else 1


def canonical_sequences(S, n) -> np.ndarray:
    """All canonical sequences of length ``n`` in lexicographic order, int64 ``(count, n)``."""
    return _continuations(S, n, 0)


def _continuations(S, n, m0):
    """Canonical continuations of length ``n`` after a prefix that used tokens ``0 … m0-1``.

    Returns int64 ``(count, n)`` in lexicographic order.
    """
    seqs = np.zeros((1, 0), dtype=np.int64)
    mx = np.full(1, m0 - 1, dtype=np.int64)
    for _ in range(n):
        nxt = np.minimum(mx + 1, S - 1)
        counts = nxt + 1
        rows = np.repeat(np.arange(len(seqs)), counts)
        tok = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        seqs = np.concatenate([seqs[rows], tok[:, None]], axis=1)
        mx = np.maximum(mx[rows], tok)
    return seqs


def _canonical_chunks(S, T, chunk):
    """The canonical sequences of length ``T`` in lexicographic order, in chunks of about ``chunk`` rows."""
    r = 0
    while r < T and S ** (r + 1) <= chunk:
        r += 1
    prefixes = canonical_sequences(S, T - r)
    tails = [_continuations(S, r, m) for m in range(S + 1)]
    used = prefixes.max(axis=1) + 1 if T - r > 0 else np.zeros(len(prefixes), dtype=np.int64)
    buf, n = [], 0
    for p, m in zip(prefixes, used):
        tail = tails[int(m)]
        buf.append(np.concatenate([np.broadcast_to(p, (len(tail), T - r)), tail], axis=1))
        n += len(tail)
        if n >= chunk:
            yield np.concatenate(buf)
            buf, n = [], 0
    if buf:
        yield np.concatenate(buf)


def _weighted_sequences(task, symmetry="auto", chunk=NUMPY_CHUNK):
    """``(seqs, w, mult)`` over the task: every sequence (``mult = None``), or with a prior exactly
    closed under relabeling and ``symmetry != "off"``, the canonical ones with ``mult`` = orbit sizes.

    For sums that are invariant under relabeling ``(s, c) → (σs, σc)``.
    """
    if symmetry not in ("auto", "off"):
        raise ValueError(f"symmetry must be 'auto' or 'off', got {symmetry!r}")
    S, T = task.S, task.T
    if symmetry == "off" or S > MAX_SYMMETRY_S or not _exactly_closed(task.prior):
        for seqs, w in task.enumerate(chunk_size=chunk):
            yield seqs, w, None
        return
    parents, mu, atoms, prior_w = task.kernel_arrays()
    orbit = _orbit_sizes(S)
    for seqs in _canonical_chunks(S, T, chunk):
        w = np.empty((len(seqs), S))
        (_kernels.rows_weights if len(seqs) >= PARALLEL_MIN_SEQUENCES else _kernels.rows_weights_serial)(
            seqs, parents, mu, atoms, prior_w, w)
        yield seqs, w, orbit[seqs.max(axis=1) + 1]


# ------------------------------------------------------------ prefix engine plan
def _prefix_plan(task, sym) -> _Plan:
    key = (id(task), bool(sym), PREFIX_BLOCK_SEQUENCES, PREFIX_BATCH_GROUPS, PREFIX_TABLE_MAX, SYM_MIN_BLOCKS,
           MAX_BLOCKS, PARALLEL_MIN_SEQUENCES, WEIGHT_CACHE_BYTES)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is task:
        _PLANS.move_to_end(key)
        return hit[1]
    plan = _build_prefix_plan(task, sym)
    _PLANS[key] = (task, plan)
    while len(_PLANS) > _PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)
    return plan


def _build_prefix_plan(task, sym) -> _Plan:
    S, T = task.S, task.T
    L = T - 1
    parents, mu, atoms, prior_w = task.kernel_arrays()
    K = atoms.shape[0]
    n_fixed = _prefix_n_fixed(S, T)
    h, ctx_pos = _prefix_batch_plan(parents, S, T, n_fixed, K)
    Lh = L - h
    D = n_fixed
    if sym:
        sequences = canonical_count(S, T)
        if sequences >= PARALLEL_MIN_SEQUENCES:  # blocks for the threads; a serial run wants few blocks
            while D < Lh and canonical_count(S, D) < SYM_MIN_BLOCKS:
                D += 1
        prefixes = canonical_sequences(S, D)
    else:
        prefixes = np.array(list(itertools.product(range(S), repeat=D)), dtype=np.int64).reshape(S**D, D)
        sequences = S**T
    n_blocks = prefixes.shape[0]
    order = _balanced_order(prefixes, S, T) if sym else np.arange(n_blocks, dtype=np.int64)
    if sym:
        per_block = [_completions(S, Lh - D, int(p.max()) + 1 if D else 0) for p in prefixes]
    else:
        per_block = [S ** (Lh - D)] * n_blocks
    bstart = np.concatenate([[0], np.cumsum(per_block)[:-1]]).astype(np.int64)
    fac = np.empty((L, S, S, K))
    for d in range(L):
        fac[d] = mu.T[None, :, :] if parents[d] < 0 else atoms.transpose(1, 2, 0)
    n_valid = S**h
    NG = -(-n_valid // _kernels.LANES) * _kernels.LANES
    Qv = _batch_factor_table(parents, mu, atoms, Lh, h, ctx_pos)
    Q = np.zeros(Qv.shape[:2] + (NG,))
    Q[:, :, :n_valid] = Qv
    dig_v = ((np.arange(n_valid)[None, :] // S ** np.arange(h - 1, -1, -1)[:, None]) % S).astype(np.int64)
    dig = np.zeros((h, NG), dtype=np.int64)
    dig[:, :n_valid] = dig_v
    mask = np.zeros((h, S, NG))
    for t in range(h):
        mask[t, dig_v[t], np.arange(n_valid)] = 1.0
    ofac = _orbit_factor_table(S, dig_v, NG) if sym else np.ones((1, 1, 1))
    return _Plan(
        parents=parents, fac=fac, pk0=prior_w / S, wtab=np.ascontiguousarray(atoms.reshape(K, S * S)), Q=Q,
        ctx_pos=ctx_pos, mask=mask, dig=dig, ofac=ofac, prefixes=np.ascontiguousarray(prefixes),
        order=order, n_groups=NG, sequences=sequences, parallel=_parallel(n_blocks, sequences),
        bstart=bstart, wcache=[], n_batch=int(sum(per_block)),
    )


def _orbit_factor_table(S, dig, NG) -> np.ndarray:
    """``ofac[m, q, g]``: orbit size of prefix (``m`` distinct tokens, canonical) + group ``g`` + query ``q``, or 0.

    The whole sequence is canonical when each token of ``g`` then ``q`` is
    either already used or the next new one; its orbit size is ``S!/(S-m')!``.
    """
    h, n_valid = dig.shape
    orbit = _orbit_sizes(S)
    ofac = np.zeros((S + 1, S, NG))
    for m in range(S + 1):
        for g in range(n_valid):
            cnt, ok = m, True
            for t in range(h):
                b = int(dig[t, g])
                if b > cnt:
                    ok = False
                    break
                cnt += b == cnt
            if not ok:
                continue
            for q in range(S):
                if q <= cnt:
                    ofac[m, q, g] = orbit[cnt + (q == cnt)] if cnt + (q == cnt) <= S else 0.0
    return ofac


def _balanced_order(prefixes, S, T) -> np.ndarray:
    """A block order whose contiguous runs carry similar work (numba splits ``prange`` into contiguous chunks).

    Work of a canonical prefix = its number of canonical completions (it
    depends on its distinct-token count); blocks sorted by work are dealt
    heaviest, lightest, second heaviest, second lightest, …
    """
    n, D = prefixes.shape
    m = (prefixes.max(axis=1) + 1) if D else np.zeros(n, dtype=np.int64)
    work = np.array([_completions(S, T - D, int(mi)) for mi in m], dtype=float)
    idx = np.argsort(-work, kind="stable")
    out = np.empty(n, dtype=np.int64)
    lo, hi = 0, n - 1
    for p in range(n):
        if p % 2 == 0:
            out[p] = idx[lo]
            lo += 1
        else:
            out[p] = idx[hi]
            hi -= 1
    return out


def _completions(S, n, m) -> int:
    """Canonical continuations of length ``n`` of a canonical prefix with ``m`` distinct tokens."""
    row = {m: 1}
    for _ in range(n):
        new = {}
        for used, c in row.items():
            new[used] = new.get(used, 0) + c * used
            if used < S:
                new[used + 1] = new.get(used + 1, 0) + c
        row = new
    return sum(row.values())


def _prefix_n_fixed(S, T) -> int:
    """Leading positions fixed per block.

    Blocks are whole subtrees of ``≥ PREFIX_BLOCK_SEQUENCES`` sequences, and
    there are at most ``MAX_BLOCKS`` of them. Depends on ``S`` and ``T`` only.
    """
    L = T - 1
    inner = 0  # free non-query positions per block; a block holds S**(inner + 1) sequences
    while inner < L and (S ** (inner + 1) < PREFIX_BLOCK_SEQUENCES or S ** (L - inner) > MAX_BLOCKS):
        inner += 1
    return L - inner


def _prefix_batch_plan(parents, S, T, n_fixed, K):
    """Batched trailing positions ``h`` and the prefix positions ``ctx_pos`` they depend on.

    Aims at ``S**h ≥ PREFIX_BATCH_GROUPS`` leaf groups per batch, within the
    block's free positions and with the factor table ``Q`` at most
    ``PREFIX_TABLE_MAX`` entries.
    """
    L = T - 1
    h = 0
    while h < L - n_fixed and S**h < PREFIX_BATCH_GROUPS:
        h += 1
    while True:
        Lh = L - h
        ctx_pos = np.array(sorted({int(p) for p in parents[Lh:L] if 0 <= p < Lh}), dtype=np.int64)
        if h == 0 or S ** (len(ctx_pos) + h) * K <= PREFIX_TABLE_MAX:
            return h, ctx_pos
        h -= 1


def _batch_factor_table(parents, mu, atoms, Lh, h, ctx_pos):
    """``Q[ctx, k, g] = Π_{t<h} fac[Lh+t, a_t, g_t, k]`` (see :func:`popgrad._kernels.loss_grad_prefix`)."""
    K, S, _ = atoms.shape
    n_groups, n_ctx = S**h, S ** len(ctx_pos)
    g_dig = (np.arange(n_groups)[:, None] // S ** np.arange(h - 1, -1, -1)) % S  # (G, h)
    c_dig = (np.arange(n_ctx)[:, None] // S ** np.arange(len(ctx_pos) - 1, -1, -1)) % S  # (C, n_ctx)
    where = {int(p): m for m, p in enumerate(ctx_pos)}
    Q = np.ones((n_ctx, n_groups, K))
    for t in range(h):
        pos = Lh + t
        par = int(parents[pos])
        b = g_dig[:, t]
        if par < 0:
            Q *= mu[:, b].T[None, :, :]
        elif par >= Lh:
            Q *= atoms[:, g_dig[:, par - Lh], b].T[None, :, :]
        else:
            a = c_dig[:, where[par]]
            Q *= atoms[:, a[:, None], b[None, :]].transpose(1, 2, 0)
    return np.ascontiguousarray(Q.transpose(0, 2, 1))


def _slots(n_blocks, T, S):
    return np.zeros(n_blocks), np.zeros((n_blocks, T, T)), np.zeros((n_blocks, S, S))


def _finish(loss, G, dA2, P) -> LossAndGrad:
    """Apply the layer-1 softmax Jacobian once: ``dA1[i] = P[i] ⊙ (G[i] - <P[i], G[i]>)``."""
    G = np.tril(G)
    dA1 = P * (G - np.sum(P * G, axis=1, keepdims=True))
    dA1 = np.tril(dA1)
    if math.isinf(loss):
        _warn_inf("exact_loss_and_grad")
        dA1 = np.full_like(dA1, np.nan)
        dA2 = np.full_like(dA2, np.nan)
    return LossAndGrad(float(loss), dA1, dA2)


def _numpy_chunks(task, chunk=NUMPY_CHUNK, canonical=False):
    """``(seqs, w)`` chunks for the NumPy reference: every sequence, or the canonical ones with orbit weights."""
    S, T = task.S, task.T
    parents, mu, atoms, prior_w = task.kernel_arrays()
    if canonical:
        orbit = _orbit_sizes(S)
        for seqs in _canonical_chunks(S, T, chunk):
            w = sequence_weights_numpy(seqs, parents, mu, atoms, prior_w)
            yield seqs, w * orbit[seqs.max(axis=1) + 1][:, None]
        return
    powers = S ** np.arange(T - 1, -1, -1, dtype=np.int64)
    for c0 in range(0, task.n_sequences, chunk):
        idx = np.arange(c0, min(c0 + chunk, task.n_sequences), dtype=np.int64)
        seqs = (idx[:, None] // powers) % S
        yield seqs, sequence_weights_numpy(seqs, parents, mu, atoms, prior_w)


def _numpy_sums(task, P, A2, eps, start=0, stop=None, chunk=NUMPY_CHUNK, canonical=False):
    """NumPy reference partial sums over sequence numbers ``start … stop-1`` (all of them by default).

    With ``canonical`` the sum runs over the canonical sequences with orbit
    weights instead (``start``/``stop`` ignored). Returns ``(loss, G, dA2)``
    with ``G = ∂L/∂P`` restricted to those sequences.
    """
    S, T = task.S, task.T
    parents, mu, atoms, prior_w = task.kernel_arrays()
    loss = 0.0
    G = np.zeros((T, T))
    dA2 = np.zeros(S * S)
    if canonical:
        chunks = _numpy_chunks(task, chunk, canonical=True)
    else:
        stop = task.n_sequences if stop is None else stop
        powers = S ** np.arange(T - 1, -1, -1, dtype=np.int64)
        chunks = (
            (seqs, sequence_weights_numpy(seqs, parents, mu, atoms, prior_w))
            for seqs in (
                (np.arange(c0, min(c0 + chunk, stop), dtype=np.int64)[:, None] // powers) % S
                for c0 in range(start, stop, chunk)
            )
        )
    for seqs, w in chunks:
        l_c, G_c, dA2_c = _numpy_chunk_sums(seqs, w, P, A2, eps)
        loss += l_c
        G += G_c
        dA2 += dA2_c
    return loss, np.tril(G), dA2.reshape(S, S)


def _numpy_chunk_sums(seqs, w, P, A2, eps):
    """One chunk of the NumPy reference: ``(loss, G (T, T), dA2 (S*S,))`` summed over its sequences."""
    T, S = P.shape[0], A2.shape[0]
    q = seqs[:, T - 1]
    V = A2[q[:, None], seqs]  # (n, T)
    a = softmax(V @ P.T, axis=1)  # (n, T)
    f = np.empty((len(seqs), S))
    for c in range(S):
        f[:, c] = np.sum(a * (seqs == c), axis=1)
    pos = w > 0
    fe = f + eps
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = -float(np.sum(w[pos] * np.log(fe[pos])))
        r = np.where(pos, -w / np.where(pos, fe, 1.0), 0.0)
        rbar = np.sum(f * r, axis=1)
        delta = a * (np.take_along_axis(r, seqs, axis=1) - rbar[:, None])  # (n, T)
    G = delta.T @ V
    E = delta @ P  # E[n, j] = Σ_i δ_i P[i, j]
    dA2 = np.bincount((q[:, None] * S + seqs).ravel(), weights=E.ravel(), minlength=S * S)
    return loss, G, dA2


# ---------------------------------------------------------------- validation
def _check_task(task):
    if not isinstance(task, Task):
        raise ValueError(f"task must be a popgrad.Task (graph + prior), got {type(task).__name__}")


def _check_real(x, name) -> float:
    if isinstance(x, bool):
        raise ValueError(f"{name} must be a finite real number, got {x!r}")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite real number, got {x!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def _check_eps(task, eps) -> float:
    if eps is None:
        return float(task.default_eps)
    if isinstance(eps, bool):
        raise ValueError(f"eps must be a finite number >= 0 (or None for T_eff**-0.5), got {eps!r}")
    try:
        v = float(eps)
    except (TypeError, ValueError):
        raise ValueError(f"eps must be a finite number >= 0 (or None for T_eff**-0.5), got {eps!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"eps must be a finite number >= 0 (or None for T_eff**-0.5), got {v}")
    return v


def _validate(task, A1, A2, eps):
    _check_task(task)
    A1 = _square_fast(A1, "A1")
    A2 = _square_fast(A2, "A2")
    T, S = task.T, task.S
    if A1.shape != (T, T):
        raise ValueError(f"A1 must have shape (T, T) = ({T}, {T}) for this task, got {A1.shape}")
    if A2.shape != (S, S):
        raise ValueError(f"A2 must have shape (S, S) = ({S}, {S}) for this task, got {A2.shape}")
    return A1, A2, _check_eps(task, eps)


def _square_fast(M, name):
    """:func:`popgrad.model._check_square` with a fast path for finite float64 square arrays (the training loop)."""
    if type(M) is np.ndarray and M.dtype == np.float64 and M.ndim == 2 and M.shape[0] == M.shape[1] \
            and _kernels.all_finite(M):
        return M
    return _check_square(M, name)  # converts, or raises with the message that names the entry


def _warn_inf(where):
    """RuntimeWarning for an infinite loss, attributed to the first caller outside popgrad."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(pkg):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"{where}: the loss is infinite: with eps = 0 some token has zero predicted mass but positive "
        "weight (use eps > 0, e.g. eps=None for T_eff**-0.5); gradients are undefined (NaN)",
        RuntimeWarning,
        stacklevel=level,
    )
