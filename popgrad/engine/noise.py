"""The per-sample gradient's exact mean and covariance: the noise a sampled run sees (issue 22).

A **sample** is ``(π, s)``: an atom ``π_k`` drawn with probability ``ρ_k``, a
sequence ``s ~ P(· | π_k)``, and the soft label ``y = π_k(· | q)`` (as the
official code and :meth:`popgrad.Task.sample` draw them). Its loss and
gradient are::

    ℓ(s, y) = Σ_c y_c ℓ_c(s),   ℓ_c(s) = -log(f_c(s) + ε),   ∇ℓ(s, y) = Σ_c y_c ∇ℓ_c(s).

Over the task's finite prior, every moment is a finite sum over the ``S**T``
sequences, with the weights ``w(s, c) = Σ_k ρ_k p_k(s) π_k(c|q)`` (DESIGN §2)
for the mean and, for the second moment, the ``S×S`` matrix
``Y2(s)[c, c'] = Σ_k ρ_k p_k(s) π_k(c|q) π_k(c'|q)``::

    E[∇ℓ]     = Σ_s Σ_c   w(s,c)       ∇ℓ_c(s)                 (= the exact population gradient)
    Cov[∇ℓ]   = Σ_s Σ_cc' Y2(s)[c,c']  ∇ℓ_c(s) ∇ℓ_c'(s)ᵀ  -  E[∇ℓ] E[∇ℓ]ᵀ
    Var[ℓ]    = Σ_s Σ_cc' Y2(s)[c,c']  ℓ_c(s) ℓ_c'(s)      -  L²

One enumeration pass, no sampling. A batch of ``B`` independent samples
(the mean of their gradients) has covariance ``cov / B``.

A continuous prior (:class:`popgrad.DirichletPrior`, :class:`popgrad.DirichletTensorPrior`: a fresh ``π``
per sample) has the same moments with ``w`` and ``Y2`` its prior means; the kernels then read ``w`` from
the task's weight table and ``Y2`` from the second-moment table
(:func:`popgrad.engine.table.second_moment_table`), and so does a finite prior whose table was prepared
(the one rule, :func:`popgrad.engine.table.use_table`; DESIGN §20).

Coordinates: the gradient is flattened as
``concat(dA1[np.tril_indices(T)], dA2.ravel())`` (``D = T(T+1)/2 + S²``);
for a k-head task ``concat(dA1[0][tril], …, dA1[k-1][tril], dA2.ravel())``
(``A1`` head by head, then ``A2`` head by head, ``D = k·T(T+1)/2 + k·S²``).
:func:`flatten_grad` is that map.

Kernels: :mod:`popgrad.engine._kernels.noise` (numba, blocks summed in
order: thread-count independent) on the block protocol of
:mod:`popgrad.engine.blocks` (:func:`blocks`, :func:`block_work`,
:func:`run_blocks`, :func:`finish_blocks`; ``client=`` splits the blocks over
Dask workers, bit-identical); NumPy reference :func:`gradient_noise_numpy`
(the per-token gradients of a chunk as arrays, ``Jᵀ Y2 J`` as one product).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import warn_inf
from ..model.multihead import _forward as multihead_forward
from ..model.multihead import head_attention
from ..model.reduced import first_layer_attention, softmax
from ..task.tasks import MultiParentTask, decode_sequences, parent_rows
from ._args import options_or_default, validate
from . import table as _table
from ._kernels import noise as _kn
from ._kernels.twins import use_parallel
from .result import LossAndGrad

__all__ = ["GradientNoise", "gradient_noise", "gradient_noise_numpy", "flatten_grad", "stage1_row_noise",
           "RowNoise"]

def noise_blocks(n_sequences, opts) -> tuple:
    """``(n_blocks, block)`` covering ``n_sequences``: blocks of at least ``opts.noise_block_sequences``
    sequences, at most ``opts.noise_max_blocks`` of them (each slot is ``D×D`` or ``T×T×T``); a function of
    the count and the options only."""
    n_blocks = min(opts.noise_max_blocks, max(1, -(-n_sequences // opts.noise_block_sequences)))
    return n_blocks, -(-n_sequences // n_blocks)


class NoiseJob(NamedTuple):
    """One call of the noise engine, decided (the block protocol of :mod:`popgrad.engine.blocks`).

    ``mode`` is ``"moments"`` (:func:`gradient_noise`) or ``"rows"`` (:func:`stage1_row_noise`); ``k`` the
    heads of a k-parent task (``None``: single-parent); ``P`` the layer-1 attention, ``A2``, ``eps``;
    ``n_blocks`` blocks of ``block`` consecutive sequence numbers; ``parallel`` the twin to run; ``table``
    the weight-table path (:func:`popgrad.engine.table.use_table`, DESIGN §20) or the per-atom sums.
    """

    mode: str
    S: int
    T: int
    k: object
    P: np.ndarray
    A2: np.ndarray
    eps: float
    n_blocks: int
    block: int
    parallel: bool
    table: bool = False


class MomentPartials(NamedTuple):
    """Per-block slots of :func:`gradient_noise`: ``mean (n, D)``, ``M2 (n, D, D)``, ``moments (n, 2)``."""

    mean: np.ndarray
    M2: np.ndarray
    moments: np.ndarray


class RowPartials(NamedTuple):
    """Per-block slots of :func:`stage1_row_noise`: ``mean (n, T, T)``, ``R (n, T, T, T)``."""

    mean: np.ndarray
    R: np.ndarray


class GradientNoise(NamedTuple):
    """Exact moments of the per-sample loss and gradient (module docstring).

    Attributes
    ----------
    mean : LossAndGrad
        ``E[ℓ]`` and ``E[∇ℓ]``: the exact population loss and gradient.
    cov : ndarray of float64, shape (D, D)
        ``Cov[∇ℓ]`` over the coordinates of :func:`flatten_grad`. A batch of
        ``B`` samples has covariance ``cov / B``.
    row_cov : ndarray of float64, shape (T, T, T), or (k, T, T, T)
        ``row_cov[i] = Cov[dA1[i, :]]`` (head ``h``: ``row_cov[h, i]``); zero
        outside ``[:i+1, :i+1]``.
    loss_var : float
        ``Var[ℓ]``.
    """

    mean: LossAndGrad
    cov: np.ndarray
    row_cov: np.ndarray
    loss_var: float


class RowNoise(NamedTuple):
    """Mean ``dA1`` and its per-row covariances (:func:`stage1_row_noise`).

    Attributes
    ----------
    dA1 : ndarray (T, T)
        ``E[∇_{A1} ℓ]`` (the exact population ``dA1``).
    row_cov : ndarray (T, T, T)
        ``row_cov[i] = Cov[∇_{A1[i, :]} ℓ]`` of one sample.
    """

    dA1: np.ndarray
    row_cov: np.ndarray


def flatten_grad(dA1, dA2) -> np.ndarray:
    """The coordinates of :attr:`GradientNoise.cov`: ``concat(dA1[tril], dA2.ravel())``, head by head.

    Parameters
    ----------
    dA1 : array (T, T) or (k, T, T)
    dA2 : array (S, S) or (k, S, S)

    Returns
    -------
    ndarray of float64, shape (D,)
    """
    dA1 = np.asarray(dA1, dtype=np.float64)
    dA2 = np.asarray(dA2, dtype=np.float64)
    T = dA1.shape[-1]
    r, c = np.tril_indices(T)
    return np.concatenate([dA1[..., r, c].ravel(), dA2.ravel()])


def gradient_noise(task, A1, A2, eps=None, options=None, client=None) -> GradientNoise:
    """Exact mean and covariance of the per-sample gradient at ``(A1, A2)`` (module docstring).

    Parameters
    ----------
    task : Task or MultiParentTask
        Enumerable (``task.check_size()``).
    A1 : array_like, shape (T, T), or (k, T, T)
    A2 : array_like, shape (S, S), or (k, S, S)
    eps : float, optional
        Loss perturbation; default ``task.default_eps``.
    options : EngineOptions, optional
        ``noise_block_sequences``, ``noise_max_blocks`` (the blocks) and ``parallel_min_sequences``;
        default :data:`popgrad.DEFAULT_OPTIONS`.
    client : dask.distributed.Client, optional
        Split the blocks over the client's workers; bit-identical to ``client=None``.

    Returns
    -------
    GradientNoise
        ``mean`` (:class:`LossAndGrad`), ``cov`` (``D×D``), ``row_cov``, ``loss_var``.
        With ``ε = 0`` and a token of positive weight with zero predicted mass the
        loss is infinite: a ``RuntimeWarning``, and every moment is NaN.

    Raises
    ------
    ValueError, TypeError
        On a wrong task, shape, non-finite entry or ``eps``.
    TaskTooLargeError
        If ``S**T`` exceeds ``task.max_sequences``.
    """
    A1, A2, eps = validate(task, A1, A2, eps)
    return _run(task, blocks(task, A1, A2, eps, "moments", options_or_default(options)), client)


def stage1_row_noise(task, A1, A2, eps=None, options=None, client=None) -> RowNoise:
    """Mean ``dA1`` and its per-row covariances only, for a single-parent task (``O(T³)`` per sequence).

    The rows of :func:`gradient_noise` (``row_cov`` equal to rounding) without the ``D×D`` matrix:
    what the Stage-1 sample-complexity check needs, at ``T`` up to about 22 for ``S = 2``. ``options`` and
    ``client`` as in :func:`gradient_noise`.
    """
    A1, A2, eps = validate(task, A1, A2, eps)
    if isinstance(task, MultiParentTask):
        raise ValueError("stage1_row_noise: single-parent tasks only; use gradient_noise(task, ...).row_cov")
    return _run(task, blocks(task, A1, A2, eps, "rows", options_or_default(options)), client)


def _run(task, job, client):
    if client is None:
        return finish_blocks(job, run_blocks(task, job))
    from . import distributed as _distributed

    return finish_blocks(job, _distributed.run_blocks(client, task, job, block_work(task, job), run_blocks))


# ------------------------------------------------------------ the block runner (engine/blocks.py)
def blocks(task, A1, A2, eps, mode, opts) -> NoiseJob:
    """The call's job on validated input: ``mode`` ``"moments"`` or ``"rows"`` (single-parent only)."""
    if mode not in ("moments", "rows"):
        raise ValueError(f"mode must be 'moments' or 'rows', got {mode!r}")
    task.check_size()
    multi = isinstance(task, MultiParentTask)
    if multi and mode == "rows":
        raise ValueError("the row noise is for single-parent tasks only")
    n_blocks, block = noise_blocks(task.n_sequences, opts)
    P = np.ascontiguousarray(head_attention(A1) if multi else first_layer_attention(A1))
    return NoiseJob(mode, task.S, task.T, task.k if multi else None, P, np.ascontiguousarray(A2, dtype=np.float64),
                    float(eps), n_blocks, block, use_parallel(n_blocks, task.n_sequences, opts),
                    _table.use_table(task, per_atom=True))  # the one rule (DESIGN §20)


def block_work(task, job) -> np.ndarray:
    """Relative cost of each block, ``(n_blocks,)`` int64: all equal (the last may be shorter)."""
    return np.ones(job.n_blocks, dtype=np.int64)


def run_blocks(task, job, lo=0, hi=None):
    """The slots of blocks ``lo … hi-1`` (``hi=None``: to the last): :class:`MomentPartials` or
    :class:`RowPartials`, bit for bit those of a whole-range run."""
    hi = job.n_blocks if hi is None else hi
    n = hi - lo
    S, T = job.S, job.T
    par = job.parallel and n > 1
    weights = _weight_arrays(task, job, lo, hi)
    if job.mode == "rows":
        mean_s, R_s = np.zeros((n, T, T)), np.zeros((n, T, T, T))
        kernel = _kn.row_moments_single if par else _kn.row_moments_single_serial
        kernel(lo, *weights, job.P, job.A2, job.eps, job.block, mean_s, R_s)
        return RowPartials(mean_s, R_s)
    heads = 1 if job.k is None else job.k
    D = heads * (T * (T + 1) // 2 + S * S)
    mean_s, M2_s, mom_s = np.zeros((n, D)), np.zeros((n, D, D)), np.zeros((n, 2))
    if job.k is None:
        kernel = _kn.moments_single if par else _kn.moments_single_serial
    else:
        kernel = _kn.moments_multi if par else _kn.moments_multi_serial
    kernel(lo, *weights, job.P, job.A2, job.eps, job.block, mean_s, M2_s, mom_s)
    return MomentPartials(mean_s, M2_s, mom_s)


def _weight_arrays(task, job, lo, hi):
    """The kernels' weight arguments for blocks ``lo … hi-1``: ``(*kernel_arrays, wtab, y2tab, row0)``.

    Table path: the rows of the task's weight table and of the second-moment table
    (:func:`popgrad.engine.table.second_moment_rows`) covering the blocks, ``row0`` the first sequence, and
    empty atom arrays; per-atom path: the task's atoms and empty tables.
    """
    S = job.S
    if not job.table:
        return (*task.kernel_arrays(), np.zeros((0, S)), np.zeros((0, S, S)), 0)
    start, stop = lo * job.block, min(task.n_sequences, hi * job.block)
    seqs_w = _table.table_rows(task, start, stop)[1]
    y2 = _table.second_moment_rows(task, start, stop)
    parents = np.ascontiguousarray(task.graph.parents, dtype=np.int64)
    if job.k is None:
        none = (parents, np.zeros((0, S)), np.zeros((0, S, S)), np.zeros(0))
    else:
        tp = np.ascontiguousarray(task.graph.target_parents, dtype=np.int64)
        none = (parents, tp, np.zeros((0, S**job.k, S)), np.zeros(0))
    return (*none, np.ascontiguousarray(seqs_w), np.ascontiguousarray(y2), start)


def finish_blocks(job, partials):
    """All blocks' slots, in block order: summed in block order, then the moments assembled
    (:class:`GradientNoise` or :class:`RowNoise`)."""
    if job.mode == "rows":
        mean, R = _kn.sum_blocks(partials.mean), _kn.sum_blocks(partials.R)
        row_cov = R - mean[:, :, None] * mean[:, None, :]
        return RowNoise(mean, 0.5 * (row_cov + np.swapaxes(row_cov, 1, 2)))
    return _assemble(job.S, job.T, job.k, _kn.sum_blocks(partials.mean), _kn.sum_blocks(partials.M2),
                     _kn.sum_blocks(partials.moments))


def _assemble(S, T, k, mean, M2, moments) -> GradientNoise:
    """``GradientNoise`` from the summed first and second moments (shared by kernel and reference)."""
    loss = float(moments[0])
    D1 = T * (T + 1) // 2
    if not math.isfinite(loss):
        warn_inf("gradient_noise")
        mean = np.full_like(mean, np.nan)
        M2 = np.full_like(M2, np.nan)
    cov = M2 - np.outer(mean, mean)
    cov = 0.5 * (cov + cov.T)
    r, c = np.tril_indices(T)
    heads = 1 if k is None else k
    dA1 = np.zeros((heads, T, T))
    dA1[:, r, c] = mean[: heads * D1].reshape(heads, D1)
    dA2 = mean[heads * D1:].reshape(heads, S, S)
    row_cov = np.zeros((heads, T, T, T))
    for h in range(heads):
        for i in range(T):
            lo = h * D1 + i * (i + 1) // 2
            row_cov[h, i, : i + 1, : i + 1] = cov[lo: lo + i + 1, lo: lo + i + 1]
    loss_var = float(moments[1]) - loss * loss if math.isfinite(loss) else float("nan")
    if k is None:
        dA1, dA2, row_cov = dA1[0], dA2[0], row_cov[0]
    return GradientNoise(LossAndGrad(loss, dA1, dA2), cov, row_cov, loss_var)


# ============================================================ NumPy reference
def gradient_noise_numpy(task, A1, A2, eps=None, chunk=4096) -> GradientNoise:
    """Plain-NumPy reference of :func:`gradient_noise` (same result up to rounding).

    Per chunk: the per-atom probabilities ``p_k(s)``, hence ``w`` and ``Y2`` (a continuous prior has no
    atoms: the rows of its weight table and second-moment table, :func:`popgrad.engine.table.second_moment_rows`,
    the same weights the kernels read); the per-token gradients ``J[n, c, :] = flatten_grad(∇ℓ_c(s_n))`` as
    whole arrays; then ``Σ_n J_nᵀ Y2_n J_n`` as one matrix product.
    """
    A1, A2, eps = validate(task, A1, A2, eps)
    task.check_size()
    S, T = task.S, task.T
    multi = isinstance(task, MultiParentTask)
    mean = M2 = None
    moments = np.zeros(2)
    for c0 in range(0, task.n_sequences, chunk):
        seqs = decode_sequences(c0, min(c0 + chunk, task.n_sequences), S, T)
        if task.continuous:
            w = task.weight_rows(c0, c0 + len(seqs))
            Y2 = _table.second_moment_rows(task, c0, c0 + len(seqs))
        else:
            pk, lab = _atom_probs_multi(task, seqs) if multi else _atom_probs(task, seqs)  # (K, n), (K, n, S)
            w = np.einsum("kn,knc->nc", pk, lab)
            Y2 = np.einsum("kn,knc,knd->ncd", pk, lab, lab)
        J, lc = _token_grads_multi(head_attention(A1), A2, seqs, eps) if multi else _token_grads(A1, A2, seqs, eps)
        with np.errstate(invalid="ignore"):
            J = np.where((w > 0)[:, :, None], J, 0.0)
            lc = np.where(w > 0, lc, 0.0)
        n, _, D = J.shape
        YJ = np.einsum("ncd,nda->nca", Y2, J)
        part_m = np.einsum("nc,nca->a", w, J)
        part_2 = J.reshape(n * S, D).T @ YJ.reshape(n * S, D)
        mean = part_m if mean is None else mean + part_m
        M2 = part_2 if M2 is None else M2 + part_2
        moments += [np.sum(w * lc), np.einsum("ncd,nc,nd->", Y2, lc, lc)]
    return _assemble(S, T, task.k if multi else None, mean, M2, moments)


def _atom_probs(task, seqs):
    """``(p_k(s_n) ρ_k, π_k(·|q_n))`` for a single-parent task: shapes ``(K, n)``, ``(K, n, S)``."""
    parents, mu, atoms, prior_w = task.kernel_arrays()
    S, T = task.S, task.T
    p = np.tile((prior_w / S)[:, None], (1, len(seqs)))
    for i in range(T - 1):
        par = parents[i]
        p = p * (mu[:, seqs[:, i]] if par < 0 else atoms[:, seqs[:, par], seqs[:, i]])
    return p, atoms[:, seqs[:, T - 1], :]


def _atom_probs_multi(task, seqs):
    """``(p_m(s_n) ρ_m, π_m(·|parents of the target))`` for a k-parent task."""
    parents, tp, atoms, pk0 = task.kernel_arrays()
    S, T = task.S, task.T
    p = np.tile(pk0[:, None], (1, len(seqs)))
    for i in range(T):
        if parents[i, 0] >= 0:
            p = p * atoms[:, parent_rows(seqs, parents[i], S), seqs[:, i]]
    return p, atoms[:, parent_rows(seqs, tp, S), :]


def _token_grads(A1, A2, seqs, eps):
    """Per-token gradients ``J (n, S, D)`` and losses ``ℓ_c (n, S)`` of the single-parent model."""
    P = first_layer_attention(A1)
    T, S = P.shape[0], A2.shape[0]
    n = len(seqs)
    q = seqs[:, T - 1]
    V = A2[q[:, None], seqs]  # (n, T)
    u = V @ P.T
    a = softmax(u, axis=1)
    onehot = (seqs[:, :, None] == np.arange(S)).astype(float)  # (n, T, S)
    f = np.einsum("ni,nic->nc", a, onehot)
    with np.errstate(divide="ignore"):
        fe = f + eps
        lc = -np.log(fe)
        delta = -a[:, None, :] * (np.swapaxes(onehot, 1, 2) - f[:, :, None]) / fe[:, :, None]  # (n, S, T)
    Z = P[None] * (V[:, None, :] - u[:, :, None])  # (n, T, T): Z[n, i, j] = P_ij (V_j - u_i)
    r, c = np.tril_indices(T)
    g1 = delta[:, :, r] * Z[:, None, r, c]  # (n, S, D1)
    E = delta @ P  # (n, S, T): Σ_i δ_i P_ij
    g2row = np.einsum("ncj,njb->ncb", E, onehot)  # (n, S, S): row q of dA2
    g2 = np.zeros((n, S, S, S))
    g2[np.arange(n), :, q, :] = g2row
    return np.concatenate([g1, g2.reshape(n, S, S * S)], axis=2), lc


def _token_grads_multi(P, A2, seqs, eps):
    """Per-token gradients ``J (n, S, D)`` and losses of the k-head model (equations of :mod:`popgrad.engine.multi`)."""
    k, T, _ = P.shape
    S = A2.shape[1]
    n = len(seqs)
    f, a, H, Q, kappa, onehot = multihead_forward(P, A2, seqs)
    with np.errstate(divide="ignore"):
        fe = f + eps
        lc = -np.log(fe)
        delta = -a[:, None, :] * (np.swapaxes(onehot, 1, 2) - f[:, :, None]) / fe[:, :, None]  # (n, S, T)
    eta = np.einsum("nci,nhib->nchb", delta, H)  # (n, S, k, S)
    dA2 = np.einsum("nhp,nchb->nchpb", Q, eta)  # (n, S, k, S, S)
    zeta = np.einsum("hpb,nchb->nchp", A2, eta)  # (n, S, k, S)
    idx = np.broadcast_to(seqs[:, None, :], (n, k, T))
    Vk = np.take_along_axis(kappa, idx, axis=2)  # (n, k, T): κ^h[s_j]
    Zs = np.take_along_axis(zeta, np.broadcast_to(seqs[:, None, None, :], (n, S, k, T)), axis=3)  # ζ^h[s_j]
    G = np.einsum("nci,nhj->nchij", delta, Vk)
    G[:, :, :, T - 1, :] += Zs
    low = np.tri(T, dtype=bool)
    G = np.where(low, G, 0.0)
    dA1 = P[None, None] * (G - np.sum(P[None, None] * G, axis=-1, keepdims=True))
    r, c = np.tril_indices(T)
    g1 = dA1[..., r, c].reshape(n, S, k * len(r))
    return np.concatenate([g1, dA2.reshape(n, S, k * S * S)], axis=2), lc
