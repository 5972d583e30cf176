"""The official code's optimizers, stepped exactly on a list of parameter arrays (DESIGN §14).

A parameter set is a list of float64 arrays ``θ = [θ_0, θ_1, …]`` (for the
full model: ``Ã^(1), …, Ã^(L), W``); every rule acts on each array
elementwise. Step ``t = 0, 1, …`` uses the learning rate

* ``"constant"``: ``lr_t = lr``;
* ``"cosine"``: ``lr_t = lr · ½(1 + cos(π·min(t, steps)/steps))``
  (``optax.cosine_decay_schedule(lr, steps)``, ``alpha = 0``, exponent 1).

Rules (``g = ∇L(θ_t)``, the exact population gradient):

* ``"gd"`` / ``"sgd"`` (the loop of ``single_parent.py``; ``optax.sgd`` when
  ``wd = 0``): ``g ← g + wd·θ``; ``θ ← θ − lr_t·g`` (coupled decay).
* ``"adamw"`` (``optax.adamw(schedule, b1, b2, eps, eps_root=0,
  weight_decay=wd)``)::

      m ← (1 − b1)·g + b1·m          v ← (1 − b2)·g² + b2·v        (m, v start at 0)
      n = t + 1                       m̂ = m / (1 − b1ⁿ)             v̂ = v / (1 − b2ⁿ)
      u = m̂ / (√v̂ + eps) + wd·θ       θ ← θ − lr_t·u                 (decoupled decay)

* ``"adam"`` (``optax.adam``): the same moments of ``g + wd·θ`` and ``u = m̂ /
  (√v̂ + eps)`` (coupled L2 decay, as ``torch.optim.Adam``; it equals
  ``optax.chain(optax.add_decayed_weights(wd), optax.adam(schedule))`` and
  ``optax.adam`` when ``wd = 0``).

Defaults ``b1 = 0.9``, ``b2 = 0.999``, ``eps = 1e-8`` are optax's. Each step
is a fixed sequence of float64 array operations, so a run is bit-identical
whenever its gradients are.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .._validation import as_int, as_real

__all__ = ["OPTIMIZERS", "LR_SCHEDULES", "Optimizer", "OptimizerState", "learning_rate"]

#: Optimizer names: ``"gd"`` and ``"sgd"`` are the same rule (full-batch: the population gradient).
OPTIMIZERS = ("gd", "sgd", "adam", "adamw")

#: Learning-rate schedules.
LR_SCHEDULES = ("constant", "cosine")


def learning_rate(lr: float, schedule: str, steps: int, t: int) -> float:
    """``lr_t`` of step ``t`` (module docstring): ``lr`` or ``lr·½(1 + cos(π·min(t, steps)/steps))``."""
    if schedule == "constant":
        return float(lr)
    count = min(t, steps)
    return float(lr) * (0.5 * (1.0 + math.cos(math.pi * count / steps)))


class OptimizerState(NamedTuple):
    """The optimizer's state after ``count`` updates.

    Attributes
    ----------
    count : int
        Updates applied so far (optax's ``count``).
    mu, nu : tuple of ndarray
        Adam's first and second moments, one array per parameter array (empty for ``"sgd"``/``"gd"``).
    """

    count: int
    mu: tuple
    nu: tuple


@dataclass(frozen=True)
class Optimizer:
    """One of the official optimizers (module docstring), validated.

    Parameters
    ----------
    name : {"gd", "sgd", "adam", "adamw"}
    lr : float
        Peak learning rate (``> 0``).
    lr_schedule : {"constant", "cosine"}
    steps : int
        ``decay_steps`` of the cosine schedule (the run's length, ``>= 1``).
    weight_decay : float
        ``wd >= 0``: coupled for ``"sgd"``/``"gd"``/``"adam"``, decoupled for ``"adamw"``.
    b1, b2, eps : float
        Adam's constants (optax defaults).
    """

    name: str = "sgd"
    lr: float = 1.0
    lr_schedule: str = "cosine"
    steps: int = 1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self):
        if not isinstance(self.name, str) or self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.name!r}")
        if not isinstance(self.lr_schedule, str) or self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        object.__setattr__(self, "lr", as_real(self.lr, "lr", minimum=0, strict=True))
        object.__setattr__(self, "steps", as_int(self.steps, "steps", minimum=1))
        object.__setattr__(self, "weight_decay", as_real(self.weight_decay, "weight_decay", minimum=0))
        for name in ("b1", "b2"):
            v = as_real(getattr(self, name), name, minimum=0)
            if v >= 1:
                raise ValueError(f"{name} must be in [0, 1), got {v}")
            object.__setattr__(self, name, v)
        object.__setattr__(self, "eps", as_real(self.eps, "eps", minimum=0, strict=True))

    @property
    def is_adam(self) -> bool:
        return self.name in ("adam", "adamw")

    def lr_at(self, t: int) -> float:
        """The learning rate of step ``t``."""
        return learning_rate(self.lr, self.lr_schedule, self.steps, t)

    def init(self, params) -> OptimizerState:
        """The state before the first step: zero moments shaped like ``params`` (Adam), none (SGD)."""
        if not self.is_adam:
            return OptimizerState(0, (), ())
        zeros = tuple(np.zeros_like(np.asarray(p, dtype=np.float64)) for p in params)
        return OptimizerState(0, zeros, tuple(z.copy() for z in zeros))

    def step(self, t: int, params, grads, state: OptimizerState):
        """Apply update ``t``: returns ``(new_params, new_state)`` (lists/tuples of new arrays).

        ``params`` and ``grads`` are sequences of float64 arrays of matching shapes; nothing is
        modified in place.
        """
        lr_t = self.lr_at(t)
        wd = self.weight_decay
        if not self.is_adam:
            new = []
            for p, g in zip(params, grads):
                if wd:
                    g = g + wd * p
                new.append(p - lr_t * g)
            return new, OptimizerState(state.count + 1, (), ())
        b1, b2, eps = self.b1, self.b2, self.eps
        n = state.count + 1
        c1 = 1.0 - b1**n
        c2 = 1.0 - b2**n
        new, mus, nus = [], [], []
        for p, g, m, v in zip(params, grads, state.mu, state.nu):
            if self.name == "adam" and wd:
                g = g + wd * p
            m = (1.0 - b1) * g + b1 * m
            v = (1.0 - b2) * (g * g) + b2 * v
            u = (m / c1) / (np.sqrt(v / c2) + eps)
            if self.name == "adamw" and wd:
                u = u + wd * p
            new.append(p - lr_t * u)
            mus.append(m)
            nus.append(v)
        return new, OptimizerState(n, tuple(mus), tuple(nus))
