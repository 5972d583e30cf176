"""Theorem checks beyond enumeration, from a fixed sample: every value is an estimate (``kind="sampled"``).

* :func:`check_loss_convergence_sampled` -- "Knowl 1.2" on the Stage-2 sample
  (common random numbers): ``L_ε(θ̂) - L_ε(count estimator)`` as the mean of
  per-sequence differences, with its standard error. Decided only when the
  sample resolves the statement's margin: ``n ≥ SAMPLED_MIN_N`` and
  ``2·se ≤ SAMPLED_SE_FRACTION·(L_ng − L_count)`` (``L_ng`` the better of
  the best context-free predictor and the model at uniform attention, on the
  same sample), else inconclusive with the SE;
  then passes when the difference is not significantly above 0
  (``value ≤ 2·se``); a fail is "inconclusive: Stage 2 not converged" when
  Stage 2 had decrease left (same rule as the exact check); ``L*`` is exact
  (closed form), the Bayes loss is sampled when the prior's atoms can be listed.
* :func:`check_ood_sampled` -- "Knowl 4": the 0.99-quantile of
  ``sup_c |f(s)_c - π̃(c|s_T)|`` on ``n`` sequences drawn from an unseen
  ``π̃``, with a distribution-free 95 % confidence interval, against the same
  quantile of the count estimator and of the context-free predictor (same
  rule as the exact check at one ``T``); decided only when the interval lies
  on one side of the threshold.
"""
from __future__ import annotations

import numpy as np

from ..engine.sampled import SampledObjective, estimate, quantile_interval, sampled_reference_losses
from ..model.reduced import _predict, first_layer_attention
from ..task.priors import FinitePrior
from ..task.tasks import Task
from ..engine.baselines import optimal_loss
from .hypotheses import measure_hypotheses, within_hypotheses
from .results import CheckResult, inconclusive, not_applicable
from .loss import _stage2_verdict, stage2_convergence
from .ood import context_free_predictor, count_predictor, ood_transition, ood_verdict

__all__ = ["check_loss_convergence_sampled", "check_ood_sampled", "SAMPLED_MIN_N", "SAMPLED_SE_FRACTION"]


#: A sampled verdict needs at least this many samples (the standard error is itself estimated).
SAMPLED_MIN_N = 100
#: A sampled verdict is decided when 2 SE is at most this fraction of the statement's margin (what reading the
#: context is worth, ``L_context_free − L_count``); else inconclusive with the SE.
SAMPLED_SE_FRACTION = 0.1


def _context_free_sampled(objective):
    """Per-sequence ε-losses of the best context-free predictor on the objective's sample: ``p(c|q)`` estimated
    on the sample itself (the mean soft label of the sequences with query ``q``; in-sample, so biased low)."""
    seqs, y = objective.sample.seqs, objective.sample.targets
    S = objective.task.S
    q = seqs[:, -1]
    W = np.zeros((S, S))
    np.add.at(W, q, y)
    tot = W.sum(axis=1, keepdims=True)
    table = np.where(tot > 0, W / np.where(tot > 0, tot, 1.0), 1.0 / S)
    return -np.sum(y * np.log(table[q] + objective.eps), axis=1)


def check_loss_convergence_sampled(objective: SampledObjective, A1, A2, references=None, trajectory=None,
                                   optimum=None, hypotheses="auto") -> CheckResult:
    """Loss after training against the count estimator, on the Stage-2 sample (module docstring).

    Returns a :class:`CheckResult` with ``kind="sampled"``; its details hold
    every sampled reference (``value``, ``se``, ``n``), the exact ``L*`` and
    Stage 2's convergence (``optimum``: :func:`popgrad.checks.converge_stage2`
    on the same objective; or the ``trajectory``'s Stage-2 gradient norms).
    The rule applied is in ``details["rule"]``: decided only with at least
    :data:`SAMPLED_MIN_N` samples and ``2 SE ≤ SAMPLED_SE_FRACTION · (L_ng − L_count)``
    (the margin: what reading the graph is worth); then pass at ``value ≤ 2 SE``.
    """
    task = objective.task
    statement = ("L(theta_hat) - L* -> 0 (Knowl 1.2): the trained model is at least as good as the count-estimator "
                 "construction (same eps; sampled, common random numbers)")
    if task.graph.non_roots.size == 0:
        return not_applicable("loss_convergence", statement,
                              "the graph has no non-root position: nothing in context to learn")
    refs = sampled_reference_losses(objective, A1, A2) if references is None else references
    diff = refs["model_minus_count"]
    cf = _context_free_sampled(objective)
    L_cf = estimate(cf).to_dict()
    T, S = task.T, task.S
    L_uni = estimate(objective.per_sequence_losses(np.zeros((T, T)), np.zeros((S, S)))).to_dict()
    margin = float(min(L_cf["value"], L_uni["value"]) - refs["L_count"]["value"])
    value, se = float(diff["value"]), float(diff["se"])
    n = int(objective.n)
    rule = (f"decided when n >= {SAMPLED_MIN_N} and 2 SE <= {SAMPLED_SE_FRACTION:g} x (L_no_graph - L_count) "
            "(L_no_graph: the better of the context-free predictor and the model at uniform attention); "
            "then passes when L(theta_hat) - L_count <= 2 SE")
    details = dict(
        refs, L_star={"value": optimal_loss(task), "kind": "exact"},
        L_star_eps={"value": optimal_loss(task, eps=objective.eps), "kind": "exact"},
        L_context_free=dict(L_cf, note="p(c|q) estimated on the same sample (in-sample)"),
        L_uniform_attention=L_uni, margin_no_graph_minus_count=margin,
        eps=objective.eps, samples=n, sample_seed=objective.seed,
        labels="soft label of the drawing atom, pi(.|q)", rule=rule,
    )
    details["loss_final"] = refs["L_model"]["value"]
    conv = stage2_convergence(trajectory, optimum, refs["L_model"]["value"])
    if conv:
        details["stage2_convergence"] = conv
    res = CheckResult("loss_convergence", value, 0.0, bool(value <= 2 * se), "<=", statement, details,
                      kind="sampled")
    hyp = measure_hypotheses(task) if hypotheses == "auto" else hypotheses
    if not margin > 0:
        res = inconclusive(res, f"the count estimator is no better than a predictor that ignores the graph on the "
                                f"sample (L_no_graph - L_count = {margin:.3g}): T_eff too small to tell learning from "
                                "not learning")
    elif n < SAMPLED_MIN_N or not 2 * se <= SAMPLED_SE_FRACTION * margin:
        res = inconclusive(res, f"sampled difference not resolved: {value:.4g} +- {se:.2g} (SE, n = {n}); "
                                f"needs n >= {SAMPLED_MIN_N} and 2 SE <= {SAMPLED_SE_FRACTION:g} x "
                                f"{margin:.4g}; use more --samples")
    else:
        res = _stage2_verdict(res, conv)
    return within_hypotheses(res, hyp)


def _sup_errors(task: Task, A1, A2, n: int, seed: int, predictors=(None,)) -> list:
    """``sup_c |f(s)_c − π(c|s_{T-1})|`` on one sample of ``n`` sequences, for each predictor (``None``: the
    model at ``(A1, A2)``; else ``seqs -> f``)."""
    smp = task.sample(n, seed)
    P = first_layer_attention(A1)
    outs = [np.empty(n) for _ in predictors]
    for lo in range(0, n, 2**15):
        hi = min(lo + 2**15, n)
        seqs = smp.seqs[lo:hi]
        for out, pred in zip(outs, predictors):
            f = _predict(P, np.asarray(A2, dtype=np.float64), seqs) if pred is None else pred(seqs)
            out[lo:hi] = np.abs(f - smp.targets[lo:hi]).max(axis=1)
    return outs


def _context_free_table_sampled(task, n, seed):
    """``p(c|q)`` of the in-distribution context-free predictor, estimated on ``n`` in-distribution samples."""
    smp = task.sample(n, seed)
    S = task.S
    W = np.zeros((S, S))
    np.add.at(W, smp.seqs[:, -1], smp.targets)
    tot = W.sum(axis=1, keepdims=True)
    return np.where(tot > 0, W / np.where(tot > 0, tot, 1.0), 1.0 / S)


def check_ood_sampled(task: Task, A1, A2, n: int = 100_000, seed: int = 0, pi_ood=None, gamma: float = 0.3,
                      quantile: float = 0.99, hypotheses="auto") -> CheckResult:
    """Out-of-distribution generalization ("Knowl 4") from samples (module docstring).

    The same statement as :func:`popgrad.checks.check_ood` at one ``T``: the model's quantile against the
    count estimator's and the context-free predictor's on the same out-of-distribution sample; decided only
    when the model's 95 % interval lies on one side of the threshold quantile (:func:`ood_verdict`).
    """
    S = task.S
    if pi_ood is None:
        pi_ood = ood_transition(S, gamma)
    pi_ood = np.asarray(pi_ood, dtype=float)
    ood_task = Task(task.graph, FinitePrior(pi_ood), task.max_sequences)
    table = _context_free_table_sampled(task, n, seed + 2)
    e_ood, e_count, e_cf = _sup_errors(ood_task, A1, A2, n, seed, (None, count_predictor(task.graph, S),
                                                                    context_free_predictor(table)))
    (e_in,) = _sup_errors(task, A1, A2, n, seed + 1)
    q_ood = quantile_interval(e_ood, quantile)
    q_count = quantile_interval(e_count, quantile)
    q_cf = quantile_interval(e_cf, quantile)
    q_in = quantile_interval(e_in, quantile)
    details = {
        "quantile": quantile, "ood_quantile": q_ood, "in_distribution_quantile": q_in,
        "ood_quantile_construction_interval": q_count, "ood_quantile_context_free_interval": q_cf,
        "ood_mean": estimate(e_ood).to_dict(), "in_distribution_mean": estimate(e_in).to_dict(),
        "ood_in_ratio": q_ood["value"] / q_in["value"] if q_in["value"] > 0 else float("inf"),
        "context_free_table": table,
        "pi_ood": pi_ood, "pi_ood_min_times_S": float(pi_ood.min() * S), "samples": n, "sample_seed": seed,
    }
    statement = ("sup_c |f(s)_c - pi~(c|s_T)| for an unseen pi~ with min pi~ >= gamma/S is small (Knowl 4): closer "
                 "to the count estimator's than to the context-free predictor's (sampled quantiles, 95% intervals)")
    if task.graph.non_roots.size == 0:
        return not_applicable("ood_generalization", statement,
                              "the graph has no non-root position: nothing in context to learn")
    res = ood_verdict("ood_generalization", statement, [task.T], [task.t_eff], [q_ood["value"]],
                      q_count["value"], q_cf["value"], details, kind="sampled",
                      interval=(q_ood["ci_low"], q_ood["ci_high"]))
    return within_hypotheses(res, measure_hypotheses(task) if hypotheses == "auto" else hypotheses)
