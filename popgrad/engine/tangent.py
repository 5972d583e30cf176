"""Exact Hessian-vector products by a tangent (forward-over-reverse) sweep through numba kernels (DESIGN §22).

The default products behind :func:`popgrad.catformer_hvp`, :func:`popgrad.hvp`,
:func:`popgrad.engine.hvp.catformer_rows_hvp` and :func:`popgrad.hessian_spectrum`: each sequence's forward
and reverse pass carry a tangent along the direction ``v`` (real arithmetic, no step size), so ``H v`` is
exact to rounding at every scale of ``v``. The complex step of :mod:`popgrad.engine.complex_step` is the
reference they are tested against (``method="complex_step"``).

* the CatFormer: :mod:`popgrad.engine._kernels.catformer_hvp` (the dense per-sequence rows, as the sampled
  batch kernel), over given rows (a sampled batch: :func:`rows_hvp`) or over every sequence of an
  enumerable task with its exact weights (:func:`catformer_hvp_tangent`: fixed chunks of :data:`CHUNK`
  sequences, each cut into fixed blocks of at least :data:`PER` rows, at most :data:`MAX_BLOCKS`);
* the reduced models: :mod:`popgrad.engine._kernels.reduced_hvp` (single head and k heads).

Every chunk and block is a function of the sizes only, and the partial sums are added in block and chunk
order: the bits do not depend on the thread count, nor on a ``client=`` (which takes the chunks).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ..model.catformer import CatFormerParams
from ._kernels import catformer_hvp as _kh
from ._kernels import reduced_hvp as _kr
from ._kernels.twins import use_parallel
from .catformer_rows import dense_job
from .hvp_chunks import _fill, _map, _ranges
from ._args import options_or_default

__all__ = ["catformer_hvp_tangent", "rows_hvp", "reduced_hvp_tangent", "CHUNK", "PER"]

#: Sequences per chunk of an enumeration (one fill, one kernel call).
CHUNK = 65536
#: Rows per block (one slot), at least; a call of ``n`` rows uses ``max(PER, ⌈n / MAX_BLOCKS⌉)`` (a function
#: of ``n`` only: the bits do not depend on the thread count).
PER = 256
#: Most blocks (slots) of one kernel call: bounds the slots' memory for a large batch.
MAX_BLOCKS = 128


def _per(n):
    return max(PER, -(-n // MAX_BLOCKS))


def _jobs(model, params, v):
    job = dense_job(model, params)
    vj = dense_job(model, v)
    return job, vj


def _rows_padded(seqs, w, job, vj, eps, softmax):
    """``(HA padded (n_heads, d_max, d_max), HW)`` of given (validated, contiguous) rows."""
    n = seqs.shape[0]
    nh, dmax = job.A.shape[0], job.A.shape[1]
    per = _per(n)
    n_blocks = max(1, -(-n // per))
    loss_s = np.zeros(n_blocks)
    HA_s = np.zeros((n_blocks, nh, dmax, dmax))
    HW_s = np.zeros((n_blocks, *job.W.shape))
    kernel = _kh.run_rows_hvp if use_parallel(n_blocks, n, options_or_default(None)) else _kh.run_rows_hvp_serial
    kernel(seqs, w, per, job.dims, job.hinfo, job.A, job.AT, job.EA, job.W, job.WT, vj.A, vj.AT, vj.W, vj.WT, float(eps),
           bool(softmax), loss_s, HA_s, HW_s)
    _kh.sum_hvp_slots(loss_s, HA_s, HW_s)
    return HA_s[0], HW_s[0]


def _unpad(job, HA, HW) -> CatFormerParams:
    out, g = [], 0
    for m, d, _ in job.a_shapes:
        out.append(np.ascontiguousarray(HA[g:g + m, :d, :d]))
        g += m
    return CatFormerParams(out, np.ascontiguousarray(HW))


def rows_hvp(seqs, w, model, params, v, eps) -> CatFormerParams:
    """``H v`` of ``Σ_r Σ_c w[r, c] (−log(f_c(s_r) + ε))`` over validated rows (the sampled batch's Hessian)."""
    job, vj = _jobs(model, params, v)
    seqs = np.ascontiguousarray(seqs, dtype=np.int64)
    w = np.ascontiguousarray(w, dtype=np.float64)
    HA, HW = _rows_padded(seqs, w, job, vj, eps, model.readout == "softmax")
    return _unpad(job, HA, HW)


#: Filled chunks ``(fingerprint, start, stop) -> (seqs, w)`` kept for the next product (a Lanczos run asks for
#: hundreds at one task), up to :data:`ROW_CACHE_BYTES`; :func:`popgrad.clear_caches` empties it.
_ROWS: "OrderedDict" = OrderedDict()
ROW_CACHE_BYTES = 2**27
_LOCK = threading.Lock()


def clear_rows() -> None:
    """Forget the cached enumeration chunks."""
    with _LOCK:
        _ROWS.clear()


def _chunk_rows(task, start, stop):
    """Sequences ``start … stop-1`` of ``task`` with their exact weights (cached; contiguous)."""
    key = (task.fingerprint, int(start), int(stop))
    with _LOCK:
        hit = _ROWS.get(key)
        if hit is not None:
            _ROWS.move_to_end(key)
            return hit
    seqs, w = _fill(task, start, stop)
    rows = (np.ascontiguousarray(seqs, dtype=np.int64), np.ascontiguousarray(w, dtype=np.float64))
    nbytes = rows[0].nbytes + rows[1].nbytes
    if nbytes <= ROW_CACHE_BYTES:
        with _LOCK:
            _ROWS[key] = rows
            total = sum(a.nbytes + b.nbytes for a, b in _ROWS.values())
            while total > ROW_CACHE_BYTES and len(_ROWS) > 1:
                _, (a, b) = _ROWS.popitem(last=False)
                total -= a.nbytes + b.nbytes
    return rows


def _catformer_range(task, job, vj, eps, softmax, start, stop):
    seqs, w = _chunk_rows(task, start, stop)
    return _rows_padded(seqs, w, job, vj, eps, softmax)


def catformer_hvp_tangent(task, model, params, v, eps, client=None) -> CatFormerParams:
    """``H v`` of the CatFormer's population loss over every sequence of ``task`` (validated arguments)."""
    job, vj = _jobs(model, params, v)
    parts = _map(client, _catformer_range, (task, job, vj, float(eps), model.readout == "softmax"),
                 _ranges(task.n_sequences, CHUNK))
    HA, HW = None, None
    for a, b in parts:  # chunk order, with or without a client
        if HA is None:
            HA, HW = np.array(a), np.array(b)
        else:
            HA += a
            HW += b
    return _unpad(job, HA, HW)


def _masked_softmax_tangent(A1, V1):
    """``P = softmax(A1)`` over the rows' entries ``j ≤ i`` (0 above) and ``Ṗ = P ⊙ (V1 − rowsum(P ⊙ V1))``."""
    T = A1.shape[-1]
    low = np.tri(T, dtype=bool)
    z = np.where(low, A1, -np.inf)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    P = e / e.sum(axis=-1, keepdims=True)
    V = np.where(low, V1, 0.0)
    Pd = P * (V - np.sum(P * V, axis=-1, keepdims=True))
    return np.ascontiguousarray(P), np.ascontiguousarray(np.where(low, Pd, 0.0))


def _reduced_range(task, P, Pd, A2, V2, eps, start, stop):
    seqs, w = _chunk_rows(task, start, stop)
    n = seqs.shape[0]
    per = _per(n)
    n_blocks = max(1, -(-n // per))
    loss_s = np.zeros(n_blocks)
    G_s = np.zeros((n_blocks, *P.shape))
    Gd_s = np.zeros((n_blocks, *P.shape))
    HA2_s = np.zeros((n_blocks, *A2.shape))
    par = use_parallel(n_blocks, n, options_or_default(None))
    if P.ndim == 3:
        kernel = _kr.run_multi if par else _kr.run_multi_serial
    else:
        kernel = _kr.run_single if par else _kr.run_single_serial
    kernel(seqs, w, per, P, Pd, A2, V2, float(eps), loss_s, G_s, Gd_s, HA2_s)
    _kr.sum_reduced_slots(loss_s, G_s, Gd_s, HA2_s)
    return G_s[0], Gd_s[0], HA2_s[0]


def reduced_hvp_tangent(task, A1, A2, V1, V2, eps, client=None):
    """``(HA1, HA2)`` of the reduced model (single or k heads) at validated ``A1, A2`` along ``(V1, V2)``.

    The kernels give ``G`` (the first layer's pre-softmax adjoint summed over the sequences), its tangent ``Ġ``
    and ``d(dA2)``; with ``M = G − rowsum(P ⊙ G)`` the first layer's part is
    ``Ṗ ⊙ M + P ⊙ (Ġ − rowsum(Ṗ ⊙ G) − rowsum(P ⊙ Ġ))`` on and below the diagonal.
    """
    A1 = np.ascontiguousarray(A1, dtype=np.float64)
    A2 = np.ascontiguousarray(A2, dtype=np.float64)
    V2 = np.ascontiguousarray(V2, dtype=np.float64)
    P, Pd = _masked_softmax_tangent(A1, np.asarray(V1, dtype=np.float64))
    parts = _map(client, _reduced_range, (task, P, Pd, A2, V2, float(eps)), _ranges(task.n_sequences, CHUNK))
    G, Gd, HA2 = None, None, None
    for a, b, c in parts:  # chunk order, with or without a client
        if G is None:
            G, Gd, HA2 = np.array(a), np.array(b), np.array(c)
        else:
            G += a
            Gd += b
            HA2 += c
    low = np.tri(A1.shape[-1], dtype=bool)
    G = np.where(low, G, 0.0)
    Gd = np.where(low, Gd, 0.0)
    M = G - np.sum(P * G, axis=-1, keepdims=True)
    HA1 = Pd * M + P * (Gd - np.sum(Pd * G, axis=-1, keepdims=True) - np.sum(P * Gd, axis=-1, keepdims=True))
    return np.ascontiguousarray(np.where(low, HA1, 0.0)), np.ascontiguousarray(HA2)
