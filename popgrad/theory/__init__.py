"""Step 3' of the data flow: quantities polynomial in T, no enumeration of S**T (DESIGN §5–§7).

* :mod:`.information` -- pairwise joints, χ² mutual information, the idealized gradient ``g``,
  contraction coefficients, the paper's assumptions measured on a task;
* :mod:`.dpi` -- data-processing-inequality gaps and the readings of the paper's bound;
* :mod:`.baselines` -- reference losses (L*, Bayes, count estimator, construction) for every task kind.
"""
from .baselines import (
    bayes_loss,
    bayes_loss_multi,
    construction_loss,
    construction_loss_multi,
    construction_params,
    count_estimator_loss,
    count_estimator_loss_multi,
    count_estimator_predict,
    optimal_loss,
    optimal_loss_multi,
)
from .dpi import DpiReport, bound_readings, dpi_report, dpi_report_pi
from .information import (
    Assumptions,
    ChainInformation,
    assumptions,
    chain_information,
    idealized_grad_A1,
    idealized_gradient,
    idealized_gradient_single,
    pairwise_joint,
)

__all__ = [
    "optimal_loss", "bayes_loss", "count_estimator_predict", "count_estimator_loss", "construction_params",
    "construction_loss", "optimal_loss_multi", "bayes_loss_multi", "count_estimator_loss_multi",
    "construction_loss_multi", "DpiReport", "bound_readings", "dpi_report", "dpi_report_pi", "Assumptions",
    "ChainInformation", "assumptions", "chain_information", "idealized_grad_A1", "idealized_gradient",
    "idealized_gradient_single", "pairwise_joint",
]
