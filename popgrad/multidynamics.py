"""Training the k-head model exactly: stage-wise (Algorithm 1 with k heads) or joint (DESIGN §8, §9).

Initialization breaks the head symmetry deterministically: with identical
heads the gradients of the heads are identical (the loss is symmetric under
permuting heads), so identical heads stay identical forever. popgrad starts
from::

    A1^h(0) = init_scale · Z^h   (lower triangle incl. the diagonal; Z^h i.i.d. N(0, 1)
                                  from numpy.random.default_rng(init_seed), heads in order)
    A2^h(0) = β0 · I

``init_scale = 0`` gives identical heads (and they stay identical: tested).

Schedules (learning rates in the natural units of :mod:`popgrad.dynamics`,
``η1 = lr1·S·T/β0``, ``η2 = lr2·S``):

* ``"two-stage"``: Stage 1 moves every ``A1^h`` with ``A2`` frozen at
  ``β0·I`` for ``steps1`` steps; Stage 2 moves every ``A2^h`` with ``A1``
  frozen for ``steps2`` steps.
* ``"joint"``: both move at every step for ``steps1 + steps2`` steps, with
  ``η1 = lr1·S·T`` (no ``1/β0``: ``A2`` leaves its initial scale at once)
  and ``η2``; this is how the paper's released code trains the multi-parent
  model (jointly, with Adam; popgrad uses exact full-batch gradient descent).

What the reduced k-head model learns depends on the schedule. Its query is
the soft vector ``Q^h = P^h[T-1,:] X``: at initialization ``P^h[T-1,:]`` is
nearly uniform, so ``Q^h`` is the sequence's token histogram and the
first-order (small-``β0``) gradient of ``A1^h`` rewards keys whose token is
frequent in the sequence, i.e. the diagonal (a unigram/copy solution).
Stage-wise training at small ``β0`` therefore tends to the diagonal. Joint
training at ``β0 = 2`` lets the query rows and the key rows co-adapt; what
it reaches was measured (``examples/multi_parent.py``, S = 2, T = 12,
Dirichlet(1) tensors closed under ``symmetrize="full"``): on the 3-gram the
two heads split the parents one-to-one from a random start, on the paper's
two-parent graph they settle in a mixed local minimum (one head mostly on
``i-1``) whose loss is above that of the specialized solution, which is a
stable minimum when started near the construction. Priors with few atoms
(or relabeling closure only, whose ``E[π]`` is not uniform) add
"copy a token" shortcuts that training finds first.

Returns the :class:`popgrad.Trajectory` of the single-parent dynamics with
per-head arrays: ``A1 (n, k, T, T)``, ``A2 (n, k, S, S)``,
``attn_parent (n, k, T)`` (head ``h``'s attention on slot ``h``'s parent,
:func:`attention_to_slot_parents`), ``cosine`` all NaN (no idealized
gradient for k heads). Checkpoint/resume and divergence detection are those
of :func:`popgrad.train_two_stage` (same machinery).
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

from ._io import atomic_savez
from .dynamics import MultiHeadTrainConfig, Trajectory, _checkpoint_payload, _State, load_checkpoint
from .multihead import exact_loss_and_grad_multi, head_attention
from .multiparent import MultiParentTask

__all__ = ["MultiHeadTrainConfig", "train_multi_head", "initial_parameters", "attention_to_slot_parents"]


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


def train_multi_head(
    task: MultiParentTask,
    *,
    beta0: float = 2.0,
    lr1: float = 2.0,
    steps1: int = 3000,
    lr2: float = 1.0,
    steps2: int = 0,
    schedule: str = "joint",
    init_seed: int = 0,
    init_scale: float = 0.1,
    A1_init=None,
    record_every: int = 10,
    eps: float | None = None,
    divergence_patience: int = 100,
    checkpoint_path=None,
    checkpoint_every: int = 0,
    resume: bool = False,
    progress: bool = False,
) -> Trajectory:
    """Train the k-head model exactly and record the trajectory.

    Parameters
    ----------
    task : MultiParentTask
    beta0 : float
        ``A2^h(0) = β0·I``.
    lr1, lr2 : float
        Natural-unit learning rates (module docstring).
    steps1, steps2 : int
        Stage lengths (``"joint"``: ``steps1 + steps2`` joint steps).
    schedule : {"joint", "two-stage"}
    init_seed : int
        Seed of the symmetry-breaking ``A1(0)``.
    init_scale : float
        Standard deviation of ``A1(0)`` (``0``: identical heads).
    A1_init : array_like, shape (k, T, T), optional
        Start from this ``A1`` instead (e.g. a weak construction, to test
        whether a solution is a stable minimum); ``init_seed`` and
        ``init_scale`` are then unused. Not part of the checkpoint's
        configuration check.
    record_every : int
        Record every this many steps (and the first/last step of each stage).
    eps : float, optional
        Loss perturbation; default ``T_eff ** -0.5``.
    divergence_patience : int
        Stop after this many consecutive loss increases (or at once on a
        non-finite loss or parameter).
    checkpoint_path, checkpoint_every, resume, progress
        As in :func:`popgrad.train_two_stage`.

    Returns
    -------
    Trajectory
        ``A1 (n, k, T, T)``, ``A2 (n, k, S, S)``, ``attn_parent (n, k, T)``,
        ``cosine`` NaN; ``config`` is a :class:`MultiHeadTrainConfig`.
    """
    if not isinstance(task, MultiParentTask):
        raise ValueError(f"task must be a popgrad.MultiParentTask, got {type(task).__name__}")
    cfg = MultiHeadTrainConfig(
        beta0=beta0, lr1=lr1, steps1=steps1, lr2=lr2, steps2=steps2, gradient="exact", schedule=schedule,
        record_every=record_every, eps=eps, divergence_patience=divergence_patience,
        init_seed=init_seed, init_scale=init_scale,
    ).validate()
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, (int, np.integer)) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be an integer >= 0, got {checkpoint_every!r}")
    if resume and checkpoint_path is None:
        raise ValueError("resume=True needs checkpoint_path")
    task.check_size()
    if resume:
        if not os.path.exists(checkpoint_path):
            raise ValueError(f"no checkpoint at {checkpoint_path} to resume from: run without --resume first")
        state = load_checkpoint(checkpoint_path, task, cfg)
    else:
        state = _State(task, cfg)
        state.A1, state.A2 = initial_parameters(task, cfg.beta0, cfg.init_seed, cfg.init_scale)
        if A1_init is not None:
            A1_init = np.array(A1_init, dtype=np.float64)
            if A1_init.shape != state.A1.shape or not np.all(np.isfinite(A1_init)):
                raise ValueError(f"A1_init must be a finite array of shape (k, T, T) = {state.A1.shape}, "
                                 f"got shape {A1_init.shape}")
            state.A1 = A1_init

    total = cfg.steps1 + cfg.steps2
    bar = None
    if progress and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, initial=state.t, desc="popgrad", unit="step", file=sys.stderr)
    joint = cfg.schedule == "joint"
    eta1 = cfg.lr1 * task.S * task.T if joint else cfg.eta1(task)
    eta2 = cfg.eta2(task)

    def stage_of(t):
        if joint:
            return 0
        return 1 if t <= cfg.steps1 else 2

    def should_record(t):
        if t in (0, cfg.steps1, total) or (not joint and t == cfg.steps1 + 1):
            return True
        return t % cfg.record_every == 0

    while not state.done:
        t = state.t
        stage = stage_of(t)
        record = should_record(t)
        last = t == total
        res = exact_loss_and_grad_multi(task, state.A1, state.A2, cfg.eps)
        loss = res.loss
        if record:
            if stage == 1:
                gnorm = float(np.linalg.norm(res.dA1))
            elif stage == 2:
                gnorm = float(np.linalg.norm(res.dA2))
            else:
                gnorm = float(np.sqrt(np.sum(res.dA1**2) + np.sum(res.dA2**2)))
            state.rec["step"].append(t)
            state.rec["stage"].append(stage)
            state.rec["loss"].append(loss)
            state.rec["grad_norm"].append(gnorm)
            state.rec["cosine"].append(float("nan"))
            state.rec["attn_parent"].append(attention_to_slot_parents(task.graph, state.A1))
            state.rec["A1"].append(state.A1.copy())
            state.rec["A2"].append(state.A2.copy())
        # --- divergence (as train_two_stage)
        if not (np.all(np.isfinite(state.A1)) and np.all(np.isfinite(state.A2))) or math.isnan(loss):
            state.status = "diverged"
            state.message = f"non-finite loss or parameters at step {t}: lower lr1/lr2"
            break
        if math.isinf(loss):
            state.status = "diverged"
            state.message = f"infinite loss at step {t} (eps = 0 and a token got zero mass?)"
            break
        state.increases = state.increases + 1 if loss > state.prev_loss else 0
        state.prev_loss = loss
        if state.increases >= cfg.divergence_patience:
            state.status = "diverged"
            state.message = (
                f"loss increased for {state.increases} consecutive steps (step {t}, loss {loss:.6g}): lower lr1/lr2"
            )
            break
        if last:
            break
        # --- update (step t -> t+1)
        if joint:
            state.A1 = state.A1 - eta1 * res.dA1
            state.A2 = state.A2 - eta2 * res.dA2
        elif t < cfg.steps1:
            state.A1 = state.A1 - eta1 * res.dA1
        else:
            state.A2 = state.A2 - eta2 * res.dA2
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
    arrays = state.to_arrays()
    return Trajectory(**arrays, status=state.status, message=state.message, config=cfg)
