"""popgrad: exact population gradients for "How Transformers Learn Causal
Structure with Gradient Descent" (Nichani, Damian & Lee, ICML 2024).

Data flow, one subpackage per step::

    task (graphs, priors, exact sequence weights) -> model (NumPy forward passes)
      -> engine (exact population loss/gradient, reference losses)  |  theory (polynomial in T: g, χ², DPI)
      -> train (Algorithm 1) -> checks (CheckResult) -> app (cli, jobs, report, plots)

See ``docs/DESIGN.md`` for the conventions (0-based positions, query last,
``pi[a, b] = π(b | a)``) and every formula. Old module paths
(``popgrad.exact``, ``popgrad.multihead``, ...) still import, with a
``DeprecationWarning``, for one release (:mod:`popgrad._compat`).
"""
__version__ = "0.2.0"

from ._signals import install_import_guard as _guard

_guard()  # acts only in the `popgrad` command itself (a Ctrl-C during its imports: one line); a no-op for a library
del _guard

from .task import (
    DEFAULT_MAX_SEQUENCES,
    CausalGraph,
    DirichletPrior,
    DirichletTensorPrior,
    official_random_tree,
    official_dags,
    FinitePrior,
    MultiParentGraph,
    MultiParentTask,
    PriorDiagnostics,
    Sample,
    Task,
    TaskTooLargeError,
    TensorPrior,
    Tree,
    chain,
    dirichlet_prior,
    dirichlet_tensor_prior,
    icl_pairs,
    ngram,
    random_multi_parent,
    random_tree,
    relabel,
    relabel_closure,
    stationary_distribution,
    two_parent,
)
from .model import predict, predict_multi
from .engine import (
    DEFAULT_OPTIONS,
    EngineOptions,
    GradientNoise,
    LossAndGrad,
    Stage1Field,
    bayes_loss,
    bayes_loss_multi,
    official_bayes_loss,
    official_bayes_predict,
    clear_caches,
    construction_loss,
    construction_loss_multi,
    count_estimator_loss,
    count_estimator_loss_multi,
    exact_loss,
    exact_loss_and_grad,
    exact_loss_and_grad_multi,
    exact_loss_multi,
    optimal_loss,
    optimal_loss_multi,
    floor_loss,
    gradient_noise,
    sampled_loss_and_grad,
    stage1_field,
    stage1_row_noise,
    symmetry_applies,
)
from .theory import (
    Assumptions,
    ChainInformation,
    DpiReport,
    assumptions,
    bound_readings,
    chain_information,
    dpi_report,
    dpi_report_pi,
    idealized_grad_A1,
    idealized_gradient,
    idealized_gradient_single,
    pairwise_joint,
)
from .model.catformer import CatFormer, CatFormerParams, StandardTransformer, catformer_from_reduced, \
    to_disentangled, to_standard
from .model.transformer import Transformer
from .model.protocol import Model
from .model.reduced_model import ReducedModel
from .engine.front import ModelLossAndGrad, loss_and_grad
from .engine.catformer import CatFormerLossAndGrad, catformer_loss, catformer_loss_and_grad, \
    catformer_rows_loss_and_grad
from .engine.catformer_attention import CatFormerAttention, catformer_attention
from .engine.hvp import HessianSpectrum, catformer_hvp, hessian_spectrum, hvp
from .train import MultiHeadTrainConfig, TrainConfig, Trajectory, train_multi_head, train_two_stage
from .train import CatFormerTrajectory, train_catformer
from .train.optim import Optimizer
from .train.model_trainer import ModelTrainConfig, ModelTrajectory, train_model
from . import checks
from . import testing
from .checks.symmetry_breaking import follow_symmetric_start, head_ablation, positional_margins, symmetric_start
from . import _compat
from .engine._kernels.cache import refresh_stale_indexes as _refresh_stale_indexes

_refresh_stale_indexes()  # before any kernel runs: cached kernels whose callees changed are compiled afresh

#: Deprecated alias of :class:`LossAndGrad` (one result type serves every task kind).
MultiLossAndGrad = LossAndGrad


def sweep(spec, client=None, out="sweep_out", **kwargs):
    """Run the main job on every cell of a sweep spec with Dask; return the results as a pandas DataFrame.

    See :func:`popgrad.app.sweep.sweep` (imported on first call, so that ``import popgrad`` does not
    import Dask): ``spec`` is a TOML path or a dict with ``fixed`` / ``axes`` / ``cells``; ``client`` a
    ``dask.distributed.Client`` (default: a LocalCluster with one single-threaded worker per core).
    """
    from .app.sweep import sweep as _sweep

    return _sweep(spec, client=client, out=out, **kwargs)

_compat.install()

__all__ = [
    "DirichletPrior",
    "DirichletTensorPrior",
    "official_bayes_loss",
    "official_bayes_predict",
    "official_random_tree",
    "official_dags",
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
    "EngineOptions",
    "DEFAULT_OPTIONS",
    "exact_loss_and_grad",
    "exact_loss",
    "optimal_loss",
    "bayes_loss",
    "count_estimator_loss",
    "construction_loss",
    "floor_loss",
    "sampled_loss_and_grad",
    "GradientNoise",
    "gradient_noise",
    "symmetry_applies",
    "clear_caches",
    "Stage1Field",
    "stage1_field",
    "stage1_row_noise",
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
    "predict_multi",
    "MultiHeadTrainConfig",
    "train_multi_head",
    "checks",
    "sweep",
    "CatFormer",
    "CatFormerParams",
    "CatFormerLossAndGrad",
    "catformer_loss_and_grad",
    "catformer_rows_loss_and_grad",
    "catformer_loss",
    "StandardTransformer",
    "Transformer",
    "Model",
    "ReducedModel",
    "loss_and_grad",
    "ModelLossAndGrad",
    "train_model",
    "ModelTrainConfig",
    "ModelTrajectory",
    "to_disentangled",
    "to_standard",
    "catformer_from_reduced",
    "CatFormerAttention",
    "catformer_attention",
    "train_catformer",
    "CatFormerTrajectory",
    "Optimizer",
    "catformer_hvp",
    "hvp",
    "hessian_spectrum",
    "HessianSpectrum",
    "symmetric_start",
    "follow_symmetric_start",
    "positional_margins",
    "head_ablation",
]

#: Deprecated names: still importable (``popgrad.exact_loss_multi`` ...), each with a ``DeprecationWarning``
#: when called (one release), but not part of the public surface (not in ``__all__``).
DEPRECATED = (
    "MultiLossAndGrad",
    "exact_loss_and_grad_multi",
    "exact_loss_multi",
    "optimal_loss_multi",
    "bayes_loss_multi",
    "count_estimator_loss_multi",
    "construction_loss_multi",
)
