"""The enumeration's chunks for the Hessian-vector products: the rows with their exact weights, the fixed
chunk ranges and their map over an optional Dask client (shared by :mod:`popgrad.engine.complex_step` and
:mod:`popgrad.engine.tangent`; importable from both).
"""
from __future__ import annotations

import numpy as np

from .._validation import ArgumentTypeError
from ..task.tasks import decode_sequences


def _fill(task, start, stop):
    """Sequences ``start … stop-1`` (the task's numbering) with their exact weights.

    A continuous prior (:class:`popgrad.DirichletPrior`, :class:`popgrad.DirichletTensorPrior`) has no atoms: its
    weights are the task's weight table (DESIGN §20), read by rows; a finite prior's are summed over its atoms.
    """
    if task.continuous:
        return decode_sequences(start, stop, task.S, task.T), np.asarray(task.weight_rows(start, stop))
    n = stop - start
    seqs = np.empty((n, task.T), dtype=np.int64)
    w = np.empty((n, task.S), dtype=np.float64)
    task._fill_chunk(start, task.kernel_arrays(), seqs, w)
    return seqs, w


def _ranges(n_total, chunk):
    return [(a, min(a + chunk, n_total)) for a in range(0, n_total, chunk)]


def _map(client, fn, args, ranges):
    if client is None:
        return [fn(*args, a, b) for a, b in ranges]
    if not (hasattr(client, "submit") and hasattr(client, "gather")):
        raise ArgumentTypeError(f"client must be a dask.distributed.Client, got {type(client).__name__}")
    futs = [client.submit(fn, *args, a, b, pure=False) for a, b in ranges]
    return client.gather(futs)
