"""NumPy references of the exact engines, independent of the code they check (the tests compare).

:func:`exact_loss_and_grad_numpy` implements DESIGN §2–§4 (and the k-head
equations of :mod:`popgrad.engine.multi`) literally, with whole-chunk arrays.
It shares nothing with the engines but the input checks of
:mod:`popgrad._validation`: its own sequence numbering, its own exact weights
``w(s, c)`` (from the atoms, their stationary distributions and the graph),
its own masked softmax and layer-1 softmax Jacobian, its own k-head forward
pass, and its own orbit reduction, which decides nothing with a tolerance
(``A2`` must lie in ``span{I, 11ᵀ}`` bit for bit) and checks the prior's
closure by trying all ``S!`` relabelings. ``A2`` is never projected.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from .. import _validation as V
from ..task.tasks import ExactTask, MultiParentTask
from .options import DEFAULT_OPTIONS, EngineOptions
from .result import LossAndGrad

__all__ = ["exact_loss_and_grad_numpy", "rows_loss_and_grad_numpy"]

#: Values of ``symmetry`` the reference takes (the engines' spelling).
_SYMMETRY = ("auto", "on", "off")


def exact_loss_and_grad_numpy(task, A1, A2, eps=None, symmetry="off", options=None) -> LossAndGrad:
    """Plain-NumPy reference of :func:`popgrad.exact_loss_and_grad` (same result, slower), any task kind.

    Enumerates every sequence in chunks of ``options.numpy_chunk`` and implements
    DESIGN §3–§4 literally with whole-chunk arrays: ``V[n, j] = A2[q_n, s_{n,j}]``,
    ``u = V Pᵀ``, ``a = softmax(u)``, ``G += Δᵀ V``, ``E = Δ P`` scattered into
    ``dA2[q, s_j]``, and the softmax Jacobian once at the end. A k-parent task
    runs :func:`_multi_sums` (the equations of :mod:`popgrad.engine.multi`).

    ``symmetry``: ``"off"`` and ``"auto"`` (the default of the engines) both sum
    over every sequence at the ``A2`` given: the orbit reduction is exact, so the
    full sum is its reference, and the reference takes no decision the engines
    take. ``"on"``: the reference's own orbit reduction (canonical sequences
    with orbit weights ``S!/(S-m)!``, ``dA2`` averaged over all ``S!``
    relabelings); ``ValueError`` unless ``A2`` is exactly ``αI + β11ᵀ`` and the
    prior is closed under every relabeling (single-parent tasks only).
    """
    A1, A2, eps = _validate(task, A1, A2, eps)
    if symmetry not in _SYMMETRY:
        raise ValueError(f"symmetry must be one of {_SYMMETRY}, got {symmetry!r}")
    chunk = _chunk(options)
    task.check_size()
    if isinstance(task, MultiParentTask):
        if symmetry == "on":
            raise ValueError("symmetry: the k-head reference has no orbit reduction; use symmetry='off'")
        P = _masked_softmax(A1)
        loss, G, dA2 = _multi_sums(task, P, A2, eps, 0, task.n_sequences, chunk)
        return _finish(loss, G, dA2, P)
    canonical = symmetry == "on"
    if canonical and not (_exactly_in_span(A2) and _closed_by_brute_force(task.prior)):
        raise ValueError("symmetry='on' needs a relabeling-closed prior and A2 in span{I, 11^T}")
    P = _masked_softmax(A1)
    loss, G, dA2 = _numpy_sums(task, P, A2, eps, chunk=chunk, canonical=canonical)
    return _finish(loss, G, _average_over_relabelings(dA2) if canonical else dA2, P)


def rows_loss_and_grad_numpy(seqs, w, A1, A2, eps) -> LossAndGrad:
    """NumPy reference of :func:`popgrad.engine.single.rows_loss_and_grad` (DESIGN §3–§4 with whole-array products)."""
    P = _masked_softmax(np.asarray(A1, float))
    A2 = np.asarray(A2, float)
    loss, G, dA2 = _numpy_chunk_sums(np.asarray(seqs), np.asarray(w, dtype=float), P, A2, eps)
    return _finish(loss, G, dA2.reshape(A2.shape), P)


# ------------------------------------------------------------ building blocks
def _validate(task, A1, A2, eps):
    if not isinstance(task, ExactTask):
        raise V.ArgumentTypeError(
            f"task must be a popgrad.Task or popgrad.MultiParentTask (graph + prior), got {type(task).__name__}")
    T, S = task.T, task.S
    if isinstance(task, MultiParentTask):
        k = task.k
        if k == 1 and np.ndim(A1) == 2:
            A1 = np.asarray(A1)[None]
        if k == 1 and np.ndim(A2) == 2:
            A2 = np.asarray(A2)[None]
        A1, A2 = V.as_heads(A1, "A1"), V.as_heads(A2, "A2")
        want1, want2 = ("(k, T, T)", (k, T, T)), ("(k, S, S)", (k, S, S))
    else:
        A1, A2 = V.as_square(A1, "A1"), V.as_square(A2, "A2")
        want1, want2 = ("(T, T)", (T, T)), ("(S, S)", (S, S))
    for name, M, (sym, want) in (("A1", A1, want1), ("A2", A2, want2)):
        if M.shape != want:
            raise ValueError(f"{name} must have shape {sym} = ({', '.join(map(str, want))}) for this task, got {M.shape}")
    return A1, A2, V.as_eps(task, eps)


def _chunk(options) -> int:
    if options is None:
        return DEFAULT_OPTIONS.numpy_chunk
    if not isinstance(options, EngineOptions):
        raise V.ArgumentTypeError(f"options must be a popgrad.EngineOptions, got {type(options).__name__}")
    return options.numpy_chunk


def _masked_softmax(A1) -> np.ndarray:
    """``P[..., i, j] = exp(A1[i,j] - m_i) / Σ_{j' ≤ i} exp(A1[i,j'] - m_i)`` for ``j ≤ i``, 0 above the diagonal."""
    T = A1.shape[-1]
    low = np.tri(T, dtype=bool)
    x = np.where(low, A1, -np.inf)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _finish(loss, G, dA2, P) -> LossAndGrad:
    """``dA1[i, :] = P[i, :] ⊙ (G[i, :] - <P[i, :], G[i, :]>)`` on and below the diagonal (once, after the sum)."""
    low = np.tri(P.shape[-1], dtype=bool)
    G = np.where(low, G, 0.0)
    dA1 = np.where(low, P * (G - np.sum(P * G, axis=-1, keepdims=True)), 0.0)
    dA2 = np.array(dA2, dtype=np.float64)
    if math.isinf(loss):
        V.warn_inf("exact_loss_and_grad_numpy")
        dA1, dA2 = np.full_like(dA1, np.nan), np.full_like(dA2, np.nan)
    return LossAndGrad(float(loss), dA1, dA2)


def _sequences(start, stop, S, T) -> np.ndarray:
    """Sequences ``start … stop-1`` as base-``S`` numerals ``s_0 … s_{T-1}`` (position 0 most significant)."""
    out = np.empty((stop - start, T), dtype=np.int64)
    m = np.arange(start, stop, dtype=np.int64)
    for t in range(T - 1, -1, -1):
        out[:, t] = m % S
        m = m // S
    return out


def _weights(task, seqs) -> np.ndarray:
    """``w(s, c) = Σ_k ρ_k (1/S) Π_{roots i<T-1} μ_k(s_i) Π_{non-roots} π_k(s_i | s_{p(i)}) · π_k(c | s_{T-1})`` (DESIGN §2)."""
    if task.continuous:  # no atoms: the sufficient-statistic weights of the task's table (DESIGN §20)
        return task._continuous_rows(seqs)[0]
    pr = task.prior
    parents = task.graph.parents
    T = seqs.shape[1]
    w = np.zeros((len(seqs), task.S))
    for pi, mu, rho in zip(pr.atoms, pr.stationary, pr.weights):
        p = np.full(len(seqs), rho / task.S)
        for i in range(T - 1):
            par = int(parents[i])
            p = p * (mu[seqs[:, i]] if par < 0 else pi[seqs[:, par], seqs[:, i]])
        w += p[:, None] * pi[seqs[:, T - 1], :]
    return w


def _weights_multi(task, seqs) -> np.ndarray:
    """k-parent ``w(s, c)``: roots uniform, non-root ``i`` from row ``Σ_h s_{p_h(i)} S^{k-1-h}`` of the atom, the target from the query's parents."""
    if task.continuous:  # no atoms: the sufficient-statistic weights of the task's table (DESIGN §20)
        return task._continuous_rows(seqs)[0]
    S, T, k = task.S, task.T, task.k
    parents = np.asarray(task.graph.parents)
    tp = np.asarray(task.graph.target_parents)
    digits = S ** np.arange(k - 1, -1, -1)
    pr = task.prior
    w = np.zeros((len(seqs), S))
    for pi, rho in zip(pr.atoms, pr.weights):
        p = np.full(len(seqs), float(rho))
        for i in range(T):
            if parents[i, 0] < 0:
                p = p / S
            else:
                p = p * pi[seqs[:, parents[i]] @ digits, seqs[:, i]]
        w += p[:, None] * pi[seqs[:, tp] @ digits, :]
    return w


def _canonical(seqs) -> np.ndarray:
    """Rows whose tokens first occur in the order ``0, 1, 2, …`` (one per relabeling orbit)."""
    seen = np.full(len(seqs), -1)
    ok = np.ones(len(seqs), dtype=bool)
    for t in range(seqs.shape[1]):
        ok &= seqs[:, t] <= seen + 1
        seen = np.maximum(seen, seqs[:, t])
    return ok


def _exactly_in_span(A2) -> bool:
    """``A2 = αI + β11ᵀ`` bit for bit: one value on the diagonal, one off it."""
    eye = np.eye(A2.shape[0], dtype=bool)
    d, o = A2[eye], A2[~eye]
    return bool(np.all(d == d[0]) and (o.size == 0 or np.all(o == o[0])))


def _closed_by_brute_force(prior) -> bool:
    """Every relabeling ``σ π_k σ⁻¹`` of every atom is an atom of the same total weight, with ``μ ∘ σ⁻¹`` (all ``S!``)."""
    atoms, w, mus = np.asarray(prior.atoms, float), np.asarray(prior.weights), np.asarray(prior.stationary)
    S = atoms.shape[1]
    mass, mu_of = {}, {}
    for a, wk, mu in zip(atoms, w, mus):
        key = (a + 0.0).tobytes()  # -0.0 counts as 0.0
        mass[key] = mass.get(key, 0.0) + float(wk)
        mu_of.setdefault(key, mu)
    for perm in itertools.permutations(range(S)):
        inv = np.argsort(perm)
        for key, m in mass.items():
            pi = np.frombuffer(key).reshape(S, S)
            rkey = (pi[np.ix_(inv, inv)] + 0.0).tobytes()  # (σπσ⁻¹)[a, b] = π[σ⁻¹a, σ⁻¹b]
            if rkey not in mass or abs(mass[rkey] - m) > 1e-13 * m:
                return False
            if not np.allclose(mu_of[rkey], mu_of[key][inv], rtol=1e-12, atol=0):
                return False
    return True


def _average_over_relabelings(D) -> np.ndarray:
    """``(1/S!) Σ_σ σ D σᵀ`` by listing every relabeling."""
    S = D.shape[0]
    perms = list(itertools.permutations(range(S)))
    return sum(D[np.ix_(p, p)] for p in perms) / len(perms)


def _numpy_sums(task, P, A2, eps, start=0, stop=None, chunk=DEFAULT_OPTIONS.numpy_chunk, canonical=False):
    """NumPy reference partial sums over sequence numbers ``start … stop-1`` (all of them by default).

    With ``canonical`` only the canonical sequences count, each with its orbit
    weight ``S!/(S-m)!`` (``m`` distinct tokens). Returns ``(loss, G, dA2)`` with
    ``G = ∂L/∂P`` restricted to those sequences.
    """
    S, T = task.S, task.T
    stop = task.n_sequences if stop is None else stop
    loss = 0.0
    G = np.zeros((T, T))
    dA2 = np.zeros(S * S)
    for c0 in range(start, stop, chunk):
        seqs = _sequences(c0, min(c0 + chunk, stop), S, T)
        if canonical:
            seqs = seqs[_canonical(seqs)]
            if not len(seqs):
                continue
        w = _weights(task, seqs)
        if canonical:
            m = np.array([len(set(r)) for r in seqs.tolist()])
            w = w * np.array([math.perm(S, x) for x in m], dtype=float)[:, None]
        l_c, G_c, dA2_c = _numpy_chunk_sums(seqs, w, P, A2, eps)
        loss += l_c
        G += G_c
        dA2 += dA2_c
    return loss, np.tril(G), dA2.reshape(S, S)


def _numpy_chunk_sums(seqs, w, P, A2, eps):
    """One chunk of the NumPy reference: ``(loss, G (T, T), dA2 (S*S,))`` summed over its sequences."""
    T, S = P.shape[0], A2.shape[0]
    q = seqs[:, T - 1]
    V = A2[q[:, None], seqs]  # (n, T)
    u = V @ P.T
    e = np.exp(u - u.max(axis=1, keepdims=True))
    a = e / e.sum(axis=1, keepdims=True)  # (n, T)
    f = np.empty((len(seqs), S))
    for c in range(S):
        f[:, c] = np.sum(a * (seqs == c), axis=1)
    pos = w > 0
    fe = f + eps
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = -float(np.sum(w[pos] * np.log(fe[pos])))
        r = np.where(pos, -w / np.where(pos, fe, 1.0), 0.0)
        rbar = np.sum(f * r, axis=1)
        delta = a * (np.take_along_axis(r, seqs, axis=1) - rbar[:, None])  # (n, T)
    G = delta.T @ V
    E = delta @ P  # E[n, j] = Σ_i δ_i P[i, j]
    dA2 = np.bincount((q[:, None] * S + seqs).ravel(), weights=E.ravel(), minlength=S * S)
    return loss, G, dA2


def _multi_forward(P, A2, seqs):
    """k-head forward pass (DESIGN §9), written here: ``(f, a, H, Q, κ)`` of a chunk.

    ``H[n,h,i,c] = Σ_{j≤i} P^h[i,j] [s_j = c]``, ``Q^h = H^h_{T-1}``, ``κ^h[c] = Σ_b Q^h[b] A2^h[b,c]``,
    ``u_i = Σ_h <κ^h, H^h_i>``, ``a = softmax(u)``, ``f_c = Σ_i a_i [s_i = c]``.
    """
    S = A2.shape[1]
    X = (seqs[:, :, None] == np.arange(S)[None, None, :]).astype(np.float64)  # (n, T, S)
    H = np.stack([np.matmul(P[h], X) for h in range(P.shape[0])], axis=1)  # (n, k, T, S)
    Q = H[:, :, -1, :]
    kappa = np.stack([Q[:, h, :] @ A2[h] for h in range(A2.shape[0])], axis=1)  # (n, k, S)
    u = np.sum(H * kappa[:, :, None, :], axis=(1, 3))  # (n, T)
    e = np.exp(u - u.max(axis=1, keepdims=True))
    a = e / e.sum(axis=1, keepdims=True)
    f = np.sum(a[:, :, None] * X, axis=1)
    return f, a, H, Q, kappa


def _multi_sums(task, P, A2, eps, start, stop, chunk):
    """k-head NumPy reference partial sums ``(loss, G (k,T,T), dA2 (k,S,S))`` over sequence numbers ``start … stop-1``."""
    S, T, k = task.S, task.T, task.k
    loss = 0.0
    G = np.zeros((k, T, T))
    dA2 = np.zeros((k, S, S))
    for c0 in range(start, stop, chunk):
        seqs = _sequences(c0, min(c0 + chunk, stop), S, T)
        w = _weights_multi(task, seqs)  # (n, S)
        f, a, H, Q, kappa = _multi_forward(P, A2, seqs)
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
