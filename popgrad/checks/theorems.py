"""Theorem checks: each prediction of the paper turned into a number and a verdict (DESIGN §15).

Every check returns a :class:`CheckResult` with a ``status``: ``"pass"``,
``"fail"``, ``"inconclusive"`` (a Knowl 10 assumption the statement needs
fails on the task, named with its measured figure; a pre-asymptotic rate; an
unconverged Stage 2) or ``"not_applicable"`` (nothing to test). The
assumptions each check needs are :data:`popgrad.checks.hypotheses.NEEDS`;
``hypotheses="auto"`` measures them on the task, ``None`` skips. Thresholds
come from the statements:

1. :func:`check_graph_recovery` ("Knowl 1.1"): after Stage 1, every non-root
   row puts ``softmax(A1)[i, p(i)] ≥ 1 - C/T`` on its parent (``C = 1`` by
   default) and ``argmax_j = p(i)``. Value: the minimum over rows.
2. :func:`check_gradient_alignment` ("Knowl 3"): the exact Stage-1 gradient
   at initialization against the idealized prediction
   ``-(β0/(S·T)) J(P_i) g_i`` over a sweep of ``T``; the angle error
   ``sin θ`` is fitted as ``∝ T_eff^b`` (theory ``-1/2``). Passes at
   ``b ≤ -0.4`` with the error decreasing (:func:`~.results.rate_status`),
   inconclusive (pre-asymptotic) for ``-0.4 < b < 0``, fails when it does not
   decrease. One ``T`` cannot show a rate: inconclusive.
3. :func:`check_loss_convergence` ("Knowl 1.2"): ``L_ε(θ̂) - L_ε(count
   estimator)`` (the construction of "Knowl 8"), passes at ``≤ 0``; a fail
   that Stage 2 run to convergence could change is inconclusive
   (:func:`popgrad.checks.converge_stage2`). References: ``L*``, ``L*_ε``,
   ``L_Bayes,ε`` and the exact floor ``L_floor,ε`` (the only lower bound of the
   ε-loss). :func:`loss_sweep` fits ``L_ε(θ̂) - L*_ε ∝ T_eff^b``.
4. :func:`check_ood` ("Knowl 4"): for a ``π̃`` outside the prior's support with
   ``min π̃ ≥ γ/S``, the exact 0.99-quantile of ``sup_c |f(s)_c - π̃(c | s_{T-1})|``
   is of the order of the in-distribution one (ratio ``≤ 2``) and shrinks as
   ``T_eff`` grows (over a sweep, when one is given).
5. :func:`check_roots` (Knowl 3.3): in-context roots that can attend to two
   or more positions keep near-uniform rows (TV ``≤ 0.1``); not applicable
   on a chain; inconclusive without a uniform mean. The query row is
   reported, not thresholded (its first-order gradient is not zero; see
   :func:`popgrad.theory.information.query_row_first_order`).
"""
from __future__ import annotations

import itertools
import warnings
from typing import Callable

import numpy as np

from ..engine.api import exact_loss, exact_loss_and_grad
from ..engine.floor import floor_loss
from ..model.multihead import head_attention
from ..model.reduced import first_layer_attention, predict
from ..task.priors import FinitePrior, stationary_distribution
from ..task.tasks import MultiParentTask, Task, decode_sequences
from ..engine.baselines import bayes_loss, count_estimator_loss, optimal_loss
from ..theory.information import has_idealized_gradient, idealized_grad_A1
from ..train.algorithm1 import train_two_stage
from ..train.multihead import initial_parameters
from . import _kernels
from .._validation import as_heads, as_real, as_square
from .hypotheses import Hypotheses, measure_hypotheses, within_hypotheses
from .results import (RATE_EXPONENT, CheckResult, SweepFit, _result, fit_power_law, inconclusive, not_applicable,
                      rate_status)

__all__ = [
    "CheckResult",
    "SweepFit",
    "check_graph_recovery",
    "check_gradient_alignment",
    "check_loss_convergence",
    "check_ood",
    "check_roots",
    "alignment_sweep",
    "loss_sweep",
    "fit_power_law",
    "ood_transition",
    "not_applicable",
    "check_head_specialization",
    "reference_losses",
    "reference_losses_multi",
    "check_loss_convergence_multi",
    "check_roots_multi",
]

def _hypotheses(task, hypotheses):
    """``"auto"``: measure on the task; ``None``: skip; a :class:`Hypotheses`: as given."""
    if isinstance(hypotheses, str) and hypotheses == "auto":
        return measure_hypotheses(task)
    if hypotheses is None or isinstance(hypotheses, Hypotheses):
        return hypotheses
    raise TypeError(f"hypotheses must be 'auto', None or a popgrad.checks.Hypotheses, got {type(hypotheses).__name__}")


# ------------------------------------------------------------ 1. recovery
def _check_task(task, kinds=(Task,)):
    if not isinstance(task, kinds):
        names = " or ".join(f"popgrad.{k.__name__}" for k in kinds)
        raise TypeError(f"task must be a {names}, got {type(task).__name__}")


def _as_A1(task, A1, name: str = "A1") -> np.ndarray:
    """``A1`` as a finite float64 array of the task's shape (``(T, T)``; ``(k, T, T)`` for k heads)."""
    if isinstance(task, MultiParentTask):
        M = as_heads(A1, name)
        want = (task.k, task.T, task.T)
    else:
        M = as_square(A1, name)
        want = (task.T, task.T)
    if M.shape != want:
        raise ValueError(f"{name} must have shape {want} for this task, got {M.shape}")
    return M


def _as_A2(task, A2, name: str = "A2") -> np.ndarray:
    M = as_heads(A2, name) if np.ndim(A2) == 3 else as_square(A2, name)
    if M.shape[-2:] != (task.S, task.S):
        raise ValueError(f"{name} must be {task.S}×{task.S} (S = {task.S}) for this task, got shape {M.shape}")
    return M


def check_graph_recovery(task: Task, A1, C: float = 1.0, hypotheses="auto") -> CheckResult:
    """Attention to the true parent after Stage 1 ("Knowl 1.1").

    Value: ``min_i softmax(A1)[i, p(i)]`` over non-roots; threshold ``1 - C/T``;
    also requires ``argmax_j softmax(A1)[i, j] = p(i)`` for every non-root.
    ``"inconclusive"`` when a Knowl 10 assumption fails on the task
    (``hypotheses="auto"`` measures them; ``None`` skips; DESIGN §15).
    """
    _check_task(task)
    A1 = _as_A1(task, A1)
    as_real(C, "C", minimum=0, strict=True)
    graph = task.graph
    P = first_layer_attention(A1)
    nr = graph.non_roots
    statement = "softmax(A1)[i, p(i)] >= 1 - O(1/T) for every non-root i (Knowl 1.1)"
    if nr.size == 0:
        return not_applicable("graph_recovery", statement, "the graph has no non-root position: no parent to recover")
    attn = P[nr, graph.parents[nr]]
    argmax_ok = P[nr].argmax(axis=1) == graph.parents[nr]
    threshold = 1.0 - C / task.T
    value = float(attn.min())
    details = {
        "per_row": {int(i): float(a) for i, a in zip(nr, attn)},
        "argmax_is_parent_all_rows": bool(argmax_ok.all()),
        "rows_with_wrong_argmax": [int(i) for i in nr[~argmax_ok]],
        "C": C,
    }
    res = _result("graph_recovery", value, threshold, ">=", statement, details)
    res = res._replace(passed=res.passed and bool(argmax_ok.all()))
    return within_hypotheses(res, _hypotheses(task, hypotheses))


# ----------------------------------------------------------- 2. alignment




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


# --------------------------------------------------------------- 3. loss
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

    Value: ``L_ε(θ̂) - L_ε(count estimator)``, threshold 0: the trained model
    is at least as good as the construction of "Knowl 8" that the theorem's
    model approaches (same perturbed loss). Details: the theorem's
    ``L_ε(θ̂) - L*``, the gaps to every reference (the exact floor
    ``L_floor,ε`` is the lower bound) and Stage 2's convergence. The initial
    loss is at ``A1 = 0, A2 = β0·I`` (single-parent) or at
    :func:`popgrad.train.multihead.initial_parameters` (``init_seed``,
    ``init_scale``; k-parent: the count estimator is that of "Knowl 9").

    Status: ``"not_applicable"`` when the graph has no non-root (nothing to
    learn); ``"pass"`` at ``value ≤ 0``; a would-be ``"fail"`` is
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
    res = _result("loss_convergence", L - refs["L_count"], 0.0, "<=", statement, details)
    res = _stage2_verdict(res, conv)
    return within_hypotheses(res, _hypotheses(task, hypotheses))


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


# ----------------------------------------------------------------- 4. OOD
def ood_transition(S: int, gamma: float = 0.3, seed: int = 2**31 - 1) -> np.ndarray:
    """A transition matrix ``π̃ = (1-γ)·D + γ·11ᵀ/S`` with ``D`` a Dirichlet(1) draw.

    ``min π̃ ≥ γ/S`` by construction; the seed is distinct from the prior's.
    """
    rng = np.random.default_rng(seed)
    D = rng.dirichlet(np.ones(S), size=S)
    pi = (1 - gamma) * D + gamma / S
    return pi / pi.sum(axis=1, keepdims=True)


def _weighted_quantile(values, weights, q):
    # = values[order][min(searchsorted(cumsum(weights[order]), q * total), n - 1)] with
    # order = argsort(values, kind="stable"): same sums, same bits, no n-long temporaries
    return float(_kernels.weighted_quantile(np.ascontiguousarray(values, dtype=np.float64),
                                            np.ascontiguousarray(weights, dtype=np.float64), float(q)))


def sup_error_distribution(task: Task, A1, A2, atoms, atom_weights):
    """Exact distribution of ``sup_c |f(s)_c - π(c | s_{T-1})|`` under a finite set of ``π``.

    Returns ``(errors, probabilities)``, each flattened over (atom, sequence).
    """
    task.check_size()
    atoms = np.ascontiguousarray(atoms, dtype=float)
    mu = stationary_distribution(atoms)
    parents = np.ascontiguousarray(task.graph.parents, dtype=np.int64)
    errs, probs = [], []
    S, T = task.S, task.T
    for start in range(0, task.n_sequences, 2**15):
        seqs = decode_sequences(start, min(start + 2**15, task.n_sequences), S, T)
        f = predict(A1, A2, seqs)
        q = seqs[:, -1]
        # p[k, m]: probability of seqs[m] under atom k alone (bit-identical to sequence_weights_numpy)
        p = np.empty((atoms.shape[0], len(seqs)))
        _kernels.atom_prefix_probs(seqs, parents, mu, atoms, p)
        if S < 8:  # same arithmetic as the NumPy loop below, in one kernel
            e, pr = np.empty_like(p), np.empty_like(p)
            _kernels.sup_error_rows(f, q, atoms, p, np.asarray(atom_weights, dtype=float), e, pr)
            errs.extend(e)
            probs.extend(pr)
            continue
        for k in range(atoms.shape[0]):
            errs.append(np.abs(f - atoms[k][q]).max(axis=1))
            probs.append(atom_weights[k] * (p[k][:, None] * atoms[k][q]).sum(axis=1))
    return np.concatenate(errs), np.concatenate(probs)


#: "Shrinks": the last value is below the first by more than this fraction (rounding is not a trend).
SHRINK_RTOL = 1e-9

#: Knowl 4: the out-of-distribution error is of the order of the in-distribution error; popgrad reads
#: "of the order" as a ratio of the 0.99-quantiles at most this.
OOD_RATIO = 2.0


def _ood_quantiles(task, A1, A2, pi_ood, quantile):
    e_ood, p_ood = sup_error_distribution(task, A1, A2, pi_ood[None], np.ones(1))
    e_in, p_in = sup_error_distribution(task, A1, A2, task.prior.atoms, task.prior.weights)
    return (_weighted_quantile(e_ood, p_ood, quantile), _weighted_quantile(e_in, p_in, quantile),
            float(e_ood @ p_ood / p_ood.sum()), float(e_in @ p_in / p_in.sum()))


def ood_verdict(name, statement, T, t_eff, q_ood, q_in, details, kind="exact") -> CheckResult:
    """The Knowl 4 verdict from the OOD and in-distribution quantiles at one or more ``T`` (the task's last).

    Value: ``q_ood / q_in`` at the task's ``T``, threshold :data:`OOD_RATIO` (``≤``: the OOD error is of
    the order of the in-distribution error). With two or more ``T`` the OOD quantile must also shrink
    with ``T_eff`` (fitted exponent ``< 0``, last below first); a sweep where it does not is a
    ``"fail"``. With one ``T`` the trend is not measured: the ratio alone decides, and the details say so.
    """
    ratio = q_ood[-1] / q_in[-1] if q_in[-1] > 0 else float("inf")
    details = dict(details, ood_in_ratio=ratio, ratio_threshold=OOD_RATIO)
    ok = bool(ratio <= OOD_RATIO)
    if len(T) >= 2:
        fit = fit_power_law(t_eff, q_ood)
        shrinks = bool(q_ood[-1] < q_ood[0] * (1 - SHRINK_RTOL) and fit.exponent < 0)
        details.update(sweep_T=list(T), sweep_t_eff=list(t_eff), sweep_ood_quantile=list(q_ood),
                       sweep_in_distribution_quantile=list(q_in), ood_quantile_exponent=fit.exponent,
                       ood_quantile_exponent_stderr=fit.stderr, ood_quantile_shrinks=shrinks)
        ok = ok and shrinks
    else:
        details["trend"] = "not measured (one T): the ratio alone decides"
    return CheckResult(name, float(ratio), OOD_RATIO, ok, "<=", statement, details, kind=kind)


def check_ood(task: Task, A1, A2, pi_ood=None, gamma: float = 0.3, quantile: float = 0.99, sweep=None,
              hypotheses="auto") -> CheckResult:
    """Out-of-distribution generalization ("Knowl 4").

    For a transition matrix ``π̃`` outside the prior's support with ``min π̃ ≥ γ/S``: the exact
    ``quantile`` of ``sup_c |f(s)_c - π̃(c|s_{T-1})|`` over sequences drawn from ``π̃`` (``q_ood``),
    and the same for in-distribution ``π`` (``q_in``, the prior's atoms with their weights).
    Knowl 4: ``q_ood`` is of the order of ``q_in`` and shrinks as ``T_eff`` grows. Value:
    ``q_ood / q_in``, threshold :data:`OOD_RATIO`; with ``sweep`` (a list of ``(task_T, A1_T, A2_T)``
    trained at smaller ``T``, e.g. :func:`loss_sweep`'s ``params``) ``q_ood`` must also shrink over
    the sweep (:func:`ood_verdict`). ``"not_applicable"`` when the graph has no non-root (nothing
    learned); ``"inconclusive"`` when a Knowl 10 assumption fails (``hypotheses``).
    """
    _check_task(task)
    A1, A2 = _as_A1(task, A1), _as_A2(task, A2)
    S = task.S
    if pi_ood is None:
        pi_ood = ood_transition(S, as_real(gamma, "gamma", minimum=0, strict=True))
    pi_ood = as_square(pi_ood, "pi_ood")
    if pi_ood.shape != (S, S):
        raise ValueError(f"pi_ood must be an S×S transition matrix, S = {S}, got shape {pi_ood.shape}")
    if np.any(pi_ood < 0) or not np.allclose(pi_ood.sum(axis=1), 1.0, atol=1e-9):
        raise ValueError("pi_ood must be a transition matrix: non-negative entries, rows summing to 1")
    quantile = as_real(quantile, "quantile", minimum=0)
    if quantile > 1:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    statement = ("sup_c |f(s)_c - pi~(c|s_T)| for an unseen pi~ with min pi~ >= gamma/S is of the order of the "
                 "in-distribution error and shrinks with T_eff (Knowl 4)")
    if task.graph.non_roots.size == 0:
        return not_applicable("ood_generalization", statement,
                              "the graph has no non-root position: nothing in context to learn, so nothing "
                              "to generalize")
    points = [(t, a1, a2) for (t, a1, a2) in (sweep or []) if t.T < task.T] + [(task, A1, A2)]
    T, te, qo, qi = [], [], [], []
    for t, a1, a2 in points:
        q_ood, q_in, m_ood, m_in = _ood_quantiles(t, a1, a2, pi_ood, quantile)
        T.append(int(t.T))
        te.append(float(t.t_eff))
        qo.append(q_ood)
        qi.append(q_in)
    details = {
        "quantile": quantile,
        "ood_quantile": qo[-1],
        "ood_mean": m_ood,
        "in_distribution_quantile": qi[-1],
        "in_distribution_mean": m_in,
        "pi_ood": pi_ood,
        "pi_ood_min_times_S": float(pi_ood.min() * S),
        "pi_ood_distance_to_prior_support": float(
            np.abs(task.prior.atoms - pi_ood[None]).max(axis=(1, 2)).min()
        ),
    }
    res = ood_verdict("ood_generalization", statement, T, te, qo, qi, details)
    return within_hypotheses(res, _hypotheses(task, hypotheses))


# --------------------------------------------------------------- 5. roots
def check_roots(task, A1, tol: float = 0.1, hypotheses="auto") -> CheckResult:
    """In-context root rows of ``softmax(A1)`` stay near uniform at one ``T`` (Knowl 3.3); any task kind.

    Value: the largest total-variation distance to uniform over in-context
    roots ``0 < i < T-1`` (position 0 can attend only to itself: its row is
    uniform by construction); threshold ``tol``. ``"not_applicable"`` when no
    in-context root can attend to two or more positions (a chain);
    ``"inconclusive"`` when the prior's mean is not uniform (Knowl 10.3: a
    sticky mean rewards self-attention on every row) or it is not
    relabeling-closed (``hypotheses``). The query row's distance is in the
    details. For a k-parent task: every head. That the drift *shrinks with T*
    is :func:`popgrad.checks.check_roots_at_scale`.
    """
    _check_task(task, (Task, MultiParentTask))
    A1 = _as_A1(task, A1)
    tol = as_real(tol, "tol", minimum=0)
    hyp = _hypotheses(task, hypotheses)
    statement = "in-context root rows of the first layer carry no signal and stay near uniform (Knowl 3.3)"
    roots = [int(i) for i in task.graph.roots if 0 < i < task.T - 1]
    if task.graph.non_roots.size == 0:
        return not_applicable("roots_uniform", statement,
                              "the graph has no non-root position: no row carries a signal, so root rows have "
                              "nothing to be told apart from")
    if not roots:
        return not_applicable("roots_uniform", statement,
                              "no in-context root can attend to two or more positions (the only in-context root, "
                              "if any, is position 0, whose row is uniform by construction)")
    if isinstance(task, MultiParentTask):
        return within_hypotheses(_roots_multi(task, A1, roots, tol), hyp)
    P = first_layer_attention(A1)
    T = task.T

    def tv(i):
        return float(0.5 * np.abs(P[i, : i + 1] - 1.0 / (i + 1)).sum())

    per_root = {i: tv(i) for i in roots}
    details = {"per_root_tv": per_root, "query_row_tv": tv(T - 1),
               "query_row_self_attention": float(P[T - 1, T - 1])}
    res = _result("roots_uniform", max(per_root.values()), tol, "<=", statement, details)
    return within_hypotheses(res, hyp)


# ===================================================== multi-parent tasks


def check_head_specialization(task, A1, hypotheses="auto") -> CheckResult:
    """Which parent slot each head of a k-head first layer attends to, row by row ("Knowl 9").

    For every head ``h`` and every row ``i`` that has parents (non-roots
    ``i < T-1``, and the last row, whose parents are the target's), the
    slot of ``argmax_j softmax(A1^h)[i, j]``: ``s`` if it is ``p(i)_s``
    (the target's ``s``-th parent for the last row), ``-1`` if it is no
    parent of ``i``. The heads *split the parents one-to-one* when a single
    permutation ``σ`` of the slots explains every row: head ``h`` always
    attends to slot ``σ(h)``.

    Value: the fraction of (head, row) pairs that agree with the best
    permutation (all ``k!`` are tried for ``k ≤ 6``; for larger ``k`` only the
    identity); threshold 1; passes when the split is one-to-one. Details:
    the permutation, each head's slot per row, the attention each head puts
    on its assigned slot's parent (minimum over rows) and the rows that
    disagree.

    Parameters
    ----------
    task : popgrad.MultiParentTask
    A1 : array_like, shape (k, T, T)
    """
    _check_task(task, (MultiParentTask,))
    A1 = _as_A1(task, A1)
    graph = task.graph
    k, T = graph.k, graph.T
    P = head_attention(A1)
    if P.shape != (k, T, T):
        raise ValueError(f"A1 must have shape (k, T, T) = ({k}, {T}, {T}) for this task, got {P.shape}")
    slots = np.stack([graph.slot_parents(s) for s in range(k)])  # (k slots, T)
    rows = [int(i) for i in np.flatnonzero(slots[0] >= 0)]
    statement = "each head of layer 1 attends to one parent slot, and the heads split the k slots one-to-one (Knowl 9)"
    if not rows:
        return not_applicable("head_specialization", statement, "the graph has no non-root row")
    arg = P.argmax(axis=2)  # (k, T)
    slot_of = np.full((k, T), -1, dtype=np.int64)
    for h in range(k):
        for i in rows:
            hit = np.flatnonzero(slots[:, i] == arg[h, i])
            slot_of[h, i] = int(hit[0]) if hit.size else -1
    best, sigma = -1, None
    perms = itertools.permutations(range(k)) if k <= 6 else [tuple(range(k))]
    for perm in perms:
        agree = sum(int(np.sum(slot_of[h, rows] == perm[h])) for h in range(k))
        if agree > best:
            best, sigma = agree, perm
    total = k * len(rows)
    attn = {h: {i: float(P[h, i, slots[sigma[h], i]]) for i in rows} for h in range(k)}
    disagree = [[h, i] for h in range(k) for i in rows if slot_of[h, i] != sigma[h]]
    details = {
        "assignment_head_to_slot": {h: int(sigma[h]) for h in range(k)},
        "one_to_one": not disagree,
        "rows": rows,
        "slot_by_head_and_row": {h: {i: int(slot_of[h, i]) for i in rows} for h in range(k)},
        "min_attention_on_assigned_parent": {h: min(attn[h].values()) for h in range(k)},
        "attention_on_assigned_parent": attn,
        "disagreeing_head_row_pairs": disagree,
        "note": "slot -1: the row's argmax is not one of its parents",
    }
    value = best / total
    res = CheckResult("head_specialization", float(value), 1.0, not disagree, ">=", statement, details)
    return within_hypotheses(res, _hypotheses(task, hypotheses))


def _roots_multi(task, A1, roots, tol: float = 0.1) -> CheckResult:
    """Root rows ``0 < i < T-1`` of every head stay near uniform (the k-head case of :func:`check_roots`).

    Value: the largest total-variation distance to uniform over heads and those root rows; threshold ``tol``.
    """
    P = head_attention(A1)
    per = {h: {i: float(0.5 * np.abs(P[h, i, : i + 1] - 1.0 / (i + 1)).sum()) for i in roots}
           for h in range(P.shape[0])}
    value = max(v for d in per.values() for v in d.values())
    return _result("roots_uniform", value, tol, "<=",
                   "in-context root rows of every head carry no signal and stay near uniform",
                   {"per_head_root_tv": per})


# ------------------------------------------------------- deprecated aliases (one release)
def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"popgrad.checks.{old} is deprecated and will be removed in popgrad 0.3: use "
                  f"popgrad.checks.{new} (it serves every task kind)", DeprecationWarning, stacklevel=3)


def reference_losses_multi(task, eps=None) -> dict:
    """Deprecated alias of :func:`reference_losses`."""
    _deprecated("reference_losses_multi", "reference_losses")
    return reference_losses(task, eps)


def check_loss_convergence_multi(task, A1, A2, beta0: float, eps=None, references=None,
                                 init_seed: int = 0, init_scale: float = 0.0) -> CheckResult:
    """Deprecated alias of :func:`check_loss_convergence`."""
    _deprecated("check_loss_convergence_multi", "check_loss_convergence")
    return check_loss_convergence(task, A1, A2, beta0, eps, references, init_seed, init_scale)


def check_roots_multi(task, A1, tol: float = 0.1) -> CheckResult:
    """Deprecated alias of :func:`check_roots`."""
    _deprecated("check_roots_multi", "check_roots")
    return check_roots(task, A1, tol)
