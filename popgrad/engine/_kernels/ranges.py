"""Numba entries that run a contiguous range of an engine's blocks: the kernels behind ``run_blocks``.

The direct engine (:func:`popgrad.engine._kernels.single._direct_block`) and
the k-head engine (:func:`popgrad.engine._kernels.multi._multi_block`) number
their blocks ``0 … n_blocks-1`` and derive each block's sequences from its
number; the entries here run the blocks ``lo … lo + n - 1`` (``n =
loss_out.shape[0]``) into slots ``0 … n-1``. A local call runs ``lo = 0`` and
every block, a Dask worker (:mod:`popgrad.engine.distributed`) its chunk:
the same per-block functions, so every slot is bit for bit the same. (The
prefix engine needs no entry of its own: its blocks are rows of the plan's
``prefixes``, and a slice of them runs in its kernel,
:func:`popgrad.engine._kernels.prefix.loss_grad_prefix`.) Each entry has a
``_serial`` twin compiled from the same body (:func:`popgrad.engine._kernels.twins.twins`: same blocks,
same bits, on the calling thread).
``cache=True``, no ``fastmath``, as everywhere.
"""
from numba import prange

from .multi import _multi_block
from .single import _direct_block
from .twins import twins


def _loss_grad_direct_range_body(lo, parents, mu, atoms, prior_w, P, A2, eps, block_size, sym, orbit, want_grad,
                           loss_out, G_out, dA2_out):
    """The direct engine on blocks ``lo … lo + len(loss_out) - 1``: per-sequence fused forward/backward,
    ``O(T² + K·T)`` work per sequence.

    Block ``b`` covers sequence numbers ``b·block_size …`` (lexicographic);
    sequences and weights are decoded on the fly (:func:`decode_sequence`,
    :func:`sequence_weight_row`), nothing is materialized. The layer-2
    softmax is shifted by the per-sequence maximum, so any finite ``A2``
    is safe. Per sequence (DESIGN §3–§4)::

        u_i = Σ_{j≤i} P[i,j] A2[q,s_j],  a = softmax(u),  f_c = Σ_i a_i [s_i = c]
        loss   += -Σ_c w_c log(f_c + ε)            (terms with w_c = 0 skipped)
        r_c     = -w_c / (f_c + ε),  r̄ = Σ_c f_c r_c,  δ_i = a_i (r_{s_i} - r̄)
        G[i,j] += δ_i A2[q, s_j]   (j ≤ i)
        dA2[q, s_j] += Σ_{i≥j} δ_i P[i, j]

    With ``sym`` only canonical sequences (first occurrences in the order
    ``0, 1, …``) are visited, their weights multiplied by ``orbit[m]``
    (``m`` distinct tokens). Outputs (one slot per block of the range, zero
    on entry): ``loss_out (n,)``, ``G_out (n, T, T)``, ``dA2_out (n, S, S)``.
    """
    for b in prange(loss_out.shape[0]):
        loss_out[b] = _direct_block(lo + b, parents, mu, atoms, prior_w, P, A2, eps, block_size, sym, orbit,
                                    want_grad, G_out[b], dA2_out[b])


loss_grad_direct_range, loss_grad_direct_range_serial = twins(_loss_grad_direct_range_body)


def _loss_grad_multi_range_body(lo, parents, tp, atoms, pk0, P, A2, eps, n_fixed, want_grad, loss_out, G_out, dA2_out):
    """Exact loss, ``G^h = ∂L/∂P^h`` and ``∂L/∂A2^h`` of the k-head model on blocks ``lo … lo + n - 1``.

    Parameters
    ----------
    lo : int
        First block of the range.
    parents : int64 (T, k)
    tp : int64 (k,)
        The target's parents.
    atoms : float64 (K, S**k, S)
    pk0 : float64 (K,)
        ``weights · S^{-|R|}``.
    P : float64 (k, T, T)
        ``P^h = softmax_rows(MASK(A1^h))``.
    A2 : float64 (k, S, S)
    eps : float
    n_fixed : int
        Leading positions fixed per block (``≤ T-1``); the engine has ``S**n_fixed`` blocks.
    want_grad : bool
        ``False``: forward only.
    loss_out, G_out, dA2_out : float64 (n,), (n, k, T, T), (n, k, S, S)
        One slot per block of the range, zero on entry.
    """
    for b in prange(loss_out.shape[0]):
        loss_out[b] = _multi_block(lo + b, parents, tp, atoms, pk0, P, A2, eps, n_fixed, want_grad,
                                   G_out[b], dA2_out[b])


loss_grad_multi_range, loss_grad_multi_range_serial = twins(_loss_grad_multi_range_body)
