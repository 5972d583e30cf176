"""Training the full model exactly: the official recipes on exact population gradients (DESIGN §14).

:func:`train_catformer` trains a :class:`popgrad.CatFormer` (every ``Ã^(ℓ)``
and ``W`` jointly, as the official ``single_parent.py`` / ``multi_parent.ipynb``
/ ``many_graphs.ipynb`` do) with an optimizer (:mod:`popgrad.train.optim`: the official ones by name, or
any optax-style transformation) on the exact population gradient
(:func:`popgrad.catformer_loss_and_grad`, ``gradient="exact"``) or, as the
official code does, on a fresh sampled batch at every step
(``gradient="sampled"``)::

    θ_0 = init;   for t = 0 … steps-1:   g_t = ∇L(θ_t),   u_t, s_{t+1} = opt.update(g_t, s_t, θ_t),
                                         θ_{t+1} = θ_t + u_t

so a run is a deterministic function of its settings: two runs are
bit-identical, for any thread count, with or without ``client=``.

Sampled gradient: step ``t`` draws ``batch_size`` sequences with their soft
labels ``y = π(·|s_T)`` from ``task.sample`` with seed
``SeedSequence([sample_seed, t])`` (so a run is the same after a resume) and
follows the gradient of the batch mean of ``−Σ_c y_c log f_c``
(:func:`batch_loss_and_grad`, the engine's dense batch kernel); at a recorded step the
loss is that batch's estimate with its standard error (``loss_se``), which the
divergence rule reads with its standard error (:mod:`popgrad.train.loop`; a batch
of one sequence has no standard error, so its noise is never read as divergence);
between records only a non-finite batch loss is read.

The loop is the one every trainer shares (:func:`popgrad.train.loop.run_schedule`)
with :class:`CatFormerScheme`: the checkpoint holds the parameters and the
optimizer's whole state (a mapping), so a resumed run is bit-identical to an
uninterrupted one; divergence is as for every trainer (a non-finite loss or
parameter, or a loss that stays above its start).

Starts (``init``): ``"zero"`` (the single-parent recipe), ``("normal", scale,
seed)`` (every ``Ã`` entry ``scale·N(0,1)`` from ``numpy.random.default_rng(seed)``,
``W = 0``: the two-parent recipe with ``scale = 1e-4``, :meth:`popgrad.CatFormer.init`)
or a :class:`popgrad.CatFormerParams`.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

import numpy as np

from .._io import atomic_savez
from .._validation import ArgumentTypeError, as_int, as_real
from ..engine.catformer import catformer_loss_and_grad
from ..engine.catformer_rows import catformer_batch_loss_and_grad
from ..engine.sampled import estimate
from ..engine.table import prepare_table
from ..model.catformer import CatFormer, CatFormerParams, check_task_model
from .loop import StepValues, run_schedule, start_state
from .catformer_config import CATFORMER_GRADIENTS, CatFormerTrainConfig, _optimizer_name, _RULE_SETTINGS
from .catformer_config import DEFAULT_BATCH_SIZE  # noqa: F401  (old import path)
from .optim import apply_updates, flatten_state, unflatten_state
from .trajectory import Monotonicity, _as_path, _open_npz, summary_line, summary_tail

__all__ = ["CatFormerTrainConfig", "CatFormerTrajectory", "CatFormerScheme", "train_catformer", "initial_params",
           "batch_loss_and_grad", "CATFORMER_GRADIENTS"]

@dataclass(frozen=True)
class CatFormerTrajectory:
    """What a :func:`train_catformer` run recorded.

    Record ``r`` holds the parameters at step ``step[r]`` (before that step's
    update; the last record, step ``steps``, is after the last update) and the
    loss there.

    Attributes
    ----------
    step : int64 (n,)
        Recorded steps: ``0``, every ``record_every``, and ``steps``.
    loss : float64 (n,)
        Exact population loss ``L(θ_step)`` (cross entropy for the softmax readout); with
        ``gradient="sampled"`` the step's batch estimate (standard error in ``loss_se``).
    grad_norm : float64 (n,)
        ``‖∇L(θ_step)‖`` over every parameter array (Frobenius, stacked; sampled: of the batch gradient).
    lr : float64 (n,)
        ``lr_step`` of the schedule (NaN for an optimizer object without ``learning_rate``).
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
    loss_se : float64 (n,)
        Standard error of a sampled ``loss`` (NaN for an exact one).
    monotonicity : Monotonicity
        The non-monotone episodes of the loss (:meth:`popgrad.train.trajectory.Monotonicity.describe`).
    graph : str
        The task's graph (:meth:`popgrad.CausalGraph.to_string`; empty when unknown), for :meth:`to_frame`.
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
    loss_se: np.ndarray | None = None
    monotonicity: Monotonicity = Monotonicity()
    graph: str = ""

    def __post_init__(self):
        if self.loss_se is None:
            object.__setattr__(self, "loss_se", np.full(np.shape(self.loss), np.nan))

    def __repr__(self) -> str:
        """One line: model sizes, optimizer, recorded steps, status, first and last loss (no arrays)."""
        c = self.config
        return summary_line(self, f"S={c.S}, T={c.T}, heads={tuple(c.heads)}, {c.optimizer if isinstance(c.optimizer, str) else 'custom optimizer'}, {c.gradient}")

    def __str__(self) -> str:
        """:meth:`__repr__`, the loss curve's shape and the stop message."""
        return "\n".join([repr(self)] + summary_tail(self))

    @property
    def model(self) -> CatFormer:
        """The :class:`popgrad.CatFormer` that was trained."""
        c = self.config
        return CatFormer(c.S, c.T, heads=tuple(c.heads), readout=c.readout)

    def params(self, r: int) -> CatFormerParams:
        """The recorded parameters of record ``r`` (negative ``r`` counts from the end)."""
        return CatFormerParams([a[r].copy() for a in self.A], self.W[r].copy())

    def to_frame(self, graph=None):
        """The recorded scalars as a pandas DataFrame, one row per record.

        Columns: ``step``, ``stage`` (0: one stage), ``loss``, ``loss_se``, ``grad_norm``, ``lr``, and,
        given the task's ``graph``, the attention to the parent per position ``attn_parent_<i>`` read from
        the layer-1 positional block (the official metric, :func:`popgrad.checks.catformer.positional_attention`;
        NaN for roots; several layer-1 heads: ``attn_parent_h<h>_<i>``), from the graph the run was trained
        on (or ``graph``, for a trajectory written before the graph was saved).
        """
        import pandas as pd

        cols = {"step": self.step, "stage": np.zeros(len(self.step), dtype=np.int64), "loss": self.loss,
                "loss_se": self.loss_se, "grad_norm": self.grad_norm, "lr": self.lr}
        if graph is None and self.graph:
            graph = _graph_from_string(self.graph)
        if graph is not None:
            if getattr(graph, "T", None) != self.config.T:
                raise ValueError(f"graph must be the task's graph (T = {self.config.T}), got {graph!r}")
            m = self.A[0].shape[1]
            att = np.stack([_positional_attention_to_parent(graph, self.model, self.A[0][r])
                            for r in range(len(self.step))]) if len(self.step) else np.zeros((0, m, self.config.T))
            for h in range(m):
                name = "attn_parent_" if m == 1 else f"attn_parent_h{h}_"
                cols.update({f"{name}{i}": att[:, h, i] for i in range(att.shape[2])})
        return pd.DataFrame(cols)

    def save(self, path) -> None:
        """Write the trajectory as an ``.npz`` archive atomically (arrays, final parameters, status, config)."""
        arrays = {"step": self.step, "loss": self.loss, "loss_se": self.loss_se, "grad_norm": self.grad_norm,
                  "lr": self.lr, "W": self.W, "final_W": self.final.W}
        for i, a in enumerate(self.A):
            arrays[f"A_{i + 1}"] = a
            arrays[f"final_A_{i + 1}"] = self.final.A[i]
        atomic_savez(path, **arrays, status=np.array(self.status), message=np.array(self.message),
                     config_json=np.array(json.dumps(self.config.to_dict())), kind=np.array("catformer"),
                     monotonicity_json=np.array(json.dumps(self.monotonicity.to_json())), graph=np.array(self.graph))

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
                cfg = CatFormerTrainConfig.from_dict(json.loads(str(z["config_json"])))
                L = len(cfg.heads)
                A = tuple(np.array(z[f"A_{i + 1}"]) for i in range(L))
                final = CatFormerParams([np.array(z[f"final_A_{i + 1}"]) for i in range(L)], np.array(z["final_W"]))
                se = np.array(z["loss_se"]) if "loss_se" in z.files else None
                mono = Monotonicity.from_json(json.loads(str(z["monotonicity_json"]))) \
                    if "monotonicity_json" in z.files else Monotonicity()
                graph = str(z["graph"]) if "graph" in z.files else ""
                out = cls(np.array(z["step"]), np.array(z["loss"]), np.array(z["grad_norm"]), np.array(z["lr"]), A,
                          np.array(z["W"]), final, str(z["status"]), str(z["message"]), cfg, se, mono, graph)
            except KeyError as exc:
                raise bad(f"no entry {exc}") from None
            except (TypeError, ValueError, AttributeError) as exc:
                raise bad(f"unreadable entry ({exc})") from None
        n = len(out.step)
        if any(len(v) != n for v in (out.loss, out.loss_se, out.grad_norm, out.lr, out.W, *out.A)):
            raise bad("inconsistent record lengths")
        return out


def _positional_attention_to_parent(graph, model, A1) -> np.ndarray:
    """``softmax_rows(MASK(Ã^(1)_h[S:, S:]))[i, p(i)]`` per head and position, shape ``(m_1, T)`` (NaN for roots;
    a k-parent graph: the largest attention any one parent of ``i`` gets). The official metric, as
    :func:`popgrad.checks.catformer.positional_attention` reads it."""
    S, T = model.S, model.T
    low = np.tri(T, dtype=bool)
    z = np.where(low, A1[:, S:, S:], -np.inf)
    z = np.exp(z - z.max(axis=2, keepdims=True))
    P = z / z.sum(axis=2, keepdims=True)
    out = np.full((P.shape[0], T), np.nan)
    par = np.asarray(graph.parents)
    nr = np.asarray(graph.non_roots)
    if par.ndim == 1:
        out[:, nr] = P[:, nr, par[nr]]
    else:
        for i in nr:
            out[:, i] = P[:, i, par[i][par[i] >= 0]].max(axis=1)
    return out


def _graph_from_string(text):
    """The graph :meth:`to_string` wrote: one parent list, or per-position parent tuples (k parents)."""
    from ..task.graphs import CausalGraph
    from ..task.multigraphs import MultiParentGraph

    return MultiParentGraph.from_string(text) if ">" in text else CausalGraph.from_string(text)


def _names(model: CatFormer):
    return [f"A_{i + 1}" for i in range(model.n_layers)] + ["W"]


def batch_loss_and_grad(model: CatFormer, params: CatFormerParams, seqs, targets, eps: float, per_row: bool = False):
    """The batch mean loss and its gradients on explicit rows (the sampled gradient), optionally per-row losses.

    ``L = (1/n) Σ_m −Σ_c y_mc log(f_c(s_m) + ε)``; returns ``(L, dA list, dW, losses)`` with ``losses`` the
    ``n`` per-sequence losses when ``per_row`` (for the standard error; one NumPy forward pass), else
    ``None``. The gradient is the engine's dense batch kernel
    :func:`popgrad.engine.catformer_rows.catformer_batch_loss_and_grad` with weights ``y/n``, rows in the sample's
    order (the one rule between the row kernels is in that module); the per-row losses are the kernel's,
    times ``n`` (NumPy reference: :func:`popgrad.model.catformer.catformer_backward`, :func:`_row_losses`).
    """
    n = seqs.shape[0]
    res = catformer_batch_loss_and_grad(seqs, targets / n, model, params, eps)
    losses = res.row_loss * n if per_row else None
    return res.loss, list(res.dA), res.dW, losses


def _row_losses(model: CatFormer, params: CatFormerParams, seqs, targets, eps: float) -> np.ndarray:
    """``−Σ_c y_mc log(f_c(s_m) + ε)`` per row: the forward pass of
    :func:`popgrad.model.catformer.catformer_forward` with batched matrix products (its three-operand
    ``einsum`` is ~100x slower at T = 20), a log-softmax for the softmax readout at ``ε = 0``."""
    S, T = model.S, model.T
    n = seqs.shape[0]
    h = np.zeros((n, T, S + T))
    h[np.arange(n)[:, None], np.arange(T)[None, :], seqs] = 1.0
    h[:, np.arange(T), S + np.arange(T)] = 1.0
    low = np.tri(T, dtype=bool)
    for A in params.A:
        heads = [h]
        for k in range(A.shape[0]):
            z = np.where(low, (h @ A[k]) @ h.transpose(0, 2, 1), -np.inf)
            P = np.exp(z - z.max(axis=2, keepdims=True))
            heads.append((P / P.sum(axis=2, keepdims=True)) @ h)
        h = np.concatenate(heads, axis=2)
    z = h[:, -1, :] @ params.W
    pos = targets > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if model.readout == "softmax" and eps == 0.0:
            zmax = z.max(axis=1, keepdims=True)
            logf = z - zmax - np.log(np.sum(np.exp(z - zmax), axis=1, keepdims=True))
        else:
            f = np.exp(z - z.max(axis=1, keepdims=True)) if model.readout == "softmax" else z
            f = f / f.sum(axis=1, keepdims=True) if model.readout == "softmax" else f
            logf = np.log(f + eps)
        return -np.sum(np.where(pos, targets * logf, 0.0), axis=1)


class _LegacyCheckpoint(Mapping):
    """A checkpoint written before optimizer states were saved whole: Adam's moments as ``mu_<name>``,
    ``nu_<name>``, every count equal to the step counter, no ``rec_loss_se``."""

    def __init__(self, z, t):
        self.z, self.t = z, t

    def __getitem__(self, key):
        if key.startswith("opt."):
            parts = key.split(".")
            if parts[-1] == "count":
                return np.array(self.t, dtype=np.int64)
            if len(parts) >= 3 and parts[-2] in ("mu", "nu"):
                return self.z[f"{parts[-2]}_{parts[-1]}"]
            raise KeyError(key)
        if key == "rec_loss_se" and key not in self.z.files:
            return np.full(np.shape(self.z["rec_step"]), np.nan)
        return self.z[key]

    def __iter__(self):
        return iter(self.z.files)

    def __len__(self):
        return len(self.z.files)


class CatFormerScheme:
    """The full model's scheme for :func:`popgrad.train.loop.run_schedule` (a :class:`popgrad.train.loop.Scheme`).

    Parameters ``A_1 … A_L``, ``W``; the optimizer's state (a mapping) is flattened into the checkpoint
    under ``opt.<path>`` (:func:`popgrad.train.optim.flatten_state`). The update of step ``t`` is the
    optimizer's ``update`` on the step's gradients, then :func:`popgrad.train.optim.apply_updates`; the
    result a :class:`CatFormerTrajectory`.
    """

    def __init__(self, task, model: CatFormer, cfg: CatFormerTrainConfig, start: CatFormerParams | None = None):
        self.task, self.model, self.config = task, model, cfg
        self.rule = cfg.optimizer_rule()
        self.total = cfg.steps
        self.patience = cfg.divergence_patience
        self.hint = "lower lr" if isinstance(cfg.optimizer, str) else "lower the optimizer's learning rate"
        self.names = _names(model)
        self.start = start
        a_shapes, w_shape = model.shapes()
        self.shapes = dict(zip(self.names, [*a_shapes, w_shape]))
        zero = {n: np.zeros(s) for n, s in self.shapes.items()}
        self._state_like = self.rule.init(zero)
        flat = flatten_state(self._state_like)
        self._state_specs = {f"opt.{k}": (v.shape, v.dtype) for k, v in flat.items()}
        self._lr = getattr(self.rule, "learning_rate", None)

    # -- settings
    def config_dict(self) -> dict:
        return self.config.to_dict()

    def config_defaults(self) -> dict:
        return {f.name: f.default for f in fields(self.config)}

    # -- arrays
    def param_names(self) -> tuple:
        return tuple(self.names)

    def params_of(self, arrays) -> CatFormerParams:
        return CatFormerParams([arrays[n] for n in self.names[:-1]], arrays["W"])

    def initial_arrays(self) -> dict:
        start = self.start if self.start is not None else self.model.zeros()
        params = dict(zip(self.names, [a.copy() for a in (*start.A, start.W)]))
        state = flatten_state(self.rule.init(params))
        return {**params, **{f"opt.{k}": np.array(v) for k, v in state.items()}}

    def array_specs(self) -> dict:
        return {**{n: (s, np.float64) for n, s in self.shapes.items()}, **self._state_specs}

    def checkpoint_source(self, z, meta):
        if self._state_specs and not any(k.startswith("opt.") for k in z.files) or "rec_loss_se" not in z.files:
            return _LegacyCheckpoint(z, meta["t"])
        return z

    # -- schedule
    def should_record(self, t: int) -> bool:
        return t == 0 or t == self.total or t % self.config.record_every == 0

    def stage_of(self, t: int) -> int:
        return 0

    # -- records
    def record_specs(self, n: int) -> dict:
        f = np.float64
        specs = {"step": ((n,), np.int64), "loss": ((n,), f), "loss_se": ((n,), f), "grad_norm": ((n,), f),
                 "lr": ((n,), f)}
        specs.update({name: ((n, *s), f) for name, s in self.shapes.items()})
        return specs

    def record(self, arrays, step, t: int, stage: int):
        gnorm = math.sqrt(sum(float(np.sum(step.grads[n] * step.grads[n])) for n in self.names))
        lr = float(self._lr(t)) if callable(self._lr) else float("nan")
        out = [("step", t), ("loss", step.loss), ("loss_se", step.loss_se), ("grad_norm", gnorm), ("lr", lr)]
        out += [(n, arrays[n].copy()) for n in self.names]
        return out

    def update(self, arrays, grads, t: int) -> dict:
        params = {n: arrays[n] for n in self.names}
        state = unflatten_state({k[4:]: v for k, v in arrays.items() if k.startswith("opt.")}, self._state_like)
        updates, state = self.rule.update({n: grads[n] for n in self.names}, state, params)
        new = apply_updates(params, updates)
        flat = {f"opt.{k}": np.asarray(v) for k, v in flatten_state(state).items()}
        if {k: (v.shape, v.dtype) for k, v in flat.items()} != self._state_specs:
            raise ValueError(f"optimizer {_optimizer_name(self.rule)}: update returned a state whose layout differs "
                             "from init's (same keys, shapes and dtypes needed)")
        return {**{n: np.asarray(new[n], dtype=np.float64) for n in self.names}, **flat}

    def result(self, state) -> CatFormerTrajectory:
        rec = state.to_arrays()
        final = self.params_of({n: state.arrays[n].copy() for n in self.names})
        return CatFormerTrajectory(rec["step"], rec["loss"], rec["grad_norm"], rec["lr"],
                                   tuple(rec[n] for n in self.names[:-1]), rec["W"], final,
                                   state.status, state.message, self.config, rec["loss_se"], state.monotonicity,
                                   self.task.graph.to_string())


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


def _start_of(model, cfg, init):
    """The start parameters and the config's init fields, from ``init`` or (``init=None``) from ``cfg``."""
    if init is None:
        if cfg.init == "given":
            raise ValueError("config.init is 'given': pass the start parameters as init=CatFormerParams(...)")
        init = ("normal", cfg.init_scale, cfg.init_seed) if cfg.init == "normal" else "zero"
    start, kind, scale, seed, fingerprint = initial_params(model, init)
    return start, dict(init=kind, init_scale=scale, init_seed=seed, init_fingerprint=fingerprint)


def train_catformer(task, model: CatFormer, steps: int, config: CatFormerTrainConfig | None = None, *, init=None,
                    client=None, checkpoint_path=None, checkpoint_every: int = 0, resume: bool = False,
                    progress: bool = False, **overrides) -> CatFormerTrajectory:
    """Train the disentangled transformer with an optimizer on exact (or sampled) gradients.

    Parameters
    ----------
    task : Task or MultiParentTask
        Enumerable (``task.check_size()``) for ``gradient="exact"``; any size for ``"sampled"``.
    model : CatFormer
        Same ``S``, ``T`` as the task.
    steps : int
        Number of updates (``>= 1``); also the cosine schedule's ``decay_steps``.
    config : CatFormerTrainConfig, optional
        Every setting at once (``popgrad run`` passes its validated one); ``overrides`` replace some.
    init : "zero", ("normal", scale, seed) or CatFormerParams, optional
        The start (module docstring); default ``"zero"`` (or what ``config`` names).
    client : dask.distributed.Client, optional
        Split every exact enumeration over its workers (bit-identical to ``None``).
    checkpoint_path, checkpoint_every, resume, progress
        As in :func:`popgrad.train_two_stage` (the checkpoint also holds the optimizer's state).
    **overrides
        Settings of :class:`CatFormerTrainConfig`, validated there once:

        optimizer : {"sgd", "gd", "adam", "adamw"} or an optax-style object
            :mod:`popgrad.train.optim` (``"sgd"``/``"gd"``: ``g ← ∇L + wd·θ``, ``θ ← θ − lr_t g``;
            ``"adamw"``: ``optax.adamw``; ``"adam"``: ``optax.adam`` of ``∇L + wd·θ``), or any object with
            ``init(params)`` and ``update(grads, state, params)`` (e.g. ``popgrad.train.optim.adamw(...)``
            or your own; ``lr``, ``lr_schedule``, ``weight_decay`` are then part of it).
        lr : float
            Peak learning rate ``> 0`` (default 1).
        lr_schedule : {"cosine", "constant"}
            ``optax.cosine_decay_schedule(lr, steps)`` or constant.
        weight_decay : float
            ``wd >= 0``.
        record_every : int
            Record every this many steps (and steps ``0`` and ``steps``); default ``max(1, steps // 128)``
            (the official ``n_save = 128``).
        eps : float
            Loss perturbation (default: ``0`` for the softmax readout, ``T_eff**-0.5`` for the linear one).
        divergence_patience : int
            Steps in a row above the starting loss before the run stops as diverged (:mod:`popgrad.train.loop`).
        gradient : {"exact", "sampled"}
            The exact population gradient, or a fresh batch at every step (module docstring).
        batch_size : int
            Sequences per sampled step (default 1024; ``gradient="sampled"`` only).
        sample_seed : int
            Seed of the sampled batches (default 0; ``gradient="sampled"`` only).

    Returns
    -------
    CatFormerTrajectory
        ``final``, ``step``, ``loss`` (``loss_se``), ``grad_norm``, ``lr``, recorded ``A`` and ``W``,
        ``status``, ``monotonicity``.
    """
    check_task_model(task, model, None)
    unknown = set(overrides) - {f.name for f in fields(CatFormerTrainConfig)}
    if unknown:
        raise TypeError(f"train_catformer got unexpected keyword argument(s) {', '.join(sorted(unknown))}")
    shape = dict(S=model.S, T=model.T, heads=tuple(model.heads), readout=model.readout)
    if config is None:
        opt = overrides.get("optimizer", "sgd")
        if not isinstance(opt, str) and opt is not None:
            given = [k for k in _RULE_SETTINGS if k in overrides]
            if given:
                raise ValueError(f"{', '.join(given)}: part of the optimizer object you passed; drop "
                                 f"{'them' if len(given) > 1 else 'it'} (or pass optimizer by name)")
        overrides.setdefault("record_every", None)
        base = CatFormerTrainConfig(**shape, steps=steps, **overrides)
    elif not isinstance(config, CatFormerTrainConfig):
        raise ArgumentTypeError(f"config must be a popgrad.train.catformer.CatFormerTrainConfig, "
                                f"got {type(config).__name__}")
    else:
        mismatch = [k for k, v in shape.items() if getattr(config, k) != v]
        if mismatch:
            raise ValueError(f"config has {', '.join(f'{k} = {getattr(config, k)!r}' for k in mismatch)} but the "
                             f"model has {', '.join(f'{k} = {shape[k]!r}' for k in mismatch)}: build the config "
                             "for this model")
        base = replace(config, steps=steps, **overrides) if (overrides or steps != config.steps) else config
    start, init_fields = _start_of(model, base, init)
    cfg = replace(base, **init_fields) if any(getattr(base, k) != v for k, v in init_fields.items()) else base
    if cfg.gradient == "exact":
        task.check_size()
        prepare_table(task)  # many exact steps on one task: the weight table, once (the one rule, DESIGN §20)
    scheme = CatFormerScheme(task, model, cfg, start)
    state = start_state(task, scheme, checkpoint_path, checkpoint_every, resume)
    params = lambda: scheme.params_of(state.arrays)  # noqa: E731  (the current parameters)

    if cfg.gradient == "exact":
        def evaluate(t, stage, record) -> StepValues:
            res = catformer_loss_and_grad(task, model, params(), cfg.eps, client=client)
            return StepValues(res.loss, dict(zip(scheme.names, (*res.dA, res.dW))))
    else:
        eps = 0.0 if cfg.eps is None and model.readout == "softmax" else (
            task.default_eps if cfg.eps is None else cfg.eps)

        def evaluate(t, stage, record) -> StepValues:
            batch = task.sample(cfg.batch_size, np.random.SeedSequence([cfg.sample_seed, t]))
            loss, dA, dW, losses = batch_loss_and_grad(model, params(), batch.seqs, batch.targets, eps, record)
            grads = dict(zip(scheme.names, (*dA, dW)))
            if record:  # the batch estimate with its standard error (what the divergence rule reads)
                est = estimate(losses)
                return StepValues(est.value, grads, True, est.se, sampled=True)  # SE NaN for a batch of 1
            # between records only a non-finite batch loss is read (it stops the run)
            return StepValues(loss, grads, True) if not math.isfinite(loss) else StepValues(math.nan, grads, False)

    return run_schedule(task, scheme, state, evaluate, checkpoint_path=checkpoint_path,
                        checkpoint_every=checkpoint_every, progress=progress)
