"""What every check returns: :class:`CheckResult`, and the power-law fits of the sweeps."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["CheckResult", "SweepFit", "fit_power_law", "not_applicable"]


class CheckResult(NamedTuple):
    """One theorem check.

    Attributes
    ----------
    name : str
        Short identifier (``graph_recovery``, ...).
    value : float
        The measured quantity.
    threshold : float
        What ``value`` is compared against.
    passed : bool
    comparison : str
        ``">="`` or ``"<="``: the direction of the comparison.
    statement : str
        The paper statement checked, in one line.
    details : dict
        Supporting numbers (JSON-serialisable).
    applicable : bool, default True
        ``False`` when the check does not apply to the task (e.g. the
        idealized-gradient check for a multi-parent task): ``value`` and
        ``threshold`` are NaN, ``passed`` is ``False`` and reports show "n/a"
        and leave it out of ``all_passed`` (:func:`not_applicable`).
    kind : {"exact", "sampled"}, default "exact"
        Whether ``value`` is exact (for the task's finite prior) or an estimate
        from a sample (then the details hold its standard error and ``n``).
    """

    name: str
    value: float
    threshold: float
    passed: bool
    comparison: str
    statement: str
    details: dict
    applicable: bool = True
    kind: str = "exact"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "value": _jsonable(self.value),
            "threshold": _jsonable(self.threshold),
            "passed": bool(self.passed),
            "comparison": self.comparison,
            "statement": self.statement,
            "details": _jsonable(self.details),
            "applicable": bool(self.applicable),
            "kind": self.kind,
        }


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _result(name, value, threshold, comparison, statement, details) -> CheckResult:
    if comparison == ">=":
        passed = bool(value >= threshold)
    else:
        passed = bool(value <= threshold)
    return CheckResult(name, float(value), float(threshold), passed, comparison, statement, details)


# ===================================================== multi-parent tasks (issue 7)
def not_applicable(name: str, statement: str, reason: str) -> CheckResult:
    """A check that does not apply to the task: NaN value, ``applicable=False``, the reason in the details."""
    nan = float("nan")
    return CheckResult(name, nan, nan, False, "n/a", statement, {"reason": reason}, applicable=False)


# ----------------------------------------------------------- 2. alignment
class SweepFit(NamedTuple):
    """Least-squares fit ``log y = a + b log x``.

    Attributes
    ----------
    x, y : ndarray
        The data (``x`` = ``T_eff``).
    exponent : float
        ``b``.
    stderr : float
        Standard error of ``b`` (NaN with fewer than three points).
    intercept : float
        ``a``.
    """

    x: np.ndarray
    y: np.ndarray
    exponent: float
    stderr: float
    intercept: float


def fit_power_law(x, y) -> SweepFit:
    """Fit ``y ∝ x^b`` by least squares on logs (points with ``y <= 0`` dropped)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    keep = (x > 0) & (y > 0) & np.isfinite(y)
    lx, ly = np.log(x[keep]), np.log(y[keep])
    n = lx.size
    if n < 2:
        return SweepFit(x, y, float("nan"), float("nan"), float("nan"))
    X = np.column_stack([np.ones(n), lx])
    coef, *_ = np.linalg.lstsq(X, ly, rcond=None)
    if n > 2:
        resid = ly - X @ coef
        s2 = resid @ resid / (n - 2)
        cov = s2 * np.linalg.inv(X.T @ X)
        se = float(np.sqrt(cov[1, 1]))
    else:
        se = float("nan")
    return SweepFit(x, y, float(coef[1]), se, float(coef[0]))
