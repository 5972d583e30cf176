"""Algorithm 1 of the paper: two-stage gradient descent, stepped exactly (DESIGN §8).

Stage 1: ``A1(0) = 0``, ``A2 = β0·I`` frozen, ``A1 ← A1 - η1 ∇_{A1} L`` for
``steps1`` steps. Stage 2: ``A1`` frozen at ``A1(τ1)``,
``A2 ← A2 - η2 ∇_{A2} L`` for ``steps2`` steps.

Learning rates are given in natural units (:mod:`popgrad.train.config`):
``η1 = lr1 · S · T / β0``, ``η2 = lr2 · S``. The loop, its state and the
checkpoints are :mod:`popgrad.train.loop`; the record is
:class:`popgrad.train.trajectory.Trajectory`.

The Stage-1 gradient is ``"exact"`` (enumeration,
:func:`popgrad.exact_loss_and_grad`), ``"field"`` (the exact first-order field,
:func:`popgrad.stage1_field`, any ``T``) or ``"idealized"``
(:func:`popgrad.idealized_grad_A1`, polynomial in ``T``). Stage 2 uses the exact
gradient, or the sample-average approximation (``stage2="sampled"``).
``gradient="sgd"`` is minibatch SGD as the official code runs it: at every
step (both stages, or joint) a fresh batch of ``batch_size`` samples with soft
labels from ``task.sample`` (seed ``(sample_seed, t)``: deterministic and
resumable), the same step sizes and schedule. ``schedule="joint"`` instead moves both matrices at
every step (as the paper's released code does), with the same ``η1``, ``η2``.

Every computation is deterministic, so a run resumed from a checkpoint is
bit-identical to an uninterrupted one.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .._validation import ArgumentTypeError
from ..engine.api import exact_loss, exact_loss_and_grad
from ..engine.field import field_grad_A1, stage1_field
from ..engine.sampled import SampledObjective, default_samples, estimate
from ..engine.single import rows_loss_and_grad, rows_losses
from ..engine.table import prepare_table
from ..task.tasks import Task, TaskTooLargeError, check_task
from ..theory.information import has_idealized_gradient, idealized_grad_A1
from .config import TrainConfig, resolve_auto
from .loop import StepValues, run_schedule, start_state
from .reduced import ReducedScheme
from .trajectory import Trajectory, attention_to_parent

__all__ = ["train_two_stage", "idealized_available"]


def _grads(dA1, dA2) -> dict:
    """The step's gradients under the scheme's names (only those computed)."""
    return {k: v for k, v in (("A1", dA1), ("A2", dA2)) if v is not None}


def _cos(a, b) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return float("nan")
    return float(np.sum(a * b) / (na * nb))


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
    batch_size: int = 0,
    config: TrainConfig | None = None,
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
    gradient : {"exact", "field", "idealized", "sgd", "auto"}
        Stage-1 gradient. ``"sgd"``: minibatch SGD in both stages (and joint
        training): step ``t`` draws a fresh batch ``task.sample(batch_size,
        SeedSequence([sample_seed, t]))`` and follows the gradient of its mean
        loss (soft labels), with the step sizes and schedule of the population run;
        the recorded loss is the exact population loss when the task can be
        enumerated (so it compares with an exact run), else the batch's estimate
        with its standard error. ``"field"``: the exact first-order (in ``β0``)
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
        Stop (status ``"diverged"``) when the loss stays above its value at the start of the stage
        for this many steps, or at once on a non-finite loss or parameter; a stage that ends above
        its start is diverged too. Rises that come back are recorded
        (``Trajectory.monotonicity``), not stopped (:mod:`popgrad.train.loop`).
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
        Seed of the Stage-2 sample, or of the SGD batches.
    batch_size : int
        Samples per SGD step (``gradient="sgd"`` only; the paper's code uses 1024).
    config : TrainConfig, optional
        Every setting at once (``popgrad run`` passes its resolved one); the keyword settings
        ``beta0 … batch_size`` are then unused. ``"auto"`` in it is resolved by the same rule.
    client : dask.distributed.Client, optional
        Split every exact enumeration over its workers (:mod:`popgrad.engine.distributed`;
        bit-identical to ``None``, this process).

    Returns
    -------
    Trajectory
    """
    check_task(task, Task, "train_two_stage (train_multi_head trains k-parent tasks)")
    enumerable = task.enumerable
    if config is None:
        config = TrainConfig(
            beta0=beta0, lr1=lr1, steps1=steps1, lr2=lr2, steps2=steps2, gradient=gradient,
            schedule=schedule, record_every=record_every, eps=eps, divergence_patience=divergence_patience,
            stage2=stage2, samples=0 if samples is None else samples, sample_seed=sample_seed, batch_size=batch_size,
        )
    elif type(config) is not TrainConfig:
        raise ArgumentTypeError(f"config must be a popgrad.TrainConfig, got {type(config).__name__}")
    gradient, stage2 = resolve_auto(config.gradient, config.stage2, enumerable, config.steps2)
    cfg = replace(config, gradient=gradient, stage2=stage2).validate()
    sampled = cfg.stage2 == "sampled" and cfg.steps2 > 0
    if not enumerable and cfg.gradient != "sgd" and (cfg.gradient == "exact" or (cfg.steps2 > 0 and not sampled) or cfg.schedule == "joint"):
        what = ("Exact Stage 2 (steps2 > 0)" if cfg.steps2 > 0 else "Joint training") if cfg.gradient != "exact" \
            else "The exact Stage-1 gradient"
        try:
            task.check_size()
        except TaskTooLargeError as exc:
            raise TaskTooLargeError(
                f"{what} needs the exact population: {exc} For Stage 1 at any T: gradient='field' "
                "(or 'idealized'); for Stage 2 beyond enumeration: stage2='sampled'."
            ) from None
    if enumerable and cfg.gradient != "sgd":
        prepare_table(task)  # many exact evaluations on one task: the weight table, once (the one rule, DESIGN §20)
    graph = task.graph
    scheme = ReducedScheme(task, cfg, lambda A1: attention_to_parent(graph, A1), cfg.eta1(task), cfg.eta2(task))
    state = start_state(task, scheme, checkpoint_path, checkpoint_every, resume)
    arrays = lambda: (state.arrays["A1"], state.arrays["A2"])  # noqa: E731  (the current parameters)

    field_M = stage1_field(task, cfg.eps).M if cfg.gradient == "field" else None
    saa = {}  # the Stage-2 objective, built at the first step that needs it (A1 is then frozen)

    def objective():
        if "obj" not in saa:
            n = cfg.samples
            if n == 0:  # A1 is frozen from here on and A2 starts at β0·I: the same n after a resume
                n, _ = default_samples(task, state.arrays["A1"], cfg.beta0 * np.eye(task.S), cfg.eps)
            saa["obj"] = SampledObjective(task, n, cfg.sample_seed, cfg.eps, options=None)
        return saa["obj"]

    # The idealized gradient divides by the stationary probabilities: without it, no cosine is recorded.
    has_ideal = has_idealized_gradient(task)
    if cfg.gradient == "idealized" and not has_ideal:
        raise ValueError("gradient='idealized' needs every prior draw to have stationary probabilities > 0 "
                         "(a reducible draw, e.g. from a small alpha, has zeros): use gradient='exact' or 'field'")

    sgd_eps = task.default_eps if cfg.eps is None else cfg.eps

    def sgd_step(t, stage, record) -> StepValues:
        A1, A2 = arrays()
        batch = task.sample(cfg.batch_size, np.random.SeedSequence([cfg.sample_seed, t]))
        w = batch.targets / cfg.batch_size
        res = rows_loss_and_grad(batch.seqs, w, A1, A2, sgd_eps, want_dA1=stage != 2)
        loss, se = float("nan"), float("nan")
        if record and enumerable:
            loss = exact_loss(task, A1, A2, cfg.eps, client=client)
        elif record:
            est = estimate(rows_losses(batch.seqs, batch.targets, A1, A2, sgd_eps))
            loss, se = est.value, est.se
        return StepValues(loss, _grads(res.dA1, res.dA2), record, se)

    def evaluate(t, stage, record) -> StepValues:
        if cfg.gradient == "sgd":
            return sgd_step(t, stage, record)
        A1, A2 = arrays()
        if sampled and cfg.steps1 <= t:  # Stage 2 (and the step that starts it) on the fixed sample
            obj = objective()
            res = obj.loss_and_grad(A1, A2, want_dA1=stage == 1 and field_M is None)
            se = float(obj.loss(A1, A2).se) if record else float("nan")
            dA1 = field_grad_A1(field_M, A1, cfg.beta0) if stage == 1 and field_M is not None else res.dA1
            return StepValues(res.loss, _grads(dA1, res.dA2), True, se)
        # Stage 2, joint training and the step that starts Stage 2 need the exact gradient.
        needs_exact = cfg.gradient == "exact" or stage != 1 or cfg.steps1 <= t < cfg.steps1 + cfg.steps2
        loss = float("nan")
        exact = None
        if needs_exact:
            exact = exact_loss_and_grad(task, A1, A2, cfg.eps, client=client)
            loss = exact.loss
        elif record and enumerable:
            loss = exact_loss(task, A1, A2, cfg.eps, client=client)
        dA1 = dA2 = None
        if stage == 1 or cfg.schedule == "joint":
            if cfg.gradient == "idealized" and stage == 1:
                dA1 = idealized_grad_A1(task, A1, cfg.beta0)
            elif cfg.gradient == "field" and stage == 1:
                dA1 = field_grad_A1(field_M, A1, cfg.beta0)
            else:
                dA1 = exact.dA1
        if exact is not None:
            dA2 = exact.dA2
        cosine = float("nan")
        if record and stage == 1 and has_ideal:
            if cfg.gradient == "exact":
                exact_dA1, ideal = dA1, idealized_grad_A1(task, A1, cfg.beta0)
            elif cfg.gradient == "field":  # the exact first-order gradient against Knowl 3's prediction
                exact_dA1, ideal = dA1, idealized_grad_A1(task, A1, cfg.beta0)
            else:
                ideal = dA1
                exact_dA1 = None
                if exact is not None:
                    exact_dA1 = exact.dA1
                elif enumerable:
                    exact_dA1 = exact_loss_and_grad(task, A1, A2, cfg.eps, client=client).dA1
            if exact_dA1 is not None:
                cosine = _cos(exact_dA1, ideal)
        return StepValues(loss, _grads(dA1, dA2), exact is not None, extra={"cosine": cosine})

    traj = run_schedule(task, scheme, state, evaluate, checkpoint_path=checkpoint_path,
                        checkpoint_every=checkpoint_every, progress=progress)
    if sampled:
        traj = replace(traj, stage2_samples=objective().n)
    return traj


#: The old name of :func:`popgrad.theory.information.has_idealized_gradient` (the one predicate).
idealized_available = has_idealized_gradient
