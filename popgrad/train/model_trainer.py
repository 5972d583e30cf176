"""One trainer for every :class:`popgrad.Model`: :func:`train_model` (DESIGN §26).

A run is a schedule of *stages* over the parameter names (:class:`Stage`): stage ``s`` steps the
parameters ``stages[s].names`` for ``stages[s].steps`` updates with its own optimizer (an optax-style
rule of :mod:`popgrad.train.optim`, learning rate ``stages[s].lr`` or ``config.lr``, its schedule over
the stage's steps, a fresh state at the stage's start); the other parameters stay frozen. One stage
over every name is the official full-model recipe; Algorithm 1 (DESIGN §8) is two::

    stages = (Stage(("A1",), tau1, lr1), Stage(("A2",), tau2, lr2))      # Stage 1 steps A1, Stage 2 A2

:func:`algorithm1_stages` builds them in the paper's natural units. The gradient of a step is one of
the *gradient sources*:

* ``"exact"`` -- the population gradient of :func:`popgrad.loss_and_grad` (the model's engine: the fast
  ones or the generic engine; ``client=`` splits it over Dask workers, bit-identical);
* ``"sampled"`` -- a fresh batch at every step (``batch_size`` draws of ``task.sample`` with seed
  ``SeedSequence([sample_seed, t])``, soft labels ``y``) through the same rows call with ``w = y / n``;
  a recorded loss is the batch estimate with its standard error;
* ``"field"``, ``"idealized"`` -- the reduced single-parent model's Stage 1 only (a stage stepping
  ``A1`` alone at ``A2 = β0·I``): the exact first-order field (:func:`popgrad.stage1_field`, DESIGN §12)
  or Knowl 3's idealized gradient (DESIGN §5); the other stages use the exact gradient.

The loop is the one every trainer shares (:func:`popgrad.train.loop.run_schedule`): divergence, records,
checkpoints holding the parameters and every stage's optimizer state, so a resumed run is bit-identical
to an uninterrupted one. The result is a :class:`ModelTrajectory`.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import NamedTuple

import numpy as np

from .._validation import ArgumentTypeError, as_int, as_real
from ..engine.front import _exact, rows_loss_and_grad, validate
from ..engine.sampled import estimate
from ..engine.table import prepare_table
from ..model.protocol import check_params, check_task_and_model, model_eps, model_name
from ..model.reduced_model import ReducedModel
from .loop import StepValues, run_schedule, start_state
from .optim import LR_SCHEDULES, OPTIMIZERS, GradientTransformationLike, Optimizer, apply_updates, flatten_state, \
    unflatten_state
from .trajectory import Monotonicity

__all__ = ["Stage", "ModelTrainConfig", "ModelTrajectory", "ModelScheme", "train_model", "algorithm1_stages",
           "GRADIENTS"]

#: The gradient sources of :func:`train_model`.
GRADIENTS = ("exact", "sampled", "field", "idealized")


class Stage(NamedTuple):
    """One stage of a schedule: the parameters it steps, its number of updates, its learning rate.

    Attributes
    ----------
    names : tuple of str
        Parameter names (of ``model.param_shapes()``) this stage updates; the others stay frozen.
    steps : int
        Updates in this stage (``>= 1``).
    lr : float or None
        This stage's peak learning rate (``None``: ``config.lr``).
    """

    names: tuple
    steps: int
    lr: float | None = None


def algorithm1_stages(task, tau1: int, tau2: int, lr1: float, lr2: float, beta0: float) -> tuple:
    """Algorithm 1 (DESIGN §8) as two stages over the reduced model's names, learning rates in natural units.

    Stage 1 steps ``A1`` for ``tau1`` updates with ``η1 = lr1 · S · T / β0`` (the Stage-1 gradient is
    ``O(β0 / (S T))``), Stage 2 steps ``A2`` for ``tau2`` updates with ``η2 = lr2 · S`` (the step sizes of
    :class:`popgrad.TrainConfig`); with ``optimizer="gd"`` and ``lr_schedule="constant"`` this is the paper's
    two-stage gradient descent, bit for bit :func:`popgrad.train_two_stage`'s.
    """
    beta0 = as_real(beta0, "beta0", minimum=0, strict=True)
    return (Stage(("A1",), as_int(tau1, "tau1", minimum=1), as_real(lr1, "lr1", minimum=0, strict=True)
                  * task.S * task.T / beta0),
            Stage(("A2",), as_int(tau2, "tau2", minimum=1), as_real(lr2, "lr2", minimum=0, strict=True) * task.S))


def _as_stages(stages, steps):
    if stages is None:
        return None
    if isinstance(stages, (str, bytes)) or not hasattr(stages, "__len__") or len(stages) < 1:
        raise ArgumentTypeError(f"stages must be a non-empty tuple of popgrad.train.model_trainer.Stage(names, steps, "
                                f"lr), got {stages!r}")
    out = []
    for i, st in enumerate(stages):
        if not isinstance(st, (tuple, list)) or len(st) not in (2, 3):
            raise ArgumentTypeError(f"stages[{i}] must be a Stage(names, steps, lr=None), got {st!r}")
        names, n = st[0], st[1]
        lr = st[2] if len(st) == 3 else None
        if isinstance(names, str):
            names = (names,)
        if not names or not all(isinstance(x, str) for x in names):
            raise ValueError(f"stages[{i}].names must be a non-empty tuple of parameter names, got {names!r}")
        out.append(Stage(tuple(names), as_int(n, f"stages[{i}].steps", minimum=1),
                         None if lr is None else as_real(lr, f"stages[{i}].lr", minimum=0, strict=True)))
    total = sum(s.steps for s in out)
    if total != steps:
        raise ValueError(f"the stages take {total} updates in all but steps = {steps}: pass steps = {total} "
                         "(the sum of the stages' steps)")
    return tuple(out)


@dataclass(frozen=True)
class ModelTrainConfig:
    """Settings of one :func:`train_model` run, validated where it is built (everything a checkpoint must match).

    Attributes
    ----------
    steps : int
        Updates in all (``>= 1``).
    optimizer : {"sgd", "gd", "adam", "adamw"} or an optax-style object
        The rule of every stage (:mod:`popgrad.train.optim`; an object: ``lr``, ``lr_schedule``,
        ``weight_decay`` are then part of it).
    lr, lr_schedule, weight_decay
        The named rule's settings (``lr_schedule`` ``"constant"`` or ``"cosine"`` over each stage's steps).
    stages : tuple of Stage, optional
        The schedule over the parameter names; ``None``: one stage stepping every parameter.
    gradient : {"exact", "sampled", "field", "idealized"}
        The gradient source (module docstring).
    batch_size, sample_seed : int
        The sampled gradient's batch (default 1024) and seed (default 0).
    eps : float, optional
        Loss perturbation; default the model's (``model.default_eps(task)``, else ``task.default_eps``).
    record_every : int, optional
        Record every this many steps (and the first and last); default ``max(1, steps // 128)``.
    divergence_patience : int
        Steps in a row above the stage's starting loss before the run stops as diverged.
    init : {"normal", "zero", "given"}
        ``model.init(init_scale, init_seed)``, all zeros, or given parameters (``init_fingerprint``: the
        SHA-256 of the given arrays).
    """

    steps: int = 1
    optimizer: object = "sgd"
    lr: float = 1.0
    lr_schedule: str = "constant"
    weight_decay: float = 0.0
    stages: tuple | None = None
    gradient: str = "exact"
    batch_size: int | None = None
    sample_seed: int | None = None
    eps: float | None = None
    record_every: int | None = None
    divergence_patience: int = 100
    init: str = "normal"
    init_scale: float = 1.0
    init_seed: int = 0
    init_fingerprint: str = ""

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        put("steps", as_int(self.steps, "steps", minimum=1))
        opt = self.optimizer
        if isinstance(opt, str):
            if opt not in OPTIMIZERS:
                raise ValueError(f"optimizer must be one of {OPTIMIZERS} or an object with init and update "
                                 f"methods (popgrad.train.optim.adamw(...), ...), got {opt!r}")
        elif not isinstance(opt, GradientTransformationLike):
            raise ArgumentTypeError(f"optimizer must be one of {OPTIMIZERS} or an object with init and update "
                                    f"methods, got {type(opt).__name__}")
        if not isinstance(self.lr_schedule, str) or self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        put("lr", as_real(self.lr, "lr", minimum=0, strict=True))
        put("weight_decay", as_real(self.weight_decay, "weight_decay", minimum=0))
        put("stages", _as_stages(self.stages, self.steps))
        if not isinstance(self.gradient, str) or self.gradient not in GRADIENTS:
            raise ValueError(f"gradient must be one of {GRADIENTS}, got {self.gradient!r}")
        if self.gradient == "sampled":
            put("batch_size", 1024 if self.batch_size is None else as_int(self.batch_size, "batch_size", minimum=1))
            put("sample_seed", 0 if self.sample_seed is None else as_int(self.sample_seed, "sample_seed", minimum=0))
        else:
            for name in ("batch_size", "sample_seed"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is only used with gradient='sampled': drop it or set gradient='sampled'")
        if self.eps is not None:
            put("eps", as_real(self.eps, "eps", minimum=0))
        put("record_every", max(1, self.steps // 128) if self.record_every is None
            else as_int(self.record_every, "record_every", minimum=1))
        put("divergence_patience", as_int(self.divergence_patience, "divergence_patience", minimum=1))
        if self.init not in ("zero", "normal", "given"):
            raise ValueError(f"init must be 'zero', 'normal' or 'given', got {self.init!r}")
        put("init_scale", as_real(self.init_scale, "init_scale", minimum=0))
        put("init_seed", as_int(self.init_seed, "init_seed", minimum=0))

    def stage_list(self, names) -> tuple:
        """The stages, ``stages`` or one stage over ``names`` (every parameter)."""
        return self.stages if self.stages is not None else (Stage(tuple(names), self.steps, None),)

    def rule(self, stage: Stage):
        """The optimizer of ``stage``: the named rule at its learning rate and over its steps, or the object."""
        if not isinstance(self.optimizer, str):
            return self.optimizer
        return Optimizer(self.optimizer, lr=self.lr if stage.lr is None else stage.lr, lr_schedule=self.lr_schedule,
                         steps=stage.steps, weight_decay=self.weight_decay)

    def to_dict(self) -> dict:
        """The settings as JSON-able values (an optimizer object by its ``name``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["optimizer"] = _optimizer_name(self.optimizer)
        out["stages"] = None if self.stages is None else [[list(s.names), s.steps, s.lr] for s in self.stages]
        return out

    @classmethod
    def from_dict(cls, d) -> "ModelTrainConfig":
        """The config :meth:`to_dict` wrote; an optimizer object comes back as its name (a description only)."""
        d = {k: v for k, v in dict(d).items() if k in {f.name for f in fields(cls)}}
        if d.get("stages") is not None:
            d["stages"] = tuple(Stage(tuple(n), int(k), lr) for n, k, lr in d["stages"])
        name = d.get("optimizer", "sgd")
        if name not in OPTIMIZERS:
            d["optimizer"] = "sgd"
        out = cls(**d)
        if name not in OPTIMIZERS:
            object.__setattr__(out, "optimizer", name)
        return out


@dataclass(frozen=True)
class ModelTrajectory:
    """What a :func:`train_model` run recorded.

    Record ``r`` holds the parameters at step ``step[r]`` (before that step's update; the last record,
    step ``steps``, after the last update) and the loss there.

    Attributes
    ----------
    step, stage : int64 (n,)
        Recorded steps (``0``, every ``record_every``, the last of every stage and ``steps``) and their stage.
    loss, loss_se : float64 (n,)
        The exact population loss (sampled: the batch estimate and its standard error; NaN when not computed).
    grad_norm : float64 (n,)
        ``‖g‖`` of the step's gradient over the parameters its stage steps.
    lr : float64 (n,)
        The stage's learning rate at the step (NaN for an optimizer object without ``learning_rate``).
    params : dict
        ``name -> (n, *shape)`` recorded parameters.
    final : dict
        The parameters after the last update (at the stop, for a diverged run).
    status, message : str
        ``"completed"`` or ``"diverged"``, and why it stopped.
    config : ModelTrainConfig
    monotonicity : Monotonicity
    model : str
        The model's text (:func:`popgrad.model.protocol.model_name`).
    """

    step: np.ndarray
    stage: np.ndarray
    loss: np.ndarray
    loss_se: np.ndarray
    grad_norm: np.ndarray
    lr: np.ndarray
    params: dict
    final: dict
    status: str
    message: str
    config: ModelTrainConfig = field(default_factory=ModelTrainConfig)
    monotonicity: Monotonicity = Monotonicity()
    model: str = ""

    def params_at(self, r: int) -> dict:
        """The recorded parameters of record ``r`` (negative ``r`` counts from the end)."""
        return {k: v[r].copy() for k, v in self.params.items()}

    def __str__(self):
        if not len(self.step):
            return f"ModelTrajectory({self.model}: no records, {self.status})"
        return (f"ModelTrajectory({self.model}: {len(self.step)} records, steps 0..{int(self.step[-1])}, "
                f"{self.status}; loss {self.loss[0]:.6g} -> {self.loss[-1]:.6g})")

    def save(self, path) -> None:
        """Write the trajectory as an ``.npz`` archive atomically (records, final parameters, status, config)."""
        from .._io import atomic_savez

        arrays = {k: getattr(self, k) for k in ("step", "stage", "loss", "loss_se", "grad_norm", "lr")}
        arrays.update({f"p_{k}": v for k, v in self.params.items()})
        arrays.update({f"final_{k}": v for k, v in self.final.items()})
        atomic_savez(path, **arrays, kind=np.array("model"), status=np.array(self.status),
                     message=np.array(self.message), model=np.array(self.model),
                     names_json=np.array(json.dumps(list(self.params))),
                     config_json=np.array(json.dumps(self.config.to_dict())),
                     monotonicity_json=np.array(json.dumps(self.monotonicity.to_json())))

    @classmethod
    def load(cls, path) -> "ModelTrajectory":
        """Read a file written by :meth:`save`; ``ValueError`` naming the file otherwise."""
        from .trajectory import _as_path, _open_npz

        path = _as_path(path, "path")

        def bad(what):
            return ValueError(f"{path} is not a popgrad model trajectory file: {what}")

        with _open_npz(path, bad) as z:
            try:
                if str(z["kind"]) != "model":
                    raise bad(f"kind is {str(z['kind'])!r}")
                names = json.loads(str(z["names_json"]))
                rec = {k: np.array(z[k]) for k in ("step", "stage", "loss", "loss_se", "grad_norm", "lr")}
                out = cls(**rec, params={k: np.array(z[f"p_{k}"]) for k in names},
                          final={k: np.array(z[f"final_{k}"]) for k in names}, status=str(z["status"]),
                          message=str(z["message"]),
                          config=ModelTrainConfig.from_dict(json.loads(str(z["config_json"]))),
                          monotonicity=Monotonicity.from_json(json.loads(str(z["monotonicity_json"]))),
                          model=str(z["model"]))
            except KeyError as exc:
                raise bad(f"no entry {exc}") from None
            except (TypeError, ValueError, AttributeError) as exc:
                raise bad(f"unreadable entry ({exc})") from None
        return out


class ModelScheme:
    """The :class:`popgrad.train.loop.Scheme` of :func:`train_model`: parameters under the model's names,
    stage ``s``'s optimizer state under ``opt<s>.<path>``."""

    def __init__(self, task, model, cfg: ModelTrainConfig, start: dict):
        self.task, self.model, self.config = task, model, cfg
        self.shapes = {k: tuple(int(d) for d in s) for k, s in model.param_shapes().items()}
        self.names = tuple(self.shapes)
        self.stages = cfg.stage_list(self.names)
        for i, st in enumerate(self.stages):
            bad = [n for n in st.names if n not in self.shapes]
            if bad:
                raise ValueError(f"stages[{i}] names {', '.join(map(repr, bad))}, not a parameter of "
                                 f"{model_name(model)} (its parameters: {', '.join(self.names)})")
        self.bounds = np.cumsum([0] + [s.steps for s in self.stages])
        self._bounds = [int(b) for b in self.bounds]
        self._inner = set(self._bounds[1:-1])
        self.total = cfg.steps
        self.patience = cfg.divergence_patience
        self.hint = "lower lr" if isinstance(cfg.optimizer, str) else "lower the optimizer's learning rate"
        self.rules = [cfg.rule(st) for st in self.stages]
        self.start = start
        self._like, self._specs = [], {}
        for s, (st, rule) in enumerate(zip(self.stages, self.rules)):
            like = rule.init({n: np.zeros(self.shapes[n]) for n in st.names})
            self._like.append(like)
            self._specs.update({f"opt{s}.{k}": (v.shape, v.dtype) for k, v in flatten_state(like).items()})

    def config_dict(self) -> dict:
        return {**self.config.to_dict(), "model": model_name(self.model),
                "param_shapes": {k: list(v) for k, v in self.shapes.items()}}

    def config_defaults(self) -> dict:
        return {f.name: f.default for f in fields(self.config)}

    def param_names(self) -> tuple:
        return self.names

    def initial_arrays(self) -> dict:
        out = {n: np.array(self.start[n], dtype=np.float64) for n in self.names}
        for s, st in enumerate(self.stages):
            state = flatten_state(self.rules[s].init({n: out[n] for n in st.names}))
            out.update({f"opt{s}.{k}": np.array(v) for k, v in state.items()})
        return out

    def array_specs(self) -> dict:
        return {**{n: (s, np.float64) for n, s in self.shapes.items()}, **self._specs}

    def stage_of(self, t: int) -> int:
        """The stage step ``t`` is recorded in: stage ``s`` spans the evaluations ``bounds[s] … bounds[s+1]``
        (its last evaluation, after its last update, ends it: the end-of-stage rule reads it)."""
        return max(0, bisect.bisect_left(self._bounds, t) - 1)

    def update_stage(self, t: int) -> int:
        """The stage whose optimizer applies the update of step ``t`` (``bounds[s] <= t < bounds[s+1]``)."""
        return min(bisect.bisect_right(self._bounds, t) - 1, len(self.stages) - 1)

    def should_record(self, t: int) -> bool:
        """The first and last step of each stage (:meth:`stage_of`), and every ``record_every``."""
        return t == 0 or t == self.total or t % self.config.record_every == 0 or t in self._inner \
            or t - 1 in self._inner

    def record_specs(self, n: int) -> dict:
        f = np.float64
        specs = {"step": ((n,), np.int64), "stage": ((n,), np.int64), "loss": ((n,), f), "loss_se": ((n,), f),
                 "grad_norm": ((n,), f), "lr": ((n,), f)}
        specs.update({f"p_{name}": ((n, *s), f) for name, s in self.shapes.items()})
        return specs

    def _lr(self, t, stage):
        fn = getattr(self.rules[stage], "learning_rate", None)
        return float(fn(t - int(self.bounds[stage]))) if callable(fn) else float("nan")

    def record(self, arrays, step, t: int, stage: int):
        stage_u = self.update_stage(t)
        names = self.stages[stage_u].names
        gnorm = math.sqrt(sum(float(np.sum(np.asarray(step.grads[n]) ** 2)) for n in names if n in step.grads))
        out = [("step", t), ("stage", stage), ("loss", step.loss), ("loss_se", step.loss_se), ("grad_norm", gnorm),
               ("lr", self._lr(t, stage_u))]
        return out + [(f"p_{n}", arrays[n].copy()) for n in self.names]

    def update(self, arrays, grads, t: int) -> dict:
        s = self.update_stage(t)
        names = self.stages[s].names
        prefix = f"opt{s}."
        params = {n: arrays[n] for n in names}
        state = unflatten_state({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}, self._like[s])
        updates, state = self.rules[s].update({n: grads[n] for n in names}, state, params)
        new = apply_updates(params, updates)
        flat = {f"{prefix}{k}": np.asarray(v) for k, v in flatten_state(state).items()}
        if {k: (v.shape, v.dtype) for k, v in flat.items()} != {k: v for k, v in self._specs.items()
                                                              if k.startswith(prefix)}:
            raise ValueError(f"optimizer {_optimizer_name(self.rules[s])}: update returned a state whose layout "
                             "differs from init's (same keys, shapes and dtypes needed)")
        out = dict(arrays)
        out.update({n: np.asarray(new[n], dtype=np.float64) for n in names})
        out.update(flat)
        return out

    def result(self, state) -> ModelTrajectory:
        rec = state.to_arrays()
        final = {n: state.arrays[n].copy() for n in self.names}
        return ModelTrajectory(rec["step"], rec["stage"], rec["loss"], rec["loss_se"], rec["grad_norm"], rec["lr"],
                               {n: rec[f"p_{n}"] for n in self.names}, final, state.status, state.message,
                               self.config, state.monotonicity, model_name(self.model))


def _optimizer_name(opt) -> str:
    """A rule's name as a checkpoint stores it (a name, or an object's ``name`` attribute or its class)."""
    if isinstance(opt, str):
        return opt
    return str(getattr(opt, "name", None) or f"{type(opt).__module__}.{type(opt).__qualname__}")


def _fingerprint(params) -> str:
    h = hashlib.sha256()
    for k in sorted(params):
        h.update(k.encode())
        h.update(np.ascontiguousarray(params[k], dtype=np.float64).tobytes())
    return h.hexdigest()


def _start(model, cfg, init):
    """``(start params, init fields)`` from ``init`` (None: the config's), validated."""
    if init is None:
        if cfg.init == "given":
            raise ValueError("config.init is 'given': pass the start parameters as init={name: array, ...}")
        if cfg.init == "zero":
            return {k: np.zeros(s) for k, s in model.param_shapes().items()}, {}
        return check_params(model, model.init(cfg.init_scale, cfg.init_seed), "model.init(...)"), {}
    if isinstance(init, str):
        if init == "zero":
            return {k: np.zeros(s) for k, s in model.param_shapes().items()}, dict(init="zero")
        raise ValueError(f"init must be 'zero', a mapping name -> array or None (model.init(init_scale, init_seed)), "
                         f"got {init!r}")
    p = check_params(model, init, "init")
    p = {k: v.copy() for k, v in p.items()}
    return p, dict(init="given", init_fingerprint=_fingerprint(p))


def _field_source(task, model, cfg, scheme, start):
    """The Stage-1 ``A1`` gradient of ``gradient="field"`` / ``"idealized"`` (the reduced single-parent model)."""
    from ..task.tasks import Task

    if not (isinstance(model, ReducedModel) and model.heads == 1 and isinstance(task, Task)):
        raise ValueError(f"gradient={cfg.gradient!r} is the reduced single-parent model's Stage 1 (DESIGN §5, §12): "
                         f"{model_name(model)} on {type(task).__name__} has none; use gradient='exact' or 'sampled'")
    a1_only = [s for s, st in enumerate(scheme.stages) if tuple(st.names) == ("A1",)]
    if not a1_only:
        raise ValueError(f"gradient={cfg.gradient!r} drives a stage stepping A1 alone (Stage 1 at A2 = β0·I): add "
                         "one, e.g. stages=algorithm1_stages(...)")
    A2 = start["A2"]
    beta0 = float(A2[0, 0])
    if not (beta0 > 0 and np.array_equal(A2, beta0 * np.eye(task.S))):
        raise ValueError(f"gradient={cfg.gradient!r} is the first-order gradient at A2 = β0·I with β0 > 0, but the "
                         "start's A2 is not of that form: start from model.start(beta0)")
    if cfg.gradient == "field":
        from ..engine.field import field_grad_A1, stage1_field

        M = stage1_field(task, model_eps(task, model, cfg.eps)).M
        return set(a1_only), lambda A1: field_grad_A1(M, A1, beta0)
    from ..theory.information import has_idealized_gradient, idealized_grad_A1

    if not has_idealized_gradient(task):
        raise ValueError("gradient='idealized' needs every prior draw to have stationary probabilities > 0: use "
                         "gradient='exact' or 'field'")
    return set(a1_only), lambda A1: idealized_grad_A1(task, A1, beta0)


def _step_values(*args, **kw) -> StepValues:
    """:class:`StepValues` with the fields this loop knows (``sampled`` marks a batch estimate)."""
    return StepValues(*args, **{k: v for k, v in kw.items() if k in StepValues._fields})


def train_model(task, model, steps: int, config: ModelTrainConfig | None = None, *, init=None, client=None,
                checkpoint_path=None, checkpoint_every: int = 0, resume: bool = False, progress: bool = False,
                options=None, **overrides) -> ModelTrajectory:
    """Train any :class:`popgrad.Model` on exact (or sampled, field, idealized) gradients (module docstring).

    Parameters
    ----------
    task : Task or MultiParentTask
        Enumerable for the exact gradient (``task.check_size()``); any size for ``"sampled"``.
    model : Model
        Same ``S``, ``T`` as the task.
    steps : int
        Updates in all (``>= 1``; with ``stages``, their sum).
    config : ModelTrainConfig, optional
        Every setting at once; ``overrides`` replace some (``steps`` always wins).
    init : mapping or "zero", optional
        The start parameters (``name -> array``, e.g. ``model.start(beta0)`` of the reduced model); default
        ``model.init(init_scale, init_seed)`` (the config's).
    client : dask.distributed.Client, optional
        Split every exact enumeration over its workers (bit-identical to ``None``).
    checkpoint_path, checkpoint_every, resume, progress
        As in :func:`popgrad.train_two_stage`: the checkpoint holds the parameters and every stage's
        optimizer state, so a resumed run is bit-identical to an uninterrupted one.
    options : EngineOptions, optional
        Engine tunables.
    **overrides
        Settings of :class:`ModelTrainConfig` (``optimizer``, ``lr``, ``lr_schedule``, ``weight_decay``,
        ``stages``, ``gradient``, ``batch_size``, ``sample_seed``, ``eps``, ``record_every``,
        ``divergence_patience``, ``init_scale``, ``init_seed``).

    Returns
    -------
    ModelTrajectory

    Examples
    --------
    >>> import popgrad as pg
    >>> task = pg.Task(pg.chain(4), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=2, seed=0))
    >>> model = pg.ReducedModel(2, 4)
    >>> stages = pg.train.model_trainer.algorithm1_stages(task, 5, 5, lr1=1.0, lr2=1.0, beta0=1.0)
    >>> traj = pg.train_model(task, model, 10, init=model.start(1.0), stages=stages, optimizer="gd")
    >>> traj.status, bool(traj.loss[-1] < traj.loss[0])
    ('completed', True)
    """
    check_task_and_model(task, model)
    unknown = set(overrides) - {f.name for f in fields(ModelTrainConfig)}
    if unknown:
        raise TypeError(f"train_model got unexpected keyword argument(s) {', '.join(sorted(unknown))}: "
                        f"settings are those of ModelTrainConfig")
    if config is None:
        opt = overrides.get("optimizer", "sgd")
        if not isinstance(opt, str):
            given = [k for k in ("lr", "lr_schedule", "weight_decay") if k in overrides]
            if given:
                raise ValueError(f"{', '.join(given)}: part of the optimizer object you passed; drop "
                                 f"{'them' if len(given) > 1 else 'it'} (or pass optimizer by name)")
        cfg = ModelTrainConfig(steps=steps, **overrides)
    elif not isinstance(config, ModelTrainConfig):
        raise ArgumentTypeError(f"config must be a popgrad.ModelTrainConfig, got {type(config).__name__}")
    else:
        cfg = replace(config, steps=steps, **overrides) if (overrides or steps != config.steps) else config
    start, init_fields = _start(model, cfg, init)
    if init_fields:
        cfg = replace(cfg, **init_fields)
    p0, eps = validate(task, model, start, cfg.eps, "init")
    scheme = ModelScheme(task, model, cfg, p0)
    field_stages, field_grad = (set(), None)
    if cfg.gradient in ("field", "idealized"):
        field_stages, field_grad = _field_source(task, model, cfg, scheme, p0)
    exact_needed = cfg.gradient == "exact" or (cfg.gradient in ("field", "idealized")
                                              and any(s not in field_stages for s in range(len(scheme.stages))))
    if exact_needed:
        task.check_size()
    if cfg.gradient != "sampled" and task.enumerable:
        prepare_table(task)  # many exact steps on one task: the weight table, once (DESIGN §20)
    state = start_state(task, scheme, checkpoint_path, checkpoint_every, resume)
    params = lambda: {n: state.arrays[n] for n in scheme.names}  # noqa: E731  (the current parameters)

    if cfg.gradient == "sampled":
        def evaluate(t, stage, record) -> StepValues:
            batch = task.sample(cfg.batch_size, np.random.SeedSequence([cfg.sample_seed, t]))
            n = batch.seqs.shape[0]
            p = params()
            res = rows_loss_and_grad(model, p, batch.seqs, batch.targets / n, eps, options)
            if record:  # the batch estimate with its standard error (what the divergence rule reads)
                f = np.asarray(model.predict(p, batch.seqs), dtype=np.float64)
                y = batch.targets
                with np.errstate(divide="ignore", invalid="ignore"):
                    losses = -np.sum(np.where(y > 0, y * np.log(np.where(y > 0, f + eps, 1.0)), 0.0), axis=1)
                est = estimate(losses)
                return _step_values(est.value, res.grads, True, est.se, sampled=True)
            return StepValues(res.loss, res.grads, True) if not math.isfinite(res.loss) else \
                StepValues(math.nan, res.grads, False)
    else:
        def evaluate(t, stage, record) -> StepValues:
            p = params()
            if scheme.update_stage(t) in field_stages:
                dA1 = field_grad(p["A1"])
                loss = _exact(task, model, p, eps, False, client, options).loss if task.enumerable else math.nan
                return StepValues(loss, {"A1": dA1}, task.enumerable)
            res = _exact(task, model, p, eps, True, client, options)
            return StepValues(res.loss, res.grads)

    return run_schedule(task, scheme, state, evaluate, checkpoint_path=checkpoint_path,
                        checkpoint_every=checkpoint_every, progress=progress)
