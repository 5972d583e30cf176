"""What every check returns: :class:`CheckResult`, and the power-law fits of the sweeps."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["ATTENTION_LIFT", "attention_lift", "CheckResult", "STATEMENT_LABELS", "statement_label", "outcome", "RATE_EXPONENT", "STATUSES", "rate_status", "SweepFit", "all_passed", "fit_power_law", "inconclusive", "not_applicable"]


#: The four verdicts of a check (DESIGN §15).
STATUSES = ("pass", "fail", "inconclusive", "not_applicable")

#: Each check's statement, named as a reader of the paper knows it, then its label in popgrad's summary of the
#: paper ("Knowl N"; the map to the paper's own numbers: docs/guide/paper_statements.md). Reports, ``str`` of a
#: check and the docs name the statement first: "graph recovery in the first layer (Knowl 1.1)".
STATEMENT_LABELS = {
    "graph_recovery": "graph recovery in the first layer (Knowl 1.1)",
    "catformer_graph_recovery": "graph recovery by the full model's first layer (Knowl 1.1, the experiments)",
    "model_graph_recovery": "graph recovery by a trained model's first layer (Knowl 1.1, the experiments)",
    "head_specialization": "one head per parent, multi-parent graphs (Knowl 9)",
    "gradient_alignment": "attention gradients compute the χ² mutual information (Knowl 3)",
    "alignment_rate": "attention gradients compute the χ² mutual information (Knowl 3)",
    "field_dpi": "the parent maximizes the gradient, by the data-processing inequality (Knowl 3.2)",
    "loss_convergence": "population loss convergence (Knowl 1.2)",
    "ood_generalization": "out-of-distribution generalization (Knowl 4)",
    "roots_uniform": "in-context roots stay near uniform (Knowl 3.3)",
    "roots_at_scale": "in-context roots stay near uniform (Knowl 3.3)",
    "sample_complexity": "graph recovery from finitely many samples (the finite-sample analysis)",
    "induction_head": "the second layer is an induction head (Knowl 8's construction)",
}

#: The comparison each ``comparison`` negates when its rule is not met, and how reports print both.
_NEGATION = {">=": "<", "<=": ">", ">": "<=", "<": ">="}
_SYMBOL = {">=": "≥", "<=": "≤", ">": ">", "<": "<"}


def statement_label(name: str) -> str:
    """The statement a check tests, named first (``"population loss convergence (Knowl 1.2)"``); the check's
    name itself when popgrad has no label for it."""
    return STATEMENT_LABELS.get(str(name), str(name))


def _num(x) -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f"{x:.4g}" if math.isfinite(x) else "n/a"


def outcome(value, comparison: str, threshold) -> str:
    """What a check measured against its rule, as the outcome: ``"0.9751 ≥ 0.9: met"``,
    ``"-0.3049 > -0.4: not met"`` (the relation that holds, never the rule when it fails); ``"n/a"``
    without a value or a rule. 4 significant digits."""
    try:
        v, t = float(value), float(threshold)
    except (TypeError, ValueError):
        return "n/a"
    if comparison not in _NEGATION or not (math.isfinite(v) and math.isfinite(t)):
        return "n/a" if not (isinstance(v, float) and math.isfinite(v)) else _num(v)
    met = {">=": v >= t, "<=": v <= t, ">": v > t, "<": v < t}[comparison]
    shown = comparison if met else _NEGATION[comparison]
    return f"{_num(v)} {_SYMBOL[shown]} {_num(t)}: {'met' if met else 'not met'}"


class _CheckFields(NamedTuple):
    name: str
    value: float
    threshold: float
    passed: object
    comparison: str
    statement: str
    details: dict
    applicable: bool = True
    kind: str = "exact"
    status: str = "pass"
    reason: str = ""


class CheckResult(_CheckFields):
    """One theorem check and its verdict (DESIGN §15).

    Attributes
    ----------
    name : str
        Short identifier (``graph_recovery``, ...).
    value : float
        The measured quantity (shown for every status; NaN when nothing was measured).
    threshold : float
        What ``value`` is compared against, taken from the statement.
    passed : bool or None
        ``True`` / ``False`` for ``status`` ``"pass"`` / ``"fail"``; ``None`` (JSON null) otherwise.
    comparison : str
        ``">="``, ``"<="``, ``">"`` or ``"n/a"``: the direction of the comparison.
    statement : str
        The paper statement checked, in one line.
    details : dict
        Supporting numbers (JSON-serialisable).
    applicable : bool
        Derived from ``status``: ``False`` exactly for ``"not_applicable"``.
    kind : {"exact", "sampled"}, default "exact"
        Whether ``value`` is exact (for the task's finite prior) or an estimate
        from a sample (then the details hold its standard error and ``n``).
    status : {"pass", "fail", "inconclusive", "not_applicable"}
        The verdict. When not given it is derived from ``passed`` and ``applicable``
        (the pre-status constructor): ``"pass"`` / ``"fail"``, or ``"not_applicable"``.
    reason : str
        Why the verdict is ``"inconclusive"`` or ``"not_applicable"`` (one line,
        e.g. "uniform mean fails (error 0.035); Knowl 3.3 assumes it"); empty otherwise.
    """

    __slots__ = ()

    def __new__(cls, name, value, threshold, passed, comparison, statement, details, applicable=True,
                kind="exact", status=None, reason=""):
        if status is None:
            status = ("pass" if passed else "fail") if applicable else "not_applicable"
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        if status == "not_applicable" and not reason:
            reason = str((details or {}).get("reason", ""))
        if status in ("inconclusive", "not_applicable") and not reason:
            raise ValueError(f"a {status} check needs a reason")
        decided = status in ("pass", "fail")
        return super().__new__(cls, name, value, threshold, (status == "pass") if decided else None, comparison,
                               statement, details, status != "not_applicable", kind, status,
                               "" if decided else str(reason))

    def _replace(self, **changes) -> "CheckResult":
        """A copy with ``changes``; the status is derived again when ``passed`` changes without it."""
        d = self._asdict()
        if ("passed" in changes or "applicable" in changes) and "status" not in changes:
            d["status"] = None
            d["reason"] = changes.get("reason", "")
        d.update(changes)
        return CheckResult(**d)

    @property
    def label(self) -> str:
        """The statement this check tests, named first: ``"population loss convergence (Knowl 1.2)"``."""
        return statement_label(self.name)

    @property
    def outcome(self) -> str:
        """The measured value against the rule, as it came out: ``"-0.3049 > -0.4: not met"`` (see
        :func:`outcome`)."""
        return outcome(self.value, self.comparison, self.threshold)

    def __str__(self) -> str:
        """One paragraph: the verdict, the statement, the outcome and the reason."""
        tag = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "not_applicable": "N/A"}[self.status]
        head = f"{tag} {self.name}: {self.label}"
        lines = [head, f"  outcome: {self.outcome}" + (" (sampled)" if self.kind == "sampled" else "")]
        if self.reason:
            lines.append(f"  reason: {self.reason}")
        lines.append(f"  statement: {self.statement}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        """Short: name, status, value, rule (``CheckResult(name='graph_recovery', status='pass', value=0.9751,
        rule='>= 0.9', kind='exact')``); the details are in ``.details``."""
        rule = "n/a" if self.comparison not in _SYMBOL else f"{self.comparison} {_num(self.threshold)}"
        extra = f", reason={self.reason!r}" if self.reason else ""
        return (f"CheckResult(name={self.name!r}, status={self.status!r}, value={_num(self.value)}, "
                f"rule={rule!r}, kind={self.kind!r}{extra})")

    @property
    def decided(self) -> bool:
        """Whether the check gave a verdict (``"pass"`` or ``"fail"``)."""
        return self.status in ("pass", "fail")

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "value": _jsonable(self.value),
            "threshold": _jsonable(self.threshold),
            "status": self.status,
            "reason": self.reason,
            "passed": None if self.passed is None else bool(self.passed),
            "comparison": self.comparison,
            "statement": self.statement,
            "details": _jsonable(self.details),
            "applicable": bool(self.applicable),
            "kind": self.kind,
        }


def all_passed(checks):
    """Whether every decided check passed (pass and fail count; inconclusive and not applicable do not);
    ``None`` (JSON null) when no check was decided: nothing passed."""
    decided = [c for c in checks if c.status in ("pass", "fail")]
    if not decided:
        return None
    return bool(all(c.status == "pass" for c in decided))


#: The attention statements' margin over uniform attention (graph recovery of the full model, head
#: specialization, induction head, roots): the attention on the target at least halfway from uniform to the
#: construction of Knowl 8 (weight -> 1 on it), i.e. a lift ``(a - u) / (1 - u) >= 1/2``.
ATTENTION_LIFT = 0.5


def attention_lift(a, u, top=1.0):
    """``(a − u) / (top − u)``: how far attention ``a`` went from its uniform value ``u`` to the construction's
    ``top`` (0 at uniform attention, 1 at the construction; elementwise)."""
    a, u = np.asarray(a, dtype=np.float64), np.asarray(u, dtype=np.float64)
    return (a - u) / (top - u)


#: The rate checks pass when the local exponent over the top of the sweep is at most this (theory -1/2).
RATE_EXPONENT = -0.4


def rate_status(exponent: float, decreasing: bool, where: str = "", theory: float = -0.5) -> tuple:
    """``(status, reason)`` of a rate statement ``y = O(T_eff^theory)`` (DESIGN §15).

    ``"pass"`` when ``y`` decreases and its local exponent is ``≤ RATE_EXPONENT``; ``"inconclusive"``
    ("pre-asymptotic") when it decreases more slowly; ``"fail"`` when it does not decrease.
    """
    where = f" {where}" if where else ""
    if not np.isfinite(exponent):
        return "inconclusive", f"the exponent could not be fitted{where}"
    if not decreasing or exponent >= 0:
        return "fail", ""
    if exponent <= RATE_EXPONENT:
        return "pass", ""
    return "inconclusive", (f"pre-asymptotic: local exponent {exponent:.3f}{where} (theory {theory:g}; "
                            f"passes at <= {RATE_EXPONENT:g})")


def inconclusive(result: CheckResult, reason: str) -> CheckResult:
    """``result`` with status ``"inconclusive"`` and ``reason`` (its value, threshold and details kept)."""
    return result._replace(status="inconclusive", reason=reason, passed=None)


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


def _result(name, value, threshold, comparison, statement, details, kind="exact") -> CheckResult:
    if comparison == ">=":
        passed = bool(value >= threshold)
    elif comparison == ">":
        passed = bool(value > threshold)
    else:
        passed = bool(value <= threshold)
    return CheckResult(name, float(value), float(threshold), passed, comparison, statement, details, kind=kind)


# ===================================================== multi-parent tasks (issue 7)
def not_applicable(name: str, statement: str, reason: str) -> CheckResult:
    """A check with nothing to test on the task: status ``"not_applicable"``, NaN value, the reason in
    ``reason`` and in the details."""
    nan = float("nan")
    return CheckResult(name, nan, nan, None, "n/a", statement, {"reason": reason}, status="not_applicable",
                       reason=reason)


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
