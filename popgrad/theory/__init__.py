"""Step 3' of the data flow: quantities polynomial in T, no enumeration of S**T (DESIGN §5–§7).

* :mod:`.information` -- the idealized gradient ``g`` and the paper's assumptions measured on a task
  (re-exports the two modules below);
* :mod:`.chain` -- χ² mutual information, ``σ₂``, contraction coefficients of one transition matrix;
* :mod:`.joints` -- pairwise joints of two positions and the LCA distances, from the graph;
* :mod:`.dpi` -- data-processing-inequality gaps and the readings of the paper's bound.

Nothing here imports :mod:`popgrad.engine`. The reference losses (L*, Bayes, count estimator,
construction) enumerate, so they live in :mod:`popgrad.engine.baselines`; their old names here
(``popgrad.theory.bayes_loss``, ``popgrad.theory.baselines``) still resolve, with a
``DeprecationWarning``, for one release.
"""
from .._compat import moved_attribute
from .dpi import DpiReport, bound_readings, dpi_report, dpi_report_pi
from .information import (
    Assumptions,
    ChainInformation,
    assumptions,
    chain_information,
    has_idealized_gradient,
    idealized_grad_A1,
    idealized_gradient,
    idealized_gradient_single,
    pairwise_joint,
)

__all__ = [
    "DpiReport", "bound_readings", "dpi_report", "dpi_report_pi", "Assumptions", "ChainInformation",
    "assumptions", "chain_information", "has_idealized_gradient", "idealized_grad_A1", "idealized_gradient", "idealized_gradient_single",
    "pairwise_joint",
]

#: Names that moved to :mod:`popgrad.engine.baselines` (resolved on access, with a warning).
_MOVED_TO_ENGINE = frozenset({
    "optimal_loss", "bayes_loss", "count_estimator_predict", "count_estimator_loss", "construction_params",
    "construction_loss", "optimal_loss_multi", "bayes_loss_multi", "count_estimator_loss_multi",
    "construction_loss_multi", "count_estimator_predict_multi",
})


def __getattr__(name):
    if name in _MOVED_TO_ENGINE:
        return moved_attribute(__name__, name, "popgrad.engine.baselines")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
