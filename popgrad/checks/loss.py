"""Loss after training against the reference losses ("Knowl 1.2"), exact for the task's finite prior.

:func:`check_loss_convergence`: ``L_ε(θ̂) - L_ε(count estimator)`` (the
construction of "Knowl 8"), passes at ``≤ 0``; a fail that Stage 2 run to
convergence could change is inconclusive
(:func:`popgrad.checks.converge_stage2`). References: ``L*``, ``L*_ε``,
``L_Bayes,ε``, the exact floor ``L_floor,ε`` (the only lower bound of the
ε-loss) and the predictors that ignore the graph (context-free; uniform attention),
which the model must beat by a margin. :func:`loss_sweep` fits
``L_ε(θ̂) - L*_ε ∝ T_eff^b``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .._validation import as_real
from ..engine.api import exact_loss
from ..engine.baselines import bayes_loss, count_estimator_loss, optimal_loss
from ..engine.floor import floor_loss
from ..task.priors import FinitePrior
from ..task.tasks import MultiParentTask, Task
from ..train.algorithm1 import train_two_stage
from ..train.multihead import initial_parameters
from .ood import context_free_loss
from ._common import _as_A1, _as_A2, _check_task, _hypotheses
from .hypotheses import within_hypotheses
from .results import CheckResult, _result, fit_power_law, inconclusive, not_applicable

__all__ = ["reference_losses", "stage2_convergence", "check_loss_convergence", "loss_sweep", "STAGE2_RTOL",
           "STAGE2_GRAD_RTOL", "LOSS_MARGIN_FRACTION"]


def reference_losses(task, eps=None) -> dict:
    """Reference losses of a task (DESIGN §7), exact for its finite prior; any task kind.

    ``L_star`` and ``L_bayes`` are the unperturbed information-theoretic
    references (``L* ≤ L_Bayes``). The perturbed loss the model is trained on
    uses ``log(f + ε)``, so it is compared with the same-``ε`` losses of the
    oracle that knows ``π`` (``L_star_eps`` = ``L*_ε``), of the Bayes posterior
    predictive (``L_bayes_eps`` = ``L_Bayes,ε``) and of the count estimator
    (``L_count``). Neither ``L*_ε`` nor ``L_Bayes,ε`` bounds the ε-loss from
    below (``L*_ε`` is negative when ``π + ε > 1``; the posterior predictive is
    optimal for ``ε = 0`` only); ``L_floor_eps`` is its exact floor
    (:func:`popgrad.floor_loss`, DESIGN §15): ``L_floor,ε ≤ L_ε(θ)`` for every θ.
    For a k-parent task ``L_count`` is the count estimator of "Knowl 9" and
    ``L_count_model_limit`` the model's own ``β → ∞`` limit at the
    construction (they differ by the self-match of the last position).
    """
    eps = task.default_eps if eps is None else float(eps)
    refs = {
        "eps": eps,
        "L_star": float(optimal_loss(task)),
        "L_bayes": float(bayes_loss(task)),
        "L_star_eps": float(optimal_loss(task, eps=eps)),
        "L_bayes_eps": float(bayes_loss(task, eps=eps)),
        "L_count": float(count_estimator_loss(task, eps=eps)),
        "L_floor_eps": float(floor_loss(task, eps=eps)),
    }
    refs["L_context_free"] = context_free_loss(task, eps)
    if isinstance(task, MultiParentTask):
        refs["L_count_model_limit"] = float(count_estimator_loss(task, eps=eps, model_limit=True))
    return refs


#: Stage 2 counts as converged for the verdict when its remaining decrease is below this fraction of the margin.
STAGE2_RTOL = 0.01
#: Without the 1-D optimum: converged when the last Stage-2 gradient norm is below this fraction of the first.
STAGE2_GRAD_RTOL = 1e-2


def stage2_convergence(trajectory=None, optimum=None, loss=None) -> dict:
    """What is known of Stage 2's convergence: from the exact 1-D optimum (``optimum``, a
    :class:`popgrad.checks.stage2.Stage2Optimum`, with the trained ``loss``) or from the recorded
    Stage-2 gradient norms of ``trajectory``. Returns a dict (empty when nothing is known)."""
    out = {}
    if optimum is not None and loss is not None:
        out.update(method="1-D minimization over A2 = alpha*I (exact under a relabeling-closed prior)",
                   alpha_star=float(optimum.alpha), loss_at_optimum=float(optimum.loss),
                   loss_at_optimum_se=float(optimum.loss_se), optimum_kind=optimum.kind,
                   remaining_decrease=float(loss - optimum.loss), dloss_dalpha_at_optimum=float(optimum.dloss_dalpha))
    if trajectory is not None:
        st2 = np.flatnonzero((np.asarray(trajectory.stage) == 2) & np.isfinite(trajectory.grad_norm))
        if st2.size >= 2:
            g0, g1 = float(trajectory.grad_norm[st2[0]]), float(trajectory.grad_norm[st2[-1]])
            out.update(stage2_grad_norm_first=g0, stage2_grad_norm_last=g1,
                       stage2_grad_norm_ratio=g1 / g0 if g0 > 0 else float("nan"))
    return out


def _stage2_verdict(res: CheckResult, conv: dict) -> CheckResult:
    """A fail that running Stage 2 further could change becomes "inconclusive: Stage 2 not converged"."""
    if not conv or res.status != "fail":
        return res
    margin = res.value - res.threshold
    if "remaining_decrease" in conv:
        rem = conv["remaining_decrease"]
        if rem > STAGE2_RTOL * margin:
            at_opt = conv["loss_at_optimum"] - (res.details["loss_final"] - res.value)
            return inconclusive(res, f"Stage 2 not converged: {rem:.3g} of decrease left at frozen A1 (the "
                                     f"1-D optimum alpha* = {conv['alpha_star']:.4g} gives value {at_opt:.4g})")
        return res
    ratio = conv.get("stage2_grad_norm_ratio")
    if ratio is not None and np.isfinite(ratio) and ratio > STAGE2_GRAD_RTOL:
        return inconclusive(res, f"Stage 2 not converged: its gradient norm fell only to {ratio:.3g} of its "
                                 f"first value (needs <= {STAGE2_GRAD_RTOL:g}); run Stage 2 to convergence "
                                 "(popgrad.checks.converge_stage2)")
    return res


def check_loss_convergence(task, A1, A2, beta0: float, eps=None, references=None,
                           init_seed: int = 0, init_scale: float = 0.0, trajectory=None, optimum=None,
                           hypotheses="auto") -> CheckResult:
    """Loss after training against the reference losses ("Knowl 1.2"); any task kind.

    Value: ``L_ε(θ̂) - L_ε(count estimator)``, threshold
    ``min(0, L_ng − m − L_count)``: the trained model is at least as good as
    the construction of "Knowl 8" that the theorem's model approaches (same
    perturbed loss) *and* beats every predictor that ignores the graph
    (``L_ng``: the context-free predictor, the model at uniform attention) by
    ``m = LOSS_MARGIN_FRACTION·(L_ng − L_floor,ε)`` -- at small ``T_eff`` the
    count estimator alone is a bar a model that learned nothing clears. Details: the theorem's
    ``L_ε(θ̂) - L*``, the gaps to every reference (the exact floor
    ``L_floor,ε`` is the lower bound) and Stage 2's convergence. The initial
    loss is at ``A1 = 0, A2 = β0·I`` (single-parent) or at
    :func:`popgrad.train.multihead.initial_parameters` (``init_seed``,
    ``init_scale``; k-parent: the count estimator is that of "Knowl 9").

    Status: ``"not_applicable"`` when the graph has no non-root (nothing to
    learn); ``"pass"`` at ``value ≤ threshold``; a would-be ``"fail"`` is
    ``"inconclusive: Stage 2 not converged"`` when Stage 2 had decrease left
    that could change the verdict: from ``optimum``
    (:func:`popgrad.checks.converge_stage2` at the trained ``A1``; remaining
    decrease above ``STAGE2_RTOL`` of the margin) or, without it, from the
    ``trajectory``'s Stage-2 gradient norms (last/first above
    ``STAGE2_GRAD_RTOL``); ``"inconclusive"`` also when a Knowl 10 assumption
    fails (``hypotheses``).
    """
    _check_task(task, (Task, MultiParentTask))
    A1, A2 = _as_A1(task, A1), _as_A2(task, A2)
    as_real(beta0, "beta0", minimum=0, strict=True)
    if references is not None and not isinstance(references, dict):
        raise TypeError(f"references must be a dict from reference_losses(task), got {type(references).__name__}")
    T, S = task.T, task.S
    if isinstance(task, MultiParentTask):
        statement = ("the trained k-head model is at least as good as the multi-parent count estimator of "
                     "Knowl 9 (same eps)")
    else:
        statement = (
            "L(theta_hat) - L* -> 0 polynomially in T_eff (Knowl 1.2): the trained model is at least "
            "as good as the count-estimator construction (same eps)"
        )
    if task.graph.non_roots.size == 0:
        return not_applicable("loss_convergence", statement,
                              "the graph has no non-root position: every token is drawn independently of the "
                              "others and there is nothing in context to learn")
    refs = reference_losses(task, eps) if references is None else references
    if isinstance(task, MultiParentTask):
        A1_0, A2_0 = initial_parameters(task, beta0, init_seed, init_scale)
    else:
        A1_0, A2_0 = np.zeros((T, T)), beta0 * np.eye(S)
    L0 = exact_loss(task, A1_0, A2_0, eps)
    L = exact_loss(task, A1, A2, eps)
    details = dict(
        loss_init=L0, loss_final=L, excess_over_L_star=L - refs["L_star"],
        excess_over_L_star_eps=L - refs["L_star_eps"], excess_over_bayes_eps=L - refs["L_bayes_eps"],
        excess_over_count=L - refs["L_count"], **refs,
    )
    if "L_floor_eps" in refs:
        details["excess_over_floor_eps"] = L - refs["L_floor_eps"]
    conv = stage2_convergence(trajectory, optimum, L)
    if conv:
        details["stage2_convergence"] = conv
    no_graph = _no_graph_losses(task, refs, eps)
    L_ng = min(no_graph.values())
    floor = refs.get("L_floor_eps")
    floor = floor_loss(task, eps=refs.get("eps", task.default_eps if eps is None else eps)) if floor is None else floor
    need = LOSS_MARGIN_FRACTION * (L_ng - floor)
    threshold = min(0.0, (L_ng - need) - refs["L_count"])
    details.update(no_graph, L_no_graph=L_ng, count_margin_over_no_graph=L_ng - refs["L_count"],
                   count_margin_needed=need, no_graph_margin=need,
                   rule=(f"passes when L(theta_hat) <= min(L_count, L_no_graph - m): at least as good as the count "
                         f"estimator and better than every predictor that ignores the graph (context-free, or the model "
                         f"at uniform attention) by m = {LOSS_MARGIN_FRACTION:g} of that predictor's excess over the "
                         f"floor; value L - L_count, threshold min(0, L_no_graph - m - L_count)"))
    res = _result("loss_convergence", L - refs["L_count"], threshold, "<=", statement, details)
    res = _stage2_verdict(res, conv)
    return within_hypotheses(res, _hypotheses(task, hypotheses))


#: The loss check needs the trained model to beat the best predictor that ignores the graph by at least this fraction
#: of that predictor's excess over the exact floor (and the count estimator, Knowl 8's construction, at all).
LOSS_MARGIN_FRACTION = 0.1


def _no_graph_losses(task, refs, eps) -> dict:
    """ε-losses of the predictors that ignore the graph: the best context-free one (``L_context_free``) and the
    model at uniform attention in both layers (``L_uniform_attention``: the in-context token frequencies)."""
    e = refs.get("eps", eps)
    e = task.default_eps if e is None else float(e)
    cf = refs.get("L_context_free")
    if cf is None or not np.isfinite(cf):
        cf = context_free_loss(task, e)
    shape1 = (task.k, task.T, task.T) if isinstance(task, MultiParentTask) else (task.T, task.T)
    shape2 = (task.k, task.S, task.S) if isinstance(task, MultiParentTask) else (task.S, task.S)
    uni = exact_loss(task, np.zeros(shape1), np.zeros(shape2), e)
    return {"L_context_free": float(cf), "L_uniform_attention": float(uni)}


def loss_sweep(graph_for_T: Callable, prior: FinitePrior, T_values, train_kwargs: dict) -> dict:
    """Train at each ``T`` and fit ``L_ε(θ̂) - L*_ε ∝ T_eff^b``.

    ``ε = T_eff^{-1/2}`` of each task unless ``train_kwargs['eps']`` is set;
    ``L*_ε`` is the same-``ε`` loss of the oracle that knows ``π``.

    Returns a dict of lists (``T``, ``t_eff``, ``excess`` over ``L*_ε``,
    ``excess_bayes`` over the same-``ε`` Bayes predictive, ``excess_floor``
    over the exact floor ``L_floor,ε``, and the trained ``params`` ``(task,
    A1 after Stage 1, final A1, final A2)`` for the OOD sweep) and ``fit``
    (:class:`SweepFit` of ``excess``).
    """
    rows = {"T": [], "t_eff": [], "excess": [], "excess_bayes": [], "excess_floor": [], "params": []}
    for T in T_values:
        task = Task(graph_for_T(int(T)), prior)
        traj = train_two_stage(task, **train_kwargs)
        eps = train_kwargs.get("eps")
        eps = task.default_eps if eps is None else eps
        L = exact_loss(task, traj.final_A1, traj.final_A2, eps)
        rows["T"].append(int(T))
        rows["t_eff"].append(task.t_eff)
        rows["excess"].append(L - optimal_loss(task, eps=eps))
        rows["excess_bayes"].append(L - bayes_loss(task, eps=eps))
        rows["excess_floor"].append(L - floor_loss(task, eps=eps))
        rows["params"].append((task, traj.A1[traj.stage1_end] if traj.config.schedule == "two-stage"
                               else traj.final_A1, traj.final_A1, traj.final_A2))
    rows["fit"] = fit_power_law(rows["t_eff"], rows["excess"])
    return rows

