"""Algorithm 1 of the paper: two-stage gradient descent, stepped exactly (DESIGN §8).

Stage 1: ``A1(0) = 0``, ``A2 = β0·I`` frozen, ``A1 ← A1 - η1 ∇_{A1} L`` for
``steps1`` steps. Stage 2: ``A1`` frozen at ``A1(τ1)``,
``A2 ← A2 - η2 ∇_{A2} L`` for ``steps2`` steps.

Learning rates are given in natural units so that defaults work across
``S`` and ``T``:

* Stage 1: ``η1 = lr1 · S · T / β0``. The Stage-1 gradient is
  ``-(β0/(S·T)) J(P_i) (g_i + O(T_eff^{-1/2}))`` (DESIGN §5), so one step moves
  row ``i`` of ``A1`` by about ``lr1 · J(P_i) g_i``, independent of ``β0``.
* Stage 2: ``η2 = lr2 · S``. Row ``q`` of ``∇_{A2} L`` only receives the
  sequences whose query is ``q`` (probability ``1/S``).

The Stage-1 gradient is either ``"exact"`` (enumeration,
:func:`popgrad.exact_loss_and_grad`) or ``"idealized"``
(:func:`popgrad.idealized_grad_A1`, polynomial in ``T``). Stage 2 always uses
the exact gradient. ``schedule="joint"`` instead moves both matrices at
every step (as the paper's released code does), with the same ``η1``, ``η2``.

Every computation is deterministic, so a run resumed from a checkpoint is
bit-identical to an uninterrupted one.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

from .._io import atomic_savez
from .._validation import as_int, as_real
from ..engine.api import exact_loss, exact_loss_and_grad
from ..model.reduced import first_layer_attention
from ..engine.field import field_grad_A1, stage1_field
from ..engine.sampled import SampledObjective, default_samples
from ..task.tasks import Task, TaskTooLargeError
from ..theory.information import idealized_grad_A1

__all__ = ["TrainConfig", "MultiHeadTrainConfig", "Trajectory", "train_two_stage", "attention_to_parent", "load_checkpoint",
           "CheckpointError", "DIVERGENCE_RTOL"]

#: A loss more than this far above its lowest value (relative) counts towards divergence: after
#: ``divergence_patience`` such steps in a row the run stops with status ``"diverged"``.
DIVERGENCE_RTOL = 1e-2

#: Stage-1 gradients: the exact one (enumeration), the exact first-order field (DESIGN §12, any T),
#: the idealized prediction of Knowl 3 (DESIGN §5, any T).
GRADIENTS = ("exact", "field", "idealized")
SCHEDULES = ("two-stage", "joint")
#: Stage-2 methods: ``"exact"`` (enumeration) or ``"sampled"`` (sample-average approximation on a fixed
#: sample, :mod:`popgrad.engine.sampled`; every loss it gives is an estimate with a standard error).
STAGE2_METHODS = ("exact", "sampled")
_RECORDED = ("step", "stage", "loss", "loss_se", "grad_norm", "cosine", "attn_parent", "A1", "A2")


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
        if self.gradient not in GRADIENTS:
            raise ValueError(f"gradient must be one of {GRADIENTS}, got {self.gradient!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.stage2 not in STAGE2_METHODS:
            raise ValueError(f"stage2 must be one of {STAGE2_METHODS}, got {self.stage2!r}")
        as_int(self.samples, "samples", minimum=0)
        as_int(self.sample_seed, "sample_seed", minimum=0)
        if self.stage2 == "sampled" and self.schedule != "two-stage":
            raise ValueError("stage2='sampled' needs schedule='two-stage' (A1 frozen while A2 trains on the sample)")
        if self.schedule == "joint" and self.gradient != "exact":
            raise ValueError("schedule='joint' needs gradient='exact' (the idealized gradient only covers Stage 1)")
        if self.eps is not None and not (math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"eps must be None or a finite number >= 0, got {self.eps}")
        return self


@dataclass(frozen=True)
class MultiHeadTrainConfig(TrainConfig):
    """:class:`TrainConfig` of a k-head run (:func:`popgrad.train_multi_head`): adds the seeded start.

    ``A1^h(0) = init_scale · N(0, 1)`` from ``numpy.random.default_rng(init_seed)``;
    ``gradient`` must be ``"exact"``.
    """

    init_seed: int = 0
    init_scale: float = 0.1

    def validate(self) -> "MultiHeadTrainConfig":
        super().validate()
        if self.gradient != "exact":
            raise ValueError("gradient must be 'exact' for k heads (there is no idealized k-head gradient)")
        as_int(self.init_seed, "init_seed", minimum=0)
        as_real(self.init_scale, "init_scale", minimum=0, hint=" (0 gives identical heads)")
        return self


@dataclass(frozen=True)
class Trajectory:
    """What a run of :func:`train_two_stage` recorded.

    Arrays are indexed by record ``r``; a record holds the parameters at
    global step ``step[r]`` (before the update of that step) and the exact
    quantities there.

    Attributes
    ----------
    step : int64 (n,)
        Global step: ``0..steps1`` is Stage 1 (``steps1`` is ``A1(τ1)``),
        ``steps1+1 .. steps1+steps2`` Stage 2.
    stage : int64 (n,)
        1 or 2 (``schedule='joint'``: 0).
    loss : float64 (n,)
        Population loss: exact, or in Stage 2 with ``config.stage2 == "sampled"`` the
        sample-average estimate (its standard error in ``loss_se``); NaN where
        neither was computed (Stage 1 beyond enumeration).
    loss_se : float64 (n,)
        Standard error of a sampled loss (NaN for an exact one).
    grad_norm : float64 (n,)
        Frobenius norm of the gradient of the matrix the stage moves
        (joint: of both, stacked).
    cosine : float64 (n,)
        Cosine between the exact Stage-1 gradient ``∇_{A1} L`` and the
        idealized prediction at the same ``A1`` (NaN in Stage 2 or when the
        exact gradient is out of reach).
    attn_parent : float64 (n, T)
        ``softmax(A1)[i, p(i)]`` per non-root row, NaN for roots.
    A1 : float64 (n, T, T)
    A2 : float64 (n, S, S)
    status : str
        ``"completed"`` or ``"diverged"``.
    message : str
        Why the run stopped (empty when completed).
    config : TrainConfig
    """

    step: np.ndarray
    stage: np.ndarray
    loss: np.ndarray
    loss_se: np.ndarray
    grad_norm: np.ndarray
    cosine: np.ndarray
    attn_parent: np.ndarray
    A1: np.ndarray
    A2: np.ndarray
    status: str
    message: str
    config: TrainConfig = field(default_factory=TrainConfig)
    stage2_samples: int = 0

    @property
    def loss_kind(self) -> np.ndarray:
        """``"exact"``, ``"sampled"`` or ``"none"`` for each record."""
        kind = np.where(np.isnan(self.loss_se), "exact", "sampled")
        return np.where(np.isnan(self.loss), "none", kind)

    @property
    def final_A1(self) -> np.ndarray:
        return self.A1[-1]

    @property
    def final_A2(self) -> np.ndarray:
        return self.A2[-1]

    @property
    def stage1_end(self) -> int:
        """Record index of ``A1(τ1)`` (the last Stage-1 record)."""
        idx = np.flatnonzero(self.stage == 1)
        return int(idx[-1]) if idx.size else len(self.step) - 1

    def arrays(self) -> dict:
        """The numeric arrays, for ``np.savez``."""
        return {
            k: getattr(self, k)
            for k in _RECORDED
        }

    def save(self, path) -> None:
        """Write ``trajectory.npz`` atomically (arrays + status + config JSON)."""
        extra = {
            "status": np.array(self.status),
            "message": np.array(self.message),
            "config_json": np.array(json.dumps(asdict(self.config))),
            "stage2_samples": np.array(self.stage2_samples),
        }
        atomic_savez(path, **self.arrays(), **extra)

    @classmethod
    def load(cls, path) -> "Trajectory":
        """Read a ``trajectory.npz`` written by :meth:`save`; ``ValueError`` naming the file otherwise."""
        path = _as_path(path, "path")
        keys = ("step", "stage", "loss", "grad_norm", "cosine", "attn_parent", "A1", "A2")

        def bad(what):
            return ValueError(f"{path} is not a popgrad trajectory file: {what}")

        with _open_npz(path, bad) as z:
            try:
                arrays = {k: np.array(z[k]) for k in keys}
                # written by popgrad 0.1: no standard errors, no sampled Stage 2
                arrays["loss_se"] = np.array(z["loss_se"]) if "loss_se" in z.files \
                    else np.full(arrays["loss"].shape, np.nan)
                samples = int(z["stage2_samples"]) if "stage2_samples" in z.files else 0
                cfg_dict = json.loads(str(z["config_json"]))
                status, message = str(z["status"]), str(z["message"])
                cfg = (MultiHeadTrainConfig if "init_seed" in cfg_dict else TrainConfig)(**cfg_dict)
            except KeyError as exc:
                raise bad(f"no entry {exc}") from None
            except (TypeError, ValueError, AttributeError) as exc:
                raise bad(f"unreadable entry ({exc})") from None
        n = len(arrays["step"])
        if any(np.ndim(v) == 0 or len(v) != n for v in arrays.values()) or status not in ("completed", "diverged"):
            raise bad("inconsistent record lengths or status")
        return cls(**arrays, status=status, message=message, config=cfg, stage2_samples=samples)


def attention_to_parent(graph, A1) -> np.ndarray:
    """``softmax(MASK(A1))[i, p(i)]`` for non-roots, NaN for roots, shape ``(T,)``."""
    P = first_layer_attention(A1)
    out = np.full(graph.T, np.nan)
    nr = graph.non_roots
    out[nr] = P[nr, graph.parents[nr]]
    return out


def _cos(a, b) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return float("nan")
    return float(np.sum(a * b) / (na * nb))


# ---------------------------------------------------------------- the loop
class _State:
    """Mutable state of a run; everything a checkpoint must hold."""

    def __init__(self, task, cfg):
        T, S = task.T, task.S
        self.t = 0
        self.A1 = np.zeros((T, T))
        self.A2 = cfg.beta0 * np.eye(S)
        self.rec = {k: [] for k in _RECORDED}
        self.increases = 0
        self.prev_loss = math.inf
        self.best_loss = math.inf  # lowest loss so far, and steps in a row above it (divergence)
        self.above_best = 0
        self.status = "completed"
        self.message = ""
        self.done = False  # True once the run has finished (completed or diverged)

    def to_arrays(self):
        T = self.A1.shape[0]
        S = self.A2.shape[0]
        out = {}
        shapes = {"attn_parent": (0, T), "A1": (0, T, T), "A2": (0, S, S)}
        for k, v in self.rec.items():
            if v:
                out[k] = np.asarray(v)
            else:
                out[k] = np.zeros(shapes.get(k, (0,)), dtype=np.int64 if k in ("step", "stage") else float)
        return out


def _checkpoint_payload(state, cfg, task):
    arrays = {f"rec_{k}": v for k, v in state.to_arrays().items()}
    meta = {
        "t": state.t,
        "increases": state.increases,
        "prev_loss": state.prev_loss,
        "best_loss": state.best_loss,
        "above_best": state.above_best,
        "done": state.done,
        "status": state.status,
        "message": state.message,
        "config": asdict(cfg),
        "graph": task.graph.to_string(),
        "S": task.S,
        "atoms_fingerprint": _fingerprint(task),
    }
    return dict(A1=state.A1, A2=state.A2, meta_json=np.array(json.dumps(meta)), **arrays)


def _fingerprint(task) -> str:
    return task.fingerprint


class CheckpointError(ValueError):
    """A checkpoint file that cannot be resumed from (damaged, edited, or not a popgrad checkpoint)."""


def _as_path(path, name) -> str:
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"{name} must be a non-empty file path (str or os.PathLike), got {path!r}")
    return os.fspath(path)


def _open_npz(path, bad):
    """``np.load(path)`` of an ``.npz`` archive, every failure turned into ``bad(reason)``."""
    import zipfile

    try:
        z = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise bad("the file does not exist") from None
    except IsADirectoryError:
        raise bad("it is a folder") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise bad(f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'empty'})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise bad("it is a single .npy array, not an .npz archive")
    return z


def _should_record(cfg, t: int) -> bool:
    """Whether step ``t`` is recorded: the first and last step of each stage, and every ``record_every``."""
    total = cfg.steps1 + cfg.steps2
    if t in (0, cfg.steps1, total) or (cfg.schedule != "joint" and t == cfg.steps1 + 1):
        return True
    return t % cfg.record_every == 0


def _stage_of(cfg, t: int) -> int:
    if cfg.schedule == "joint":
        return 0
    return 1 if t <= cfg.steps1 else 2


def _param_shapes(task, cfg):
    T, S = task.T, task.S
    if isinstance(cfg, MultiHeadTrainConfig):
        return (task.k, T, T), (task.k, S, S), (task.k, T)
    return (T, T), (S, S), (T,)


def validate_checkpoint(z, path, task, cfg) -> _State:
    """The :class:`_State` a checkpoint archive ``z`` holds, after checking every field.

    Checks: the metadata (JSON, every key and its type), the task fingerprint
    and configuration, the step counter (``0 <= t <= steps1 + steps2``), the
    parameters (shape, float64, finite), and the records (the steps the
    schedule records up to ``t``, stages, dtypes, shapes). Raises
    :class:`CheckpointError` naming the file and what is wrong.
    """
    def bad(what):
        return CheckpointError(f"checkpoint {path} is damaged or not a popgrad checkpoint: {what}; "
                               "delete it or run without --resume")

    try:
        meta = json.loads(str(z["meta_json"]))
    except KeyError:
        raise bad("no metadata (meta_json)") from None
    except (ValueError, TypeError) as exc:
        raise bad(f"metadata is not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise bad("metadata is not a JSON object")
    kinds = {"t": int, "increases": int, "prev_loss": (int, float), "best_loss": (int, float), "above_best": int,
             "done": bool, "status": str, "message": str, "config": dict, "graph": str, "S": int,
             "atoms_fingerprint": str}
    for key, kind in kinds.items():
        if key not in meta:
            raise bad(f"metadata has no {key!r}")
        value = meta[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise bad(f"metadata {key!r} = {value!r} has the wrong type")
    if meta["atoms_fingerprint"] != _fingerprint(task) or meta["config"] != json.loads(json.dumps(asdict(cfg))):
        raise ValueError(
            f"checkpoint {path} belongs to a different task or configuration: "
            "resume with exactly the settings of the original run, or start afresh without --resume"
        )
    total = cfg.steps1 + cfg.steps2
    t = meta["t"]
    if not 0 <= t <= total:
        raise bad(f"step counter t = {t} is outside the schedule 0..{total}")
    if meta["status"] not in ("completed", "diverged"):
        raise bad(f"status {meta['status']!r} is not 'completed' or 'diverged'")
    if meta["status"] == "diverged" and not meta["done"]:
        raise bad("a diverged run that is not marked done")
    if not 0 <= meta["increases"] <= cfg.divergence_patience or not 0 <= meta["above_best"] <= cfg.divergence_patience:
        raise bad("divergence counters out of range")
    shape1, shape2, shape_attn = _param_shapes(task, cfg)

    def array(key, shape, dtype):
        try:
            a = z[key]
        except KeyError:
            raise bad(f"no array {key!r}") from None
        except (ValueError, OSError, EOFError) as exc:
            raise bad(f"array {key!r} is unreadable ({exc})") from None
        if a.dtype != dtype:
            raise bad(f"array {key!r} has dtype {a.dtype}, expected {np.dtype(dtype)}")
        if a.shape != shape:
            raise bad(f"array {key!r} has shape {a.shape}, expected {shape}")
        return np.array(a)

    A1 = array("A1", shape1, np.float64)
    A2 = array("A2", shape2, np.float64)
    if not (np.all(np.isfinite(A1)) and np.all(np.isfinite(A2))) and meta["status"] != "diverged":
        raise bad("non-finite parameters in a run that did not diverge")
    want = [s for s in range(t) if _should_record(cfg, s)]
    if meta["done"] and _should_record(cfg, t):
        # a completed run recorded its last step; a diverged one may have stopped before recording step t
        try:
            got = z["rec_step"]
        except KeyError:
            raise bad("no array 'rec_step'") from None
        if meta["status"] == "completed" or (got.ndim == 1 and len(got) == len(want) + 1):
            want.append(t)
    want_steps = np.array(want, dtype=np.int64)
    n = len(want_steps)
    rec_shapes = {"step": (n,), "stage": (n,), "loss": (n,), "loss_se": (n,), "grad_norm": (n,), "cosine": (n,),
                  "attn_parent": (n, *shape_attn), "A1": (n, *shape1), "A2": (n, *shape2)}
    rec = {}
    for k in _RECORDED:
        rec[k] = array(f"rec_{k}", rec_shapes[k], np.int64 if k in ("step", "stage") else np.float64)
    if not np.array_equal(rec["step"], want_steps):
        raise bad(f"the recorded steps do not match the step counter t = {t}")
    if not np.array_equal(rec["stage"], np.array([_stage_of(cfg, int(s)) for s in want_steps], dtype=np.int64)):
        raise bad("the recorded stages do not match the schedule")
    state = _State(task, cfg)
    state.t = t
    state.increases = meta["increases"]
    state.prev_loss = float(meta["prev_loss"])
    state.best_loss = float(meta["best_loss"])
    state.above_best = meta["above_best"]
    state.done = meta["done"]
    state.status = meta["status"]
    state.message = meta["message"]
    state.A1, state.A2 = A1, A2
    for k in _RECORDED:
        state.rec[k] = list(rec[k])
    return state


def load_checkpoint(path, task, cfg) -> _State:
    """Restore the state saved by a checkpoint, checking it belongs to this run and every field
    (:func:`validate_checkpoint`); :class:`CheckpointError` (a ``ValueError``) otherwise."""
    path = _as_path(path, "checkpoint_path")

    def bad(what):
        return CheckpointError(f"checkpoint {path} is damaged or not a popgrad checkpoint: {what}; "
                               "delete it or run without --resume")

    import zipfile

    with _open_npz(path, bad) as z:
        try:
            return validate_checkpoint(z, path, task, cfg)
        except (zipfile.BadZipFile, EOFError, OSError) as exc:  # a member damaged inside a valid archive
            raise bad(f"unreadable ({type(exc).__name__})") from None


def start_state(task, cfg, checkpoint_path, checkpoint_every, resume) -> "_State":
    """Validate the checkpoint arguments; a fresh :class:`_State`, or the one saved at ``checkpoint_path``."""
    as_int(checkpoint_every, "checkpoint_every", minimum=0)
    if not isinstance(resume, (bool, np.bool_)):
        raise TypeError(f"resume must be True or False, got {resume!r}")
    if checkpoint_path is not None:
        checkpoint_path = _as_path(checkpoint_path, "checkpoint_path")
        folder = os.path.dirname(os.path.abspath(checkpoint_path))
        if os.path.isdir(checkpoint_path):
            raise ValueError(f"checkpoint_path {checkpoint_path} is a folder: give a file path")
        if not os.path.isdir(folder):
            raise ValueError(f"checkpoint_path {checkpoint_path}: folder {folder} does not exist")
    if not resume:
        return _State(task, cfg)
    if checkpoint_path is None:
        raise ValueError("resume=True needs checkpoint_path")
    if not os.path.exists(checkpoint_path):
        raise ValueError(f"no checkpoint at {checkpoint_path} to resume from: run without --resume first")
    return load_checkpoint(checkpoint_path, task, cfg)


def train_two_stage(
    task: Task,
    *,
    beta0: float = TrainConfig.beta0,
    lr1: float = TrainConfig.lr1,
    steps1: int = TrainConfig.steps1,
    lr2: float = TrainConfig.lr2,
    steps2: int = TrainConfig.steps2,
    gradient: str = "exact",
    record_every: int = TrainConfig.record_every,
    schedule: str = "two-stage",
    eps: float | None = None,
    divergence_patience: int = TrainConfig.divergence_patience,
    checkpoint_path=None,
    checkpoint_every: int = 0,
    resume: bool = False,
    progress: bool = False,
    stage2: str = "exact",
    samples: int | None = None,
    sample_seed: int = 0,
    client=None,
) -> Trajectory:
    """Run Algorithm 1 (or joint training) exactly and record the trajectory.

    Parameters
    ----------
    task : Task
    beta0 : float
        Initial scale, ``A2(0) = β0·I`` (paper: ``β0 ≤ c T_eff^{-3/2}``).
    lr1, lr2 : float
        Learning rates in natural units: ``η1 = lr1·S·T/β0``, ``η2 = lr2·S``.
    steps1, steps2 : int
        ``τ1`` and ``τ2``.
    gradient : {"exact", "field", "idealized"}
        Stage-1 gradient. ``"field"``: the exact first-order (in ``β0``)
        gradient ``-(β0/T) J(P_i) M_i`` of the Stage-1 field ``M``
        (:func:`popgrad.stage1_field`, computed once; DESIGN §12), so a step
        is ``A1_i += lr1·S·J(P_i) M_i``. ``"idealized"``: the prediction
        ``-(β0/(S·T)) J(P_i) g_i`` of Knowl 3. Both work for tasks too large
        to enumerate when ``steps2 = 0`` (losses are then NaN; the recorded
        cosine is then field-vs-idealized).
    record_every : int
        Record every this many steps (and always the first and last step of
        each stage).
    schedule : {"two-stage", "joint"}
        ``"joint"`` moves A1 and A2 together for ``steps1 + steps2`` steps.
    eps : float, optional
        Loss perturbation; default ``T_eff ** -0.5``.
    divergence_patience : int
        Stop (status ``"diverged"``) after this many consecutive loss
        increases, or at once on a non-finite loss or parameter.
    checkpoint_path : path, optional
        Where to write a checkpoint (atomically) every ``checkpoint_every``
        steps and at the end.
    resume : bool
        Continue from ``checkpoint_path`` (bit-identical to an uninterrupted run).
    progress : bool
        Show a tqdm progress bar (only when stderr is a terminal).
    stage2 : {"auto", "exact", "sampled"}
        ``"exact"``: Stage 2 on the exact population (enumeration).
        ``"sampled"``: sample-average approximation (:mod:`popgrad.engine.sampled`):
        deterministic gradient descent on the average loss over a fixed sample
        of ``samples`` sequences (seed ``sample_seed``) with soft labels;
        ``dA2`` projected onto ``span{I, 11ᵀ}`` for a relabeling-closed prior.
        Its losses are estimates (``Trajectory.loss_se``). ``"auto"``: exact
        when the task can be enumerated, sampled otherwise (what ``popgrad run``
        does). The default is ``"exact"``: sampling is never chosen silently.
    samples : int, optional
        Sample size of the sampled Stage 2; default: from a pilot sample, so
        that the loss's standard error is ``≤ 1e-3``
        (:func:`popgrad.engine.sampled.default_samples`).
    sample_seed : int
        Seed of the Stage-2 sample.
    client : dask.distributed.Client, optional
        Split every exact enumeration over its workers (:mod:`popgrad.engine.distributed`;
        bit-identical to ``None``, this process).

    Returns
    -------
    Trajectory
    """
    if not isinstance(task, Task):
        raise ValueError(f"task must be a popgrad.Task, got {type(task).__name__}")
    enumerable = task.enumerable
    if stage2 == "auto":
        stage2 = "exact" if enumerable or steps2 == 0 else "sampled"
    if samples is None:
        samples = 0
    cfg = TrainConfig(
        beta0=beta0, lr1=lr1, steps1=steps1, lr2=lr2, steps2=steps2, gradient=gradient,
        schedule=schedule, record_every=record_every, eps=eps, divergence_patience=divergence_patience,
        stage2=stage2, samples=samples, sample_seed=sample_seed,
    ).validate()
    sampled = cfg.stage2 == "sampled" and cfg.steps2 > 0
    if not enumerable and (cfg.gradient == "exact" or (cfg.steps2 > 0 and not sampled) or cfg.schedule == "joint"):
        what = ("Exact Stage 2 (steps2 > 0)" if cfg.steps2 > 0 else "Joint training") if cfg.gradient != "exact" \
            else "The exact Stage-1 gradient"
        try:
            task.check_size()
        except TaskTooLargeError as exc:
            raise TaskTooLargeError(
                f"{what} needs the exact population: {exc} For Stage 1 at any T: gradient='field' "
                "(or 'idealized'); for Stage 2 beyond enumeration: stage2='sampled'."
            ) from None
    state = start_state(task, cfg, checkpoint_path, checkpoint_every, resume)

    graph = task.graph
    field_M = stage1_field(task, cfg.eps).M if cfg.gradient == "field" else None
    saa = {}  # the Stage-2 objective, built at the first step that needs it (A1 is then frozen)

    def objective():
        if "obj" not in saa:
            n = cfg.samples
            if n == 0:  # A1 is frozen from here on and A2 starts at β0·I: the same n after a resume
                n, _ = default_samples(task, state.A1, cfg.beta0 * np.eye(task.S), cfg.eps)
            saa["obj"] = SampledObjective(task, n, cfg.sample_seed, cfg.eps, options=None)
        return saa["obj"]

    # The idealized gradient divides by the stationary probabilities: without it, no cosine is recorded.
    has_ideal = idealized_available(task)
    if cfg.gradient == "idealized" and not has_ideal:
        raise ValueError("gradient='idealized' needs every prior draw to have stationary probabilities > 0 "
                         "(a reducible draw, e.g. from a small alpha, has zeros): use gradient='exact' or 'field'")

    def evaluate(t, stage, record) -> StepValues:
        if sampled and cfg.steps1 <= t:  # Stage 2 (and the step that starts it) on the fixed sample
            obj = objective()
            res = obj.loss_and_grad(state.A1, state.A2)
            se = float(obj.loss(state.A1, state.A2).se) if record else float("nan")
            dA1 = field_grad_A1(field_M, state.A1, cfg.beta0) if stage == 1 and field_M is not None else res.dA1
            return StepValues(res.loss, dA1, res.dA2, float("nan"), True, se)
        # Stage 2, joint training and the step that starts Stage 2 need the exact gradient.
        needs_exact = cfg.gradient == "exact" or stage != 1 or cfg.steps1 <= t < cfg.steps1 + cfg.steps2
        loss = float("nan")
        exact = None
        if needs_exact:
            exact = exact_loss_and_grad(task, state.A1, state.A2, cfg.eps, client=client)
            loss = exact.loss
        elif record and enumerable:
            loss = exact_loss(task, state.A1, state.A2, cfg.eps, client=client)
        dA1 = dA2 = None
        if stage == 1 or cfg.schedule == "joint":
            if cfg.gradient == "idealized" and stage == 1:
                dA1 = idealized_grad_A1(task, state.A1, cfg.beta0)
            elif cfg.gradient == "field" and stage == 1:
                dA1 = field_grad_A1(field_M, state.A1, cfg.beta0)
            else:
                dA1 = exact.dA1
        if exact is not None:
            dA2 = exact.dA2
        cosine = float("nan")
        if record and stage == 1 and has_ideal:
            if cfg.gradient == "exact":
                exact_dA1, ideal = dA1, idealized_grad_A1(task, state.A1, cfg.beta0)
            elif cfg.gradient == "field":  # the exact first-order gradient against Knowl 3's prediction
                exact_dA1, ideal = dA1, idealized_grad_A1(task, state.A1, cfg.beta0)
            else:
                ideal = dA1
                exact_dA1 = None
                if exact is not None:
                    exact_dA1 = exact.dA1
                elif enumerable:
                    exact_dA1 = exact_loss_and_grad(task, state.A1, state.A2, cfg.eps, client=client).dA1
            if exact_dA1 is not None:
                cosine = _cos(exact_dA1, ideal)
        return StepValues(loss, dA1, dA2, cosine, exact is not None)

    traj = run_schedule(
        task, cfg, state, evaluate, lambda A1: attention_to_parent(graph, A1),
        eta1=cfg.eta1(task), eta2=cfg.eta2(task), checkpoint_path=checkpoint_path,
        checkpoint_every=checkpoint_every, progress=progress,
    )
    if sampled:
        traj = replace(traj, stage2_samples=objective().n)
    return traj


def idealized_available(task) -> bool:
    """Whether the idealized gradient exists for ``task``'s prior (every stationary probability > 0)."""
    prior = task.prior
    mu = prior.invariant_view()[2] if hasattr(prior, "invariant_view") else prior.stationary
    return bool(np.all(np.asarray(mu) > 0))


class StepValues(NamedTuple):
    """What one step of a schedule evaluates at the current parameters.

    Attributes
    ----------
    loss : float
        Exact population loss (NaN when not computed).
    dA1, dA2 : ndarray or None
        The gradients the step may apply (``None`` when the stage does not need one).
    cosine : float
        Exact-vs-idealized Stage-1 cosine (NaN when not measured).
    loss_is_exact : bool
        Whether ``loss`` was computed, exactly or as a sampled estimate (a NaN then means divergence).
    loss_se : float
        Standard error of a sampled ``loss`` (NaN when exact or not computed).
    """

    loss: float
    dA1: object
    dA2: object
    cosine: float
    loss_is_exact: bool
    loss_se: float = float("nan")


def run_schedule(task, cfg, state, evaluate, attention, *, eta1, eta2, checkpoint_path, checkpoint_every, progress):
    """The gradient-descent loop shared by :func:`train_two_stage` and ``train_multi_head``.

    ``evaluate(t, stage, record) -> StepValues`` computes what step ``t``
    needs at ``state.A1, state.A2``; ``attention(A1)`` gives the recorded
    attention-to-parent array. The loop records, stops on divergence
    (non-finite values, or ``cfg.divergence_patience`` consecutive loss
    increases), applies the update of the schedule (two-stage: ``A1`` for
    ``t < steps1``, then ``A2``; joint: both), writes checkpoints and
    returns the :class:`Trajectory`.
    """
    total = cfg.steps1 + cfg.steps2
    bar = None
    if progress and sys.stderr.isatty():
        bar = tqdm(total=total, initial=state.t, desc="popgrad", unit="step", file=sys.stderr)

    while not state.done:
        t = state.t
        stage = _stage_of(cfg, t)
        record = _should_record(cfg, t)
        if not _finite_params(state):  # an update overflowed: stop before evaluating at inf/NaN
            _diverge(state, f"non-finite parameters after the update of step {t - 1} (overflow): lower lr1/lr2")
            break
        with np.errstate(over="ignore", invalid="ignore"):
            step = evaluate(t, stage, record)
        loss = step.loss
        if record:
            if stage == 1:
                gnorm = float(np.linalg.norm(step.dA1))
            elif stage == 2:
                gnorm = float(np.linalg.norm(step.dA2))
            else:
                gnorm = float(np.sqrt(np.sum(step.dA1**2) + np.sum(step.dA2**2)))
            for key, value in (
                ("step", t), ("stage", stage), ("loss", loss), ("loss_se", step.loss_se), ("grad_norm", gnorm),
                ("cosine", step.cosine),
                ("attn_parent", attention(state.A1)), ("A1", state.A1.copy()), ("A2", state.A2.copy()),
            ):
                state.rec[key].append(value)
        # --- divergence
        if step.loss_is_exact and math.isnan(loss):
            _diverge(state, f"non-finite loss at step {t}: lower lr1/lr2")
            break
        if not math.isnan(loss):
            if math.isinf(loss):
                _diverge(state, f"infinite loss at step {t} (eps = 0 and a token got zero mass?)")
                break
            why = _track_loss(state, cfg, loss, t)
            if why:
                _diverge(state, why)
                break
        if t == total:
            break
        # --- update (step t -> t+1); an overflow is caught at the top of the next step
        with np.errstate(over="ignore", invalid="ignore"):
            _update(state, cfg, step, t, eta1, eta2)
        state.t = t + 1
        if bar is not None:
            bar.update(1)
        if checkpoint_path is not None and checkpoint_every and state.t % checkpoint_every == 0:
            atomic_savez(checkpoint_path, **_checkpoint_payload(state, cfg, task))

    state.done = True
    if bar is not None:
        bar.close()
    if checkpoint_path is not None:
        atomic_savez(checkpoint_path, **_checkpoint_payload(state, cfg, task))
    return Trajectory(**state.to_arrays(), status=state.status, message=state.message, config=cfg)


def _finite_params(state) -> bool:
    return bool(np.all(np.isfinite(state.A1)) and np.all(np.isfinite(state.A2)))


def _diverge(state, message: str) -> None:
    state.status = "diverged"
    state.message = message


def _track_loss(state, cfg, loss: float, t: int) -> str:
    """Update the divergence counters with the loss of step ``t``; the reason to stop, or ``""``.

    Two signs of divergence, each sustained for ``cfg.divergence_patience`` steps: the loss rising
    at every step, or the loss staying more than :data:`DIVERGENCE_RTOL` above its lowest value
    (a step that overshoots and lands on a plateau, e.g. a saturated softmax).
    """
    state.increases = state.increases + 1 if loss > state.prev_loss else 0
    state.prev_loss = loss
    if loss < state.best_loss:
        state.best_loss = loss
    state.above_best = state.above_best + 1 if loss > state.best_loss + DIVERGENCE_RTOL * abs(state.best_loss) else 0
    if state.increases >= cfg.divergence_patience:
        return f"loss increased for {state.increases} consecutive steps (step {t}, loss {loss:.6g}): lower lr1/lr2"
    if state.above_best >= cfg.divergence_patience:
        return (f"loss stayed more than {DIVERGENCE_RTOL:.0%} above its lowest value {state.best_loss:.6g} for "
                f"{state.above_best} steps (step {t}, loss {loss:.6g}): lower lr1/lr2")
    return ""


def _update(state, cfg, step, t, eta1, eta2) -> None:
    """Gradient step ``t -> t+1`` of the schedule (two-stage: ``A1`` for ``t < steps1``, then ``A2``; joint: both)."""
    joint = cfg.schedule == "joint"
    if joint:
        state.A1 = state.A1 - eta1 * step.dA1
        state.A2 = state.A2 - eta2 * step.dA2
    elif t < cfg.steps1:
        state.A1 = state.A1 - eta1 * step.dA1
    else:
        state.A2 = state.A2 - eta2 * step.dA2
