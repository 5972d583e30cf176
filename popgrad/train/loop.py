"""The one gradient-descent loop every trainer shares (:func:`run_schedule`), its state and checkpoints.

:func:`run_schedule` records, stops on divergence, applies the update of the
schedule and writes checkpoints; the trainers (:func:`popgrad.train_two_stage`,
:func:`popgrad.train_multi_head`, :func:`popgrad.train_catformer`) only say
what a step evaluates. What is trained, how a step updates it, and what is
recorded is a *scheme* (:class:`ReducedScheme` for the reduced model's
``A1``/``A2`` gradient descent; :class:`popgrad.train.catformer.CatFormerScheme`
for the full model with the official optimizers): the named float64 arrays a
checkpoint holds (parameters and optimizer state), the records, the update.
Every computation is deterministic, so a run resumed from a checkpoint is
bit-identical to an uninterrupted one; a checkpoint is validated field by field
before it is used (:func:`validate_checkpoint`).
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

from .._io import atomic_savez
from .._validation import as_int
from .config import MultiHeadTrainConfig
from .trajectory import Trajectory, _as_path, _open_npz

__all__ = ["run_schedule", "StepValues", "ReducedScheme", "start_state", "load_checkpoint", "validate_checkpoint",
           "CheckpointError", "DIVERGENCE_RTOL"]

#: A loss more than this far above its lowest value (relative) counts towards divergence: after
#: ``divergence_patience`` such steps in a row the run stops with status ``"diverged"``.
DIVERGENCE_RTOL = 1e-2


# ---------------------------------------------------------------- schemes
class ReducedScheme:
    """Plain gradient descent on the reduced model's ``A1``, ``A2`` (Algorithm 1, joint, k heads).

    The loop's original behaviour, unchanged: arrays ``A1``, ``A2``; records
    :data:`popgrad.train.trajectory._RECORDED`; update ``A1 ← A1 − η1 dA1``
    for ``t < steps1`` then ``A2 ← A2 − η2 dA2`` (joint: both); the result is a
    :class:`Trajectory`. ``attention``, ``eta1``, ``eta2`` are only needed to
    run (not to validate a checkpoint).

    A scheme tells the loop: ``config`` (its ``asdict`` is the checkpoint's
    configuration), ``total`` (the last step), ``patience``, ``hint`` (the fix
    named in divergence messages), ``should_record(t)``, ``stage_of(t)``,
    ``initial_arrays()``, ``array_specs()`` (name -> shape of every float64
    array a checkpoint holds), ``record_specs(n)`` (record key -> (shape,
    dtype)), ``record(state, step, t, stage)``, ``update(state, step, t)`` and
    ``result(state)``.
    """

    hint = "lower lr1/lr2"

    def __init__(self, task, cfg, attention=None, eta1=None, eta2=None):
        self.task, self.config = task, cfg
        self.attention, self.eta1, self.eta2 = attention, eta1, eta2
        self.total = cfg.steps1 + cfg.steps2
        self.patience = cfg.divergence_patience

    def should_record(self, t: int) -> bool:
        return _should_record(self.config, t)

    def stage_of(self, t: int) -> int:
        return _stage_of(self.config, t)

    def initial_arrays(self) -> dict:
        T, S = self.task.T, self.task.S
        return {"A1": np.zeros((T, T)), "A2": self.config.beta0 * np.eye(S)}

    def array_specs(self) -> dict:
        shape1, shape2, _ = _param_shapes(self.task, self.config)
        return {"A1": shape1, "A2": shape2}

    def record_specs(self, n: int) -> dict:
        shape1, shape2, shape_attn = _param_shapes(self.task, self.config)
        f, i = np.float64, np.int64
        return {"step": ((n,), i), "stage": ((n,), i), "loss": ((n,), f), "loss_se": ((n,), f),
                "grad_norm": ((n,), f), "cosine": ((n,), f), "attn_parent": ((n, *shape_attn), f),
                "A1": ((n, *shape1), f), "A2": ((n, *shape2), f)}

    def record(self, state, step, t: int, stage: int):
        if stage == 1:
            gnorm = float(np.linalg.norm(step.dA1))
        elif stage == 2:
            gnorm = float(np.linalg.norm(step.dA2))
        else:
            gnorm = float(np.sqrt(np.sum(step.dA1**2) + np.sum(step.dA2**2)))
        return (
            ("step", t), ("stage", stage), ("loss", step.loss), ("loss_se", step.loss_se), ("grad_norm", gnorm),
            ("cosine", step.cosine),
            ("attn_parent", self.attention(state.A1)), ("A1", state.A1.copy()), ("A2", state.A2.copy()),
        )

    def update(self, state, step, t: int) -> None:
        _update(state, self.config, step, t, self.eta1, self.eta2)

    def result(self, state):
        return Trajectory(**state.to_arrays(), status=state.status, message=state.message, config=self.config)


def _as_scheme(task, cfg):
    """``cfg`` itself if it is a scheme, else the :class:`ReducedScheme` of a ``TrainConfig``."""
    return cfg if hasattr(cfg, "array_specs") else ReducedScheme(task, cfg)


# ---------------------------------------------------------------- the loop
class _State:
    """Mutable state of a run; everything a checkpoint must hold.

    ``arrays`` are the scheme's named float64 arrays (parameters, optimizer
    state); ``A1`` and ``A2`` name two of them for the reduced trainers.
    """

    def __init__(self, task, cfg):
        scheme = _as_scheme(task, cfg)
        self.t = 0
        self.arrays = scheme.initial_arrays()
        self._empty = {k: np.zeros(shape, dtype=dtype) for k, (shape, dtype) in scheme.record_specs(0).items()}
        self.rec = {k: [] for k in self._empty}
        self.increases = 0
        self.prev_loss = math.inf
        self.best_loss = math.inf  # lowest loss so far, and steps in a row above it (divergence)
        self.above_best = 0
        self.status = "completed"
        self.message = ""
        self.done = False  # True once the run has finished (completed or diverged)

    @property
    def A1(self):
        return self.arrays["A1"]

    @A1.setter
    def A1(self, value):
        self.arrays["A1"] = value

    @property
    def A2(self):
        return self.arrays["A2"]

    @A2.setter
    def A2(self, value):
        self.arrays["A2"] = value

    def to_arrays(self):
        return {k: np.asarray(v) if v else self._empty[k] for k, v in self.rec.items()}


def _checkpoint_payload(state, scheme, task):
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
        "config": asdict(scheme.config),
        "graph": task.graph.to_string(),
        "S": task.S,
        "atoms_fingerprint": _fingerprint(task),
    }
    return dict(**state.arrays, meta_json=np.array(json.dumps(meta)), **arrays)


def _fingerprint(task) -> str:
    return task.fingerprint


class CheckpointError(ValueError):
    """A checkpoint file that cannot be resumed from (damaged, edited, or not a popgrad checkpoint)."""


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

    ``cfg`` is a ``TrainConfig`` (the reduced model) or a scheme. Checks: the
    metadata (JSON, every key and its type), the task fingerprint and
    configuration, the step counter (``0 <= t <= total``), the scheme's arrays
    (shape, float64, finite), and the records (the steps the schedule records
    up to ``t``, stages, dtypes, shapes). Raises :class:`CheckpointError`
    naming the file and what is wrong.
    """
    scheme = _as_scheme(task, cfg)

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
    now = json.loads(json.dumps(asdict(scheme.config)))
    if meta["atoms_fingerprint"] != _fingerprint(task) or meta["config"] != now:
        # issue 32: say which setting changed (the task's graph and S are in the metadata too)
        changed = [f"{k} {meta['config'].get(k, '(absent)')!r} -> {now.get(k, '(absent)')!r}"
                   for k in sorted(set(meta["config"]) | set(now)) if meta["config"].get(k) != now.get(k)]
        if meta["graph"] != task.graph.to_string():
            changed.append("the graph")
        if meta["S"] != task.S:
            changed.append(f"S {meta['S']} -> {task.S}")
        if meta["atoms_fingerprint"] != _fingerprint(task) and meta["graph"] == task.graph.to_string() \
                and meta["S"] == task.S:
            changed.append("the prior (alpha, atoms, seed, floor or uniform_mean)")
        what = "; ".join(changed[:6]) + ("; ..." if len(changed) > 6 else "")
        raise ValueError(
            f"checkpoint {path} belongs to a different task or configuration ({what or 'the task'}): "
            "resume with exactly the settings of the original run, or start afresh without --resume"
        )
    total = scheme.total
    t = meta["t"]
    if not 0 <= t <= total:
        raise bad(f"step counter t = {t} is outside the schedule 0..{total}")
    if meta["status"] not in ("completed", "diverged"):
        raise bad(f"status {meta['status']!r} is not 'completed' or 'diverged'")
    if meta["status"] == "diverged" and not meta["done"]:
        raise bad("a diverged run that is not marked done")
    if not 0 <= meta["increases"] <= scheme.patience or not 0 <= meta["above_best"] <= scheme.patience:
        raise bad("divergence counters out of range")

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

    params = {key: array(key, shape, np.float64) for key, shape in scheme.array_specs().items()}
    if not all(np.all(np.isfinite(a)) for a in params.values()) and meta["status"] != "diverged":
        raise bad("non-finite parameters in a run that did not diverge")
    want = [s for s in range(t) if scheme.should_record(s)]
    if meta["done"] and scheme.should_record(t):
        # a completed run recorded its last step; a diverged one may have stopped before recording step t
        try:
            got = z["rec_step"]
        except KeyError:
            raise bad("no array 'rec_step'") from None
        if meta["status"] == "completed" or (got.ndim == 1 and len(got) == len(want) + 1):
            want.append(t)
    want_steps = np.array(want, dtype=np.int64)
    n = len(want_steps)
    rec = {k: array(f"rec_{k}", shape, dtype) for k, (shape, dtype) in scheme.record_specs(n).items()}
    if not np.array_equal(rec["step"], want_steps):
        raise bad(f"the recorded steps do not match the step counter t = {t}")
    if "stage" in rec and not np.array_equal(
            rec["stage"], np.array([scheme.stage_of(int(s)) for s in want_steps], dtype=np.int64)):
        raise bad("the recorded stages do not match the schedule")
    state = _State(task, scheme)
    state.t = t
    state.increases = meta["increases"]
    state.prev_loss = float(meta["prev_loss"])
    state.best_loss = float(meta["best_loss"])
    state.above_best = meta["above_best"]
    state.done = meta["done"]
    state.status = meta["status"]
    state.message = meta["message"]
    state.arrays = params
    for k in state.rec:
        state.rec[k] = list(rec[k])
    return state


def load_checkpoint(path, task, cfg) -> _State:
    """Restore the state saved by a checkpoint, checking it belongs to this run and every field
    (:func:`validate_checkpoint`; ``cfg`` a ``TrainConfig`` or a scheme); :class:`CheckpointError`
    (a ``ValueError``) otherwise."""
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
    """Validate the checkpoint arguments; a fresh :class:`_State`, or the one saved at ``checkpoint_path``
    (``cfg`` a ``TrainConfig`` or a scheme)."""
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
    grads : tuple of ndarray, optional
        A scheme's gradients in its own layout (the full model: ``dÃ^(1), …, dÃ^(L), dW``).
    """

    loss: float
    dA1: object
    dA2: object
    cosine: float
    loss_is_exact: bool
    loss_se: float = float("nan")
    grads: object = None


def run_schedule(task, cfg, state, evaluate, attention=None, *, eta1=None, eta2=None, checkpoint_path,
                 checkpoint_every, progress, scheme=None):
    """The gradient-descent loop shared by every trainer.

    ``evaluate(t, stage, record) -> StepValues`` computes what step ``t``
    needs at the state's current arrays. The loop records (the scheme's
    ``record``), stops on divergence (non-finite values,
    ``cfg.divergence_patience`` consecutive loss increases or steps above the
    lowest loss, or a final loss more than :data:`DIVERGENCE_RTOL` above the
    lowest), applies the scheme's update, writes checkpoints and returns the
    scheme's result.

    Without ``scheme``: the reduced model (:class:`ReducedScheme` of ``cfg``
    with ``attention(A1)`` the recorded attention-to-parent array and the
    step sizes ``eta1``, ``eta2``; two-stage: ``A1`` for ``t < steps1``,
    then ``A2``; joint: both); the result is a :class:`Trajectory`.
    """
    if scheme is None:
        scheme = ReducedScheme(task, cfg, attention, eta1, eta2)
    total = scheme.total
    bar = None
    if progress and sys.stderr.isatty():
        bar = tqdm(total=total, initial=state.t, desc="popgrad", unit="step", file=sys.stderr)

    while not state.done:
        t = state.t
        stage = scheme.stage_of(t)
        record = scheme.should_record(t)
        if not _finite_params(state):  # an update overflowed: stop before evaluating at inf/NaN
            _diverge(state, f"non-finite parameters after the update of step {t - 1} (overflow): {scheme.hint}")
            break
        with np.errstate(over="ignore", invalid="ignore"):
            step = evaluate(t, stage, record)
        loss = step.loss
        if record:
            for key, value in scheme.record(state, step, t, stage):
                state.rec[key].append(value)
        # --- divergence
        if step.loss_is_exact and math.isnan(loss):
            _diverge(state, f"non-finite loss at step {t}: {scheme.hint}")
            break
        if not math.isnan(loss):
            if math.isinf(loss):
                _diverge(state, f"infinite loss at step {t} (eps = 0 and a token got zero mass?)")
                break
            why = _track_loss(state, scheme, loss, t)
            if why:
                _diverge(state, why)
                break
        if t == total:
            why = _final_excess(state, loss, t, scheme.hint)
            if why:
                _diverge(state, why)
            break
        # --- update (step t -> t+1); an overflow is caught at the top of the next step
        with np.errstate(over="ignore", invalid="ignore"):
            scheme.update(state, step, t)
        state.t = t + 1
        if bar is not None:
            bar.update(1)
        if checkpoint_path is not None and checkpoint_every and state.t % checkpoint_every == 0:
            atomic_savez(checkpoint_path, **_checkpoint_payload(state, scheme, task))

    state.done = True
    if bar is not None:
        bar.close()
    if checkpoint_path is not None:
        atomic_savez(checkpoint_path, **_checkpoint_payload(state, scheme, task))
    return scheme.result(state)


def _finite_params(state) -> bool:
    return bool(all(np.all(np.isfinite(a)) for a in state.arrays.values()))


def _diverge(state, message: str) -> None:
    state.status = "diverged"
    state.message = message


def _track_loss(state, scheme, loss: float, t: int) -> str:
    """Update the divergence counters with the loss of step ``t``; the reason to stop, or ``""``.

    Two signs of divergence, each sustained for ``scheme.patience`` steps: the loss rising
    at every step, or the loss staying more than :data:`DIVERGENCE_RTOL` above its lowest value
    (a step that overshoots and lands on a plateau, e.g. a saturated softmax).
    """
    state.increases = state.increases + 1 if loss > state.prev_loss else 0
    state.prev_loss = loss
    if loss < state.best_loss:
        state.best_loss = loss
    state.above_best = state.above_best + 1 if loss > state.best_loss + DIVERGENCE_RTOL * abs(state.best_loss) else 0
    if state.increases >= scheme.patience:
        return f"loss increased for {state.increases} consecutive steps (step {t}, loss {loss:.6g}): {scheme.hint}"
    if state.above_best >= scheme.patience:
        return (f"loss stayed more than {DIVERGENCE_RTOL:.0%} above its lowest value {state.best_loss:.6g} for "
                f"{state.above_best} steps (step {t}, loss {loss:.6g}): {scheme.hint}")
    return ""


def _final_excess(state, loss: float, t: int, hint: str = "lower lr1/lr2") -> str:
    """The end-of-run rule: a final loss more than :data:`DIVERGENCE_RTOL` above the lowest loss of the run
    counts as divergence, however few steps were left for the patience rule (``""`` otherwise)."""
    if math.isnan(loss) or not math.isfinite(state.best_loss):
        return ""
    if loss > state.best_loss + DIVERGENCE_RTOL * abs(state.best_loss):
        return (f"the final loss {loss:.6g} (step {t}) is more than {DIVERGENCE_RTOL:.0%} above the lowest loss of "
                f"the run, {state.best_loss:.6g}: {hint}")
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
