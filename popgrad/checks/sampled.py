"""Theorem checks beyond enumeration, from a fixed sample: every value is an estimate (``kind="sampled"``).

* :func:`check_loss_convergence_sampled` -- "Knowl 1.2" on the Stage-2 sample
  (common random numbers): ``L_ε(θ̂) - L_ε(count estimator)`` as the mean of
  per-sequence differences, with its standard error. Passes when the
  difference is not significantly above 0 (``value ≤ 2·se``); ``L*`` is exact
  (closed form), the Bayes loss is sampled when the prior's atoms can be
  listed.
* :func:`check_ood_sampled` -- "Knowl 4": the 0.99-quantile of
  ``sup_c |f(s)_c - π̃(c|s_T)|`` on ``n`` sequences drawn from an unseen
  ``π̃``, with a distribution-free 95 % confidence interval, against twice the
  same quantile in distribution (same rule as the exact check).
"""
from __future__ import annotations

import numpy as np

from ..engine.sampled import SampledObjective, estimate, quantile_interval, sampled_reference_losses
from ..model.reduced import _predict, first_layer_attention
from ..task.priors import FinitePrior
from ..task.tasks import Task
from ..engine.baselines import optimal_loss
from .results import CheckResult
from .theorems import ood_transition

__all__ = ["check_loss_convergence_sampled", "check_ood_sampled"]


def check_loss_convergence_sampled(objective: SampledObjective, A1, A2, references=None) -> CheckResult:
    """Loss after training against the count estimator, on the Stage-2 sample (module docstring).

    Returns a :class:`CheckResult` with ``kind="sampled"``; its details hold
    every sampled reference (``value``, ``se``, ``n``) and the exact ``L*``.
    """
    task = objective.task
    refs = sampled_reference_losses(objective, A1, A2) if references is None else references
    diff = refs["model_minus_count"]
    details = dict(
        refs, L_star={"value": optimal_loss(task), "kind": "exact"},
        L_star_eps={"value": optimal_loss(task, eps=objective.eps), "kind": "exact"},
        eps=objective.eps, samples=objective.n, sample_seed=objective.seed,
        labels="soft label of the drawing atom, pi(.|q)",
        rule="passes when L(theta_hat) - L_count <= 2 se (not significantly worse than the count estimator)",
    )
    statement = ("L(theta_hat) - L* -> 0 (Knowl 1.2): the trained model is at least as good as the count-estimator "
                 "construction (same eps; sampled, common random numbers)")
    value, se = diff["value"], diff["se"]
    return CheckResult("loss_convergence", float(value), 0.0, bool(value <= 2 * se), "<=", statement, details,
                       kind="sampled")


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
                      quantile: float = 0.99) -> CheckResult:
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
    statement = ("sup_c |f(s)_c - pi~(c|s_T)| small w.h.p. for an unseen pi~ with min pi~ >= gamma/S (Knowl 4; "
                 "sampled quantiles with 95% intervals)")
    value, thr = q_ood["value"], 2.0 * q_in["value"]
    return CheckResult("ood_generalization", value, thr, bool(value <= thr), "<=", statement, details,
                       kind="sampled")
