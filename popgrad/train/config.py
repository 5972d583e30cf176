"""Training settings: :class:`TrainConfig` (Algorithm 1) and :class:`MultiHeadTrainConfig` (k heads).

Learning rates are in natural units so that defaults work across ``S`` and ``T``:

* Stage 1: ``η1 = lr1 · S · T / β0``. The Stage-1 gradient is
  ``-(β0/(S·T)) J(P_i) (g_i + O(T_eff^{-1/2}))`` (DESIGN §5), so one step moves
  row ``i`` of ``A1`` by about ``lr1 · J(P_i) g_i``, independent of ``β0``.
* Stage 2: ``η2 = lr2 · S``. Row ``q`` of ``∇_{A2} L`` only receives the
  sequences whose query is ``q`` (probability ``1/S``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .._validation import as_int, as_real
from ..task.tasks import Task

__all__ = ["GRADIENTS", "TRAIN_GRADIENTS", "SCHEDULES", "STAGE2_METHODS", "TrainConfig", "MultiHeadTrainConfig",
           "resolve_auto"]


#: Stage-1 gradients: the exact one (enumeration), the exact first-order field (DESIGN §12, any T),
#: the idealized prediction of Knowl 3 (DESIGN §5, any T).
GRADIENTS = ("exact", "field", "idealized")
#: What a run may follow: a population gradient, or minibatch SGD as the official code runs it (a fresh
#: seeded batch of ``batch_size`` samples with soft labels at every step, both stages; the Python API only).
TRAIN_GRADIENTS = GRADIENTS + ("sgd",)


SCHEDULES = ("two-stage", "joint")


#: Stage-2 methods: ``"exact"`` (enumeration) or ``"sampled"`` (sample-average approximation on a fixed
#: sample, :mod:`popgrad.engine.sampled`; every loss it gives is an estimate with a standard error).
STAGE2_METHODS = ("exact", "sampled")


def resolve_auto(gradient: str, stage2: str, enumerable: bool, steps2: int) -> tuple:
    """``(gradient, stage2)`` with ``"auto"`` resolved: the one rule (``train_two_stage`` and ``popgrad run``).

    ``gradient="auto"``: ``"exact"`` when the task can be enumerated, else ``"field"`` (the exact
    first-order Stage-1 gradient, any T). ``stage2="auto"``: ``"exact"`` when the task can be
    enumerated or there is no Stage 2 (``steps2 == 0``), else ``"sampled"``.
    """
    if gradient == "auto":
        gradient = "exact" if enumerable else "field"
    if stage2 == "auto":
        stage2 = "exact" if enumerable or steps2 == 0 else "sampled"
    return gradient, stage2


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one run of Algorithm 1 (natural units, see module doc)."""

    beta0: float = 1e-3
    lr1: float = 2.0
    steps1: int = 300
    lr2: float = 2.0
    steps2: int = 300
    gradient: str = "exact"
    schedule: str = "two-stage"
    record_every: int = 10
    eps: float | None = None
    divergence_patience: int = 100
    stage2: str = "exact"
    samples: int = 0
    sample_seed: int = 0
    batch_size: int = 0

    def eta1(self, task: Task) -> float:
        """Stage-1 step size ``lr1 · S · T / β0``."""
        return self.lr1 * task.S * task.T / self.beta0

    def eta2(self, task: Task) -> float:
        """Stage-2 step size ``lr2 · S``."""
        return self.lr2 * task.S

    def validate(self) -> "TrainConfig":
        as_real(self.beta0, "beta0", minimum=0, strict=True)
        for name in ("lr1", "lr2"):
            as_real(getattr(self, name), name, minimum=0)
        for name in ("steps1", "steps2"):
            as_int(getattr(self, name), name, minimum=0)
        for name in ("record_every", "divergence_patience"):
            as_int(getattr(self, name), name, minimum=1)
        if self.gradient not in TRAIN_GRADIENTS:
            raise ValueError(f"gradient must be one of {TRAIN_GRADIENTS}, got {self.gradient!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.stage2 not in STAGE2_METHODS:
            raise ValueError(f"stage2 must be one of {STAGE2_METHODS}, got {self.stage2!r}")
        as_int(self.samples, "samples", minimum=0)
        as_int(self.sample_seed, "sample_seed", minimum=0)
        if self.stage2 == "sampled" and self.schedule != "two-stage":
            raise ValueError("stage2='sampled' needs schedule='two-stage' (A1 frozen while A2 trains on the sample)")
        if self.schedule == "joint" and self.gradient not in ("exact", "sgd"):
            raise ValueError("schedule='joint' needs gradient='exact' or 'sgd' (the idealized gradient only covers "
                             "Stage 1)")
        as_int(self.batch_size, "batch_size", minimum=0)
        if self.gradient == "sgd":
            if self.batch_size < 1:
                raise ValueError("gradient='sgd' needs batch_size >= 1 (the paper's code uses 1024)")
            if self.stage2 != "exact":
                raise ValueError("gradient='sgd' draws a fresh batch at every step of both stages: leave stage2 at "
                                 "'exact' (stage2='sampled' is the fixed-sample Stage 2 of the population run)")
        elif self.batch_size:
            raise ValueError(f"batch_size={self.batch_size} is only used with gradient='sgd'; drop it or set "
                             "gradient='sgd'")
        if self.eps is not None and not (math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be None or a finite number >= 0, got {self.eps}")
        return self


@dataclass(frozen=True)
class MultiHeadTrainConfig(TrainConfig):
    """:class:`TrainConfig` of a k-head run (:func:`popgrad.train_multi_head`): adds the seeded start.

    ``A1^h(0) = init_scale · N(0, 1)`` from ``numpy.random.default_rng(init_seed)``;
    ``gradient`` must be ``"exact"``. Its defaults are those of :func:`popgrad.train_multi_head`
    and of ``popgrad run`` on a multi-parent graph (one value each): joint training from
    ``β0 = 2`` for 3000 steps.
    """

    beta0: float = 2.0
    steps1: int = 3000
    steps2: int = 0
    schedule: str = "joint"
    init_seed: int = 0
    init_scale: float = 0.1

    def validate(self) -> "MultiHeadTrainConfig":
        super().validate()
        if self.gradient != "exact":
            raise ValueError("gradient must be 'exact' for k heads (there is no idealized k-head gradient)")
        as_int(self.init_seed, "init_seed", minimum=0)
        as_real(self.init_scale, "init_scale", minimum=0, hint=" (0 gives identical heads)")
        return self
