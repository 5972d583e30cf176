"""Reports of a run: ``report.json`` (machine-readable) and ``report.md`` (a table).

Both are written atomically. The population is exact *for the finite prior*
of the run (its atoms and weights); every report says so.
"""
from __future__ import annotations

import json
import os
import platform

import numba
import numpy as np
import scipy

from .. import __version__
from .._io import atomic_write_text
from ..checks.hypotheses import measure_hypotheses
from ..checks.results import _jsonable, all_passed
from ..task.tasks import MultiParentTask
from ..theory.information import assumptions

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
}

__all__ = ["build_report", "write_report", "render_markdown", "atomic_write_text", "versions"]


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


def build_report(config: dict, task, trajectory, checks, references: dict, extra: dict | None = None) -> dict:
    """Assemble the report dictionary (JSON-serialisable)."""
    try:
        if isinstance(task, MultiParentTask):  # its tensor prior's diagnostics
            assume = {**task.prior.diagnostics()._asdict(), "k": task.k, "root_fraction": task.graph.root_fraction,
                      "t_eff": task.t_eff}
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
                "assumptions": assume,
                "hypotheses": hyp.to_dict(),
                "hypotheses_all_met": hyp.all_met,
                "note": "every population quantity is exact for this finite prior (its atoms and weights), "
                        "except those labelled sampled (estimates with a standard error and n)",
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
            },
            "checks": [c.to_dict() for c in checks],
            "all_passed": all_passed(checks),
            "status_counts": {st: sum(c.status == st for c in checks) for st in STATUS_NAMES},
            **(extra or {}),
        }
    )


def _fmt(x) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (int, np.integer)):
        return str(x)
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


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


def render_markdown(report: dict) -> str:
    """The report as Markdown: task, references, checks table, details."""
    t = report["task"]
    cfg = report["config"]
    lines = [
        "# popgrad run report",
        "",
        f"Task: graph `{t['graph']}`, S = {t['S']}, T = {t['T']}, T_eff = {_fmt(t['t_eff'])}, "
        f"S**T = {t['n_sequences']:,} sequences, prior with {t['prior_atoms']} atoms.",
        f"_{t['note']}._",
        "",
        "Paper assumptions (Knowl 10) measured on this task: "
        + ", ".join(f"{k} = {_fmt(v)}" for k, v in t["assumptions"].items()),
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
        "Configuration: " + ", ".join(f"`{k}={v}`" for k, v in cfg.items()),
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
             "n": tr.get("stage2_samples")}
    lines.append(f"| final loss L(θ̂) | {_fmt_value(final)} | {_kind(final)} |")
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
    sweep = report.get("loss_sweep")
    if sweep:
        lines += [
            "",
            "## Loss sweep over T (trained at each T with the same settings)",
            "",
            "| T | T_eff | L_ε(θ̂) - L*_ε | L_ε(θ̂) - L_Bayes,ε | L_ε(θ̂) - L_floor,ε (≥ 0) |",
            "|---|---|---|---|---|",
        ]
        floor = sweep.get("excess_over_floor_eps") or [None] * len(sweep["T"])
        for row in zip(sweep["T"], sweep["t_eff"], sweep["excess_over_L_star_eps"], sweep["excess_over_bayes_eps"],
                       floor):
            lines.append("| " + " | ".join(_fmt(x) for x in row) + " |")
        lines += [
            "",
            f"Fitted exponent of L_ε(θ̂) - L*_ε against T_eff: {_fmt(sweep['fitted_exponent'])} "
            f"± {_fmt(sweep['fitted_exponent_stderr'])} (standard error).",
        ]
    lines += _catformer_section(report.get("catformer"))
    lines += ["", "## Details", ""]
    for c in report["checks"]:
        lines.append(f"### {c['name']}")
        lines.append("")
        lines.append(c["statement"])
        lines.append("")
        for k, v in c["details"].items():
            if isinstance(v, list) and len(v) > 0 and isinstance(v[0], list):
                v = "matrix " + json.dumps(v)
            elif isinstance(v, dict):
                v = ", ".join(f"{kk}: {_fmt(vv)}" for kk, vv in v.items())
            elif isinstance(v, list):
                v = ", ".join(_fmt(x) for x in v)
            else:
                v = _fmt(v)
            lines.append(f"- {k}: {v}")
        lines.append("")
    return "\n".join(lines) + "\n"


def _catformer_section(cat) -> list:
    """The full model's section of report.md: final loss against the references, attention to the parent."""
    if not cat:
        return []
    ex = cat["excess_over"]
    lines = ["", "## The full model (population-average layer-1 attention)", "",
             f"Heads per layer {tuple(cat['heads'])}; final loss {_fmt(cat['final_loss'])}; final loss minus the "
             f"Bayes loss {_fmt(ex['bayes'])}, minus the exact floor {_fmt(ex['floor'])}, minus the (smoothed) "
             f"count estimator {_fmt(ex['count_estimator'])}.", ""]
    rows = cat["attention_to_parent_per_position"]
    cols = [i for i in range(len(rows[0])) if any(r[i] is not None and np.isfinite(r[i]) for r in rows)]
    lines += ["| head | " + " | ".join(f"P̄[{i}, p({i})]" for i in cols) + " |",
              "|---|" + "---|" * len(cols)]
    lines += [f"| {h} | " + " | ".join(_fmt(r[i]) for i in cols) + " |" for h, r in enumerate(rows)]
    return lines


def write_report(out_dir, report: dict) -> None:
    """Write ``report.json`` and ``report.md`` into ``out_dir`` atomically."""
    atomic_write_text(os.path.join(out_dir, "report.json"), json.dumps(report, indent=2) + "\n")
    atomic_write_text(os.path.join(out_dir, "report.md"), render_markdown(report))
