"""Exact population loss and gradients of the disentangled transformer (DESIGN §14).

``L(θ) = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)`` over all ``S**T`` sequences with
the task's exact weights ``w(s, c)`` (DESIGN §2; :class:`popgrad.Task` and
:class:`popgrad.MultiParentTask` alike), ``f`` the :class:`popgrad.CatFormer`
output; with the softmax readout and ``ε = 0`` (the default there) the loss is
the cross entropy, computed as a log-softmax.

Two implementations of the same sum:

* :func:`catformer_loss_and_grad_numpy` -- the NumPy reference
  (:func:`popgrad.model.catformer.catformer_backward` over chunks of
  :meth:`task.enumerate`);
* the numba trie engine (:mod:`popgrad.engine._kernels.catformer`, used by
  :func:`catformer_loss_and_grad`): a depth-first walk of the prefix tree.
  Row ``t`` of every layer depends on ``s_0 … s_t`` only, so it is computed
  once per prefix node; the last layer is computed at the last position only
  (the leaves); the per-atom weight products are carried down the tree. The
  backward pass is reverse mode over the same tree: a leaf adds its adjoints
  of the rows ``j < T-1`` into per-depth buffers, and a node back-propagates
  its own row once, after all its children (DESIGN §14).

The enumeration is split into ``S**D`` fixed blocks (the sequences sharing
their first ``D`` tokens, ``D`` a function of ``S``, ``T`` and the options
only); :func:`run_blocks` runs a contiguous range of blocks into one slot
each, and the slots are added in block order, so the result does not depend
on the thread count nor on how a ``client=`` splits the range.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import ArgumentTypeError, as_eps, warn_inf
from ..model.catformer import CatFormer, catformer_backward
from ..task.tasks import MultiParentTask
from ._args import check_task, options_or_default

__all__ = ["CatFormerLossAndGrad", "catformer_loss_and_grad", "catformer_loss", "catformer_loss_and_grad_numpy"]


class CatFormerLossAndGrad(NamedTuple):
    """Exact population loss of a :class:`popgrad.CatFormer` and its gradients (immutable).

    Attributes
    ----------
    loss : float
        ``L = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)``.
    dA : list of ndarray
        ``∂L/∂Ã``, the same list structure and shapes as ``params.A``. ``None`` for a loss-only call.
    dW : ndarray, shape (d_L, S)
        ``∂L/∂W``. ``None`` for a loss-only call.
    """

    loss: float
    dA: list
    dW: np.ndarray


def _validate(task, model, params, eps):
    check_task(task)
    if not isinstance(model, CatFormer):
        raise ArgumentTypeError(f"model must be a popgrad.CatFormer, got {type(model).__name__}")
    if (model.S, model.T) != (task.S, task.T):
        raise ValueError(f"model has S = {model.S}, T = {model.T} but the task has S = {task.S}, T = {task.T}: "
                         f"use CatFormer({task.S}, {task.T}, ...)")
    params = model.check_params(params)
    if eps is None:
        eps = 0.0 if model.readout == "softmax" else as_eps(task, None)
    else:
        eps = as_eps(task, eps)
    return params, eps


def catformer_loss_and_grad(task, model, params, eps=None, client=None, options=None) -> CatFormerLossAndGrad:
    """Exact population loss and every gradient of the disentangled transformer (DESIGN §14).

    Parameters
    ----------
    task : Task or MultiParentTask
        Graph and finite prior; ``S**T`` must pass ``task.check_size()``.
    model : CatFormer
        Same ``S`` and ``T`` as the task.
    params : CatFormerParams
        ``A[ℓ]`` of shape ``(m_ℓ, d_{ℓ-1}, d_{ℓ-1})``, ``W`` of shape ``(d_L, S)``; finite.
    eps : float, optional
        ``ε ≥ 0`` in ``-Σ w log(f + ε)``. Default: ``0`` for the softmax readout (cross entropy),
        ``task.default_eps`` (``T_eff**-0.5``) for the linear readout.
    client : dask.distributed.Client, optional
        Split the enumeration's blocks over the client's workers; bit-identical to ``client=None``.
    options : EngineOptions, optional
        ``catformer_block_sequences`` sets the block size; default :data:`popgrad.DEFAULT_OPTIONS`.

    Returns
    -------
    CatFormerLossAndGrad
        ``loss``, ``dA`` (list as ``params.A``), ``dW``.

    Raises
    ------
    TypeError, ValueError
        On a wrong argument (the message names it).
    TaskTooLargeError
        If ``S**T`` exceeds ``task.max_sequences`` (before any work).
    """
    params, eps = _validate(task, model, params, eps)
    return _dispatch(task, model, params, eps, True, client, options_or_default(options))


def catformer_loss(task, model, params, eps=None, client=None, options=None) -> float:
    """Exact population loss only; same parameters and conventions as :func:`catformer_loss_and_grad`."""
    params, eps = _validate(task, model, params, eps)
    return _dispatch(task, model, params, eps, False, client, options_or_default(options)).loss


def _dispatch(task, model, params, eps, want_grad, client, opts) -> CatFormerLossAndGrad:
    task.check_size()
    return _reference(task, model, params, eps, want_grad, opts.numpy_chunk)


def catformer_loss_and_grad_numpy(task, model, params, eps=None, chunk=4096) -> CatFormerLossAndGrad:
    """NumPy reference of :func:`catformer_loss_and_grad` (same sums, whole-chunk arrays, slower)."""
    params, eps = _validate(task, model, params, eps)
    task.check_size()
    return _reference(task, model, params, eps, True, chunk)


def _reference(task, model, params, eps, want_grad, chunk) -> CatFormerLossAndGrad:
    loss = 0.0
    dA = [np.zeros_like(a) for a in params.A]
    dW = np.zeros_like(params.W)
    for seqs, w in task.enumerate(chunk_size=chunk):
        l_c, dA_c, dW_c = catformer_backward(model, params, seqs, w, eps)
        loss += l_c
        for a, b in zip(dA, dA_c):
            a += b
        dW += dW_c
    return _finish(loss, dA, dW, want_grad)


def _finish(loss, dA, dW, want_grad) -> CatFormerLossAndGrad:
    if math.isinf(loss) or math.isnan(loss):
        warn_inf("catformer_loss_and_grad") if math.isinf(loss) else None
        if want_grad:
            dA = [np.full_like(a, np.nan) for a in dA]
            dW = np.full_like(dW, np.nan)
    if not want_grad:
        return CatFormerLossAndGrad(float(loss), None, None)
    return CatFormerLossAndGrad(float(loss), dA, dW)
