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
    k = task.k if isinstance(task, MultiParentTask) else None
    A1, A2 = V.as_reduced(A1, A2, task.T, task.S, k, square=_square_fast)
    return A1, A2, V.as_eps(task, eps)
