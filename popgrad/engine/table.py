"""The weight-table path of the exact engines (DESIGN §20).

A task's weights ``w(s, c)`` depend on the task only, never on the model's
parameters. For a continuous prior (:class:`popgrad.DirichletPrior`,
:class:`popgrad.DirichletTensorPrior`) there are no atoms to carry, so the
engines read the task's table (:meth:`popgrad.Task.weight_table`, computed
once per task, ``S**T × S`` float64); for a finite prior the per-atom engines
carry ``K`` products per prefix at every call, and the table makes a call cost
independent of ``K``.

**The one rule** (:func:`use_table`): the table path when the prior is
continuous, or when the engine's per-call cost grows with the number of atoms
(``per_atom=True``: the k-head and full-model engines; the reduced
single-parent prefix engine keeps its own leaf-weight cache, so it passes
``False``) and ``K ≥ TABLE_MIN_ATOMS`` and the table fits the task's memory
budget. Both paths compute the same sums (tests: 1e-13 on finite priors).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ..task.tasks import decode_sequences

__all__ = ["use_table", "table_rows", "TABLE_MIN_ATOMS"]

#: Fewest atoms for which a per-atom engine reads the table instead (calibrated by benchmarks/bench_prior.py).
TABLE_MIN_ATOMS = 64

_SEQS = OrderedDict()  # (S, T) -> all sequences (int64, read-only): they do not depend on the task
_LOCK = threading.Lock()


def use_table(task, per_atom: bool) -> bool:
    """The one rule: read the weight table (True) or carry the per-atom products (False). See the module doc."""
    if task.continuous:
        return True
    return bool(per_atom and task.prior.K >= TABLE_MIN_ATOMS and task.table_cached)


def all_sequences(S: int, T: int) -> np.ndarray:
    """Every sequence of ``[S]^T`` in enumeration order, ``(S**T, T)`` int64, read-only (kept for 2 sizes)."""
    key = (S, T)
    seqs = _SEQS.get(key)
    if seqs is None:
        seqs = decode_sequences(0, S**T, S, T)
        seqs.setflags(write=False)
        with _LOCK:
            _SEQS[key] = seqs
            while len(_SEQS) > 2:
                _SEQS.popitem(last=False)
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
