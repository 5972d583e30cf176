"""Exact orbit reduction of the full model along relabeling-equivariant parameters (DESIGN §21).

A relabeling ``σ`` of ``[S]`` acts on a :class:`popgrad.CatFormer`'s parameters by permuting the token
coordinates: every row ``h^(ℓ)_t`` is a concatenation of copies of ``d_0``-wide blocks (the input
``x̃ = [e_s, e_t]`` and, per head, the attention-weighted average of such blocks), and each block's
first ``S`` coordinates are token coordinates. ``σ`` permutes them in every block, in the rows and the
columns of every ``Ã`` and in the rows of ``W``, and permutes ``W``'s columns (the classes). Then
``f_{σ·θ}(σ·s) = σ·f_θ(s)``. If the task's prior is closed under relabeling, ``w(σs, σc) = w(s, c)``,
so ``L(σ·θ) = L(θ)`` and ``∇L(σ·θ) = σ·∇L(θ)``.

For an *equivariant* ``θ`` (``σ·θ = θ`` for every ``σ``) the per-sequence terms of an orbit are
relabelings of each other, and::

    L(θ)  = Σ_{s canonical} |orbit(s)| Σ_c w(s, c) ℓ_c(s)
    ∇L(θ) = Sym( Σ_{s canonical} |orbit(s)| Σ_c w(s, c) ∇ℓ_c(s) ),   Sym(G) = (1/S!) Σ_σ σ·G

(an orbit's terms sum to ``(|orbit|/S!) Σ_σ σ·g(s)``). ``Sym`` is the mean over each *coordinate
orbit* (the orbits of the parameter coordinates under the group), written so that every coordinate of
an orbit gets the same bits: an equivariant ``θ`` minus a multiple of ``Sym(G)`` is exactly
equivariant again, and SGD, Adam and AdamW (elementwise in ``θ``, the gradient and the moments) keep
an exactly equivariant trajectory exactly equivariant (DESIGN §21).

The check (:func:`equivariance_defect`) compares ``θ`` with ``σ·θ`` for the two generators of the
symmetric group (the transposition ``(0 1)`` and the cycle ``(0 1 … S-1)``): ``θ`` is reduced only when
``max |σ·θ − θ| ≤ EQUIV_RTOL · max |θ|`` for both (zero is equivariant).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from ..model.catformer import CatFormerParams
from ..task.tasks import Task
from .symmetry import MAX_SYMMETRY_S, exactly_closed
from .table import table_rows

__all__ = ["EQUIV_RTOL", "TABLE_SYM_RTOL", "equivariance_defect", "is_equivariant", "relabel_params",
           "generator_moves", "symmetrize_params", "reduction_applies", "coordinate_orbits", "OrbitTable",
           "orbit_table", "canonical_codes", "canonical_form", "table_reduction_applies"]

#: Largest ``max|σ·θ − θ| / max|θ|`` over the generators for which ``θ`` counts as equivariant.
EQUIV_RTOL = 1e-12
#: Largest :attr:`OrbitTable.defect` (relative L1 distance of a weight table from its relabeling
#: symmetrization, bounded above) for which a continuous task's table path is orbit-reduced: the stated
#: accuracy of the least exact table (S = 2 stationary roots, ``weight_accuracy`` ≤ 1e-10).
TABLE_SYM_RTOL = 1e-10

_ORBITS: OrderedDict = OrderedDict()
_MOVES: OrderedDict = OrderedDict()  # (S, T, heads) -> the generators' flat index moves
_TABLES: OrderedDict = OrderedDict()  # task fingerprint -> OrbitTable, kept for 2 tasks
_LOCK = threading.Lock()
#: Rows per chunk when an orbit table is summed from the weight table.
_ORBIT_CHUNK = 2**18


def _token_index(d, d0, S, sigma) -> np.ndarray:
    """``idx`` with ``x[idx]`` the relabeled vector: ``(x[idx])[b·d0 + σ(i)] = x[b·d0 + i]`` for ``i < S``."""
    idx = np.arange(d)
    inv = np.argsort(sigma)
    for b in range(d // d0):
        idx[b * d0: b * d0 + S] = b * d0 + inv
    return idx


def relabel_params(model, params, sigma):
    """``σ·θ``: the parameters (or a gradient: it transforms alike) with ``σ`` applied to every token
    coordinate and to the classes. ``sigma`` a permutation of ``0 … S-1``."""
    sigma = np.asarray(sigma, dtype=np.int64)
    d0 = model.dims[0]
    A = []
    for a, d in zip(params.A, model.dims[:-1]):
        idx = _token_index(d, d0, model.S, sigma)
        A.append(np.ascontiguousarray(a[:, idx][:, :, idx]))
    idx = _token_index(model.dims[-1], d0, model.S, sigma)
    W = np.ascontiguousarray(params.W[idx][:, np.argsort(sigma)])
    return CatFormerParams(A, W)


def _generators(S):
    swap = np.arange(S)
    swap[[0, 1]] = [1, 0]
    return [swap, np.roll(np.arange(S), -1)]


def generator_moves(model):
    """Per generator ``g`` of the symmetric group, the index ``m`` with ``(g·θ)_flat = θ_flat[m]`` on the flat
    parameters ``[A[0] … A[L-1], W]`` (:func:`relabel_params` applied to the coordinates' numbers; cached per
    model shape)."""
    return _per_model(_MOVES, model, _build_moves)


def _per_model(store, model, build):
    """``build(model)``, kept in ``store`` per model shape (the last 16)."""
    return _kept(store, (model.S, model.T, model.heads), lambda: build(model), 16)


def _kept(store, key, build, keep):
    """``store[key]``, computed by ``build()`` on a miss; ``store`` keeps the last ``keep`` entries."""
    with _LOCK:
        hit = store.get(key)
    if hit is not None:
        return hit
    out = build()
    with _LOCK:
        store[key] = out
        while len(store) > keep:
            store.popitem(last=False)
    return out


def _build_moves(model):
    a_shapes, w_shape = model.shapes()
    sizes = [int(np.prod(s)) for s in a_shapes] + [int(np.prod(w_shape))]
    ids = np.arange(sum(sizes), dtype=np.float64)  # exact integers (sizes far below 2**53)
    parts, off = [], 0
    for s in a_shapes:
        parts.append(ids[off:off + int(np.prod(s))].reshape(s))
        off += int(np.prod(s))
    base = CatFormerParams(parts, ids[off:].reshape(w_shape))
    out = []
    for g in _generators(model.S):
        moved = relabel_params(model, base, g)
        m = np.concatenate([a.ravel() for a in moved.A] + [moved.W.ravel()]).astype(np.int64)
        m.setflags(write=False)
        out.append(m)
    return out


def equivariance_defect(model, params) -> float:
    """``max_g max|g·θ − θ|`` over the generators ``g`` of the symmetric group (``0.0`` for ``S = 1``): one
    gather per generator on the flat parameters (:func:`generator_moves`)."""
    if model.S < 2:
        return 0.0
    flat = np.concatenate([np.ravel(a) for a in params.A] + [np.ravel(params.W)])
    out = 0.0
    for m in generator_moves(model):
        out = max(out, float(np.max(np.abs(flat[m] - flat), initial=0.0)))
    return out


def is_equivariant(model, params, rtol=EQUIV_RTOL) -> bool:
    """Whether ``max|g·θ − θ| ≤ rtol · max|θ|`` for both generators ``g``."""
    scale = max([float(np.max(np.abs(a), initial=0.0)) for a in params.A] + [float(np.max(np.abs(params.W)))])
    return equivariance_defect(model, params) <= rtol * scale


def reduction_applies(task, model, params) -> bool:
    """The orbit reduction is exact: a single-parent task, ``2 ≤ S ≤ MAX_SYMMETRY_S``, equivariant ``params``,
    and a prior exactly closed under relabeling (:func:`popgrad.engine.symmetry.exactly_closed`) or a
    continuous prior whose weight table is relabeling-invariant (:func:`table_reduction_applies`)."""
    if not (isinstance(task, Task) and 2 <= task.S <= MAX_SYMMETRY_S) or not is_equivariant(model, params):
        return False
    return table_reduction_applies(task) if task.continuous else exactly_closed(task.prior)


# ====================================================================== the table path's orbit reduction
class OrbitTable(NamedTuple):
    """A weight table summed over the relabeling orbits (DESIGN §21, "the table path").

    ``seqs (M, T)`` int64: the canonical sequences (each token's first occurrence in the order ``0, 1, …``),
    in lexicographic order; ``w (M, S)``: ``W̄(r, c') = Σ_{s: τ_s s = r} w(s, τ_s⁻¹ c')``, ``τ_s`` the relabeling
    that makes ``s`` canonical (the tokens ``s`` does not use go, in increasing order, to the labels left);
    ``defect``: ``Σ_{r, c'} n(r) (max − min)_{s: τ_s s = r} w(s, τ_s⁻¹ c') / Σ w``, ``n(r)`` the orbit size, an
    upper bound on the relative L1 distance between the table and its symmetrization (0 for an invariant
    table).
    """

    seqs: np.ndarray
    w: np.ndarray
    defect: float


def canonical_codes(S: int, T: int) -> np.ndarray:
    """The canonical sequences of ``[S]^T`` as base-``S`` numbers (position 0 most significant), increasing."""
    codes = np.zeros(1, dtype=np.int64)
    mx = np.full(1, -1, dtype=np.int64)
    for _ in range(T):
        n_child = np.minimum(S, mx + 2)
        parent = np.repeat(np.arange(codes.size), n_child)
        tok = np.arange(parent.size) - np.repeat(np.cumsum(n_child) - n_child, n_child)
        codes = codes[parent] * S + tok
        mx = np.maximum(mx[parent], tok)
    return codes


def canonical_form(seqs: np.ndarray, S: int):
    """``(codes, tau)``: each row's canonical sequence as a base-``S`` number and its relabeling ``tau[n, a]``
    (a permutation of ``0 … S-1`` per row: tokens by first occurrence, the unused ones after, increasing)."""
    N, T = seqs.shape
    first = np.full((N, S), T, dtype=np.int64)
    rows = np.arange(N)
    for t in range(T - 1, -1, -1):  # the last write is the first occurrence
        first[rows, seqs[:, t]] = t
    order = np.argsort(first, axis=1, kind="stable")
    tau = np.empty_like(order)
    np.put_along_axis(tau, order, np.broadcast_to(np.arange(S), (N, S)), axis=1)
    canon = np.take_along_axis(tau, seqs, axis=1)
    return canon @ (S ** np.arange(T - 1, -1, -1, dtype=np.int64)), tau


def _build_orbit_table(task) -> OrbitTable:
    S, T, N = task.S, task.T, task.n_sequences
    codes = canonical_codes(S, T)
    M = codes.size
    wsum = np.zeros(M * S)
    wmax = np.full(M * S, -np.inf)
    wmin = np.full(M * S, np.inf)
    count = np.zeros(M, dtype=np.int64)
    total = 0.0
    for r0 in range(0, N, _ORBIT_CHUNK):
        seqs, w = table_rows(task, r0, min(N, r0 + _ORBIT_CHUNK))
        code, tau = canonical_form(np.asarray(seqs), S)
        idx = np.searchsorted(codes, code)
        flat = (idx[:, None] * S + tau).ravel()
        wf = np.asarray(w, dtype=np.float64).ravel()
        wsum += np.bincount(flat, weights=wf, minlength=M * S)
        np.maximum.at(wmax, flat, wf)
        np.minimum.at(wmin, flat, wf)
        count += np.bincount(idx, minlength=M)
        total += float(wf.sum())
    digits = (codes[:, None] // S ** np.arange(T - 1, -1, -1, dtype=np.int64)) % S
    spread = float(np.sum((wmax - wmin).reshape(M, S) * count[:, None]))
    defect = spread / total if total > 0 else 0.0
    w = wsum.reshape(M, S)
    digits.setflags(write=False)
    w.setflags(write=False)
    return OrbitTable(digits, w, defect)


def orbit_table(task) -> OrbitTable:
    """The :class:`OrbitTable` of a task's weight table (computed once per task, kept for the last two tasks;
    one pass over the table, in chunks past the table budget)."""
    return _kept(_TABLES, task.fingerprint, lambda: _build_orbit_table(task), 2)


def clear_orbit_tables() -> None:
    """Forget the kept orbit tables (:func:`popgrad.clear_caches`)."""
    with _LOCK:
        _TABLES.clear()


def table_reduction_applies(task) -> bool:
    """A continuous single-parent task (``2 ≤ S ≤ MAX_SYMMETRY_S``) whose weight table is relabeling-invariant:
    :attr:`OrbitTable.defect` ``≤ TABLE_SYM_RTOL`` (builds the orbit table on first use)."""
    return (isinstance(task, Task) and task.continuous and 2 <= task.S <= MAX_SYMMETRY_S
            and orbit_table(task).defect <= TABLE_SYM_RTOL)


def coordinate_orbits(model):
    """Per parameter array (``A[0] … A[L-1]``, ``W``): ``(labels, counts)``, the orbit number of every
    coordinate under the relabelings and the orbit sizes (cached per model)."""
    return _per_model(_ORBITS, model, _build_orbits)


def _build_orbits(model):
    a_shapes, w_shape = model.shapes()
    sizes = [int(np.prod(s)) for s in a_shapes] + [int(np.prod(w_shape))]
    n = sum(sizes)
    moves = generator_moves(model)
    label = np.arange(n)
    while True:  # connected components of i ~ g(i): propagate the smallest index
        new = label.copy()
        for m in moves:
            np.minimum.at(new, m, label)
            new = np.minimum(new, new[m])
        for _ in range(2):
            new = new[new]
        if np.array_equal(new, label):
            break
        label = new
    _, inv = np.unique(label, return_inverse=True)
    counts = np.bincount(inv).astype(np.float64)
    out, off = [], 0
    for sz in sizes:
        out.append(inv[off:off + sz])
        off += sz
    return out, counts


def symmetrize_params(model, A, W):
    """``Sym``: every coordinate replaced by the mean over its coordinate orbit (the same bits on an orbit).

    ``A`` a list as ``params.A`` and ``W`` (a gradient or parameters); returns ``(A', W')``.
    """
    labels, counts = coordinate_orbits(model)
    flat = np.concatenate([a.ravel() for a in A] + [W.ravel()])
    lab = np.concatenate(labels)
    sums = np.bincount(lab, weights=flat, minlength=len(counts))
    mean = sums / counts
    out, off = [], 0
    for a in A:
        out.append(mean[lab[off:off + a.size]].reshape(a.shape))
        off += a.size
    return out, mean[lab[off:]].reshape(W.shape)
