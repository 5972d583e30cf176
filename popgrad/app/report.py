"""Reports of a run: ``report.json`` (machine-readable), ``report.md`` (tables) and ``report.html``.

``report.md`` reads top down: the verdicts (one table: each statement named as the paper's reader knows
it, the outcome of its rule, the status and why), the figures with captions, the hypotheses, the task, the
reference losses (nats) grouped by the ``ε`` of their loss, then every check's details. Numbers have 4
significant digits, standard errors 2; a value below ``NOISE_RTOL`` of the largest in its table column or
list is rounding noise and shown as 0; every per-row, per-position or per-head detail is a table, never a
Python repr. ``report.html`` (:mod:`popgrad.app.report_html`) is the same report as one self-contained
page (figures embedded). All are written atomically. The population is exact *for the finite prior* of
the run (its atoms and weights); every report says so.
"""
from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Mapping

import numba
import numpy as np
import scipy

from .. import __version__
from .._io import atomic_write_text
from ..checks.hypotheses import measure_hypotheses
from ..checks.results import _jsonable, all_passed, outcome, statement_label
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
    "L_official_bayes": "L_official_bayes: the edges-only count estimator (in-context counts of the edges + α; the official single-parent bayes line also counts the roots)",
    "model_minus_official_bayes": "model − edges-only count estimator, same held-out sample",
    "L_official_bayes_line": "the official bayes line (InContextTree.bayes as written: in-context counts + α, every "
                             "non-query root counted as a child of position T−2; what the official figures draw)",
    "model_minus_official_bayes_line": "model − the official bayes line, same held-out sample",
    "model_minus_bayes": "model − L_Bayes, same held-out sample",
    "L_context_free": "L_context_free: the best predictor p(y \\| s_T) that ignores the context, ε-loss",
    "L_model": "the model's loss on the Stage-2 sample, ε-loss",
    "model_minus_count": "model − L_count, same sample",
    "model_minus_bayes_eps": "model − L_Bayes,ε, same sample",
}

#: References whose loss has no ε-perturbation (the plain cross-entropy); every other loss of the reduced
#: model is an ε-loss, ``-E log(f + ε)`` at the report's ``eps``.
UNPERTURBED = ("L_star", "L_bayes", "L_official_bayes", "L_model_heldout", "model_minus_official_bayes",
               "model_minus_bayes", "L_official_bayes_line", "model_minus_official_bayes_line")

#: A float below this fraction of the largest magnitude in its table column, matrix or list is rounding
#: noise of the sums behind it (float64 sums over up to 10^8 terms stay far below), shown as 0.
NOISE_RTOL = 1e-12

#: The hypotheses as the paper's reader knows them, then popgrad's label.
HYPOTHESIS_LABELS = {
    "Knowl 10.1": "transition lower bound (Knowl 10.1)",
    "Knowl 10.2": "non-degeneracy (Knowl 10.2)",
    "Knowl 10.3": "permutation symmetry and uniform mean (Knowl 10.3)",
    "Knowl 10.4": "non-root fraction (Knowl 10.4)",
    "Knowl 10.5": "effective sequence length (Knowl 10.5)",
}

#: What each figure shows (report.md and report.html captions), by file name; ``model`` picks a variant.
FIGURE_CAPTIONS = {
    "attention.png": {
        "reduced": "softmax(A1) of the trained first layer beside the true adjacency of the graph (the paper's "
                   "Figure 2): row i is position i's attention over j ≤ i; graph recovery puts the mass on p(i).",
        "catformer": "The full model's exact population-average layer-1 attention of each head beside the true "
                     "graph (the paper's Figures 2 and 7 style).",
        "transformer": "The standard transformer's layer-1 attention averaged over the population (exact) or the "
                       "held-out sample (sampled) beside the true graph (the official Figure 8 style).",
    },
    "loss.png": {
        "reduced": "Loss (nats) against the step, above the exact floor L_floor,ε (a lower bound of every model), "
                   "with L*_ε, L_Bayes,ε and the count estimator of the same ε (the first two are not bounds).",
        "catformer": "Loss (nats) against the step, with the Bayes loss, the exact floor and the count estimator "
                     "(at ε = 0, smoothed where it is infinite); sampled: the held-out estimates and both official "
                     "reference lines (the edges-only count estimator and the official bayes line).",
        "transformer": "Loss (nats, ε = 0) against the step, with the exact references (exact gradient) and both "
                       "official reference lines: the edges-only count estimator and the official bayes line.",
    },
    "gradient_cosine.png": {
        "reduced": "Cosine between the exact Stage-1 gradient and the paper's idealized prediction (Knowl 3) "
                   "along the run.",
    },
    "attention_to_parent.png": {
        "reduced": "Attention to the parent, softmax(A1)[i, p(i)], per position along the run; graph recovery "
                   "asks ≥ 1 - O(1/T).",
        "catformer": "Attention to the parent per position and head along the run, and at the end.",
    },
}


#: Where a check that is pre-asymptotic at this run's sizes is decided: the command that reaches its regime
#: (docs/guide/paper_statements.md has every check's).
REGIME_HINTS = {
    "gradient_alignment": "the alignment rate passes on the S = 2 chain with the uniform-mean pair prior swept to "
                          "T_eff = 1000 (local exponent -0.43): `pg.checks.check_alignment_rate(pg.chain, pair, "
                          "pg.checks.default_alignment_T(2))` with `pair = pg.FinitePrior([[[.8, .2], [.2, .8]], "
                          "[[.2, .8], [.8, .2]]])`, about 20 s",
    "ood_generalization": "a large-T_eff statement: it is decided only where the construction (count estimator) "
                          "beats the context-free predictor out of distribution; popgrad has not yet found a size "
                          "that enumerates where that holds for the default unseen π̃ (S = 2 stays undecided up to "
                          "T = 16), and its decided case is tested on the construction itself",
}
REGIME_HINTS["alignment_rate"] = REGIME_HINTS["gradient_alignment"]


def figure_caption(name: str, model: str = "reduced") -> str:
    """The caption of figure ``name`` (a file name) for a run of ``model``; the file name when that model has
    none (another model's caption would describe another model's figure)."""
    variants = FIGURE_CAPTIONS.get(os.path.basename(name), {})
    return variants.get(model) or os.path.basename(name)

__all__ = ["build_report", "write_report", "render_markdown", "atomic_write_text", "versions", "fmt", "fmt_se",
           "reference_value", "detail_lines", "weights_accuracy", "figure_caption"]


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


def fmt(x, scale=None) -> str:
    """A value as report.md shows it: numbers with 4 significant digits, lists and mappings written out
    (never a Python repr). With ``scale``, a float below ``NOISE_RTOL · scale`` in magnitude is rounding
    noise and shown as ``0``."""
    if x is None:
        return "n/a"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if scale is not None and math.isfinite(x) and abs(x) <= NOISE_RTOL * scale:
            return "0"
        return f"{x:.4g}" if math.isfinite(x) else ("n/a" if math.isnan(x) else f"{x:g}")
    if isinstance(x, Mapping):
        return ", ".join(f"{k}: {fmt(v)}" for k, v in x.items()) if x else "none"
    if isinstance(x, (list, tuple, np.ndarray)):
        sc = _scale(x)
        return "[" + ", ".join(fmt(v, sc) for v in x) + "]"
    return str(x)


def fmt_se(x) -> str:
    """A standard error as reports show it: 2 significant digits (``n/a`` when missing)."""
    if x is None or isinstance(x, (bool, np.bool_)):
        return "n/a"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f"{x:.2g}" if math.isfinite(x) else "n/a"


_fmt = fmt


def _is_float(v) -> bool:
    return isinstance(v, (float, np.floating)) and not isinstance(v, (bool, np.bool_))


def _scale(values):
    """The largest finite float magnitude among ``values`` (None without two floats: nothing to compare)."""
    flat = [abs(float(v)) for v in values if _is_float(v) and math.isfinite(float(v))]
    return max(flat) if len(flat) >= 2 else None


def _is_se(key) -> bool:
    k = str(key).lower()
    return k in ("se", "stderr") or k.endswith(("_se", "_stderr"))


def _is_scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str, np.generic))


def _cell(v, scale=None, se=False) -> str:
    text = fmt_se(v) if se and _is_float(v) else fmt(v, scale)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header, rows, whole=False) -> list:
    """A Markdown table; rounding noise zeroed per column (``whole``: over the whole table, a matrix)."""
    rows = [list(r) for r in rows]
    width = len(header)
    if whole:
        scales = [_scale([c for r in rows for c in r[1:]])] * width
    else:
        scales = [_scale([r[j] for r in rows if j < len(r)]) for j in range(width)]
    ses = [_is_se(h) for h in header]
    return (["", "| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * width]
            + ["| " + " | ".join(_cell(c, scales[j], ses[j]) for j, c in enumerate(row)) + " |" for row in rows]
            + [""])


def detail_lines(key, v) -> list:
    """One detail of a check as report.md lines: a scalar or a short list on one line; a matrix, a
    mapping of rows (per row, per position, per head) or a list of records as a table. Standard errors
    (keys ``*_se``, ``*_stderr``) have 2 significant digits; rounding noise is shown as 0."""
    if isinstance(v, Mapping) and v and all(isinstance(r, Mapping) for r in v.values()):
        cols = list(dict.fromkeys(c for r in v.values() for c in r))
        return [f"- {key}:"] + _table([key.rsplit("per_", 1)[1] if "per_" in key else "key"] + cols,
                                      [[k] + [r.get(c) for c in cols] for k, r in v.items()])
    if isinstance(v, Mapping) and v and all(isinstance(r, (list, tuple)) and all(map(_is_scalar, r))
                                            for r in v.values()):
        width = max(len(r) for r in v.values())
        return [f"- {key}:"] + _table(["key"] + list(range(width)),
                                      [[k] + list(r) + [None] * (width - len(r)) for k, r in v.items()], whole=True)
    if isinstance(v, (list, tuple)) and v and all(isinstance(r, Mapping) for r in v):
        cols = list(dict.fromkeys(c for r in v for c in r))
        return [f"- {key}:"] + _table(["#"] + cols, [[i] + [r.get(c) for c in cols] for i, r in enumerate(v)])
    per = key.startswith("per_") or "_per_" in key
    value_col = "se" if _is_se(key) else "value"
    if per and isinstance(v, Mapping) and v and all(map(_is_scalar, v.values())):
        return [f"- {key}:"] + _table([key.rsplit("per_", 1)[1], value_col], [[k, x] for k, x in v.items()])
    if per and isinstance(v, (list, tuple)) and v and all(map(_is_scalar, v)):
        return [f"- {key}:"] + _table([key.rsplit("per_", 1)[1], value_col], list(enumerate(v)))
    if isinstance(v, (list, tuple)) and v and all(isinstance(r, (list, tuple)) for r in v):
        if all(all(map(_is_scalar, r)) for r in v):
            width = max(len(r) for r in v)
            return [f"- {key} (matrix, rows × columns):"] + _table(
                ["row"] + list(range(width)), [[i] + list(r) + [None] * (width - len(r)) for i, r in enumerate(v)],
                whole=True)
    if isinstance(v, (list, tuple)):
        if not v:
            return [f"- {key}: none"]
        sc = _scale(v)
        return [f"- {key}: " + ", ".join(fmt_se(x) if _is_se(key) and _is_float(x) else fmt(x, sc) for x in v)]
    if _is_se(key) and _is_float(v):
        return [f"- {key}: {fmt_se(v)}"]
    return [f"- {key}: {fmt(v)}"]


def _kind(v) -> str:
    return v.get("kind", "exact") if isinstance(v, dict) else "exact"


def _fmt_value(v) -> str:
    """``value`` (exact) or ``value ± se (n = …)`` (sampled; the SE to 2 significant digits)."""
    if not isinstance(v, dict):
        return _fmt(v)
    if v.get("value") is None:
        return "n/a" + (f" ({v['reason']})" if v.get("reason") else "")
    if v.get("kind") == "sampled" and v.get("se") is not None:
        return f"{_fmt(v['value'])} ± {fmt_se(v['se'])} (n = {v.get('n', 0):,})"
    return _fmt(v["value"])


def reference_value(v):
    """The number of a reference entry (a float, or a ``{"value", "kind", ...}`` dict)."""
    return v.get("value") if isinstance(v, dict) else v


def _status(c) -> str:
    return c.get("status") or (("pass" if c["passed"] else "fail") if c.get("applicable", True)
                               else "not_applicable")


def verdict_lines(report: dict) -> list:
    """The one verdict table of report.md (and report.html): per check its statement (named first), its
    name, the outcome of its rule, the status, exact or sampled, and the reason; then the counts."""
    lines = ["## Verdicts", "",
             "| statement | check | outcome | status | kind | reason |",
             "|---|---|---|---|---|---|"]
    for c in report["checks"]:
        lines.append(f"| {_cell(statement_label(c['name']))} | {c['name']} | "
                     f"{_cell(outcome(c.get('value'), c.get('comparison'), c.get('threshold')))} | "
                     f"{_TAGS[_status(c)]} | {c.get('kind', 'exact')} | {_cell(c.get('reason', ''))} |")
    counts = report.get("status_counts")
    if counts:
        ap = report["all_passed"]
        lines += ["", "Verdicts: " + ", ".join(f"{counts[k]} {k}" for k in STATUS_NAMES) +
                  ("; no check was decided (all_passed: null)." if ap is None
                   else f"; all decided checks passed: {ap}.")]
    hints = [(c["name"], REGIME_HINTS[c["name"]]) for c in report["checks"]
             if _status(c) == "inconclusive" and str(c.get("reason", "")).startswith("pre-asymptotic")
             and c["name"] in REGIME_HINTS]
    if hints:
        lines += ["", "Pre-asymptotic here; where the regime is reached:", ""]
        lines += [f"- {statement_label(name)}: {hint}." for name, hint in hints]
    lines += ["", "_The outcome is the relation that holds between the measured value and the threshold, and "
                  "whether the check's rule is met; a verdict is decided (PASS or FAIL) only inside the "
                  "statement's hypotheses and regime, otherwise INCONCLUSIVE with the reason. Losses and their "
                  "differences are in nats; attention values are probabilities. The statements and the paper's "
                  "own names for them: docs/guide/paper_statements.md._"]
    return lines


def _figure_lines(figures, model: str) -> list:
    names = [os.path.basename(str(f)) for f in figures]
    if not names:
        return []
    lines = ["", "## Figures", ""]
    for i, name in enumerate(names, 1):
        cap = figure_caption(name, model)
        lines += [f"![{name}]({name})", "", f"**Figure {i}** ({name}): {_md_escape(cap)}", ""]
    return lines


def _md_escape(text: str) -> str:
    """Text with Markdown's emphasis characters escaped (captions hold ``L*_ε``, ``L_floor,ε``)."""
    return str(text).replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")


def _reference_lines(report: dict) -> list:
    """The reference losses in nats, one table per ε (each named), the final loss with its own ε."""
    refs = report["references"]
    eps = refs.get("eps")
    eps = float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else 0.0
    tr = report["trajectory"]
    final = {"value": tr["final_loss"], "kind": tr.get("final_loss_kind") or "exact", "se": tr.get("final_loss_se"),
             "n": tr.get("final_loss_n") or tr.get("stage2_samples")}
    plain, perturbed = [], []
    for k, v in refs.items():
        if k == "eps":
            continue
        base = k.replace("_sampled", "")
        (plain if base in UNPERTURBED or eps == 0 else perturbed).append((REFERENCE_LABELS.get(base, k), v))
    head = ["| quantity | value (nats) | kind |", "|---|---|---|"]
    lines = ["## Reference losses (nats)", ""]
    if eps > 0:
        lines += [f"The model is trained on the ε-loss −E log(f(s)_y + ε) with ε = {_fmt(eps)} (T_eff^-1/2, the "
                  "paper's perturbation); the information-theoretic references are plain cross-entropies "
                  "(ε = 0). Compare a loss only with losses of the same ε.", ""]
    if plain:
        title = ("### Unperturbed cross-entropy (ε = 0)" if eps > 0 else
                 "### Cross-entropy (ε = 0: the loss the model is trained on)")
        lines += [title, ""] + head + [f"| {label} | {_fmt_value(v)} | {_kind(v)} |" for label, v in plain]
        if eps == 0:
            lines.append(f"| final loss L(θ̂) | {_fmt_value(final)} | {_kind(final)} |")
        lines.append("")
    if eps > 0:
        lines += [f"### ε-loss at ε = {_fmt(eps)} (the loss the model is trained on)", ""] + head
        lines += [f"| {label} | {_fmt_value(v)} | {_kind(v)} |" for label, v in perturbed]
        lines += [f"| final loss L_ε(θ̂) | {_fmt_value(final)} | {_kind(final)} |", ""]
    if tr.get("loss_curve"):
        lines += [f"Loss curve: {tr['loss_curve']}.", ""]
    return lines


def _hypothesis_lines(report: dict) -> list:
    t, cfg = report["task"], report["config"]
    hyp = t.get("hypotheses") or {}
    lines = []
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
            # an error to rounding (the uniform mean's) is measured against probabilities of order 1
            value = _fmt(h["value"], 1.0 if k == "uniform_mean" else None)
            lines.append(f"| {k} | {HYPOTHESIS_LABELS.get(h['knowl'], h['knowl'])} | {value} | "
                         f"{h['requirement']} | {mark} |")
        if cfg.get("uniform_mean") and hyp.get("uniform_mean", {}).get("met") is False:
            lines += ["", f"Note: {UNIFORM_MEAN_IMPOSSIBLE}."]
        lines.append("")
    assume = t["assumptions"]
    lines += [("Paper assumptions (Knowl 10) per prior draw: not measured: " + assume["not_measured"]
               if "not_measured" in assume else
               "Paper assumptions (Knowl 10) measured on this task: "
               + ", ".join(f"{k} = {_fmt(v, 1.0 if k.endswith('_error') else None)}" for k, v in assume.items())),
              ""]
    return lines


def render_markdown(report: dict, sections=(), figures=()) -> str:
    """The report as Markdown: summary, verdicts, ``figures`` (file names beside report.md, with captions),
    hypotheses, task and configuration, reference losses by ε, ``sections`` (the kind's report.md lines,
    :meth:`popgrad.app.kinds.Kind.markdown`), rules, details."""
    t = report["task"]
    cfg = report["config"]
    tr = report["trajectory"]
    model = cfg.get("model") or "reduced"
    lines = [
        "# popgrad run report",
        "",
        f"Graph `{t['graph']}`, S = {t['S']}, T = {t['T']}, T_eff = {_fmt(t['t_eff'])}; run "
        f"**{tr['status']}** after step {tr.get('last_step', 0)}. {tr['message']}".rstrip(),
        "",
    ]
    lines += verdict_lines(report)
    lines += _figure_lines(figures, model)
    lines += [""] + _hypothesis_lines(report)
    lines += [
        "## Task and configuration",
        "",
        f"Task: graph `{t['graph']}`, S = {t['S']}, T = {t['T']}, T_eff = {_fmt(t['t_eff'])}, "
        f"S**T = {t['n_sequences']:,} sequences, "
        + (f"prior with {t['prior_atoms']} atoms." if t['prior_atoms'] is not None else "continuous prior."),
        *([f"Weights: {t['weights']['summary']}."] if t.get("weights") else []),
        f"_{t['note']}._",
        "",
        "Configuration: " + ", ".join(f"`{k}={v}`" for k, v in cfg.items()
                                      if not (cfg.get("prior") == "continuous" and k in FINITE_PRIOR_KEYS)),
        "",
        f"Run status: **{tr['status']}** {tr['message']}".rstrip(),
        "",
    ]
    lines += _reference_lines(report)
    rules = [(c["name"], c["details"]["rule"]) for c in report["checks"]
             if isinstance(c.get("details"), dict) and c["details"].get("rule")]
    if rules:
        lines += ["Rules applied:", ""] + [f"- {name}: {rule}" for name, rule in rules]
    lines += list(sections)
    lines += ["", "## Details", ""]
    for c in report["checks"]:
        lines.append(f"### {statement_label(c['name'])}: {c['name']}")
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
    PNG files report.md links and the HTML page embeds (those that exist)."""
    from .report_html import render_html

    figures = [f for f in figures if os.path.exists(f)]
    markdown = render_markdown(report, sections, figures=figures)
    atomic_write_text(os.path.join(out_dir, "report.json"), json.dumps(report, indent=2) + "\n")
    atomic_write_text(os.path.join(out_dir, "report.md"), markdown)
    atomic_write_text(os.path.join(out_dir, "report.html"), render_html(report, markdown, figures))
