"""Check suites: which checks apply to a trained run, in which regime, and the references they read.

The science of ``popgrad run``'s kinds of run, kept out of the application layer:

* :func:`exact_reference_losses` -- :func:`popgrad.checks.reference_losses` as report entries
  (``{"value", "kind": "exact"}``);
* :func:`softmax_reference_losses` -- the references of a softmax readout (the full model): at
  ``ε = 0``, the count estimators smoothed to ``(f + ε)/(1 + S ε)`` where unsmoothed they are infinite;
* :func:`stage2_optimum` -- Stage 2 run to convergence at the trained ``A1`` where it applies;
* :func:`single_parent_suite` -- the six checks of the reduced model on a single-parent task
  (graph recovery, gradient alignment, DPI in the field, loss convergence, OOD, roots) and the loss
  sweep over ``T``, each chosen by what the task allows (enumerable or not, a graph family over ``T``).
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..engine.baselines import count_estimator_loss, optimal_loss
from ..theory.information import has_idealized_gradient
from . import (check_alignment_rate, check_field_dpi, check_gradient_alignment, check_graph_recovery,
               check_loss_convergence, check_loss_convergence_sampled, check_ood, check_ood_sampled, check_roots,
               check_roots_at_scale, converge_stage2, default_alignment_T, default_roots_T, loss_sweep,
               measure_hypotheses, not_applicable, reference_losses, within_hypotheses)
from .scale import FIELD_DPI_STATEMENT

__all__ = ["ALIGNMENT_TOP_T", "ROOTS_TOP_T", "SINGLE_PARENT_CHECKS", "exact_reference_losses",
           "softmax_reference_losses", "no_population_references", "stage2_optimum", "single_parent_suite"]

#: Largest T of the gradient-alignment sweep of the Stage-1 field (T_eff = T for a chain): a few
#: seconds on 2 cores for S <= 3 (examples/alignment_at_scale.py goes to T_eff = 1000).
ALIGNMENT_TOP_T = 200

#: Largest T of the roots sweep (Knowl 3.3 over T, from the Stage-1 field; see default_roots_T).
ROOTS_TOP_T = 80

#: The checks of :func:`single_parent_suite`, in order.
SINGLE_PARENT_CHECKS = ("graph_recovery", "gradient_alignment", "field_dpi", "loss_convergence",
                        "ood_generalization", "roots_uniform")


#: What ``gradient_alignment`` tests, when it has nothing to test.
ALIGNMENT_STATEMENT = "S*M_i = g_i + O(T_eff^-1/2) (Knowl 3)"

#: Why a check that sums over a finite prior's atoms has nothing to test under the continuous prior.
NO_ATOMS = ("the continuous prior has no atoms, and {what} is a sum over a finite prior's atoms: run its finite "
            "stand-in (--prior finite) for this check")


def _value(v):
    return v.get("value") if isinstance(v, dict) else v


def exact_reference_losses(task, eps=None) -> dict:
    """:func:`popgrad.checks.reference_losses` as report entries: ``{"value", "kind": "exact"}`` (and ``eps``)."""
    return {k: ({"value": v, "kind": "exact"} if k != "eps" else v) for k, v in reference_losses(task, eps).items()}


def softmax_reference_losses(task) -> dict:
    """The references of a softmax readout (no ``ε``-perturbation): :func:`exact_reference_losses` at
    ``ε = 0``; a count estimator infinite there (zero mass on a token that occurs) is replaced by its
    cross-entropy smoothed to ``(f + ε)/(1 + S ε)`` at ``ε = T_eff^-1/2``, which is a distribution: its
    cross-entropy is the ``ε``-loss plus ``log(1 + S ε)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        refs = exact_reference_losses(task, eps=0.0)
    eps, S = task.default_eps, task.S
    for key, v in refs.items():
        if isinstance(v, dict) and not np.isfinite(v["value"]):
            value = count_estimator_loss(task, eps=eps, model_limit=key == "L_count_model_limit")
            refs[key] = {"value": float(value + math.log1p(S * eps)), "kind": "exact", "smoothing": eps,
                         "note": f"cross-entropy of the count estimator smoothed to (f + eps)/(1 + S eps), eps = "
                                 f"T_eff^-1/2 = {eps:.4g} (unsmoothed it is infinite: zero mass on a token that "
                                 "occurs)"}
    return refs


def stage2_optimum(task, trajectory, objective=None):
    """Stage 2 run to convergence at the trained ``A1`` (exact 1-D minimization), or ``None`` where it does
    not apply (a prior not closed under relabelings, joint training, no population and no sample)."""
    if not task.prior.is_relabeling_closed() or trajectory.config.schedule != "two-stage":
        return None
    if objective is None and not task.enumerable:
        return None
    return converge_stage2(task, trajectory.final_A1, objective=objective)


def single_parent_suite(task, trajectory, A1_hat, refs, objective=None, *, family=None, sweep=True,
                        train_kwargs=None, sample_seed=0):
    """The checks of the reduced model on a single-parent task: ``(results, extra report sections)``.

    Parameters
    ----------
    task : Task
    trajectory : Trajectory
        The run (:func:`popgrad.train_two_stage`).
    A1_hat : ndarray
        The first layer the checks read (after Stage 1, or at the end).
    refs : dict
        Reference entries (:func:`exact_reference_losses`, with sampled ones for a sampled Stage 2).
    objective : SampledObjective, optional
        The Stage-2 sample of a sampled Stage 2 (then loss convergence and OOD are sampled checks).
    family : callable ``T -> graph``, optional
        The graph family over ``T`` (``None`` for a fixed parents string): with ``sweep``, gradient
        alignment and roots are read over ``T`` from the Stage-1 field, and the loss is swept over ``T``.
    train_kwargs : dict
        The trainer's settings (``beta0``, ``lr1``, ``steps1``, ``lr2``, ``steps2``, ``schedule``,
        ``record_every``, ``gradient``, ``stage2``, ``samples``, ``sample_seed``) for the loss sweep.
    sample_seed : int
        Seed of the OOD check's sample beyond enumeration.
    """
    kw = dict(train_kwargs or {})
    enumerable = task.enumerable
    exact_stage2 = objective is None
    hyp = measure_hypotheses(task)
    T_sweep = list(range(max(4, (task.T + 1) // 2), task.T + 1)) if sweep and family and enumerable \
        and exact_stage2 else None
    extra = {}
    swept = None
    if T_sweep:
        swept = loss_sweep(family, task.prior, T_sweep, kw)
        extra["loss_sweep"] = {
            "T": swept["T"], "t_eff": swept["t_eff"], "excess_over_L_star_eps": swept["excess"],
            "excess_over_bayes_eps": swept["excess_bayes"], "excess_over_floor_eps": swept["excess_floor"],
            "fitted_exponent": swept["fit"].exponent, "fitted_exponent_stderr": swept["fit"].stderr,
        }
    continuous = task.continuous
    if continuous:
        alignment = not_applicable("gradient_alignment", ALIGNMENT_STATEMENT,
                                   NO_ATOMS.format(what="the idealized gradient g"))
    elif not has_idealized_gradient(task):
        alignment = not_applicable("gradient_alignment", ALIGNMENT_STATEMENT,
                                   "a prior draw is reducible (a stationary probability is 0): the idealized "
                                   "gradient g divides by it")
    elif family is not None and sweep:  # Knowl 3 at T_eff up to 200: the exact first-order field
        alignment = check_alignment_rate(family, task.prior, default_alignment_T(task.S, top=ALIGNMENT_TOP_T),
                                         name="gradient_alignment", hypotheses=hyp)
    elif enumerable:
        alignment = check_gradient_alignment(task, trajectory, hypotheses=hyp)
    else:
        alignment = not_applicable("gradient_alignment", ALIGNMENT_STATEMENT,
                                   "needs a graph family over T (chain, icl, random) and the sweep")
    if family is not None and sweep and not continuous:  # Knowl 3.3 is a statement about T: a sweep of the field
        roots = check_roots_at_scale(family, task.prior, default_roots_T(task.S, top=ROOTS_TOP_T),
                                     lr1=kw["lr1"], steps1=kw["steps1"], beta0=kw["beta0"],
                                     name="roots_uniform", hypotheses=hyp)
    else:
        roots = check_roots(task, A1_hat, hypotheses=hyp)
    optimum = stage2_optimum(task, trajectory, objective)
    if optimum is not None:
        extra["stage2_optimum"] = {"alpha_star": optimum.alpha, "loss": optimum.loss, "loss_se": optimum.loss_se,
                                   "kind": optimum.kind, "dloss_dalpha": optimum.dloss_dalpha,
                                   "note": "Stage 2 run to convergence at the trained A1: A2 = alpha* I minimizes "
                                           "the loss (exact 1-D minimization under a relabeling-closed prior)"}
    exact_refs = {k: _value(v) for k, v in refs.items()} if enumerable else None
    ood_sweep = [(t, a1, a2) for (t, _, a1, a2) in swept["params"]] if swept else None
    A1, A2 = trajectory.final_A1, trajectory.final_A2
    results = [
        check_graph_recovery(task, A1_hat, hypotheses=hyp),
        alignment,
        not_applicable("field_dpi", FIELD_DPI_STATEMENT, NO_ATOMS.format(what="the exact first-order field"))
        if continuous else within_hypotheses(check_field_dpi(task), hyp),
        check_loss_convergence(task, A1, A2, kw["beta0"], references=exact_refs, trajectory=trajectory,
                               optimum=optimum, hypotheses=hyp)
        if exact_stage2 else check_loss_convergence_sampled(objective, A1, A2, trajectory=trajectory,
                                                            optimum=optimum, hypotheses=hyp),
        check_ood(task, A1, A2, sweep=ood_sweep, hypotheses=hyp) if enumerable
        else check_ood_sampled(task, A1, A2, seed=sample_seed, hypotheses=hyp),
        roots,
    ]
    if objective is not None:
        extra["stage2"] = {"method": "sampled", "samples": objective.n, "sample_seed": objective.seed,
                           "labels": "soft label of the drawing atom, pi(.|q)",
                           "projection": "dA2 projected onto span{I, 11^T}" if objective.project else "none"}
    return results, extra


def no_population_references(task) -> dict:
    """The references beyond enumeration: the oracle's losses (exact without enumerating), the floor
    marked as needing enumeration."""
    eps = task.default_eps
    return {"eps": eps, "L_star": {"value": optimal_loss(task), "kind": "exact"},
            "L_star_eps": {"value": optimal_loss(task, eps=eps), "kind": "exact"},
            "L_floor_eps": {"value": None, "kind": "exact",
                            "reason": "the floor is a sum over all S**T sequences: needs enumeration"}}
