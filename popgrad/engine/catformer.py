"""Exact population loss and gradients of the disentangled transformer (DESIGN §18).

``L(θ) = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)`` over all ``S**T`` sequences with
the task's exact weights ``w(s, c)`` (DESIGN §2; :class:`popgrad.Task` and
:class:`popgrad.MultiParentTask` alike), ``f`` the :class:`popgrad.CatFormer`
output; with the softmax readout and ``ε = 0`` (the default there) the loss is
the cross entropy, computed as a log-softmax.

Two implementations of the same sum:

* :func:`catformer_loss_and_grad_numpy` -- the NumPy reference
  (:func:`popgrad.model.catformer.catformer_backward` over chunks of
  :meth:`task.enumerate`);
* the numba trie engine (:mod:`popgrad.engine._kernels.catformer_walk` over the per-row kernels of
  :mod:`popgrad.engine._kernels.catformer`, used by
  :func:`catformer_loss_and_grad`): a depth-first walk of the prefix tree.
  Row ``t`` of every layer depends on ``s_0 … s_t`` only, so it is computed
  once per prefix node; the last layer is computed at the last position only
  (the leaves); the per-atom weight products are carried down the tree. The
  backward pass is reverse mode over the same tree: a leaf adds its adjoints
  of the rows ``j < T-1`` into per-depth buffers, and a node back-propagates
  its own row once, after all its children (DESIGN §18).

The enumeration is split into ``S**D`` fixed blocks (the sequences sharing
their first ``D`` tokens, ``D`` a function of ``S``, ``T`` and the options
only), on the block protocol of :mod:`popgrad.engine.blocks`: :func:`blocks`
decides the call, :func:`block_work` weighs the blocks, :func:`run_blocks` runs
a contiguous range of blocks into one slot each and :func:`finish_blocks` adds
the slots in block order, so the result does not depend on the thread count
nor on how a ``client=`` splits the range.

:func:`catformer_rows_loss_and_grad` takes the same sum over given rows with given weights (sampled
batches with soft labels, weight tables): the rows kernel walks the sorted rows as the paths of a trie.
Along relabeling-equivariant parameters on a relabeling-closed prior, :func:`catformer_loss_and_grad`
walks the canonical sub-trie only (one sequence per orbit, weights times orbit sizes) and symmetrizes the
gradient (DESIGN §21, :mod:`popgrad.engine.catformer_symmetry`); on the weight-table path (the official
continuous prior) the rows kernel runs the canonical rows with the table summed over each orbit instead;
``symmetry="off"`` turns that off.

Stable logs: the readout's log-softmax is ``(z_c - max z) - log Σ_c' e^(z_c' - max z)``; the last term
lies in ``[0, log S]`` and is never added to a large logit, so no loss rounds below its floor.
"""
from __future__ import annotations

import math
import time
import warnings
from typing import NamedTuple

import numpy as np

from .._validation import ArgumentTypeError, as_eps, as_seqs, warn_grad_overflow, warn_inf
from ..model.catformer import CatFormer, catformer_backward, check_task_model
from ..task.tasks import MultiParentTask, Task
from . import catformer_symmetry as _sym
from . import catformer_table as _ct
from . import table as _table
from ._args import options_or_default
from ._kernels import catformer as _kc
from ._kernels import specialize as _spec
from ._kernels.twins import use_parallel
from .symmetry import MAX_SYMMETRY_S, exactly_closed, orbit_sizes

__all__ = ["CatFormerLossAndGrad", "catformer_loss_and_grad", "catformer_loss", "catformer_loss_and_grad_numpy",
           "catformer_rows_loss_and_grad", "catformer_rows_loss_and_grad_numpy"]


class CatFormerLossAndGrad(NamedTuple):
    """Exact population loss of a :class:`popgrad.CatFormer` and its gradients (immutable).

    Attributes
    ----------
    loss : float
        ``L = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)``.
    dA : list of ndarray
        ``∂L/∂Ã``, the same list structure and shapes as ``params.A``. ``None`` for a loss-only call.
    dW : ndarray, shape (d_L, S)
        ``∂L/∂W``. ``None`` for a loss-only call.
    """

    loss: float
    dA: list
    dW: np.ndarray


def _validate(task, model, params, eps):
    params = check_task_model(task, model, params)
    if eps is None:
        eps = 0.0 if model.readout == "softmax" else as_eps(task, None)
    else:
        eps = as_eps(task, eps)
    return params, eps


def catformer_loss_and_grad(task, model, params, eps=None, client=None, options=None,
                            symmetry="auto") -> CatFormerLossAndGrad:
    """Exact population loss and every gradient of the disentangled transformer (DESIGN §18).

    Parameters
    ----------
    task : Task or MultiParentTask
        Graph and finite prior; ``S**T`` must pass ``task.check_size()``.
    model : CatFormer
        Same ``S`` and ``T`` as the task.
    params : CatFormerParams
        ``A[ℓ]`` of shape ``(m_ℓ, d_{ℓ-1}, d_{ℓ-1})``, ``W`` of shape ``(d_L, S)``; finite.
    eps : float, optional
        ``ε ≥ 0`` in ``-Σ w log(f + ε)``. Default: ``0`` for the softmax readout (cross entropy),
        ``task.default_eps`` (``T_eff**-0.5``) for the linear readout.
    client : dask.distributed.Client, optional
        Split the enumeration's blocks over the client's workers; bit-identical to ``client=None``.
    options : EngineOptions, optional
        ``prefix_block_sequences`` and ``max_blocks`` set the blocks; default :data:`popgrad.DEFAULT_OPTIONS`.
    symmetry : {"auto", "on", "off"}, default "auto"
        The exact orbit reduction (DESIGN §21, :mod:`popgrad.engine.catformer_symmetry`): ``"auto"`` uses
        it when the prior is exactly closed under relabeling, or continuous with a weight table invariant to
        ``TABLE_SYM_RTOL`` (single-parent task, ``S ≥ 2``), and ``params`` is relabeling-equivariant to
        ``EQUIV_RTOL`` (checked at every call); ``"on"`` requires it (else a ValueError naming the failed
        condition); ``"off"`` never. Where the weight table is read (DESIGN §20) the reduced sum runs on its
        orbit-summed rows (``orbit_table``, built once per task), else per atom; either way in this process
        (``client`` is then not used). The weight-table path (DESIGN §20) splits its blocks over ``client``
        like the per-atom path.

    Returns
    -------
    CatFormerLossAndGrad
        ``loss``, ``dA`` (list as ``params.A``), ``dW``.

    Raises
    ------
    TypeError, ValueError
        On a wrong argument (the message names it).
    TaskTooLargeError
        If ``S**T`` exceeds ``task.max_sequences`` (before any work).
    """
    params, eps = _validate(task, model, params, eps)
    return _dispatch(task, model, params, eps, True, client, options_or_default(options), symmetry)


def catformer_loss(task, model, params, eps=None, client=None, options=None, symmetry="auto") -> float:
    """Exact population loss only; same parameters and conventions as :func:`catformer_loss_and_grad`."""
    params, eps = _validate(task, model, params, eps)
    return _dispatch(task, model, params, eps, False, client, options_or_default(options), symmetry).loss


def _use_reduction(task, model, params, symmetry) -> bool:
    if symmetry not in ("auto", "on", "off"):
        raise ValueError(f"symmetry must be 'auto', 'on' or 'off', got {symmetry!r}")
    if symmetry == "off":
        return False
    if symmetry == "auto":
        return _sym.reduction_applies(task, model, params)
    single = isinstance(task, Task) and 2 <= task.S <= MAX_SYMMETRY_S
    if single and task.continuous and not _sym.table_reduction_applies(task):
        raise ValueError(f"symmetry='on' needs a weight table closed under relabeling (defect "
                         f"{_sym.orbit_table(task).defect:.3g} > TABLE_SYM_RTOL = {_sym.TABLE_SYM_RTOL:g}); "
                         "use symmetry='auto' or 'off'")
    if not single or (not task.continuous and not exactly_closed(task.prior)):
        raise ValueError("symmetry='on' needs a single-parent task with 2 <= S <= 8 whose prior is closed under "
                         "relabeling (e.g. FinitePrior.relabeling_closure); use symmetry='auto' or 'off'")
    if not _sym.is_equivariant(model, params):
        raise ValueError(f"symmetry='on' needs relabeling-equivariant params (defect "
                         f"{_sym.equivariance_defect(model, params):.3g} > EQUIV_RTOL * max|params|); "
                         "use symmetry='auto' or 'off'")
    return True


def _dispatch(task, model, params, eps, want_grad, client, opts, symmetry="off") -> CatFormerLossAndGrad:
    task.check_size()
    if client is not None:
        from . import distributed as _distributed

        _distributed.check_client(client)
    table = _table.use_table(task, per_atom=True)  # the one rule (DESIGN §20): the weight table's rows
    if _use_reduction(task, model, params, symmetry):
        if table:
            return _reduced_table(task, model, params, eps, want_grad, opts)
        return _reduced(task, model, params, eps, want_grad, opts)
    if table:
        tjob = _ct.blocks(task, blocks(None, model, params, eps, want_grad, opts), opts)
        if client is None:
            return finish_blocks(tjob.job, _ct.run_blocks(task, tjob))
        return finish_blocks(tjob.job, _over_client(client, task, tjob, tjob.job, _ct.block_work(task, tjob),
                                                    _ct.run_blocks))
    job = blocks(task, model, params, eps, want_grad, opts)
    if client is None:
        partials = run_blocks(task, job)
    else:
        partials = _over_client(client, task, job, job, block_work(task, job), run_blocks)
    return finish_blocks(job, partials)


def _over_client(client, task, job, walk_job, work, run):
    """``job``'s blocks over the client's workers (imports no Dask itself); the wall time it waits counts
    towards ``"auto"`` for ``walk_job``'s layout, as this process's own walks do (``specialize.count``)."""
    from . import distributed as _distributed

    t0 = time.perf_counter()
    partials = _distributed.run_blocks(client, task, job, work, run)
    _spec.count(walk_job, time.perf_counter() - t0)
    return partials


# ====================================================================== explicit rows
def catformer_rows_loss_and_grad(seqs, w, model, params, eps=None, options=None,
                                 want_grad=True) -> CatFormerLossAndGrad:
    """Exact loss ``Σ_r Σ_c w[r, c] (-log(f_c(s_r) + ε))`` over given sequences and its gradients.

    The sum :func:`catformer_loss_and_grad` takes over every sequence with the task's weights, taken
    over the rows of ``seqs`` with the weights ``w`` instead: sampled training passes a sample with
    ``w = y / n`` (soft labels), a weight table passes its rows. With ``seqs`` every sequence and ``w``
    the task's weights it is the population loss (the same number up to rounding).

    Parameters
    ----------
    seqs : array_like of int, shape (n, T)
        Tokens in ``0 … S-1``, query last (``n ≥ 0``; a single ``(T,)`` row is promoted).
    w : array_like of float, shape (n, S)
        Finite weights ``≥ 0``; a row of zeros contributes nothing.
    model : CatFormer
    params : CatFormerParams
    eps : float, optional
        ``ε ≥ 0``. Default ``0`` for the softmax readout (cross entropy, as a log-softmax); required
        for the linear readout (the population default ``T_eff**-0.5`` needs a task).
    options : EngineOptions, optional
        ``catformer_rows_per_block`` (rows per block); default :data:`popgrad.DEFAULT_OPTIONS`.
    want_grad : bool, default True
        ``False``: the loss only (``dA``, ``dW`` are ``None``).

    Returns
    -------
    CatFormerLossAndGrad

    Notes
    -----
    The rows are sorted (by their tokens, ties by their weights) and cut into blocks of
    ``catformer_rows_per_block`` rows; within a block consecutive rows share the rows of their
    common prefix (a trie walk); each block writes one slot and the slots are added in block order.
    The result depends on the multiset of (row, weights) pairs and the options only: the same bits
    for any thread count and any order of the given rows.

    Examples
    --------
    Every sequence with the task's weights gives the population loss and gradient:

    >>> import numpy as np, popgrad as pg
    >>> task = pg.Task(pg.chain(3), pg.dirichlet_prior(2, 1.0, 3, seed=0))
    >>> model = pg.CatFormer(2, 3, heads=(1, 1))
    >>> params = model.init(0.1, 0)
    >>> seqs, w = task.all_sequences()
    >>> rows = pg.catformer_rows_loss_and_grad(seqs, w, model, params)
    >>> full = pg.catformer_loss_and_grad(task, model, params)
    >>> bool(np.isclose(rows.loss, full.loss, rtol=1e-12, atol=0)), bool(np.abs(rows.dW).max() > 0)
    (True, True)
    >>> bool(np.allclose(rows.dW, full.dW, rtol=1e-10, atol=1e-15))
    True
    """
    seqs, w, params, eps, opts = _validate_rows(seqs, w, model, params, eps, options)
    job = blocks(None, model, params, eps, want_grad, opts)
    if seqs.shape[0]:
        order = np.lexsort(np.concatenate([w.T[::-1], seqs.T[::-1]]))  # by tokens, ties by weights
        seqs = np.ascontiguousarray(seqs[order])
        w = np.ascontiguousarray(w[order])
    return finish_blocks(job, _rows_partials(job, seqs, w, opts))


def _rows_partials(job, seqs, w, opts) -> CatFormerPartials:
    """The rows kernel on sorted rows: blocks of ``max(catformer_rows_per_block, ⌈n / max_blocks⌉)`` rows."""
    n = seqs.shape[0]
    per = max(int(opts.catformer_rows_per_block), -(-n // int(opts.max_blocks)))
    n_blocks = max(1, -(-n // per))
    loss_s = np.zeros(n_blocks)
    gr_s = np.zeros((n_blocks, job.n_A + job.w_shape[0] * job.w_shape[1]))
    _spec.run(job, "run_rows", use_parallel(n_blocks, n, opts), seqs, w, per, job.sizes, job.hinfo, job.prm, job.eps,
              job.softmax_readout, job.want_grad, loss_s, gr_s)
    return CatFormerPartials(loss_s, gr_s)


# ====================================================================== the orbit reduction (DESIGN §21)
def _reduced(task, model, params, eps, want_grad, opts) -> CatFormerLossAndGrad:
    """The orbit-reduced sum (:mod:`popgrad.engine.catformer_symmetry`): the trie walk over the canonical
    sequences only, each leaf's weights times its orbit size (the same blocks as the full walk, so the
    bits do not depend on the thread count), then ``Sym``."""
    job = blocks(task, model, params, eps, want_grad, opts)
    ids = _canonical_blocks(task.S, job.n_fixed)  # the other blocks are empty: run these only (balanced threads)
    job = job._replace(canon=True, orbit=orbit_sizes(task.S), ids=ids, n_blocks=len(ids),
                       parallel=use_parallel(len(ids), task.n_sequences, opts))
    return _symmetrized(model, finish_blocks(job, run_blocks(task, job)), want_grad)


def _reduced_table(task, model, params, eps, want_grad, opts) -> CatFormerLossAndGrad:
    """The orbit-reduced sum on the table path: the rows kernel over the canonical sequences with the
    orbit-summed weights of :func:`popgrad.engine.catformer_symmetry.orbit_table` (built once per task), then
    ``Sym``. For equivariant ``θ`` the loss is the table's loss and the gradient ``Sym`` of the table's
    gradient, exactly (DESIGN §21): the same numbers as the full table up to its measured defect."""
    orb = _sym.orbit_table(task)
    job = blocks(None, model, params, eps, want_grad, opts)
    return _symmetrized(model, finish_blocks(job, _rows_partials(job, orb.seqs, orb.w, opts)), want_grad)


def _symmetrized(model, res, want_grad) -> CatFormerLossAndGrad:
    """A reduced sum's result with its gradient symmetrized (``Sym``: the same bits on every coordinate orbit)."""
    if not want_grad or not math.isfinite(res.loss):
        return res
    dA, dW = _sym.symmetrize_params(model, res.dA, res.dW)
    return CatFormerLossAndGrad(res.loss, dA, dW)


def _canonical_blocks(S, n_fixed) -> np.ndarray:
    """The blocks (base-``S`` numbers of their fixed tokens) whose fixed tokens are canonical, increasing."""
    ids = [0]
    mx = [-1]
    for _ in range(n_fixed):
        ids, mx = zip(*[(b * S + c, max(m, c)) for b, m in zip(ids, mx) for c in range(min(S, m + 2))])
    return np.array(ids, dtype=np.int64)


def catformer_rows_loss_and_grad_numpy(seqs, w, model, params, eps=None, chunk=4096) -> CatFormerLossAndGrad:
    """NumPy reference of :func:`catformer_rows_loss_and_grad` (:func:`popgrad.model.catformer.catformer_backward`
    over chunks of the rows, in the given order)."""
    seqs, w, params, eps, _ = _validate_rows(seqs, w, model, params, eps, None)
    loss = 0.0
    dA = [np.zeros_like(a) for a in params.A]
    dW = np.zeros_like(params.W)
    for lo in range(0, seqs.shape[0], int(chunk)):
        l_c, dA_c, dW_c = catformer_backward(model, params, seqs[lo:lo + chunk], w[lo:lo + chunk], eps)
        loss += l_c
        for a, b in zip(dA, dA_c):
            a += b
        dW += dW_c
    return _finish(loss, dA, dW, True, (*params.A, params.W))


def _validate_rows(seqs, w, model, params, eps, options):
    if not isinstance(model, CatFormer):
        raise ArgumentTypeError(f"model must be a popgrad.CatFormer, got {type(model).__name__}")
    params = model.check_params(params)
    seqs = as_seqs(seqs, model.T, model.S)
    try:
        w = np.asarray(w, dtype=np.float64)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"w must be a real array of shape (n, S) = ({seqs.shape[0]}, {model.S})") from None
    if w.ndim == 1 and seqs.shape[0] == 1:
        w = w[None, :]
    if w.shape != (seqs.shape[0], model.S):
        raise ValueError(f"w must have shape (n, S) = ({seqs.shape[0]}, {model.S}) (one weight per row and class), "
                         f"got {w.shape}")
    if not np.all(np.isfinite(w)) or (w.size and w.min() < 0):
        bad = tuple(int(i) for i in np.argwhere(~(np.isfinite(w) & (w >= 0)))[0])
        raise ValueError(f"w{list(bad)} = {w[bad]}: weights must be finite and >= 0")
    if eps is None:
        if model.readout != "softmax":
            raise ValueError("eps is required with the linear readout (e.g. eps=task.default_eps)")
        eps = 0.0
    else:
        eps = as_eps(None, eps)
    return np.ascontiguousarray(seqs, dtype=np.int64), np.ascontiguousarray(w), params, eps, \
        options_or_default(options)


# ====================================================================== the trie engine
class CatFormerJob(NamedTuple):
    """One evaluation, decided (the block protocol of :mod:`popgrad.engine.blocks`): the model's flat arrays
    and the block structure.

    ``sizes`` is a :class:`popgrad.engine._kernels.catformer.Layout` (the kernels' named sizes and offsets);
    ``hinfo[g] = (layer, d_in, out offset, offset in Af)`` for the heads in global order (layer by layer;
    the last layer's heads last); ``prm = [Af | AfT | W | WT]`` flat (``AfT`` every head's ``Ãᵀ``);
    ``a_shapes`` the shapes of ``params.A`` (to unflatten the gradient). ``canon``: the blocks walk the
    canonical sequences only, each leaf's weights times ``orbit[m]`` (its orbit size, ``m`` distinct
    tokens): the orbit-reduced sum of DESIGN §21, before ``Sym``; ``ids`` the blocks that run (slot ``b`` is
    block ``ids[b]``; ``None``: all, in order). ``specialized``: run the walks compiled for this layout
    (:func:`popgrad.engine._kernels.specialize.walks`; ``EngineOptions.catformer_specialize``).
    """

    n_fixed: int
    n_blocks: int
    sizes: tuple
    hinfo: np.ndarray
    prm: np.ndarray
    n_A: int
    w_shape: tuple
    a_shapes: tuple
    eps: float
    softmax_readout: bool
    want_grad: bool
    parallel: bool
    canon: bool = False
    orbit: np.ndarray = None
    ids: np.ndarray = None
    specialized: bool = False


class CatFormerPartials(NamedTuple):
    """Per-block slots of a range of ``n`` blocks, in block order: ``loss (n,)``, ``gr (n, n_A + d_L·S)``
    (``gr[b] = [dA | dW]`` flat; ``(n, 0)`` for a loss-only job)."""

    loss: np.ndarray
    gr: np.ndarray


def block_count(S, T, opts):
    """``(n_fixed, n_blocks)``: blocks fix the first ``n_fixed`` tokens, ``n_blocks = S**n_fixed``.

    Each block holds at least ``opts.prefix_block_sequences`` sequences (or all of them): ``n_fixed = T - f``
    with ``f ≤ T`` the smallest count with ``S**f ≥ prefix_block_sequences``; then ``n_fixed`` is lowered
    until ``S**n_fixed ≤ opts.max_blocks``. A function of ``S``, ``T`` and the options only.
    """
    free = 0
    while free < T and S**free < opts.prefix_block_sequences:
        free += 1
    n_fixed = T - free
    while n_fixed > 0 and S**n_fixed > opts.max_blocks:
        n_fixed -= 1
    return n_fixed, S**n_fixed


def blocks(task, model, params, eps, want_grad, opts) -> CatFormerJob:
    """The call's job on validated input (``task=None``: explicit rows, no enumeration)."""
    if task is not None:
        task.check_size()
    S, T, dims = model.S, model.T, model.dims
    L = model.n_layers
    rows, off = [], 0
    for l, m in enumerate(model.heads):
        d = dims[l]
        for k in range(m):
            rows.append((l + 1, d, d * (1 + k), off))
            off += d * d
    hinfo = np.array(rows, dtype=np.int64)
    Af = np.concatenate([a.reshape(-1) for a in params.A])
    AfT = np.concatenate([a.transpose(0, 2, 1).reshape(-1) for a in params.A])
    prm = np.ascontiguousarray(np.concatenate([Af, AfT, params.W.reshape(-1), params.W.T.reshape(-1)]))
    n_last = model.heads[-1]
    n_inner = len(rows) - n_last
    sizes = _kc.make_sizes(T, S, dims[0], dims[L - 1], len(rows), max(r[1] for r in rows), n_last, dims[L],
                           len(Af), n_inner)
    n_fixed, n_blocks = block_count(S, T, opts)
    parallel = task is not None and use_parallel(n_blocks, task.n_sequences, opts)
    return CatFormerJob(n_fixed, n_blocks, sizes, hinfo, prm, len(Af), tuple(params.W.shape),
                        tuple(a.shape for a in params.A), float(eps), model.readout == "softmax", bool(want_grad),
                        parallel, specialized=_spec.decide(sizes, hinfo, opts))


def block_work(task, job) -> np.ndarray:
    """Relative cost of each block, ``(n_blocks,)`` int64: all equal (whole subtrees of one size)."""
    return np.ones(job.n_blocks, dtype=np.int64)


def weight_arrays(task):
    """The task's exact weights as per-position factor tables (both task kinds; DESIGN §2, §9).

    ``w(s, c) = Σ_k pk0[k] Π_t ftab[k, roff[t] + r_t(s), s_t] · ttab[k, troff + r_tp(s), c]``, with
    ``r_t(s) = Σ_h s[par[t, h]] S^{npar[t]-1-h}`` the flat row of position ``t``'s parents.
    Returns ``(npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT)``, the tables atoms last
    (``ftabT[row, token, k] = ftab[k, row, token]``: the kernels' products run over contiguous atoms).
    """
    S, T = task.S, task.T
    if isinstance(task, MultiParentTask):
        parents, tp, atoms, pk0 = task.kernel_arrays()
        K, k = atoms.shape[0], parents.shape[1]
        ftab = np.concatenate([np.ones((K, 1, S)), atoms], axis=1)
        root = parents[:, 0] < 0
        npar = np.where(root, 0, k).astype(np.int64)
        par = np.where(root[:, None], 0, parents).astype(np.int64)
        roff = np.where(root, 0, 1).astype(np.int64)
        return (npar, np.ascontiguousarray(par), roff, _atoms_last(ftab), pk0, int(k),
                np.ascontiguousarray(tp, dtype=np.int64), 0, _atoms_last(atoms))
    parents, mu, atoms, prior_w = task.kernel_arrays()
    K = atoms.shape[0]
    ftab = np.concatenate([np.ones((K, 1, S)), mu[:, None, :], atoms], axis=1)
    npar = np.zeros(T, dtype=np.int64)
    par = np.zeros((T, 1), dtype=np.int64)
    roff = np.zeros(T, dtype=np.int64)
    for t in range(T - 1):  # the query (T-1) is uniform: its factor 1/S is in pk0
        if parents[t] < 0:
            roff[t] = 1
        else:
            npar[t], par[t, 0], roff[t] = 1, parents[t], 2
    return (npar, par, roff, _atoms_last(ftab), np.ascontiguousarray(prior_w / S), 1,
            np.array([T - 1], dtype=np.int64), 0, _atoms_last(atoms))


def _atoms_last(tab):
    """``(K, R, S) -> (R, S, K)``, contiguous."""
    return np.ascontiguousarray(np.transpose(tab, (1, 2, 0)))


def run_blocks(task, job, lo=0, hi=None) -> CatFormerPartials:
    """The slots of blocks ``lo … hi-1`` of ``job`` (``hi=None``: to the last), bit for bit those of a
    whole-range run (a Dask worker runs a chunk, :mod:`popgrad.engine.distributed`)."""
    hi = job.n_blocks if hi is None else hi
    n = hi - lo
    npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT = weight_arrays(task)
    loss_s = np.zeros(n)
    gr_s = np.zeros((n, job.n_A + job.w_shape[0] * job.w_shape[1]))
    orbit = np.ones(job.sizes.S + 1) if job.orbit is None else job.orbit
    ids = np.arange(job.n_blocks, dtype=np.int64) if job.ids is None else job.ids
    _spec.run(job, "run_blocks", job.parallel and n > 1, lo, ids, job.n_fixed, job.sizes, job.hinfo, job.prm, npar,
              par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT, job.eps, job.softmax_readout, job.want_grad,
              bool(job.canon), orbit, loss_s, gr_s)
    return CatFormerPartials(loss_s, gr_s if job.want_grad else np.zeros((n, 0)))


def finish_blocks(job, partials) -> CatFormerLossAndGrad:
    """All blocks' slots, in block order: added in block order, ``[dA | dW]`` unflattened as ``params``."""
    loss_s, gr_s = partials
    if not job.want_grad:
        return _finish(float(_kc.sum_loss(loss_s)), None, None, False)
    loss = float(_kc.sum_slots(loss_s, gr_s))
    dA, dW = _unflatten(job, gr_s[0])
    return _finish(loss, dA, dW, True, (job.prm,))


def _unflatten(job, g):
    """``[dA | dW]`` flat -> ``(dA list, dW)`` (copies)."""
    dA, off = [], 0
    for shape in job.a_shapes:
        size = int(np.prod(shape))
        dA.append(g[off:off + size].reshape(shape).copy())
        off += size
    return dA, g[off:].reshape(job.w_shape).copy()


def catformer_loss_and_grad_numpy(task, model, params, eps=None, chunk=4096) -> CatFormerLossAndGrad:
    """NumPy reference of :func:`catformer_loss_and_grad` (same sums, whole-chunk arrays, slower)."""
    params, eps = _validate(task, model, params, eps)
    task.check_size()
    return _reference(task, model, params, eps, True, chunk)


def _reference(task, model, params, eps, want_grad, chunk) -> CatFormerLossAndGrad:
    loss = 0.0
    dA = [np.zeros_like(a) for a in params.A]
    dW = np.zeros_like(params.W)
    for seqs, w in task.enumerate(chunk_size=chunk):
        l_c, dA_c, dW_c = catformer_backward(model, params, seqs, w, eps)
        loss += l_c
        for a, b in zip(dA, dA_c):
            a += b
        dW += dW_c
    return _finish(loss, dA, dW, want_grad, (*params.A, params.W))


def _finish(loss, dA, dW, want_grad, params=()) -> CatFormerLossAndGrad:
    """The result: NaN gradients and a warning for an infinite or NaN loss; a warning for a finite loss whose
    gradient overflowed (``params``: the parameter arrays, for the message)."""
    if want_grad and math.isfinite(loss):
        warn_grad_overflow("catformer_loss_and_grad", [*dA, dW], params)
    if math.isinf(loss) or math.isnan(loss):
        if math.isinf(loss):
            warn_inf("catformer_loss_and_grad")
        else:
            warnings.warn("catformer_loss_and_grad: the loss is NaN: with the linear readout some sequence with "
                          "positive weight has f_c + eps <= 0 (log undefined); gradients are NaN",
                          RuntimeWarning, stacklevel=3)
        if want_grad:
            dA = [np.full_like(a, np.nan) for a in dA]
            dW = np.full_like(dW, np.nan)
    if not want_grad:
        return CatFormerLossAndGrad(float(loss), None, None)
    return CatFormerLossAndGrad(float(loss), dA, dW)
