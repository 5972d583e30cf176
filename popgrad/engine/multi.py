"""The k-head exact engine (DESIGN §9): multi-parent tasks.

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

Engines: :func:`popgrad.exact_loss_and_grad` runs the numba prefix kernel of
:mod:`popgrad.engine._kernels.multi` through the block runner of
:mod:`popgrad.engine.blocks` (:func:`blocks`, :func:`run_blocks`,
:func:`finish_blocks`: fixed blocks, per-block slots summed in order,
bit-identical for any thread count and over Dask workers);
:func:`popgrad.engine.reference.exact_loss_and_grad_numpy` is the plain-NumPy reference of the
equations above over chunks of sequences.
"""
from __future__ import annotations

import math

import numpy as np

from .._validation import warn_inf
from ..model.multihead import head_attention
from ._kernels import multi as _km
from ._kernels import ranges as _kr
from ._kernels import table as _kt
from . import table as _table
from .blocks import BlockJob, Partials
from .result import LossAndGrad, finish

__all__ = ["loss_grad", "blocks", "block_work", "run_blocks", "finish_blocks", "n_fixed"]


def n_fixed(S, T, opts) -> int:
    """Leading positions fixed per block: blocks of ``≥ multi_block_sequences``, at most ``max_blocks``; ``S``, ``T``, options only."""
    D = 0
    while D < T - 1 and S ** (T - D - 1) >= opts.multi_block_sequences and S ** (D + 1) <= opts.max_blocks:
        D += 1
    return D


_n_fixed = n_fixed  # the old private name (tests, benchmarks)


def loss_grad(task, A1, A2, eps, want_grad, opts) -> LossAndGrad:
    """Run the k-head numba engine on validated input (``A1 (k,T,T)``, ``A2 (k,S,S)``): all blocks, here."""
    job = blocks(task, A1, A2, eps, want_grad, opts)
    return finish_blocks(job, run_blocks(task, job))


# ------------------------------------------------------------ the block runner (engine/blocks.py)
def blocks(task, A1, A2, eps, want_grad, opts) -> BlockJob:
    """The call's layer-1 attention ``P^h`` (the blocks: ``S**n_fixed`` of them), on validated input."""
    task.check_size()
    P = np.ascontiguousarray(head_attention(A1))
    A2 = np.ascontiguousarray(A2, dtype=np.float64)
    kind = "multi-table" if _table.use_table(task, per_atom=True) else "multi"  # the one rule (DESIGN §20)
    return BlockJob(kind, False, P, A2, float(eps), bool(want_grad), opts)


def block_work(task, job) -> np.ndarray:
    """Relative cost of each block, ``(n_blocks,)`` int64: all equal."""
    if job.engine == "multi-table":
        return np.ones(_table.table_blocks(task, job.opts)[1], dtype=np.int64)
    return np.ones(task.S ** n_fixed(task.S, task.T, job.opts), dtype=np.int64)


def run_blocks(task, job, lo=0, hi=None) -> Partials:
    """The per-block slots of blocks ``lo … hi-1`` of ``job`` (bit for bit those of a whole-range run).

    ``hi=None``: to the last block (``run_blocks(task, job)`` runs them all).
    """
    S, T, k = task.S, task.T, task.k
    if job.engine == "multi-table":  # the weight table (DESIGN §20)
        block_size, n_blocks = _table.table_blocks(task, job.opts)
        hi = n_blocks if hi is None else hi
        seqs, w = _table.table_rows(task, lo * block_size, min(task.n_sequences, hi * block_size))
        n = hi - lo
        loss_s = np.zeros(n)
        G_s = np.zeros((n, k, T, T) if job.want_grad else (n, k, 1, 1))
        dA2_s = np.zeros((n, k, S, S) if job.want_grad else (n, k, 1, 1))
        _kt.loss_grad_multi_rows(seqs, w, job.P, job.A2, job.eps, block_size, job.want_grad, loss_s, G_s, dA2_s)
        return Partials(loss_s, G_s, dA2_s)
    parents, tp, atoms, pk0 = task.kernel_arrays()
    D = n_fixed(S, T, job.opts)
    n_blocks = S**D
    hi = n_blocks if hi is None else hi
    n = hi - lo
    loss_s = np.zeros(n)
    G_s = np.zeros((n, k, T, T) if job.want_grad else (n, k, 1, 1))
    dA2_s = np.zeros((n, k, S, S) if job.want_grad else (n, k, 1, 1))
    parallel = n_blocks > 1 and n > 1 and task.n_sequences >= job.opts.parallel_min_sequences
    kernel = _kr.loss_grad_multi_range if parallel else _kr.loss_grad_multi_range_serial
    kernel(lo, parents, tp, atoms, pk0, job.P, job.A2, job.eps, D, job.want_grad, loss_s, G_s, dA2_s)
    return Partials(loss_s, G_s, dA2_s)


def finish_blocks(job, partials) -> LossAndGrad:
    """All blocks' :class:`Partials`, in block order: summed, then the softmax Jacobian (:func:`finish`)."""
    loss = float(_km.sum_slots(partials.loss, partials.G, partials.dA2))  # block order; totals in slot 0
    if not job.want_grad:
        if math.isinf(loss):
            warn_inf("exact_loss_multi")
        return LossAndGrad(loss, None, None)
    return finish(loss, partials.G[0], partials.dA2[0], job.P, "exact_loss_and_grad")
