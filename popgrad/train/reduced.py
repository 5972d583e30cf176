"""The reduced model's scheme for the shared loop: plain gradient descent on ``A1``, ``A2`` (DESIGN §8).

:class:`ReducedScheme` is what :func:`popgrad.train_two_stage` trains (Algorithm 1's two stages, or
joint); :class:`MultiHeadScheme` extends it to k heads. Parameters
``{"A1", "A2"}`` (the checkpoint holds exactly these); the update of step ``t`` is
``A1 ← A1 − η1·dA1`` for ``t < steps1``, then ``A2 ← A2 − η2·dA2`` (joint: both at every step);
the result is a :class:`popgrad.Trajectory`.

The k-head start and read-out (:func:`initial_parameters`, :func:`attention_to_slot_parents`) are
described in :mod:`popgrad.train.multihead`, which re-exports them.
"""
from __future__ import annotations

from dataclasses import asdict, fields

import numpy as np

from ..model.multihead import head_attention
from ..task.tasks import MultiParentTask
from .trajectory import Trajectory

__all__ = ["ReducedScheme", "MultiHeadScheme", "initial_parameters", "attention_to_slot_parents"]


class ReducedScheme:
    """Gradient descent on the reduced model's ``A1``, ``A2`` (a :class:`popgrad.train.loop.Scheme`).

    ``attention(A1)`` (the recorded attention-to-parent array), ``eta1`` and ``eta2`` are only needed to
    run, not to validate a checkpoint.
    """

    hint = "lower lr1/lr2"

    def __init__(self, task, cfg, attention=None, eta1=None, eta2=None, start=None):
        self.task, self.config = task, cfg
        self.attention, self.eta1, self.eta2 = attention, eta1, eta2
        self.total = cfg.steps1 + cfg.steps2
        self.patience = cfg.divergence_patience
        self.start = start

    # -- settings
    def config_dict(self) -> dict:
        return asdict(self.config)

    def config_defaults(self) -> dict:
        return {f.name: f.default for f in fields(self.config)}

    # -- arrays
    def param_names(self) -> tuple:
        return ("A1", "A2")

    def _shapes(self):
        T, S = self.task.T, self.task.S
        return (T, T), (S, S), (T,)

    def initial_arrays(self) -> dict:
        if self.start is not None:
            return {k: np.array(v, dtype=np.float64) for k, v in self.start.items()}
        T, S = self.task.T, self.task.S
        return {"A1": np.zeros((T, T)), "A2": self.config.beta0 * np.eye(S)}

    def array_specs(self) -> dict:
        shape1, shape2, _ = self._shapes()
        return {"A1": (shape1, np.float64), "A2": (shape2, np.float64)}

    # -- schedule
    def should_record(self, t: int) -> bool:
        """The first and last step of each stage, and every ``record_every``."""
        cfg = self.config
        if t in (0, cfg.steps1, self.total) or (cfg.schedule != "joint" and t == cfg.steps1 + 1):
            return True
        return t % cfg.record_every == 0

    def stage_of(self, t: int) -> int:
        if self.config.schedule == "joint":
            return 0
        return 1 if t <= self.config.steps1 else 2

    # -- records
    def record_specs(self, n: int) -> dict:
        shape1, shape2, shape_attn = self._shapes()
        f, i = np.float64, np.int64
        return {"step": ((n,), i), "stage": ((n,), i), "loss": ((n,), f), "loss_se": ((n,), f),
                "grad_norm": ((n,), f), "cosine": ((n,), f), "attn_parent": ((n, *shape_attn), f),
                "A1": ((n, *shape1), f), "A2": ((n, *shape2), f)}

    def record(self, arrays, step, t: int, stage: int):
        g = step.grads
        if stage == 1:
            gnorm = float(np.linalg.norm(g["A1"]))
        elif stage == 2:
            gnorm = float(np.linalg.norm(g["A2"]))
        else:
            gnorm = float(np.sqrt(np.sum(g["A1"]**2) + np.sum(g["A2"]**2)))
        return (
            ("step", t), ("stage", stage), ("loss", step.loss), ("loss_se", step.loss_se), ("grad_norm", gnorm),
            ("cosine", step.extra.get("cosine", float("nan"))),
            ("attn_parent", self.attention(arrays["A1"])), ("A1", arrays["A1"].copy()), ("A2", arrays["A2"].copy()),
        )

    def update(self, arrays, grads, t: int) -> dict:
        """Step ``t -> t+1`` (two-stage: ``A1`` for ``t < steps1``, then ``A2``; joint: both)."""
        out = dict(arrays)
        if self.config.schedule == "joint":
            out["A1"] = arrays["A1"] - self.eta1 * grads["A1"]
            out["A2"] = arrays["A2"] - self.eta2 * grads["A2"]
        elif t < self.config.steps1:
            out["A1"] = arrays["A1"] - self.eta1 * grads["A1"]
        else:
            out["A2"] = arrays["A2"] - self.eta2 * grads["A2"]
        return out

    def result(self, state) -> Trajectory:
        return Trajectory(**state.to_arrays(), status=state.status, message=state.message, config=self.config,
                          monotonicity=state.monotonicity)


class MultiHeadScheme(ReducedScheme):
    """The k-head model's scheme: per-head ``A1 (k, T, T)``, ``A2 (k, S, S)`` from the seeded start
    (:func:`initial_parameters`, or ``A1_init``); joint steps use ``η1 = lr1·S·T`` (module docstring)."""

    def __init__(self, task, cfg, A1_init=None):
        joint = cfg.schedule == "joint"
        super().__init__(task, cfg, lambda A1: attention_to_slot_parents(task.graph, A1),
                         cfg.lr1 * task.S * task.T if joint else cfg.eta1(task), cfg.eta2(task))
        self.A1_init = A1_init

    def _shapes(self):
        k, T, S = self.task.k, self.task.T, self.task.S
        return (k, T, T), (k, S, S), (k, T)

    def initial_arrays(self) -> dict:
        c = self.config
        A1, A2 = initial_parameters(self.task, c.beta0, c.init_seed, c.init_scale)
        if self.A1_init is not None:
            A1 = self.A1_init
        return {"A1": A1, "A2": A2}


def initial_parameters(task: MultiParentTask, beta0: float, init_seed: int, init_scale: float):
    """The deterministic symmetry-breaking start (module docstring).

    Returns
    -------
    A1 : float64 (k, T, T)
        ``init_scale · N(0, 1)`` on and below each diagonal, 0 above.
    A2 : float64 (k, S, S)
        ``β0 · I`` for every head.
    """
    k, T, S = task.k, task.T, task.S
    rng = np.random.default_rng(init_seed)
    A1 = init_scale * rng.standard_normal((k, T, T))
    A1 = np.where(np.tri(T, dtype=bool), A1, 0.0)
    A2 = np.stack([beta0 * np.eye(S) for _ in range(k)])
    return A1, A2


def attention_to_slot_parents(graph, A1) -> np.ndarray:
    """``softmax(A1^h)[i, slot_parents(h)[i]]`` per head and row, NaN where the slot has no parent.

    Returns
    -------
    float64 (k, T)
        Row ``T-1`` measures attention on the target's ``h``-th parent.
    """
    P = head_attention(A1)
    out = np.full((graph.k, graph.T), np.nan)
    for h in range(graph.k):
        par = graph.slot_parents(h)
        rows = np.flatnonzero(par >= 0)
        out[h, rows] = P[h, rows, par[rows]]
    return out
