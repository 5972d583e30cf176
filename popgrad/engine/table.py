"""The weight-table path of the exact engines (DESIGN §20).

A task's weights ``w(s, c)`` depend on the task only, never on the model's
parameters. For a continuous prior (:class:`popgrad.DirichletPrior`,
:class:`popgrad.DirichletTensorPrior`) there are no atoms to carry, so the
engines read the task's table (:meth:`popgrad.Task.weight_table`, computed
once per task, ``S**T × S`` float64); for a finite prior the per-atom engines
carry ``K`` products per prefix at every call, and the table makes a call cost
independent of ``K``.

**The one rule** (:func:`use_table`): the table path when the prior is
continuous; for a finite prior, when the engine's per-call cost grows with the
number of atoms (``per_atom=True``: the k-head, full-model and gradient-noise
engines, and the reduced prefix engine, which carries ``K`` products per prefix
node even with its leaf weights cached), ``K ≥ TABLE_MIN_ATOMS``, and the task
keeps its table already (:func:`table_built`). A run of many evaluations on one
task -- every trainer, before its first step -- asks for it with
:func:`prepare_table`; a one-off call never builds it. Why: the table step
costs the same for any ``K`` (and for the continuous prior), but building a
finite prior's table costs ``O(S^T · K · T)`` atom products, more than a
per-atom step (measured, CPU, full model S = 3, T = 10: a step 0.11 s on the
table, 0.13 s per-atom at 48 atoms and 0.47 s at 3000, the build 3.3 s at
3000 atoms, repaid after about ten steps; reduced S = 3, T = 12 at 3000
atoms: 14 ms against 28 ms, the build 35 s), so a single gradient is cheaper
per atom and a training run gets the step cost of the continuous prior
(``benchmarks/bench_step_cost.py``). (The reduced engine's exact orbit
reduction, when it applies, is cheaper still and keeps its own path.) Both
paths compute the same sums (tests: 1e-13 on finite priors, trajectories
included); which one ran depends on whether the table was prepared, never on
anything else.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ..task.tasks import TABLE_BUDGET_BYTES, MultiParentTask, decode_sequences

__all__ = ["use_table", "prepare_table", "table_built", "table_rows", "TABLE_MIN_ATOMS", "second_moment_rows",
           "second_moment_table"]

#: Fewest atoms for which a per-atom engine reads a prepared table instead (calibrated by
#: benchmarks/bench_step_cost.py: below it the per-atom step costs about what the table step costs).
TABLE_MIN_ATOMS = 16

_SEQS = OrderedDict()  # (S, T) -> all sequences (int64, read-only): they do not depend on the task
_Y2 = OrderedDict()  # task.fingerprint -> the second-moment table (read-only), kept for 2 tasks
_LOCK = threading.Lock()


def use_table(task, per_atom: bool) -> bool:
    """The one rule: read the weight table (True) or carry the per-atom products (False). See the module doc."""
    if task.continuous:
        return True
    return bool(per_atom and task.prior.K >= TABLE_MIN_ATOMS and table_built(task))


def clear_tables() -> None:
    """Forget the kept sequence arrays and second-moment tables (the tasks keep their own weight tables)."""
    with _LOCK:
        _SEQS.clear()
        _Y2.clear()


def table_built(task) -> bool:
    """Whether the task keeps its weight table already (built by :meth:`popgrad.Task.weight_table`; never builds)."""
    return getattr(task, "_table", None) is not None


def prepare_table(task) -> bool:
    """Before a run of many exact evaluations on one task (a trainer's first step): build the task's weight
    table once when the one rule reads it -- a continuous prior whose table fits the budget, or a finite prior
    with ``K ≥ TABLE_MIN_ATOMS`` whose table fits. Returns :func:`use_table` ``(task, per_atom=True)`` after it.

    Costs one pass over the sequences and atoms (DESIGN §20: about ten full-model steps' savings at 3000 atoms); a
    no-op for a task that cannot be enumerated (the size guard is the engines' to raise).
    """
    if task.enumerable and task.table_cached and (task.continuous or task.prior.K >= TABLE_MIN_ATOMS):
        task.weight_table()
    return use_table(task, per_atom=True)


def _remember(cache, key, value, keep: int = 2) -> None:
    """Keep ``value`` under ``key`` in a least-recently-added ``cache`` of at most ``keep`` entries."""
    with _LOCK:
        cache[key] = value
        while len(cache) > keep:
            cache.popitem(last=False)


def all_sequences(S: int, T: int) -> np.ndarray:
    """Every sequence of ``[S]^T`` in enumeration order, ``(S**T, T)`` int64, read-only (kept for 2 sizes)."""
    key = (S, T)
    seqs = _SEQS.get(key)
    if seqs is None:
        seqs = decode_sequences(0, S**T, S, T)
        seqs.setflags(write=False)
        _remember(_SEQS, key, seqs)
    return seqs


def table_rows(task, start: int, stop: int):
    """``(seqs, w)`` of sequences ``start … stop-1``: the kept sequences and table when they fit, else computed."""
    if task.table_cached:
        return all_sequences(task.S, task.T)[start:stop], task.weight_table()[start:stop]
    return decode_sequences(start, stop, task.S, task.T), task.weight_rows(start, stop)


def table_blocks(task, opts):
    """``(block_size, n_blocks)`` of the table path: the direct engine's blocks (``S``, ``T``, options only)."""
    n_total = task.n_sequences
    block_size = max(opts.direct_block_sequences, -(-n_total // opts.max_blocks))
    return block_size, -(-n_total // block_size)


# ------------------------------------------------------------ the second-moment table (gradient noise)
def second_moment_fits(task) -> bool:
    """Whether the ``S**T × S × S`` second-moment table fits :data:`popgrad.task.tasks.TABLE_BUDGET_BYTES`."""
    return task.n_sequences * task.S * task.S * 8 <= TABLE_BUDGET_BYTES


def second_moment_table(task) -> np.ndarray:
    """``Y2[m, c, c'] = E[π(c|q) π(c'|q) P(s_m | π)]`` for every sequence in enumeration order (read-only).

    The gradient-noise engine's second table (:mod:`popgrad.engine.noise`, DESIGN §20): computed once per
    task (kept for the last two tasks, by fingerprint) when it fits the table budget; ValueError otherwise
    (read it in chunks with :func:`second_moment_rows`).
    """
    key = task.fingerprint
    y2 = _Y2.get(key)
    if y2 is not None:
        return y2
    if not second_moment_fits(task):
        raise ValueError(f"the second-moment table of S**T = {task.n_sequences:,} sequences needs more than "
                         f"{TABLE_BUDGET_BYTES / 2**20:.0f} MB: read it in chunks with second_moment_rows")
    task.check_size()
    n, S = task.n_sequences, task.S
    y2 = np.empty((n, S, S))
    step = 2**16
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        y2[lo:hi] = _second_moment_rows(task, lo, hi)
    y2.setflags(write=False)
    _remember(_Y2, key, y2)
    return y2


def second_moment_rows(task, start: int, stop: int) -> np.ndarray:
    """Rows ``start … stop-1`` of :func:`second_moment_table` (from the kept table, or computed past the budget).

    Every row is a function of its sequence only (the same bits whatever the chunk): a finite prior sums its
    atoms as the per-atom noise kernels do; a continuous prior uses the sufficient statistics with two label
    edges, ``(q, c)`` and ``(q, c')``: under uniform roots the closed form
    ``Y2[c, c'] = w(s, c) (n[q, c'] + α + [c = c']) / (n[q, ·] + Sα + 1)`` (the Dirichlet posterior of row ``q``,
    ``n`` the context edges); under stationary roots the task's own rule for the weights
    (:func:`popgrad.task.dirichlet.stationary_expectations`) on those statistics.
    """
    if second_moment_fits(task):
        return second_moment_table(task)[start:stop]
    return _second_moment_rows(task, start, stop)


def _second_moment_rows(task, start, stop):
    S, T = task.S, task.T
    multi = isinstance(task, MultiParentTask)
    if not task.continuous:
        from ._kernels import noise as _kn

        y2 = np.empty((stop - start, S, S))
        if multi:
            parents, tp, atoms, pk0 = task.kernel_arrays()
            _kn.second_moment_table_multi(start, parents, tp, atoms, pk0, y2)
        else:
            _kn.second_moment_table(start, *task.kernel_arrays(), y2)
        return y2
    from ..task import dirichlet as _dir

    prior = task.prior
    alpha = float(prior.alpha)
    seqs = decode_sequences(start, stop, S, T)
    N = len(seqs)
    rows = np.arange(N)
    if multi or prior.roots == "uniform":
        w = task.weight_rows(start, stop)
        if multi:
            tparents = np.asarray(task.graph.target_parents)
            n = _dir.edge_counts_multi(seqs, task.graph.parents, S)
            q = seqs[:, tparents] @ (S ** np.arange(len(tparents) - 1, -1, -1, dtype=np.int64))
        else:
            n, _ = _dir.edge_counts_single(seqs, task.graph.parents, S)
            q = seqs[:, T - 1]
        nq = n[rows, q].astype(np.float64)  # (N, S): the posterior of row q is Dirichlet(α + nq)
        A = nq.sum(axis=1) + S * alpha + 1.0
        y2 = w[:, :, None] * (nq[:, None, :] + alpha + np.eye(S)[None]) / A[:, None, None]
        return 0.5 * (y2 + np.swapaxes(y2, 1, 2))  # symmetric bit for bit (the two orders round apart)
    # stationary roots: the expectation of every statistic with the two label edges (c <= c', symmetric)
    n, r = _dir.edge_counts_single(seqs, task.graph.parents, S)
    q = seqs[:, T - 1]
    cc, dd = np.triu_indices(S)
    P = len(cc)
    nl = np.repeat(n[:, None], P, axis=1)  # (N, P, S, S)
    nl[rows[:, None], np.arange(P)[None], q[:, None], cc[None]] += 1
    nl[rows[:, None], np.arange(P)[None], q[:, None], dd[None]] += 1
    key = np.concatenate([nl.reshape(N * P, S * S), np.repeat(r, P, axis=0)], axis=1)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    vals, _, _ = _dir.stationary_expectations(uniq[:, :S * S].reshape(-1, S, S), uniq[:, S * S:], alpha)
    v = (vals[inv.reshape(-1)] / S).reshape(N, P)
    y2 = np.empty((N, S, S))
    y2[:, cc, dd] = v
    y2[:, dd, cc] = v
    return y2
