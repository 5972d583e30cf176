"""Theorem checks at any ``T``, from the Stage-1 field (DESIGN §12): no enumeration of ``S**T``.

The field ``M`` is the exact first-order (in ``β0``) Stage-1 gradient,
``∇_{A1[i,:]} L = -(β0/T) J(P_i) M_i``; Knowl 3 is the statement
``S·M_i = g_i + O(T_eff^{-1/2})`` up to a constant per row (which ``J``
removes). These checks measure it where the theorems live:

* :func:`check_alignment_rate` -- over a sweep of ``T``, the relative
  distance ``‖J(S·M - g)‖ / ‖J g‖`` at initialization (``A1 = 0``; non-root,
  non-query rows), its product with ``√T_eff`` and the local exponent over
  the top decade of ``T_eff``. Passes when the distance decreases over the
  top decade and ``√T_eff ·`` distance stays within a factor 2 there
  (the ``O(T_eff^{-1/2})`` claim). The exponent is reported beside ``-1/2``.
* :func:`check_field_dpi` -- the data-processing inequality in the exact
  field: for every non-root row, whether the parent is the argmax of
  ``M[i, :i]`` and by how much, and the diagonal ``M[i, i]`` (lazy chains),
  for ``S·M`` as for ``g``.
* :func:`check_roots_at_scale` -- the field's in-context root rows and how
  far field-driven Stage 1 moves them, as ``T`` grows.
* Graph recovery after field-driven Stage 1 is
  :func:`popgrad.checks.check_graph_recovery` on ``train_two_stage(...,
  gradient="field", steps2=0)``: it works at any ``T``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..engine.field import field_grad_A1, stage1_field
from ..model.reduced import first_layer_attention
from ..task.tasks import Task
from ..theory.information import idealized_gradient
from .hypotheses import NEEDS, measure_hypotheses, within_hypotheses
from .results import RATE_EXPONENT, CheckResult, fit_power_law, not_applicable, rate_status

__all__ = ["default_alignment_T", "alignment_rate_sweep", "check_alignment_rate", "check_field_dpi",
           "check_roots_at_scale", "default_roots_T", "jacobian_rows", "root_drive_ratio"]


def jacobian_rows(P, X) -> np.ndarray:
    """``J(P_i) X_i`` for every row: ``P ⊙ (X - <P_i, X_i>)`` (lower triangle of ``X`` only)."""
    X = np.tril(X)
    return P * (X - np.sum(P * X, axis=1, keepdims=True))


def default_alignment_T(S: int, n: int = 8, top: int | None = None) -> list:
    """Default sweep of the alignment rate: ``n`` log-spaced ``T`` with ``T_eff`` (chain) from 10 to
    ``top``: 1000 for ``S = 2``, 200 for ``S = 3``, 100 for larger ``S`` (the field costs ``O(S²T³)``)."""
    if top is None:
        top = 1000 if S <= 2 else 200 if S == 3 else 100
    return sorted({int(round(t)) for t in np.geomspace(10, top, n)})


def _context_rows(graph) -> np.ndarray:
    """Non-root rows other than the query (the rows Knowl 3 speaks about)."""
    nr = graph.non_roots
    return nr[nr < graph.T - 1]


def alignment_rate_sweep(graph_for_T: Callable, prior, T_values, eps=None) -> dict:
    """Field-vs-idealized distance at initialization for each ``T`` (no enumeration).

    Returns a dict of lists: ``T``, ``t_eff``, ``distance`` (``‖J(S·M - g)‖ / ‖J g‖``,
    non-root context rows, ``J = J(P)`` at ``A1 = 0``), ``scaled`` (``√T_eff ·`` distance),
    ``cosine`` (between ``J·S·M`` and ``J·g``), and ``seconds`` per point.
    """
    import time

    rows = {"T": [], "t_eff": [], "distance": [], "scaled": [], "cosine": [], "seconds": []}
    for T in T_values:
        task = Task(graph_for_T(int(T)), prior)
        ctx = _context_rows(task.graph)
        if ctx.size == 0:
            continue
        t0 = time.perf_counter()
        M = stage1_field(task, eps).M
        g = idealized_gradient(task)
        P = first_layer_attention(np.zeros((task.T, task.T)))
        jd = jacobian_rows(P, task.S * M - g)[ctx]
        jg = jacobian_rows(P, g)[ctx]
        jm = jacobian_rows(P, task.S * M)[ctx]
        d = float(np.linalg.norm(jd) / np.linalg.norm(jg))
        rows["T"].append(int(T))
        rows["t_eff"].append(float(task.t_eff))
        rows["distance"].append(d)
        rows["scaled"].append(d * float(np.sqrt(task.t_eff)))
        rows["cosine"].append(float(np.sum(jm * jg) / (np.linalg.norm(jm) * np.linalg.norm(jg))))
        rows["seconds"].append(time.perf_counter() - t0)
    return rows


def check_alignment_rate(graph_for_T: Callable, prior, T_values=None, eps=None, name="alignment_rate",
                         hypotheses="auto") -> CheckResult:
    """Knowl 3's rate, exactly to first order in ``β0``, over a sweep of ``T`` (module docstring).

    Value: the local exponent ``b`` of ``distance ∝ T_eff^b`` fitted over the
    top decade of the sweep's ``T_eff`` (theory ``-1/2``); threshold
    :data:`~popgrad.checks.results.RATE_EXPONENT` ``= -0.4``. Status
    (:func:`~popgrad.checks.results.rate_status`): ``"pass"`` when the distance
    decreases over the top decade and ``b ≤ -0.4``; ``"inconclusive"``
    ("pre-asymptotic", with ``b``) when it decreases more slowly; ``"fail"`` when
    it does not decrease; ``"inconclusive"`` also when a Knowl 10 assumption it
    needs fails (``hypotheses``: ``"auto"`` measures them on the largest task of
    the sweep, ``None`` skips). Details: the whole sweep, the exponent's
    standard error, ``√T_eff ·`` distance and its max/min over the top decade.
    """
    statement = ("S*M_i = g_i + O(T_eff^-1/2) (Knowl 3, exact first-order field): "
                 "|J(S M - g)| / |J g| decreases like T_eff^-1/2")
    if T_values is None:
        T_values = default_alignment_T(prior.S)
    sweep = alignment_rate_sweep(graph_for_T, prior, sorted(int(T) for T in T_values), eps)
    if len(sweep["T"]) < 2:
        return not_applicable(name, statement, "fewer than two T of the sweep have a non-root context row")
    te = np.asarray(sweep["t_eff"])
    d = np.asarray(sweep["distance"])
    top = te >= te.max() / 10.0
    if top.sum() < 2:
        top = te >= np.sort(te)[-2]
    fit = fit_power_law(te[top], d[top])
    scaled = np.asarray(sweep["scaled"])[top]
    factor = float(scaled.max() / scaled.min())
    decreasing = bool(d[top][-1] < d[top][0])
    details = dict(
        sweep_T=sweep["T"], sweep_t_eff=sweep["t_eff"], sweep_distance=sweep["distance"],
        sweep_sqrt_t_eff_times_distance=sweep["scaled"], sweep_cosine=sweep["cosine"],
        sweep_seconds=sweep["seconds"], top_decade_t_eff=[float(x) for x in te[top]],
        local_exponent=fit.exponent, local_exponent_stderr=fit.stderr, theory_exponent=-0.5,
        sqrt_t_eff_times_distance_factor=factor, decreasing_over_top_decade=decreasing,
        method="stage1_field (exact to first order in beta0), idealized_gradient; J at A1 = 0",
    )
    where = f"over T_eff {te[top][0]:.4g}-{te[top][-1]:.4g}"
    status, reason = rate_status(fit.exponent, decreasing, where)
    res = CheckResult(name, float(fit.exponent), RATE_EXPONENT, status == "pass", "<=", statement, details,
                      status=status, reason=reason)
    if hypotheses == "auto":
        hypotheses = measure_hypotheses(Task(graph_for_T(int(sweep["T"][-1])), prior))
    return within_hypotheses(res, hypotheses, NEEDS["alignment_rate"])


#: What :func:`check_field_dpi` tests.
FIELD_DPI_STATEMENT = "s_j -> s_p(i) -> s_i: the parent maximizes the exact first-order field over j < i (DPI)"


def check_field_dpi(task: Task, eps=None, M=None) -> CheckResult:
    """The data-processing inequality in the exact field, row by row (no enumeration).

    For every non-root context row ``i``: whether ``p(i) = argmax_{j<i} M[i, j]``
    and the margin ``(M[i,p(i)] - max_{j<i, j≠p(i)} M[i,j]) / |M[i,p(i)]|``,
    and the diagonal ratio ``M[i,i] / M[i,p(i)]`` (a lazy chain can make the
    diagonal win; only ``J`` and the uniform-mean prior remove it), the same
    for ``g``. Value: the smallest margin of ``S·M`` (threshold 0: the parent
    wins every row).
    """
    statement = FIELD_DPI_STATEMENT
    rows = [int(i) for i in _context_rows(task.graph)]
    if M is None:
        M = stage1_field(task, eps).M
    try:
        g = idealized_gradient(task)
    except ValueError:  # a reducible draw: g divides by a zero stationary probability; the field needs no μ > 0
        g = np.full_like(M, np.nan)
    S = task.S
    per_row, margins, margins_g = {}, [], []
    for i in rows:
        p = int(task.graph.parents[i])
        others = [j for j in range(i) if j != p]
        m_row, g_row = S * M[i, :i], g[i, :i]
        entry = {"parent": p, "field_argmax": int(np.argmax(m_row)), "g_argmax": int(np.argmax(g_row)),
                 "field_diagonal_over_parent": float(M[i, i] / M[i, p]) if M[i, p] != 0 else None,
                 "g_diagonal_over_parent": float(g[i, i] / g[i, p]) if g[i, p] != 0 else None}
        if others:
            mm = float((m_row[p] - m_row[others].max()) / abs(m_row[p])) if m_row[p] != 0 else float("-inf")
            mg = float((g_row[p] - g_row[others].max()) / abs(g_row[p])) if g_row[p] != 0 else float("-inf")
            entry.update(field_margin=mm, g_margin=mg)
            margins.append(mm)
            margins_g.append(mg)
        per_row[i] = entry
    if not margins:
        return not_applicable("field_dpi", statement, "no non-root row has another earlier position to compare")
    details = {"per_row": per_row, "min_field_margin": min(margins), "min_g_margin": float(np.min(margins_g)),
               "parent_is_field_argmax_everywhere": all(v["field_argmax"] == v["parent"] for v in per_row.values()),
               "eps": float(task.default_eps if eps is None else eps)}
    value = float(min(margins))
    return CheckResult("field_dpi", value, 0.0, bool(value > 0), ">", statement, details)


def _in_context_roots(graph) -> list:
    """Roots other than the query that can attend to two or more positions (``0 < i < T-1``)."""
    return [int(i) for i in graph.roots if 0 < i < graph.T - 1]


def root_drive_ratio(task: Task, eps=None, M=None) -> float:
    """The in-context roots' first-order drive relative to the non-roots' (Knowl 3.3; DESIGN §12).

    ``median_{i ∈ roots} (i+1)·‖J(P_i) S M_i‖ / median_{i ∈ non-roots} (i+1)·‖J(P_i) S M_i‖`` at
    ``A1 = 0`` (``P_i`` uniform over ``i+1`` positions; ``(i+1)`` undoes the ``1/(i+1)`` of ``J``),
    roots ``0 < i < T-1``. NaN when the task has no such root or no non-root context row.
    """
    roots, ctx = _in_context_roots(task.graph), [int(i) for i in _context_rows(task.graph)]
    if not roots or not ctx:
        return float("nan")
    if M is None:
        M = stage1_field(task, eps).M
    P = first_layer_attention(np.zeros((task.T, task.T)))
    drive = (np.arange(task.T) + 1.0) * np.linalg.norm(jacobian_rows(P, task.S * M), axis=1)
    return float(np.median(drive[roots]) / np.median(drive[ctx]))


def default_roots_T(S: int, top: int = 160) -> list:
    """Default ``T`` of :func:`check_roots_at_scale`: doubling from 10 to ``top`` (S = 2), to 80 (S = 3), to 40."""
    top = top if S <= 2 else min(top, 80 if S == 3 else 40)
    return [int(T) for T in (10, 20, 40, 80, 160, 320, 640) if T <= top]


def check_roots_at_scale(graph_for_T: Callable, prior, T_values=None, lr1: float = 2.0, steps1: int = 300,
                         beta0: float = 1e-3, eps=None, name: str = "roots_at_scale",
                         hypotheses="auto") -> CheckResult:
    """In-context roots carry no first-order signal, as ``T`` grows (Knowl 3.3), from the Stage-1 field.

    For each ``T`` of the sweep (default :func:`default_roots_T`): the roots' drive ratio
    (:func:`root_drive_ratio`), and the largest total-variation distance to uniform of an in-context
    root row after ``steps1`` field-driven Stage-1 steps (``A1_i += lr1·S·J(P_i) M_i``, natural units).

    Value: the fitted exponent of the drive ratio against ``T_eff``; threshold 0. Status:
    ``"not_applicable"`` when no graph of the sweep has an in-context root that can attend to two or
    more positions (a chain: its only in-context root is position 0); ``"pass"`` when both the drive
    ratio and the drift shrink with ``T`` (negative fitted exponent, last below first); ``"fail"``
    otherwise; ``"inconclusive"`` when an assumption it needs fails (the uniform mean, Knowl 10.3:
    without it a sticky mean ``E[tr π] > 1`` rewards self-attention on every row and the drive does
    not fall).
    """
    statement = ("in-context root rows carry no first-order signal (Knowl 3.3): their drive relative to "
                 "non-roots and their drift after Stage 1 shrink with T")
    if T_values is None:
        T_values = default_roots_T(prior.S)
    T_values = sorted(int(T) for T in T_values)
    rows = {"T": [], "t_eff": [], "root_drive_ratio": [], "root_tv_after_stage1": [], "root_field_norm": []}
    last = None
    for T in T_values:
        task = Task(graph_for_T(int(T)), prior)
        roots = _in_context_roots(task.graph)
        if not roots or _context_rows(task.graph).size == 0:
            continue
        last = task
        M = stage1_field(task, eps).M
        A1 = np.zeros((task.T, task.T))
        j0 = jacobian_rows(first_layer_attention(A1), task.S * M)
        eta1 = lr1 * task.S * task.T / beta0
        for _ in range(steps1):
            A1 = A1 - eta1 * field_grad_A1(M, A1, beta0)
        P = first_layer_attention(A1)
        rows["T"].append(int(T))
        rows["t_eff"].append(float(task.t_eff))
        rows["root_drive_ratio"].append(root_drive_ratio(task, M=M))
        rows["root_tv_after_stage1"].append(
            max(float(0.5 * np.abs(P[i, : i + 1] - 1.0 / (i + 1)).sum()) for i in roots))
        rows["root_field_norm"].append(float(max(np.linalg.norm(j0[i]) for i in roots)))
    if len(rows["T"]) < 2:
        return not_applicable(name, statement, "fewer than two graphs of the sweep have an in-context root that "
                                               "can attend to two or more positions and a non-root row "
                                               "(a chain's only in-context root is position 0)")
    fit_r = fit_power_law(rows["t_eff"], rows["root_drive_ratio"])
    fit_tv = fit_power_law(rows["t_eff"], rows["root_tv_after_stage1"])
    r, tv = rows["root_drive_ratio"], rows["root_tv_after_stage1"]
    shrinks_r = bool(r[-1] < r[0] * (1 - 1e-9) and fit_r.exponent < 0)
    shrinks_tv = bool(tv[-1] < tv[0] * (1 - 1e-9) and fit_tv.exponent < 0)
    details = dict(sweep=rows, drive_ratio_exponent=fit_r.exponent, drive_ratio_exponent_stderr=fit_r.stderr,
                   tv_exponent=fit_tv.exponent, drive_ratio_shrinks=shrinks_r, tv_shrinks=shrinks_tv,
                   lr1=lr1, steps1=steps1, beta0=beta0,
                   note="drive ratio: median over in-context roots of (i+1)|J(P_i) S M_i| at A1 = 0 over the "
                        "same median over non-roots; theory ~ 1/T under a uniform mean")
    res = CheckResult(name, float(fit_r.exponent), 0.0, shrinks_r and shrinks_tv, "<", statement, details)
    if hypotheses == "auto":
        hypotheses = measure_hypotheses(last)
    return within_hypotheses(res, hypotheses, NEEDS["roots_at_scale"])
