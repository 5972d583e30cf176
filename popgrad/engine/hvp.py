"""Exact Hessian-vector products of the population loss and their extreme spectra (DESIGN §22): the import path.

Two modules do the work; every name of both is importable from here (the path the API, the checks and the
tests use):

* :mod:`popgrad.engine.complex_step` -- the products' entries: :func:`catformer_hvp` (the full model),
  :func:`catformer_rows_hvp` (its loss on given rows: a sampled batch), :func:`hvp` (the reduced single- and
  k-head models), run by default on the tangent (forward-over-reverse) numba kernels of
  :mod:`popgrad.engine.tangent`, with ``method="complex_step"`` by the complex-step reference
  ``Im ∇L(θ + i h v)/h`` (the complex gradients); :func:`flatten_params` / :func:`unflatten_params`;
* :mod:`popgrad.engine.hessian` -- :func:`head_swap` and the head-(anti)symmetric subspaces,
  :func:`hessian_spectrum` (Lanczos on a ``LinearOperator`` of the product, optionally restricted), dense
  Hessians for tests.
"""
from __future__ import annotations

from .complex_step import (  # noqa: F401  (re-exported, private helpers included: the checks use them)
    CHUNK, STEP, _cat_direction, _cat_validate, _catformer_chunk, _catformer_hvp_flat, _embed, _fill, _map,
    _masked_softmax_c, _reduced_hvp, _rows_hvp_flat, _step, catformer_grad_complex, catformer_hvp,
    catformer_rows_hvp, flatten_params, reduced_grad_complex, unflatten_params)
from .complex_step import hvp as _reduced_hvp_entry
from .hessian import (  # noqa: F401
    HessianSpectrum, _pair, _reduced_swap, _select, _WHICH, basis_embed, basis_project, catformer_hessian_dense,
    head_swap, hessian_spectrum, reduced_hessian_dense, subspace_basis)


def hvp(task, A1, A2, v, eps=None, client=None, method=None):
    """Exact Hessian-vector product of the population loss (DESIGN §22): the reduced model's, or any model's.

    ``hvp(task, A1, A2, (V1, V2))`` -- the reduced model (:func:`popgrad.engine.complex_step.hvp`:
    ``(HA1, HA2)`` in the shapes of ``A1``, ``A2``); ``hvp(task, model, params, v)`` with a
    :class:`popgrad.Model` -- ``H v`` as a mapping ``name -> array`` (:func:`popgrad.engine.front.hvp`:
    the reduced and full models' own products, a complex step through any other model's
    ``loss_and_grad_rows`` when it declares ``complex_safe = True``). ``eps`` and ``client`` as in
    :func:`popgrad.exact_loss_and_grad` / :func:`popgrad.loss_and_grad`. ``method`` (the reduced model's
    arrays): ``"tangent"`` (the default, the numba kernel) or ``"complex_step"`` (the reference); a
    :class:`popgrad.Model` runs its own product (the tangent kernels for the reduced and full models).
    """
    from ..model.protocol import is_model

    if is_model(A1):  # hvp(task, model, params, v): the seam
        if method is not None:
            raise ValueError(f"method={method!r} applies to hvp(task, A1, A2, v) (the reduced model's arrays); "
                             "a popgrad.Model runs its own product: leave method out")
        from .front import hvp as _model_hvp

        return _model_hvp(task, A1, A2, v, eps=eps, client=client)
    return _reduced_hvp_entry(task, A1, A2, v, eps=eps, client=client, method=method)


__all__ = [
    "catformer_hvp", "hvp", "catformer_rows_hvp", "catformer_grad_complex", "reduced_grad_complex",
    "flatten_params", "unflatten_params", "head_swap", "subspace_basis", "basis_embed", "basis_project",
    "HessianSpectrum", "hessian_spectrum", "catformer_hessian_dense", "reduced_hessian_dense",
]
