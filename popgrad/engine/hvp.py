"""Exact Hessian-vector products of the population loss and their extreme spectra (DESIGN §22).

``H v = d/dt ∇L(θ + t v)|₀``, computed by **complex-step differentiation of an
analytic gradient**: every function here evaluates the exact population
gradient (the reverse-mode formulas of DESIGN §4, §9 and §18, written for
complex arrays) at ``θ + i·h·v`` and returns ``Im ∇L(θ + i h v) / h``.

Why this is exact to rounding (not a finite difference). Every operation in
the gradient code is holomorphic (``+ − × /``, ``exp``, ``log``, matrix
products; the only non-holomorphic step, the softmax's shift, subtracts a
*real* constant, the maximum of the real parts, and the softmax does not depend
on the shift). For a holomorphic ``g``, ``g(θ + i h v) = g(θ) − h²/2 g''[v,v]
+ i h (g'(θ) v − h²/6 g'''[v,v,v]) + …``, so ``Im g(θ + i h v)/h = g'(θ) v + O(h²)``
with **no subtraction of nearby numbers**: with ``h = 1e-20 / ‖v‖_∞`` the
``O(h²)`` term is ``1e-40`` relative, far below rounding. Carried through the
arithmetic, ``x + i ẋ h`` is exactly a dual number whose product
``(a + i ȧh)(b + i ḃh) = ab − ȧḃh² + i(aḃ + ȧb)h`` differs from the dual product
only by the ``h²`` term: this *is* forward-over-reverse, in complex arithmetic.

Cost: one complex gradient (about 3–4 real ones) per product, vectorised NumPy
over enumeration chunks (not a numba kernel; DESIGN §22 gives the figures).
``client=`` splits the chunks over a Dask client's workers; the chunk partial
sums are added in chunk order, so the result is bit-identical to ``client=None``.

The models:

* :func:`catformer_hvp` -- the disentangled transformer (DESIGN §18), every parameter;
* :func:`hvp` -- the reduced models: single head (``A1 (T,T)``, ``A2 (S,S)``, DESIGN §3–§4)
  and k heads (``(k,T,T)``, ``(k,S,S)``, DESIGN §9).

Spectra: :func:`hessian_spectrum` (Lanczos, ``scipy.sparse.linalg.eigsh`` on a
``LinearOperator`` of the product), optionally restricted to the head-antisymmetric
or head-symmetric subspace of a pair of heads of one layer (:func:`head_swap`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import _validation as V
from .._validation import ArgumentTypeError, as_eps, as_int
from ..model.catformer import CatFormer, CatFormerParams, check_task_model
from ..task.tasks import MultiParentTask
from ._args import validate

__all__ = [
    "catformer_hvp", "hvp", "catformer_grad_complex", "reduced_grad_complex", "HessianSpectrum",
    "hessian_spectrum", "head_swap", "catformer_hessian_dense", "reduced_hessian_dense",
    "flatten_params", "unflatten_params",
]

#: Imaginary step relative to ``‖v‖_∞`` (``O(h²)`` error ~ 1e-40; no underflow above ~1e-280).
STEP = 1e-20
#: Sequences per chunk of the vectorised sums.
CHUNK = 2048


# ============================================================ flat parameter vectors
def flatten_params(params) -> np.ndarray:
    """``[Ã^(1) | … | Ã^(L) | W]`` flat (C order), the coordinates of :func:`hessian_spectrum`."""
    return np.concatenate([np.asarray(a).reshape(-1) for a in params[0]] + [np.asarray(params[1]).reshape(-1)])


def unflatten_params(model, x) -> CatFormerParams:
    """Inverse of :func:`flatten_params` for ``model`` (copies; real or complex)."""
    a_shapes, w_shape = model.shapes()
    A, off = [], 0
    for s in a_shapes:
        n = math.prod(s)
        A.append(np.array(x[off:off + n]).reshape(s))
        off += n
    return CatFormerParams(A, np.array(x[off:off + math.prod(w_shape)]).reshape(w_shape))


# ============================================================ complex-capable gradients
def _masked_softmax_c(z, low):
    """Row softmax over ``low`` entries of complex/real ``z (..., T, T)``; real shift; 0 elsewhere."""
    shift = np.max(np.where(low, z.real, -np.inf), axis=-1, keepdims=True)
    e = np.where(low, np.exp(np.where(low, z, shift) - shift), 0.0)
    return e / np.sum(e, axis=-1, keepdims=True)


def _embed(S, T, seqs):
    n = seqs.shape[0]
    x = np.zeros((n, T, S + T))
    x[np.arange(n)[:, None], np.arange(T)[None, :], seqs] = 1.0
    x[:, np.arange(T), S + np.arange(T)] = 1.0
    return x


def _catformer_chunk(model, A, W, seqs, w, eps):
    """Loss and gradients summed over one chunk, complex-safe: ``(loss, dA list, dW)`` (DESIGN §18 backward)."""
    S, T, dims = model.S, model.T, model.dims
    dt = np.result_type(W, *A)
    low = np.tri(T, dtype=bool)
    h = _embed(S, T, seqs).astype(dt)
    probs = []
    for Al in A:
        Ps = []
        outs = []
        for k in range(Al.shape[0]):
            z = (h @ Al[k]) @ h.transpose(0, 2, 1)
            P = _masked_softmax_c(z, low)
            Ps.append(P)
            outs.append(P @ h)
        probs.append(Ps)
        h = np.concatenate([h] + outs, axis=2)
    z = h[:, -1, :] @ W
    pos = w > 0
    wp = np.where(pos, w, 0.0)
    if model.readout == "softmax":
        shift = z.real.max(axis=1, keepdims=True)
        ez = np.exp(z - shift)
        se = np.sum(ez, axis=1, keepdims=True)
        f = ez / se
        if eps == 0.0:
            logf = z - shift - np.log(se)
            loss = -np.sum(wp * logf)
            dz = -wp + f * wp.sum(axis=1, keepdims=True)
        else:
            fe = f + eps
            loss = -np.sum(wp * np.log(np.where(pos, fe, 1.0)))
            r = -wp / np.where(pos, fe, 1.0)
            dz = f * (r - np.sum(f * r, axis=1, keepdims=True))
    else:
        fe = z + eps
        with np.errstate(invalid="ignore", divide="ignore"):
            loss = -np.sum(wp * np.log(np.where(pos, fe, 1.0)))
            dz = -wp / np.where(pos, fe, 1.0)
    dW = h[:, -1, :].T @ dz
    dh = np.zeros_like(h)
    dh[:, -1, :] = dz @ W.T
    dA = [None] * len(A)
    for l in range(len(A) - 1, -1, -1):
        Al, Ps, d = A[l], probs[l], dims[l]
        hin = h[:, :, :d]
        g = dh[:, :, :d].copy()
        dAl = np.zeros(Al.shape, dtype=dt)
        for k in range(Al.shape[0]):
            P = Ps[k]
            go = dh[:, :, d * (1 + k): d * (2 + k)]
            dP = go @ hin.transpose(0, 2, 1)
            g += P.transpose(0, 2, 1) @ go
            dZ = P * (dP - np.sum(P * dP, axis=2, keepdims=True))
            dZh = dZ @ hin
            dAl[k] = np.einsum("nia,nib->ab", hin, dZh)
            g += dZh @ Al[k].T + dZ.transpose(0, 2, 1) @ (hin @ Al[k])
        dA[l] = dAl
        dh = np.concatenate([g, np.zeros((h.shape[0], h.shape[1], h.shape[2] - d), dtype=dt)], axis=2)
    return loss, dA, dW


def _fill(task, start, stop):
    """Sequences ``start … stop-1`` (the task's numbering) with their exact weights (a continuous prior's from
    its weight table, DESIGN §20)."""
    if getattr(task, "continuous", False):
        from .table import table_rows

        seqs, w = table_rows(task, start, stop)
        return np.ascontiguousarray(seqs, dtype=np.int64), np.ascontiguousarray(w, dtype=np.float64)
    n = stop - start
    seqs = np.empty((n, task.T), dtype=np.int64)
    w = np.empty((n, task.S), dtype=np.float64)
    task._fill_chunk(start, task.kernel_arrays(), seqs, w)
    return seqs, w


def _ranges(n_total, chunk):
    return [(a, min(a + chunk, n_total)) for a in range(0, n_total, chunk)]


def _catformer_range(task, model, A, W, eps, start, stop):
    seqs, w = _fill(task, start, stop)
    return _catformer_chunk(model, A, W, seqs, w, eps)


def _sum_parts(parts):
    loss = 0
    dA = None
    dW = None
    for l_c, dA_c, dW_c in parts:  # chunk order: the same additions with or without a client
        loss = loss + l_c
        if dA is None:
            dA = [np.array(a) for a in dA_c]
            dW = np.array(dW_c)
        else:
            for a, b in zip(dA, dA_c):
                a += b
            dW += dW_c
    return loss, dA, dW


def _map(client, fn, args, ranges):
    if client is None:
        return [fn(*args, a, b) for a, b in ranges]
    if not (hasattr(client, "submit") and hasattr(client, "gather")):
        raise ArgumentTypeError(f"client must be a dask.distributed.Client, got {type(client).__name__}")
    futs = [client.submit(fn, *args, a, b, pure=False) for a, b in ranges]
    return client.gather(futs)


def catformer_grad_complex(task, model, params, eps=0.0, client=None, chunk=None):
    """Population loss and gradient of the CatFormer at (possibly complex) ``params``: ``(loss, dA, dW)``.

    The reverse-mode formulas of :func:`popgrad.model.catformer.catformer_backward`, holomorphic
    (real softmax shift), summed over every sequence in chunks of ``chunk`` (default :data:`CHUNK`). No validation: callers
    pass checked arguments.
    """
    ranges = _ranges(task.n_sequences, CHUNK if chunk is None else int(chunk))
    parts = _map(client, _catformer_range, (task, model, list(params[0]), params[1], eps), ranges)
    return _sum_parts(parts)


def _second_layer(seqs, X, u, w, eps):
    """The reduced models' readout from the scores ``u (n, T)``, complex-safe: ``(loss, δ = ∂loss/∂u (n, T))``.

    ``a = softmax(u)``, ``f = Σ_{s_i = c} a_i``, ``loss = -Σ w_c log(f_c + ε)`` (terms with ``w_c = 0`` left out),
    ``δ_i = a_i (r_{s_i} - r̄)`` with ``r_c = -w_c/(f_c + ε)``, ``r̄ = Σ_c f_c r_c``; ``X (n, T, S)`` one-hot ``seqs``.
    """
    e = np.exp(u - u.real.max(axis=1, keepdims=True))
    a = e / e.sum(axis=1, keepdims=True)
    f = np.einsum("ni,nic->nc", a, X)
    pos = w > 0
    wp = np.where(pos, w, 0.0)
    fe = np.where(pos, f + eps, 1.0)
    loss = -np.sum(wp * np.log(fe))
    r = -wp / fe
    rbar = np.sum(f * r, axis=1)
    return loss, a * (np.take_along_axis(r, seqs, axis=1) - rbar[:, None])


def _reduced_single_chunk(seqs, w, P, A2, eps):
    """DESIGN §4 over one chunk, complex-safe: ``(loss, G (T,T), dA2 (S,S))``."""
    T, S = P.shape[0], A2.shape[0]
    q = seqs[:, T - 1]
    Vv = A2[q[:, None], seqs]  # (n, T)
    u = Vv @ P.T
    X = (seqs[:, :, None] == np.arange(S)).astype(np.float64)
    loss, delta = _second_layer(seqs, X, u, w, eps)
    G = delta.T @ Vv
    E = delta @ P  # E[n, j] = Σ_i δ_i P[i, j] -> dA2[q, s_j]
    Q = (q[:, None] == np.arange(S)).astype(np.float64)  # (n, S)
    dA2 = np.einsum("nb,njc,nj->bc", Q, X, E)
    return loss, G, dA2


def _reduced_multi_chunk(seqs, w, P, A2, eps):
    """DESIGN §9 (k heads) over one chunk, complex-safe: ``(loss, G (k,T,T), dA2 (k,S,S))``."""
    S = A2.shape[1]
    T = P.shape[1]
    X = (seqs[:, :, None] == np.arange(S)).astype(np.float64)  # (n, T, S)
    H = np.einsum("hij,njc->nhic", P, X)
    Q = H[:, :, -1, :]
    kappa = np.einsum("nhb,hbc->nhc", Q, A2)
    u = np.einsum("nhic,nhc->ni", H, kappa)
    loss, delta = _second_layer(seqs, X, u, w, eps)  # δ_i = ∂ℓ/∂u_i
    # u_i = Σ_h Σ_{b,c} Q^h_b A2^h_{bc} H^h_{ic}
    eta = np.einsum("ni,nhic->nhc", delta, H)  # Σ_i δ_i H^h_i
    dA2 = np.einsum("nhb,nhc->hbc", Q, eta)
    dH = np.einsum("ni,nhc->nhic", delta, kappa)  # through the keys
    zeta = np.einsum("hbc,nhc->nhb", A2, eta)  # through the query Q^h = H^h_{T-1}
    dH[:, :, T - 1, :] += zeta
    # H^h = P^h X -> dP^h[i, j] = Σ_n Σ_c dH[n,h,i,c] X[n,j,c]
    G = np.einsum("nhic,njc->hij", dH, X)
    return loss, G, dA2


def _reduced_range(task, A1, A2, eps, start, stop):
    seqs, w = _fill(task, start, stop)
    low = np.tri(task.T, dtype=bool)
    if A1.ndim == 3:
        P = _masked_softmax_c(A1, low)
        return _reduced_multi_chunk(seqs, w, P, A2, eps)
    P = _masked_softmax_c(A1, low)
    return _reduced_single_chunk(seqs, w, P, A2, eps)


def reduced_grad_complex(task, A1, A2, eps, client=None, chunk=None):
    """Loss and ``(dA1, dA2)`` of the reduced model (single or k heads) at (possibly complex) ``A1``, ``A2``.

    ``dA1 = P ⊙ (G − <P, G>)`` on and below the diagonal, applied once after the sum (DESIGN §4).
    No validation: callers pass checked arguments.
    """
    ranges = _ranges(task.n_sequences, CHUNK if chunk is None else int(chunk))
    parts = _map(client, _reduced_range, (task, A1, A2, eps), ranges)
    loss, G, dA2 = 0, None, None
    for l_c, G_c, d_c in parts:
        loss = loss + l_c
        G = np.array(G_c) if G is None else G + G_c
        dA2 = np.array(d_c) if dA2 is None else dA2 + d_c
    low = np.tri(task.T, dtype=bool)
    P = _masked_softmax_c(A1, low)
    G = np.where(low, G, 0.0)
    dA1 = np.where(low, P * (G - np.sum(P * G, axis=-1, keepdims=True)), 0.0)
    return loss, dA1, dA2


# ============================================================ the products
def _step(v_flat):
    m = float(np.max(np.abs(v_flat))) if v_flat.size else 0.0
    return STEP / m if m > 0 else 0.0


def _cat_validate(task, model, params, eps):
    check_task_model(task, model, None)  # the task, the model and their sizes
    params = model.check_params(params)
    if eps is None:
        eps = 0.0 if model.readout == "softmax" else as_eps(task, None)
    else:
        eps = as_eps(task, eps)
    task.check_size()
    return params, eps


def _cat_direction(model, v):
    try:
        return model.check_params(v)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"v: {exc} (v must have the structure of params: CatFormerParams(A, W))") from None


def catformer_hvp(task, model, params, v, eps=None, client=None) -> CatFormerParams:
    """Exact Hessian-vector product ``H v`` of the CatFormer's population loss (DESIGN §22).

    Parameters
    ----------
    task : Task or MultiParentTask
        Enumerable.
    model : CatFormer
        Same ``S``, ``T`` as the task.
    params : CatFormerParams
        The point ``θ``.
    v : CatFormerParams
        The direction, same structure as ``params``.
    eps : float, optional
        As in :func:`popgrad.catformer_loss_and_grad` (default 0 for the softmax readout).
    client : dask.distributed.Client, optional
        Split the enumeration's chunks over its workers (bit-identical to ``None``).

    Returns
    -------
    CatFormerParams
        ``H v`` with the structure of ``params`` (``A`` list, ``W``).
    """
    params, eps = _cat_validate(task, model, params, eps)
    v = _cat_direction(model, v)
    return _catformer_hvp_flat(task, model, params, flatten_params(v), eps, client)


def _catformer_hvp_flat(task, model, params, vf, eps, client=None) -> CatFormerParams:
    h = _step(vf)
    if h == 0.0:
        return unflatten_params(model, np.zeros_like(vf))
    x = flatten_params(params) + 1j * h * vf
    pc = unflatten_params(model, x)
    _, dA, dW = catformer_grad_complex(task, model, pc, eps, client)
    return CatFormerParams([np.ascontiguousarray(a.imag / h) for a in dA], np.ascontiguousarray(dW.imag / h))


def hvp(task, A1, A2, v, eps=None, client=None):
    """Exact Hessian-vector product of the reduced model's population loss (DESIGN §22).

    Parameters
    ----------
    task : Task or MultiParentTask
        Single parent: ``A1 (T, T)``, ``A2 (S, S)`` (DESIGN §3); k parents: ``(k, T, T)``, ``(k, S, S)``
        (DESIGN §9).
    A1, A2 : array_like
        The point.
    v : (V1, V2)
        The direction, shaped like ``(A1, A2)``; entries of ``V1`` above the diagonal do not matter.
    eps : float, optional
        Loss perturbation (default ``T_eff**-0.5``, as :func:`popgrad.exact_loss_and_grad`).
    client : dask.distributed.Client, optional
        Split the chunks over its workers (bit-identical to ``None``).

    Returns
    -------
    (HA1, HA2)
        ``H v`` in the shapes of ``A1`` (zero above the diagonal) and ``A2``.
    """
    A1, A2, eps = validate(task, A1, A2, eps)
    task.check_size()
    if not (isinstance(v, (tuple, list)) and len(v) == 2):
        raise ArgumentTypeError("v must be a pair (V1, V2) shaped like (A1, A2)")
    try:
        V1, V2 = np.array(v[0], dtype=np.float64), np.array(v[1], dtype=np.float64)
    except (TypeError, ValueError):
        raise ArgumentTypeError("v must be a pair (V1, V2) of real arrays shaped like (A1, A2)") from None
    if V1.shape != A1.shape and not (V1.ndim == 2 and A1.ndim == 3 and (1,) + V1.shape == A1.shape):
        raise ValueError(f"v[0] must have the shape of A1 {A1.shape}, got {V1.shape}")
    if V2.shape != A2.shape and not (V2.ndim == 2 and A2.ndim == 3 and (1,) + V2.shape == A2.shape):
        raise ValueError(f"v[1] must have the shape of A2 {A2.shape}, got {V2.shape}")
    V1, V2 = V1.reshape(A1.shape), V2.reshape(A2.shape)
    if not (np.all(np.isfinite(V1)) and np.all(np.isfinite(V2))):
        raise ValueError("v must be finite")
    return _reduced_hvp(task, A1, A2, V1, V2, eps, client)


def _reduced_hvp(task, A1, A2, V1, V2, eps, client=None):
    h = _step(np.concatenate([V1.ravel(), V2.ravel()]))
    if h == 0.0:
        return np.zeros_like(A1), np.zeros_like(A2)
    _, d1, d2 = reduced_grad_complex(task, A1 + 1j * h * V1, A2 + 1j * h * V2, eps, client)
    return np.ascontiguousarray(d1.imag / h), np.ascontiguousarray(d2.imag / h)


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
                     eps=None, tol=0.0, client=None) -> HessianSpectrum:
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
        ``eigsh`` tolerance (0: machine precision).

    Returns
    -------
    HessianSpectrum
    """
    from scipy.sparse.linalg import LinearOperator, eigsh

    if isinstance(model, str):
        if model != "reduced":
            raise ValueError(f"model must be a popgrad.CatFormer or 'reduced', got {model!r}")
        if not (isinstance(params, (tuple, list)) and len(params) == 2):
            raise ArgumentTypeError("params must be (A1, A2) for model='reduced'")
        A1, A2, eps_ = validate(task, params[0], params[1], eps)
        task.check_size()
        n1 = A1.size
        shapes = (A1.shape, A2.shape)

        def matvec_full(x):
            h1, h2 = _reduced_hvp(task, A1, A2, x[:n1].reshape(shapes[0]), x[n1:].reshape(shapes[1]), eps_, client)
            return np.concatenate([h1.ravel(), h2.ravel()])

        n = n1 + A2.size
        perm_fn = (lambda: _reduced_swap(A1.shape, A2.shape, heads)) if A1.ndim == 3 else None
    else:
        p, eps_ = _cat_validate(task, model, params, eps)
        n = flatten_params(p).size

        def matvec_full(x):
            return flatten_params(_catformer_hvp_flat(task, model, p, np.asarray(x, float), eps_, client))

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
