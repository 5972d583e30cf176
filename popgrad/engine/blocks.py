"""The block-runner interface every exact engine implements (DESIGN §11).

An engine splits its ``S**T`` (or canonical) sequences into a fixed set of
blocks numbered ``0 … n_blocks-1``; the set depends on ``S``, ``T``, the mode
and the :class:`EngineOptions` only. Each block writes one slot of per-block
partial sums, and the slots are added in block order, so the result does not
depend on which thread or process ran which block. Every engine module
(:mod:`popgrad.engine.single`, :mod:`popgrad.engine.multi`, the full model's
:mod:`popgrad.engine.catformer`, the gradient noise's :mod:`popgrad.engine.noise`)
exposes (the reduced engines' types shown; the others have their own job and
partials NamedTuples, a loss-only job's partials carrying empty gradient slots):

``blocks(task, A1, A2, eps, want_grad, ...) -> BlockJob``
    Every decision of the call (engine, orbit reduction, layer-1 attention
    ``P``, the ``A2`` it runs on).
``block_work(task, job) -> ndarray (n_blocks,) int64``
    Relative cost of each block (for splitting a range into chunks); its
    length is the number of blocks.
``run_blocks(task, job, lo=0, hi=None) -> Partials``
    The slots of blocks ``lo … hi-1`` (``hi=None``: to the last): bit for
    bit the slots a whole-range run writes for them.
``finish_blocks(job, partials) -> LossAndGrad``
    Adds the slots of all blocks in block order and applies the layer-1
    softmax Jacobian once.

A local call is ``finish_blocks(job, run_blocks(task, job))``;
:mod:`popgrad.engine.distributed` runs contiguous ranges on workers,
concatenates their :class:`Partials` in block order (:func:`concat_partials`)
and calls the same ``finish_blocks``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["BlockJob", "Partials", "concat_partials"]


class BlockJob(NamedTuple):
    """One call of an engine, decided: what any process needs, besides the task, to run some of its blocks.

    Attributes
    ----------
    engine : str
        ``"prefix"`` | ``"direct"`` (single-parent) or ``"multi"`` (k heads).
    sym : bool
        Whether the orbit reduction is on (``A2`` is then projected onto ``span{I, 11ᵀ}``).
    P : ndarray of float64, shape (T, T) or (k, T, T)
        Layer-1 attention ``softmax_rows(MASK(A1))``.
    A2 : ndarray of float64, shape (S, S) or (k, S, S)
    eps : float
    want_grad : bool
    opts : EngineOptions
        With ``S`` and ``T`` these fix the blocks (``len(block_work(task, job))`` of them).
    """

    engine: str
    sym: bool
    P: np.ndarray
    A2: np.ndarray
    eps: float
    want_grad: bool
    opts: object


class Partials(NamedTuple):
    """Per-block partial sums of a range of ``n`` blocks, one slot per block, in block order.

    Attributes
    ----------
    loss : ndarray of float64, shape (n,)
    G : ndarray of float64, shape (n, T, T) or (n, k, T, T)
        ``∂L/∂P`` per block (trailing axes of size 1 for a loss-only job).
    dA2 : ndarray of float64, shape (n, S, S) or (n, k, S, S)
        (trailing axes of size 1 for a loss-only job).
    """

    loss: np.ndarray
    G: np.ndarray
    dA2: np.ndarray


def concat_partials(parts):
    """The partials of consecutive ranges, given in block order, as one (any engine's NamedTuple of slot
    arrays, block axis first: :class:`Partials`, the full model's, the gradient noise's)."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    kind = type(parts[0])
    return kind(*(np.concatenate([p[i] for p in parts]) for i in range(len(parts[0]))))
