"""The full model's loss and gradient over a sampled batch, rows in the given order (DESIGN §18).

:func:`catformer_batch_loss_and_grad` takes the sum of
:func:`popgrad.engine.catformer.catformer_rows_loss_and_grad`,
``Σ_r Σ_c w[r, c] (-log(f_c(s_r) + ε))``, with the dense per-sequence kernel
(:mod:`popgrad.engine._kernels.catformer_rows`) instead of the trie walk, and also returns every
row's loss (the sampled trainer's standard error).

The one rule between the two row kernels: rows that share long prefixes -- every sequence of an
enumeration, a weight table, the canonical sequences of an orbit reduction -- go to the trie kernel
(:func:`~popgrad.engine.catformer.catformer_rows_loss_and_grad`, which sorts them and computes a shared
prefix once); a sampled batch (:func:`popgrad.train.catformer.batch_loss_and_grad`, the trainer's
``gradient="sampled"``) goes to this one, which neither sorts nor walks a trie.

Rows in the given order, cut into fixed blocks of ``max(catformer_rows_per_block, ⌈n / max_blocks⌉)`` rows;
each block writes one slot and the slots are added in block order: the bits are a function of the rows,
their order and the options, not of the thread count. (Reordering the rows changes the rounding only.)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._validation import warn_grad_overflow
from . import catformer as _ec
from ._kernels import catformer_rows as _kr
from ._kernels import single as _ks
from ._kernels.twins import use_parallel

__all__ = ["CatFormerBatchLossAndGrad", "catformer_batch_loss_and_grad"]


class CatFormerBatchLossAndGrad(NamedTuple):
    """Loss and gradients over explicit rows, with each row's loss (immutable).

    Attributes
    ----------
    loss : float
        ``Σ_r Σ_c w[r, c] (-log(f_c(s_r) + ε))``.
    dA : list of ndarray
        ``∂loss/∂Ã``, shapes as ``params.A``; ``None`` for a loss-only call.
    dW : ndarray, shape (d_L, S)
        ``∂loss/∂W``; ``None`` for a loss-only call.
    row_loss : ndarray, shape (n,)
        ``-Σ_c w[r, c] log(f_c(s_r) + ε)`` per row, in the given order (0 for a row of zero weights).
    """

    loss: float
    dA: list
    dW: np.ndarray
    row_loss: np.ndarray


class DenseJob(NamedTuple):
    """The model's arrays for the dense kernel: sizes, head table, padded ``Ã`` and transposes."""

    dims: np.ndarray
    hinfo: np.ndarray
    A: np.ndarray
    AT: np.ndarray
    EA: np.ndarray
    W: np.ndarray
    WT: np.ndarray
    heads_din: tuple
    a_shapes: tuple


def dense_job(model, params) -> DenseJob:
    """The dense kernel's arrays of validated ``params``."""
    S, T, dims = model.S, model.T, model.dims
    L = model.n_layers
    rows, din_of = [], []
    for l, m in enumerate(model.heads):
        d = dims[l]
        for k in range(m):
            rows.append((l + 1, d, d * (1 + k), 0))
            din_of.append(d)
    nh = len(rows)
    dmax = max(din_of)
    A = np.zeros((nh, dmax, dmax))
    g = 0
    for a in params.A:
        for k in range(a.shape[0]):
            d = a.shape[1]
            A[g, :d, :d] = a[k]
            g += 1
    AT = np.ascontiguousarray(A.transpose(0, 2, 1))
    d0 = dims[0]
    EA = np.zeros((nh, d0, d0))  # exp(Ã - rowmax) of the layer-1 heads (their scores without exp)
    if L > 1:
        A1 = A[:model.heads[0], :d0, :d0]
        EA[:model.heads[0]] = np.exp(A1 - A1.max(axis=2, keepdims=True))
    n_last = model.heads[-1]
    dl1, dL = dims[L - 1], dims[L]
    sizes = np.array([T, S, d0, max(dl1, d0), nh, dmax, dL, dl1, nh - n_last, n_last], dtype=np.uint64)
    W = np.ascontiguousarray(params.W, dtype=np.float64)
    return DenseJob(sizes, np.array(rows, dtype=np.uint64), A, AT, EA, W, np.ascontiguousarray(W.T), tuple(din_of),
                    tuple(a.shape for a in params.A))


def catformer_batch_loss_and_grad(seqs, w, model, params, eps=None, options=None,
                                  want_grad=True) -> CatFormerBatchLossAndGrad:
    """Loss ``Σ_r Σ_c w[r, c] (-log(f_c(s_r) + ε))`` over the given rows, its gradients and every row's loss.

    The sum of :func:`popgrad.catformer_rows_loss_and_grad` (same arguments and validation), with the
    dense per-sequence kernel: the rows in the given order, no sort, no trie (module docstring for
    which kernel takes which rows).

    Parameters
    ----------
    seqs : array_like of int, shape (n, T)
        Tokens in ``0 … S-1``, query last.
    w : array_like of float, shape (n, S)
        Finite weights ``≥ 0`` (``y / n`` for the batch mean of soft labels ``y``).
    model : CatFormer
    params : CatFormerParams
    eps : float, optional
        ``ε ≥ 0``; default ``0`` for the softmax readout, required for the linear one.
    options : EngineOptions, optional
        ``catformer_rows_per_block``, ``max_blocks`` (the blocks), ``parallel_min_sequences``.
    want_grad : bool, default True
        ``False``: loss and row losses only.

    Returns
    -------
    CatFormerBatchLossAndGrad
        ``loss``, ``dA``, ``dW``, ``row_loss``.

    Examples
    --------
    >>> import numpy as np, popgrad as pg
    >>> from popgrad.engine.catformer_rows import catformer_batch_loss_and_grad
    >>> model = pg.CatFormer(3, 4, heads=(1, 1))
    >>> params = model.init(0.5, 0)
    >>> rng = np.random.default_rng(0)
    >>> seqs, w = rng.integers(0, 3, size=(50, 4)), rng.random((50, 3))
    >>> r = catformer_batch_loss_and_grad(seqs, w, model, params)
    >>> ref = pg.catformer_rows_loss_and_grad(seqs, w, model, params)
    >>> bool(abs(r.loss - ref.loss) <= 1e-12 * abs(ref.loss)), bool(np.allclose(r.dW, ref.dW, rtol=1e-12))
    (True, True)
    >>> bool(abs(r.row_loss.sum() - r.loss) <= 1e-12 * abs(r.loss))
    True
    """
    seqs, w, params, eps, opts = _ec._validate_rows(seqs, w, model, params, eps, options)
    want_grad = bool(want_grad)
    job = dense_job(model, params)
    n = seqs.shape[0]
    per = max(int(opts.catformer_rows_per_block), -(-n // int(opts.max_blocks)))
    n_blocks = max(1, -(-n // per))
    nh, dmax = job.A.shape[0], job.A.shape[1]
    loss_s = np.zeros(n_blocks)
    dA_s = np.zeros((n_blocks, nh, dmax, dmax) if want_grad else (n_blocks, 0, 0, 0))
    dW_s = np.zeros((n_blocks, *job.W.shape) if want_grad else (n_blocks, 0, 0))
    row_loss = np.zeros(n)
    kernel = _kr.run_rows_dense if use_parallel(n_blocks, n, opts) else _kr.run_rows_dense_serial
    kernel(seqs, w, per, job.dims, job.hinfo, job.A, job.AT, job.EA, job.W, job.WT, float(eps),
           model.readout == "softmax", want_grad, row_loss, loss_s, dA_s, dW_s)
    loss = float(_ks.sum_slots(loss_s, dA_s, dW_s))
    res = _ec._finish(loss, [np.zeros(s) for s in job.a_shapes], np.zeros(job.W.shape), want_grad)
    if not want_grad:
        return CatFormerBatchLossAndGrad(res.loss, None, None, row_loss)
    if not np.isfinite(loss):  # _finish's NaN gradients (and its warning)
        return CatFormerBatchLossAndGrad(res.loss, res.dA, res.dW, row_loss)
    dA, g = [], 0
    for shape in job.a_shapes:
        m, d, _ = shape
        dA.append(np.ascontiguousarray(dA_s[0, g:g + m, :d, :d]))
        g += m
    dW = dW_s[0].copy()
    warn_grad_overflow("catformer_batch_loss_and_grad", [*dA, dW], (job.A, job.W))
    return CatFormerBatchLossAndGrad(loss, dA, dW, row_loss)
