"""The paper's assumptions ("Knowl 10") as hypotheses of each check (DESIGN §15).

A theorem is a statement under hypotheses. :func:`measure_hypotheses` measures
every Knowl 10 assumption that popgrad can measure on a task, each as a
:class:`Hypothesis` (met or not, the measured figure, the requirement). Every
check declares which of them its statement needs (:data:`NEEDS`);
:func:`within_hypotheses` turns a pass or fail into ``"inconclusive"`` when one
of them fails, naming it with its measured figure.

The assumptions, with one constant ``γ`` as in the paper (popgrad takes
``γ = GAMMA_MIN = 0.1``: the theorems' constants are polynomial in ``1/γ``, so
a smaller ``γ`` puts every finite ``T`` out of their reach):

* ``gamma`` (Knowl 10.1): ``min π ≥ γ/S`` over every atom and entry;
* ``nondegenerate`` (Knowl 10.2): ``min_k Σ_a ‖π_k(·|a) - μ_k‖² ≥ γ²/S``;
* ``symmetric`` (Knowl 10.3): the prior is closed under relabeling the tokens;
* ``uniform_mean`` (Knowl 10.3): ``E[π] = 11ᵀ/S`` to rounding (``max |E π - 1/S| ≤ 1e-12``);
* ``root_fraction`` (Knowl 10.4): ``|roots| / T ≤ 1 - γ`` (the query counted as a root).

The ``T_eff`` regime (Knowl 10.5, ``T_eff ≥ poly(1/γ, S)``) has no explicit
constant; each check says what it needs of it (e.g. the alignment check reads
its local exponent over the top of its sweep).
"""
from __future__ import annotations

from typing import NamedTuple

from ..task.tasks import MultiParentTask
from .results import CheckResult, inconclusive

__all__ = ["GAMMA_MIN", "UNIFORM_MEAN_TOL", "Hypothesis", "Hypotheses", "NEEDS", "measure_hypotheses",
           "within_hypotheses"]

#: The ``γ`` of Knowl 10 that popgrad's verdicts require.
GAMMA_MIN = 0.1
#: "Uniform mean to rounding".
UNIFORM_MEAN_TOL = 1e-12

#: Which Knowl 10 assumptions each check's statement needs.
NEEDS = {
    "graph_recovery": ("gamma", "nondegenerate", "symmetric", "uniform_mean", "root_fraction"),  # Knowl 1.1
    "head_specialization": ("symmetric", "uniform_mean"),  # Knowl 9 (its k-parent prior: symmetry, mean)
    "gradient_alignment": ("gamma", "nondegenerate"),  # Knowl 3.1-3.2: the constant of O(T_eff^-1/2)
    "alignment_rate": ("gamma", "nondegenerate"),
    "field_dpi": ("gamma",),  # a strict DPI needs every transition possible
    "loss_convergence": ("gamma", "nondegenerate", "symmetric", "uniform_mean", "root_fraction"),  # Knowl 1.2
    "ood_generalization": ("gamma", "nondegenerate", "symmetric", "uniform_mean", "root_fraction"),  # Knowl 4
    "roots_uniform": ("symmetric", "uniform_mean"),  # Knowl 3.3
    "roots_at_scale": ("symmetric", "uniform_mean"),
    "sample_complexity": ("gamma", "nondegenerate"),  # the Stage-1 signal of Knowl 3 at finite N
}

#: The statement each check tests (named in its inconclusive reasons).
STATEMENT_OF = {"graph_recovery": "Knowl 1.1", "head_specialization": "Knowl 9", "gradient_alignment": "Knowl 3",
                "alignment_rate": "Knowl 3", "field_dpi": "the DPI (Knowl 3.2)", "loss_convergence": "Knowl 1.2",
                "ood_generalization": "Knowl 4", "roots_uniform": "Knowl 3.3", "roots_at_scale": "Knowl 3.3",
                "sample_complexity": "the finite-sample Stage 1 (Knowl 3 at N samples)"}

_KNOWL = {"gamma": "Knowl 10.1", "nondegenerate": "Knowl 10.2", "symmetric": "Knowl 10.3",
          "uniform_mean": "Knowl 10.3", "root_fraction": "Knowl 10.4"}


class Hypothesis(NamedTuple):
    """One Knowl 10 assumption measured on a task.

    Attributes
    ----------
    name : str
        ``gamma``, ``nondegenerate``, ``symmetric``, ``uniform_mean`` or ``root_fraction``.
    met : bool or None
        Whether it holds (``None``: not measured, e.g. symmetry for ``S > 7``).
    value : float
        The measured figure (γ; the non-degeneracy sum; 1/0 for symmetry; the mean's error; the root fraction).
    requirement : str
        What it must satisfy, e.g. ``">= 0.1"``.
    knowl : str
        Where the paper states it.
    """

    name: str
    met: object
    value: float
    requirement: str
    knowl: str

    def describe(self) -> str:
        """One phrase, e.g. ``"uniform mean fails (error 0.035, needs <= 1e-12)"``."""
        what = {"gamma": "gamma", "nondegenerate": "non-degeneracy", "symmetric": "relabeling symmetry",
                "uniform_mean": "uniform mean", "root_fraction": "root fraction"}[self.name]
        fig = {"uniform_mean": "error"}.get(self.name, "measured")
        verdict = "holds" if self.met else ("not measured" if self.met is None else "fails")
        if self.name == "symmetric":
            return f"{what} {verdict}"
        return f"{what} {verdict} ({fig} {self.value:.3g}, needs {self.requirement})"


class Hypotheses(NamedTuple):
    """Every measured Knowl 10 assumption of a task (:func:`measure_hypotheses`).

    Attributes
    ----------
    items : dict
        ``name -> Hypothesis``.
    gamma_min : float
        The ``γ`` the requirements use.
    """

    items: dict
    gamma_min: float

    def failed(self, names) -> list:
        """The :class:`Hypothesis` of ``names`` that fail (``met is False``), in order."""
        return [self.items[n] for n in names if n in self.items and self.items[n].met is False]

    @property
    def all_met(self) -> bool:
        return all(h.met for h in self.items.values())

    def to_dict(self) -> dict:
        return {n: {"met": h.met, "value": float(h.value), "requirement": h.requirement, "knowl": h.knowl}
                for n, h in self.items.items()}


def measure_hypotheses(task, gamma_min: float = GAMMA_MIN) -> Hypotheses:
    """Measure the Knowl 10 assumptions of ``task`` (module docstring); any task kind.

    Parameters
    ----------
    task : popgrad.Task or popgrad.MultiParentTask
    gamma_min : float, default GAMMA_MIN
        The ``γ`` of the requirements.

    Returns
    -------
    Hypotheses
    """
    from .._validation import as_real

    gamma_min = as_real(gamma_min, "gamma_min", minimum=0, strict=True)
    S = task.S
    dg = task.prior.diagnostics()
    rf = float(task.graph.root_fraction)
    need = f">= {gamma_min:g}"
    if getattr(task.prior, "continuous", False):  # Dirichlet rows reach π(b|a) = 0: no γ > 0 (DESIGN §20)
        need += f" (the continuous prior {task.prior!r} has no gamma > 0)"
    items = {"gamma": Hypothesis("gamma", bool(dg.gamma >= gamma_min), float(dg.gamma), need, _KNOWL["gamma"])}
    if not isinstance(task, MultiParentTask):
        items["nondegenerate"] = Hypothesis(
            "nondegenerate", bool(dg.nondegeneracy >= gamma_min**2 / S), float(dg.nondegeneracy),
            f">= gamma^2/S = {gamma_min**2 / S:.3g}", _KNOWL["nondegenerate"])
    sym = dg.symmetric
    items["symmetric"] = Hypothesis("symmetric", None if sym is None else bool(sym),
                                    float("nan") if sym is None else float(bool(sym)), "closed", _KNOWL["symmetric"])
    items["uniform_mean"] = Hypothesis("uniform_mean", bool(dg.uniform_mean_error <= UNIFORM_MEAN_TOL),
                                       float(dg.uniform_mean_error), f"<= {UNIFORM_MEAN_TOL:g}",
                                       _KNOWL["uniform_mean"])
    items["root_fraction"] = Hypothesis("root_fraction", bool(rf <= 1.0 - gamma_min), rf,
                                        f"<= 1 - gamma = {1 - gamma_min:g}", _KNOWL["root_fraction"])
    return Hypotheses(items, float(gamma_min))


#: The assumptions a Dirichlet prior meets with ``floor`` and ``uniform_mean`` (the defaults of ``popgrad run``,
#: not of :func:`popgrad.dirichlet_prior`); an inconclusive reason that names one of them says how.
PRIOR_FIXABLE = ("gamma", "uniform_mean")
PRIOR_HINT = (" (single-parent tasks: dirichlet_prior(..., floor=0.15, uniform_mean=True), the default prior "
              "of popgrad run, meets them)")


def within_hypotheses(result: CheckResult, hypotheses: Hypotheses | None, needs=None) -> CheckResult:
    """``result``, made ``"inconclusive"`` when an assumption it needs fails on the task.

    A decided result (pass or fail) becomes inconclusive; an inconclusive one gets the failed assumptions
    added to its reason. The value, threshold and details stay, the details
    gain ``hypotheses`` (what it needs and whether each holds). ``needs`` defaults to
    :data:`NEEDS` of the check's name.
    """
    if hypotheses is None or not result.applicable:
        return result
    needs = NEEDS.get(result.name, ()) if needs is None else tuple(needs)
    details = dict(result.details)
    details["hypotheses"] = {n: hypotheses.items[n].met for n in needs if n in hypotheses.items}
    result = result._replace(details=details)
    bad = hypotheses.failed(needs)
    if not bad:
        return result
    names = " and ".join(sorted({h.knowl for h in bad}))
    what = "; ".join(h.describe() for h in bad)
    reason = f"{what}; {STATEMENT_OF.get(result.name, 'the statement')} assumes {names}"
    if {h.name for h in bad} & set(PRIOR_FIXABLE):  # where the API's default prior and the CLI's differ
        reason += PRIOR_HINT
    if result.status == "inconclusive":  # already undecided (e.g. pre-asymptotic): say both
        return result._replace(reason=f"{result.reason}; also {reason}")
    return inconclusive(result, reason)
