"""Theorem checks beyond enumeration, from a fixed sample: every value is an estimate (``kind="sampled"``).

* :func:`check_loss_convergence_sampled` -- "Knowl 1.2" on the Stage-2 sample
  (common random numbers): ``L_ε(θ̂) - L_ε(count estimator)`` as the mean of
  per-sequence differences, with its standard error. Passes when the
  difference is not significantly above 0 (``value ≤ 2·se``); a fail is
  "inconclusive: Stage 2 not converged" when Stage 2 had decrease left
  (same rule as the exact check); ``L*`` is exact (closed form), the Bayes
  loss is sampled when the prior's atoms can be listed.
* :func:`check_ood_sampled` -- "Knowl 4": the 0.99-quantile of
  ``sup_c |f(s)_c - π̃(c|s_T)|`` on ``n`` sequences drawn from an unseen
  ``π̃``, with a distribution-free 95 % confidence interval; value: its ratio
  to the same quantile in distribution, threshold 2 (same rule as the exact
  check at one ``T``).
"""
from __future__ import annotations

import numpy as np

from ..engine.sampled import SampledObjective, estimate, quantile_interval, sampled_reference_losses
from ..model.reduced import _predict, first_layer_attention
from ..task.priors import FinitePrior
from ..task.tasks import Task
from ..engine.baselines import optimal_loss
from .hypotheses import measure_hypotheses, within_hypotheses
from .results import CheckResult, not_applicable
from .loss import _stage2_verdict, stage2_convergence
from .ood import ood_transition, ood_verdict

__all__ = ["check_loss_convergence_sampled", "check_ood_sampled"]


def check_loss_convergence_sampled(objective: SampledObjective, A1, A2, references=None, trajectory=None,
                                   optimum=None, hypotheses="auto") -> CheckResult:
    """Loss after training against the count estimator, on the Stage-2 sample (module docstring).

    Returns a :class:`CheckResult` with ``kind="sampled"``; its details hold
    every sampled reference (``value``, ``se``, ``n``), the exact ``L*`` and
    Stage 2's convergence (``optimum``: :func:`popgrad.checks.converge_stage2`
    on the same objective; or the ``trajectory``'s Stage-2 gradient norms).
    """
    task = objective.task
    statement = ("L(theta_hat) - L* -> 0 (Knowl 1.2): the trained model is at least as good as the count-estimator "
                 "construction (same eps; sampled, common random numbers)")
    if task.graph.non_roots.size == 0:
        return not_applicable("loss_convergence", statement,
                              "the graph has no non-root position: nothing in context to learn")
    refs = sampled_reference_losses(objective, A1, A2) if references is None else references
    diff = refs["model_minus_count"]
    details = dict(
        refs, L_star={"value": optimal_loss(task), "kind": "exact"},
        L_star_eps={"value": optimal_loss(task, eps=objective.eps), "kind": "exact"},
        eps=objective.eps, samples=objective.n, sample_seed=objective.seed,
        labels="soft label of the drawing atom, pi(.|q)",
        rule="passes when L(theta_hat) - L_count <= 2 se (not significantly worse than the count estimator)",
    )
    value, se = diff["value"], diff["se"]
    details["loss_final"] = refs["L_model"]["value"]
    conv = stage2_convergence(trajectory, optimum, refs["L_model"]["value"])
    if conv:
        details["stage2_convergence"] = conv
    res = CheckResult("loss_convergence", float(value), 0.0, bool(value <= 2 * se), "<=", statement, details,
                      kind="sampled")
    res = _stage2_verdict(res, conv)
    return within_hypotheses(res, measure_hypotheses(task) if hypotheses == "auto" else hypotheses)


def _sup_errors(task: Task, A1, A2, n: int, seed: int) -> np.ndarray:
    smp = task.sample(n, seed)
    P = first_layer_attention(A1)
    out = np.empty(n)
    for lo in range(0, n, 2**15):
        hi = min(lo + 2**15, n)
        f = _predict(P, np.asarray(A2, dtype=np.float64), smp.seqs[lo:hi])
        out[lo:hi] = np.abs(f - smp.targets[lo:hi]).max(axis=1)
    return out


def check_ood_sampled(task: Task, A1, A2, n: int = 100_000, seed: int = 0, pi_ood=None, gamma: float = 0.3,
                      quantile: float = 0.99, hypotheses="auto") -> CheckResult:
    """Out-of-distribution generalization ("Knowl 4") from samples (module docstring)."""
    S = task.S
    if pi_ood is None:
        pi_ood = ood_transition(S, gamma)
    pi_ood = np.asarray(pi_ood, dtype=float)
    e_ood = _sup_errors(Task(task.graph, FinitePrior(pi_ood), task.max_sequences), A1, A2, n, seed)
    e_in = _sup_errors(task, A1, A2, n, seed + 1)
    q_ood = quantile_interval(e_ood, quantile)
    q_in = quantile_interval(e_in, quantile)
    details = {
        "quantile": quantile, "ood_quantile": q_ood, "in_distribution_quantile": q_in,
        "ood_mean": estimate(e_ood).to_dict(), "in_distribution_mean": estimate(e_in).to_dict(),
        "pi_ood": pi_ood, "pi_ood_min_times_S": float(pi_ood.min() * S), "samples": n, "sample_seed": seed,
    }
    statement = ("sup_c |f(s)_c - pi~(c|s_T)| for an unseen pi~ with min pi~ >= gamma/S is of the order of the "
                 "in-distribution error and shrinks with T_eff (Knowl 4; sampled quantiles with 95% intervals)")
    if task.graph.non_roots.size == 0:
        return not_applicable("ood_generalization", statement,
                              "the graph has no non-root position: nothing in context to learn")
    res = ood_verdict("ood_generalization", statement, [task.T], [task.t_eff], [q_ood["value"]],
                      [q_in["value"]], details, kind="sampled")
    return within_hypotheses(res, measure_hypotheses(task) if hypotheses == "auto" else hypotheses)
