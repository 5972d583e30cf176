"""The full model's weight-table path on the block protocol (DESIGN §20; :mod:`popgrad.engine.blocks`).

The population sum over the task's weight table: the rows kernel of
:func:`popgrad.engine.catformer.catformer_rows_loss_and_grad` on every sequence in enumeration order
(already sorted by tokens, so the same blocks and bits as that function on ``(all sequences,
weight_table)``). Block ``b`` is rows ``b·per … (b+1)·per - 1`` with ``per = max(catformer_rows_per_block,
⌈S**T / max_blocks⌉)``: a function of ``S``, ``T`` and the options only. :func:`run_blocks` runs any
contiguous range of blocks into one slot each (reading the rows of the task's table, or computing them in
chunks of whole blocks past the table budget), so ``client=`` splits the range over Dask workers
(:mod:`popgrad.engine.distributed`) and the result is bit-identical to the local one: every slot depends on
its block's rows only. A worker reads its own copy of the task's table: the one that travelled with the task
when the client had built it, else the one it builds itself -- the same bits, since every row of a table
is a function of its sequence only (tests/engine/test_distributed.py builds it both ways).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import table as _table
from ._kernels import specialize as _spec
from ._kernels.twins import use_parallel

__all__ = ["TableJob", "TablePartials", "blocks", "block_work", "run_blocks"]


class TableJob(NamedTuple):
    """One table-path evaluation, decided: the model's job (:class:`popgrad.engine.catformer.CatFormerJob`),
    ``per`` rows per block, ``n_blocks`` blocks."""

    job: tuple
    per: int
    n_blocks: int


class TablePartials(NamedTuple):
    """Per-block slots, as :class:`popgrad.engine.catformer.CatFormerPartials` (``loss (n,)``, ``gr (n, ·)``):
    :func:`popgrad.engine.catformer.finish_blocks` of the model's job adds them."""

    loss: np.ndarray
    gr: np.ndarray


def blocks(task, model_job, opts) -> TableJob:
    """The table path's blocks for ``model_job`` (decided by :func:`popgrad.engine.catformer.blocks` with no task)."""
    N = task.n_sequences
    per = max(int(opts.catformer_rows_per_block), -(-N // int(opts.max_blocks)))
    n_blocks = max(1, -(-N // per))
    return TableJob(model_job._replace(parallel=use_parallel(n_blocks, N, opts)), per, n_blocks)


def block_work(task, tjob) -> np.ndarray:
    """Relative cost of each block, ``(n_blocks,)`` int64: all equal (the last may be shorter)."""
    return np.ones(tjob.n_blocks, dtype=np.int64)


def _chunk_blocks(per) -> int:
    """Blocks per streamed chunk of an uncached table (about 2**18 sequences)."""
    return max(1, 2**18 // per)


def run_blocks(task, tjob, lo=0, hi=None):
    """The slots (:class:`TablePartials`) of blocks ``lo … hi-1`` (``hi=None``: to the last), bit for bit those
    of a whole-range run."""
    job, per = tjob.job, tjob.per
    hi = tjob.n_blocks if hi is None else hi
    N = task.n_sequences
    n = hi - lo
    loss_s = np.zeros(n)
    gr_s = np.zeros((n, job.n_A + job.w_shape[0] * job.w_shape[1]))
    step = n if task.table_cached else _chunk_blocks(per)  # in whole blocks
    for b0 in range(lo, hi, step):
        b1 = min(hi, b0 + step)
        r0, r1 = b0 * per, min(N, b1 * per)
        seqs, w = _table.table_rows(task, r0, r1)
        _spec.run(job, "run_rows", job.parallel and b1 - b0 > 1, seqs, w, per, job.sizes, job.hinfo, job.prm,
                  job.eps, job.softmax_readout, job.want_grad, loss_s[b0 - lo:b1 - lo], gr_s[b0 - lo:b1 - lo])
    return TablePartials(loss_s, gr_s if job.want_grad else np.zeros((n, 0)))

