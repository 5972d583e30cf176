"""Argument handling shared by the theorem checks: the task kind, ``A1``/``A2`` shapes, the hypotheses."""
from __future__ import annotations

import numpy as np

from .._validation import as_heads, as_square
from ..task.tasks import MultiParentTask, Task
from .hypotheses import Hypotheses, measure_hypotheses

def _hypotheses(task, hypotheses):
    """``"auto"``: measure on the task; ``None``: skip; a :class:`Hypotheses`: as given."""
    if isinstance(hypotheses, str) and hypotheses == "auto":
        return measure_hypotheses(task)
    if hypotheses is None or isinstance(hypotheses, Hypotheses):
        return hypotheses
    raise TypeError(f"hypotheses must be 'auto', None or a popgrad.checks.Hypotheses, got {type(hypotheses).__name__}")



def _check_task(task, kinds=(Task,)):
    if not isinstance(task, kinds):
        names = " or ".join(f"popgrad.{k.__name__}" for k in kinds)
        raise TypeError(f"task must be a {names}, got {type(task).__name__}")


def _as_A1(task, A1, name: str = "A1") -> np.ndarray:
    """``A1`` as a finite float64 array of the task's shape (``(T, T)``; ``(k, T, T)`` for k heads)."""
    if isinstance(task, MultiParentTask):
        M = as_heads(A1, name)
        want = (task.k, task.T, task.T)
    else:
        M = as_square(A1, name)
        want = (task.T, task.T)
    if M.shape != want:
        raise ValueError(f"{name} must have shape {want} for this task, got {M.shape}")
    return M


def _as_A2(task, A2, name: str = "A2") -> np.ndarray:
    M = as_heads(A2, name) if np.ndim(A2) == 3 else as_square(A2, name)
    if M.shape[-2:] != (task.S, task.S):
        raise ValueError(f"{name} must be {task.S}×{task.S} (S = {task.S}) for this task, got shape {M.shape}")
    return M

