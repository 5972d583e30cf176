"""Theorem checks of the reduced models, by family (DESIGN §15); this module keeps the old import path.

The checks live in one module per family:

* :mod:`.recovery` -- :func:`check_graph_recovery` (Knowl 1.1), :func:`check_head_specialization`
  (Knowl 9), :func:`check_roots` (Knowl 3.3);
* :mod:`.alignment` -- :func:`check_gradient_alignment` (Knowl 3), :func:`alignment_sweep`;
* :mod:`.loss` -- :func:`check_loss_convergence` (Knowl 1.2), :func:`reference_losses`, :func:`loss_sweep`;
* :mod:`.ood` -- :func:`check_ood` (Knowl 4), :func:`sup_error_distribution`, :func:`ood_transition`.

Every name that ``popgrad.checks.theorems`` exported is importable from here, and the deprecated
``*_multi`` aliases (one release) live here.
"""
from __future__ import annotations

import warnings

from ._common import _as_A1, _as_A2, _check_task, _hypotheses  # noqa: F401  (old private import path)
from .alignment import alignment_sweep, check_gradient_alignment, gradient_agreement
from .loss import (STAGE2_GRAD_RTOL, STAGE2_RTOL, _stage2_verdict, check_loss_convergence,  # noqa: F401
                   loss_sweep, reference_losses, stage2_convergence)
from .ood import (SHRINK_RTOL, _weighted_quantile, check_ood, ood_transition,  # noqa: F401
                  ood_verdict, sup_error_distribution)
from .recovery import _roots_multi, check_graph_recovery, check_head_specialization, check_roots  # noqa: F401
from .results import CheckResult, SweepFit, fit_power_law, not_applicable

__all__ = [
    "CheckResult",
    "SweepFit",
    "check_graph_recovery",
    "check_gradient_alignment",
    "check_loss_convergence",
    "check_ood",
    "check_roots",
    "alignment_sweep",
    "loss_sweep",
    "fit_power_law",
    "ood_transition",
    "not_applicable",
    "check_head_specialization",
    "reference_losses",
]
#: Deprecated (one release), importable but not in ``__all__``: ``reference_losses_multi``,
#: ``check_loss_convergence_multi``, ``check_roots_multi``.


# ------------------------------------------------------- deprecated aliases (one release)
def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"popgrad.checks.{old} is deprecated and will be removed in popgrad 0.3: use "
                  f"popgrad.checks.{new} (it serves every task kind)", DeprecationWarning, stacklevel=3)


def reference_losses_multi(task, eps=None) -> dict:
    """Deprecated alias of :func:`reference_losses`."""
    _deprecated("reference_losses_multi", "reference_losses")
    return reference_losses(task, eps)


def check_loss_convergence_multi(task, A1, A2, beta0: float, eps=None, references=None,
                                 init_seed: int = 0, init_scale: float = 0.0) -> CheckResult:
    """Deprecated alias of :func:`check_loss_convergence`."""
    _deprecated("check_loss_convergence_multi", "check_loss_convergence")
    return check_loss_convergence(task, A1, A2, beta0, eps, references, init_seed, init_scale)


def check_roots_multi(task, A1, tol: float = 0.1) -> CheckResult:
    """Deprecated alias of :func:`check_roots`."""
    _deprecated("check_roots_multi", "check_roots")
    return check_roots(task, A1, tol)
