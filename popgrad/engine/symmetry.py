"""Exact token-relabeling symmetry (DESIGN §10): closure test, canonical sequences, orbit sizes.

With a prior exactly closed under token relabeling and ``A2 ∈ span{I, 11ᵀ}``,
the loss and ``dA1`` are invariant and ``dA2`` is equivariant under a
relabeling ``σ`` of the tokens, because ``w(σs, σc) = w(s, c)`` and
``f_{σc}(σs) = f_c(s)``. The engines then visit only the *canonical*
sequences (first occurrences in the order ``0, 1, 2, …``: one per orbit,
``Σ_{m≤S} Stirling2(T, m)`` of them, about ``S!`` fewer) with their weights
multiplied by the orbit size ``S!/(S-m)!`` (``m`` distinct tokens), and
``dA2`` is averaged over relabelings (:func:`symmetrize_dA2`).
"""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from .._validation import as_square
from ..task import _weights
from ..task.priors import closed_under_relabeling
from ..task.tasks import Task, check_task
from ._kernels import single as _single
from .options import DEFAULT_OPTIONS

__all__ = ["symmetry_applies", "canonical_count", "canonical_sequences", "weighted_sequences", "SYMMETRY_MODES"]


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


#: Closure verdicts, ``id(prior) -> (prior, bool)``: the prior is kept alive (so its id stays
#: valid) and compared by identity; priors are immutable, so a verdict never goes stale.
_CLOSED = OrderedDict()
_CLOSED_CACHE_SIZE = 16


def symmetry_applies(task, A2) -> bool:
    """Whether the exact engine uses the relabeling-orbit reduction for ``(task, A2)`` (DESIGN §10).

    True when the prior is *exactly* closed under all ``S!`` token
    relabelings (every relabeled atom equals an atom bit for bit, with the
    same merged weight to ``1e-14`` relative) and ``A2 ∈ span{I, 11ᵀ}``
    (equal diagonal entries and equal off-diagonal entries, exactly or to
    ``SPAN_RTOL = 1e-15`` relative to ``max|A2|``). ``S ≤ MAX_SYMMETRY_S``.
    """
    check_task(task, Task, "the orbit reduction")
    A2 = as_square(A2, "A2")
    if A2.shape != (task.S, task.S):
        raise ValueError(f"A2 must have shape (S, S) = ({task.S}, {task.S}) for this task, got {A2.shape}")
    return symmetry_check(task, A2)[0]


def symmetry_check(task, A2):
    """``(applies, A2 projected onto span{I, 11ᵀ})``."""
    S = task.S
    if S > MAX_SYMMETRY_S or not exactly_closed(task.prior):
        return False, A2
    kind = _single.span_kind(A2, SPAN_RTOL)
    if kind == 1:
        return True, A2
    if kind == 2:
        eye = np.eye(S, dtype=bool)
        return True, np.where(eye, np.diagonal(A2).mean(), A2[~eye].mean())
    return False, A2


def exactly_closed(prior) -> bool:
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
    if getattr(prior, "continuous", False):  # a table, not atoms: no bit-exact closure to rely on (DESIGN §20)
        return False
    key = id(prior)
    hit = _CLOSED.get(key)
    if hit is not None and hit[0] is prior:
        return hit[1]
    if prior.implicit_closure:
        # Built by relabeling every base draw with every permutation (exact copies, equal weights,
        # stationary distributions relabeled too): closed by construction.
        closed = True
    else:
        atoms, weights = prior.expand()
        closed = closed_under_relabeling(atoms, weights, tol=0.0, weight_tol=1e-14 * float(np.max(weights)),
                                         extra=prior.stationary, extra_rtol=MU_RTOL)
    _CLOSED[key] = (prior, closed)
    while len(_CLOSED) > _CLOSED_CACHE_SIZE:
        _CLOSED.popitem(last=False)
    return closed


def symmetrize_dA2(D) -> np.ndarray:
    """Average of ``σ D σᵀ`` over all relabelings: mean diagonal on the diagonal, mean off-diagonal elsewhere.

    For ``A2 ∈ span{I, 11ᵀ}`` and a closed prior the full ``dA2`` is this
    average of the canonical-sequence sum ``D`` (DESIGN §10), and it lies
    exactly in the span (so a Stage-2 step keeps ``A2`` in it bit for bit).
    """
    S = D.shape[0]
    eye = np.eye(S, dtype=bool)
    return np.where(eye, np.trace(D) / S, D[~eye].sum() / (S * (S - 1)))


def orbit_sizes(S) -> np.ndarray:
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


def canonical_chunks(S, T, chunk):
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


def weighted_sequences(task, symmetry="auto", options=None):
    """``(seqs, w, mult)`` over the task: every sequence (``mult = None``), or with a prior exactly
    closed under relabeling and ``symmetry != "off"``, the canonical ones with ``mult`` = orbit sizes.

    For sums that are invariant under relabeling ``(s, c) → (σs, σc)``.
    """
    opts = DEFAULT_OPTIONS if options is None else options
    chunk = opts.numpy_chunk
    if symmetry not in ("auto", "off"):
        raise ValueError(f"symmetry must be 'auto' or 'off', got {symmetry!r}")
    S, T = task.S, task.T
    if symmetry == "off" or not isinstance(task, Task) or S > MAX_SYMMETRY_S or not exactly_closed(task.prior):
        for seqs, w in task.enumerate(chunk_size=chunk):
            yield seqs, w, None
        return
    parents, mu, atoms, prior_w = task.kernel_arrays()
    orbit = orbit_sizes(S)
    for seqs in canonical_chunks(S, T, chunk):
        w = np.empty((len(seqs), S))
        (_weights.rows_weights if len(seqs) >= opts.parallel_min_sequences else _weights.rows_weights_serial)(
            seqs, parents, mu, atoms, prior_w, w)
        yield seqs, w, orbit[seqs.max(axis=1) + 1]
