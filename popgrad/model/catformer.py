"""The model the paper trains: the disentangled transformer ("CatFormer", DESIGN §18, Knowl 7 and 8), in NumPy.

This is the *reference* forward (and backward) pass; the exact engine
(:mod:`popgrad.engine.catformer`) sums the same quantities over every
sequence and the tests compare the two.

**Disentangled transformer.** For a sequence ``s`` of length ``T`` over
``[S]`` the input rows are ``x̃_t = [e_{s_t}, e_t]`` (token one-hot, then
position one-hot), ``d_0 = S + T``. Layer ``ℓ`` has ``m_ℓ`` heads with
matrices ``Ã^(ℓ)_h`` of shape ``(d_{ℓ-1}, d_{ℓ-1})``::

    attn(h; Ã) = softmax_rows(MASK(h Ã hᵀ)) h         # row t attends to j ≤ t (diagonal included)
    h^(ℓ)      = [h^(ℓ-1), attn(h^(ℓ-1); Ã_1), …, attn(h^(ℓ-1); Ã_m)]   # along features, head order
    d_ℓ        = (1 + m_ℓ) d_{ℓ-1}
    f          = softmax(h^(L)_{T-1} W)    (readout "softmax", the official code)
               = h^(L)_{T-1} W             (readout "linear", the theory's construction)

with ``W`` of shape ``(d_L, S)``. Because every layer concatenates, ``h^(ℓ)_t``
is the first ``d_ℓ`` coordinates of ``h^(L)_t``: one row of width ``d_L`` per
position holds every layer.

**Standard transformer (Knowl 7).** ``h^(0)_t = E e_{s_t} + P e_t``;
``h^(ℓ) = h^(ℓ-1) + Σ_h attn(h^(ℓ-1); Q_h K_hᵀ) V_hᵀ``; ``f = softmax(W_O h^(L)_{T-1})``.
:func:`to_disentangled` and :func:`to_standard` convert between the two with
the same function on every sequence (``h^(ℓ) = Φ_ℓ h̃^(ℓ)``, DESIGN §18);
:func:`catformer_from_reduced` embeds the reduced model (Knowl 8).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from .._validation import ArgumentTypeError, as_int, as_real, as_rng, as_seqs, is_int
from .reduced import softmax

__all__ = [
    "READOUTS", "CatFormer", "CatFormerParams", "StandardTransformer", "to_disentangled", "to_standard",
    "catformer_from_reduced", "catformer_forward", "catformer_backward", "backward_from_logits", "check_task_model",
]

#: The readouts of :class:`CatFormer`: ``"softmax"`` (official code) and ``"linear"`` (theory, loss with ε).
READOUTS = ("softmax", "linear")


class CatFormerParams(NamedTuple):
    """Parameters of a :class:`CatFormer` (immutable container; the arrays are float64).

    Attributes
    ----------
    A : list of ndarray
        ``A[ℓ]`` has shape ``(m_ℓ, d_{ℓ-1}, d_{ℓ-1})``: the attention matrices ``Ã^(ℓ+1)_h``
        of layer ``ℓ + 1``, heads in order.
    W : ndarray, shape (d_L, S)
        Readout at the last position: ``f = softmax(h^(L)_{T-1} W)`` (or linear).
    """

    A: list
    W: np.ndarray

    # -- usable as the mapping of :class:`popgrad.Model`: names ``A_1 … A_L``, ``W`` (tuple behaviour unchanged)
    def keys(self) -> tuple:
        """The parameter names ``("A_1", …, "A_L", "W")`` (:meth:`CatFormer.param_shapes`)."""
        return tuple(f"A_{i + 1}" for i in range(len(self.A))) + ("W",)

    def items(self) -> list:
        """``[(name, array), …]`` in the order of :meth:`keys`."""
        return [(k, self[k]) for k in self.keys()]

    def values(self) -> list:
        """The arrays in the order of :meth:`keys`."""
        return [*self.A, self.W]

    def __getitem__(self, key):
        if isinstance(key, str):
            if key == "W":
                return self.W
            if key.startswith("A_") and key[2:].isdigit() and 1 <= int(key[2:]) <= len(self.A):
                return self.A[int(key[2:]) - 1]
            raise KeyError(key)
        return tuple.__getitem__(self, key)

    @classmethod
    def from_mapping(cls, params) -> "CatFormerParams":
        """The parameters of a mapping ``{"A_1": …, …, "A_L": …, "W": …}`` (as :class:`popgrad.Model` passes
        them)."""
        L = sum(1 for k in params if k != "W")
        return cls([params[f"A_{i + 1}"] for i in range(L)], params["W"])


#: Copies of the parameters a training holds at once (parameters, gradient, optimizer state, workspace).
TRAINING_COPIES = 4


def _check_size(model) -> None:
    """Refuse a model whose training cannot fit in memory, naming its size (issue 32): the parameters
    ``Σ_ℓ m_ℓ d_{ℓ-1}² + d_L S`` as float64, about :data:`TRAINING_COPIES` times over, against half
    of the memory this process may use (:func:`popgrad._io.memory_limit`, ``ulimit -v`` included).
    Python integers throughout: no overflow however large the heads."""
    from .._io import memory_limit, size_text as _bytes

    n = sum(m * d * d for m, d in zip(model._heads, model._dims[:-1])) + model._dims[-1] * model._S
    need = TRAINING_COPIES * 8 * n
    limit = memory_limit()
    if limit is None:
        limit = 2**40
    if need > limit // 2:
        count = f"{n:,}" if n < 10**15 else f"about 10^{len(str(n)) - 1}"
        raise ValueError(
            f"CatFormer(S={model._S}, T={model._T}, heads={_short(model._heads)}) has {count} parameters "
            f"(widths d = {_short(model._dims)}; training holds about {_bytes(need)}), more than half of the "
            f"{_bytes(limit)} this process may use: use fewer heads or layers, or a smaller S or T")


def _short(t) -> str:
    text = str(tuple(t))
    return text if len(text) <= 60 else text[:50] + "...)"


class CatFormer:
    """The disentangled transformer of the official code (``catformer.py``), DESIGN §18.

    Parameters
    ----------
    S : int
        Alphabet size (``≥ 1``).
    T : int
        Sequence length, the query included (``≥ 1``).
    heads : sequence of int, default (1, 1)
        ``m_ℓ ≥ 1`` heads per layer, ``L = len(heads) ≥ 1`` layers.
    readout : {"softmax", "linear"}, default "softmax"
        ``f = softmax(h^(L)_{T-1} W)`` (loss ``-Σ w log f``) or ``f = h^(L)_{T-1} W``
        (loss ``-Σ w log(f + ε)``).

    Attributes
    ----------
    S, T, heads, readout
    dims : tuple of int
        ``(d_0, …, d_L)`` with ``d_0 = S + T`` and ``d_ℓ = (1 + m_ℓ) d_{ℓ-1}``.
    """

    __slots__ = ("_S", "_T", "_heads", "_readout", "_dims")

    def __init__(self, S, T, heads=(1, 1), readout="softmax"):
        self._S = as_int(S, "S", minimum=1)
        self._T = as_int(T, "T", minimum=1)
        if isinstance(heads, (str, bytes)) or not hasattr(heads, "__len__"):
            raise ArgumentTypeError(f"heads must be a sequence of head counts per layer, e.g. (1, 1), got {heads!r}")
        if len(heads) < 1:
            raise ValueError("heads must name at least one layer, e.g. heads=(1, 1)")
        hs = []
        for i, m in enumerate(heads):
            if not is_int(m):
                raise ArgumentTypeError(f"heads[{i}] must be an integer number of heads, got {m!r}")
            if int(m) < 1:
                raise ValueError(f"heads[{i}] = {int(m)} must be >= 1 (every layer has at least one head)")
            hs.append(int(m))
        self._heads = tuple(hs)
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
        self._readout = readout
        d = [self._S + self._T]
        for m in self._heads:
            d.append((1 + m) * d[-1])
        self._dims = tuple(d)
        _check_size(self)

    # ----------------------------------------------------------- attributes
    @property
    def S(self) -> int:
        return self._S

    @property
    def T(self) -> int:
        return self._T

    @property
    def heads(self) -> tuple:
        return self._heads

    @property
    def readout(self) -> str:
        return self._readout

    @property
    def dims(self) -> tuple:
        """``(d_0, …, d_L)``."""
        return self._dims

    @property
    def n_layers(self) -> int:
        return len(self._heads)

    def __repr__(self):
        return f"CatFormer(S={self._S}, T={self._T}, heads={self._heads}, readout={self._readout!r})"

    def __eq__(self, other):
        return isinstance(other, CatFormer) and (self._S, self._T, self._heads, self._readout) == \
            (other._S, other._T, other._heads, other._readout)

    def __hash__(self):
        return hash((self._S, self._T, self._heads, self._readout))

    # ----------------------------------------------------------- parameters
    def shapes(self):
        """``([(m_ℓ, d_{ℓ-1}, d_{ℓ-1}) for each layer], (d_L, S))``."""
        return [(m, d, d) for m, d in zip(self._heads, self._dims[:-1])], (self._dims[-1], self._S)

    def zeros(self) -> CatFormerParams:
        """All-zero parameters (the official single-parent start)."""
        a_shapes, w_shape = self.shapes()
        return CatFormerParams([np.zeros(s) for s in a_shapes], np.zeros(w_shape))

    def init(self, scale, seed) -> CatFormerParams:
        """Seeded start: every ``Ã`` entry ``scale · N(0, 1)``, ``W = 0`` (the official two-parent start, scale 1e-4).

        Parameters
        ----------
        scale : float
            Standard deviation of the entries (``≥ 0``).
        seed : int
            Seed of ``numpy.random.default_rng``; the layers are drawn in order.
        """
        scale = as_real(scale, "scale", minimum=0.0)
        rng = as_rng(seed, "seed")
        a_shapes, w_shape = self.shapes()
        with np.errstate(over="ignore"):
            A = [scale * rng.standard_normal(s) for s in a_shapes]
        if not all(np.all(np.isfinite(a)) for a in A):
            raise ValueError(f"scale = {scale:g} overflows: scale * N(0, 1) is not finite; use a scale of "
                             "order 1e-4 (the official two-parent start) to 1")
        return CatFormerParams(A, np.zeros(w_shape))

    def check_params(self, params) -> CatFormerParams:
        """``params`` as a :class:`CatFormerParams` of contiguous finite float64 arrays of this model's shapes.

        Raises
        ------
        TypeError
            If ``params`` is not a ``(A, W)`` pair.
        ValueError
            On a wrong number of layers, a wrong shape or a non-finite entry (the message names it).
        """
        if isinstance(params, Mapping) and not isinstance(params, tuple):  # the popgrad.Model mapping
            from .protocol import check_params as _check_mapping

            params = CatFormerParams.from_mapping(_check_mapping(self, params))
        if not (isinstance(params, tuple) and len(params) == 2):
            raise ArgumentTypeError(f"params must be a popgrad.CatFormerParams(A, W) (model.zeros() or "
                                    f"model.init(scale, seed)), got {type(params).__name__}")
        A, W = params
        a_shapes, w_shape = self.shapes()
        if isinstance(A, np.ndarray) or not hasattr(A, "__len__") or len(A) != len(a_shapes):
            raise ValueError(f"params.A must be a list of {len(a_shapes)} arrays (one per layer) for {self!r}")
        out = []
        for i, (a, s) in enumerate(zip(A, a_shapes)):
            out.append(_finite(a, s, f"params.A[{i}]"))
        return CatFormerParams(out, _finite(W, w_shape, "params.W"))

    # -------------------------------------------------------------- forward
    def predict(self, params, seqs) -> np.ndarray:
        """Output ``f(s)`` for a batch of sequences (NumPy reference forward, DESIGN §18).

        Parameters
        ----------
        params : CatFormerParams
        seqs : array_like of int, shape (n, T) or (T,)
            Tokens in ``0 … S-1``, query last.

        Returns
        -------
        f : ndarray of float64, shape (n, S)
            ``softmax(h^(L)_{T-1} W)`` (rows are distributions) or ``h^(L)_{T-1} W`` (linear).
        """
        params = self.check_params(params)
        seqs = as_seqs(seqs, self._T, self._S)
        return catformer_forward(self, params, seqs)[0]

    # ------------------------------------------------------ the popgrad.Model protocol (DESIGN §26)
    #: The NumPy backward takes max/abs of real values only where it is real: not complex-safe (the full
    #: model has its own complex-step product, :func:`popgrad.catformer_hvp`).
    complex_safe = False

    def param_shapes(self) -> dict:
        """``{"A_1": (m_1, d_0, d_0), …, "A_L": (m_L, d_{L-1}, d_{L-1}), "W": (d_L, S)}``."""
        a_shapes, w_shape = self.shapes()
        return {**{f"A_{i + 1}": s for i, s in enumerate(a_shapes)}, "W": w_shape}

    def default_eps(self, task) -> float:
        """``0`` for the softmax readout (cross entropy), ``task.default_eps`` for the linear one."""
        return 0.0 if self._readout == "softmax" else float(task.default_eps)

    def loss_and_grad_rows(self, params, seqs, w, eps):
        """``(loss, grads)`` of ``-Σ_n Σ_c w[n, c] log(f[n, c] + ε)`` on given rows (:func:`catformer_backward`),
        ``grads`` under the names of :meth:`param_shapes`."""
        params = self.check_params(params)
        seqs = as_seqs(seqs, self._T, self._S)
        loss, dA, dW = catformer_backward(self, params, seqs, np.asarray(w, dtype=np.float64), float(eps))
        return loss, {**{f"A_{i + 1}": a for i, a in enumerate(dA)}, "W": dW}

    def layer1_attention(self, params, seqs) -> np.ndarray:
        """``(n, m_1, T, T)``: the layer-1 attention ``softmax_rows(MASK(x̃ Ã^(1)_h x̃ᵀ))`` of every sequence."""
        params = self.check_params(params)
        seqs = as_seqs(seqs, self._T, self._S)
        h = embed(self._S, self._T, seqs)
        A = params.A[0]
        return np.stack([_attention(h, A[k]) for k in range(A.shape[0])], axis=1)

    def query_attention(self, params, seqs) -> np.ndarray:
        """``(n, m_2, T)``: the query row of the layer-2 attention of every sequence (``(n, 0, T)`` with one
        layer), the optional member of the protocol the induction-head check reads."""
        params = self.check_params(params)
        seqs = as_seqs(seqs, self._T, self._S)
        if self.n_layers < 2:
            return np.zeros((seqs.shape[0], 0, self._T))
        return catformer_forward(self, params, seqs)[3][1][:, :, self._T - 1, :]


def check_task_model(task, model, params):
    """The one validation of a ``(task, model, params)`` triple (engine, training, checks).

    ``task`` must be a :class:`popgrad.Task` or :class:`popgrad.MultiParentTask`, ``model`` a
    :class:`CatFormer` of the task's ``S`` and ``T``; returns ``model.check_params(params)``
    (``None`` when ``params`` is ``None``).

    Raises
    ------
    TypeError
        A task or model of the wrong type (:class:`popgrad._validation.ArgumentTypeError`).
    ValueError
        ``S`` or ``T`` of the model and the task differ, or a bad ``params`` (the message names it).
    """
    from ..task.tasks import check_task

    check_task(task)
    if not isinstance(model, CatFormer):
        raise ArgumentTypeError(f"model must be a popgrad.CatFormer, got {type(model).__name__}")
    if (model.S, model.T) != (task.S, task.T):
        raise ValueError(f"model has S = {model.S}, T = {model.T} but the task has S = {task.S}, T = {task.T}: "
                         f"use CatFormer({task.S}, {task.T}, ...)")
    return None if params is None else model.check_params(params)


def _finite(a, shape, name) -> np.ndarray:
    try:
        a = np.ascontiguousarray(a, dtype=np.float64)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{name} must be a real array of shape {shape}") from None
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    if not np.all(np.isfinite(a)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ValueError(f"{name}{list(bad)} = {a[bad]} is not finite: parameters must be finite")
    return a


# ============================================================ NumPy reference (forward and backward)
def embed(S, T, seqs) -> np.ndarray:
    """``x̃ (n, T, S+T)``: token one-hot then position one-hot."""
    n = seqs.shape[0]
    x = np.zeros((n, T, S + T))
    x[np.arange(n)[:, None], np.arange(T)[None, :], seqs] = 1.0
    x[:, np.arange(T), S + np.arange(T)] = 1.0
    return x


def _attention(h, A):
    """``softmax_rows(MASK(h A hᵀ))`` for ``h (n, T, d)``, ``A (d, d)``: ``(n, T, T)``, zero above the diagonal."""
    T = h.shape[1]
    z = np.matmul(h @ A, np.swapaxes(h, 1, 2))  # = einsum("nia,ab,njb->nij"); unoptimized einsum is O(n T^2 d^2)
    low = np.tri(T, dtype=bool)
    P = softmax(np.where(low, z, -np.inf), axis=2)
    return np.where(low, P, 0.0)


def catformer_forward(model, params, seqs):
    """Forward pass on clean input: ``(f (n, S), z (n, S), h (n, T, d_L), probs)``.

    ``probs[ℓ]`` is ``(n, m_ℓ, T, T)``, the attention of every head of layer ``ℓ + 1``;
    ``h`` the last layer's rows (its first ``d_ℓ`` coordinates are layer ``ℓ``).
    """
    h = embed(model.S, model.T, seqs)
    probs = []
    for A in params.A:
        Ps = np.stack([_attention(h, A[k]) for k in range(A.shape[0])], axis=1)
        probs.append(Ps)
        h = np.concatenate([h] + [Ps[:, k] @ h for k in range(A.shape[0])], axis=2)
    z = h[:, -1, :] @ params.W
    f = softmax(z, axis=1) if model.readout == "softmax" else z
    return f, z, h, probs


def catformer_backward(model, params, seqs, w, eps):
    """Loss and gradients summed over a batch (NumPy reference of the engine): ``(loss, dA list, dW)``.

    ``L = -Σ_m Σ_c w[m, c] log(f_c(s_m) + ε)`` (``ε = 0`` with the softmax readout: log-softmax).
    Reverse mode written out: for a head ``out = P h`` with ``P = softmax(MASK(h Ã hᵀ))``,
    ``dP = d(out) hᵀ``, ``dZ = P ⊙ (dP - rowsum(P ⊙ dP))``, ``dÃ = Σ hᵀ dZ h``,
    ``dh += Pᵀ d(out) + dZ h Ãᵀ + dZᵀ h Ã``.
    """
    f, z, h, probs = catformer_forward(model, params, seqs)
    pos = w > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        if model.readout == "softmax" and eps == 0.0:
            zmax = z.max(axis=1, keepdims=True)
            logf = z - zmax - np.log(np.sum(np.exp(z - zmax), axis=1, keepdims=True))
            loss = -float(np.sum(w[pos] * logf[pos]))
            dz = -w + f * w.sum(axis=1, keepdims=True)
        else:
            fe = f + eps
            loss = -float(np.sum(w[pos] * np.log(fe[pos])))
            r = np.where(pos, -w / np.where(pos, fe, 1.0), 0.0)  # dL/df
            dz = f * (r - np.sum(f * r, axis=1, keepdims=True)) if model.readout == "softmax" else r
    dA, dW = backward_from_logits(model, params, h, probs, dz)
    return loss, dA, dW


def backward_from_logits(model, params, h, probs, dz, per_row: bool = False):
    """``(dA list, dW)`` from the adjoint ``dz`` (n, S) of the logits, given the forward pass's ``h`` and
    ``probs`` (:func:`catformer_forward`): summed over the batch, or per row (``per_row``: ``dA[ℓ]`` is
    ``(n, m_ℓ, d, d)`` and ``dW`` is ``(n, d_L, S)``; the per-sequence Jacobians of
    :func:`popgrad.checks.linear_response.logit_jacobian`). The reverse mode of :func:`catformer_backward`.
    """
    n = h.shape[0]
    dW = h[:, -1, :, None] * dz[:, None, :] if per_row else h[:, -1, :].T @ dz
    dh = np.zeros_like(h)
    dh[:, -1, :] = dz @ params.W.T
    dims = model.dims
    dA = [None] * len(params.A)
    for l in range(len(params.A) - 1, -1, -1):
        A, Ps, d = params.A[l], probs[l], dims[l]
        hin = h[:, :, :d]
        g = dh[:, :, :d].copy()
        dAl = np.zeros(((n,) if per_row else ()) + A.shape)
        for k in range(A.shape[0]):
            P = Ps[:, k]
            go = dh[:, :, d * (1 + k): d * (2 + k)]
            dP = go @ hin.transpose(0, 2, 1)
            g += P.transpose(0, 2, 1) @ go
            dZ = P * (dP - np.sum(P * dP, axis=2, keepdims=True))
            if per_row:
                dAl[:, k] = np.einsum("nia,nij,njb->nab", hin, dZ, hin)
            else:
                dAl[k] = np.einsum("nia,nij,njb->ab", hin, dZ, hin)
            g += dZ @ hin @ A[k].T + dZ.transpose(0, 2, 1) @ hin @ A[k]
        dA[l] = dAl
        dh = np.concatenate([g, np.zeros((n, h.shape[1], h.shape[2] - d))], axis=2)
    return dA, dW


# ============================================================ Knowl 7: the standard transformer
class StandardTransformer:
    """An attention-only standard transformer with residual stream (DESIGN §18, Knowl 7).

    Parameters
    ----------
    E : array_like, shape (d, S)
        Token embeddings (``E e_s`` is column ``s``).
    P : array_like, shape (d, T)
        Position embeddings.
    layers : list of lists of (Q, K, V)
        ``layers[ℓ][h] = (Q, K, V)``, each ``(d, d)``:
        ``h^(ℓ) = h^(ℓ-1) + Σ_h softmax(MASK(h Q Kᵀ hᵀ)) h Vᵀ``.
    W_O : array_like, shape (S, d)
        Output ``f = softmax(W_O h^(L)_{T-1})`` (or ``W_O h^(L)_{T-1}`` for ``readout="linear"``).
    readout : {"softmax", "linear"}
    """

    __slots__ = ("E", "P", "layers", "W_O", "readout")

    def __init__(self, E, P, layers, W_O, readout="softmax"):
        E = np.asarray(E, dtype=np.float64)
        if E.ndim != 2:
            raise ValueError(f"E must have shape (d, S), got {E.shape}")
        d, S = E.shape
        self.E = _finite(E, (d, S), "E")
        P = np.asarray(P, dtype=np.float64)
        if P.ndim != 2 or P.shape[0] != d:
            raise ValueError(f"P must have shape (d, T) = ({d}, T), got {P.shape}")
        self.P = _finite(P, P.shape, "P")
        if isinstance(layers, np.ndarray) or not hasattr(layers, "__len__") or len(layers) < 1:
            raise ValueError("layers must be a non-empty list over layers of lists of (Q, K, V)")
        out = []
        for l, heads in enumerate(layers):
            if not hasattr(heads, "__len__") or len(heads) < 1:
                raise ValueError(f"layers[{l}] must be a non-empty list of (Q, K, V) triples")
            hs = []
            for k, qkv in enumerate(heads):
                if not hasattr(qkv, "__len__") or len(qkv) != 3:
                    raise ValueError(f"layers[{l}][{k}] must be a (Q, K, V) triple")
                hs.append(tuple(_finite(M, (d, d), f"layers[{l}][{k}][{i}]") for i, M in enumerate(qkv)))
            out.append(hs)
        self.layers = out
        self.W_O = _finite(W_O, (S, d), "W_O")
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
        self.readout = readout

    @property
    def S(self) -> int:
        return self.E.shape[1]

    @property
    def T(self) -> int:
        return self.P.shape[1]

    @property
    def d(self) -> int:
        return self.E.shape[0]

    def predict(self, seqs) -> np.ndarray:
        """``f (n, S)`` for a batch of sequences ``(n, T)`` (NumPy forward)."""
        seqs = as_seqs(seqs, self.T, self.S)
        h = self.E.T[seqs] + self.P.T[None, :, :]  # (n, T, d)
        for heads in self.layers:
            upd = np.zeros_like(h)
            for Q, K, V in heads:
                upd += (_attention(h, Q @ K.T) @ h) @ V.T
            h = h + upd
        z = h[:, -1, :] @ self.W_O.T
        return softmax(z, axis=1) if self.readout == "softmax" else z


def to_disentangled(std):
    """The disentangled model with the same function as ``std`` (Knowl 7): ``(CatFormer, CatFormerParams)``.

    With ``h^(ℓ) = Φ_ℓ h̃^(ℓ)``: ``Φ_0 = [E, P]``, ``Ã_h = Φ_{ℓ-1}ᵀ Q_h K_hᵀ Φ_{ℓ-1}``,
    ``Φ_ℓ = [Φ_{ℓ-1}, V_1 Φ_{ℓ-1}, …, V_m Φ_{ℓ-1}]``, ``W = (W_O Φ_L)ᵀ``.
    """
    if not isinstance(std, StandardTransformer):
        raise ArgumentTypeError(f"std must be a popgrad.StandardTransformer, got {type(std).__name__}")
    Phi = np.concatenate([std.E, std.P], axis=1)
    A = []
    for heads in std.layers:
        A.append(np.stack([Phi.T @ Q @ K.T @ Phi for Q, K, _ in heads]))
        Phi = np.concatenate([Phi] + [V @ Phi for _, _, V in heads], axis=1)
    model = CatFormer(std.S, std.T, heads=tuple(len(h) for h in std.layers), readout=std.readout)
    return model, CatFormerParams(A, np.ascontiguousarray((std.W_O @ Phi).T))


def to_standard(model, params) -> StandardTransformer:
    """A standard transformer of width ``d = d_L`` with the same function (Knowl 7, the converse).

    ``h̃^(ℓ)`` sits in the first ``d_ℓ`` coordinates (``Ψ`` the embedding): ``E = [I_S; 0]``,
    ``P = [0; I_T; 0]``, ``Q_h = Ψ Ã_h Ψᵀ``, ``K_h = I``, ``V_h`` copies coordinates ``0 … d_{ℓ-1}-1``
    into head ``h``'s block ``d_{ℓ-1}(1 + h) …``; ``W_O = Wᵀ``.
    """
    if not isinstance(model, CatFormer):
        raise ArgumentTypeError(f"model must be a popgrad.CatFormer, got {type(model).__name__}")
    params = model.check_params(params)
    S, T, dims = model.S, model.T, model.dims
    D = dims[-1]
    E = np.zeros((D, S))
    E[np.arange(S), np.arange(S)] = 1.0
    P = np.zeros((D, T))
    P[S + np.arange(T), np.arange(T)] = 1.0
    layers = []
    for l, A in enumerate(params.A):
        d = dims[l]
        heads = []
        for k in range(A.shape[0]):
            Q = np.zeros((D, D))
            Q[:d, :d] = A[k]
            V = np.zeros((D, D))
            V[d * (1 + k) + np.arange(d), np.arange(d)] = 1.0
            heads.append((Q, np.eye(D), V))
        layers.append(heads)
    return StandardTransformer(E, P, layers, params.W.T.copy(), readout=model.readout)


def catformer_from_reduced(A1, A2, S, T):
    """The reduced model (DESIGN §3) as a disentangled transformer with block-sparse weights (Knowl 8).

    ``Ã^(1)[S:, S:] = A1`` (position-position), zero elsewhere; ``Ã^(2)[0:S, d_0:d_0+S] = A2`` (query
    token × layer-1 output token part); ``W[2 d_0 + c, c] = 1`` (the layer-2 output's token part), linear
    readout. Then ``model.predict(params, seqs) == popgrad.predict(A1, A2, seqs)`` on every sequence and
    the ε-loss equals :func:`popgrad.exact_loss`.

    Returns
    -------
    (CatFormer, CatFormerParams)
        ``heads=(1, 1)``, ``readout="linear"``.
    """
    S = as_int(S, "S", minimum=1)
    T = as_int(T, "T", minimum=1)
    A1 = _finite(A1, (T, T), "A1")
    A2 = _finite(A2, (S, S), "A2")
    model = CatFormer(S, T, heads=(1, 1), readout="linear")
    params = model.zeros()
    d0 = S + T
    params.A[0][0, S:, S:] = A1
    params.A[1][0, :S, d0:d0 + S] = A2
    params.W[2 * d0 + np.arange(S), np.arange(S)] = 1.0
    return model, params


def _n_params(model) -> int:
    a_shapes, w_shape = model.shapes()
    return int(sum(math.prod(s) for s in a_shapes) + math.prod(w_shape))
