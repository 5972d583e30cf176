"""What a run records: :class:`Trajectory` (arrays of the recorded steps, status, config), saved and loaded."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from .._io import atomic_savez
from ..model.reduced import first_layer_attention
from .config import MultiHeadTrainConfig, TrainConfig

__all__ = ["Trajectory", "attention_to_parent"]

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
