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
from ..checks.results import _jsonable
from ..task.tasks import MultiParentTask
from ..theory.information import assumptions

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
    ok = np.flatnonzero(np.isfinite(trajectory.loss))
    last = int(ok[-1]) if ok.size else None
    final_se = float(trajectory.loss_se[last]) if last is not None else float("nan")
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
                "stage2_samples": int(trajectory.stage2_samples),
            },
            "checks": [c.to_dict() for c in checks],
            "all_passed": bool(all(c.passed for c in checks if getattr(c, "applicable", True))),
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
        lines.append(f"| {k} | {_fmt_value(v)} | {_kind(v)} |")
    tr = report["trajectory"]
    final = {"value": tr["final_loss"], "kind": tr.get("final_loss_kind") or "exact", "se": tr.get("final_loss_se"),
             "n": tr.get("stage2_samples")}
    lines.append(f"| final loss L(θ̂) | {_fmt_value(final)} | {_kind(final)} |")
    lines += [
        "",
        "## Theorem checks",
        "",
        "| check | value | | threshold | passed | kind |",
        "|---|---|---|---|---|---|",
    ]
    for c in report["checks"]:
        mark = "n/a" if not c.get("applicable", True) else ("PASS" if c["passed"] else "FAIL")
        lines.append(f"| {c['name']} | {_fmt(c['value'])} | {c['comparison']} | {_fmt(c['threshold'])} | {mark} "
                     f"| {c.get('kind', 'exact')} |")
    sweep = report.get("loss_sweep")
    if sweep:
        lines += [
            "",
            "## Loss sweep over T (trained at each T with the same settings)",
            "",
            "| T | T_eff | L_ε(θ̂) - L*_ε | L_ε(θ̂) - L_Bayes,ε |",
            "|---|---|---|---|",
        ]
        for row in zip(sweep["T"], sweep["t_eff"], sweep["excess_over_L_star_eps"], sweep["excess_over_bayes_eps"]):
            lines.append("| " + " | ".join(_fmt(x) for x in row) + " |")
        lines += [
            "",
            f"Fitted exponent of L_ε(θ̂) - L*_ε against T_eff: {_fmt(sweep['fitted_exponent'])} "
            f"± {_fmt(sweep['fitted_exponent_stderr'])} (standard error).",
        ]
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


def write_report(out_dir, report: dict) -> None:
    """Write ``report.json`` and ``report.md`` into ``out_dir`` atomically."""
    atomic_write_text(os.path.join(out_dir, "report.json"), json.dumps(report, indent=2) + "\n")
    atomic_write_text(os.path.join(out_dir, "report.md"), render_markdown(report))
