"""Exact against idealized Stage-1 gradient at initialization ("Knowl 3"), by enumeration over a sweep of ``T``.

:func:`check_gradient_alignment`: the angle error ``sin θ`` between the exact
gradient and ``-(β0/(S·T)) J(P_i) g_i`` is fitted as ``∝ T_eff^b`` (theory
``-1/2``); pass at ``b ≤ -0.4`` with the error decreasing
(:func:`~.results.rate_status`). The check reads the task's gradient at
initialization, not a trained model.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .._validation import as_real
from ..engine.api import exact_loss_and_grad
from ..task.priors import FinitePrior
from ..task.tasks import Task
from ..theory.information import has_idealized_gradient, idealized_grad_A1
from ._common import _check_task, _hypotheses
from .hypotheses import within_hypotheses
from .results import RATE_EXPONENT, CheckResult, fit_power_law, not_applicable, rate_status

__all__ = ["gradient_agreement", "alignment_sweep", "check_gradient_alignment"]


def gradient_agreement(task: Task, A1=None, beta0: float = 1e-6, eps=None):
    """Cosine and relative error between exact and idealized Stage-1 gradients.

    Returns ``(cosine, relative_error, sign_agreement_on_parents)`` at ``A1``
    (default zero) and ``A2 = β0·I``.
    """
    T, S = task.T, task.S
    A1 = np.zeros((T, T)) if A1 is None else np.asarray(A1, dtype=float)
    exact = exact_loss_and_grad(task, A1, beta0 * np.eye(S), eps).dA1
    ideal = idealized_grad_A1(task, A1, beta0)
    ni = np.linalg.norm(ideal)
    cos = float(np.sum(exact * ideal) / (np.linalg.norm(exact) * ni)) if ni > 0 else float("nan")
    rel = float(np.linalg.norm(exact - ideal) / ni) if ni > 0 else float("nan")
    nr = task.graph.non_roots
    par = task.graph.parents[nr]
    signs = bool(np.all(np.sign(exact[nr, par]) == np.sign(ideal[nr, par])))
    return cos, rel, signs


def alignment_sweep(graph_for_T: Callable, prior: FinitePrior, T_values, beta0: float = 1e-6) -> dict:
    """Exact-vs-idealized agreement at initialization for each ``T``.

    Returns a dict of lists: ``T``, ``t_eff``, ``cosine``, ``angle_error``
    (``sqrt(1 - cos²)``), ``relative_error``, and the :class:`SweepFit` of the
    angle error (``fit``) and of the relative error (``fit_relative``)
    against ``T_eff``.
    """
    rows = {"T": [], "t_eff": [], "cosine": [], "angle_error": [], "relative_error": []}
    for T in T_values:
        task = Task(graph_for_T(int(T)), prior)
        if task.graph.non_roots.size == 0:
            continue
        cos, rel, _ = gradient_agreement(task, beta0=beta0)
        rows["T"].append(int(T))
        rows["t_eff"].append(task.t_eff)
        rows["cosine"].append(cos)
        rows["angle_error"].append(float(np.sqrt(max(0.0, 1.0 - cos * cos))))
        rows["relative_error"].append(rel)
    rows["fit"] = fit_power_law(rows["t_eff"], rows["angle_error"])
    rows["fit_relative"] = fit_power_law(rows["t_eff"], rows["relative_error"])
    return rows


def check_gradient_alignment(
    task: Task,
    trajectory=None,
    graph_for_T: Callable | None = None,
    T_values=None,
    beta0: float = 1e-6,
    hypotheses="auto",
) -> CheckResult:
    """Exact vs idealized Stage-1 gradient ("Knowl 3"), by enumeration over a sweep of ``T``.

    Value: the fitted exponent ``b`` of ``angle error ∝ T_eff^b`` over the
    sweep; threshold ``RATE_EXPONENT = -0.4`` (theory ``-1/2``). ``"pass"``
    when the error decreases (last below first), ``b ≤ -0.4``, the cosine at
    initialization is positive and the signs agree on every parent entry;
    ``"inconclusive"`` ("pre-asymptotic") when it decreases more slowly;
    ``"fail"`` when it does not decrease or the signs disagree. Without a sweep
    (``graph_for_T=None`` or fewer than two ``T``) the rate cannot be measured:
    ``"inconclusive"``, the cosine at initialization in the details. The
    relative error's exponent and both standard errors are in the details.
    For ``T_eff`` beyond enumeration use :func:`popgrad.checks.check_alignment_rate`.
    """
    statement = "grad_A1 L = -(b0/(S T)) J(P_i)(g_i + O(T_eff^-1/2)) (Knowl 3): error shrinks with T_eff"
    _check_task(task)
    as_real(beta0, "beta0", minimum=0, strict=True)
    if graph_for_T is not None and not callable(graph_for_T):
        raise TypeError(f"graph_for_T must be a callable T -> graph, or None, got {type(graph_for_T).__name__}")
    hyp = _hypotheses(task, hypotheses)
    if task.graph.non_roots.size == 0:
        return not_applicable("gradient_alignment", statement,
                              "the graph has no non-root position: the Stage-1 gradient has no parent signal")
    if not has_idealized_gradient(task):
        return not_applicable("gradient_alignment", statement,
                              "a prior draw has a zero stationary probability (reducible, e.g. a small alpha): "
                              "the idealized gradient divides by it")
    cos0, rel0, signs = gradient_agreement(task, beta0=beta0)
    if not np.isfinite(cos0):
        return not_applicable("gradient_alignment", statement,
                              "the idealized gradient is zero at initialization: no direction to compare")
    details = {"cosine_at_init": cos0, "relative_error_at_init": rel0, "parent_signs_agree": signs, "beta0": beta0}
    if trajectory is not None:
        stage1 = (trajectory.stage == 1) & np.isfinite(trajectory.cosine)
        if stage1.any():
            details["trajectory_cosine_min"] = float(trajectory.cosine[stage1].min())
            details["trajectory_cosine_final"] = float(trajectory.cosine[stage1][-1])
    if graph_for_T is None or T_values is None or len(T_values) < 2:
        details["sweep"] = "not run (needs a graph family over T)"
        res = CheckResult("gradient_alignment", float("nan"), RATE_EXPONENT, None, "<=", statement, details,
                          status="inconclusive",
                          reason=f"no T sweep: Knowl 3 is a rate in T_eff and one T cannot show it (cosine at "
                                 f"initialization {cos0:.4f})")
        return within_hypotheses(res, hyp)
    sweep = alignment_sweep(graph_for_T, task.prior, T_values, beta0)
    fit, fit_rel = sweep["fit"], sweep["fit_relative"]
    details.update(
        sweep_T=sweep["T"], sweep_t_eff=sweep["t_eff"], sweep_cosine=sweep["cosine"],
        sweep_angle_error=sweep["angle_error"], sweep_relative_error=sweep["relative_error"],
        angle_error_exponent=fit.exponent, angle_error_exponent_stderr=fit.stderr,
        relative_error_exponent=fit_rel.exponent, relative_error_exponent_stderr=fit_rel.stderr,
        theory_exponent=-0.5,
    )
    err = sweep["angle_error"]
    decreasing = len(err) >= 2 and err[-1] < err[0]
    te = sweep["t_eff"]
    status, reason = rate_status(fit.exponent, decreasing, f"over T_eff {te[0]:.4g}-{te[-1]:.4g}" if te else "")
    if not (cos0 > 0 and signs):
        status, reason = "fail", ""
    res = CheckResult("gradient_alignment", float(fit.exponent), RATE_EXPONENT, status == "pass", "<=", statement,
                      details, status=status, reason=reason)
    return within_hypotheses(res, hyp)

