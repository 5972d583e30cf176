"""Training the full model exactly: the official recipes on exact population gradients (DESIGN §14).

:func:`train_catformer` trains a :class:`popgrad.CatFormer` (every ``Ã^(ℓ)``
and ``W`` jointly, as the official ``single_parent.py`` / ``multi_parent.ipynb``
/ ``many_graphs.ipynb`` do) with one of the official optimizers
(:mod:`popgrad.train.optim`) on the exact population gradient
(:func:`popgrad.catformer_loss_and_grad`) in place of a sampled batch::

    θ_0 = init;   for t = 0 … steps-1:   g_t = ∇L(θ_t),   θ_{t+1} = rule(θ_t, g_t, lr_t)

so a run is a deterministic function of its settings: two runs are
bit-identical, for any thread count, with or without ``client=``.

The loop is the one every trainer shares (:func:`popgrad.train.loop.run_schedule`)
with :class:`CatFormerScheme`: the checkpoint holds the parameters and the
optimizer state (Adam's moments; the step count is the step counter), so a
resumed run is bit-identical to an uninterrupted one, and divergence is
detected as for the reduced trainers (a non-finite loss or parameter, or
``divergence_patience`` steps of rising loss or of loss more than 1 % above
its lowest value).

Starts (``init``): ``"zero"`` (the single-parent recipe), ``("normal", scale,
seed)`` (every ``Ã`` entry ``scale·N(0,1)`` from ``numpy.random.default_rng(seed)``,
``W = 0``: the two-parent recipe with ``scale = 1e-4``, :meth:`popgrad.CatFormer.init`)
or a :class:`popgrad.CatFormerParams`.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .._io import atomic_savez
from .._validation import ArgumentTypeError, as_int, as_real
from ..engine.catformer import catformer_loss_and_grad
from ..model.catformer import CatFormer, CatFormerParams, check_task_model
from .loop import StepValues, run_schedule, start_state
from .optim import LR_SCHEDULES, OPTIMIZERS, Optimizer, OptimizerState
from .trajectory import _as_path, _open_npz

__all__ = ["CatFormerTrainConfig", "CatFormerTrajectory", "CatFormerScheme", "train_catformer", "initial_params"]


@dataclass(frozen=True)
class CatFormerTrainConfig:
    """Settings of one :func:`train_catformer` run (everything a checkpoint must match).

    ``init`` is ``"zero"``, ``"normal"`` (with ``init_scale``, ``init_seed``) or ``"given"``
    (``init_fingerprint`` is then the SHA-256 of the given arrays); ``record_every`` is resolved.
    """

    S: int = 2
    T: int = 2
    heads: tuple = (1, 1)
    readout: str = "softmax"
    steps: int = 1
    optimizer: str = "sgd"
    lr: float = 1.0
    lr_schedule: str = "cosine"
    weight_decay: float = 0.0
    init: str = "zero"
    init_scale: float = 0.0
    init_seed: int = 0
    init_fingerprint: str = ""
    record_every: int = 1
    eps: float | None = None
    divergence_patience: int = 100

    def optimizer_rule(self) -> Optimizer:
        """The validated :class:`popgrad.train.optim.Optimizer` of this run."""
        return Optimizer(self.optimizer, lr=self.lr, lr_schedule=self.lr_schedule, steps=self.steps,
                         weight_decay=self.weight_decay)


@dataclass(frozen=True)
class CatFormerTrajectory:
    """What a :func:`train_catformer` run recorded.

    Record ``r`` holds the parameters at step ``step[r]`` (before that step's
    update; the last record, step ``steps``, is after the last update) and the
    exact population loss there.

    Attributes
    ----------
    step : int64 (n,)
        Recorded steps: ``0``, every ``record_every``, and ``steps``.
    loss : float64 (n,)
        Exact population loss ``L(θ_step)`` (cross entropy for the softmax readout).
    grad_norm : float64 (n,)
        ``‖∇L(θ_step)‖`` over every parameter array (Frobenius, stacked).
    lr : float64 (n,)
        ``lr_step`` of the schedule.
    A : tuple of ndarray
        ``A[ℓ]`` is ``(n, m_ℓ, d_{ℓ-1}, d_{ℓ-1})``: layer ``ℓ+1``'s ``Ã`` at every record.
    W : float64 (n, d_L, S)
    final : CatFormerParams
        The parameters after the last update (at the stop, for a diverged run).
    status : str
        ``"completed"`` or ``"diverged"``.
    message : str
        Why the run stopped (empty when completed).
    config : CatFormerTrainConfig
    """

    step: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray
    lr: np.ndarray
    A: tuple
    W: np.ndarray
    final: CatFormerParams
    status: str
    message: str
    config: CatFormerTrainConfig = field(default_factory=CatFormerTrainConfig)

    @property
    def model(self) -> CatFormer:
        """The :class:`popgrad.CatFormer` that was trained."""
        c = self.config
        return CatFormer(c.S, c.T, heads=tuple(c.heads), readout=c.readout)

    def params(self, r: int) -> CatFormerParams:
        """The recorded parameters of record ``r`` (negative ``r`` counts from the end)."""
        return CatFormerParams([a[r].copy() for a in self.A], self.W[r].copy())

    def save(self, path) -> None:
        """Write the trajectory as an ``.npz`` archive atomically (arrays, final parameters, status, config)."""
        arrays = {"step": self.step, "loss": self.loss, "grad_norm": self.grad_norm, "lr": self.lr, "W": self.W,
                  "final_W": self.final.W}
        for i, a in enumerate(self.A):
            arrays[f"A_{i + 1}"] = a
            arrays[f"final_A_{i + 1}"] = self.final.A[i]
        atomic_savez(path, **arrays, status=np.array(self.status), message=np.array(self.message),
                     config_json=np.array(json.dumps(asdict(self.config))), kind=np.array("catformer"))

    @classmethod
    def load(cls, path) -> "CatFormerTrajectory":
        """Read a file written by :meth:`save`; ``ValueError`` naming the file otherwise."""
        path = _as_path(path, "path")

        def bad(what):
            return ValueError(f"{path} is not a popgrad catformer trajectory file: {what}")

        with _open_npz(path, bad) as z:
            try:
                if str(z["kind"]) != "catformer":
                    raise bad(f"kind is {str(z['kind'])!r}")
                cfg = json.loads(str(z["config_json"]))
                cfg["heads"] = tuple(cfg["heads"])
                cfg = CatFormerTrainConfig(**cfg)
                L = len(cfg.heads)
                A = tuple(np.array(z[f"A_{i + 1}"]) for i in range(L))
                final = CatFormerParams([np.array(z[f"final_A_{i + 1}"]) for i in range(L)], np.array(z["final_W"]))
                out = cls(np.array(z["step"]), np.array(z["loss"]), np.array(z["grad_norm"]), np.array(z["lr"]), A,
                          np.array(z["W"]), final, str(z["status"]), str(z["message"]), cfg)
            except KeyError as exc:
                raise bad(f"no entry {exc}") from None
            except (TypeError, ValueError, AttributeError) as exc:
                raise bad(f"unreadable entry ({exc})") from None
        n = len(out.step)
        if any(len(v) != n for v in (out.loss, out.grad_norm, out.lr, out.W, *out.A)):
            raise bad("inconsistent record lengths")
        return out


def _names(model: CatFormer):
    return [f"A_{i + 1}" for i in range(model.n_layers)] + ["W"]


class CatFormerScheme:
    """The full model's parameters and optimizer state for :func:`popgrad.train.loop.run_schedule`.

    Arrays (a checkpoint holds them all): ``A_1 … A_L``, ``W``, and for Adam
    the moments ``mu_<name>``, ``nu_<name>`` of each; the optimizer's count is
    the step counter ``t``. The update is :meth:`Optimizer.step` of step
    ``t`` on the step's exact gradients; the result a :class:`CatFormerTrajectory`.
    """

    hint = "lower lr"

    def __init__(self, task, model: CatFormer, cfg: CatFormerTrainConfig, start: CatFormerParams | None = None):
        self.task, self.model, self.config = task, model, cfg
        self.rule = cfg.optimizer_rule()
        self.total = cfg.steps
        self.patience = cfg.divergence_patience
        self.names = _names(model)
        self.start = start
        a_shapes, w_shape = model.shapes()
        self.shapes = dict(zip(self.names, [*a_shapes, w_shape]))

    def should_record(self, t: int) -> bool:
        return t == 0 or t == self.total or t % self.config.record_every == 0

    def stage_of(self, t: int) -> int:
        return 0

    def array_specs(self) -> dict:
        specs = dict(self.shapes)
        if self.rule.is_adam:
            for kind in ("mu", "nu"):
                specs.update({f"{kind}_{n}": s for n, s in self.shapes.items()})
        return specs

    def initial_arrays(self) -> dict:
        start = self.start if self.start is not None else self.model.zeros()
        arrays = dict(zip(self.names, [a.copy() for a in (*start.A, start.W)]))
        state = self.rule.init([arrays[n] for n in self.names])
        for kind, moments in (("mu", state.mu), ("nu", state.nu)):
            arrays.update({f"{kind}_{n}": m for n, m in zip(self.names, moments)})
        return arrays

    def record_specs(self, n: int) -> dict:
        f = np.float64
        specs = {"step": ((n,), np.int64), "loss": ((n,), f), "grad_norm": ((n,), f), "lr": ((n,), f)}
        specs.update({name: ((n, *s), f) for name, s in self.shapes.items()})
        return specs

    def params_of(self, arrays) -> CatFormerParams:
        return CatFormerParams([arrays[n] for n in self.names[:-1]], arrays["W"])

    def record(self, state, step, t: int, stage: int):
        gnorm = math.sqrt(sum(float(np.sum(g * g)) for g in step.grads))
        out = [("step", t), ("loss", step.loss), ("grad_norm", gnorm), ("lr", self.rule.lr_at(t))]
        out += [(n, state.arrays[n].copy()) for n in self.names]
        return out

    def update(self, state, step, t: int) -> None:
        a = state.arrays
        opt_state = OptimizerState(t, tuple(a[f"mu_{n}"] for n in self.names) if self.rule.is_adam else (),
                                   tuple(a[f"nu_{n}"] for n in self.names) if self.rule.is_adam else ())
        new, opt_state = self.rule.step(t, [a[n] for n in self.names], step.grads, opt_state)
        a.update(zip(self.names, new))
        if self.rule.is_adam:
            a.update({f"mu_{n}": m for n, m in zip(self.names, opt_state.mu)})
            a.update({f"nu_{n}": v for n, v in zip(self.names, opt_state.nu)})

    def result(self, state) -> CatFormerTrajectory:
        rec = state.to_arrays()
        final = self.params_of({n: state.arrays[n].copy() for n in self.names})
        return CatFormerTrajectory(rec["step"], rec["loss"], rec["grad_norm"], rec["lr"],
                                   tuple(rec[n] for n in self.names[:-1]), rec["W"], final,
                                   state.status, state.message, self.config)


def initial_params(model: CatFormer, init) -> tuple:
    """The start ``init`` names, validated: ``(CatFormerParams, kind, scale, seed, fingerprint)``.

    ``init`` is ``"zero"``, ``("normal", scale, seed)`` or a :class:`popgrad.CatFormerParams`.
    """
    if isinstance(init, CatFormerParams):
        p = model.check_params(init)
        p = CatFormerParams([a.copy() for a in p.A], p.W.copy())
        h = hashlib.sha256()
        for a in (*p.A, p.W):
            h.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
        return p, "given", 0.0, 0, h.hexdigest()
    if isinstance(init, str):
        if init != "zero":
            raise ValueError(f"init must be 'zero', ('normal', scale, seed) or a popgrad.CatFormerParams, got {init!r}")
        return model.zeros(), "zero", 0.0, 0, ""
    if isinstance(init, (tuple, list)) and len(init) == 3 and init[0] == "normal":
        scale = as_real(init[1], "init scale", minimum=0)
        seed = as_int(init[2], "init seed", minimum=0)
        return model.init(scale, seed), "normal", scale, seed, ""
    raise ArgumentTypeError(f"init must be 'zero', ('normal', scale, seed) or a popgrad.CatFormerParams, "
                            f"got {init!r}")


def train_catformer(
    task,
    model: CatFormer,
    steps: int,
    optimizer: str = "sgd",
    lr: float = 1.0,
    lr_schedule: str = "cosine",
    weight_decay: float = 0.0,
    init="zero",
    record_every: int | None = None,
    client=None,
    *,
    eps: float | None = None,
    divergence_patience: int = 100,
    checkpoint_path=None,
    checkpoint_every: int = 0,
    resume: bool = False,
    progress: bool = False,
) -> CatFormerTrajectory:
    """Train the disentangled transformer on exact population gradients with an official optimizer.

    Parameters
    ----------
    task : Task or MultiParentTask
        Enumerable (``task.check_size()``).
    model : CatFormer
        Same ``S``, ``T`` as the task.
    steps : int
        Number of updates (``>= 1``); also the cosine schedule's ``decay_steps``.
    optimizer : {"sgd", "gd", "adam", "adamw"}
        :mod:`popgrad.train.optim` (``"sgd"``/``"gd"``: ``g ← ∇L + wd·θ``, ``θ ← θ − lr_t g``;
        ``"adamw"``: ``optax.adamw``; ``"adam"``: ``optax.adam`` of ``∇L + wd·θ``).
    lr : float
        Peak learning rate ``> 0``.
    lr_schedule : {"cosine", "constant"}
        ``optax.cosine_decay_schedule(lr, steps)`` or constant.
    weight_decay : float
        ``wd >= 0``.
    init : "zero", ("normal", scale, seed) or CatFormerParams
        The start (module docstring).
    record_every : int, optional
        Record every this many steps (and steps ``0`` and ``steps``); default ``max(1, steps // 128)``
        (the official ``n_save = 128``).
    client : dask.distributed.Client, optional
        Split every exact enumeration over its workers (bit-identical to ``None``).
    eps : float, optional
        Loss perturbation (default: ``0`` for the softmax readout, ``T_eff**-0.5`` for the linear one).
    divergence_patience : int
        Steps of rising loss (or of loss > 1 % above its lowest) before the run stops as diverged.
    checkpoint_path, checkpoint_every, resume, progress
        As in :func:`popgrad.train_two_stage` (the checkpoint also holds Adam's moments).

    Returns
    -------
    CatFormerTrajectory
        ``final``, ``step``, ``loss``, ``grad_norm``, ``lr``, recorded ``A`` and ``W``, ``status``.
    """
    check_task_model(task, model, None)
    steps = as_int(steps, "steps", minimum=1)
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if not isinstance(lr_schedule, str) or lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {lr_schedule!r}")
    record_every = max(1, steps // 128) if record_every is None else as_int(record_every, "record_every", minimum=1)
    divergence_patience = as_int(divergence_patience, "divergence_patience", minimum=1)
    if eps is not None:
        eps = as_real(eps, "eps", minimum=0)
    start, kind, scale, seed, fingerprint = initial_params(model, init)
    cfg = CatFormerTrainConfig(
        S=model.S, T=model.T, heads=tuple(model.heads), readout=model.readout, steps=steps, optimizer=optimizer,
        lr=as_real(lr, "lr", minimum=0, strict=True), lr_schedule=lr_schedule,
        weight_decay=as_real(weight_decay, "weight_decay", minimum=0), init=kind, init_scale=scale, init_seed=seed,
        init_fingerprint=fingerprint, record_every=record_every, eps=eps, divergence_patience=divergence_patience,
    )
    task.check_size()
    scheme = CatFormerScheme(task, model, cfg, start)
    state = start_state(task, scheme, checkpoint_path, checkpoint_every, resume)

    def evaluate(t, stage, record) -> StepValues:
        res = catformer_loss_and_grad(task, model, scheme.params_of(state.arrays), eps, client=client)
        return StepValues(res.loss, None, None, float("nan"), True, grads=(*res.dA, res.dW))

    return run_schedule(task, cfg, state, evaluate, checkpoint_path=checkpoint_path,
                        checkpoint_every=checkpoint_every, progress=progress, scheme=scheme)
