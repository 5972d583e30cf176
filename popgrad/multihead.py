"""The k-head reduced model: forward pass, exact loss and gradients, references (DESIGN §9, "Knowl 9").

Model
-----
Parameters ``A1`` of shape ``(k, T, T)`` (head ``h`` uses the lower
triangle of ``A1[h]``, diagonal included) and ``A2`` of shape ``(k, S, S)``.
For a sequence ``s`` with one-hot rows ``X = [e_{s_0}, …, e_{s_{T-1}}]ᵀ``::

    P^h   = softmax_rows(MASK(A1^h))                 # T×T, as popgrad.model.first_layer_attention
    H^h   = P^h X,   H^h_i = Σ_{j≤i} P^h[i,j] e_{s_j}  # layer-1 output of head h at position i
    Q^h   = H^h_{T-1}                                # the query of head h (the last position's output)
    u_i   = Σ_h (Q^h)ᵀ A2^h H^h_i = Σ_h <κ^h, H^h_i>,   κ^h = (A2^h)ᵀ Q^h
    a     = softmax(u),   f_c = Σ_i a_i [s_i = c]
    L     = -Σ_s Σ_c w(s,c) log(f_c(s) + ε)          # w of popgrad.multiparent, ε = T_eff^{-1/2}

Head ``h`` is meant to copy the ``h``-th parent: row ``i < T-1`` attends to
``p(i)_h`` and the last row to the target's ``h``-th parent, so that ``u_i``
counts the parent slots of ``i`` whose tokens match the target's parents
(the construction of "Knowl 9": ``A1^h = β1·adjacency(h)``,
``A2^h = β2·I``).

**k = 1.** With one head whose last row attends to itself
(``P[T-1] = e_{T-1}``, e.g. ``A1[T-1, :T-1] = -1000``), ``Q = e_{s_{T-1}}`` and
``u_i = Σ_j P[i,j] A2[q, s_j]``: exactly the single-parent model of DESIGN §3
(whose query is the raw token ``e_q``, keys ``P``'s rows), and the loss and
both gradients equal :func:`popgrad.exact_loss_and_grad`'s (tested to 1e-12).

Exact backward pass (the generalization of DESIGN §4)
------------------------------------------------------
Per sequence, with ``ℓ = -Σ_c w_c log(f_c + ε)``::

    r_c   = -w_c / (f_c + ε),   r̄ = Σ_c f_c r_c,   δ_i = ∂ℓ/∂u_i = a_i (r_{s_i} - r̄)

``u_i`` is bilinear in the query ``Q^h`` and the key ``H^h_i``, and
``∂u_i / ∂A2^h[b', b] = Q^h[b'] H^h_i[b]``, so::

    η^h          = Σ_i δ_i H^h_i                           (S-vector)
    ∂ℓ/∂A2^h     = Q^h (η^h)ᵀ                               (an outer product: S×S)

``H^h_i`` is the key of position ``i`` and ``H^h_{T-1}`` is also the query
of every score, so::

    ζ^h          = Σ_{i'} δ_{i'} A2^h H^h_{i'} = A2^h η^h    (∂ℓ/∂Q^h)
    ∂ℓ/∂H^h_i    = δ_i κ^h + [i = T-1] ζ^h

and ``∂H^h_i / ∂P^h[i, j] = e_{s_j}`` gives, for ``j ≤ i``::

    G^h[i, j]    = Σ_s ( δ_i κ^h[s_j] + [i = T-1] ζ^h[s_j] )      (G^h = ∂L/∂P^h)
    dA2^h        = Σ_s Q^h (η^h)ᵀ
    dA1^h[i, :]  = P^h[i,:] ⊙ (G^h[i,:] - <P^h[i,:], G^h[i,:]>)   (softmax Jacobian, once, after the sum)

For ``k = 1`` and ``P[T-1] = e_{T-1}``: ``κ = A2[q, :]``, so
``G[i, j] = Σ δ_i A2[q, s_j]`` and ``dA2[q, b] = Σ δ_i Σ_j P[i,j][s_j = b]``:
DESIGN §4 term by term; the extra ``ζ`` term of row ``T-1`` is annihilated
by the Jacobian ``J(e_{T-1}) = 0``.

Invariants (tested): ``Σ_i δ_i = 0``, so every row of ``dA2^h`` sums to
``Q^h[b'] Σ_i δ_i = 0``; every row of ``dA1^h`` sums to 0 and ``dA1^h`` is
zero above the diagonal; adding a constant ``c`` to row ``b'`` of ``A2^h``
adds ``c Q^h[b']`` to every ``u_i`` (rows of ``H^h`` sum to 1) and changes
nothing, as does adding a constant to a row of ``A1^h``; permuting the heads
(``A1`` and ``A2`` together) changes nothing.

Engines: :func:`exact_loss_and_grad_multi` runs the numba prefix kernel of
:mod:`popgrad._kernels_multi` (fixed blocks, per-block slots summed in
order: bit-identical for any thread count);
:func:`exact_loss_and_grad_multi_numpy` is the plain-NumPy reference of the
equations above over chunks of sequences.

Reference losses (exact for the finite prior)
---------------------------------------------
* :func:`optimal_loss_multi`: ``L* = -E_{π,s}[Σ_c π(c|s_tp) log π(c|s_tp)]`` (knows π);
* :func:`bayes_loss_multi`: ``H(y | s) = -Σ_s Σ_c w log(w / Σ_c' w)``;
* :func:`count_estimator_loss_multi`: the multi-parent transition-count
  estimator of "Knowl 9" (or, ``model_limit=True``, the ``β → ∞`` limit of
  the model at the construction);
* :func:`construction_loss_multi`: the model's loss at ``A1^h = β1·adjacency(h)``,
  ``A2^h = β2·I``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import _kernels_multi
from .exact import _check_eps, _check_real, _warn_inf
from .model import _check_seqs, first_layer_attention, softmax
from .multiparent import MultiParentGraph, MultiParentTask, sequence_weights_multi_numpy

__all__ = [
    "MultiLossAndGrad",
    "head_attention",
    "predict_multi",
    "exact_loss_and_grad_multi",
    "exact_loss_multi",
    "exact_loss_and_grad_multi_numpy",
    "optimal_loss_multi",
    "bayes_loss_multi",
    "count_estimator_predict_multi",
    "count_estimator_loss_multi",
    "construction_params",
    "construction_loss_multi",
]

#: Smallest number of sequences per block of the prefix kernel.
BLOCK_SEQUENCES = 4096
#: Largest number of blocks (one ``k×T×T`` slot each).
MAX_BLOCKS = 1024
#: Smaller tasks run on the calling thread (waking the pool costs more than it saves).
PARALLEL_MIN_SEQUENCES = 2**15
#: Sequences per chunk of the NumPy reference and the reference losses.
NUMPY_CHUNK = 2**13


class MultiLossAndGrad(NamedTuple):
    """Exact population loss of the k-head model and its gradients (immutable).

    Attributes
    ----------
    loss : float
        ``L = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)``; ``inf`` when ``ε = 0`` and a
        token with positive weight gets zero predicted mass.
    dA1 : ndarray of float64, shape (k, T, T)
        ``∂L/∂A1^h``; zero above each diagonal, every row sums to 0.
    dA2 : ndarray of float64, shape (k, S, S)
        ``∂L/∂A2^h``; every row sums to 0.
    """

    loss: float
    dA1: np.ndarray
    dA2: np.ndarray


# ================================================================== forward
def head_attention(A1) -> np.ndarray:
    """First-layer attention of every head, ``P^h = softmax_rows(MASK(A1^h))``.

    Parameters
    ----------
    A1 : array_like, shape (k, T, T)
        Finite; entries above each diagonal are ignored.

    Returns
    -------
    P : ndarray of float64, shape (k, T, T)
        Row-stochastic, lower triangular per head
        (:func:`popgrad.model.first_layer_attention` of each head).
    """
    A1 = _check_heads(A1, "A1")
    return np.stack([first_layer_attention(A1[h]) for h in range(A1.shape[0])])


def predict_multi(A1, A2, seqs) -> np.ndarray:
    """Output distributions ``f(s)`` of the k-head model (module docstring), NumPy reference.

    Parameters
    ----------
    A1 : array_like, shape (k, T, T)
    A2 : array_like, shape (k, S, S)
        ``A2[h][b', b]`` scores a key token mixture ``b`` against the query mixture ``b'``.
    seqs : array_like of int, shape (n, T) or (T,)

    Returns
    -------
    f : ndarray of float64, shape (n, S)
        Rows are probability distributions.
    """
    A2 = _check_heads(A2, "A2")
    P = head_attention(A1)
    if P.shape[0] != A2.shape[0] or A2.shape[1] != A2.shape[2]:
        raise ValueError(f"A2 must have shape (k, S, S) with k = {P.shape[0]} heads like A1, got {A2.shape}")
    seqs = _check_seqs(seqs, P.shape[1], A2.shape[1])
    return _forward(P, A2, seqs)[0]


def _forward(P, A2, seqs):
    """``(f, a, H, Q, kappa, onehot)`` of a batch on clean arrays."""
    S = A2.shape[1]
    onehot = (seqs[:, :, None] == np.arange(S)).astype(np.float64)  # (n, T, S)
    H = np.einsum("hij,njc->nhic", P, onehot)  # (n, k, T, S)
    Q = H[:, :, -1, :]  # (n, k, S)
    kappa = np.einsum("nhb,hbc->nhc", Q, A2)  # κ^h = A2^hᵀ Q^h
    u = np.einsum("nhic,nhc->ni", H, kappa)
    a = softmax(u, axis=1)
    f = np.einsum("ni,nic->nc", a, onehot)
    return f, a, H, Q, kappa, onehot


# =============================================================== exact API
def exact_loss_and_grad_multi(task, A1, A2, eps=None) -> MultiLossAndGrad:
    """Exact population loss and gradients of the k-head model (module docstring).

    Parameters
    ----------
    task : MultiParentTask
        ``S**T`` must pass ``task.check_size()``.
    A1 : array_like, shape (k, T, T)
        Finite (a ``(T, T)`` array is accepted when ``k = 1``).
    A2 : array_like, shape (k, S, S)
        Finite (``(S, S)`` accepted when ``k = 1``).
    eps : float, optional
        ``ε ≥ 0``; default ``task.default_eps``. With ``ε = 0`` an infinite
        loss gives a ``RuntimeWarning`` and NaN gradients.

    Returns
    -------
    MultiLossAndGrad
        ``loss``, ``dA1 (k, T, T)``, ``dA2 (k, S, S)``.

    Raises
    ------
    ValueError
        Wrong shapes, non-finite entries, invalid ``eps``.
    TaskTooLargeError
        ``S**T`` over ``task.max_sequences`` (before any work).
    """
    A1, A2, eps = _validate(task, A1, A2, eps)
    return _exact(task, A1, A2, eps, want_grad=True)


def exact_loss_multi(task, A1, A2, eps=None) -> float:
    """Exact population loss only (forward pass); as :func:`exact_loss_and_grad_multi`."""
    A1, A2, eps = _validate(task, A1, A2, eps)
    return _exact(task, A1, A2, eps, want_grad=False).loss


def exact_loss_and_grad_multi_numpy(task, A1, A2, eps=None) -> MultiLossAndGrad:
    """Plain-NumPy reference of :func:`exact_loss_and_grad_multi` (same result, slower).

    Chunks of :data:`NUMPY_CHUNK` sequences, weights from
    :func:`popgrad.multiparent.sequence_weights_multi_numpy`, the equations
    of the module docstring with whole-chunk arrays (``einsum``); independent
    of the numba kernels.
    """
    A1, A2, eps = _validate(task, A1, A2, eps)
    P = head_attention(A1)
    loss, G, dA2 = _numpy_sums(task, P, A2, eps, 0, task.n_sequences)
    return _finish(loss, G, dA2, P)


# ======================================================== implementation
def _n_fixed(S, T) -> int:
    """Leading positions fixed per block: blocks of ``≥ BLOCK_SEQUENCES``, at most ``MAX_BLOCKS``; ``S``, ``T`` only."""
    D = 0
    while D < T - 1 and S ** (T - D - 1) >= BLOCK_SEQUENCES and S ** (D + 1) <= MAX_BLOCKS:
        D += 1
    return D


def _exact(task, A1, A2, eps, want_grad) -> MultiLossAndGrad:
    task.check_size()
    S, T, k = task.S, task.T, task.k
    P = np.ascontiguousarray(head_attention(A1))
    A2 = np.ascontiguousarray(A2, dtype=np.float64)
    parents, tp, atoms, pk0 = task.kernel_arrays()
    D = _n_fixed(S, T)
    n_blocks = S**D
    loss_s = np.zeros(n_blocks)
    G_s = np.zeros((n_blocks, k, T, T) if want_grad else (n_blocks, k, 1, 1))
    dA2_s = np.zeros((n_blocks, k, S, S) if want_grad else (n_blocks, k, 1, 1))
    parallel = n_blocks > 1 and task.n_sequences >= PARALLEL_MIN_SEQUENCES
    kernel = _kernels_multi.loss_grad_multi if parallel else _kernels_multi.loss_grad_multi_serial
    kernel(parents, tp, atoms, pk0, P, A2, float(eps), D, bool(want_grad), loss_s, G_s, dA2_s)
    loss = float(_kernels_multi.sum_slots(loss_s, G_s, dA2_s))  # block order; totals in slot 0
    if not want_grad:
        if math.isinf(loss):
            _warn_inf("exact_loss_multi")
        return MultiLossAndGrad(loss, None, None)
    return _finish(loss, G_s[0], dA2_s[0], P)


def _finish(loss, G, dA2, P) -> MultiLossAndGrad:
    """Apply each head's softmax Jacobian once: ``dA1^h[i] = P^h[i] ⊙ (G^h[i] - <P^h[i], G^h[i]>)``."""
    T = P.shape[1]
    low = np.tri(T, dtype=bool)
    G = np.where(low, G, 0.0)
    dA1 = P * (G - np.sum(P * G, axis=2, keepdims=True))
    dA1 = np.where(low, dA1, 0.0)
    if math.isinf(loss):
        _warn_inf("exact_loss_and_grad_multi")
        dA1 = np.full_like(dA1, np.nan)
        dA2 = np.full_like(dA2, np.nan)
    return MultiLossAndGrad(float(loss), dA1, np.array(dA2))


def _sequences(start, stop, S, T):
    powers = S ** np.arange(T - 1, -1, -1, dtype=np.int64)
    idx = np.arange(start, stop, dtype=np.int64)
    return (idx[:, None] // powers) % S


def _numpy_sums(task, P, A2, eps, start, stop, chunk=NUMPY_CHUNK):
    """NumPy reference partial sums ``(loss, G (k,T,T), dA2 (k,S,S))`` over sequence numbers ``start … stop-1``."""
    S, T, k = task.S, task.T, task.k
    parents, tp, atoms, _ = task.kernel_arrays()
    prior_w = np.asarray(task.prior.weights)
    loss = 0.0
    G = np.zeros((k, T, T))
    dA2 = np.zeros((k, S, S))
    for c0 in range(start, stop, chunk):
        seqs = _sequences(c0, min(c0 + chunk, stop), S, T)
        w = sequence_weights_multi_numpy(seqs, parents, tp, atoms, prior_w)  # (n, S)
        f, a, H, Q, kappa, _ = _forward(P, A2, seqs)
        pos = w > 0
        fe = f + eps
        with np.errstate(divide="ignore", invalid="ignore"):
            loss -= float(np.sum(w[pos] * np.log(fe[pos])))
            r = np.where(pos, -w / np.where(pos, fe, 1.0), 0.0)
            rbar = np.sum(f * r, axis=1)
            delta = a * (np.take_along_axis(r, seqs, axis=1) - rbar[:, None])  # (n, T)
            eta = np.einsum("ni,nhic->nhc", delta, H)
            dA2 += np.einsum("nhb,nhc->hbc", Q, eta)
            zeta = np.einsum("hbc,nhc->nhb", A2, eta)
            idx = np.broadcast_to(seqs[:, None, :], (seqs.shape[0], k, T))
            V = np.take_along_axis(kappa, idx, axis=2)  # V[n, h, j] = κ^h[s_j]
            Zv = np.take_along_axis(zeta, idx, axis=2)  # ζ^h[s_j]
            G += np.einsum("ni,nhj->hij", delta, V)
            G[:, T - 1, :] += Zv.sum(axis=0)
    return loss, G, dA2


# ============================================================ references
def optimal_loss_multi(task, eps=0.0) -> float:
    """``L* = -E_{π, s}[Σ_c π(c | s_tp) log(π(c | s_tp) + ε)]``: the loss of a predictor that knows ``π``.

    The target's parent tuple is not uniform in general, so unlike
    :func:`popgrad.optimal_loss` this enumerates (the weights kernel with the
    per-row entropies in place of the target distribution).

    Parameters
    ----------
    task : MultiParentTask
    eps : float, default 0
        ``None`` means ``task.default_eps``.
    """
    _check_task(task)
    eps = _check_eps(task, eps)
    task.check_size()
    parents, tp, atoms, pk0 = task.kernel_arrays()
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(atoms > 0, atoms * np.log(np.where(atoms > 0, atoms, 1.0) + eps), 0.0)
    ent = np.ascontiguousarray(-plogp.sum(axis=2)[:, :, None])  # (K, S**k, 1)
    total = 0.0
    T = task.T
    chunk = 2**16
    for start in range(0, task.n_sequences, chunk):
        n = min(chunk, task.n_sequences - start)
        seqs, out = np.empty((n, T), dtype=np.int64), np.empty((n, 1))
        _kernels_multi.chunk_weights_multi(start, parents, tp, atoms, ent, pk0, seqs, out)
        total += float(out.sum())
    return total


def bayes_loss_multi(task, eps=0.0) -> float:
    """Bayes loss ``H(y | s) = -Σ_s Σ_c w(s,c) log(w(s,c) / Σ_c' w(s,c'))`` (``ε = 0``).

    The smallest loss any predictor of ``s`` can reach under the finite
    prior. ``ε > 0`` scores the same posterior predictive with the model's
    perturbed loss; ``None`` means ``task.default_eps``.
    """
    _check_task(task)
    eps = _check_eps(task, eps)
    total = 0.0
    for _, w in task.enumerate(chunk_size=2**16):
        ws = w.sum(axis=1, keepdims=True)
        pos = w > 0
        total -= float(np.sum(w[pos] * np.log((w / np.where(ws > 0, ws, 1.0))[pos] + eps)))
    return total


def count_estimator_predict_multi(graph, seqs, S, model_limit=False) -> np.ndarray:
    """The multi-parent transition-count estimator of "Knowl 9" for given sequences.

    With ``q = (s_{tp_1}, …, s_{tp_k})`` the target's parent tokens and
    ``M(s) = {non-root i ≤ T-2 : s_{p(i)_h} = q_h for every h}``::

        f_c = #{i ∈ M(s) : s_i = c} / |M(s)|

    (the paper counts ``i < T`` in 1-based positions: the last position,
    whose layer-1 row serves the target, is not counted). When ``M(s)`` is
    empty the estimator is replaced by the model limit below.

    **The model limit** (``model_limit=True`` for every sequence): at
    ``A1^h = β1·adjacency(h)`` (root rows zero), ``A2^h = β2·I`` and
    ``β1, β2 → ∞`` with ``β2·exp(-β1) → 0``, the model attends uniformly to
    the positions whose score ``Σ_h H^h_i[q_h]`` is maximal (``= k``): the
    matching non-roots of ``M(s)``, **the last position** (its layer-1 output
    *is* the query: it always matches) and every root ``i < T-1`` whose
    prefix ``s_0 … s_i`` is constant and equal to ``q_1 = … = q_k`` (its
    uniform layer-1 average then matches every head). So the model adds
    ``e_{s_{T-1}}`` (and the rare constant-prefix roots) to the counts, an
    ``O(1/|M|)`` difference from the estimator that the architecture cannot
    avoid.

    Parameters
    ----------
    graph : MultiParentGraph
    seqs : int array (n, T)
    S : int
    model_limit : bool, default False

    Returns
    -------
    f : float64 (n, S)
    """
    if not isinstance(graph, MultiParentGraph):
        raise ValueError(f"graph must be a popgrad.MultiParentGraph, got {type(graph).__name__}")
    seqs = _check_seqs(seqs, graph.T, S)
    n, T = seqs.shape
    parents, tp = graph.parents, graph.target_parents
    q = seqs[:, tp]  # (n, k)
    ctx = np.array([i for i in graph.non_roots if i < T - 1], dtype=np.int64)
    root_ctx = np.array([i for i in graph.roots if i < T - 1], dtype=np.int64)
    if ctx.size:
        match = np.all(seqs[:, parents[ctx]] == q[:, None, :], axis=2)  # (n, |ctx|)
    else:
        match = np.zeros((n, 0), dtype=bool)
    onehot = (seqs[:, :, None] == np.arange(S)).astype(np.float64)
    top = np.zeros((n, T), dtype=bool)
    top[:, ctx] = match
    top[:, T - 1] = True
    if root_ctx.size:
        same_q = np.all(q == q[:, :1], axis=1)
        const = np.logical_and.accumulate(seqs == q[:, :1], axis=1)
        top[:, root_ctx] = same_q[:, None] & const[:, root_ctx]
    f_limit = np.einsum("ni,nic->nc", top.astype(np.float64), onehot) / top.sum(axis=1)[:, None]
    if model_limit:
        return f_limit
    den = match.sum(axis=1)
    num = np.einsum("ni,nic->nc", match.astype(np.float64), onehot[:, ctx, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        f = num / den[:, None]
    empty = den == 0
    f[empty] = f_limit[empty]
    return f


def count_estimator_loss_multi(task, eps=None, model_limit=False) -> float:
    """Exact loss ``-Σ_s Σ_c w log(f̂_c(s) + ε)`` of :func:`count_estimator_predict_multi`.

    Parameters
    ----------
    task : MultiParentTask
    eps : float, optional
        Default ``task.default_eps`` (the estimator often predicts 0 for a
        possible token: with ``ε = 0`` the loss is usually ``inf``).
    model_limit : bool, default False
        Score the model's ``β → ∞`` limit instead: the limit of
        :func:`construction_loss_multi`.
    """
    _check_task(task)
    eps = _check_eps(task, eps)
    total = 0.0
    for seqs, w in task.enumerate(chunk_size=NUMPY_CHUNK):
        f = count_estimator_predict_multi(task.graph, seqs, task.S, model_limit=model_limit)
        pos = w > 0
        with np.errstate(divide="ignore"):
            total -= float(np.sum(w[pos] * np.log(f[pos] + eps)))
    if math.isinf(total):
        _warn_inf("count_estimator_loss_multi")
    return total


def construction_params(graph, S, beta1, beta2):
    """The construction of "Knowl 9": ``A1^h = β1·adjacency(h)``, ``A2^h = β2·I``.

    Returns
    -------
    A1 : float64 (k, T, T)
    A2 : float64 (k, S, S)
    """
    if not isinstance(graph, MultiParentGraph):
        raise ValueError(f"graph must be a popgrad.MultiParentGraph, got {type(graph).__name__}")
    b1 = _check_real(beta1, "beta1")
    b2 = _check_real(beta2, "beta2")
    A1 = np.stack([b1 * graph.adjacency(h) for h in range(graph.k)])
    A2 = np.stack([b2 * np.eye(S) for _ in range(graph.k)])
    return A1, A2


def construction_loss_multi(task, beta1, beta2, eps=None) -> float:
    """Exact loss of the model at the construction (:func:`construction_params`).

    As ``β1, β2 → ∞`` (``β2·exp(-β1) → 0``) it converges to
    ``count_estimator_loss_multi(task, eps, model_limit=True)``.
    """
    _check_task(task)
    A1, A2 = construction_params(task.graph, task.S, beta1, beta2)
    return exact_loss_multi(task, A1, A2, eps)


# ============================================================ validation
def _check_task(task):
    if not isinstance(task, MultiParentTask):
        raise ValueError(f"task must be a popgrad.MultiParentTask (multi-parent graph + tensor prior), got "
                         f"{type(task).__name__}")


def _check_heads(M, name) -> np.ndarray:
    try:
        M = np.asarray(M, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real array of shape (k, n, n), one square matrix per head") from None
    if M.ndim != 3 or M.shape[1] != M.shape[2]:
        raise ValueError(f"{name} must have shape (k, n, n), one square matrix per head, got shape {M.shape}")
    if not np.all(np.isfinite(M)):
        h, i, j = (int(x) for x in np.argwhere(~np.isfinite(M))[0])
        raise ValueError(f"{name}[{h}, {i}, {j}] = {M[h, i, j]} is not finite: {name} must be finite (replace inf/NaN)")
    return M


def _validate(task, A1, A2, eps):
    _check_task(task)
    k, T, S = task.k, task.T, task.S
    if k == 1 and np.ndim(A1) == 2:
        A1 = np.asarray(A1)[None]
    if k == 1 and np.ndim(A2) == 2:
        A2 = np.asarray(A2)[None]
    A1 = _check_heads(A1, "A1")
    A2 = _check_heads(A2, "A2")
    if A1.shape != (k, T, T):
        raise ValueError(f"A1 must have shape (k, T, T) = ({k}, {T}, {T}) for this task, got {A1.shape}")
    if A2.shape != (k, S, S):
        raise ValueError(f"A2 must have shape (k, S, S) = ({k}, {S}, {S}) for this task, got {A2.shape}")
    return A1, A2, _check_eps(task, eps)
