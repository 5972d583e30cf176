"""One record per kind of run: what ``popgrad run`` does differently for each (DESIGN §11).

:data:`KINDS` holds a :class:`Kind` per kind of run -- the reduced model on a
single-parent task (Algorithm 1), the reduced ``k``-head model on a
multi-parent task, and the full disentangled transformer (``--model
catformer``, any task). Each record holds its trainer's config class, how the
task and the trainer's config are built from the settings, the trainer, the
reference losses, the checks (and which of them a diverged run reports as
inconclusive), the figures and the console notes. :func:`kind_of` is the one
place that decides the kind; :func:`popgrad.app.jobs.run` looks it up once
(through :func:`popgrad.app.config.settle`) and never branches on it again.

Per kind:

* ``reduced-single``: :func:`popgrad.train_two_stage`; checks graph recovery,
  gradient alignment (a T sweep of the field), DPI in the field, loss
  convergence (exact or on the Stage-2 sample), OOD, roots (a T sweep); the
  loss sweep over T; figures ``attention.png``, ``loss.png``,
  ``gradient_cosine.png``, ``attention_to_parent.png``.
* ``reduced-k-head``: :func:`popgrad.train_multi_head` (seeded
  symmetry-breaking start, ``init_seed = --seed``) on the prior
  :func:`popgrad.dirichlet_tensor_prior` with ``symmetrize="full"``; checks
  ``head_specialization`` in place of graph recovery, loss convergence against
  the count estimator of "Knowl 9", roots per head; gradient alignment and OOD
  are reported as not applicable (no idealized k-head gradient, no k-parent OOD
  check), never faked; no T sweep; no ``gradient_cosine.png``.
* ``catformer``: :func:`popgrad.train_catformer` with the official
  optimizers; references at ``ε = 0`` (the softmax readout's loss); checks
  ``catformer_graph_recovery`` (single-parent), ``head_specialization``
  (k-parent, on the population-average attention) and ``induction_head``;
  figures ``loss.png``, ``attention.png`` (population-average layer-1
  attention of each head beside the true graph), ``attention_to_parent.png``.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import checks as C
from .._validation import is_int
from ..checks import catformer as CC
from ..engine.baselines import count_estimator_loss, optimal_loss
from ..engine.sampled import SampledObjective, sampled_reference_losses
from ..model.catformer import CatFormer
from ..task import (MultiParentTask, Task, chain, dirichlet_prior, dirichlet_tensor_prior, icl_pairs, ngram,
                    random_tree, two_parent)
from ..task.priors import MAX_CLOSURE_ATOMS
from ..theory.information import has_idealized_gradient
from ..train.algorithm1 import train_two_stage
from ..train.catformer import CatFormerScheme, CatFormerTrainConfig, train_catformer
from ..train.config import GRADIENTS, STAGE2_METHODS, MultiHeadTrainConfig, TrainConfig, resolve_auto
from ..train.loop import load_checkpoint
from ..train.multihead import train_multi_head
from ..train.optim import LR_SCHEDULES, OPTIMIZERS
from . import plots as P
from .config import MAX_S, MAX_T, MULTI_PARENT_GRAPHS, CLIError, parse_parents
from .report import reference_value

__all__ = ["Kind", "KINDS", "kind_of", "build_task", "build_graph", "graph_family", "ALIGNMENT_TOP_T", "ROOTS_TOP_T"]

#: Largest T of the job's gradient-alignment sweep of the Stage-1 field (T_eff = T for a chain): a few
#: seconds on 2 cores for S <= 3 (examples/alignment_at_scale.py goes to T_eff = 1000).
ALIGNMENT_TOP_T = 200

#: Largest T of the job's roots sweep (Knowl 3.3 over T, from the Stage-1 field; see default_roots_T).
ROOTS_TOP_T = 80


@dataclass(frozen=True)
class Kind:
    """What one kind of run does; every callable takes the run's :class:`popgrad.app.config.RunConfig` ``rc``.

    Attributes
    ----------
    name : str
    config_class : type
        The trainer's config class (``rc.train`` is one).
    settle : callable ``(values, task) -> (updates, train_config)``
        Resolves ``"auto"`` and validates the trainer's settings (one-line :class:`CLIError`).
    train : callable ``(rc, **run_options) -> trajectory``
        ``run_options``: ``checkpoint_path``, ``checkpoint_every``, ``resume``, ``progress``, ``client``.
    references : callable ``(rc, trajectory, sampled) -> (refs, objective)``
    checks : callable ``(rc, trajectory, refs, objective) -> (results, extra report sections)``
    check_names : tuple of str
        The checks a diverged run reports as inconclusive.
    plots : callable ``(folder, rc, trajectory, refs, context)``
    notes : callable ``(rc) -> list of str``
        Console lines before training.
    check_resume : callable ``(checkpoint_path, rc)``
        Refuses a damaged or foreign checkpoint before anything is written.
    """

    name: str
    config_class: type
    settle: Callable
    train: Callable
    references: Callable
    checks: Callable
    check_names: tuple
    plots: Callable
    notes: Callable = lambda rc: []
    check_resume: Callable = lambda path, rc: load_checkpoint(path, rc.task, rc.train)
    build_task: Callable = None  # set below: every kind builds its task the same way

    def __post_init__(self):
        if self.build_task is None:
            object.__setattr__(self, "build_task", build_task)


# ------------------------------------------------------------------- tasks
def build_graph(spec: str, T: int, seed: int):
    """The single-parent graph of ``--graph``: a family at ``T`` or a parents string."""
    if spec == "chain":
        return chain(T)
    if spec == "icl":
        return icl_pairs(T)
    if spec == "random":
        return random_tree(T, seed=seed, root_prob=0.2)
    if "," in spec or spec.lstrip("-").isdigit():
        return parse_parents(spec)
    raise CLIError(f"unknown --graph {spec!r}: use chain, icl, random, ngram (with --n), two-parent, "
                   "or a parents string such as -1,0,0,1,-1")


def graph_family(spec: str, seed: int):
    """``T -> graph`` for sweeps, or ``None`` for a fixed parents string."""
    if spec in ("chain", "icl", "random"):
        return lambda T: build_graph(spec, T, seed)
    return None


def build_task(cfg) -> Task | MultiParentTask:
    """The task of merged settings: a :class:`popgrad.Task`, or a :class:`popgrad.MultiParentTask` for
    ``graph`` in :data:`MULTI_PARENT_GRAPHS`; ranges checked, one-line :class:`CLIError`."""
    S, T, spec = cfg["S"], cfg["T"], cfg["graph"]
    if not 2 <= S <= MAX_S:
        raise CLIError(f"--S {S} is out of range: use 2 <= S <= {MAX_S}")
    if (spec in ("chain", "icl", "random") or spec in MULTI_PARENT_GRAPHS) and not 2 <= T <= MAX_T:
        raise CLIError(f"--T {T} is out of range: use 2 <= T <= {MAX_T}")
    if not cfg["alpha"] > 0:
        raise CLIError(f"--alpha {cfg['alpha']} must be > 0 (Dirichlet concentration)")
    floor = cfg.get("floor", 0.0)
    if not 0 <= floor < 1:
        raise CLIError(f"--floor {floor} must be in [0, 1): the weight of the uniform matrix in each draw")
    if spec in MULTI_PARENT_GRAPHS:
        n_relabel = math.factorial(S)  # the k-parent closure is built: refuse one too large first
        if cfg["atoms"] * n_relabel > MAX_CLOSURE_ATOMS:
            most = MAX_CLOSURE_ATOMS // n_relabel
            fix = f"use --atoms {most} or fewer" if most >= 1 else "use a smaller --S"
            raise CLIError(f"--S {S} --atoms {cfg['atoms']}: the prior closed under all {S}! relabelings has "
                           f"{cfg['atoms'] * n_relabel:,} atoms (limit {MAX_CLOSURE_ATOMS:,}): {fix}")
        if spec == "ngram":
            n = cfg.get("n", 3)
            if not is_int(n) or not 2 <= n <= T:
                raise CLIError(f"--n {n} is out of range for --graph ngram: use 2 <= n <= T = {T}")
            graph = ngram(T, n)
        else:
            graph = two_parent(T)
        if floor != 0:
            raise CLIError(f"--floor {floor} is not available for multi-parent graphs (their tensor prior "
                           "has no floor): drop --floor")
        prior = dirichlet_tensor_prior(S, graph.k, cfg["alpha"], cfg["atoms"], seed=cfg["seed"], symmetrize="full")
        return MultiParentTask(graph, prior, max_sequences=cfg["max_sequences"])
    graph = build_graph(spec, T, cfg["seed"])
    kw = dict(seed=cfg["seed"], symmetrize=True, floor=floor)
    try:
        prior = dirichlet_prior(S, cfg["alpha"], cfg["atoms"], uniform_mean=cfg["uniform_mean"], **kw)
    except ValueError as exc:
        if not (cfg["uniform_mean"] and "reweight" in str(exc)):
            raise
        # every draw's trace is on one side of 1: no tilt gives a uniform mean. Keep equal weights; the
        # report's hypotheses table shows Knowl 10.3 failing and says why (UNIFORM_MEAN_IMPOSSIBLE).
        prior = dirichlet_prior(S, cfg["alpha"], cfg["atoms"], uniform_mean=False, **kw)
    return Task(graph, prior, max_sequences=cfg["max_sequences"])


def _too_large(task):
    """``(what the enumeration needs, how to make it smaller)`` for the one-line errors."""
    if task.n_sequences > task.max_sequences or isinstance(task, MultiParentTask):
        n = task.n_sequences
        count = f"{n:,}" if n < 10**15 else f"about 10^{task.T * np.log10(task.S):.0f}"
        return (f"S**T = {task.S}**{task.T} = {count} sequences (over --max-sequences {task.max_sequences:,})",
                "a smaller S or T, or a larger --max-sequences")
    return (f"all {task.prior.K:,} atoms of the prior ({task.prior.base.K} draws x {task.S}! relabelings)",
            "fewer --atoms or a smaller S")


def _memory_bytes() -> int | None:
    """The memory this process may use (physical, or its ``ulimit -v`` when lower), or ``None`` where unknown."""
    from .._io import memory_limit

    return memory_limit()


def _size(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


def check_sample_size(cfg, task) -> None:
    """Refuse a sampled Stage 2 whose sample cannot fit in memory: ``--samples`` x (T tokens + 2 S
    label weights) x 8 bytes, against half of the memory this process may use (physical or its ulimit -v)."""
    n = cfg.get("samples", 0)
    if cfg.get("stage2") != "sampled" or not n or cfg.get("steps2", 0) == 0:
        return
    need = n * (task.T + 2 * task.S) * 8
    memory = _memory_bytes()
    if memory is not None and need > memory // 2:
        most = max(2, memory // 2 // ((task.T + 2 * task.S) * 8))
        raise CLIError(f"--samples {n:,} needs about {_size(need)} for the Stage-2 sample (n x (T + 2S) x 8 bytes), "
                       f"more than half of the {_size(memory)} this process may use: use --samples {most:,} or fewer, or "
                       "--samples 0 (chosen from a pilot sample for a standard error of 1e-3)")


def _config(cls, **kw):
    try:
        return cls(**kw).validate()
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _reduced_train_kwargs(cfg) -> dict:
    return dict(beta0=cfg["beta0"], lr1=cfg["lr1"], steps1=cfg["steps1"], lr2=cfg["lr2"], steps2=cfg["steps2"],
                schedule=cfg["schedule"], record_every=cfg["record_every"])


def _exact_refs(task, eps=None):
    return {k: ({"value": v, "kind": "exact"} if k != "eps" else v) for k, v in C.reference_losses(task, eps).items()}


def _a1_hat(rc, traj):
    """The first layer the checks read: after Stage 1 (two-stage, completed) or at the end."""
    if rc["schedule"] == "two-stage" and traj.status == "completed":
        return traj.A1[traj.stage1_end]
    return traj.final_A1


# ---------------------------------------------------- reduced, single-parent
def _settle_single(cfg, task):
    if cfg["schedule"] not in ("two-stage", "joint"):
        raise CLIError(f"--schedule {cfg['schedule']!r}: use two-stage or joint")
    enumerable = task.enumerable
    for key, choices in (("gradient", ("auto",) + GRADIENTS), ("stage2", ("auto",) + STAGE2_METHODS)):
        if cfg[key] not in choices:
            raise CLIError(f"--{key} {cfg[key]!r}: use {' or '.join(choices)}")
    gradient, stage2 = resolve_auto(cfg["gradient"], cfg["stage2"], enumerable, cfg["steps2"])
    size, smaller = _too_large(task)
    if not enumerable and gradient == "exact":
        raise CLIError(f"--gradient exact needs {size}: use --gradient field (exact to first order, any T), "
                       f"{smaller}")
    if not enumerable and stage2 == "exact" and cfg["steps2"] > 0:
        raise CLIError(f"--stage2 exact needs {size}: use --stage2 sampled (the default beyond enumeration), "
                       f"--steps2 0, {smaller}")
    if not enumerable and cfg["schedule"] == "joint":
        raise CLIError(f"--schedule joint needs {size}: use --schedule two-stage")
    if gradient == "idealized" and not has_idealized_gradient(task):
        raise CLIError(f"--gradient idealized --alpha {cfg['alpha']}: a prior draw is reducible (a stationary "
                       "probability is 0) and the idealized gradient divides by it: use --gradient exact or field, "
                       "or a larger --alpha")
    updates = dict(gradient=gradient, stage2=stage2)
    check_sample_size({**cfg, **updates}, task)
    train = _config(TrainConfig, **_reduced_train_kwargs(cfg), gradient=gradient, stage2=stage2,
                    samples=cfg["samples"], sample_seed=cfg["sample_seed"])
    return updates, train


def _train_single(rc, **run):
    return train_two_stage(rc.task, config=rc.train, **run)


def _refs_single(rc, traj, sampled=True):
    """Reference losses, each ``{"value", "kind": "exact"|"sampled"[, "se", "n"]}``; and the Stage-2 objective."""
    task = rc.task
    objective = None
    if task.enumerable:
        refs = _exact_refs(task)
    else:
        eps = task.default_eps
        refs = {"eps": eps, "L_star": {"value": optimal_loss(task), "kind": "exact"},
                "L_star_eps": {"value": optimal_loss(task, eps=eps), "kind": "exact"},
                "L_floor_eps": {"value": None, "kind": "exact",
                                "reason": "the floor is a sum over all S**T sequences: needs enumeration"}}
    if sampled and rc["stage2"] == "sampled" and traj.stage2_samples:
        objective = SampledObjective(task, traj.stage2_samples, rc["sample_seed"])
        for k, v in sampled_reference_losses(objective, traj.final_A1, traj.final_A2).items():
            refs[k if k not in refs else k + "_sampled"] = v
    return refs, objective


def _stage2_optimum(task, traj, objective):
    """Stage 2 run to convergence at the trained A1 (exact 1-D minimization; None where it does not apply)."""
    if not task.prior.is_relabeling_closed() or traj.config.schedule != "two-stage":
        return None
    if objective is None and not task.enumerable:
        return None
    return C.converge_stage2(task, traj.final_A1, objective=objective)


def _checks_single(rc, traj, refs, objective=None):
    task, cfg = rc.task, rc
    A1_hat = _a1_hat(rc, traj)
    family = graph_family(cfg["graph"], cfg["seed"])
    enumerable = task.enumerable
    exact_stage2 = objective is None
    hyp = C.measure_hypotheses(task)
    T_sweep = list(range(max(4, (task.T + 1) // 2), task.T + 1)) if cfg["sweep"] and family and enumerable \
        and exact_stage2 else None
    extra = {}
    sweep = None
    if T_sweep:
        sweep = C.loss_sweep(family, task.prior, T_sweep, dict(_reduced_train_kwargs(cfg), gradient=cfg["gradient"],
                                                               stage2=cfg["stage2"], samples=cfg["samples"],
                                                               sample_seed=cfg["sample_seed"]))
        extra["loss_sweep"] = {
            "T": sweep["T"], "t_eff": sweep["t_eff"], "excess_over_L_star_eps": sweep["excess"],
            "excess_over_bayes_eps": sweep["excess_bayes"], "excess_over_floor_eps": sweep["excess_floor"],
            "fitted_exponent": sweep["fit"].exponent, "fitted_exponent_stderr": sweep["fit"].stderr,
        }
    if not has_idealized_gradient(task):
        alignment = C.not_applicable("gradient_alignment", "S*M_i = g_i + O(T_eff^-1/2) (Knowl 3)",
                                     "a prior draw is reducible (a stationary probability is 0): the idealized "
                                     "gradient g divides by it")
    elif family is not None and cfg["sweep"]:  # Knowl 3 at T_eff up to 200: the exact first-order field
        alignment = C.check_alignment_rate(family, task.prior, C.default_alignment_T(task.S, top=ALIGNMENT_TOP_T),
                                           name="gradient_alignment", hypotheses=hyp)
    elif enumerable:
        alignment = C.check_gradient_alignment(task, traj, hypotheses=hyp)
    else:
        alignment = C.not_applicable("gradient_alignment", "S*M_i = g_i + O(T_eff^-1/2) (Knowl 3)",
                                     "needs a graph family over T (chain, icl, random) and the sweep")
    if family is not None and cfg["sweep"]:  # Knowl 3.3 is a statement about T: a sweep of the field
        roots = C.check_roots_at_scale(family, task.prior, C.default_roots_T(task.S, top=ROOTS_TOP_T),
                                       lr1=cfg["lr1"], steps1=cfg["steps1"], beta0=cfg["beta0"],
                                       name="roots_uniform", hypotheses=hyp)
    else:
        roots = C.check_roots(task, A1_hat, hypotheses=hyp)
    optimum = _stage2_optimum(task, traj, objective)
    if optimum is not None:
        extra["stage2_optimum"] = {"alpha_star": optimum.alpha, "loss": optimum.loss, "loss_se": optimum.loss_se,
                                   "kind": optimum.kind, "dloss_dalpha": optimum.dloss_dalpha,
                                   "note": "Stage 2 run to convergence at the trained A1: A2 = alpha* I minimizes "
                                           "the loss (exact 1-D minimization under a relabeling-closed prior)"}
    exact_refs = {k: reference_value(v) for k, v in refs.items()} if enumerable else None
    ood_sweep = [(t, a1, a2) for (t, _, a1, a2) in sweep["params"]] if sweep else None
    results = [
        C.check_graph_recovery(task, A1_hat, hypotheses=hyp),
        alignment,
        C.within_hypotheses(C.check_field_dpi(task), hyp),
        C.check_loss_convergence(task, traj.final_A1, traj.final_A2, cfg["beta0"], references=exact_refs,
                                 trajectory=traj, optimum=optimum, hypotheses=hyp)
        if exact_stage2 else C.check_loss_convergence_sampled(objective, traj.final_A1, traj.final_A2,
                                                              trajectory=traj, optimum=optimum, hypotheses=hyp),
        C.check_ood(task, traj.final_A1, traj.final_A2, sweep=ood_sweep, hypotheses=hyp) if enumerable
        else C.check_ood_sampled(task, traj.final_A1, traj.final_A2, seed=cfg["sample_seed"], hypotheses=hyp),
        roots,
    ]
    if objective is not None:
        extra["stage2"] = {"method": "sampled", "samples": objective.n, "sample_seed": objective.seed,
                           "labels": "soft label of the drawing atom, pi(.|q)",
                           "projection": "dA2 projected onto span{I, 11^T}" if objective.project else "none"}
    return results, extra


def _plots_single(out, rc, traj, refs, context=""):
    task = rc.task
    how = {"field": "trained on the first-order field", "idealized": "trained on the idealized gradient"}.get(
        traj.config.gradient, "trained on the exact gradient")
    P.plot_attention(task.graph, _a1_hat(rc, traj), os.path.join(out, "attention.png"),
                     title=f"after Stage 1 ({how})", context=context)
    P.plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)
    P.plot_cosine(traj, os.path.join(out, "gradient_cosine.png"), context=context)
    P.plot_attention_to_parent(traj, task.graph, os.path.join(out, "attention_to_parent.png"), context=context)


def _notes_single(rc):
    from .report import UNIFORM_MEAN_IMPOSSIBLE

    if rc["uniform_mean"] and not rc.task.prior.diagnostics().uniform_mean:
        return [f"note: {UNIFORM_MEAN_IMPOSSIBLE}"]
    return []


# --------------------------------------------------------- reduced, k heads
def _settle_multi(cfg, task):
    if cfg["schedule"] not in ("two-stage", "joint"):
        raise CLIError(f"--schedule {cfg['schedule']!r}: use two-stage or joint")
    if cfg["gradient"] not in ("auto", "exact"):
        raise CLIError(f"--gradient {cfg['gradient']} is not available for multi-parent graphs: use exact")
    if cfg["stage2"] not in ("auto", "exact"):
        raise CLIError(f"--stage2 {cfg['stage2']} is not available for multi-parent graphs: use exact")
    task.check_size()  # the k-head job needs the exact population throughout
    train = _config(MultiHeadTrainConfig, **_reduced_train_kwargs(cfg), init_seed=cfg["seed"])
    return dict(gradient="exact", stage2="exact"), train


def _train_multi(rc, **run):
    return train_multi_head(rc.task, config=rc.train, **run)


def _refs_multi(rc, traj, sampled=True):
    return _exact_refs(rc.task), None


def _checks_multi(rc, traj, refs, objective=None):
    task = rc.task
    A1_hat = _a1_hat(rc, traj)
    results = [
        C.check_head_specialization(task, A1_hat),
        C.not_applicable(
            "gradient_alignment", "grad_A1 L = -(b0/(S T)) J(P_i)(g_i + O(T_eff^-1/2)) (Knowl 3)",
            "the idealized gradient is derived for single-parent trees with a token query; the k-head model's "
            "query is the soft layer-1 output of the last position",
        ),
        C.check_loss_convergence(task, traj.final_A1, traj.final_A2, rc["beta0"],
                                 references={k: reference_value(v) for k, v in refs.items()},
                                 init_seed=traj.config.init_seed, init_scale=traj.config.init_scale,
                                 trajectory=traj if rc["schedule"] == "two-stage" else None),
        C.not_applicable(
            "ood_generalization", "sup_c |f(s)_c - pi~(c|s_T)| small for an unseen pi~ (Knowl 4)",
            "Knowl 4 is stated for single-parent graphs; popgrad has no k-parent out-of-distribution check",
        ),
        C.check_roots(task, A1_hat),
    ]
    extra = {"multi_parent": {
        "k": task.k,
        "target_parents": [int(x) for x in task.graph.target_parents],
        "prior": "dirichlet_tensor_prior(symmetrize='full'): relabelings of parents and predicted token",
        "roots": "draw uniformly (popgrad's stated k-parent process)",
        "loss_sweep": "not run for multi-parent graphs",
    }}
    return results, extra


def _plots_multi(out, rc, traj, refs, context=""):
    graph = rc.task.graph
    P.plot_head_attention(graph, _a1_hat(rc, traj), os.path.join(out, "attention.png"), context=context)
    P.plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)
    P.plot_head_attention_to_parent(traj, graph, os.path.join(out, "attention_to_parent.png"), context=context)


# ------------------------------------------------------- the full model
def parse_heads(text) -> tuple:
    """``--heads 2,1`` as ``(2, 1)``: heads per layer, each >= 1."""
    parts = str(text).split(",")
    if not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise CLIError(f"--heads {text!r}: give the heads of each layer as integers >= 1, e.g. 2,1")
    return tuple(int(p) for p in parts)


def _settle_catformer(cfg, task):
    heads = parse_heads(cfg["heads"])
    for key, choices in (("optimizer", OPTIMIZERS), ("lr_schedule", LR_SCHEDULES)):
        if cfg[key] not in choices:
            raise CLIError(f"--{key.replace('_', '-')} {cfg[key]!r}: use {', '.join(choices)}")
    try:
        task.check_size()  # the full model's gradient enumerates every sequence
    except ValueError:
        # issue 32: the ways out of the full model (not the reduced model's field or sampled Stage 2)
        what, how = _too_large(task)
        raise CLIError(f"--model catformer needs the exact population (it trains on every sequence): {what}; "
                       f"use {how}") from None
    steps = cfg["steps"]
    record_every = cfg.get("record_every") or max(1, steps // 128)
    train = CatFormerTrainConfig(
        S=task.S, T=task.T, heads=heads, steps=steps, optimizer=cfg["optimizer"], lr=cfg["lr"],
        lr_schedule=cfg["lr_schedule"], weight_decay=cfg["weight_decay"],
        init="normal" if cfg["init_scale"] > 0 else "zero", init_scale=cfg["init_scale"],
        init_seed=cfg["init_seed"] if cfg["init_scale"] > 0 else 0, record_every=record_every)
    try:
        train.optimizer_rule()
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return dict(record_every=record_every), train


def _catformer_model(rc) -> CatFormer:
    return CatFormer(rc.task.S, rc.task.T, heads=rc.train.heads)


def _train_catformer(rc, **run):
    c = rc.train
    init = ("normal", c.init_scale, c.init_seed) if c.init == "normal" else "zero"
    return train_catformer(rc.task, _catformer_model(rc), c.steps, optimizer=c.optimizer, lr=c.lr,
                           lr_schedule=c.lr_schedule, weight_decay=c.weight_decay, init=init,
                           record_every=c.record_every, **run)


def _refs_catformer(rc, traj, sampled=True):
    """The references at ``ε = 0`` (the softmax readout's loss has no perturbation); one that is infinite
    there (the count estimator gives zero mass to a possible token) is ``None`` with the reason."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        refs = _exact_refs(rc.task, eps=0.0)
    eps, S = rc.task.default_eps, rc.task.S
    for key, v in refs.items():
        if isinstance(v, dict) and not np.isfinite(v["value"]):  # the count estimators: smoothed instead
            # (f + eps) / (1 + S eps) is a distribution: its cross-entropy is the eps-loss + log(1 + S eps)
            value = count_estimator_loss(rc.task, eps=eps, model_limit=key == "L_count_model_limit")
            refs[key] = {"value": float(value + math.log1p(S * eps)), "kind": "exact", "smoothing": eps,
                         "note": f"cross-entropy of the count estimator smoothed to (f + eps)/(1 + S eps), eps = "
                                 f"T_eff^-1/2 = {eps:.4g} (unsmoothed it is infinite: zero mass on a token that "
                                 "occurs)"}
    return refs, None


def _attention_to_parent(rc, traj, r):
    model = _catformer_model(rc)
    return CC.attention_to_parent_per_position(rc.task.graph, CC.population_attention(rc.task, model,
                                                                                      traj.params(r)))


def _checks_catformer(rc, traj, refs, objective=None):
    task, model, params = rc.task, _catformer_model(rc), traj.final
    results = [CC.check_catformer_graph_recovery(task, model, params),
               CC.check_catformer_head_specialization(task, model, params),
               CC.check_induction_head(task, model, params)]
    Pbar = CC.population_attention(task, model, params)
    loss = float(traj.loss[-1])
    names = {"bayes": "L_bayes", "count_estimator": "L_count", "floor": "L_floor_eps"}
    ref = {name: reference_value(refs[key]) for name, key in names.items()}
    extra = {"catformer": {
        "heads": list(model.heads), "final_loss": loss,
        "excess_over": {name: None if v is None else loss - v for name, v in ref.items()},
        "population_attention_layer1": Pbar,
        "attention_to_parent_per_position": CC.attention_to_parent_per_position(task.graph, Pbar),
        "note": "exact population-average layer-1 attention of each head (rows: query position i); attention to "
                "the parent per position is P[h, i, p(i)] (k-parent: the largest over i's parents)",
    }}
    return results, extra


def _plots_catformer(out, rc, traj, refs, context=""):
    model = _catformer_model(rc)
    P.plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)
    P.plot_population_attention(rc.task.graph, CC.population_attention(rc.task, model, traj.final),
                                os.path.join(out, "attention.png"), context=context)
    P.plot_parent_attention_per_position(rc.task.graph, _attention_to_parent(rc, traj, 0),
                                         _attention_to_parent(rc, traj, -1), int(traj.step[-1]),
                                         os.path.join(out, "attention_to_parent.png"), context=context)


def _check_resume_catformer(path, rc):
    """The checkpoint must be of this task and these settings (its parameters and Adam's moments)."""
    load_checkpoint(path, rc.task, CatFormerScheme(rc.task, _catformer_model(rc), rc.train))


# ------------------------------------------------------------------- table
#: One record per kind of run.
KINDS = {
    "reduced-single": Kind("reduced-single", TrainConfig, _settle_single, _train_single, _refs_single,
                           _checks_single, ("graph_recovery", "gradient_alignment", "field_dpi", "loss_convergence",
                                            "ood_generalization", "roots_uniform"), _plots_single, _notes_single),
    "reduced-k-head": Kind("reduced-k-head", MultiHeadTrainConfig, _settle_multi, _train_multi, _refs_multi,
                           _checks_multi, ("head_specialization", "gradient_alignment", "loss_convergence",
                                           "ood_generalization", "roots_uniform"), _plots_multi),
    "catformer": Kind("catformer", CatFormerTrainConfig, _settle_catformer, _train_catformer, _refs_catformer,
                      _checks_catformer, ("catformer_graph_recovery", "head_specialization", "induction_head"),
                      _plots_catformer, check_resume=_check_resume_catformer),
}


def kind_of(cfg) -> Kind:
    """The record of merged settings: ``--model catformer``, else the reduced model by the graph's kind."""
    if cfg.get("model", "reduced") == "catformer":
        return KINDS["catformer"]
    return KINDS["reduced-k-head" if cfg["graph"] in MULTI_PARENT_GRAPHS else "reduced-single"]
