"""What the disentangled transformer's first layer attends to, exactly (DESIGN §18): population averages.

Layer 1 of a :class:`popgrad.CatFormer` scores position ``j`` from position
``t`` by four gathers of ``Ã = Ã^(1)_h`` (input ``x̃_t = [e_{s_t}, e_t]``)::

    z_tj = TT[s_t, s_j] + TP[s_t, j] + PT[t, s_j] + PP[t, j]
    TT = Ã[:S, :S]   TP = Ã[:S, S:]   PT = Ã[S:, :S]   PP = Ã[S:, S:]

and attends with ``P_t = softmax_{j ≤ t}(z_tj)``. :func:`catformer_attention`
returns, for every head,

* ``mean[h] = E_s[P(s)]``: the exact population average over all ``S**T``
  sequences, each weighted by its probability ``p(s) = Σ_c w(s, c)``
  (what the official ``many_graphs`` notebook estimates from samples);
* the four blocks of ``Ã`` and ``position[h] = softmax_rows(MASK(PP))``,
  the attention with the token blocks removed (what the notebook plots as
  ``A1_soft``);
* ``parent_mass[h, i, r] = mean[h, i, p(i)_r]``: the attention mass from
  position ``i`` to its ``r``-th parent (for the last position of a
  k-parent graph: to the target's ``r``-th parent, DESIGN §9), NaN at roots.

The enumeration is the task's own (:meth:`task.enumerate`, chunks of
``chunk`` sequences); NumPy only.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._validation import as_int
from ..model.catformer import check_task_model
from ..model.reduced import softmax
from ..task.tasks import MultiParentTask

__all__ = ["CatFormerAttention", "catformer_attention", "score_blocks", "parent_slots"]


class CatFormerAttention(NamedTuple):
    """Layer-1 attention of a :class:`popgrad.CatFormer`, per head (module docstring).

    Attributes
    ----------
    mean : ndarray, shape (m_1, T, T)
        ``E_s[softmax_rows(MASK(x̃ Ã_h x̃ᵀ))]``; rows sum to 1, zero above the diagonal.
    token_token, token_position, position_token, position_position : ndarray
        The blocks ``Ã_h[:S, :S]`` ``(m_1, S, S)``, ``Ã_h[:S, S:]`` ``(m_1, S, T)``,
        ``Ã_h[S:, :S]`` ``(m_1, T, S)``, ``Ã_h[S:, S:]`` ``(m_1, T, T)``.
    position : ndarray, shape (m_1, T, T)
        ``softmax_rows(MASK(Ã_h[S:, S:]))``: the attention of the position block alone.
    parent_mass : ndarray, shape (m_1, T, k)
        ``mean[h, i, p(i)_r]``, NaN where position ``i`` has no parents (``k = 1`` for a single-parent task).
    """

    mean: np.ndarray
    token_token: np.ndarray
    token_position: np.ndarray
    position_token: np.ndarray
    position_position: np.ndarray
    position: np.ndarray
    parent_mass: np.ndarray


def score_blocks(model, params):
    """``(TT, TP, PT, PP)``: the four blocks of every layer-1 head's ``Ã`` (module docstring)."""
    A = params.A[0]
    S = model.S
    return A[:, :S, :S].copy(), A[:, :S, S:].copy(), A[:, S:, :S].copy(), A[:, S:, S:].copy()


def parent_slots(task) -> np.ndarray:
    """``(T, k)`` int: the parents ``p(i)_r`` of every position (``-1`` at roots); the last row of a k-parent
    task holds the target's parents (what its last position should attend to)."""
    g = task.graph
    if isinstance(task, MultiParentTask):
        par = np.array(g.parents, dtype=np.int64)
        par[-1] = np.asarray(g.target_parents, dtype=np.int64)
        return par
    return np.asarray(g.parents, dtype=np.int64).reshape(-1, 1)


def catformer_attention(task, model, params, chunk=2**14) -> CatFormerAttention:
    """Exact population-average layer-1 attention of every head, its score blocks and its mass on the parents.

    Parameters
    ----------
    task : Task or MultiParentTask
    model : CatFormer
        Same ``S``, ``T`` as the task.
    params : CatFormerParams
    chunk : int
        Sequences per NumPy chunk.

    Returns
    -------
    CatFormerAttention
    """
    params = check_task_model(task, model, params)
    chunk = as_int(chunk, "chunk", minimum=1)
    task.check_size()
    S, T = model.S, model.T
    TT, TP, PT, PP = score_blocks(model, params)
    m = TT.shape[0]
    low = np.tri(T, dtype=bool)
    pos = np.arange(T)
    mean = np.zeros((m, T, T))
    for seqs, w in task.enumerate(chunk_size=chunk):
        p = w.sum(axis=1)
        st, sj = seqs[:, :, None], seqs[:, None, :]
        for h in range(m):
            z = TT[h][st, sj] + TP[h][st, pos[None, None, :]] + PT[h][pos[None, :, None], sj] + PP[h][None]
            P = softmax(np.where(low, z, -np.inf), axis=2)
            mean[h] += np.einsum("n,nij->ij", p, np.where(low, P, 0.0))
    position = softmax(np.where(low, PP, -np.inf), axis=2)
    position = np.where(low, position, 0.0)
    slots = parent_slots(task)
    mass = np.full((m, T, slots.shape[1]), np.nan)
    for i in range(T):
        for r in range(slots.shape[1]):
            if slots[i, r] >= 0:
                mass[:, i, r] = mean[:, i, slots[i, r]]
    return CatFormerAttention(mean, TT, TP, PT, PP, position, mass)
