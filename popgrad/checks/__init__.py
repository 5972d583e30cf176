"""Step 5 of the data flow: each prediction of the paper turned into a number (:class:`CheckResult`).

* :mod:`.results` -- :class:`CheckResult` (status pass / fail / inconclusive / not_applicable), power-law fits;
* :mod:`.hypotheses` -- the Knowl 10 assumptions measured on a task, and which each check needs;
* :mod:`.stage2` -- Stage 2 to convergence by an exact 1-D minimization, and Knowl 1.2 over T;
* :mod:`.recovery`, :mod:`.alignment`, :mod:`.loss`, :mod:`.ood` -- the checks of the reduced models by
  family (graph recovery, head specialization, roots; gradient alignment; loss convergence; OOD), one
  function per check for every task kind, thresholds documented there (:mod:`.theorems` re-exports them);
* :mod:`.scale` -- checks at any ``T`` from the Stage-1 field (alignment rate, DPI in the field, roots);
* :mod:`.sampled` -- checks beyond enumeration from a fixed sample (``kind="sampled"``, with standard errors);
* :mod:`.sample_complexity` -- finite samples from the exact gradient noise: Stage-1 ``N_min`` (Gaussian
  limit, simulated), the linear-response spread of SGD around the exact run;
* :mod:`.linear_response` -- the full model's sampled SGD around its exact run: the linear-response
  prediction of the distance (exact Hessians, the soft-label gradient covariance);
* :mod:`.sampled_stage1` -- the finite-sample theorem's event: graph recovery after a sampled Stage 1
  (one fixed sample or fresh batches), its ``N_min`` over seeds and the fits of ``N_min(T_eff)``;
* :mod:`.catformer` -- checks of a trained full model (population attention, graph recovery, head
  specialization, induction head);
* :mod:`.model_checks` -- checks of any :class:`popgrad.Model` from its layer-1 attention (graph recovery);
* :mod:`._kernels` -- numba kernels of the OOD check.
"""
from . import catformer
from .hypotheses import GAMMA_MIN, NEEDS, Hypotheses, Hypothesis, measure_hypotheses, within_hypotheses
from .results import (ATTENTION_LIFT, RATE_EXPONENT, STATUSES, CheckResult, SweepFit, all_passed, attention_lift,
                      fit_power_law, inconclusive, not_applicable, rate_status)
from .stage2 import Stage2Optimum, converge_stage2, converged_loss_sweep
from .sampled import check_loss_convergence_sampled, check_ood_sampled
from .sample_complexity import check_sample_complexity, sample_complexity_sweep, sgd_spread
from .sampled_stage1 import population_stage1_recovery, recovery_n_min, sampled_stage1_recovery
from .scale import (
    alignment_rate_sweep,
    check_alignment_rate,
    check_field_dpi,
    check_roots_at_scale,
    default_alignment_T,
    default_roots_T,
    root_drive_ratio,
)
from .linear_response import CatFormerLinearResponse, catformer_linear_response
from .catformer import check_catformer_graph_recovery, check_catformer_head_specialization, check_induction_head
from .model_checks import (check_model_graph_recovery, check_model_head_specialization, check_model_induction_head,
                           model_population_attention)
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
    ood_verdict,
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
    "check_sample_complexity", "sample_complexity_sweep", "sgd_spread",
    "sampled_stage1_recovery", "population_stage1_recovery", "recovery_n_min",
    "STATUSES", "RATE_EXPONENT", "ATTENTION_LIFT", "attention_lift",
    "all_passed", "inconclusive", "rate_status", "ood_verdict",
    "GAMMA_MIN", "NEEDS", "Hypothesis", "Hypotheses", "measure_hypotheses", "within_hypotheses",
    "Stage2Optimum", "converge_stage2", "converged_loss_sweep", "default_roots_T", "root_drive_ratio",
    "check_catformer_graph_recovery", "check_catformer_head_specialization", "check_induction_head",
    "CatFormerLinearResponse", "catformer_linear_response",
    "check_model_graph_recovery", "check_model_head_specialization", "check_model_induction_head",
    "model_population_attention",
]
