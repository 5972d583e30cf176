"""Monte-Carlo draws from a task's generative process (DESIGN §2, §9, §20): what ``task.sample`` returns.

Positions are filled in increasing order (parents come first), one ``rng.random(n)`` per position, so
a draw is deterministic given the seed. Single-parent tasks: :func:`sample_single` (finite prior),
:func:`sample_continuous` (a fresh ``π`` per sequence), :func:`sample_relabeled` (an implicit relabeling
closure too large to list); k-parent tasks: :func:`sample_multi`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import dirichlet as _dirichlet
from .reference import parent_rows

__all__ = ["Sample", "sample_single", "sample_continuous", "sample_relabeled", "sample_multi"]


class Sample(NamedTuple):
    """Monte-Carlo draws from the task's generative process.

    Attributes
    ----------
    seqs : ndarray of int64, shape (n, T)
        Sampled sequences (query token last).
    targets : ndarray of float64, shape (n, S)
        The soft label ``π(· | s_{T-1})`` of each draw's transition matrix.
    atoms : ndarray of int64, shape (n,)
        Index of the prior atom each draw used.
    """

    seqs: np.ndarray
    targets: np.ndarray
    atoms: np.ndarray


def _draw_non_query(rng, parents, seqs, mu_cdf, pi_cdf, idx) -> None:
    """Fill positions ``0 … T-2`` of ``seqs`` (n, T) in order: a root from its row of ``mu_cdf`` (n, S), a
    non-root ``i`` from ``pi_cdf[idx, s_{p(i)}]`` (inverse CDF of one uniform per draw and position)."""
    n, T = seqs.shape
    S = pi_cdf.shape[-1]
    for i in range(T - 1):
        u = rng.random(n)[:, None]
        cdf = mu_cdf if parents[i] < 0 else pi_cdf[idx, seqs[:, parents[i]]]
        seqs[:, i] = np.minimum((u >= cdf).sum(axis=1), S - 1)


def sample_single(task, n: int, rng) -> Sample:
    """:meth:`popgrad.Task.sample` for a finite prior whose atoms can be listed: an atom ``k`` with
    probability ``weights[k]``, non-query roots from ``μ_k``, non-roots from ``π_k(· | s_{p(i)})``, the query
    uniform."""
    prior, S, T = task.prior, task.S, task.T
    atoms, weights = prior.expand()
    k = rng.choice(prior.K, size=n, p=weights)
    seqs = np.empty((n, T), dtype=np.int64)
    mu_cdf = np.cumsum(prior.stationary, axis=1)
    _draw_non_query(rng, task.graph.parents, seqs, mu_cdf[k], np.cumsum(atoms, axis=2), k)
    seqs[:, T - 1] = rng.integers(0, S, size=n)
    targets = atoms[k, seqs[:, T - 1]]
    return Sample(seqs, targets, k.astype(np.int64))


def sample_continuous(task, n: int, rng) -> Sample:
    """:meth:`popgrad.Task.sample` for a :class:`popgrad.DirichletPrior`: a fresh ``π`` per sequence (rows
    ``Dirichlet(α1)``), non-query roots from ``μ_π`` (GTH) or uniform, the query uniform, the soft label
    ``π(· | s_{T-1})``. ``atoms`` is ``-1`` (no atom)."""
    S, T = task.S, task.T
    pis = task.prior.draw(n, rng)
    rows = np.arange(n)
    if task.prior.roots == "stationary":
        mu_cdf = np.cumsum(_dirichlet._gth_batch(pis), axis=1)
    else:
        mu_cdf = np.broadcast_to(np.arange(1, S + 1) / S, (n, S))
    seqs = np.empty((n, T), dtype=np.int64)
    # position i's uniforms are row i of one draw (the stream of T-1 draws of n, as _draw_non_query reads it);
    # the tokens by a numba loop over the rows' cumulative sums: the same numbers as _draw_non_query over
    # np.cumsum(pis, axis=2) (tests/task/test_gth_kernel.py)
    from ._dirichlet_kernels import sample_tokens

    u = rng.random((T - 1, n))
    sample_tokens(pis, np.ascontiguousarray(mu_cdf), np.asarray(task.graph.parents, dtype=np.int64), u, seqs)
    seqs[:, T - 1] = rng.integers(0, S, size=n)
    return Sample(seqs, pis[rows, seqs[:, T - 1]], np.full(n, -1, dtype=np.int64))


def sample_relabeled(task, n: int, rng) -> Sample:
    """:meth:`popgrad.Task.sample` for an implicit relabeling closure too large to list (``K_base · S!`` atoms).

    A draw picks a base atom ``b`` (base weights) and a uniform relabeling
    ``σ``: the atom ``π^σ`` (``π^σ(σy | σx) = π_b(y | x)``, ``μ^σ(σx) = μ_b(x)``).
    The sequence is drawn from ``π_b`` and its tokens are mapped through ``σ``
    (the image of the ``π_b`` process under ``σ`` is the ``π^σ`` process; the
    query stays uniform); the label is ``π^σ(c | q) = π_b(σ⁻¹c | σ⁻¹q)``.
    ``atoms`` holds ``b · S! + rank(σ)``, the atom's index in the order of
    :func:`popgrad.relabel_closure`.
    """
    base = task.prior.base
    S, T = task.S, task.T
    b = rng.choice(base.K, size=n, p=base.weights)
    sigma = rng.permuted(np.tile(np.arange(S), (n, 1)), axis=1)
    inv = np.argsort(sigma, axis=1)
    raw = np.empty((n, T), dtype=np.int64)
    mu_cdf = np.cumsum(base.stationary, axis=1)
    _draw_non_query(rng, task.graph.parents, raw, mu_cdf[b], np.cumsum(base.atoms, axis=2), b)
    q = rng.integers(0, S, size=n)
    raw[:, T - 1] = np.take_along_axis(inv, q[:, None], axis=1)[:, 0]  # σ⁻¹q: the query stays uniform
    seqs = np.take_along_axis(sigma, raw, axis=1)
    targets = np.take_along_axis(base.atoms[b, raw[:, T - 1]], inv, axis=1)
    return Sample(seqs, targets, b.astype(np.int64) * math.factorial(S) + _perm_rank(sigma))


def _perm_rank(perms) -> np.ndarray:
    """Lexicographic rank of each row of ``perms`` (``(n, S)`` permutations) among all ``S!`` (Lehmer code)."""
    perms = np.asarray(perms)
    n, S = perms.shape
    rank = np.zeros(n, dtype=np.int64)
    for i in range(S):
        smaller_after = (perms[:, i + 1:] < perms[:, i:i + 1]).sum(axis=1)
        rank += smaller_after * math.factorial(S - 1 - i)
    return rank


def sample_multi(task, n: int, rng) -> Sample:
    """:meth:`popgrad.MultiParentTask.sample`: roots uniform, a non-root from ``π(· | its parents' tokens)``
    (an atom per draw, or a fresh ``π`` per draw for a continuous prior); ``targets[m] = π(· | s_tp)``."""
    prior, S, T = task.prior, task.S, task.T
    parents = task.graph.parents
    if task.continuous:  # a fresh π per sequence
        tabs = prior.draw(n, rng)
        m = np.arange(n)
        cdf = np.cumsum(tabs, axis=2)
    else:
        tabs = prior.atoms
        m = rng.choice(prior.K, size=n, p=prior.weights)
        cdf = np.cumsum(prior.atoms, axis=2)
    seqs = np.empty((n, T), dtype=np.int64)
    for i in range(T):
        u = rng.random(n)[:, None]
        if parents[i, 0] < 0:
            seqs[:, i] = np.minimum((u * S).astype(np.int64)[:, 0], S - 1)
        else:
            rows = parent_rows(seqs, parents[i], S)
            seqs[:, i] = np.minimum((u >= cdf[m, rows]).sum(axis=1), S - 1)
    targets = tabs[m, parent_rows(seqs, task.graph.target_parents, S)]
    return Sample(seqs, targets, np.full(n, -1, dtype=np.int64) if task.continuous else m.astype(np.int64))
