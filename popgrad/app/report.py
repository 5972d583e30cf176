"""Reports of a run: ``report.json`` (machine-readable), ``report.md`` (tables) and ``report.html``.

``report.md`` shows every number with 4 significant digits and every per-row, per-position or
per-head detail as a table, never a Python repr; ``report.html`` (:mod:`popgrad.app.report_html`) is
the same report as one self-contained page, figures embedded, verdict table at the top. All are
written atomically. The population is exact *for the finite prior*
of the run (its atoms and weights); every report says so.
"""
from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping

import numba
import numpy as np
import scipy

from .. import __version__
from .._io import atomic_write_text
from ..checks.hypotheses import measure_hypotheses
from ..checks.results import _jsonable, all_passed
from ..task.tasks import MultiParentTask
from ..theory.information import assumptions
from .tasks import FINITE_PRIOR_KEYS

#: Said (console and report) when ``uniform_mean`` is asked but the draws cannot be tilted to it.
UNIFORM_MEAN_IMPOSSIBLE = ("uniform_mean = true, but every draw's trace is on one side of 1, so no reweighting "
                           "gives E[pi] = 11^T/S: the draws keep equal weights and Knowl 10.3 fails (checks that "
                           "need it are inconclusive); use more --atoms, another --seed or a larger --floor")

#: The statuses, in the order report.md counts them.
STATUS_NAMES = ("pass", "fail", "inconclusive", "not_applicable")
_TAGS = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "not_applicable": "n/a"}

#: What each reference loss is (report.md).
REFERENCE_LABELS = {
    "eps": "ε, the loss perturbation (T_eff^-1/2; 0 for the full model's softmax readout)",
    "L_star": "L*: the oracle that knows π, ε = 0",
    "L_bayes": "L_Bayes = H(y \\| s), ε = 0",
    "L_star_eps": "L*_ε: the oracle's ε-loss (not a bound; < 0 when π + ε > 1)",
    "L_bayes_eps": "L_Bayes,ε: the posterior predictive's ε-loss (optimal at ε = 0 only; not a bound)",
    "L_count": "L_count: the count estimator of Knowl 8, ε-loss",
    "L_count_model_limit": "the model's own limit at the construction, ε-loss",
    "L_floor_eps": "L_floor,ε: the exact floor of the ε-loss (lower bound of every model)",
    "L_model_heldout": "the model's loss on the held-out sample (full model, sampled gradient)",
    "L_official_bayes": "L_official_bayes: the official bayes estimator (in-context counts + α, edges only)",
    "model_minus_official_bayes": "model − official bayes, same held-out sample",
    "model_minus_bayes": "model − L_Bayes, same held-out sample",
}

__all__ = ["build_report", "write_report", "render_markdown", "atomic_write_text", "versions", "fmt",
           "reference_value", "detail_lines", "weights_accuracy"]


def versions() -> dict:
    return {
        "popgrad": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "numba": numba.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


def weights_accuracy(task) -> dict:
    """The report's ``task.weights``: which weights ``w(s, c)`` are exact and the bound of the others.

    ``exact`` (closed form or a finite prior's atoms: exact to rounding), ``bound`` (the largest relative
    error estimate of a quadrature or sampled rule, 0 when exact; ``None`` when not computed), ``method``,
    ``statistical`` and ``summary`` (:meth:`popgrad.task.dirichlet.WeightAccuracy.summary`).
    """
    continuous = bool(getattr(task, "continuous", False))
    if continuous and not task.enumerable:
        return {"prior": "continuous", "exact": None, "bound": None, "method": "not computed",
                "statistical": False, "summary": "weights: not computed (S**T beyond the enumeration limit)"}
    acc = task.weight_accuracy
    return {"prior": "continuous" if continuous else "finite", "exact": bool(acc.exact), "bound": float(acc.bound),
            "method": acc.method, "statistical": bool(acc.statistical), "summary": acc.summary()}


#: The report's per-draw assumptions under a continuous prior (it has no draws to measure them on).
NO_DRAWS = ("the continuous prior has no atoms, and these quantities (chi-squared information, mu_min, sigma_2, ...) "
            "are taken per draw of a finite prior; the hypotheses table reads what holds for every draw")


def build_report(config: dict, task, trajectory, checks, references: dict, extra: dict | None = None) -> dict:
    """Assemble the report dictionary (JSON-serialisable)."""
    try:
        if isinstance(task, MultiParentTask):  # its tensor prior's diagnostics
            assume = {**task.prior.diagnostics()._asdict(), "k": task.k, "root_fraction": task.graph.root_fraction,
                      "t_eff": task.t_eff}
        elif task.continuous:  # the per-draw quantities are sums over a finite prior's draws
            assume = {"not_measured": NO_DRAWS}
        else:
            assume = assumptions(task)._asdict()
    except ValueError as exc:  # e.g. a reducible atom (mu has a zero): say so instead of failing
        assume = {"error": str(exc)}
    hyp = measure_hypotheses(task)
    ok = np.flatnonzero(np.isfinite(trajectory.loss))
    last = int(ok[-1]) if ok.size else None
    loss_se = getattr(trajectory, "loss_se", None)  # the full model's losses are all exact
    final_se = float(loss_se[last]) if last is not None and loss_se is not None else float("nan")
    sampled = last is not None and np.isfinite(final_se)
    return _jsonable(
        {
            "config": config,
            "versions": versions(),
            "task": {
                "graph": task.graph.to_string(),
                "S": task.S,
                "T": task.T,
                "t_eff": task.t_eff,
                "n_sequences": task.n_sequences,
                "prior_atoms": task.prior.K,
                "weights": weights_accuracy(task),
                "assumptions": assume,
                "hypotheses": hyp.to_dict(),
                "hypotheses_all_met": hyp.all_met,
                "note": ("every population quantity is exact for this finite prior (its atoms and weights), "
                         "except those labelled sampled (estimates with a standard error and n)")
                if not getattr(task, "continuous", False) else
                ("every population quantity is an exact sum over all sequences with the weights below (exact "
                 "to rounding, or within their stated bound), except those labelled sampled"),
            },
            "references": references,
            "trajectory": {
                "status": trajectory.status,
                "message": trajectory.message,
                "records": int(len(trajectory.step)),
                "last_step": int(trajectory.step[-1]) if len(trajectory.step) else 0,
                "final_loss": float(trajectory.loss[last]) if last is not None else None,
                "final_loss_kind": ("sampled" if sampled else "exact") if last is not None else None,
                "final_loss_se": final_se if sampled else None,
                "stage2_samples": int(getattr(trajectory, "stage2_samples", 0)),
                "final_loss_n": _final_loss_n(trajectory) if sampled else None,
                "monotonicity": trajectory.monotonicity.to_json() if hasattr(trajectory, "monotonicity") else None,
                "loss_curve": trajectory.monotonicity.describe() if hasattr(trajectory, "monotonicity") else None,
            },
            "checks": [c.to_dict() for c in checks],
            "all_passed": all_passed(checks),
            "status_counts": {st: sum(c.status == st for c in checks) for st in STATUS_NAMES},
            **(extra or {}),
        }
    )


def _final_loss_n(trajectory) -> int:
    """Sequences behind a sampled final loss: Stage 2's sample, or the full model's batch."""
    n = int(getattr(trajectory, "stage2_samples", 0) or 0)
    return n or int(getattr(getattr(trajectory, "config", None), "batch_size", None) or 0)


def fmt(x) -> str:
    """A value as report.md shows it: numbers with 4 significant digits, lists and mappings written out
    (never a Python repr)."""
    if x is None:
        return "n/a"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.4g}"
    if isinstance(x, Mapping):
        return ", ".join(f"{k}: {fmt(v)}" for k, v in x.items()) if x else "none"
    if isinstance(x, (list, tuple, np.ndarray)):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    return str(x)


_fmt = fmt


def _is_scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str, np.generic))


def _cell(v) -> str:
    return fmt(v).replace("|", "\\|").replace("\n", " ")


def _table(header, rows) -> list:
    return (["", "| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows] + [""])


def detail_lines(key, v) -> list:
    """One detail of a check as report.md lines: a scalar or a short list on one line; a matrix, a
    mapping of rows (per row, per position, per head) or a list of records as a table."""
    if isinstance(v, Mapping) and v and all(isinstance(r, Mapping) for r in v.values()):
        cols = list(dict.fromkeys(c for r in v.values() for c in r))
        return [f"- {key}:"] + _table([key.rsplit("per_", 1)[1] if "per_" in key else "key"] + cols,
                                      [[k] + [r.get(c) for c in cols] for k, r in v.items()])
    if isinstance(v, Mapping) and v and all(isinstance(r, (list, tuple)) and all(map(_is_scalar, r))
                                            for r in v.values()):
        width = max(len(r) for r in v.values())
        return [f"- {key}:"] + _table(["key"] + list(range(width)),
                                      [[k] + list(r) + [None] * (width - len(r)) for k, r in v.items()])
    if isinstance(v, (list, tuple)) and v and all(isinstance(r, Mapping) for r in v):
        cols = list(dict.fromkeys(c for r in v for c in r))
        return [f"- {key}:"] + _table(["#"] + cols, [[i] + [r.get(c) for c in cols] for i, r in enumerate(v)])
    per = key.startswith("per_") or "_per_" in key
    if per and isinstance(v, Mapping) and v and all(map(_is_scalar, v.values())):
        return [f"- {key}:"] + _table([key.rsplit("per_", 1)[1], "value"], [[k, x] for k, x in v.items()])
    if per and isinstance(v, (list, tuple)) and v and all(map(_is_scalar, v)):
        return [f"- {key}:"] + _table([key.rsplit("per_", 1)[1], "value"], list(enumerate(v)))
    if isinstance(v, (list, tuple)) and v and all(isinstance(r, (list, tuple)) for r in v):
        if all(all(map(_is_scalar, r)) for r in v):
            width = max(len(r) for r in v)
            return [f"- {key} (matrix, rows × columns):"] + _table(
                ["row"] + list(range(width)), [[i] + list(r) + [None] * (width - len(r)) for i, r in enumerate(v)])
    if isinstance(v, (list, tuple)):
        return [f"- {key}: " + (", ".join(fmt(x) for x in v) if v else "none")]
    return [f"- {key}: {fmt(v)}"]


def _kind(v) -> str:
    return v.get("kind", "exact") if isinstance(v, dict) else "exact"


def _fmt_value(v) -> str:
    """``value`` (exact) or ``value ± se (n = …)`` (sampled)."""
    if not isinstance(v, dict):
        return _fmt(v)
    if v.get("value") is None:
        return "n/a" + (f" ({v['reason']})" if v.get("reason") else "")
    if v.get("kind") == "sampled" and v.get("se") is not None:
        return f"{_fmt(v['value'])} ± {_fmt(v['se'])} (n = {v.get('n', 0):,})"
    return _fmt(v["value"])


def reference_value(v):
    """The number of a reference entry (a float, or a ``{"value", "kind", ...}`` dict)."""
    return v.get("value") if isinstance(v, dict) else v


def render_markdown(report: dict, sections=()) -> str:
    """The report as Markdown: task, references, checks table, ``sections`` (the kind's report.md lines,
    :meth:`popgrad.app.kinds.Kind.markdown`), details."""
    t = report["task"]
    cfg = report["config"]
    lines = [
        "# popgrad run report",
        "",
        f"Task: graph `{t['graph']}`, S = {t['S']}, T = {t['T']}, T_eff = {_fmt(t['t_eff'])}, "
        f"S**T = {t['n_sequences']:,} sequences, "
        + (f"prior with {t['prior_atoms']} atoms." if t['prior_atoms'] is not None else "continuous prior."),
        *([f"Weights: {t['weights']['summary']}."] if t.get("weights") else []),
        f"_{t['note']}._",
        "",
        ("Paper assumptions (Knowl 10) per prior draw: not measured: " + t["assumptions"]["not_measured"]
         if "not_measured" in t["assumptions"] else
         "Paper assumptions (Knowl 10) measured on this task: "
         + ", ".join(f"{k} = {_fmt(v)}" for k, v in t["assumptions"].items())),
        "",
    ]
    hyp = t.get("hypotheses") or {}
    if hyp:
        met = t.get("hypotheses_all_met")
        lines += [
            "## Hypotheses (Knowl 10, γ = 0.1)" + (" — all met" if met else " — NOT all met: checks that need a "
                                                                             "failed one are inconclusive"),
            "",
            "| assumption | where | measured | requirement | met |",
            "|---|---|---|---|---|",
        ]
        for k, h in hyp.items():
            mark = "n/a" if h["met"] is None else ("yes" if h["met"] else "**NO**")
            lines.append(f"| {k} | {h['knowl']} | {_fmt(h['value'])} | {h['requirement']} | {mark} |")
        if cfg.get("uniform_mean") and hyp.get("uniform_mean", {}).get("met") is False:
            lines += [f"Note: {UNIFORM_MEAN_IMPOSSIBLE}.", ""]
        lines.append("")
    lines += [
        "Configuration: " + ", ".join(f"`{k}={v}`" for k, v in cfg.items()
                                      if not (cfg.get("prior") == "continuous" and k in FINITE_PRIOR_KEYS)),
        "",
        f"Run status: **{report['trajectory']['status']}** {report['trajectory']['message']}".rstrip(),
        "",
        "## Reference losses",
        "",
        "| quantity | value | kind |",
        "|---|---|---|",
    ]
    for k, v in report["references"].items():
        label = REFERENCE_LABELS.get(k.replace("_sampled", ""), k)
        lines.append(f"| {label} | {_fmt_value(v)} | {_kind(v)} |")
    tr = report["trajectory"]
    final = {"value": tr["final_loss"], "kind": tr.get("final_loss_kind") or "exact", "se": tr.get("final_loss_se"),
             "n": tr.get("final_loss_n") or tr.get("stage2_samples")}
    lines.append(f"| final loss L(θ̂) | {_fmt_value(final)} | {_kind(final)} |")
    if tr.get("loss_curve"):
        lines += ["", f"Loss curve: {tr['loss_curve']}."]
    lines += [
        "",
        "## Theorem checks",
        "",
        "| check | value | | threshold | status | kind | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in report["checks"]:
        status = c.get("status") or (("pass" if c["passed"] else "fail") if c.get("applicable", True)
                                     else "not_applicable")
        lines.append(f"| {c['name']} | {_fmt(c['value'])} | {c['comparison']} | {_fmt(c['threshold'])} | "
                     f"{_TAGS[status]} | {c.get('kind', 'exact')} | {c.get('reason', '')} |")
    counts = report.get("status_counts")
    if counts:
        ap = report["all_passed"]
        lines += ["", "Verdicts: " + ", ".join(f"{counts[k]} {k}" for k in STATUS_NAMES) +
                  ("; no check was decided (all_passed: null)." if ap is None
                   else f"; all decided checks passed: {ap}.")]
    rules = [(c["name"], c["details"]["rule"]) for c in report["checks"]
             if isinstance(c.get("details"), dict) and c["details"].get("rule")]
    if rules:
        lines += ["", "Rules applied:", ""] + [f"- {name}: {rule}" for name, rule in rules]
    lines += list(sections)
    lines += ["", "## Details", ""]
    for c in report["checks"]:
        lines.append(f"### {c['name']}")
        lines.append("")
        lines.append(c["statement"])
        lines.append("")
        for k, v in c["details"].items():
            lines += detail_lines(k, v)
        lines.append("")
    return "\n".join(lines) + "\n"


def write_report(out_dir, report: dict, sections=(), figures=()) -> None:
    """Write ``report.json``, ``report.md`` and ``report.html`` into ``out_dir``, each atomically.

    ``sections``: the kind's report.md lines (:meth:`popgrad.app.kinds.Kind.markdown`); ``figures``: the
    PNG files the HTML page embeds (those that exist)."""
    from .report_html import render_html

    markdown = render_markdown(report, sections)
    atomic_write_text(os.path.join(out_dir, "report.json"), json.dumps(report, indent=2) + "\n")
    atomic_write_text(os.path.join(out_dir, "report.md"), markdown)
    atomic_write_text(os.path.join(out_dir, "report.html"), render_html(report, markdown, figures))
