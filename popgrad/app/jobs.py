"""The main job ``popgrad run``, one code path for every task kind.

:func:`run` builds the task from a resolved configuration (:data:`DEFAULTS`,
then the config file, then flags), checks everything it can before anything
is written, trains (Algorithm 1, or the k-head schedule), runs every theorem
check, and writes ``report.json``, ``report.md``, ``trajectory.npz``,
``checkpoint.npz`` and the figures into ``cfg["out"]``. What differs between
task kinds is one :class:`_Kind` record (trainer, checks, figures); the
command line (:mod:`popgrad.app.cli`) only parses.

Multi-parent graphs (``--graph ngram --n N`` or ``--graph two-parent``):

* the model has ``k`` first-layer heads, trained by
  :func:`popgrad.train_multi_head` (seeded symmetry-breaking start,
  ``init_seed = --seed``);
* the prior is :func:`popgrad.dirichlet_tensor_prior` with
  ``symmetrize="full"`` (relabelings of parents and of the predicted token:
  ``E[π]`` exactly uniform);
* checks: ``head_specialization`` (which parent slot each head attends to,
  row by row, and whether the heads split the slots one-to-one) in place of
  ``graph_recovery``; ``loss_convergence`` against the count estimator of
  "Knowl 9"; ``roots_uniform`` per head; ``gradient_alignment`` (the
  idealized gradient exists for single-parent trees only) and
  ``ood_generalization`` (not implemented for ``k``-parent tasks) are
  reported as not applicable, never faked;
* figures: ``attention.png`` (one heatmap per head beside the adjacency of
  each parent slot), ``loss.png``, ``attention_to_parent.png``; no
  ``gradient_cosine.png`` (no idealized gradient);
* no ``T`` sweep.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

from .. import checks as C
from .._io import OutputDir, OutputDirError, check_output_dir
from .._validation import as_int, is_int
from ..task.priors import MAX_CLOSURE_ATOMS
from ..task import (
    DEFAULT_MAX_SEQUENCES,
    CausalGraph,
    MultiParentTask,
    Task,
    chain,
    dirichlet_prior,
    dirichlet_tensor_prior,
    icl_pairs,
    ngram,
    random_tree,
    two_parent,
)
from ..engine.sampled import SampledObjective, sampled_reference_losses
from ..engine.baselines import optimal_loss
from ..train.algorithm1 import idealized_available, train_two_stage
from ..train.config import GRADIENTS, SCHEDULES, STAGE2_METHODS, MultiHeadTrainConfig, TrainConfig
from ..train.loop import load_checkpoint
from ..train.multihead import train_multi_head
from .plots import (
    plot_attention,
    plot_attention_to_parent,
    plot_cosine,
    plot_head_attention,
    plot_head_attention_to_parent,
    plot_loss,
    run_context,
)
from .report import UNIFORM_MEAN_IMPOSSIBLE, build_report, write_report

__all__ = ["DEFAULTS", "MULTI_PARENT_DEFAULTS", "MULTI_PARENT_GRAPHS", "CLIError", "CLITypeError", "build_task", "validate_config",
           "run", "RUN_OUTPUTS", "EXIT_DIVERGED"]

#: Every file ``popgrad run`` may write into ``--out`` (besides ``checkpoint.npz``); those a run does
#: not produce are removed when it finishes (stale outputs of an earlier, different run).
RUN_OUTPUTS = ("report.json", "report.md", "trajectory.npz", "attention.png", "loss.png", "gradient_cosine.png",
               "attention_to_parent.png")

#: Largest T of the job's gradient-alignment sweep of the Stage-1 field (T_eff = T for a chain): a few
#: seconds on 2 cores for S <= 3 (examples/alignment_at_scale.py goes to T_eff = 1000).
ALIGNMENT_TOP_T = 200

#: Exit status of ``popgrad run`` when training diverged (the report is written, with the status).
EXIT_DIVERGED = 3

#: ``--graph`` values that build a multi-parent task.
MULTI_PARENT_GRAPHS = ("ngram", "two-parent")


#: Built-in defaults of ``popgrad run`` (the induction-head task).
DEFAULTS = dict(
    graph="chain",
    S=3,
    T=10,
    alpha=1.0,
    atoms=8,
    seed=0,
    n=3,  # --graph ngram: the n of the n-gram (multi-parent graphs, issue 7)
    uniform_mean=True,  # Knowl 10.3 (E[pi] = 11^T/S)
    floor=0.15,  # Knowl 10.1: min pi >= floor/S (gamma >= 0.15); non-degeneracy 0.017 >= gamma^2/S

    beta0=1e-3,
    lr1=2.0,
    steps1=300,
    lr2=2.0,
    steps2=300,
    gradient="auto",
    stage2="auto",
    samples=0,
    sample_seed=0,
    schedule="two-stage",
    record_every=10,
    checkpoint_every=100,
    sweep=True,
    out="popgrad_out",
    max_sequences=DEFAULT_MAX_SEQUENCES,
)


TASK_KEYS = ("graph", "S", "T", "alpha", "atoms", "seed", "uniform_mean", "floor")


MAX_S = 16


MAX_T = 4096


class CLIError(ValueError):
    """A user error (a ``ValueError``): printed as one line by the CLI, exit status 2."""


class CLITypeError(CLIError, TypeError):
    """A user error of the wrong type (a ``TypeError``, also a :class:`CLIError`)."""


#: Defaults that replace :data:`DEFAULTS` for ``--graph ngram|two-parent`` unless given in the config
#: file or by a flag: k heads train jointly from a seeded start (see popgrad.train.multihead).
MULTI_PARENT_DEFAULTS = dict(S=2, T=12, atoms=16, floor=0.0, beta0=2.0, lr1=2.0, steps1=3000, steps2=0, schedule="joint",
                             record_every=50, checkpoint_every=500)


# ------------------------------------------------------------------- build
def build_graph(spec: str, T: int, seed: int):
    if spec == "chain":
        return chain(T)
    if spec == "icl":
        return icl_pairs(T)
    if spec == "random":
        return random_tree(T, seed=seed, root_prob=0.2)
    if "," in spec or spec.lstrip("-").isdigit():
        return parse_parents(spec)
    raise CLIError(
        f"unknown --graph {spec!r}: use chain, icl, random, ngram (with --n), two-parent, "
        "or a parents string such as -1,0,0,1,-1"
    )


def parse_parents(spec: str):
    """``--graph`` as a parents string, every error naming the flag and the entry at fault."""
    parts = [p.strip() for p in spec.split(",")]
    for i, part in enumerate(parts):
        if not part.lstrip("-").isdigit():
            raise CLIError(f"--graph {spec!r}: entry {i} = {part!r} is not an integer: give parents such as "
                           "-1,0,0,1,-1 (-1 for a root, else an earlier position)")
        v = int(part)
        if i == len(parts) - 1 and v != -1:
            raise CLIError(f"--graph {spec!r}: the last entry (the query) must be -1, got {v}")
        if not -1 <= v < i:
            where = "a root" if i == 0 else f"-1 for a root or a position in 0..{i - 1}"
            raise CLIError(f"--graph {spec!r}: entry {i} = {v} is not a valid parent: position {i} can only have "
                           f"{'-1 (' + where + ')' if i == 0 else where}")
    if not 2 <= len(parts) <= MAX_T:
        raise CLIError(f"--graph {spec!r} has {len(parts)} positions: use 2 <= T <= {MAX_T}")
    try:
        return CausalGraph.from_string(spec)
    except ValueError as exc:
        raise CLIError(f"--graph {spec!r}: {exc}") from None


def graph_family(spec: str, seed: int):
    """``T -> graph`` for sweeps, or ``None`` for a fixed parents string."""
    if spec in ("chain", "icl", "random"):
        return lambda T: build_graph(spec, T, seed)
    return None


# --------------------------------------------------------------------- run
def check_schedule(cfg: dict) -> None:
    if cfg["schedule"] not in SCHEDULES:
        raise CLIError(f"--schedule {cfg['schedule']!r}: use {' or '.join(SCHEDULES)}")


def output_paths(cfg: dict, resume: bool):
    """``(out, checkpoint)`` paths, validated before anything is written."""
    out = check_output_dir(cfg["out"], "--out", RUN_OUTPUTS + ("checkpoint.npz",))
    ckpt = os.path.join(out, "checkpoint.npz")
    if resume and not os.path.exists(ckpt):
        raise CLIError(f"--resume: no checkpoint at {ckpt}; run once without --resume")
    return out, ckpt


#: How the console and report.md show each status.
STATUS_TAGS = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "not_applicable": "N/A "}


def log_checks(results, out: str, log=print) -> None:
    """One line per check, then where the report is."""
    for c in results:
        tag = STATUS_TAGS[c.status]
        if c.status in ("pass", "fail"):
            log(f"  [{tag}] {c.name}: {c.value:.4g} {c.comparison} {c.threshold:.4g}")
        elif c.status == "inconclusive":
            log(f"  [{tag}] {c.name}: {c.value:.4g} {c.comparison} {c.threshold:.4g}: {c.reason}")
        else:
            log(f"  [{tag}] {c.name}: {c.reason}")
    log(f"report: {os.path.join(out, 'report.md')}")



# ------------------------------------------------------------------- build
def build_task(cfg: dict):
    """The task of a resolved config: a :class:`popgrad.Task`, or a :class:`popgrad.MultiParentTask`
    for ``graph`` in :data:`MULTI_PARENT_GRAPHS`. Fixes ``cfg["T"]`` for a parents string."""
    S, T = cfg["S"], cfg["T"]
    if not 2 <= S <= MAX_S:
        raise CLIError(f"--S {S} is out of range: use 2 <= S <= {MAX_S}")
    if (cfg["graph"] in ("chain", "icl", "random") or cfg["graph"] in MULTI_PARENT_GRAPHS) and not 2 <= T <= MAX_T:
        raise CLIError(f"--T {T} is out of range: use 2 <= T <= {MAX_T}")
    if not cfg["alpha"] > 0:
        raise CLIError(f"--alpha {cfg['alpha']} must be > 0 (Dirichlet concentration)")
    if not 0 <= cfg.get("floor", 0.0) < 1:
        raise CLIError(f"--floor {cfg['floor']} must be in [0, 1): the weight of the uniform matrix in each draw")
    check_closure_size(cfg)
    if cfg["graph"] in MULTI_PARENT_GRAPHS:
        if cfg["graph"] == "ngram":
            n = cfg.get("n", 3)
            if not is_int(n) or not 2 <= n <= T:
                raise CLIError(f"--n {n} is out of range for --graph ngram: use 2 <= n <= T = {T}")
            graph = ngram(T, n)
        else:
            graph = two_parent(T)
        if cfg.get("floor", 0.0) != 0:
            raise CLIError(f"--floor {cfg['floor']} is not available for multi-parent graphs (their tensor prior "
                           "has no floor): drop --floor")
        prior = dirichlet_tensor_prior(S, graph.k, cfg["alpha"], cfg["atoms"], seed=cfg["seed"], symmetrize="full")
        return MultiParentTask(graph, prior, max_sequences=cfg["max_sequences"])
    graph = build_graph(cfg["graph"], T, cfg["seed"])
    cfg["T"] = graph.T  # a parents string fixes T
    kw = dict(seed=cfg["seed"], symmetrize=True, floor=cfg.get("floor", 0.0))
    try:
        prior = dirichlet_prior(S, cfg["alpha"], cfg["atoms"], uniform_mean=cfg["uniform_mean"], **kw)
    except ValueError as exc:
        if not (cfg["uniform_mean"] and "reweight" in str(exc)):
            raise
        # every draw's trace is on one side of 1: no tilt gives a uniform mean. Keep equal weights; the
        # report's hypotheses table shows Knowl 10.3 failing and says why (UNIFORM_MEAN_IMPOSSIBLE).
        prior = dirichlet_prior(S, cfg["alpha"], cfg["atoms"], uniform_mean=False, **kw)
    return Task(graph, prior, max_sequences=cfg["max_sequences"])


def check_closure_size(cfg: dict) -> None:
    """Refuse, before anything is built, a k-parent relabeling closure too large to build.

    (A single-parent prior keeps its closure implicit: it is refused only when an exact
    enumeration would need every atom, by :func:`resolve_methods`.)
    """
    multi = cfg["graph"] in MULTI_PARENT_GRAPHS
    atoms, S = cfg["atoms"], cfg["S"]
    n_relabel = math.factorial(S)
    if multi and atoms * n_relabel > MAX_CLOSURE_ATOMS:
        most = MAX_CLOSURE_ATOMS // n_relabel
        fix = f"use --atoms {most} or fewer" if most >= 1 else "use a smaller --S"
        raise CLIError(f"--S {S} --atoms {atoms}: the prior closed under all {S}! relabelings has "
                       f"{atoms * n_relabel:,} atoms (limit {MAX_CLOSURE_ATOMS:,}): {fix}")


# --------------------------------------------------------------------- run
def _train_kwargs(cfg: dict, multi: bool) -> dict:
    kw = dict(beta0=cfg["beta0"], lr1=cfg["lr1"], steps1=cfg["steps1"], lr2=cfg["lr2"], steps2=cfg["steps2"],
              schedule=cfg["schedule"], record_every=cfg["record_every"])
    if multi:
        kw["init_seed"] = cfg["seed"]
    else:
        kw.update(gradient=cfg["gradient"], stage2=cfg["stage2"], samples=cfg["samples"],
                  sample_seed=cfg["sample_seed"])
    return kw


def resolve_methods(cfg: dict, task) -> None:
    """Fix ``cfg["gradient"]`` and ``cfg["stage2"]`` for this task ("auto" resolved), or a one-line error.

    ``gradient="auto"``: ``exact`` when the task can be enumerated, else ``field`` (the exact
    first-order Stage-1 gradient, DESIGN §12). ``stage2="auto"``: ``exact`` when the task can be
    enumerated, else ``sampled`` (sample-average approximation, every number it gives is labelled
    sampled with its standard error).
    """
    multi = isinstance(task, MultiParentTask)
    enumerable = task.enumerable
    if task.n_sequences > task.max_sequences or multi:
        size = f"S**T = {task.S}**{task.T} = {_count(task)} sequences (over --max-sequences {task.max_sequences:,})"
        smaller = "a smaller S or T, or a larger --max-sequences"
    else:
        size = f"all {task.prior.K:,} atoms of the prior ({task.prior.base.K} draws x {task.S}! relabelings)"
        smaller = "fewer --atoms or a smaller S"
    if multi:
        if cfg["gradient"] not in ("auto", "exact"):
            raise CLIError(f"--gradient {cfg['gradient']} is not available for multi-parent graphs: use exact")
        if cfg["stage2"] == "sampled":
            raise CLIError("--stage2 sampled is not available for multi-parent graphs: use exact")
        cfg["gradient"], cfg["stage2"] = "exact", "exact"
        return
    if cfg["gradient"] == "auto":
        cfg["gradient"] = "exact" if enumerable else "field"
    if cfg["gradient"] not in GRADIENTS:
        raise CLIError(f"--gradient {cfg['gradient']!r}: use {' or '.join(GRADIENTS)}")
    if cfg["stage2"] == "auto":
        cfg["stage2"] = "exact" if enumerable else "sampled"
    if cfg["stage2"] not in STAGE2_METHODS:
        raise CLIError(f"--stage2 {cfg['stage2']!r}: use {' or '.join(STAGE2_METHODS)}")
    if not enumerable and cfg["gradient"] == "exact":
        raise CLIError(f"--gradient exact needs {size}: use --gradient field (exact to first order, any T), "
                       f"{smaller}")
    if not enumerable and cfg["stage2"] == "exact" and cfg["steps2"] > 0:
        raise CLIError(f"--stage2 exact needs {size}: use --stage2 sampled (the default beyond enumeration), "
                       f"--steps2 0, {smaller}")
    if not enumerable and cfg["schedule"] == "joint":
        raise CLIError(f"--schedule joint needs {size}: use --schedule two-stage")


def _count(task) -> str:
    n = task.n_sequences
    return f"{n:,}" if n < 10**15 else f"about 10^{task.T * np.log10(task.S):.0f}"


def _references(cfg, task, traj, sampled=True):
    """Reference losses, each ``{"value", "kind": "exact"|"sampled"[, "se", "n"]}``; and the Stage-2 objective."""
    enumerable = task.enumerable
    objective = None
    if enumerable:
        refs = {k: ({"value": v, "kind": "exact"} if k != "eps" else v) for k, v in C.reference_losses(task).items()}
    else:
        eps = task.default_eps
        refs = {"eps": eps, "L_star": {"value": optimal_loss(task), "kind": "exact"},
                "L_star_eps": {"value": optimal_loss(task, eps=eps), "kind": "exact"},
                "L_floor_eps": {"value": None, "kind": "exact",
                                "reason": "the floor is a sum over all S**T sequences: needs enumeration"}}
    if sampled and cfg.get("stage2") == "sampled" and traj.stage2_samples:
        objective = SampledObjective(task, traj.stage2_samples, cfg["sample_seed"])
        sampled = sampled_reference_losses(objective, traj.final_A1, traj.final_A2)
        for k, v in sampled.items():
            refs[k if k not in refs else k + "_sampled"] = v
    return refs, objective


#: Largest T of the job's roots sweep (Knowl 3.3 over T, from the Stage-1 field; see default_roots_T).
ROOTS_TOP_T = 80


def _stage2_optimum(task, traj, objective):
    """Stage 2 run to convergence at the trained A1 (exact 1-D minimization; None where it does not apply)."""
    if not isinstance(task, Task) or not task.prior.is_relabeling_closed() or traj.config.schedule != "two-stage":
        return None
    if objective is None and not task.enumerable:
        return None
    return C.converge_stage2(task, traj.final_A1, objective=objective)


def _checks_single(cfg, task, traj, A1_hat, refs, objective=None):
    family = graph_family(cfg["graph"], cfg["seed"])
    enumerable = task.enumerable
    exact_stage2 = objective is None
    hyp = C.measure_hypotheses(task)
    T_sweep = list(range(max(4, (task.T + 1) // 2), task.T + 1)) if cfg["sweep"] and family and enumerable \
        and exact_stage2 else None
    extra = {}
    sweep = None
    if T_sweep:
        sweep = C.loss_sweep(family, task.prior, T_sweep, _train_kwargs(cfg, False))
        extra["loss_sweep"] = {
            "T": sweep["T"], "t_eff": sweep["t_eff"], "excess_over_L_star_eps": sweep["excess"],
            "excess_over_bayes_eps": sweep["excess_bayes"], "excess_over_floor_eps": sweep["excess_floor"],
            "fitted_exponent": sweep["fit"].exponent, "fitted_exponent_stderr": sweep["fit"].stderr,
        }
    if not idealized_available(task):
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
    exact_refs = {k: (v["value"] if isinstance(v, dict) else v) for k, v in refs.items()} if enumerable else None
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


def _checks_multi(cfg, task, traj, A1_hat, refs, objective=None):
    results = [
        C.check_head_specialization(task, A1_hat),
        C.not_applicable(
            "gradient_alignment", "grad_A1 L = -(b0/(S T)) J(P_i)(g_i + O(T_eff^-1/2)) (Knowl 3)",
            "the idealized gradient is derived for single-parent trees with a token query; the k-head model's "
            "query is the soft layer-1 output of the last position",
        ),
        C.check_loss_convergence(task, traj.final_A1, traj.final_A2, cfg["beta0"],
                                 references={k: (v["value"] if isinstance(v, dict) else v) for k, v in refs.items()},
                                 init_seed=traj.config.init_seed, init_scale=traj.config.init_scale,
                                 trajectory=traj if cfg["schedule"] == "two-stage" else None),
        C.not_applicable(
            "ood_generalization", "sup_c |f(s)_c - pi~(c|s_T)| small for an unseen pi~ (Knowl 4)",
            "Knowl 4 is stated for single-parent graphs; popgrad has no k-parent out-of-distribution check",
        ),
        C.check_roots(task, A1_hat),
    ]
    extra = {
        "multi_parent": {
            "k": task.k,
            "target_parents": [int(x) for x in task.graph.target_parents],
            "prior": "dirichlet_tensor_prior(symmetrize='full'): relabelings of parents and predicted token",
            "roots": "draw uniformly (popgrad's stated k-parent process)",
            "loss_sweep": "not run for multi-parent graphs",
        },
    }
    return results, extra


def _plots_single(out, task, traj, A1_hat, refs, context=""):
    how = {"field": "trained on the first-order field", "idealized": "trained on the idealized gradient"}.get(
        getattr(traj.config, "gradient", "exact"), "trained on the exact gradient")
    plot_attention(task.graph, A1_hat, os.path.join(out, "attention.png"), title=f"after Stage 1 ({how})",
                   context=context)
    plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)
    plot_cosine(traj, os.path.join(out, "gradient_cosine.png"), context=context)
    plot_attention_to_parent(traj, task.graph, os.path.join(out, "attention_to_parent.png"), context=context)


def _plots_multi(out, task, traj, A1_hat, refs, context=""):
    plot_head_attention(task.graph, A1_hat, os.path.join(out, "attention.png"), context=context)
    plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)
    plot_head_attention_to_parent(traj, task.graph, os.path.join(out, "attention_to_parent.png"), context=context)


def validate_config(cfg: dict):
    """Every check of a run's settings that needs no output folder: ``(task, train_kwargs)``.

    Builds the task (ranges, graph string; fixes ``cfg["T"]`` for a parents string), resolves
    ``gradient`` / ``stage2`` ("auto"), checks the schedule, the enumeration size where it is needed
    and the training settings; raises :class:`CLIError` or ``ValueError`` with one line. Used by
    :func:`run` and by ``popgrad sweep`` (every cell before anything is submitted).
    """
    task = build_task(cfg)
    multi = isinstance(task, MultiParentTask)
    resolve_methods(cfg, task)
    check_schedule(cfg)
    if multi:  # the k-head job needs the exact population throughout: guard first
        task.check_size()
    if cfg["gradient"] == "idealized" and not idealized_available(task):
        raise CLIError(f"--gradient idealized --alpha {cfg['alpha']}: a prior draw is reducible (a stationary "
                       "probability is 0) and the idealized gradient divides by it: use --gradient exact or field, "
                       "or a larger --alpha")
    try:
        as_int(cfg["checkpoint_every"], "--checkpoint-every", minimum=0)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    check_sample_size(cfg, task)
    train_kwargs = _train_kwargs(cfg, multi)
    (MultiHeadTrainConfig if multi else TrainConfig)(**train_kwargs).validate()
    return task, train_kwargs


def _memory_bytes() -> int | None:
    """This machine's physical memory in bytes, or ``None`` where unknown."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _size(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


def check_sample_size(cfg: dict, task) -> None:
    """Refuse a sampled Stage 2 whose sample cannot fit in memory: ``--samples`` x (T tokens + 2 S
    label weights) x 8 bytes, against half of this machine's memory."""
    n = cfg.get("samples", 0)
    if cfg.get("stage2") != "sampled" or not n or cfg.get("steps2", 0) == 0:
        return
    need = n * (task.T + 2 * task.S) * 8
    memory = _memory_bytes()
    if memory is not None and need > memory // 2:
        most = max(2, memory // 2 // ((task.T + 2 * task.S) * 8))
        raise CLIError(f"--samples {n:,} needs about {_size(need)} for the Stage-2 sample (n x (T + 2S) x 8 bytes), "
                       f"more than half of this machine's {_size(memory)}: use --samples {most:,} or fewer, or "
                       "--samples 0 (chosen from a pilot sample for a standard error of 1e-3)")


def prepare(cfg: dict, resume: bool):
    """Every check of a run, before anything is written: ``(task, train_kwargs, multi, out, ckpt)``."""
    task, train_kwargs = validate_config(cfg)
    multi = isinstance(task, MultiParentTask)
    out, ckpt = output_paths(cfg, resume)
    if resume:  # a damaged checkpoint is refused now, not after the folder is locked
        config = (MultiHeadTrainConfig if multi else TrainConfig)(**train_kwargs)
        if not multi:
            config = _resolved_config(task, config)
        load_checkpoint(ckpt, task, config)
    return task, train_kwargs, multi, out, ckpt


def _resolved_config(task, config):
    """The :class:`TrainConfig` that ``train_two_stage`` stores (``stage2="auto"`` resolved) for a checkpoint check."""
    if config.stage2 != "auto":
        return config
    from dataclasses import replace

    stage2 = "exact" if task.enumerable or config.steps2 == 0 else "sampled"
    return replace(config, stage2=stage2)


#: Seconds a Dask scheduler has to send its handshake after the TCP connection is accepted (it sends it at once).
HANDSHAKE_TIMEOUT = 5.0


def check_scheduler_address(address) -> str:
    """A Dask scheduler address (``tcp://HOST:PORT``, ``HOST:PORT``, ``tls://...``), or a one-line error."""
    if not isinstance(address, str) or not address.strip():
        raise CLIError(f"--scheduler {address!r} is empty: give an address such as tcp://127.0.0.1:8786")
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import backends

    address = address.strip()
    try:
        scheme, loc = parse_address(address, strict=False)
        if scheme not in backends:
            raise ValueError(f"unknown protocol {scheme!r} (known: {', '.join(sorted(backends))})")
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(loc)
    except (ValueError, TypeError) as exc:
        raise CLIError(f"--scheduler {address!r} is not a Dask scheduler address ({_first_line(exc)}): "
                       "use tcp://HOST:PORT, e.g. tcp://127.0.0.1:8786") from None
    return address


def _first_line(exc) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _probe_tcp(address: str, timeout: float) -> None:
    """Refuse, within ``timeout`` seconds, a TCP address where nothing listens or that is not a Dask scheduler.

    A Dask scheduler writes its handshake (an 8-byte little-endian length, then a small message) as
    soon as a connection is accepted; a server that stays silent or sends something else is not one.
    """
    import socket

    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, loc = parse_address(address, strict=False)
    if scheme != "tcp":
        return
    host, port = parse_host_port(loc)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or _first_line(exc))
        raise CLIError(f"cannot connect to the Dask scheduler at {address}: {why}: start one "
                       "(dask scheduler) or check --scheduler") from None
    try:
        sock.settimeout(timeout)
        head = b""
        while len(head) < 8:
            chunk = sock.recv(8 - len(head))
            if not chunk:
                break
            head += chunk
    except OSError:  # a timeout (silent server) or a reset
        head = None
    finally:
        sock.close()
    if head is None or len(head) < 8:
        what = "did not answer" if head is None else "closed the connection"
        raise CLIError(f"{address} accepted a connection but {what} as a Dask scheduler does within "
                       f"{timeout:g} s: it is not a Dask scheduler (check the host and port; the default port is 8786)")
    if not 0 < int.from_bytes(head, "little") < 2**24:
        raise CLIError(f"{address} answered, but not with the Dask protocol ({head!r}): it is not a Dask scheduler "
                       "(check the host and port; the default port is 8786)")


#: Stage 1 with the field at T >= FIELD_ESTIMATE_MIN_T: the run first says how long the field will take,
#: measured on this machine at the two sizes FIELD_ESTIMATE_SIZES and extrapolated.
FIELD_ESTIMATE_MIN_T = 1024
FIELD_ESTIMATE_SIZES = (256, 512)


def estimate_field_seconds(cfg: dict, task, log=print):
    """Seconds the Stage-1 field of ``task`` will take (computed once, before the first step), or ``None``.

    Only for ``gradient = "field"`` at ``T >= FIELD_ESTIMATE_MIN_T``: the field of the same graph
    family (a chain for a parents string) and prior is timed at the two sizes
    :data:`FIELD_ESTIMATE_SIZES` and extrapolated as ``T^p`` (``p`` measured, between 2 and 4; the
    counts method is ``O(K S^2 T^3)`` for a chain). Logs one line when it is more than a minute.
    """
    if cfg.get("gradient") != "field" or not isinstance(task, Task) or task.T < FIELD_ESTIMATE_MIN_T:
        return None
    from ..engine.field import stage1_field

    family = graph_family(cfg["graph"], cfg["seed"]) or chain
    stage1_field(Task(family(8), task.prior, max_sequences=task.max_sequences))  # kernels loaded: not timed
    times = []
    for T in FIELD_ESTIMATE_SIZES:
        small = Task(family(T), task.prior, max_sequences=task.max_sequences)
        t0 = time.perf_counter()
        stage1_field(small)
        times.append(max(time.perf_counter() - t0, 1e-6))
    (T1, T2), (t1, t2) = FIELD_ESTIMATE_SIZES, times
    p = min(4.0, max(2.0, math.log(t2 / t1) / math.log(T2 / T1)))
    seconds = t2 * (task.T / T2) ** p
    if seconds > 60:
        log(f"Stage 1 at T = {task.T}: the first-order field is computed once before the first step, about "
            f"{_duration(seconds)} on this machine (measured {t1:.2g} s at T = {T1} and {t2:.2g} s at T = {T2}, "
            f"growing as T^{p:.1f}); a smaller --T is faster")
    return seconds


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def connect_scheduler(address: str, worker_timeout: float = 60.0, log=None):
    """A ``dask.distributed.Client`` of the scheduler at ``address`` with at least one worker, or a one-line
    :class:`CLIError` within about ``HANDSHAKE_TIMEOUT + worker_timeout`` seconds (no hang on a wrong
    address, a server that is not a scheduler, or a scheduler without workers). ``popgrad run`` and
    ``popgrad sweep`` both use it."""
    address = check_scheduler_address(address)
    _probe_tcp(address, HANDSHAKE_TIMEOUT)
    from dask.distributed import Client  # imported only when asked for

    try:
        client = Client(address, timeout=f"{max(HANDSHAKE_TIMEOUT, 1.0)}s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise CLIError(f"cannot connect to the Dask scheduler at {address}: {_first_line(exc)}") from None
    try:
        if not client.scheduler_info().get("workers"):
            if log is not None:
                log(f"Dask scheduler {address} has no workers yet: waiting up to {worker_timeout:g} s for one")
            try:
                client.wait_for_workers(1, timeout=worker_timeout)
            except (TimeoutError, OSError):
                raise CLIError(f"the Dask scheduler at {address} has no workers after {worker_timeout:g} s: start "
                               f"one (NUMBA_NUM_THREADS=1 dask worker {address} --nthreads 1), raise "
                               "--worker-timeout, or drop --scheduler") from None
    except BaseException:
        client.close()
        raise
    return client


def run(cfg: dict, resume: bool = False, progress: bool = True, log=print, figures: bool = True,
        client=None, scheduler: str | None = None, worker_timeout: float = 60.0) -> dict:
    """The main job for any task kind. Returns the report dictionary; ``figures=False`` skips the PNG
    figures (``popgrad sweep``). ``client`` (a ``dask.distributed.Client``), or ``scheduler`` (an address
    to connect to, closed at the end): split the training's exact enumerations over its workers
    (:mod:`popgrad.engine.distributed`; same bits).

    Everything that can be checked is checked first (:func:`prepare`); the folder is then written as
    a whole through :class:`popgrad._io.OutputDir` (locked, staged, stale outputs removed), except
    ``checkpoint.npz``, written in place so that ``--resume`` works after an interrupt. A diverged
    run still writes its report (``report["trajectory"]["status"] == "diverged"``).
    """
    if client is None and scheduler:
        prepare(dict(cfg), resume)  # every check of the settings first: no wait for a scheduler to hear of --S
        client = connect_scheduler(scheduler, worker_timeout, log)
        try:
            return run(cfg, resume, progress, log, figures, client=client)
        finally:
            client.close()
    task, train_kwargs, multi, out, _ = prepare(cfg, resume)
    log(task.summary())
    if not multi and cfg.get("uniform_mean") and not task.prior.diagnostics().uniform_mean:
        log(f"note: {UNIFORM_MEAN_IMPOSSIBLE}")
    from ..engine._kernels.cache import kernels_cached

    if not kernels_cached():
        log("compiling kernels (first run only)…")
    estimate_field_seconds(cfg, task, log)
    t0 = time.perf_counter()
    with OutputDir(out, outputs=RUN_OUTPUTS, flag="--out") as od:
        ckpt = od.keep("checkpoint.npz")
        train = train_multi_head if multi else train_two_stage
        traj = train(task, **train_kwargs, checkpoint_path=ckpt, checkpoint_every=cfg["checkpoint_every"],
                     resume=resume, progress=progress, client=client)
        t_train = time.perf_counter() - t0
        log(f"training: {traj.status} after step {int(traj.step[-1])} in {t_train:.1f} s {traj.message}".rstrip())

        diverged = traj.status != "completed"
        refs, objective = _references(cfg, task, traj, sampled=not diverged)
        if cfg["schedule"] == "two-stage" and not diverged:
            A1_hat = traj.A1[traj.stage1_end]
        else:
            A1_hat = traj.final_A1
        if diverged:
            results, extra = _checks_diverged(traj, multi), {}
        else:
            results, extra = (_checks_multi if multi else _checks_single)(cfg, task, traj, A1_hat, refs, objective)
        extra = {"timing_seconds": {"training": t_train, "total": time.perf_counter() - t0}, **extra}
        report = build_report(cfg, task, traj, results, refs, extra)
        if diverged:  # no check ran: a diverged run is never "all passed" (a sweep row would count it a success)
            report["all_passed"] = False

        stage = od.staging
        traj.save(os.path.join(stage, "trajectory.npz"))
        if figures:
            context = run_context(cfg, task)
            if diverged:
                plot_loss(traj, refs, os.path.join(stage, "loss.png"), context=context)
            else:
                (_plots_multi if multi else _plots_single)(stage, task, traj, A1_hat, refs, context)
        write_report(stage, report)
        try:
            od.commit()
        except OSError as exc:
            raise OutputDirError(f"--out {out}: cannot write the outputs: {exc.strerror or exc}") from None
    log_checks(results, out, log)
    return report


def _checks_diverged(traj, multi=False):
    reason = f"training diverged: {traj.message}"
    names = (("head_specialization", "gradient_alignment", "loss_convergence", "ood_generalization", "roots_uniform")
             if multi else ("graph_recovery", "gradient_alignment", "field_dpi", "loss_convergence",
                            "ood_generalization", "roots_uniform"))
    nan = float("nan")
    return [C.CheckResult(name, nan, nan, None, "n/a", "", {"reason": reason}, status="inconclusive", reason=reason)
            for name in names]
