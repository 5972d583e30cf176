"""popgrad: exact population gradients for "How Transformers Learn Causal
Structure with Gradient Descent" (Nichani, Damian & Lee, ICML 2024).

Data flow, one module per step::

    graphs, priors -> task (exact sequence weights) -> model -> exact
    (population loss/gradient) -> dynamics -> checks -> report / plots

See ``DESIGN.md`` for the conventions (0-based positions, query last,
``pi[a, b] = π(b | a)``) and every formula.
"""
from .graphs import CausalGraph, Tree, chain, icl_pairs, random_tree
from .priors import (
    FinitePrior,
    PriorDiagnostics,
    dirichlet_prior,
    relabel,
    relabel_closure,
    stationary_distribution,
)
from .task import DEFAULT_MAX_SEQUENCES, Sample, Task, TaskTooLargeError
from .model import predict
from .exact import (
    LossAndGrad,
    bayes_loss,
    construction_loss,
    count_estimator_loss,
    exact_loss,
    exact_loss_and_grad,
    optimal_loss,
    sampled_loss_and_grad,
    symmetry_applies,
)
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
from .dpi import DpiReport, bound_readings, dpi_report, dpi_report_pi
from .dynamics import TrainConfig, Trajectory, train_two_stage
from .multiparent import (
    MultiParentGraph,
    MultiParentTask,
    TensorPrior,
    dirichlet_tensor_prior,
    ngram,
    random_multi_parent,
    two_parent,
)
from .multihead import (
    MultiLossAndGrad,
    bayes_loss_multi,
    construction_loss_multi,
    count_estimator_loss_multi,
    exact_loss_and_grad_multi,
    exact_loss_multi,
    optimal_loss_multi,
    predict_multi,
)
from .multidynamics import MultiHeadTrainConfig, train_multi_head
from . import checks

__version__ = "0.1.0"

__all__ = [
    "CausalGraph",
    "Tree",
    "chain",
    "icl_pairs",
    "random_tree",
    "FinitePrior",
    "PriorDiagnostics",
    "dirichlet_prior",
    "relabel",
    "relabel_closure",
    "stationary_distribution",
    "Task",
    "Sample",
    "TaskTooLargeError",
    "DEFAULT_MAX_SEQUENCES",
    "predict",
    "LossAndGrad",
    "exact_loss_and_grad",
    "exact_loss",
    "optimal_loss",
    "bayes_loss",
    "count_estimator_loss",
    "construction_loss",
    "sampled_loss_and_grad",
    "symmetry_applies",
    "idealized_gradient",
    "idealized_gradient_single",
    "idealized_grad_A1",
    "pairwise_joint",
    "chain_information",
    "ChainInformation",
    "assumptions",
    "Assumptions",
    "dpi_report",
    "dpi_report_pi",
    "DpiReport",
    "bound_readings",
    "TrainConfig",
    "Trajectory",
    "train_two_stage",
    "MultiParentGraph",
    "MultiParentTask",
    "TensorPrior",
    "dirichlet_tensor_prior",
    "ngram",
    "two_parent",
    "random_multi_parent",
    "MultiLossAndGrad",
    "predict_multi",
    "exact_loss_and_grad_multi",
    "exact_loss_multi",
    "optimal_loss_multi",
    "bayes_loss_multi",
    "count_estimator_loss_multi",
    "construction_loss_multi",
    "MultiHeadTrainConfig",
    "train_multi_head",
    "checks",
]
