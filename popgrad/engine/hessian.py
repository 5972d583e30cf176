"""Spectra of the exact population-loss Hessian: head swaps, (anti)symmetric subspaces, Lanczos (DESIGN §22).

The products themselves are :mod:`popgrad.engine.complex_step` (complex step of the exact gradient); this
module builds on them:

* :func:`head_swap` -- the permutation of the flat CatFormer coordinates that exchanges two heads of
  one layer (the loss is invariant under it); :func:`subspace_basis`, :func:`basis_embed`,
  :func:`basis_project` -- orthonormal bases of its antisymmetric and symmetric subspaces;
* :func:`hessian_spectrum` -- extreme eigenpairs by Lanczos (``scipy.sparse.linalg.eigsh`` on a
  ``LinearOperator`` of the product), optionally restricted to one of those subspaces;
* :func:`catformer_hessian_dense`, :func:`reduced_hessian_dense` -- dense Hessians for tests at tiny sizes.

Every name here is also importable from :mod:`popgrad.engine.hvp` (where it lived first).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import ArgumentTypeError, as_int
from ..model.catformer import CatFormer
from ._args import validate
from .complex_step import _cat_validate, _catformer_hvp_flat, _method, _reduced_hvp, flatten_params

__all__ = [
    "head_swap", "subspace_basis", "basis_embed", "basis_project", "HessianSpectrum", "hessian_spectrum",
    "catformer_hessian_dense", "reduced_hessian_dense",
]


# ============================================================ head swaps and subspaces
def head_swap(model, layer=0, heads=(0, 1)) -> np.ndarray:
    """The permutation of the flat CatFormer coordinates that exchanges two heads of one layer.

    Exchanging heads ``a, b`` of layer ``layer + 1`` (``params.A[layer][a] ↔ [b]``) permutes the
    features of every later hidden state: in ``h^(layer+1)`` the blocks ``d_layer(1+a) …`` and
    ``d_layer(1+b) …`` trade places, and every later layer repeats that permutation ``σ`` inside
    each of its blocks. Later ``Ã`` become ``σ Ã σᵀ`` (both indices) and ``W`` is ``W[σ]``; the
    output, hence the loss, is unchanged on every sequence. Returns ``perm`` with
    ``(swap x)[i] = x[perm[i]]`` (an involution).
    """
    if not isinstance(model, CatFormer):
        raise ArgumentTypeError(f"model must be a popgrad.CatFormer, got {type(model).__name__}")
    layer = as_int(layer, "layer", minimum=0)
    if layer >= model.n_layers:
        raise ValueError(f"layer = {layer} but the model has {model.n_layers} layers (0-based)")
    a, b = _pair(heads, model.heads[layer], "heads")
    dims = model.dims
    d = dims[layer]
    sigma = np.arange(dims[layer + 1])
    ba, bb = d * (1 + a), d * (1 + b)
    sigma[ba:ba + d], sigma[bb:bb + d] = np.arange(bb, bb + d), np.arange(ba, ba + d)
    sig = {layer + 1: sigma}
    for l in range(layer + 1, model.n_layers):
        prev = sig[l]
        dl = dims[l]
        sig[l + 1] = np.concatenate([prev] + [prev + dl * (1 + k) for k in range(model.heads[l])])
    a_shapes, w_shape = model.shapes()
    perm, off = [], 0
    for l, (m, dl, _) in enumerate(a_shapes):
        idx = np.arange(m * dl * dl).reshape(m, dl, dl)
        if l == layer:
            idx = idx[[b if k == a else a if k == b else k for k in range(m)]]
        elif l > layer:
            s = sig[l]
            idx = idx[:, s][:, :, s]
        perm.append(idx.reshape(-1) + off)
        off += m * dl * dl
    widx = np.arange(math.prod(w_shape)).reshape(w_shape)[sig.get(model.n_layers, np.arange(dims[-1]))]
    perm.append(widx.reshape(-1) + off)
    return np.concatenate(perm)


def _pair(heads, m, name):
    if not (isinstance(heads, (tuple, list)) and len(heads) == 2):
        raise ArgumentTypeError(f"{name} must be a pair (a, b) of head indices, got {heads!r}")
    a, b = as_int(heads[0], f"{name}[0]", minimum=0), as_int(heads[1], f"{name}[1]", minimum=0)
    if a == b or max(a, b) >= m:
        raise ValueError(f"{name} = ({a}, {b}) must be two different heads among the layer's {m} heads")
    return a, b


def _reduced_swap(A1shape, A2shape, heads):
    """Flat permutation exchanging heads ``a, b`` of the k-head reduced model (``[A1 | A2]`` flat)."""
    k = A1shape[0]
    a, b = _pair(heads, k, "heads")
    order = [b if j == a else a if j == b else j for j in range(k)]
    n1 = math.prod(A1shape)
    i1 = np.arange(n1).reshape(A1shape)[order].reshape(-1)
    i2 = np.arange(math.prod(A2shape)).reshape(A2shape)[order].reshape(-1) + n1
    return np.concatenate([i1, i2])


def subspace_basis(perm, which):
    """Orthonormal basis of the swap's (anti)symmetric subspace as ``(idx_i, idx_j, coef_j)``.

    Basis vector ``k`` is ``(e_{i_k} + coef_k e_{j_k}) / norm_k``: for a transposed pair ``i < j = perm[i]``
    antisymmetric ``(e_i − e_j)/√2``, symmetric ``(e_i + e_j)/√2``; fixed coordinates (``perm[i] = i``) are
    symmetric basis vectors ``e_i`` (``j = i``, ``coef = 0``).
    """
    n = perm.size
    i = np.arange(n)
    pairs = i < perm
    fixed = perm == i
    if which == "head_antisymmetric":
        return i[pairs], perm[pairs], -np.ones(int(pairs.sum()))
    if which == "head_symmetric":
        ii = np.concatenate([i[pairs], i[fixed]])
        jj = np.concatenate([perm[pairs], i[fixed]])
        cc = np.concatenate([np.ones(int(pairs.sum())), np.zeros(int(fixed.sum()))])
        return ii, jj, cc
    raise ValueError(f"subspace must be None, 'head_antisymmetric' or 'head_symmetric', got {which!r}")


def _norms(coef):
    return np.where(coef == 0, 1.0, math.sqrt(2.0))


def basis_embed(n, basis, y):
    """``B y``: subspace coordinates → full vector (length ``n``)."""
    ii, jj, cc = basis
    x = np.zeros(n)
    s = y / _norms(cc)
    x[ii] += s
    np.add.at(x, jj, np.where(cc == 0, 0.0, cc * s))
    return x


def basis_project(basis, x):
    """``Bᵀ x``: full vector → subspace coordinates."""
    ii, jj, cc = basis
    return (x[ii] + np.where(cc == 0, 0.0, cc * x[jj])) / _norms(cc)


class HessianSpectrum(NamedTuple):
    """Extreme eigenpairs of the (restricted) Hessian of the population loss.

    Attributes
    ----------
    values : ndarray (m,)
        Eigenvalues, ascending.
    vectors : ndarray (n_params, m)
        Unit eigenvectors in the flat coordinates of :func:`flatten_params` (reduced models:
        ``[A1 | A2]`` flat), already mapped back from the subspace.
    subspace : str or None
    dim : int
        Dimension of the operator's domain (the subspace's, or every parameter).
    n_products : int
        Hessian-vector products used.
    """

    values: np.ndarray
    vectors: np.ndarray
    subspace: object
    dim: int
    n_products: int


_WHICH = ("both", "smallest", "largest")


def hessian_spectrum(task, model, params, k=6, which="both", subspace=None, *, layer=0, heads=(0, 1),
                     eps=None, tol=0.0, client=None, method=None) -> HessianSpectrum:
    """Extreme eigenpairs of the population-loss Hessian by Lanczos (``scipy.sparse.linalg.eigsh``).

    Parameters
    ----------
    task : Task or MultiParentTask
    model : CatFormer, or ``"reduced"``
        A :class:`popgrad.CatFormer` with ``params`` a :class:`CatFormerParams`; or the string
        ``"reduced"`` with ``params = (A1, A2)`` (single or k heads).
    params : CatFormerParams or (A1, A2)
    k : int
        Eigenpairs per end (``"both"`` returns up to ``2k``; fewer when the domain is small).
    which : {"both", "smallest", "largest"}
        Algebraically smallest, largest, or ``k`` of each.
    subspace : None, "head_antisymmetric" or "head_symmetric"
        Restrict to ``P H P`` on the subspace of :func:`head_swap` ``(layer, heads)``: antisymmetric
        ``(v − swap v)/2`` or symmetric ``(v + swap v)/2`` directions, in an orthonormal basis of the
        subspace (so the complement's zeros do not enter). At a head-symmetric point (``swap θ = θ``)
        both are invariant subspaces of ``H`` and the restricted spectra are exact blocks of ``H``'s.
    layer, heads
        The pair of heads (0-based layer index into ``params.A``; for the reduced model ``layer`` is ignored).
    eps, client
        As in :func:`catformer_hvp` / :func:`hvp`.
    tol : float
        ``eigsh`` tolerance: a finite real ``≥ 0`` (0: machine precision).
    method : {"tangent", "complex_step"}, optional
        The products: the tangent kernel (default) or the complex-step reference (:func:`catformer_hvp`).

    Returns
    -------
    HessianSpectrum
    """
    from scipy.sparse.linalg import LinearOperator, eigsh

    tol = _tol(tol)
    method = _method(method)
    if not isinstance(model, (str, CatFormer)) and hasattr(model, "param_shapes"):  # any popgrad.Model (DESIGN §26)
        from .front import hessian_operator

        n, matvec_full, perm_fn = hessian_operator(task, model, params, eps, client, heads, method, _reduced_swap)
    elif isinstance(model, str):
        if model != "reduced":
            raise ValueError(f"model must be a popgrad.CatFormer or 'reduced', got {model!r}")
        if not (isinstance(params, (tuple, list)) and len(params) == 2):
            raise ArgumentTypeError("params must be (A1, A2) for model='reduced'")
        A1, A2, eps_ = validate(task, params[0], params[1], eps)
        task.check_size()
        n1 = A1.size
        shapes = (A1.shape, A2.shape)

        def matvec_full(x):
            h1, h2 = _reduced_hvp(task, A1, A2, x[:n1].reshape(shapes[0]), x[n1:].reshape(shapes[1]), eps_, client,
                                  method)
            return np.concatenate([h1.ravel(), h2.ravel()])

        n = n1 + A2.size
        perm_fn = (lambda: _reduced_swap(A1.shape, A2.shape, heads)) if A1.ndim == 3 else None
    else:
        p, eps_ = _cat_validate(task, model, params, eps)
        n = flatten_params(p).size

        def matvec_full(x):
            return flatten_params(_catformer_hvp_flat(task, model, p, np.asarray(x, float), eps_, client, method))

        perm_fn = lambda: head_swap(model, layer, heads)  # noqa: E731
    k = as_int(k, "k", minimum=1)
    if which not in _WHICH:
        raise ValueError(f"which must be one of {_WHICH}, got {which!r}")
    count = [0]
    if subspace is None:
        dim = n

        def op(y):
            count[0] += 1
            return matvec_full(np.ravel(y))

        embed = lambda y: y  # noqa: E731
    else:
        if perm_fn is None:
            raise ValueError("subspace needs two heads: the single-parent reduced model has one")
        basis = subspace_basis(perm_fn(), subspace)
        dim = basis[0].size

        def op(y):
            count[0] += 1
            return basis_project(basis, matvec_full(basis_embed(n, basis, np.ravel(y))))

        embed = lambda y: basis_embed(n, basis, y)  # noqa: E731
    if dim == 0:
        return HessianSpectrum(np.zeros(0), np.zeros((n, 0)), subspace, 0, 0)
    if dim <= 2 * k + 2 or dim <= 12:  # too small for ARPACK: dense in the subspace
        M = np.stack([op(e) for e in np.eye(dim)], axis=1)
        vals, vecs = np.linalg.eigh((M + M.T) / 2)
        sel = _select(vals.size, k, which)
        vals, vecs = vals[sel], vecs[:, sel]
    else:
        L = LinearOperator((dim, dim), matvec=op, dtype=np.float64)
        kk = min(k, dim - 2)
        v0 = np.random.default_rng(0).standard_normal(dim)  # fixed start vector: reproducible
        got = []
        if which in ("both", "smallest"):
            got.append(eigsh(L, k=kk, which="SA", tol=tol, v0=v0))
        if which in ("both", "largest"):
            got.append(eigsh(L, k=kk, which="LA", tol=tol, v0=v0))
        vals = np.concatenate([g[0] for g in got])
        vecs = np.concatenate([g[1] for g in got], axis=1)
        order = np.argsort(vals)
        vals, vecs = vals[order], vecs[:, order]
    full = np.stack([embed(vecs[:, j]) for j in range(vecs.shape[1])], axis=1) if vecs.size else np.zeros((n, 0))
    return HessianSpectrum(np.asarray(vals), full, subspace, int(dim), int(count[0]))


def _tol(tol):
    """The ``eigsh`` tolerance: a finite real ``≥ 0`` (bool, strings, NaN and inf refused in one line)."""
    if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"tol must be a finite real number >= 0 (0: machine precision), got {tol!r}")
    tol = float(tol)
    if not (math.isfinite(tol) and tol >= 0.0):
        raise ValueError(f"tol must be a finite real number >= 0 (0: machine precision), got {tol!r}")
    return tol


def _select(m, k, which):
    idx = np.arange(m)
    if which == "smallest":
        return idx[:k]
    if which == "largest":
        return idx[max(0, m - k):]
    return np.unique(np.concatenate([idx[:k], idx[max(0, m - k):]]))


# ============================================================ dense Hessians (tests, tiny sizes)
def catformer_hessian_dense(task, model, params, eps=None, client=None) -> np.ndarray:
    """The full Hessian in :func:`flatten_params` coordinates, one product per column (tiny sizes only)."""
    p, eps_ = _cat_validate(task, model, params, eps)
    n = flatten_params(p).size
    return np.stack([flatten_params(_catformer_hvp_flat(task, model, p, e, eps_, client)) for e in np.eye(n)],
                    axis=1)


def reduced_hessian_dense(task, A1, A2, eps=None, client=None) -> np.ndarray:
    """The reduced model's Hessian in ``[A1 | A2]`` flat coordinates (tiny sizes only)."""
    A1, A2, eps_ = validate(task, A1, A2, eps)
    n1 = A1.size
    cols = []
    for e in np.eye(n1 + A2.size):
        h1, h2 = _reduced_hvp(task, A1, A2, e[:n1].reshape(A1.shape), e[n1:].reshape(A2.shape), eps_, client)
        cols.append(np.concatenate([h1.ravel(), h2.ravel()]))
    return np.stack(cols, axis=1)
