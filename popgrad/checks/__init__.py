"""Step 5 of the data flow: each prediction of the paper turned into a number (:class:`CheckResult`).

* :mod:`.results` -- :class:`CheckResult`, :func:`not_applicable`, power-law fits;
* :mod:`.theorems` -- the checks (graph recovery, gradient alignment, loss convergence, OOD, roots,
  head specialization), one function per check for every task kind, thresholds documented there;
* :mod:`.scale` -- checks at any ``T`` from the Stage-1 field (alignment rate, DPI in the field, roots);
* :mod:`.sampled` -- checks beyond enumeration from a fixed sample (``kind="sampled"``, with standard errors);
* :mod:`.catformer` -- checks of a trained full model (population attention, graph recovery, head
  specialization, induction head);
* :mod:`._kernels` -- numba kernels of the OOD check.
"""
from . import catformer
from .results import CheckResult, SweepFit, fit_power_law, not_applicable
from .sampled import check_loss_convergence_sampled, check_ood_sampled
from .scale import (
    alignment_rate_sweep,
    check_alignment_rate,
    check_field_dpi,
    check_roots_at_scale,
    default_alignment_T,
)
from .catformer import check_catformer_graph_recovery, check_catformer_head_specialization, check_induction_head
from .theorems import (
    alignment_sweep,
    check_gradient_alignment,
    check_graph_recovery,
    check_head_specialization,
    check_loss_convergence,
    check_loss_convergence_multi,
    check_ood,
    check_roots,
    check_roots_multi,
    gradient_agreement,
    loss_sweep,
    ood_transition,
    reference_losses,
    reference_losses_multi,
    sup_error_distribution,
)

__all__ = [
    "CheckResult", "SweepFit", "fit_power_law", "not_applicable",
    "check_graph_recovery", "check_gradient_alignment", "check_loss_convergence", "check_ood", "check_roots",
    "check_head_specialization", "reference_losses", "alignment_sweep", "loss_sweep", "gradient_agreement",
    "ood_transition", "sup_error_distribution",
    "check_alignment_rate", "alignment_rate_sweep", "check_field_dpi", "check_roots_at_scale", "default_alignment_T",
    "check_loss_convergence_sampled", "check_ood_sampled",
    "reference_losses_multi", "check_loss_convergence_multi", "check_roots_multi",
    "check_catformer_graph_recovery", "check_catformer_head_specialization", "check_induction_head",
]
