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
from .results import CheckResult, _result, fit_power_law, not_applicable

__all__ = ["default_alignment_T", "alignment_rate_sweep", "check_alignment_rate", "check_field_dpi",
           "check_roots_at_scale", "jacobian_rows"]


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


def check_alignment_rate(graph_for_T: Callable, prior, T_values=None, eps=None, name="alignment_rate") -> CheckResult:
    """Knowl 3's rate, exactly to first order in ``β0``, over a sweep of ``T`` (module docstring).

    Value: the local exponent ``b`` of ``distance ∝ T_eff^b`` fitted over the
    top decade of ``T_eff`` (threshold 0; theory ``-1/2``). Passes when the
    distance decreases over the top decade and ``max/min`` of
    ``√T_eff · distance`` there is at most 2. Details: the whole sweep, the
    exponent's standard error, the factor.
    """
    statement = ("S*M_i = g_i + O(T_eff^-1/2) (Knowl 3, exact first-order field): "
                 "|J(S M - g)| / |J g| decreases like T_eff^-1/2")
    if T_values is None:
        T_values = default_alignment_T(prior.S)
    sweep = alignment_rate_sweep(graph_for_T, prior, T_values, eps)
    if len(sweep["T"]) < 2:
        return not_applicable(name, statement, "fewer than two T of the sweep have a non-root row")
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
    res = _result(name, fit.exponent, 0.0, "<=", statement, details)
    return res._replace(passed=bool(decreasing and factor <= 2.0))


def check_field_dpi(task: Task, eps=None, M=None) -> CheckResult:
    """The data-processing inequality in the exact field, row by row (no enumeration).

    For every non-root context row ``i``: whether ``p(i) = argmax_{j<i} M[i, j]``
    and the margin ``(M[i,p(i)] - max_{j<i, j≠p(i)} M[i,j]) / |M[i,p(i)]|``,
    and the diagonal ratio ``M[i,i] / M[i,p(i)]`` (a lazy chain can make the
    diagonal win; only ``J`` and the uniform-mean prior remove it), the same
    for ``g``. Value: the smallest margin of ``S·M`` (threshold 0: the parent
    wins every row).
    """
    statement = "s_j -> s_p(i) -> s_i: the parent maximizes the exact first-order field over j < i (DPI)"
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


def check_roots_at_scale(graph_for_T: Callable, prior, T_values, lr1: float = 2.0, steps1: int = 300,
                         beta0: float = 1e-3, eps=None, tol: float = 0.1) -> CheckResult:
    """In-context roots under field-driven Stage 1, as ``T`` grows.

    For each ``T``: the field's root rows (largest ``|J(P_i) S M_i|`` at
    ``A1 = 0`` over in-context roots), and the largest total-variation
    distance to uniform of a root row after ``steps1`` field-driven steps
    (``A1_i += lr1·S·J(P_i) M_i``). Value: the distance at the largest ``T``
    (threshold ``tol``); details: the whole sweep and whether it shrinks.
    """
    statement = "in-context root rows carry no first-order signal and stay near uniform as T grows"
    rows = {"T": [], "t_eff": [], "root_field_norm": [], "root_tv_after_stage1": []}
    for T in T_values:
        task = Task(graph_for_T(int(T)), prior)
        roots = [int(i) for i in task.graph.roots if 0 < i < task.T - 1]
        if not roots:
            continue
        M = stage1_field(task, eps).M
        A1 = np.zeros((task.T, task.T))
        P0 = first_layer_attention(A1)
        j0 = jacobian_rows(P0, task.S * M)
        eta1 = lr1 * task.S * task.T / beta0
        for _ in range(steps1):
            A1 = A1 - eta1 * field_grad_A1(M, A1, beta0)
        P = first_layer_attention(A1)
        tv = max(float(0.5 * np.abs(P[i, : i + 1] - 1.0 / (i + 1)).sum()) for i in roots)
        rows["T"].append(int(T))
        rows["t_eff"].append(float(task.t_eff))
        rows["root_field_norm"].append(float(max(np.linalg.norm(j0[i]) for i in roots)))
        rows["root_tv_after_stage1"].append(tv)
    if not rows["T"]:
        return not_applicable("roots_at_scale", statement, "no graph of the sweep has an in-context root")
    tvs = rows["root_tv_after_stage1"]
    details = dict(sweep=rows, shrinks_with_T=bool(tvs[-1] <= tvs[0]), lr1=lr1, steps1=steps1)
    return _result("roots_at_scale", tvs[-1], tol, "<=", statement, details)
