"""The one result type of every engine, and the one place the layer-1 softmax Jacobian is applied."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import warn_inf

__all__ = ["LossAndGrad", "finish"]


class LossAndGrad(NamedTuple):
    """Exact population loss and its gradients (immutable), for every task kind.

    Attributes
    ----------
    loss : float
        ``L = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)``; ``inf`` when ``ε = 0`` and a
        token with positive weight gets zero predicted mass.
    dA1 : ndarray of float64, shape (T, T) or (k, T, T)
        ``∂L/∂A1`` (one ``T×T`` matrix per head for a k-head model); zero
        above the diagonal, every row sums to 0. ``None`` for a loss-only call.
    dA2 : ndarray of float64, shape (S, S) or (k, S, S)
        ``∂L/∂A2``; every row sums to 0. ``None`` for a loss-only call.
    """

    loss: float
    dA1: np.ndarray
    dA2: np.ndarray


def finish(loss, G, dA2, P, where="exact_loss_and_grad") -> LossAndGrad:
    """Apply the layer-1 softmax Jacobian once, after the sum over sequences.

    ``dA1[..., i, :] = P[..., i, :] ⊙ (G[..., i, :] - <P[..., i, :], G[..., i, :]>)`` for ``G = ∂L/∂P``
    of shape ``(T, T)`` or ``(k, T, T)`` (entries above the diagonal are ignored). An infinite loss
    (``ε = 0``) gives a ``RuntimeWarning`` and NaN gradients.
    """
    T = P.shape[-1]
    low = np.tri(T, dtype=bool)
    G = np.where(low, G, 0.0)
    dA1 = P * (G - np.sum(P * G, axis=-1, keepdims=True))
    dA1 = np.where(low, dA1, 0.0)
    dA2 = np.array(dA2, dtype=np.float64)
    if math.isinf(loss):
        warn_inf(where)
        dA1 = np.full_like(dA1, np.nan)
        dA2 = np.full_like(dA2, np.nan)
    return LossAndGrad(float(loss), dA1, dA2)
