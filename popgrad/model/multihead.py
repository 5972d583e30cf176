"""The k-head reduced model (DESIGN §9, "Knowl 9"), in NumPy: the reference forward pass.

Parameters ``A1`` of shape ``(k, T, T)`` (head ``h`` uses the lower
triangle of ``A1[h]``, diagonal included) and ``A2`` of shape ``(k, S, S)``.
For a sequence ``s`` with one-hot rows ``X = [e_{s_0}, …, e_{s_{T-1}}]ᵀ``::

    P^h   = softmax_rows(MASK(A1^h))                 # T×T, as popgrad.model.reduced.first_layer_attention
    H^h   = P^h X,   H^h_i = Σ_{j≤i} P^h[i,j] e_{s_j}  # layer-1 output of head h at position i
    Q^h   = H^h_{T-1}                                # the query of head h (the last position's output)
    u_i   = Σ_h (Q^h)ᵀ A2^h H^h_i = Σ_h <κ^h, H^h_i>,   κ^h = (A2^h)ᵀ Q^h
    a     = softmax(u),   f_c = Σ_i a_i [s_i = c]
    L     = -Σ_s Σ_c w(s,c) log(f_c(s) + ε)          # w of popgrad.MultiParentTask, ε = T_eff^{-1/2}

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
"""
from __future__ import annotations

import numpy as np

from .._validation import as_heads, as_seqs
from .reduced import first_layer_attention, softmax

__all__ = ["head_attention", "predict_multi"]


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
        (:func:`popgrad.model.reduced.first_layer_attention` of each head).
    """
    A1 = as_heads(A1, "A1")
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
    A2 = as_heads(A2, "A2")
    P = head_attention(A1)
    if P.shape[0] != A2.shape[0] or A2.shape[1] != A2.shape[2]:
        raise ValueError(f"A2 must have shape (k, S, S) with k = {P.shape[0]} heads like A1, got {A2.shape}")
    seqs = as_seqs(seqs, P.shape[1], A2.shape[1])
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
