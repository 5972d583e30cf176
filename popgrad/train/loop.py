"""The one gradient-descent loop every trainer shares (:func:`run_schedule`), its state and checkpoints.

The loop knows no model. What is trained is a *scheme* (:class:`Scheme`, a
``typing.Protocol``): its parameters as a mapping name → float64 array, the
gradients a step evaluates under the same names, the arrays its checkpoint
holds (parameters and optimizer state), what it records, and the fix its
divergence messages name. The schemes: the reduced model
(:class:`popgrad.train.reduced.ReducedScheme`), its k heads
(:class:`popgrad.train.reduced.MultiHeadScheme`) and the full model with
optax-style optimizers (:class:`popgrad.train.catformer.CatFormerScheme`).

:func:`run_schedule` evaluates each step (the trainer's ``evaluate``),
records, watches for divergence (:class:`DivergenceTracker`), applies the
scheme's update and writes checkpoints. Every computation is deterministic, so
a run resumed from a checkpoint is bit-identical to an uninterrupted one; a
checkpoint is validated field by field before it is used
(:func:`validate_checkpoint`), and checkpoints of earlier popgrad versions
still resume.

Divergence (DESIGN §8): a run is ``"diverged"`` when a loss or a parameter
becomes non-finite, when the loss stays above the loss at the start of its
stage for ``divergence_patience`` steps in a row, or when a stage ends above
its start. "Above" means by more than rounding (:data:`ABOVE_RTOL`) for an
exact loss, and by more than :data:`Z_NOISE` standard errors for a sampled
estimate (so sampling noise alone never stops a run); a sampled estimate without
a standard error (a batch of one sequence) is never "above": its noise is unknown, so
only a non-finite loss or parameter stops such a run. A loss that rises above
its best and comes back is not divergence: the run goes on, and each such
*non-monotone episode* is counted with its height
(:class:`popgrad.train.trajectory.Monotonicity`, on the trajectory).
"""
from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
from tqdm import tqdm

from .._io import atomic_savez
from .._validation import as_int
from .trajectory import Monotonicity, _as_path, _open_npz

__all__ = ["run_schedule", "StepValues", "Scheme", "start_state", "load_checkpoint", "validate_checkpoint",
           "CheckpointError", "DivergenceTracker", "ABOVE_RTOL", "NONMONOTONE_RTOL", "LARGE_RISE", "Z_NOISE"]

#: An exact loss is "above" a reference ``r`` when it exceeds ``r + ABOVE_RTOL·max(|r|, 1e-3)`` (rounding aside).
ABOVE_RTOL = 1e-9
#: A rise above the best loss smaller than this (relative) is rounding, not a non-monotone episode.
NONMONOTONE_RTOL = 1e-9
#: An episode whose rise exceeds this fraction of the best loss counts as large (:class:`Monotonicity`).
LARGE_RISE = 1e-2
#: A sampled loss is "above" a reference only beyond this many standard errors of their difference.
Z_NOISE = 4.0


# ---------------------------------------------------------------- the scheme contract
@runtime_checkable
class Scheme(Protocol):
    """What the loop needs from a trainer (the reduced, k-head and full-model trainers are three).

    Attributes
    ----------
    config : object
        The run's settings; :meth:`config_dict` is what a checkpoint must match.
    total : int
        The last step (updates ``0 … total-1``; step ``total`` is evaluated and recorded).
    patience : int
        Steps in a row above the stage's starting loss before the run stops as diverged.
    hint : str
        The fix divergence messages name (e.g. ``"lower lr1/lr2"``, ``"lower lr"``).

    Two optional methods keep old checkpoints readable: ``config_defaults()`` (a setting added since a
    file was written matches it when at its default) and ``checkpoint_source(z, meta)`` (a mapping that
    reads a file of an earlier layout as the current one).
    """

    config: Any
    total: int
    patience: int
    hint: str

    def config_dict(self) -> dict:
        """The JSON-able settings a checkpoint stores and a resumed run must match."""

    def param_names(self) -> tuple:
        """The names of the trained arrays (gradients come under the same names)."""

    def initial_arrays(self) -> dict:
        """Every array of a fresh run's checkpoint state: parameters and optimizer state (name → array)."""

    def array_specs(self) -> dict:
        """``name → (shape, dtype)`` of every array :meth:`initial_arrays` returns."""

    def should_record(self, t: int) -> bool: ...

    def stage_of(self, t: int) -> int:
        """The stage of step ``t`` (``0`` when the schedule has one stage)."""

    def record_specs(self, n: int) -> dict:
        """``record key → (shape, dtype)`` of ``n`` records."""

    def record(self, arrays: Mapping, step: "StepValues", t: int, stage: int):
        """``(key, value)`` pairs recorded at step ``t`` (``arrays`` the state before the update)."""

    def update(self, arrays: Mapping, grads: Mapping, t: int) -> dict:
        """The arrays after the update of step ``t`` (new arrays; ``grads`` under :meth:`param_names`)."""

    def result(self, state: "_State"):
        """The trajectory of a finished run."""


class StepValues(NamedTuple):
    """What one step evaluates at the current parameters.

    Attributes
    ----------
    loss : float
        Population loss, exact or a sampled estimate (NaN when not computed).
    grads : mapping
        Gradients under the scheme's parameter names (only those the step applies).
    loss_is_exact : bool
        Whether ``loss`` was computed (exactly or as an estimate): a NaN then means divergence.
    loss_se : float
        Standard error of a sampled ``loss`` (NaN when exact or not computed, or sampled from one sequence).
    extra : mapping
        Scheme-specific recorded values (the reduced model: ``"cosine"``).
    sampled : bool
        Whether ``loss`` is a sampled estimate: then a NaN ``loss_se`` means its noise is unknown (never
        "above" by the divergence rule), not that it is exact.
    """

    loss: float
    grads: Mapping
    loss_is_exact: bool = True
    loss_se: float = float("nan")
    extra: Mapping = {}
    sampled: bool = False


# ---------------------------------------------------------------- divergence
class DivergenceTracker:
    """The divergence rule and the non-monotone episodes of a run (module docstring).

    State (all in the checkpoint): ``ref``/``ref_se``/``ref_step`` the loss at the start of the stage,
    ``best``/``best_se`` the lowest loss of the stage, ``above`` steps in a row above ``ref``, and the
    episode counters of :class:`Monotonicity` (``in_episode``, ``peak`` of the open episode).
    """

    FIELDS = ("ref", "ref_se", "ref_step", "best", "best_se", "above", "in_episode", "episodes", "max_rise",
              "max_rise_rel", "worst_step", "steps_above_best", "last", "last_se", "last_step", "large_episodes",
              "episode_is_large")

    def __init__(self):
        self.ref = self.ref_se = self.best = self.best_se = math.nan
        self.last = self.last_se = math.nan
        self.ref_step = self.worst_step = self.last_step = -1
        self.above = self.episodes = self.steps_above_best = 0
        self.in_episode = self.episode_is_large = False
        self.large_episodes = 0
        self.max_rise = self.max_rise_rel = 0.0

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}

    @classmethod
    def from_json(cls, d) -> "DivergenceTracker":
        out = cls()
        for k in cls.FIELDS:
            v = d.get(k, getattr(out, k))
            setattr(out, k, float(v) if isinstance(getattr(out, k), float) and v is not None else v)
        return out

    @staticmethod
    def _tol(ref, ref_se, se, rtol):
        """Rounding for an exact loss; :data:`Z_NOISE` SEs of the difference for a sampled one (an SE of
        ``inf``: a sampled loss whose noise is unknown, never above)."""
        noise = math.sqrt((0.0 if math.isnan(se) else se) ** 2 + (0.0 if math.isnan(ref_se) else ref_se) ** 2)
        return max(rtol * max(abs(ref), 1e-3), Z_NOISE * noise)

    def is_above(self, loss, se, ref, ref_se) -> bool:
        return loss > ref + self._tol(ref, ref_se, se, ABOVE_RTOL)

    def start_stage(self, t, loss, se) -> None:
        self.ref, self.ref_se, self.ref_step = loss, se, t
        self.best, self.best_se = loss, se
        self.above = 0
        self.in_episode = False

    def observe(self, t: int, loss: float, se: float, patience: int, hint: str, sampled: bool = False) -> str:
        """Account for the finite loss of step ``t``; the reason to stop, or ``""``.

        ``sampled``: ``loss`` is an estimate; without a finite SE (one sequence) its noise is unknown and it is
        kept with SE ``inf``, so no comparison with it is ever "above" (noise is not divergence).
        """
        if sampled and not math.isfinite(se):
            se = math.inf
        self.last, self.last_se, self.last_step = loss, se, t
        if math.isnan(self.ref):
            self.start_stage(t, loss, se)
            return ""
        # non-monotone episodes: a rise above the best that (usually) comes back
        if loss > self.best + self._tol(self.best, self.best_se, se, NONMONOTONE_RTOL):
            if not self.in_episode:
                self.in_episode, self.episode_is_large = True, False
                self.episodes += 1
            self.steps_above_best += 1
            rise = loss - self.best
            rel = rise / abs(self.best) if self.best else math.inf
            if rel > LARGE_RISE and not self.episode_is_large:
                self.episode_is_large = True
                self.large_episodes += 1
            if rise > self.max_rise:
                self.max_rise, self.max_rise_rel, self.worst_step = rise, rel, t
        else:
            self.in_episode = False
        if loss < self.best:
            self.best, self.best_se = loss, se
        # divergence: above the stage's start for `patience` steps in a row
        self.above = self.above + 1 if self.is_above(loss, se, self.ref, self.ref_se) else 0
        if self.above >= patience:
            ref, now = _distinct(self.ref, loss)
            return (f"the loss stayed above its value at the start of the stage, {ref} (step "
                    f"{self.ref_step}), for {self.above} steps (step {t}, loss {now}): {hint}")
        return ""

    def end_stage(self, t: int, hint: str) -> str:
        """The end-of-stage rule: the stage's last loss above its first is divergence (``""`` otherwise)."""
        if math.isnan(self.ref) or math.isnan(self.last) or self.last_step == self.ref_step:
            return ""
        if self.is_above(self.last, self.last_se, self.ref, self.ref_se):
            last, ref = _distinct(self.last, self.ref)
            return (f"the loss at the end of the stage, {last} (step {self.last_step}), is above its value "
                    f"at the start, {ref} (step {self.ref_step}): {hint}")
        return ""

    def monotonicity(self) -> Monotonicity:
        return Monotonicity(self.episodes, self.max_rise, self.max_rise_rel, self.worst_step, self.steps_above_best,
                            self.large_episodes)


def _distinct(a: float, b: float) -> tuple:
    """``a`` and ``b`` printed with 6 significant digits, or as many more as it takes to tell them apart."""
    for digits in range(6, 18):
        x, y = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if x != y:
            break
    return x, y


# ---------------------------------------------------------------- state and checkpoints
class _State:
    """Mutable state of a run; everything a checkpoint must hold (``arrays``: the scheme's named arrays)."""

    def __init__(self, scheme):
        self.t = 0
        self.arrays = scheme.initial_arrays()
        self._empty = {k: np.zeros(shape, dtype=dtype) for k, (shape, dtype) in scheme.record_specs(0).items()}
        self.rec = {k: [] for k in self._empty}
        self.tracker = DivergenceTracker()
        self.status = "completed"
        self.message = ""
        self.done = False  # True once the run has finished (completed or diverged)

    def to_arrays(self):
        return {k: np.asarray(v) if v else self._empty[k] for k, v in self.rec.items()}

    @property
    def monotonicity(self) -> Monotonicity:
        return self.tracker.monotonicity()


def _few(keys, n=4) -> str:
    return ", ".join(keys[:n]) + (", ..." if len(keys) > n else "")


def _checkpoint_payload(state, scheme, task):
    arrays = {f"rec_{k}": v for k, v in state.to_arrays().items()}
    meta = {
        "t": state.t,
        "tracker": state.tracker.to_json(),
        "done": state.done,
        "status": state.status,
        "message": state.message,
        "config": scheme.config_dict(),
        "graph": task.graph.to_string(),
        "S": task.S,
        "atoms_fingerprint": task.fingerprint,
    }
    return dict(**state.arrays, meta_json=np.array(json.dumps(meta)), **arrays)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be resumed from (damaged, edited, or not a popgrad checkpoint)."""


def _as_scheme(task, cfg):
    """``cfg`` itself if it is a :class:`Scheme`; a reduced ``TrainConfig`` gives its scheme (the old API)."""
    if isinstance(cfg, Scheme):
        return cfg
    from .config import MultiHeadTrainConfig, TrainConfig

    if isinstance(cfg, MultiHeadTrainConfig):
        from .reduced import MultiHeadScheme
        return MultiHeadScheme(task, cfg)
    if isinstance(cfg, TrainConfig):
        from .reduced import ReducedScheme
        return ReducedScheme(task, cfg)
    raise TypeError(f"cfg must be a training scheme (popgrad.train.loop.Scheme) or a popgrad.TrainConfig, "
                    f"got {type(cfg).__name__}")


def _same_config(stored: dict, current: dict, defaults: dict) -> bool:
    """Equal settings; a setting added since the file was written matches when it has its default value."""
    current = json.loads(json.dumps(current))
    defaults = json.loads(json.dumps(defaults))
    for key in set(current) - set(stored):
        if key not in defaults or current[key] != defaults[key]:
            return False
    return all(k in current and current[k] == v for k, v in stored.items())


def _replay(tracker, steps, stages, losses, ses, scheme):
    """A tracker rebuilt from the records (checkpoints written before the tracker was saved)."""
    prev_stage = None
    for t, stage, loss, se in zip(steps, stages, losses, ses):
        if prev_stage is not None and stage != prev_stage:
            tracker.start_stage(tracker.last_step, tracker.last, tracker.last_se)
        prev_stage = stage
        if math.isfinite(loss):
            tracker.observe(int(t), float(loss), float(se), math.inf, "")
    return tracker


def validate_checkpoint(z, path, task, cfg) -> _State:
    """The :class:`_State` a checkpoint archive ``z`` holds, after checking every field.

    ``cfg`` is a :class:`Scheme` (or a reduced ``TrainConfig``). Checks: the metadata (JSON, every key and
    its type), the task fingerprint and configuration, the step counter (``0 <= t <= total``), the scheme's
    arrays (shape, dtype, finite), and the records (the steps the schedule records up to ``t``, stages,
    dtypes, shapes). Raises :class:`CheckpointError` naming the file and what is wrong.
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
    legacy = "tracker" not in meta  # written before popgrad tracked non-monotone episodes
    kinds = {"t": int, "done": bool, "status": str, "message": str, "config": dict, "graph": str, "S": int,
             "atoms_fingerprint": str}
    kinds.update({"increases": int, "prev_loss": (int, float), "best_loss": (int, float), "above_best": int}
                 if legacy else {"tracker": dict})
    for key, kind in kinds.items():
        if key not in meta:
            raise bad(f"metadata has no {key!r}")
        value = meta[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise bad(f"metadata {key!r} = {value!r} has the wrong type")
    defaults = getattr(scheme, "config_defaults", lambda: {})()
    now = scheme.config_dict()
    if meta["atoms_fingerprint"] != task.fingerprint or not _same_config(meta["config"], now, defaults):
        # issue 32: say which setting changed (the task's graph and S are in the metadata too)
        old = {**json.loads(json.dumps(defaults)), **meta["config"]}
        cur = json.loads(json.dumps(now))
        # settings of another trainer on both sides (a file of an earlier layout of the same trainer only lacks
        # settings added since): name the two kinds of run, not each key as '(absent)'
        only_old = sorted(set(meta["config"]) - set(cur))
        only_new = sorted(set(cur) - set(meta["config"]))
        if only_old and only_new:
            raise ValueError(
                f"checkpoint {path} was written by a different kind of run (its settings {_few(only_old)}; this "
                f"run's {_few(only_new)}): resume with the --model and graph of the original run, or start afresh "
                "without --resume")
        changed = [f"{k} {old.get(k, '(absent)')!r} -> {cur.get(k, '(absent)')!r}"
                   for k in sorted(set(old) | set(cur)) if old.get(k) != cur.get(k)]
        if meta["graph"] != task.graph.to_string():
            changed.append("the graph")
        if meta["S"] != task.S:
            changed.append(f"S {meta['S']} -> {task.S}")
        if meta["atoms_fingerprint"] != task.fingerprint and meta["graph"] == task.graph.to_string() \
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
    if legacy and (meta["increases"] < 0 or meta["above_best"] < 0):
        raise bad("divergence counters out of range")
    tracker = None
    if not legacy:
        try:
            tracker = DivergenceTracker.from_json(meta["tracker"])
        except (KeyError, TypeError, ValueError):
            raise bad("divergence tracker unreadable") from None
        if not 0 <= tracker.above <= scheme.patience:
            raise bad("divergence counters out of range")
    source = scheme.checkpoint_source(z, meta) if hasattr(scheme, "checkpoint_source") else z

    def array(key, shape, dtype):
        try:
            a = source[key]
        except KeyError:
            raise bad(f"no array {key!r}") from None
        except (ValueError, OSError, EOFError) as exc:
            raise bad(f"array {key!r} is unreadable ({exc})") from None
        if a.dtype != dtype:
            raise bad(f"array {key!r} has dtype {a.dtype}, expected {np.dtype(dtype)}")
        if a.shape != tuple(shape):
            raise bad(f"array {key!r} has shape {a.shape}, expected {tuple(shape)}")
        return np.array(a)

    arrays = {key: array(key, shape, dtype) for key, (shape, dtype) in scheme.array_specs().items()}
    if meta["status"] != "diverged" and not all(np.all(np.isfinite(a)) for a in arrays.values()):
        raise bad("non-finite parameters in a run that did not diverge")
    want = [s for s in range(t) if scheme.should_record(s)]
    if meta["done"] and scheme.should_record(t):
        # a completed run recorded its last step; a diverged one may have stopped before recording step t
        try:
            got = source["rec_step"]
        except KeyError:
            raise bad("no array 'rec_step'") from None
        if meta["status"] == "completed" or (got.ndim == 1 and len(got) == len(want) + 1):
            want.append(t)
    want_steps = np.array(want, dtype=np.int64)
    n = len(want_steps)
    rec = {k: array(f"rec_{k}", shape, dtype) for k, (shape, dtype) in scheme.record_specs(n).items()}
    if not np.array_equal(rec["step"], want_steps):
        raise bad(f"the recorded steps do not match the step counter t = {t}")
    stages = np.array([scheme.stage_of(int(s)) for s in want_steps], dtype=np.int64)
    if "stage" in rec and not np.array_equal(rec["stage"], stages):
        raise bad("the recorded stages do not match the schedule")
    state = _State(scheme)
    state.t = t
    state.done = meta["done"]
    state.status = meta["status"]
    state.message = meta["message"]
    state.arrays = arrays
    for k in state.rec:
        state.rec[k] = list(rec[k])
    if tracker is None:
        ses = rec["loss_se"] if "loss_se" in rec else np.full(n, np.nan)
        tracker = _replay(DivergenceTracker(), want_steps, stages, rec["loss"], ses, scheme)
    state.tracker = tracker
    return state


def load_checkpoint(path, task, cfg) -> _State:
    """Restore the state saved by a checkpoint, checking it belongs to this run and every field
    (:func:`validate_checkpoint`; ``cfg`` a :class:`Scheme` or a ``TrainConfig``); :class:`CheckpointError`
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


def start_state(task, cfg, checkpoint_path, checkpoint_every, resume) -> _State:
    """Validate the checkpoint arguments; a fresh :class:`_State`, or the one saved at ``checkpoint_path``
    (``cfg`` a :class:`Scheme` or a ``TrainConfig``)."""
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
        return _State(_as_scheme(task, cfg))
    if checkpoint_path is None:
        raise ValueError("resume=True needs checkpoint_path")
    if not os.path.exists(checkpoint_path):
        raise ValueError(f"no checkpoint at {checkpoint_path} to resume from: run without --resume first")
    return load_checkpoint(checkpoint_path, task, cfg)


# ---------------------------------------------------------------- the loop
def run_schedule(task, scheme, state, evaluate, *, checkpoint_path, checkpoint_every, progress):
    """The gradient-descent loop shared by every trainer.

    ``evaluate(t, stage, record) -> StepValues`` computes what step ``t`` needs at ``state.arrays``.
    The loop records (``scheme.record``), stops on divergence (module docstring), applies
    ``scheme.update``, writes checkpoints and returns ``scheme.result(state)``.
    """
    if not isinstance(scheme, Scheme):
        raise TypeError(f"scheme must satisfy popgrad.train.loop.Scheme, got {type(scheme).__name__}")
    total = scheme.total
    tracker = state.tracker
    bar = None
    if progress and sys.stderr.isatty():
        bar = tqdm(total=total, initial=state.t, desc="popgrad", unit="step", file=sys.stderr)

    while not state.done:
        t = state.t
        stage = scheme.stage_of(t)
        record = scheme.should_record(t)
        if not _finite(state.arrays):  # an update overflowed: stop before evaluating at inf/NaN
            _diverge(state, f"non-finite parameters after the update of step {t - 1} (overflow): {scheme.hint}")
            break
        with np.errstate(over="ignore", invalid="ignore"):
            step = evaluate(t, stage, record)
        loss = step.loss
        if record:
            for key, value in scheme.record(state.arrays, step, t, stage):
                state.rec[key].append(value)
        # --- divergence
        if math.isnan(loss):
            if step.loss_is_exact:
                _diverge(state, f"non-finite loss at step {t}: {scheme.hint}")
                break
        elif math.isinf(loss):
            _diverge(state, f"infinite loss at step {t} (eps = 0 and a token got zero mass?)")
            break
        else:
            why = tracker.observe(t, float(loss), float(step.loss_se), scheme.patience, scheme.hint,
                                  sampled=bool(step.sampled))
            if why:
                _diverge(state, why)
                break
        last_of_stage = t == total or scheme.stage_of(t + 1) != stage
        if last_of_stage:
            why = tracker.end_stage(t, scheme.hint)
            if why:
                _diverge(state, why)
                break
        if t == total:
            break
        # --- update (step t -> t+1); an overflow is caught at the top of the next step
        with np.errstate(over="ignore", invalid="ignore"):
            state.arrays = scheme.update(state.arrays, step.grads, t)
        if last_of_stage:  # the next stage starts from the parameters this step was evaluated at
            tracker.start_stage(tracker.last_step, tracker.last, tracker.last_se)
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


def _finite(arrays) -> bool:
    return bool(all(np.all(np.isfinite(a)) for a in arrays.values() if np.issubdtype(a.dtype, np.floating)))


def _diverge(state, message: str) -> None:
    state.status = "diverged"
    state.message = message
