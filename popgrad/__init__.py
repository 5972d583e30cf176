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
]
