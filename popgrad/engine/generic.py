"""The generic exact engine: any :class:`popgrad.Model`'s population loss and gradient by enumeration (DESIGN §26).

``L(θ) = -Σ_s Σ_c w(s, c) log(f_c(s; θ) + ε)`` over all ``S**T`` sequences with the task's exact weights
(DESIGN §2; a finite prior's atoms or a continuous prior's weight table, DESIGN §20): the sequences are
enumerated in fixed blocks of consecutive sequence numbers and each block is one call of the model's
``loss_and_grad_rows(params, seqs, w, eps)`` -- the same call a sampled batch makes with ``w = y / n``.
A model without a fast engine needs nothing else to be trained exactly.

On the block protocol of :mod:`popgrad.engine.blocks`: :func:`blocks` decides the call (the blocks are
a function of ``S``, ``T``, the number of parameters and the :class:`popgrad.EngineOptions` only),
:func:`block_work` weighs them, :func:`run_blocks` writes one slot (loss, flat gradient) per block, and
:func:`finish_blocks` adds the slots in block order; with ``client=`` the ranges run on Dask workers
(:mod:`popgrad.engine.distributed`) and the result is bit-identical to the local one. A loss-only job
calls the model's ``predict`` instead (no backward pass).

:func:`model_hvp` is the complex-step Hessian-vector product ``Im ∇L(θ + i h v) / h`` through the same
blocks, for a model that declares ``complex_safe = True`` (its ``loss_and_grad_rows`` holomorphic);
any other model is refused in one line.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import warn_inf
from ..model.protocol import check_params, flatten, model_attr, model_name, n_parameters, unflatten
from ..task.reference import decode_sequences
from ._args import options_or_default
from .table import table_built

__all__ = ["ModelLossAndGrad", "GenericJob", "GenericPartials", "blocks", "block_work", "run_blocks",
           "finish_blocks", "exact", "exact_rows", "model_hvp", "SLOT_BUDGET_BYTES", "STEP"]

#: The per-block gradient slots of one call stay within this many bytes (larger blocks otherwise).
SLOT_BUDGET_BYTES = 2**28
#: The complex step's size relative to the direction's largest entry (as :mod:`popgrad.engine.complex_step`).
STEP = 1e-20


class ModelLossAndGrad(NamedTuple):
    """The exact population loss of a :class:`popgrad.Model` and its gradients: what :func:`popgrad.loss_and_grad`
    returns for every model (immutable).

    Attributes
    ----------
    loss : float
        ``L = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)``; ``inf`` when ``ε = 0`` and a token with positive
        weight gets zero predicted mass (the gradients are then NaN, with a ``RuntimeWarning``).
    grads : dict
        ``name -> ∂L/∂param`` (float64), the names and shapes of ``model.param_shapes()``.
    engine : str
        The engine that computed it: ``"reduced"`` (prefix / direct), ``"k-head"``, ``"catformer"``
        (the fast engines) or ``"generic"`` (the model's rows).
    """

    loss: float
    grads: dict
    engine: str = "generic"


class GenericJob(NamedTuple):
    """One call of the generic engine, decided (picklable; no task inside).

    Attributes
    ----------
    model : Model
    params : dict
        ``name -> array`` (float64, or complex for the complex step).
    eps : float
    want_grad : bool
    block : int
        Sequences per block (the last block may hold fewer).
    n_total : int
        ``S**T``.
    """

    model: object
    params: dict
    eps: float
    want_grad: bool
    block: int
    n_total: int


class GenericPartials(NamedTuple):
    """Per-block slots of a range of ``n`` blocks, in block order.

    Attributes
    ----------
    loss : ndarray, shape (n,)
    grad : ndarray, shape (n, n_params)
        The flat gradient of each block (``(n, 0)`` for a loss-only job).
    """

    loss: np.ndarray
    grad: np.ndarray


def block_size(n_total: int, n_params: int, opts) -> int:
    """Sequences per block: ``opts.direct_block_sequences``, larger when ``opts.max_blocks`` blocks or the
    slot budget (:data:`SLOT_BUDGET_BYTES`) would otherwise be exceeded."""
    b = max(int(opts.direct_block_sequences), -(-int(n_total) // int(opts.max_blocks)))
    b = max(b, -(-int(n_total) * 8 * max(int(n_params), 1) // SLOT_BUDGET_BYTES))
    return max(1, min(b, int(n_total)))


def blocks(task, model, params, eps, want_grad, opts=None) -> GenericJob:
    """The job of one call on validated input (``params`` from :func:`popgrad.model.protocol.check_params`)."""
    opts = options_or_default(opts)
    task.check_size()
    n = task.n_sequences
    return GenericJob(model, dict(params), float(eps), bool(want_grad), block_size(n, n_parameters(model), opts), n)


def block_work(task, job) -> np.ndarray:
    """Sequences per block (the cost of a block is about proportional)."""
    n_blocks = -(-job.n_total // job.block)
    work = np.full(n_blocks, job.block, dtype=np.int64)
    work[-1] = job.n_total - job.block * (n_blocks - 1)
    return work


def exact_rows(task, start, stop):
    """Sequences ``start … stop-1`` and their exact weights ``(n, S)``: read from the task's weight table where
    the one rule of :mod:`popgrad.engine.table` reads it (a continuous prior, or a table already prepared), else
    summed over the atoms for these rows only -- so a call never builds a finite prior's table (which would
    change the path, and the rounding, of the other engines' next calls)."""
    seqs = decode_sequences(start, stop, task.S, task.T)
    if task.continuous or table_built(task):
        return seqs, np.asarray(task.weight_rows(start, stop), dtype=np.float64)
    return seqs, np.asarray(task._table_rows(start, stop)[0], dtype=np.float64)


def _loss_only(model, params, seqs, w, eps) -> float:
    f = np.asarray(model.predict(params, seqs), dtype=np.float64)
    pos = w > 0
    with np.errstate(divide="ignore"):
        return -float(np.sum(w[pos] * np.log(f[pos] + eps)))


def run_blocks(task, job, lo=0, hi=None) -> GenericPartials:
    """The slots of blocks ``lo … hi-1`` (``hi=None``: to the last): one model call per block."""
    n_blocks = -(-job.n_total // job.block)
    hi = n_blocks if hi is None else int(hi)
    model, params, eps = job.model, job.params, job.eps
    dtype = np.complex128 if any(np.iscomplexobj(v) for v in params.values()) else np.float64
    n_par = n_parameters(model) if job.want_grad else 0
    loss = np.zeros(hi - lo, dtype=dtype)
    grad = np.zeros((hi - lo, n_par), dtype=dtype)
    names = tuple(model.param_shapes())
    for b in range(lo, hi):
        start = b * job.block
        seqs, w = exact_rows(task, start, min(job.n_total, start + job.block))
        if not job.want_grad:
            loss[b - lo] = _loss_only(model, params, seqs, w, eps)
            continue
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            l_b, g_b = model.loss_and_grad_rows(params, seqs, w, eps)
        loss[b - lo] = l_b
        grad[b - lo] = np.concatenate([np.asarray(g_b[k], dtype=dtype).ravel() for k in names]) if names else []
    return GenericPartials(loss, grad)


def _sum_slots(x):
    """The slots added one after the other, in block order (the same additions for any split)."""
    out = np.zeros(x.shape[1:], dtype=x.dtype)
    for row in x:
        out += row
    return out


def finish_blocks(job, partials) -> ModelLossAndGrad:
    """Every slot added in block order: the loss and the gradients under the model's names."""
    loss = _sum_slots(partials.loss[:, None])[0]
    if not job.want_grad:
        if math.isinf(float(np.real(loss))):
            warn_inf("loss_and_grad")
        return ModelLossAndGrad(float(np.real(loss)), None, "generic")
    g = _sum_slots(partials.grad)
    if np.iscomplexobj(g):  # the complex step: the caller reads the imaginary parts
        return ModelLossAndGrad(loss, unflatten(job.model, g), "generic")
    grads = {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in unflatten(job.model, g).items()}
    loss = float(loss)
    if math.isinf(loss):
        warn_inf("loss_and_grad")
        grads = {k: np.full_like(v, np.nan) for k, v in grads.items()}
    return ModelLossAndGrad(loss, grads, "generic")


def exact(task, model, params, eps, want_grad=True, client=None, options=None) -> ModelLossAndGrad:
    """The generic engine on validated input: local, or the same blocks over ``client``'s workers."""
    opts = options_or_default(options)
    job = blocks(task, model, params, eps, want_grad, opts)
    if client is None:
        partials = run_blocks(task, job)
    else:
        from . import distributed as _distributed

        partials = _distributed.run_blocks(client, task, job, block_work(task, job), run_blocks)
    return finish_blocks(job, partials)


def model_hvp(task, model, params, v, eps, client=None, options=None) -> dict:
    """``H v`` of a generic model's population loss by a complex step through its ``loss_and_grad_rows``.

    ``params`` and ``v`` validated mappings of the model's shapes. ``Im ∇L(θ + i h v) / h`` with
    ``h = STEP / max|v|``: exact to rounding for a holomorphic backward (no cancellation). A model
    without ``complex_safe = True`` is refused (``TypeError``, one line).
    """
    if not model_attr(model, "complex_safe", False):
        raise TypeError(f"hvp: {model_name(model)} does not declare complex_safe = True, so its loss_and_grad_rows "
                        "may not accept complex parameters: make it holomorphic (softmax shifted by the real part, "
                        "no abs/max of complex values) and set complex_safe = True")
    vf = flatten(model, v)
    m = float(np.max(np.abs(vf))) if vf.size else 0.0
    if m == 0.0:
        return {k: np.zeros(s) for k, s in model.param_shapes().items()}
    h = STEP / m
    pc = unflatten(model, flatten(model, params) + 1j * h * vf)
    pc = check_params(model, pc, dtype=np.complex128)
    res = exact(task, model, pc, eps, True, client, options)
    return {k: np.ascontiguousarray(np.imag(g) / h) for k, g in res.grads.items()}
