"""What a run records: :class:`Trajectory` (arrays of the recorded steps, status, config), saved and loaded."""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import numpy as np

from .._io import atomic_savez
from ..model.reduced import first_layer_attention
from .config import MultiHeadTrainConfig, TrainConfig

__all__ = ["Trajectory", "Monotonicity", "attention_to_parent"]


class Monotonicity(NamedTuple):
    """How often and how high a run's loss rose above its best value and came back (DESIGN §8).

    An *episode* starts at a step whose loss exceeds the lowest loss so far (of the stage) by more than
    rounding (a sampled loss: by more than ``Z_NOISE`` standard errors) and ends when the loss is back
    at or below it. Such rises are not divergence: the run goes on.

    Attributes
    ----------
    episodes : int
        Number of episodes (0: the loss never rose above its best).
    max_rise : float
        The largest rise above the best loss (loss units).
    max_rise_rel : float
        ``max_rise / |best|`` at that step.
    worst_step : int
        The step of the largest rise (-1 when there was none).
    steps_above_best : int
        Steps (evaluations) spent above the best loss.
    large_episodes : int
        Episodes that rose more than 1 % (``LARGE_RISE``) above the best loss.
    """

    episodes: int = 0
    max_rise: float = 0.0
    max_rise_rel: float = 0.0
    worst_step: int = -1
    steps_above_best: int = 0
    large_episodes: int = 0

    @property
    def monotone(self) -> bool:
        return self.episodes == 0

    def describe(self) -> str:
        """``"monotone"`` or ``"non-monotone: 3 episodes of rising loss (1 over 1%), the highest … (step …), …"``."""
        if self.monotone:
            return "monotone"
        return (f"non-monotone: {self.episodes} episode{'s' if self.episodes != 1 else ''} of rising loss "
                f"({self.large_episodes} over 1%), the highest {self.max_rise:.3g} ({100 * self.max_rise_rel:.3g}%) "
                f"above the best loss (step {self.worst_step}), {self.steps_above_best} steps above the best in all")

    def to_json(self) -> dict:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self._asdict().items()}

    @classmethod
    def from_json(cls, d) -> "Monotonicity":
        return cls(int(d["episodes"]), float(d["max_rise"]), math.inf if d["max_rise_rel"] is None
                   else float(d["max_rise_rel"]), int(d["worst_step"]), int(d["steps_above_best"]),
                   int(d.get("large_episodes", 0)))

_RECORDED = ("step", "stage", "loss", "loss_se", "grad_norm", "cosine", "attn_parent", "A1", "A2")


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
    monotonicity : Monotonicity
        The non-monotone episodes of the loss (:meth:`Monotonicity.describe`).
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
    monotonicity: Monotonicity = Monotonicity()

    def __repr__(self) -> str:
        """One line: the schedule, the recorded steps, status, first and last loss (the arrays stay in the fields)."""
        return summary_line(self, f"{self.config.schedule}, S={self.A2.shape[-1]}, T={self.A1.shape[-1]}",
                            "ε-loss")

    def __str__(self) -> str:
        """A short multi-line summary: :meth:`__repr__`, where Stage 1 ended, the loss curve's shape, the message."""
        lines = [repr(self)]
        if self.config.schedule == "two-stage" and len(self.step):
            lines.append(f"  Stage 1 ends at record {self.stage1_end} (step {int(self.step[self.stage1_end])})")
        return "\n".join(lines + summary_tail(self))

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
            "monotonicity_json": np.array(json.dumps(self.monotonicity.to_json())),
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
                mono = Monotonicity.from_json(json.loads(str(z["monotonicity_json"]))) \
                    if "monotonicity_json" in z.files else Monotonicity()
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
        return cls(**arrays, status=status, message=message, config=cfg, stage2_samples=samples, monotonicity=mono)

    def to_frame(self):
        """The recorded scalars as a pandas DataFrame, one row per record.

        Columns: ``step``, ``stage``, ``loss``, ``loss_se``, ``grad_norm``, ``cosine``, ``lr1``/``lr2``
        (the natural-unit learning rate of the matrix the step's update moves, NaN for the other one;
        joint: both), and the attention to
        the parent ``attn_parent_<i>`` per row ``i`` (k heads: ``attn_parent_h<h>_<i>``), NaN for roots.
        """
        import pandas as pd

        c = self.config
        joint = c.schedule == "joint"
        step = np.asarray(self.step)
        cols = {"step": step, "stage": self.stage, "loss": self.loss, "loss_se": self.loss_se,
                "grad_norm": self.grad_norm, "cosine": self.cosine,
                "lr1": np.where(joint | (step < c.steps1), float(c.lr1), np.nan),
                "lr2": np.where(joint | (step >= c.steps1), float(c.lr2), np.nan)}
        ap = self.attn_parent
        if ap.ndim == 2:
            cols.update({f"attn_parent_{i}": ap[:, i] for i in range(ap.shape[1])})
        else:
            cols.update({f"attn_parent_h{h}_{i}": ap[:, h, i] for h in range(ap.shape[1]) for i in range(ap.shape[2])})
        return pd.DataFrame(cols)


def _loss_text(traj, r: int) -> str:
    v = float(traj.loss[r])
    se = getattr(traj, "loss_se", None)
    se = float(se[r]) if se is not None and len(se) > r else float("nan")
    if not np.isfinite(v):
        return "n/a"
    return f"{v:.6g}" + (f" ± {se:.2g}" if np.isfinite(se) else "")


def summary_line(traj, what: str, loss_name: str = "loss") -> str:
    """``Trajectory(two-stage, S=3, T=10: 62 records, steps 0..600, completed; loss 1.0986 -> 0.3844)``: a
    trajectory's repr (no arrays); the losses are nats, ``± SE`` where sampled."""
    n = len(traj.step)
    if not n:
        return f"{type(traj).__name__}({what}: no records, {traj.status})"
    ok = np.flatnonzero(np.isfinite(np.asarray(traj.loss, dtype=float)))
    loss = (f"; {loss_name} {_loss_text(traj, int(ok[0]))} -> {_loss_text(traj, int(ok[-1]))} nats" if ok.size
            else "; loss not computed")
    return (f"{type(traj).__name__}({what}: {n} records, steps {int(traj.step[0])}..{int(traj.step[-1])}, "
            f"{traj.status}{loss})")


def summary_tail(traj) -> list:
    """The lines :func:`summary_line` does not hold: the loss curve's shape and the stop message."""
    lines = [f"  loss curve: {traj.monotonicity.describe()}"]
    if traj.message:
        lines.append(f"  message: {traj.message}")
    return lines


def attention_to_parent(graph, A1) -> np.ndarray:
    """``softmax(MASK(A1))[i, p(i)]`` for non-roots, NaN for roots, shape ``(T,)``."""
    P = first_layer_attention(A1)
    out = np.full(graph.T, np.nan)
    nr = graph.non_roots
    out[nr] = P[nr, graph.parents[nr]]
    return out


def _as_path(path, name) -> str:
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"{name} must be a non-empty file path (str or os.PathLike), got {path!r}")
    return os.fspath(path)


def _open_npz(path, bad):
    """``np.load(path)`` of an ``.npz`` archive, every failure turned into ``bad(reason)``."""
    import zipfile

    from .._io import regular_file_problem

    kind = regular_file_problem(path)  # a FIFO would block np.load forever (a hang of --resume)
    if kind is not None:
        raise bad(f"it is {kind}, not a regular file" if kind != "a folder" else "it is a folder")
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
