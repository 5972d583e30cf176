"""The results of a sweep (:mod:`popgrad.app.sweep`): a cell's id and row, the rows of cells already done,
the results table and its atomic write.

A row is flat: ``cell_id``, every config key, ``status`` / ``error``, the run's status, every check's
``<name>_value`` / ``_passed`` / ``_status`` / ``_reason`` / ``_applicable`` / ``_kind``, the reference
losses, ``final_loss``, ``time_*_s`` and the library versions (the columns are listed in
:mod:`popgrad.app.sweep`). A cell is done when its ``report.json`` is whole and of the cell's config
(:func:`cached_report`); its row is then rebuilt from the report (:func:`cached_row`).
"""
from __future__ import annotations

import hashlib
import json
import os

from .._io import atomic_path
from .config import DEFAULTS, CLIError, settle

__all__ = ["cell_id", "summary_row", "cached_report", "cached_row", "write_csv_atomic", "CONFIG_KEYS",
           "CELL_FACTS", "REPORT_KEYS", "FIRST_COLUMNS"]

CONFIG_KEYS = tuple(k for k in DEFAULTS if k != "out")
#: Keys every row has even when a cell's config leaves them out.
MODEL_COLUMN_KEYS = ("model",)
#: Per-cell facts of the run that the report does not hold, kept beside it so a resumed row has them too.
CELL_FACTS = "cell.json"
REPORT_KEYS = ("config", "versions", "task", "references", "trajectory", "checks", "all_passed")
FIRST_COLUMNS = ("cell", "cell_id", *CONFIG_KEYS, "status", "error", "resumed")


def cell_id(cfg: dict) -> str:
    """12 hex digits of the SHA-256 of the resolved config (canonical JSON, sorted keys, without ``out``)."""
    blob = json.dumps({k: v for k, v in cfg.items() if k != "out"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _scalar(v):
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return v


def summary_row(cfg: dict, report: dict | None = None, error: str = "", versions: dict | None = None) -> dict:
    """The flat results row of one cell: config, status, checks, references, timings, versions."""
    row = {"cell_id": cell_id(cfg), **{k: cfg.get(k) for k in CONFIG_KEYS},  # --model catformer: its own keys
           **{k: v for k, v in cfg.items() if k not in CONFIG_KEYS and k != "out"}}
    if "model" in MODEL_COLUMN_KEYS:
        row["model"] = cfg.get("model", "reduced")  # a reduced row of a mixed spec says so (not NaN)
    row["status"] = "ok" if report is not None else "failed"
    row["error"] = "" if report is not None else error
    if report is not None:
        row["run_status"] = report["trajectory"]["status"]
        row["all_passed"] = report["all_passed"]
        for c in report["checks"]:
            row[f"{c['name']}_value"] = _scalar(c["value"])
            row[f"{c['name']}_passed"] = c["passed"]
            row[f"{c['name']}_status"] = c.get("status", "")
            row[f"{c['name']}_reason"] = c.get("reason", "")
            row[f"{c['name']}_applicable"] = c.get("applicable", True)
            row[f"{c['name']}_kind"] = c.get("kind", "exact")
        for k, v in report["references"].items():
            if isinstance(v, dict):
                row[k] = v.get("value")
                row[f"{k}_kind"] = v.get("kind", "exact")
                if v.get("kind") == "sampled":
                    row[f"{k}_se"] = v.get("se")
            else:
                row[k] = _scalar(v)
        row["final_loss"] = report["trajectory"]["final_loss"]
        row["final_loss_kind"] = report["trajectory"].get("final_loss_kind")
        row["final_loss_se"] = report["trajectory"].get("final_loss_se")
        row["t_eff"] = report["task"]["t_eff"]
        row["n_sequences"] = report["task"]["n_sequences"]
        if "loss_sweep" in report:
            row["loss_sweep_exponent"] = report["loss_sweep"]["fitted_exponent"]
            row["loss_sweep_exponent_stderr"] = report["loss_sweep"]["fitted_exponent_stderr"]
        for k, v in report.get("timing_seconds", {}).items():
            row[f"time_{k}_s"] = v
        versions = report["versions"]
    for k, v in (versions or {}).items():
        row[k if k in ("platform", "cpu_count") else f"version_{k}"] = v
    return row


def cached_report(cell_dir: str, cfg: dict) -> dict | None:
    """The cell's ``report.json`` if it is whole (JSON, the report's keys, the cell's config), else ``None``."""
    try:
        with open(os.path.join(cell_dir, "report.json"), encoding="utf-8") as fh:
            report = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or any(k not in report for k in REPORT_KEYS):
        return None
    conf = report["config"]
    if not isinstance(conf, dict):
        return None
    conf = {k: v for k, v in conf.items() if k != "out"}
    try:
        resolved = dict(settle(cfg))  # the report holds the resolved methods ("auto" -> exact/field/sampled)
    except (ValueError, CLIError):
        return None
    want = json.loads(json.dumps(resolved))
    return report if conf == want else None


def cached_row(cell_dir: str, cfg: dict) -> dict | None:
    """The results row of a cell already done, or ``None`` (run it): a ``report.json`` that is missing,
    not JSON, of another config, or damaged in a way that still parses (a field of the wrong type or
    missing, e.g. ``"checks": "x"``) counts as not done."""
    report = cached_report(cell_dir, cfg)
    if report is None:
        return None
    try:
        row = summary_row(cfg, report)
    except (TypeError, KeyError, ValueError, AttributeError, IndexError):
        return None
    if not isinstance(row.get("run_status"), str) or not isinstance(row.get("all_passed"), (bool, type(None))):
        return None
    try:  # the cell's time and host, as the first run's row had them (issue 32)
        with open(os.path.join(cell_dir, CELL_FACTS), encoding="utf-8") as fh:
            facts = json.load(fh)
        if isinstance(facts, dict):
            row.update({k: facts[k] for k in ("time_cell_s", "host") if k in facts})
    except (OSError, ValueError):
        pass
    return row


# ------------------------------------------------------------------ output
def _frame(rows: dict):
    """The results table: rows in cell order, fixed leading columns, then the rest by first appearance."""
    import pandas as pd

    ordered = [dict(rows[i], cell=i) for i in sorted(rows)]
    cols = list(FIRST_COLUMNS)
    for row in ordered:
        cols += [k for k in row if k not in cols]
    return pd.DataFrame(ordered, columns=cols)


def write_csv_atomic(path, df) -> None:
    """``df.to_csv(path)`` into a temp file beside ``path``, flushed and fsynced, then ``os.replace``."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            df.to_csv(fh, index=False)
            fh.flush()
            os.fsync(fh.fileno())
    try:  # make the rename durable too
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
