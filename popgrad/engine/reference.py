"""NumPy references of the exact engines, independent of the numba kernels (the tests compare).

:func:`exact_loss_and_grad_numpy` implements DESIGN §3–§4 (and the k-head
equations of :mod:`popgrad.engine.multi`) literally, with whole-chunk arrays,
over sequences decoded by :func:`popgrad.task.tasks.decode_sequences` with
weights from :func:`popgrad.task.tasks.sequence_weights_numpy` /
:func:`popgrad.task.tasks.sequence_weights_multi_numpy`.
"""
from __future__ import annotations

import numpy as np

from ..model.multihead import _forward as multihead_forward
from ..model.multihead import head_attention
from ..model.reduced import first_layer_attention, softmax
from ..task.tasks import MultiParentTask, decode_sequences, sequence_weights_multi_numpy, sequence_weights_numpy
from ._args import options_or_default, validate
from .options import DEFAULT_OPTIONS
from .result import LossAndGrad, finish
from .symmetry import SYMMETRY_MODES, canonical_chunks, orbit_sizes, symmetrize_dA2, symmetry_check

__all__ = ["exact_loss_and_grad_numpy", "rows_loss_and_grad_numpy"]


def exact_loss_and_grad_numpy(task, A1, A2, eps=None, symmetry="off", options=None) -> LossAndGrad:
    """Plain-NumPy reference of :func:`popgrad.exact_loss_and_grad` (same result, slower), any task kind.

    A k-parent task runs :func:`_multi_sums` (the equations of :mod:`popgrad.engine.multi` with
    ``einsum`` over chunks; ``symmetry`` must then be ``"off"``).

    Enumerates sequences in chunks of ``options.numpy_chunk`` with weights from
    :func:`popgrad.task.tasks.sequence_weights_numpy` and implements DESIGN §3–§4
    literally with whole-chunk arrays: ``V[n, j] = A2[q_n, s_{n,j}]``,
    ``u = V Pᵀ``, ``a = softmax(u)``, ``G += Δᵀ V``, ``E = Δ P`` scattered
    into ``dA2[q, s_j]``, and the softmax Jacobian once at the end.
    Independent of the numba kernels; the tests compare the two.

    ``symmetry`` defaults to ``"off"`` (every sequence); with ``"auto"`` or
    ``"on"`` it sums over :func:`canonical_sequences` with orbit weights and
    symmetrizes ``dA2`` (the reference of the orbit reduction).
    """
    A1, A2, eps = validate(task, A1, A2, eps)
    opts = options_or_default(options)
    task.check_size()
    if isinstance(task, MultiParentTask):
        if symmetry != "off":
            raise ValueError("symmetry: the k-head reference has no orbit reduction; use symmetry='off'")
        P = head_attention(A1)
        loss, G, dA2 = _multi_sums(task, P, A2, eps, 0, task.n_sequences, opts.numpy_chunk)
        return finish(loss, G, dA2, P)
    if symmetry not in SYMMETRY_MODES:
        raise ValueError(f"symmetry must be one of {SYMMETRY_MODES}, got {symmetry!r}")
    sym = False
    if symmetry != "off":
        sym, A2s = symmetry_check(task, A2)
        if symmetry == "on" and not sym:
            raise ValueError("symmetry='on' needs a relabeling-closed prior and A2 in span{I, 11^T}")
        A2 = A2s if sym else A2
    P = first_layer_attention(A1)
    loss, G, dA2 = _numpy_sums(task, P, A2, eps, chunk=opts.numpy_chunk, canonical=sym)
    return finish(loss, G, symmetrize_dA2(dA2) if sym else dA2, P)


def rows_loss_and_grad_numpy(seqs, w, A1, A2, eps) -> LossAndGrad:
    """NumPy reference of :func:`popgrad.engine.single.rows_loss_and_grad` (DESIGN §3–§4 with whole-array products)."""
    P = first_layer_attention(A1)
    loss, G, dA2 = _numpy_chunk_sums(np.asarray(seqs), np.asarray(w, dtype=float), P, np.asarray(A2, float), eps)
    return finish(loss, G, dA2.reshape(A2.shape), P)


def _numpy_chunks(task, chunk, canonical=False):
    """``(seqs, w)`` chunks for the NumPy reference: every sequence, or the canonical ones with orbit weights."""
    S, T = task.S, task.T
    parents, mu, atoms, prior_w = task.kernel_arrays()
    if canonical:
        orbit = orbit_sizes(S)
        for seqs in canonical_chunks(S, T, chunk):
            w = sequence_weights_numpy(seqs, parents, mu, atoms, prior_w)
            yield seqs, w * orbit[seqs.max(axis=1) + 1][:, None]
        return
    for c0 in range(0, task.n_sequences, chunk):
        seqs = decode_sequences(c0, min(c0 + chunk, task.n_sequences), S, T)
        yield seqs, sequence_weights_numpy(seqs, parents, mu, atoms, prior_w)


def _numpy_sums(task, P, A2, eps, start=0, stop=None, chunk=DEFAULT_OPTIONS.numpy_chunk, canonical=False):
    """NumPy reference partial sums over sequence numbers ``start … stop-1`` (all of them by default).

    With ``canonical`` the sum runs over the canonical sequences with orbit
    weights instead (``start``/``stop`` ignored). Returns ``(loss, G, dA2)``
    with ``G = ∂L/∂P`` restricted to those sequences.
    """
    S, T = task.S, task.T
    parents, mu, atoms, prior_w = task.kernel_arrays()
    loss = 0.0
    G = np.zeros((T, T))
    dA2 = np.zeros(S * S)
    if canonical:
        chunks = _numpy_chunks(task, chunk, canonical=True)
    else:
        stop = task.n_sequences if stop is None else stop
        chunks = (
            (seqs, sequence_weights_numpy(seqs, parents, mu, atoms, prior_w))
            for seqs in (decode_sequences(c0, min(c0 + chunk, stop), S, T) for c0 in range(start, stop, chunk))
        )
    for seqs, w in chunks:
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
    a = softmax(V @ P.T, axis=1)  # (n, T)
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


def _multi_sums(task, P, A2, eps, start, stop, chunk):
    """k-head NumPy reference partial sums ``(loss, G (k,T,T), dA2 (k,S,S))`` over sequence numbers ``start … stop-1``."""
    S, T, k = task.S, task.T, task.k
    parents, tp, atoms, _ = task.kernel_arrays()
    prior_w = np.asarray(task.prior.weights)
    loss = 0.0
    G = np.zeros((k, T, T))
    dA2 = np.zeros((k, S, S))
    for c0 in range(start, stop, chunk):
        seqs = decode_sequences(c0, min(c0 + chunk, stop), S, T)
        w = sequence_weights_multi_numpy(seqs, parents, tp, atoms, prior_w)  # (n, S)
        f, a, H, Q, kappa, _ = multihead_forward(P, A2, seqs)
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
