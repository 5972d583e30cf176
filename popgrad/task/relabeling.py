"""Token relabelings of transition matrices and tensors (paper Assumption 3, DESIGN §6, §10).

A relabeling ``σ`` of the tokens maps a transition matrix to ``σ π σ⁻¹``
(``out[σ(a), σ(b)] = pi[a, b]``). :func:`relabel_closure` closes a weighted
atom set under all ``S!`` relabelings; :func:`closed_under_relabeling` is the
one test of whether a weighted atom set (matrices or tensors) is closed.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from .._validation import as_permutation

__all__ = ["relabel", "relabel_closure", "closed_under_relabeling", "MAX_CLOSURE_ATOMS"]

#: Largest number of atoms a relabeling closure may create.
MAX_CLOSURE_ATOMS = 200_000


def relabel(pi, perm) -> np.ndarray:
    """Relabel tokens: ``out[σ(a), σ(b)] = pi[a, b]`` (i.e. ``σ π σ⁻¹``)."""
    pi = np.asarray(pi, dtype=np.float64)
    if pi.ndim < 2 or pi.shape[-1] != pi.shape[-2]:
        raise ValueError(f"pi must be a square matrix, got shape {pi.shape}")
    perm = as_permutation(perm, pi.shape[-1])
    out = np.empty_like(pi)
    out[np.ix_(perm, perm)] = pi
    return out


def relabel_closure(atoms, weights=None):
    """Close a weighted atom set under all ``S!`` token relabelings.

    Each atom ``k`` is replaced by its ``S!`` relabelings, each with weight
    ``weights[k] / S!``. Returns ``(atoms (K·S!, S, S), weights (K·S!,))``,
    atoms grouped by source atom, permutations in lexicographic order.
    """
    atoms = np.asarray(atoms, dtype=np.float64)
    K, S, _ = atoms.shape
    if weights is None:
        weights = np.full(K, 1.0 / K)
    n_perm = math.factorial(S)
    if K * n_perm > MAX_CLOSURE_ATOMS:
        raise ValueError(
            f"closing {K} atoms under all {S}! = {n_perm} relabelings would create {K * n_perm} atoms "
            f"(limit {MAX_CLOSURE_ATOMS}): use symmetrize=False, fewer atoms, or a smaller S"
        )
    inv = _inverse_perms(S)
    # out[k·S! + m] = relabel(atoms[k], perms[m]), i.e. out[.., σ(a), σ(b)] = atoms[k, a, b]: pure copies.
    out = atoms[:, inv[:, :, None], inv[:, None, :]].reshape(K * n_perm, S, S)
    w = np.repeat(np.asarray(weights, dtype=np.float64) / n_perm, n_perm)
    return out, w


def _inverse_perms(S: int) -> np.ndarray:
    """``(S!, S)`` inverses of the permutations of ``range(S)`` in lexicographic order."""
    perms = np.array(list(itertools.permutations(range(S))), dtype=np.intp).reshape(-1, S)
    return np.argsort(perms, axis=1)


def closed_under_relabeling(atoms, weights, tol: float = 1e-10, weight_tol: float = 1e-12,
                            extra=None, extra_rtol: float = 1e-12) -> bool:
    """The one relabeling-closure test of popgrad (matrices and tensors alike).

    Parameters
    ----------
    atoms : ndarray, shape (K, S, ..., S)
        ``K`` atoms with ``k + 1`` token axes (a transition matrix has 2, a
        ``k``-parent tensor ``k + 1``); a relabeling ``σ`` moves every axis:
        ``out[σa_1, …, σa_k, σc] = π[a_1, …, a_k, c]``.
    weights : ndarray, shape (K,)
    tol : float
        Atoms within ``tol`` (max-abs) are the same atom (their weights are
        merged); ``0`` means bit for bit (``-0.0`` counts as ``0.0``).
    weight_tol : float
        Largest difference between the weights of an atom and of its image.
    extra : ndarray, shape (K, S), optional
        A per-atom vector that must move with the atom (``extra ∘ σ⁻¹``, to
        ``extra_rtol`` relative): the stationary distributions the exact
        engine uses for roots (they are not unique for reducible atoms).

    Only the transposition ``(0 1)`` and the cycle ``(0 1 … S-1)`` are tried:
    a finite set mapped into itself by both generators is invariant under
    every relabeling. Atoms are looked up in a hash of their coordinates
    rounded to ``tol``, so the cost is ``O(K · S^(k+1))``, never ``O(S!)``.
    An image that misses the hash (just across a rounding boundary) is
    searched exhaustively, once, before the answer is "not closed"; when
    merging, near-duplicates across a rounding boundary stay separate atoms
    (a relabeling closure built by :func:`relabel_closure` is bit-exact, so
    this never happens there).
    """
    atoms = np.asarray(atoms, dtype=np.float64) + 0.0
    weights = np.asarray(weights, dtype=np.float64)
    K, S = atoms.shape[0], atoms.shape[1]
    axes = atoms.ndim - 1
    flat = atoms.reshape(K, -1)
    scale = 1.0 / tol if tol > 0 else None

    def key(v):
        return (np.round(v * scale).astype(np.int64) if scale else v).tobytes()

    index, reps, rep_w, rep_x = {}, [], [], []

    def find(v, x, exhaustive):
        """Index of the merged atom equal to ``v`` (within ``tol``) whose extra matches ``x`` (any with None), or -1."""
        for c in index.get(key(v), ()):
            if np.abs(reps[c] - v).max() <= tol and _same(rep_x[c], x):
                return c
        if exhaustive and reps and tol > 0:  # a neighbour just across a rounding boundary
            d = np.abs(np.asarray(reps) - v).max(axis=1)
            for c in np.flatnonzero(d <= tol):
                if _same(rep_x[c], x):
                    return int(c)
        return -1

    def _same(a, b):
        if a is None or b is None:
            return True
        return bool(np.all(np.abs(a - b) <= extra_rtol * np.abs(b)))

    for m in range(K):
        x = None if extra is None else np.asarray(extra[m], dtype=np.float64)
        c = find(flat[m], None, False)
        if c >= 0:
            rep_w[c] += float(weights[m])
            if x is not None and not _same(rep_x[c], x):
                rep_x[c] = np.full(S, np.nan)  # the same atom with two different vectors: matches nothing
            continue
        index.setdefault(key(flat[m]), []).append(len(reps))
        reps.append(flat[m])
        rep_w.append(float(weights[m]))
        rep_x.append(x)
    R = len(reps)
    rep_arr = np.asarray(reps).reshape((R,) + (S,) * axes)
    for perm in (np.array([1, 0] + list(range(2, S))), np.roll(np.arange(S), -1)):
        moved = np.empty_like(rep_arr)
        moved[np.ix_(np.arange(R), *([perm] * axes))] = rep_arr
        moved = moved.reshape(R, -1)
        for r in range(R):
            xm = None
            if rep_x[r] is not None:
                xm = np.empty(S)
                xm[perm] = rep_x[r]
            c = find(moved[r], xm, True)
            if c < 0 or abs(rep_w[c] - rep_w[r]) > weight_tol:
                return False
    return True
