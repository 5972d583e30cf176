"""Numba entries that run a contiguous range of an engine's blocks (for :mod:`popgrad.engine.distributed`).

The direct engine (:func:`popgrad.engine._kernels.single.loss_grad_direct`) and
the k-head engine (:func:`popgrad.engine._kernels.multi.loss_grad_multi`) number
their blocks ``0 … n_blocks-1`` and derive each block's sequences from its
number; the entries here run the blocks ``lo … lo + n - 1`` (``n =
loss_out.shape[0]``) into slots ``0 … n-1`` with the very same per-block
functions, so every slot is bit for bit the slot of the whole-range kernel.
(The prefix engine needs no entry of its own: its blocks are rows of the
plan's ``prefixes``, and a slice of them runs in the existing kernel.)
``cache=True``, no ``fastmath``, as everywhere.
"""
from numba import njit, prange

from .multi import _multi_block
from .single import _direct_block


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_direct_range(lo, parents, mu, atoms, prior_w, P, A2, eps, block_size, sym, orbit, want_grad,
                           loss_out, G_out, dA2_out):
    """Blocks ``lo … lo + len(loss_out) - 1`` of :func:`loss_grad_direct`, one slot each."""
    for b in prange(loss_out.shape[0]):
        loss_out[b] = _direct_block(lo + b, parents, mu, atoms, prior_w, P, A2, eps, block_size, sym, orbit,
                                    want_grad, G_out[b], dA2_out[b])


@njit(cache=True, error_model="numpy")
def loss_grad_direct_range_serial(lo, parents, mu, atoms, prior_w, P, A2, eps, block_size, sym, orbit, want_grad,
                                  loss_out, G_out, dA2_out):
    """:func:`loss_grad_direct_range` on the calling thread (same blocks, same bits)."""
    for b in range(loss_out.shape[0]):
        loss_out[b] = _direct_block(lo + b, parents, mu, atoms, prior_w, P, A2, eps, block_size, sym, orbit,
                                    want_grad, G_out[b], dA2_out[b])


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_multi_range(lo, parents, tp, atoms, pk0, P, A2, eps, n_fixed, want_grad, loss_out, G_out, dA2_out):
    """Blocks ``lo … lo + len(loss_out) - 1`` of :func:`loss_grad_multi`, one slot each."""
    for b in prange(loss_out.shape[0]):
        loss_out[b] = _multi_block(lo + b, parents, tp, atoms, pk0, P, A2, eps, n_fixed, want_grad,
                                   G_out[b], dA2_out[b])


@njit(cache=True, error_model="numpy")
def loss_grad_multi_range_serial(lo, parents, tp, atoms, pk0, P, A2, eps, n_fixed, want_grad,
                                 loss_out, G_out, dA2_out):
    """:func:`loss_grad_multi_range` on the calling thread (same blocks, same bits)."""
    for b in range(loss_out.shape[0]):
        loss_out[b] = _multi_block(lo + b, parents, tp, atoms, pk0, P, A2, eps, n_fixed, want_grad,
                                   G_out[b], dA2_out[b])
