"""Step 1 of the data flow: what is learned (DESIGN §1, §2, §9).

* :mod:`.graphs` -- single-parent causal graphs (:class:`CausalGraph`, ``chain``, ``icl_pairs``, ``random_tree``);
* :mod:`.official` -- the official experiments' graphs as data (:func:`official_dags`);
* :mod:`.multigraphs` -- k-parent graphs (:class:`MultiParentGraph`, ``ngram``, ``two_parent``, ...);
* :mod:`.priors` -- finite priors over transition matrices (:class:`FinitePrior`, ``dirichlet_prior``);
* :mod:`.stationary` -- stationary distributions (GTH);
* :mod:`.relabeling` -- token relabelings, the relabeling closure and the one closure test;
* :mod:`.dirichlet` -- the official continuous priors (:class:`DirichletPrior`, :class:`DirichletTensorPrior`)
  and their exact weights from sufficient statistics (DESIGN §20);
* :mod:`.tensor_priors` -- finite priors over transition tensors (:class:`TensorPrior`);
* :mod:`.tasks` -- :class:`Task` and :class:`MultiParentTask` (shared :class:`ExactTask`): exact sequence
  weights, the size guard, the task fingerprint, :func:`check_task` (the one task validator);
* :mod:`.table` -- the weight table of a task (computed once, or streamed past its memory budget);
* :mod:`.sampling` -- the draws of ``task.sample`` (:class:`Sample`);
* :mod:`.reference` -- the NumPy references of the exact weights and the NumPy sequence decoder;
* :mod:`._weights` -- the numba kernels of the exact weights and the one sequence decoder.
"""
from .dirichlet import DirichletPrior, DirichletTensorPrior, WeightAccuracy
from .graphs import CausalGraph, Tree, chain, icl_pairs, official_random_tree, random_tree
from .official import official_dags
from .multigraphs import MultiParentGraph, ngram, random_multi_parent, two_parent
from .priors import (
    FinitePrior,
    PriorDiagnostics,
    dirichlet_prior,
    relabel,
    relabel_closure,
    stationary_distribution,
)
from .tensor_priors import TensorPrior, TensorPriorDiagnostics, dirichlet_tensor_prior, relabel_tensor
from .tasks import (
    DEFAULT_MAX_SEQUENCES,
    ExactTask,
    MultiParentTask,
    Sample,
    Task,
    TaskTooLargeError,
    check_task,
    decode_sequences,
    parent_rows,
    sequence_weights_multi_numpy,
    sequence_weights_numpy,
)

__all__ = [
    "CausalGraph", "Tree", "chain", "icl_pairs", "random_tree", "official_random_tree", "official_dags",
    "DirichletPrior", "DirichletTensorPrior", "WeightAccuracy",
    "MultiParentGraph", "ngram", "two_parent", "random_multi_parent",
    "FinitePrior", "PriorDiagnostics", "dirichlet_prior", "relabel", "relabel_closure", "stationary_distribution",
    "TensorPrior", "TensorPriorDiagnostics", "dirichlet_tensor_prior", "relabel_tensor",
    "ExactTask", "Task", "MultiParentTask", "Sample", "TaskTooLargeError", "DEFAULT_MAX_SEQUENCES",
    "decode_sequences", "parent_rows", "sequence_weights_numpy", "sequence_weights_multi_numpy", "check_task",
]
