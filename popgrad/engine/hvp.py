"""Exact Hessian-vector products of the population loss and their extreme spectra (DESIGN §22): the import path.

Two modules do the work; every name of both is importable from here (the path the API, the checks and the
tests use):

* :mod:`popgrad.engine.complex_step` -- the products, by complex-step differentiation of the exact
  (analytic, holomorphic) population gradient: ``Im ∇L(θ + i h v)/h``, exact to rounding.
  :func:`catformer_hvp` (the full model), :func:`catformer_rows_hvp` (its loss on given rows: a sampled
  batch), :func:`hvp` (the reduced single- and k-head models), the complex gradients and
  :func:`flatten_params` / :func:`unflatten_params`;
* :mod:`popgrad.engine.hessian` -- :func:`head_swap` and the head-(anti)symmetric subspaces,
  :func:`hessian_spectrum` (Lanczos on a ``LinearOperator`` of the product, optionally restricted), dense
  Hessians for tests.
"""
from __future__ import annotations

from .complex_step import (  # noqa: F401  (re-exported, private helpers included: the checks use them)
    CHUNK, STEP, _cat_direction, _cat_validate, _catformer_chunk, _catformer_hvp_flat, _embed, _fill, _map,
    _masked_softmax_c, _reduced_hvp, _rows_hvp_flat, _step, catformer_grad_complex, catformer_hvp,
    catformer_rows_hvp, flatten_params, hvp, reduced_grad_complex, unflatten_params)
from .hessian import (  # noqa: F401
    HessianSpectrum, _pair, _reduced_swap, _select, _WHICH, basis_embed, basis_project, catformer_hessian_dense,
    head_swap, hessian_spectrum, reduced_hessian_dense, subspace_basis)

__all__ = [
    "catformer_hvp", "hvp", "catformer_rows_hvp", "catformer_grad_complex", "reduced_grad_complex",
    "flatten_params", "unflatten_params", "head_swap", "subspace_basis", "basis_embed", "basis_project",
    "HessianSpectrum", "hessian_spectrum", "catformer_hessian_dense", "reduced_hessian_dense",
]
