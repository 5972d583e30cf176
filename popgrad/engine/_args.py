"""Validation of the engines' arguments, one code path for every task kind."""
from __future__ import annotations

import numpy as np

from .. import _validation as V
from ..task.tasks import ExactTask, MultiParentTask
from ..task.tasks import check_task as _check_task_kind
from ._kernels import single as _k
from .options import DEFAULT_OPTIONS, EngineOptions

__all__ = ["check_task", "validate", "options_or_default"]


def check_task(task) -> None:
    """Any exact task (:func:`popgrad.task.tasks.check_task`)."""
    if not isinstance(task, ExactTask):  # the common case costs one isinstance
        _check_task_kind(task)


def options_or_default(options) -> EngineOptions:
    if options is None:
        return DEFAULT_OPTIONS
    if not isinstance(options, EngineOptions):
        raise V.ArgumentTypeError(f"options must be a popgrad.EngineOptions, got {type(options).__name__}")
    return options


def _square_fast(M, name):
    """:func:`as_square` with a fast path for finite float64 square arrays (the training loop)."""
    if type(M) is np.ndarray and M.dtype == np.float64 and M.ndim == 2 and M.shape[0] == M.shape[1] \
            and _k.all_finite(M):
        return M
    return V.as_square(M, name)  # converts, or raises with the message that names the entry


def validate(task, A1, A2, eps):
    """``(A1, A2, eps)`` checked against the task: ``(T, T)``/``(S, S)`` for a single-parent task,
    ``(k, T, T)``/``(k, S, S)`` for a k-parent one (``(T, T)``/``(S, S)`` accepted when ``k = 1``)."""
    check_task(task)
    T, S = task.T, task.S
    if isinstance(task, MultiParentTask):
        k = task.k
        if k == 1 and np.ndim(A1) == 2:
            A1 = np.asarray(A1)[None]
        if k == 1 and np.ndim(A2) == 2:
            A2 = np.asarray(A2)[None]
        A1 = V.as_heads(A1, "A1")
        A2 = V.as_heads(A2, "A2")
        if A1.shape != (k, T, T):
            raise ValueError(f"A1 must have shape (k, T, T) = ({k}, {T}, {T}) for this task, got {A1.shape}")
        if A2.shape != (k, S, S):
            raise ValueError(f"A2 must have shape (k, S, S) = ({k}, {S}, {S}) for this task, got {A2.shape}")
    else:
        A1 = _square_fast(A1, "A1")
        A2 = _square_fast(A2, "A2")
        if A1.shape != (T, T):
            raise ValueError(f"A1 must have shape (T, T) = ({T}, {T}) for this task, got {A1.shape}")
        if A2.shape != (S, S):
            raise ValueError(f"A2 must have shape (S, S) = ({S}, {S}) for this task, got {A2.shape}")
    return A1, A2, V.as_eps(task, eps)
