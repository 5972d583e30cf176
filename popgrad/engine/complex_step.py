"""Exact Hessian-vector products of the population loss by complex step (DESIGN §22; public face: :mod:`popgrad.engine.hvp`).

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
over enumeration chunks. It is the **reference**: the public products run the tangent
kernels of :mod:`popgrad.engine.tangent` (the same forward-over-reverse in real arithmetic, in numba)
unless ``method="complex_step"``; DESIGN §22 gives the figures.

Scale: both methods run on the direction scaled to ``max |v| ≈ 1`` by a power of two and multiply the
product back (exact: ``H v`` is linear in ``v``), so the step ``h`` never underflows (before, a direction
with ``max |v|`` near 1e305 gave 0); a product beyond float64 is ``inf`` with a ``RuntimeWarning``.
``client=`` splits the chunks over a Dask client's workers; the chunk partial
sums are added in chunk order, so the result is bit-identical to ``client=None``.

The models:

* :func:`catformer_hvp` -- the disentangled transformer (DESIGN §18), every parameter;
* :func:`catformer_rows_hvp` -- the same model's loss on given rows with given weights (a sampled batch);
* :func:`hvp` -- the reduced models: single head (``A1 (T,T)``, ``A2 (S,S)``, DESIGN §3–§4)
  and k heads (``(k,T,T)``, ``(k,S,S)``, DESIGN §9).

Spectra, head swaps and the (anti)symmetric subspaces are :mod:`popgrad.engine.hessian` (built on the
products here); :mod:`popgrad.engine.hvp` gathers both (the import path of every name).
"""
from __future__ import annotations

import math

import numpy as np

from .._validation import ArgumentTypeError, as_eps
from ..model.catformer import CatFormerParams, check_task_model
from ._args import validate
from .hvp_chunks import _fill, _map, _ranges  # noqa: F401  (their old import path)

__all__ = [
    "catformer_hvp", "hvp", "catformer_rows_hvp", "catformer_grad_complex", "reduced_grad_complex",
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


#: The ways to compute a product: the tangent kernel (the default) and the complex step (the reference).
METHODS = ("tangent", "complex_step")


def _method(method):
    if method is None:
        return "tangent"
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} (default 'tangent'), got {method!r}")
    return method


def _unit(vf):
    """``(m, vf / m)`` with ``m`` the power of two at or below ``max |v|`` (exact scaling; 0 for ``v = 0``).

    ``H v`` is linear in ``v``: the products run on the unit-scale direction and are multiplied by ``m``
    after, bit for bit the unscaled product wherever that has no overflow or underflow, so no scale of
    ``v`` reaches the complex step's ``1e-20/max|v|`` underflow or an overflow inside the kernels.
    """
    m = float(np.max(np.abs(vf))) if vf.size else 0.0
    if m == 0.0:
        return 0.0, vf
    if not math.isfinite(m):
        raise ValueError("v must be finite")
    e = math.frexp(m)[1]  # m = f·2^e, 0.5 <= f < 1
    scale = math.ldexp(1.0, e - 1)  # 1 <= max |v| / scale < 2 (2^e itself overflows near 1.8e308)
    return scale, vf / scale


def _warn_overflow(where, arrays):
    bad = sum(int(np.size(a) - np.count_nonzero(np.isfinite(a))) for a in arrays)
    if bad:
        import warnings

        from .._validation import _outside_level

        warnings.warn(f"{where}: {bad:,} entries of H v overflow float64 (the product of a direction this large "
                      "and the Hessian exceeds 1.8e308); scale the direction down", RuntimeWarning,
                      stacklevel=_outside_level())


def _scaled(out, scale, where):
    with np.errstate(over="ignore"):
        res = CatFormerParams([a * scale for a in out.A], out.W * scale)
    _warn_overflow(where, [*res.A, res.W])
    return res


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


def catformer_hvp(task, model, params, v, eps=None, client=None, method=None) -> CatFormerParams:
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
    method : {"tangent", "complex_step"}, optional
        ``"tangent"`` (the default): the forward-over-reverse numba kernel (:mod:`popgrad.engine.tangent`);
        ``"complex_step"``: the NumPy complex step of this module, the reference. Both run on ``v`` scaled
        to ``max |v| ≈ 1`` by a power of two (exact), so no scale of ``v`` underflows; a product too
        large for float64 is ``inf`` with a warning.

    Returns
    -------
    CatFormerParams
        ``H v`` with the structure of ``params`` (``A`` list, ``W``).
    """
    params, eps = _cat_validate(task, model, params, eps)
    v = _cat_direction(model, v)
    return _catformer_hvp_flat(task, model, params, flatten_params(v), eps, client, _method(method))


def _catformer_hvp_flat(task, model, params, vf, eps, client=None, method=None) -> CatFormerParams:
    """``H v`` (flat ``v``) by ``method`` (None: the tangent kernel); validated arguments."""
    vf = np.asarray(vf, dtype=np.float64)
    scale, vf = _unit(vf)
    if scale == 0.0:
        return unflatten_params(model, np.zeros_like(vf))
    if _method(method) == "tangent":
        from .tangent import catformer_hvp_tangent

        out = catformer_hvp_tangent(task, model, params, unflatten_params(model, vf), eps, client)
    else:
        out = _catformer_hvp_complex(task, model, params, vf, eps, client)
    return _scaled(out, scale, "catformer_hvp")


def _catformer_hvp_complex(task, model, params, vf, eps, client=None) -> CatFormerParams:
    h = _step(vf)
    if h == 0.0:
        return unflatten_params(model, np.zeros_like(vf))
    x = flatten_params(params) + 1j * h * vf
    pc = unflatten_params(model, x)
    _, dA, dW = catformer_grad_complex(task, model, pc, eps, client)
    return CatFormerParams([np.ascontiguousarray(a.imag / h) for a in dA], np.ascontiguousarray(dW.imag / h))


def catformer_rows_hvp(seqs, w, model, params, v, eps=None, method=None) -> CatFormerParams:
    """Exact Hessian-vector product of the CatFormer's loss on given rows (the sampled step's Hessian).

    The loss is :func:`popgrad.engine.catformer.catformer_rows_loss_and_grad`'s,
    ``Σ_r Σ_c w[r, c] (−log(f_c(s_r) + ε))``: sampled training (``train_catformer(gradient="sampled")``)
    follows it with a batch and ``w = y/n``, so this is the Hessian of the batch loss one sampled step
    descends. Same complex-step scheme as :func:`catformer_hvp` (module docstring), in chunks of
    :data:`CHUNK` rows.

    Parameters
    ----------
    seqs : array_like of int, shape (n, T)
    w : array_like of float, shape (n, S)
        Finite weights ``≥ 0``.
    model : CatFormer
    params, v : CatFormerParams
        The point and the direction.
    eps : float, optional
        As in :func:`popgrad.engine.catformer.catformer_rows_loss_and_grad` (default 0 for the softmax readout).
    method : {"tangent", "complex_step"}, optional
        As in :func:`catformer_hvp` (default: the tangent kernel, the rows in the given order).

    Returns
    -------
    CatFormerParams
        ``H v`` with the structure of ``params``.
    """
    from .catformer import _validate_rows

    seqs, w, params, eps, _ = _validate_rows(seqs, w, model, params, eps, None)
    v = _cat_direction(model, v)
    return _rows_hvp_flat(seqs, w, model, params, flatten_params(v), eps, _method(method))


def _rows_hvp_flat(seqs, w, model, params, vf, eps, method=None) -> CatFormerParams:
    """``H v`` of the rows' loss (flat ``v``) by ``method`` (None: the tangent kernel); validated arguments."""
    vf = np.asarray(vf, dtype=np.float64)
    scale, vf = _unit(vf)
    if scale == 0.0 or np.shape(seqs)[0] == 0:
        return unflatten_params(model, np.zeros_like(vf))
    if _method(method) == "tangent":
        from .tangent import rows_hvp

        out = rows_hvp(seqs, w, model, params, unflatten_params(model, vf), eps)
    else:
        out = _rows_hvp_complex(seqs, w, model, params, vf, eps)
    return _scaled(out, scale, "catformer_rows_hvp")


def _rows_hvp_complex(seqs, w, model, params, vf, eps) -> CatFormerParams:
    h = _step(vf)
    if h == 0.0:
        return unflatten_params(model, np.zeros_like(vf))
    pc = unflatten_params(model, flatten_params(params) + 1j * h * vf)
    A, W = list(pc[0]), pc[1]
    parts = [_catformer_chunk(model, A, W, seqs[a:b], w[a:b], eps) for a, b in _ranges(seqs.shape[0], CHUNK)]
    if not parts:
        return unflatten_params(model, np.zeros_like(vf))
    _, dA, dW = _sum_parts(parts)
    return CatFormerParams([np.ascontiguousarray(a.imag / h) for a in dA], np.ascontiguousarray(dW.imag / h))


def hvp(task, A1, A2, v, eps=None, client=None, method=None):
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
    method : {"tangent", "complex_step"}, optional
        As in :func:`catformer_hvp` (default: the tangent kernel).

    Returns
    -------
    (HA1, HA2)
        ``H v`` in the shapes of ``A1`` (zero above the diagonal) and ``A2``.
    """
    A1, A2, eps = validate(task, A1, A2, eps)
    task.check_size()
    method = _method(method)
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
    return _reduced_hvp(task, A1, A2, V1, V2, eps, client, method)


def _reduced_hvp(task, A1, A2, V1, V2, eps, client=None, method=None):
    """``(HA1, HA2)`` along ``(V1, V2)`` by ``method`` (None: the tangent kernel); validated arguments."""
    V1, V2 = np.asarray(V1, dtype=np.float64), np.asarray(V2, dtype=np.float64)
    scale, _ = _unit(np.concatenate([V1.ravel(), V2.ravel()]))
    if scale == 0.0:
        return np.zeros_like(A1), np.zeros_like(A2)
    V1, V2 = V1 / scale, V2 / scale
    if _method(method) == "tangent":
        from .tangent import reduced_hvp_tangent

        h1, h2 = reduced_hvp_tangent(task, A1, A2, V1, V2, eps, client)
    else:
        h1, h2 = _reduced_hvp_complex(task, A1, A2, V1, V2, eps, client)
    with np.errstate(over="ignore"):
        h1, h2 = h1 * scale, h2 * scale
    _warn_overflow("hvp", [h1, h2])
    return h1, h2


def _reduced_hvp_complex(task, A1, A2, V1, V2, eps, client=None):
    h = _step(np.concatenate([V1.ravel(), V2.ravel()]))
    if h == 0.0:
        return np.zeros_like(A1), np.zeros_like(A2)
    _, d1, d2 = reduced_grad_complex(task, A1 + 1j * h * V1, A2 + 1j * h * V2, eps, client)
    return np.ascontiguousarray(d1.imag / h), np.ascontiguousarray(d2.imag / h)
