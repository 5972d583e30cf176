"""The reduced two-layer model of the paper as a :class:`popgrad.Model` (DESIGN §3, §4, §9): ``ReducedModel``.

``ReducedModel(S, T)`` is the single-parent model of DESIGN §3 (parameters ``A1 (T, T)``, ``A2 (S, S)``);
``ReducedModel(S, T, heads=k)`` the k-head model of DESIGN §9 (``A1 (k, T, T)``, ``A2 (k, S, S)``).
The forward pass is :func:`popgrad.predict` / :func:`popgrad.predict_multi`; the backward here is the
NumPy reference of DESIGN §4 (and of the k-head equations), written for whole arrays and holomorphic
(the softmax shift uses the real part), so the complex-step Hessian-vector product runs through it.
The exact front end :func:`popgrad.loss_and_grad` sends this model to the fast engines
(:func:`popgrad.exact_loss_and_grad`: prefix / direct, k heads) when the task kind matches
(``heads=1`` on a :class:`popgrad.Task`, ``heads=k`` on a :class:`popgrad.MultiParentTask` with ``k``
parents); any other pairing runs the generic exact engine on these rows.
"""
from __future__ import annotations

import numpy as np

from .._validation import as_int, as_real, as_rng, as_seqs
from .multihead import predict_multi
from .reduced import predict as _predict_single

__all__ = ["ReducedModel", "masked_softmax", "reduced_rows", "multi_rows"]


def masked_softmax(A1) -> np.ndarray:
    """``softmax_rows(MASK(A1))`` over the last two axes, zero above the diagonal (holomorphic for complex input)."""
    T = A1.shape[-1]
    low = np.tri(T, dtype=bool)
    z = np.where(low, A1, -np.inf)
    e = np.exp(z - np.max(z.real, axis=-1, keepdims=True))
    e = np.where(low, e, 0.0)
    return e / e.sum(axis=-1, keepdims=True)


def _softmax_rows(u):
    e = np.exp(u - np.max(u.real, axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _readout(a, seqs, S):
    f = np.zeros((seqs.shape[0], S), dtype=a.dtype)
    for c in range(S):
        f[:, c] = np.sum(a * (seqs == c), axis=1)
    return f


def _loss_and_r(f, w, eps):
    """``loss = -Σ_{w>0} w log(f + ε)`` and ``r = ∂loss/∂f`` (zero where ``w = 0``)."""
    pos = w > 0
    fe = f + eps
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = -np.sum(np.where(pos, w * np.log(np.where(pos, fe, 1.0)), 0.0))
        r = np.where(pos, -w / np.where(pos, fe, 1.0), 0.0)
    return loss, r


def _jacobian(P, G):
    """``P ⊙ (G - rowsum(P ⊙ G))`` on and below the diagonal (the layer-1 softmax Jacobian)."""
    low = np.tri(P.shape[-1], dtype=bool)
    G = np.where(low, G, 0.0)
    return np.where(low, P * (G - np.sum(P * G, axis=-1, keepdims=True)), 0.0)


def reduced_rows(A1, A2, seqs, w, eps):
    """Single-parent rows (DESIGN §3–§4): ``(loss, dA1, dA2)`` summed over the rows with weights ``w``."""
    S = A2.shape[0]
    P = masked_softmax(A1)
    q = seqs[:, -1]
    V = A2[q[:, None], seqs]  # (n, T): A2[q, s_j]
    a = _softmax_rows(V @ P.T)
    f = _readout(a, seqs, S)
    loss, r = _loss_and_r(f, w, eps)
    rbar = np.sum(f * r, axis=1)
    delta = a * (np.take_along_axis(r, seqs, axis=1) - rbar[:, None])
    G = delta.T @ V
    E = delta @ P
    dA2 = np.zeros((S * S,), dtype=E.dtype)
    np.add.at(dA2, (q[:, None] * S + seqs).ravel(), E.ravel())
    return loss, _jacobian(P, G), dA2.reshape(S, S)


def multi_rows(A1, A2, seqs, w, eps):
    """k-head rows (DESIGN §9): ``(loss, dA1 (k, T, T), dA2 (k, S, S))`` summed over the rows with weights ``w``."""
    k, S, T = A2.shape[0], A2.shape[1], seqs.shape[1]
    P = masked_softmax(A1)
    X = (seqs[:, :, None] == np.arange(S)).astype(np.float64)  # (n, T, S)
    H = np.stack([np.matmul(P[h], X) for h in range(k)], axis=1)  # (n, k, T, S)
    Q = H[:, :, -1, :]
    kappa = np.stack([Q[:, h, :] @ A2[h] for h in range(k)], axis=1)  # κ^h = A2^hᵀ Q^h
    a = _softmax_rows(np.sum(H * kappa[:, :, None, :], axis=(1, 3)))
    f = _readout(a, seqs, S)
    loss, r = _loss_and_r(f, w, eps)
    rbar = np.sum(f * r, axis=1)
    delta = a * (np.take_along_axis(r, seqs, axis=1) - rbar[:, None])
    eta = np.einsum("ni,nhic->nhc", delta, H)
    dA2 = np.einsum("nhb,nhc->hbc", Q, eta)
    zeta = np.einsum("hbc,nhc->nhb", A2, eta)
    idx = np.broadcast_to(seqs[:, None, :], (seqs.shape[0], k, T))
    G = np.einsum("ni,nhj->hij", delta, np.take_along_axis(kappa, idx, axis=2))
    G[:, T - 1, :] += np.take_along_axis(zeta, idx, axis=2).sum(axis=0)
    return loss, _jacobian(P, G), dA2


class ReducedModel:
    """The reduced two-layer transformer (DESIGN §3; ``heads=k``: the k-head model of DESIGN §9) as a
    :class:`popgrad.Model`, parameters ``A1`` and ``A2``.

    Parameters
    ----------
    S : int
        Alphabet size (``>= 1``).
    T : int
        Sequence length, the query included (``>= 1``).
    heads : int, default 1
        ``1``: ``A1 (T, T)``, ``A2 (S, S)``, the single-parent model; ``k >= 2``: ``A1 (k, T, T)``,
        ``A2 (k, S, S)``, the k-head model (for k-parent tasks).

    Examples
    --------
    >>> import numpy as np, popgrad as pg
    >>> task = pg.Task(pg.chain(4), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=2, seed=0))
    >>> model = pg.ReducedModel(2, 4)
    >>> params = model.start(beta0=1.0)          # Algorithm 1's start: A1 = 0, A2 = β0·I
    >>> res = pg.loss_and_grad(task, model, params)
    >>> sorted(res.grads), res.engine
    (['A1', 'A2'], 'reduced')
    >>> bool(np.isclose(res.loss, pg.exact_loss(task, params["A1"], params["A2"])))
    True
    """

    __slots__ = ("_S", "_T", "_heads")
    #: The backward pass is holomorphic: the complex-step Hessian-vector product may run through it.
    complex_safe = True

    def __init__(self, S, T, heads=1):
        self._S = as_int(S, "S", minimum=1)
        self._T = as_int(T, "T", minimum=1)
        self._heads = as_int(heads, "heads", minimum=1)

    @property
    def S(self) -> int:
        return self._S

    @property
    def T(self) -> int:
        return self._T

    @property
    def heads(self) -> int:
        return self._heads

    def __repr__(self):
        return f"ReducedModel(S={self._S}, T={self._T}" + (f", heads={self._heads})" if self._heads > 1 else ")")

    def __eq__(self, other):
        return isinstance(other, ReducedModel) and (self._S, self._T, self._heads) == (other._S, other._T, other._heads)

    def __hash__(self):
        return hash((ReducedModel, self._S, self._T, self._heads))

    def __reduce__(self):
        return ReducedModel, (self._S, self._T, self._heads)

    # ------------------------------------------------------------------ the protocol
    def param_shapes(self) -> dict:
        """``{"A1": (T, T), "A2": (S, S)}`` (``(k, T, T)``, ``(k, S, S)`` with ``k`` heads)."""
        S, T, k = self._S, self._T, self._heads
        return {"A1": (T, T), "A2": (S, S)} if k == 1 else {"A1": (k, T, T), "A2": (k, S, S)}

    def init(self, scale, seed) -> dict:
        """Every entry ``scale · N(0, 1)`` from ``numpy.random.default_rng(seed)`` (``A1`` drawn first)."""
        scale = as_real(scale, "scale", minimum=0.0)
        rng = as_rng(seed, "seed")
        return {k: scale * rng.standard_normal(s) for k, s in self.param_shapes().items()}

    def start(self, beta0: float) -> dict:
        """Algorithm 1's start: ``A1 = 0``, ``A2 = β0·I`` (every head)."""
        beta0 = as_real(beta0, "beta0")
        s = self.param_shapes()
        return {"A1": np.zeros(s["A1"]), "A2": np.broadcast_to(beta0 * np.eye(self._S), s["A2"]).copy()}

    def default_eps(self, task) -> float:
        """The paper's loss perturbation ``T_eff**-0.5`` (DESIGN §3)."""
        return float(task.default_eps)

    def predict(self, params, seqs) -> np.ndarray:
        """``f (n, S)``: :func:`popgrad.predict` (one head) or :func:`popgrad.predict_multi` (k heads)."""
        from .protocol import check_params

        p = check_params(self, params)
        seqs = as_seqs(seqs, self._T, self._S)
        if self._heads == 1:
            return _predict_single(p["A1"], p["A2"], seqs)
        return predict_multi(p["A1"], p["A2"], seqs)

    def loss_and_grad_rows(self, params, seqs, w, eps):
        """``(loss, {"A1": dA1, "A2": dA2})`` of ``-Σ_n Σ_c w[n, c] log(f[n, c] + ε)`` (DESIGN §4; complex-safe)."""
        A1, A2 = np.asarray(params["A1"]), np.asarray(params["A2"])
        seqs = np.asarray(seqs, dtype=np.int64)
        w = np.asarray(w, dtype=np.float64)
        rows = reduced_rows if self._heads == 1 else multi_rows
        loss, dA1, dA2 = rows(A1, A2, seqs, w, float(eps))
        return (loss if np.iscomplexobj(loss) else float(loss)), {"A1": dA1, "A2": dA2}

    def layer1_attention(self, params, seqs) -> np.ndarray:
        """``(n, H, T, T)``: ``softmax_rows(MASK(A1))`` of every head, the same for every sequence."""
        A1 = np.asarray(params["A1"], dtype=np.float64)
        P = masked_softmax(A1.reshape((-1, self._T, self._T)))
        n = np.asarray(seqs).reshape(-1, self._T).shape[0]
        return np.broadcast_to(P, (n,) + P.shape).copy()

    def query_attention(self, params, seqs) -> np.ndarray:
        """``(n, 1, T)``: the query's layer-2 attention ``softmax_j(A2[s_T, ·] · (P x)_j)`` over the positions
        (k heads: ``softmax_j(Σ_h (P^h x)_j · A2^h{}ᵀ (P^h x)_T)``, one softmax), the optional member of
        :class:`popgrad.Model` the induction-head check reads."""
        A1 = np.asarray(params["A1"], dtype=np.float64)
        A2 = np.asarray(params["A2"], dtype=np.float64)
        seqs = np.asarray(seqs, dtype=np.int64).reshape(-1, self._T)
        if self._heads == 1:
            P = masked_softmax(A1)
            V = A2[seqs[:, -1][:, None], seqs]  # (n, T): A2[q, s_j]
            return _softmax_rows(V @ P.T)[:, None, :]
        P = masked_softmax(A1)
        X = (seqs[:, :, None] == np.arange(self._S)).astype(np.float64)
        H = np.stack([np.matmul(P[h], X) for h in range(self._heads)], axis=1)  # (n, k, T, S)
        kappa = np.stack([H[:, h, -1, :] @ A2[h] for h in range(self._heads)], axis=1)
        return _softmax_rows(np.sum(H * kappa[:, :, None, :], axis=(1, 3)))[:, None, :]

    # ------------------------------------------------------------------ the fast engines
    def fast_task(self, task) -> bool:
        """Whether the fast engines of :func:`popgrad.exact_loss_and_grad` serve this model on ``task``."""
        from ..task.tasks import MultiParentTask, Task

        if self._heads == 1:
            return isinstance(task, Task)
        return isinstance(task, MultiParentTask) and task.k == self._heads
