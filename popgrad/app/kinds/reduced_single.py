"""Kind ``reduced-single``: the paper's reduced two-layer model on a single-parent task (Algorithm 1).

Trainer :func:`popgrad.train_two_stage`; checks (:func:`popgrad.checks.suites.single_parent_suite`)
graph recovery, gradient alignment (a T sweep of the field), DPI in the field, loss convergence
(exact or on the Stage-2 sample), OOD, roots (a T sweep); the loss sweep over T; figures
``attention.png``, ``loss.png``, ``gradient_cosine.png``, ``attention_to_parent.png``.

The reduced model's flags (:data:`FLAGS`) are shared with :mod:`.reduced_k_head`.
"""
from __future__ import annotations

import os

from ...checks.suites import (ALIGNMENT_TOP_T, ROOTS_TOP_T, SINGLE_PARENT_CHECKS, exact_reference_losses,
                              no_population_references, single_parent_suite)
from ...engine.sampled import SampledObjective, sampled_reference_losses
from ...theory.information import has_idealized_gradient
from ...train.algorithm1 import train_two_stage
from ...train.config import GRADIENTS, SCHEDULES, STAGE2_METHODS, TrainConfig, resolve_auto
from .. import plots as P
from ..report import UNIFORM_MEAN_IMPOSSIBLE, fmt, fmt_se
from ..settings import CLIError, Flag, flag_name
from ..tasks import RUN_DEFAULTS, TASK_DEFAULTS, graph_family, is_multi_parent, too_large
from ._common import KindBase, refuse_past_memory, validated

__all__ = ["KIND", "FLAGS", "DEFAULTS", "ALIGNMENT_TOP_T", "ROOTS_TOP_T", "a1_hat", "train_kwargs",
           "loss_sweep_markdown"]

_TRAIN = TrainConfig()

#: The reduced model's flags (this kind and :mod:`.reduced_k_head`).
FLAGS = (
    Flag("beta0", "real", 0, True, help="A2(0) = beta0 * I (default 1e-3)"),
    Flag("lr1", "real", 0, help="Stage-1 rate, natural units: eta1 = lr1*S*T/beta0 (default 2)"),
    Flag("steps1", "int", 0, help="Stage-1 steps tau1 (default 300)"),
    Flag("lr2", "real", 0, help="Stage-2 rate, natural units: eta2 = lr2*S (default 2)"),
    Flag("steps2", "int", 0, help="Stage-2 steps tau2 (default 300)"),
    Flag("gradient", "str", choices=("auto",) + GRADIENTS,
         help="Stage-1 gradient: exact (enumeration), field (the exact first-order field, any T) or idealized "
              "(Knowl 3); default auto: exact when S**T <= --max-sequences, else field"),
    Flag("schedule", "str", choices=SCHEDULES, help="Algorithm 1 or joint training"),
    Flag("stage2", "str", choices=("auto",) + STAGE2_METHODS,
         help="Stage 2 on the exact population, or sampled (sample-average approximation on a fixed sample; every "
              "number it gives is labelled sampled, with its standard error); default auto: exact when S**T <= "
              "--max-sequences"),
    Flag("samples", "int", 0, help="sample size of a sampled Stage 2 (default 0: chosen from a pilot sample so "
                                   "that the loss's standard error is <= 1e-3)"),
    Flag("sample_seed", "int", 0, help="seed of the Stage-2 sample (default 0)"),
    Flag("sweep", "bool", help="run the T sweeps (default)", help_off="skip the T sweeps"),
)

#: Built-in defaults of ``popgrad run`` (the reduced model on the induction-head task); the training
#: values are :class:`popgrad.TrainConfig`'s.
DEFAULTS = dict(
    {k: TASK_DEFAULTS[k] for k in ("graph", "S", "T", "alpha", "prior", "roots", "atoms", "seed", "n", "uniform_mean",
                                   "floor")},
    beta0=_TRAIN.beta0, lr1=_TRAIN.lr1, steps1=_TRAIN.steps1, lr2=_TRAIN.lr2, steps2=_TRAIN.steps2,
    gradient="auto", stage2="auto", samples=_TRAIN.samples, sample_seed=_TRAIN.sample_seed,
    schedule=_TRAIN.schedule, record_every=_TRAIN.record_every, checkpoint_every=RUN_DEFAULTS["checkpoint_every"],
    sweep=True, out=RUN_DEFAULTS["out"], max_sequences=TASK_DEFAULTS["max_sequences"],
)


def train_kwargs(cfg) -> dict:
    """The reduced trainers' shared settings."""
    return dict(beta0=cfg["beta0"], lr1=cfg["lr1"], steps1=cfg["steps1"], lr2=cfg["lr2"], steps2=cfg["steps2"],
                schedule=cfg["schedule"], record_every=cfg["record_every"])


def a1_hat(rc, traj):
    """The first layer the checks read: after Stage 1 (two-stage, completed) or at the end."""
    return traj.A1[a1_hat_record(rc, traj)]


def a1_hat_record(rc, traj) -> int:
    """The record index of :func:`a1_hat` (its step is ``traj.step[a1_hat_record(rc, traj)]``)."""
    if rc["schedule"] == "two-stage" and traj.status == "completed":
        return traj.stage1_end
    return len(traj.step) - 1


def check_schedule(cfg) -> None:
    if cfg["schedule"] not in SCHEDULES:
        raise CLIError(f"--schedule {cfg['schedule']!r}: use two-stage or joint")


def check_sample_size(cfg, task) -> None:
    """Refuse a sampled Stage 2 whose sample cannot fit in memory: ``--samples`` x (T tokens + 2 S
    label weights) x 8 bytes, against half of the memory this process may use (physical or its ulimit -v)."""
    n = cfg.get("samples", 0)
    if cfg.get("stage2") != "sampled" or not n or cfg.get("steps2", 0) == 0:
        return
    refuse_past_memory("--samples", n, (task.T + 2 * task.S) * 8, "for the Stage-2 sample", "n x (T + 2S) x 8 bytes",
                       ", or --samples 0 (chosen from a pilot sample for a standard error of 1e-3)", least=2)


def loss_sweep_markdown(sweep) -> list:
    """The loss sweep over T as report.md lines (empty without one)."""
    if not sweep:
        return []
    lines = ["", "## Loss sweep over T (trained at each T with the same settings)", "",
             "| T | T_eff | L_ε(θ̂) - L*_ε | L_ε(θ̂) - L_Bayes,ε | L_ε(θ̂) - L_floor,ε (≥ 0) |",
             "|---|---|---|---|---|"]
    floor = sweep.get("excess_over_floor_eps") or [None] * len(sweep["T"])
    for row in zip(sweep["T"], sweep["t_eff"], sweep["excess_over_L_star_eps"], sweep["excess_over_bayes_eps"],
                   floor):
        lines.append("| " + " | ".join(fmt(x) for x in row) + " |")
    lines += ["", f"Fitted exponent of L_ε(θ̂) - L*_ε against T_eff: {fmt(sweep['fitted_exponent'])} "
                  f"± {fmt_se(sweep['fitted_exponent_stderr'])} (standard error); the losses are in nats."]
    return lines


class ReducedSingle(KindBase):
    """The reduced model on a single-parent task (Algorithm 1)."""

    name = "reduced-single"
    model = "reduced"
    summary = "the paper's two-layer model (Algorithm 1, or k heads for a multi-parent graph; the default)"
    flags = FLAGS
    defaults = DEFAULTS
    check_names = SINGLE_PARENT_CHECKS
    figures = ("attention.png", "loss.png", "gradient_cosine.png", "attention_to_parent.png")
    config_class = TrainConfig

    def selects(self, values):
        return not is_multi_parent(values)

    def check_conflicts(self, values, given):
        if values.get("stage2") == "exact":  # issue 32: a sample setting of an exact Stage 2 would be ignored
            for key in ("samples", "sample_seed"):
                if key in given and values.get(key):
                    raise CLIError(f"{flag_name(key)} {values[key]} conflicts with --stage2 exact, which draws no "
                                   f"sample: drop {flag_name(key)}, or use --stage2 sampled")

    def settle(self, cfg, task):
        check_schedule(cfg)
        enumerable = task.enumerable
        for key, choices in (("gradient", ("auto",) + GRADIENTS), ("stage2", ("auto",) + STAGE2_METHODS)):
            if cfg[key] not in choices:
                raise CLIError(f"--{key} {cfg[key]!r}: use {' or '.join(choices)}")
        gradient, stage2 = resolve_auto(cfg["gradient"], cfg["stage2"], enumerable, cfg["steps2"])
        size, smaller = too_large(task)
        if not enumerable and gradient == "exact":
            raise CLIError(f"--gradient exact needs {size}: use --gradient field (exact to first order, any T), "
                           f"{smaller}")
        if not enumerable and stage2 == "exact" and cfg["steps2"] > 0:
            raise CLIError(f"--stage2 exact needs {size}: use --stage2 sampled (the default beyond enumeration), "
                           f"--steps2 0, {smaller}")
        if not enumerable and cfg["schedule"] == "joint":
            raise CLIError(f"--schedule joint needs {size}: use --schedule two-stage")
        if task.continuous and gradient in ("field", "idealized"):
            what = "the Stage-1 field" if gradient == "field" else "the idealized gradient"
            picked = " (what --gradient auto takes beyond enumeration)" if cfg["gradient"] == "auto" else ""
            how = "--gradient exact" if enumerable else f"{smaller} for --gradient exact"
            raise CLIError(f"--gradient {gradient}{picked} sums over the prior's atoms ({what}), and --prior "
                           f"continuous has none: use {how}, or --prior finite")
        if gradient == "idealized" and not has_idealized_gradient(task):
            raise CLIError(f"--gradient idealized --alpha {cfg['alpha']}: a prior draw is reducible (a stationary "
                           "probability is 0) and the idealized gradient divides by it: use --gradient exact or "
                           "field, or a larger --alpha")
        updates = dict(gradient=gradient, stage2=stage2)
        check_sample_size({**cfg, **updates}, task)
        train = validated(TrainConfig, **train_kwargs(cfg), gradient=gradient, stage2=stage2,
                          samples=cfg["samples"], sample_seed=cfg["sample_seed"])
        return updates, train

    def train(self, rc, **run):
        return train_two_stage(rc.task, config=rc.train, **run)

    def references(self, rc, traj, sampled=True):
        """Reference losses, each ``{"value", "kind": "exact"|"sampled"[, "se", "n"]}``; and the Stage-2 objective."""
        task = rc.task
        objective = None
        refs = exact_reference_losses(task) if task.enumerable else no_population_references(task)
        if sampled and rc["stage2"] == "sampled" and traj.stage2_samples:
            objective = SampledObjective(task, traj.stage2_samples, rc["sample_seed"])
            for k, v in sampled_reference_losses(objective, traj.final_A1, traj.final_A2).items():
                refs[k if k not in refs else k + "_sampled"] = v
        return refs, objective

    def checks(self, rc, traj, refs, objective=None):
        kw = dict(train_kwargs(rc), gradient=rc["gradient"], stage2=rc["stage2"], samples=rc["samples"],
                  sample_seed=rc["sample_seed"])
        return single_parent_suite(rc.task, traj, a1_hat(rc, traj), refs, objective,
                                   family=graph_family(rc["graph"], rc["seed"]), sweep=rc["sweep"],
                                   train_kwargs=kw, sample_seed=rc["sample_seed"])

    def plots(self, out, rc, traj, refs, context=""):
        task = rc.task
        how = {"field": "trained on the first-order field", "idealized": "trained on the idealized gradient"}.get(
            traj.config.gradient, "trained on the exact gradient")
        r = a1_hat_record(rc, traj)
        when = "after Stage 1" if r == traj.stage1_end and rc["schedule"] == "two-stage" else "at the end"
        P.plot_attention(task.graph, traj.A1[r], os.path.join(out, "attention.png"),
                         title=f"at step {int(traj.step[r])}, {when} ({how})", context=context)
        P.plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)
        P.plot_cosine(traj, os.path.join(out, "gradient_cosine.png"), context=context)
        P.plot_attention_to_parent(traj, task.graph, os.path.join(out, "attention_to_parent.png"), context=context)

    def notes(self, rc):
        if rc["uniform_mean"] and not rc.task.prior.diagnostics().uniform_mean:
            return [f"note: {UNIFORM_MEAN_IMPOSSIBLE}"]
        return []

    def markdown(self, report):
        return loss_sweep_markdown(report.get("loss_sweep"))


KIND = ReducedSingle()
