"""Step 3 of the data flow: exact population loss and gradients (DESIGN §3, §4, §9, §10).

* :mod:`.api` -- the front end: ``exact_loss_and_grad``, ``exact_loss``, ``sampled_loss_and_grad``,
  ``clear_caches``; validates once and dispatches on the task kind;
* :mod:`.blocks` -- the block-runner interface every engine implements (``blocks``, ``block_work``,
  ``run_blocks``, ``finish_blocks``; :class:`BlockJob`, :class:`Partials`);
* :mod:`.single` -- single-parent engines (prefix, direct), plans and the weight cache;
* :mod:`.multi` -- the k-head engine;
* :mod:`.baselines` -- reference losses that enumerate: L*, Bayes, count estimator, construction
  (every task kind);
* :mod:`.sampled` -- Stage 2 from a sample (DESIGN §13);
* :mod:`.distributed` -- one enumeration over Dask workers (imported on first ``client=`` call);
* :mod:`.symmetry` -- exact relabeling-orbit reduction (closure test, canonical sequences);
* :mod:`.reference` -- NumPy references of every engine;
* :mod:`.field` -- the Stage-1 field (DESIGN §12): ``stage1_field`` by enumeration or count generating
  functions, no ``S**T``;
* :mod:`.floor` -- the exact floor of the ε-perturbed loss (water-filling, DESIGN §15);
* :mod:`.noise` -- the per-sample gradient's exact mean and covariance (``gradient_noise``; block protocol);
* :mod:`.catformer` -- the full model's exact loss and gradients (trie engine on the block protocol, the rows
  kernel ``catformer_rows_loss_and_grad``); :mod:`.catformer_rows` -- its sampled batches (the dense batch
  kernel ``catformer_batch_loss_and_grad``); :mod:`.catformer_symmetry` -- its exact orbit reduction along
  relabeling-equivariant parameters (DESIGN §21);
* :mod:`.options` -- :class:`EngineOptions`, the engines' tunables in one object;
* :mod:`._args` -- validation of the engines' arguments (``validate``, ``options_or_default``);
* :mod:`.result` -- :class:`LossAndGrad` and the one softmax-Jacobian finish;
* :mod:`._kernels` -- numba kernels only.
"""
from .api import (
    clear_caches,
    exact_loss,
    exact_loss_and_grad,
    exact_loss_and_grad_multi,
    exact_loss_and_grad_multi_numpy,
    exact_loss_multi,
    sampled_loss_and_grad,
)
from .baselines import (
    bayes_loss,
    bayes_loss_multi,
    construction_loss,
    construction_loss_multi,
    construction_params,
    count_estimator_loss,
    count_estimator_loss_multi,
    count_estimator_predict,
    official_bayes_loss,
    official_bayes_predict,
    optimal_loss,
    optimal_loss_multi,
)
from .catformer import catformer_rows_loss_and_grad
from .catformer_rows import catformer_batch_loss_and_grad
from .floor import floor_loss
from .noise import GradientNoise, flatten_grad, gradient_noise, gradient_noise_numpy, stage1_row_noise
from .field import Stage1Field, field_atoms, stage1_field, stage1_field_from_atoms, stage1_field_numpy
from .options import DEFAULT_OPTIONS, ENGINES, EngineOptions
from .reference import exact_loss_and_grad_numpy
from .result import LossAndGrad
from .symmetry import canonical_count, canonical_sequences, symmetry_applies

__all__ = [
    "exact_loss_and_grad", "exact_loss", "exact_loss_and_grad_numpy", "sampled_loss_and_grad", "clear_caches",
    "LossAndGrad", "EngineOptions", "DEFAULT_OPTIONS", "ENGINES", "symmetry_applies", "canonical_count",
    "canonical_sequences", "Stage1Field", "stage1_field", "stage1_field_from_atoms", "stage1_field_numpy",
    "field_atoms", "floor_loss", "exact_loss_and_grad_multi", "exact_loss_multi", "exact_loss_and_grad_multi_numpy",
    "optimal_loss", "bayes_loss", "count_estimator_predict", "count_estimator_loss", "construction_params",
    "construction_loss", "optimal_loss_multi", "bayes_loss_multi", "count_estimator_loss_multi",
    "construction_loss_multi",
    "GradientNoise", "gradient_noise", "gradient_noise_numpy", "flatten_grad",
    "stage1_row_noise", "official_bayes_loss", "official_bayes_predict", "catformer_rows_loss_and_grad",
    "catformer_batch_loss_and_grad",
]
