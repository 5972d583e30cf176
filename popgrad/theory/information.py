r"""Pairwise joints, χ² mutual information and the idealized gradient (DESIGN §5–§6).

Notation (one transition matrix ``π``, ``pi[a, b] = π(b | a)``)
----------------------------------------------------------------
``μ`` is the stationary distribution (GTH, :func:`popgrad.stationary_distribution`),
``D = diag(μ)``, ``r = √μ`` and

    N = D^{1/2} π D^{-1/2},        K = N - r rᵀ        (the *normalized kernel*).

Because ``μ π = μ`` and ``π 1 = 1`` we have ``N r = r``, ``Nᵀ r = r``, hence
``K r = Kᵀ r = 0``, ``N = r rᵀ + K`` (orthogonal pieces) and ``N^d = r rᵀ + K^d``.
Everything below follows from that decomposition.

* χ² mutual information of one transition (the paper's ``I_χ²(s_i; s_{p(i)} | π)``)::

      I_χ²(π) = Σ_{a,b} μ(a) π(a,b)² / μ(b) - 1 = ‖N‖_F² - 1 = ‖K‖_F².

* ``σ₂(π)``: the second singular value of ``N``; the top one is 1 (left and
  right vector ``r``), so ``σ₂ = ‖K‖₂`` (computed that way, no sign ambiguity).
* χ² contraction coefficient, computed **at the stationary input**::

      η_χ²(π, μ) = sup_{ν ≠ μ} χ²(ν π ‖ μ) / χ²(ν ‖ μ) = σ₂(π)²

  (maximal correlation squared of the pair ``(s_{p(i)}, s_i)``; the supremum is
  attained at ``ν = μ + t D^{1/2} u`` with ``u`` the top left singular vector
  of ``K``; the tests check both directions). It is *not* the
  input-independent ``sup_μ η_χ²(π, μ)``, which equals the KL contraction
  coefficient. Always ``σ₂² ≤ δ(π)`` (Cohen et al. 1993, the paper's ref. 11).
* Dobrushin coefficient ``δ(π) = ½ max_{a,a'} ‖π(a,·) - π(a',·)‖₁``.
* ``‖π - 1μᵀ‖_F² = Σ_a ‖π(·|a) - μ‖²`` (the paper's non-degeneracy quantity).

Pairwise joints from the graph (never by enumeration)
-----------------------------------------------------
For positions ``i, j`` of one tree with lowest common ancestor ``c`` at
distances ``d_i, d_j``::

    P[s_j = a, s_i = b | π] = Σ_x μ(x) (π^{d_j})[x, a] (π^{d_i})[x, b]
                            = ((π^{d_j})ᵀ D π^{d_i})[a, b].

Different trees give ``μ ⊗ μ``. The query ``T-1`` is uniform and independent
of everything: a pair involving it is ``marginal ⊗ marginal`` with the query
marginal ``1/S`` (and ``diag(1/S)`` for ``i = j = T-1``).

The idealized gradient (paper Knowl 3, DESIGN §5)
-------------------------------------------------
For ``j ≤ i``::

    g[i, j](π) = Σ_{a,b} P[s_j=a, s_i=b | π] π(b|a) / μ(b) - 1,      g = E_π[g(π)].

Substituting the joint and ``N^d = r rᵀ + K^d``, with the convention
``K^0 := I - r rᵀ``, gives the closed form used here::

    g[i, j](π) = ⟨(K^{d_j})ᵀ K^{d_i}, K⟩_F           (same tree),     0 (different trees).

Special cases (checked by the tests to 1e-12):

* ``j = p(i)`` (``d_j = 0, d_i = 1``): ``g = ‖K‖_F² = I_χ²``;
* ``j < i, j ≠ p(i)`` (``s_j → s_{p(i)} → s_i``): ``g = tr(Q_j K Kᵀ)`` with
  ``Q_j = D^{-1/2} M_j D^{-1/2} - r rᵀ = (K^{a})ᵀ K^{b}``, ``M_j`` the joint of
  ``(s_j, s_{p(i)})`` and ``a, b`` their distances to their LCA;
* ``j = i`` (joint ``diag(μ)``): ``g = tr K = tr(π) - 1``, for **every**
  non-query row, roots included;
* ``i`` a root, ``j < i``: ``s_j ⟂ s_i`` so ``g = 0``.

**Root rows and the query row.** DESIGN §6 says "roots (and the query row):
``g[i, :] = 0``". What the formula gives, and what this module returns:

* non-query root ``i``: ``g[i, j] = 0`` for ``j < i`` exactly, and the
  diagonal ``g[i, i] = E[tr π] - 1`` like every other diagonal entry. That is
  0 under the paper's uniform-mean assumption ``E[π] = 11ᵀ/S`` (then the
  whole root row is 0, as DESIGN says) and it is also what the first-order
  expansion of the exact gradient gives (``∂L/∂P[i,i] ≈ -(β0/(ST))·(E tr π - 1)``),
  so we keep the formula rather than forcing a 0.
* the query row ``i = T-1`` is **set to 0**, as DESIGN and the paper (the
  query is a root) mandate. The formula with the true joint would give 0 off
  the diagonal and ``(1/S) Σ_a π(a|a)/μ(a) - 1`` on it; but the formula's
  derivation assumes the query ``q`` is independent of ``(s_j, s_i)``, which
  fails for ``i = T-1`` (``s_i = q``). Expanding the exact gradient to first
  order in ``β0`` (``f ≈ μ``) gives instead
  ``∂L/∂P[T-1, j] ≈ -(β0/(ST))·c_j`` with ``c_j = E[tr π] - 1`` for ``j < T-1``
  and ``c_{T-1} = E[Σ_a π(a|a)/μ(a)] - S``. Since ``J(P_i)`` kills constant
  vectors, only ``c_{T-1} - c_0`` matters; it is not 0 in general, so the
  idealized Stage-1 gradient misses an O(β0/(ST)) term on the query row.
  :func:`query_row_first_order` returns ``c`` so that studies can measure
  this; ``idealized_gradient(task, query_row="first_order")`` puts it in.

Cost: the LCA distance table is built in ``O(T²)`` (one vectorized row per
position); the values ``h(d_j, d_i) = E⟨(K^{d_j})ᵀK^{d_i}, K⟩`` are needed
only for the distance values that occur (a chain needs ``d_j = 0`` alone) and
come from one matrix product per chunk of atoms, ``O(#d_j · #d_i · K_atoms ·
S²)``. ``T = 1000`` takes well under a second for the usual priors. Results
for a task are cached (keyed on the graph and the prior's bytes).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from .._validation import is_int
from ..model.reduced import first_layer_attention
from ..task.graphs import CausalGraph
from ..task.priors import FinitePrior, ROW_SUM_TOL, stationary_distribution
from ..task.tasks import Task, check_task

__all__ = [
    "ChainInformation",
    "Assumptions",
    "chain_information",
    "normalized_kernel",
    "chi2_mutual_information",
    "sigma2",
    "dobrushin_coefficient",
    "chi2_contraction_coefficient",
    "deviation_norm2",
    "lca_distances",
    "pairwise_joint",
    "idealized_gradient",
    "idealized_gradient_single",
    "idealized_grad_A1",
    "query_row_first_order",
    "assumptions",
    "has_idealized_gradient",
]

#: Smallest stationary probability accepted: the formulas divide by ``μ(b)``.
MU_MIN = 1e-300
#: Largest number of floats in the stacked matrix powers of one chunk of atoms.
_CHUNK_FLOATS = 4_000_000
#: Number of task-level idealized gradients kept in the cache.
_CACHE_SIZE = 8
_QUERY_ROWS = ("zero", "first_order")


# ------------------------------------------------------------------ results
class ChainInformation(NamedTuple):
    """Information quantities of one transition matrix ``π`` (module docstring).

    Attributes
    ----------
    mu : ndarray, shape (S,)
        Stationary distribution (GTH).
    kernel : ndarray, shape (S, S)
        ``K = D^{1/2} π D^{-1/2} - √μ√μᵀ``.
    chi2_mi : float
        ``I_χ² = ‖K‖_F²``.
    sigma2 : float
        Second singular value of ``D^{1/2} π D^{-1/2}`` (``= ‖K‖₂``).
    chi2_contraction : float
        ``η_χ²(π, μ) = σ₂²`` (stationary input).
    dobrushin : float
        ``δ(π) = ½ max_{a,a'} ‖π(a,·) - π(a',·)‖₁``.
    deviation_norm2 : float
        ``‖π - 1μᵀ‖_F²`` (non-degeneracy quantity of Knowl 10).
    trace : float
        ``tr π`` (``g[i,i](π) = tr π - 1``).
    gamma_min_entry : float
        ``S · min π`` (Assumption 1 holds for every ``γ`` up to this).
    gamma : float
        ``min(S·min π, sqrt(S·‖π - 1μᵀ‖_F²))``: the largest ``γ`` for which
        ``π`` meets Assumptions 1 and 2 of Knowl 10 (``min π ≥ γ/S`` and
        ``‖π - 1μᵀ‖_F² ≥ γ²/S``).
    """

    mu: np.ndarray
    kernel: np.ndarray
    chi2_mi: float
    sigma2: float
    chi2_contraction: float
    dobrushin: float
    deviation_norm2: float
    trace: float
    gamma_min_entry: float
    gamma: float


class Assumptions(NamedTuple):
    """The paper's assumptions (Knowl 10) measured on a task.

    Attributes
    ----------
    gamma : float
        ``S · min π`` over all atoms (Assumption 1: ``min π ≥ γ/S``).
    nondegeneracy : float
        ``min_k ‖π_k - 1μ_kᵀ‖_F²`` (Assumption 2: ``≥ γ²/S``).
    nondegenerate : bool
        ``nondegeneracy ≥ gamma² / S``.
    symmetric : bool or None
        Relabeling-closed weighted atom set.
    uniform_mean_error : float
        ``max |E[π] - 1/S|``.
    uniform_mean : bool
        ``uniform_mean_error ≤ 1e-12`` (Assumption 3, second half).
    root_fraction : float
        ``|R| / T``, the query counted as a root.
    root_fraction_ok : bool
        ``root_fraction ≤ 1 - gamma`` (Assumption 4).
    t_eff : float
        ``T / max_k L_k`` (Assumption 5 asks ``T_eff ≥ poly(1/γ, S)``).
    gamma_all : float
        The largest ``γ`` meeting Assumptions 1, 2 and 4 at once:
        ``min(S min π, sqrt(S · nondegeneracy), 1 - root_fraction)``.
    mu_min : float
        ``min_k min_a μ_k(a)`` (Knowl 10 implies ``≥ γ/S``).
    chi2_mi_min : float
        ``min_k ‖K_k‖_F²``.
    sigma2_max : float
        ``max_k σ₂(π_k)``.
    dobrushin_max : float
        ``max_k δ(π_k)`` (``≤ 1 - gamma`` always).
    """

    gamma: float
    nondegeneracy: float
    nondegenerate: bool
    symmetric: object
    uniform_mean_error: float
    uniform_mean: bool
    root_fraction: float
    root_fraction_ok: bool
    t_eff: float
    gamma_all: float
    mu_min: float
    chi2_mi_min: float
    sigma2_max: float
    dobrushin_max: float

    def summary(self) -> str:
        """Two human-readable lines."""
        sym = "not checked (S > 7)" if self.symmetric is None else str(self.symmetric)
        return (
            f"gamma={self.gamma:.4g}, non-degeneracy={self.nondegeneracy:.4g} (>= gamma^2/S: "
            f"{self.nondegenerate}), symmetric={sym}, uniform mean={self.uniform_mean} "
            f"(err {self.uniform_mean_error:.2g})\n"
            f"root fraction={self.root_fraction:.3f} (<= 1-gamma: {self.root_fraction_ok}), "
            f"T_eff={self.t_eff:.3g}, gamma for Assumptions 1,2,4={self.gamma_all:.4g}, "
            f"min mu={self.mu_min:.3g}, min I_chi2={self.chi2_mi_min:.3g}, "
            f"max sigma2={self.sigma2_max:.3g}, max Dobrushin={self.dobrushin_max:.3g}"
        )


# ---------------------------------------------------------- validation
def _as_transition(pi, name="pi") -> np.ndarray:
    arr = np.asarray(pi, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] < 2:
        raise ValueError(f"{name} must be a square (S, S) transition matrix with S >= 2, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries: transition probabilities must be finite")
    if np.any(arr < 0):
        a, b = (int(x) for x in np.argwhere(arr < 0)[0])
        raise ValueError(f"{name}[{a}, {b}] = {arr[a, b]} is negative: transition probabilities must be >= 0")
    err = np.abs(arr.sum(axis=1) - 1.0)
    if err.max() > ROW_SUM_TOL:
        a = int(err.argmax())
        raise ValueError(
            f"row {a} of {name} sums to {arr[a].sum()!r}, not 1 (tolerance {ROW_SUM_TOL}): "
            f"normalize the rows, pi / pi.sum(axis=1, keepdims=True)"
        )
    return arr


def _as_mu(mu, pi, name="pi") -> np.ndarray:
    S = pi.shape[0]
    if mu is None:
        mu = stationary_distribution(pi)
    else:
        mu = np.asarray(mu, dtype=np.float64)
        if mu.shape != (S,):
            raise ValueError(f"mu must have shape ({S},) to match {name}, got {mu.shape}")
        if np.abs(mu @ pi - mu).max() > 1e-10 or abs(mu.sum() - 1.0) > 1e-10:
            raise ValueError("mu is not the stationary distribution of pi (mu @ pi != mu or sum != 1): pass mu=None")
    if not mu.min() > MU_MIN:
        raise ValueError(
            f"{name} has stationary probability mu[{int(mu.argmin())}] = {mu.min():.3g}: the chi-squared "
            f"quantities divide by mu, so the chain must be irreducible with mu > 0 everywhere "
            f"(e.g. mix with the uniform matrix, (1-t)*pi + t/S)"
        )
    return mu


def has_idealized_gradient(task) -> bool:
    """Whether the idealized gradient ``g`` (DESIGN §5) exists for ``task``: the one predicate.

    ``g`` divides by the stationary probabilities, so it exists for a
    single-parent :class:`popgrad.Task` whose every prior draw has
    ``μ > MU_MIN`` everywhere (irreducible; a Dirichlet draw with a small
    ``alpha`` can be reducible). A k-parent task has no idealized gradient
    here. Reads the base draws of an implicit relabeling closure (``μ`` is
    relabeling-equivariant): never expands the prior.
    """
    if not isinstance(task, Task) or task.continuous:  # a continuous prior has no atoms to sum over
        return False
    return bool(task.prior.invariant_view()[2].min() > MU_MIN)


def _check_task(task) -> Task:
    check_task(task, Task)
    if task.continuous:
        raise ValueError(f"the idealized gradient sums over the prior's atoms, but {task.prior!r} is continuous: use a "
                         "finite stand-in, e.g. Task(graph, popgrad.dirichlet_prior(S, alpha, n_atoms, seed))")
    if not has_idealized_gradient(task):
        mu = task.prior.invariant_view()[2]
        k, a = (int(x) for x in np.argwhere(mu <= MU_MIN)[0])
        raise ValueError(
            f"prior atom {k} has stationary probability mu[{a}] = {mu[k, a]:.3g}: the idealized gradient "
            f"divides by mu, so every atom must be irreducible with mu > 0 (e.g. a Dirichlet prior, "
            f"or mix the atom with the uniform matrix)"
        )
    return task


# ------------------------------------------------------ single-π quantities
def _kernels(atoms, mu) -> np.ndarray:
    """``K = D^{1/2} π D^{-1/2} - √μ√μᵀ`` for a stack ``(K, S, S)``."""
    r = np.sqrt(mu)
    return r[:, :, None] * atoms / r[:, None, :] - r[:, :, None] * r[:, None, :]


def normalized_kernel(pi, mu=None) -> np.ndarray:
    """Normalized kernel ``K = D^{1/2} π D^{-1/2} - √μ√μᵀ``, shape ``(S, S)``.

    Parameters
    ----------
    pi : array_like, shape (S, S)
        Irreducible row-stochastic matrix, ``pi[a, b] = π(b | a)``.
    mu : array_like, shape (S,), optional
        Its stationary distribution (computed by GTH when omitted).
    """
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    return _kernels(pi[None], mu[None])[0]


def chi2_mutual_information(pi, mu=None) -> float:
    """``I_χ²(s_i; s_{p(i)} | π) = Σ μ(a)π(a,b)²/μ(b) - 1 = ‖K‖_F²``."""
    K = normalized_kernel(pi, mu)
    return float(np.sum(K * K))


def sigma2(pi, mu=None) -> float:
    """Second singular value of ``D^{1/2} π D^{-1/2}``, computed as ``‖K‖₂``."""
    return float(np.linalg.norm(normalized_kernel(pi, mu), 2))


def chi2_contraction_coefficient(pi, mu=None) -> float:
    """χ² contraction coefficient at the stationary input, ``η_χ²(π, μ) = σ₂²``.

    ``sup_{ν ≠ μ} χ²(νπ ‖ μ) / χ²(ν ‖ μ)`` (maximal correlation squared).
    """
    return sigma2(pi, mu) ** 2


def dobrushin_coefficient(pi) -> float:
    """Dobrushin coefficient ``δ(π) = ½ max_{a,a'} ‖π(a,·) - π(a',·)‖₁`` in ``[0, 1]``."""
    pi = _as_transition(pi)
    return float(0.5 * np.abs(pi[:, None, :] - pi[None, :, :]).sum(axis=2).max())


def deviation_norm2(pi, mu=None) -> float:
    """``‖π - 1μᵀ‖_F² = Σ_a ‖π(·|a) - μ‖²`` (the non-degeneracy quantity)."""
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    return float(np.sum((pi - mu[None, :]) ** 2))


def chain_information(pi, mu=None) -> ChainInformation:
    """All information quantities of one transition matrix (module docstring).

    Parameters
    ----------
    pi : array_like, shape (S, S)
        Irreducible row-stochastic matrix.
    mu : array_like, shape (S,), optional
        Stationary distribution; GTH when omitted.

    Returns
    -------
    ChainInformation
    """
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    S = pi.shape[0]
    K = _kernels(pi[None], mu[None])[0]
    s2 = float(np.linalg.norm(K, 2))
    dev = float(np.sum((pi - mu[None, :]) ** 2))
    gmin = float(S * pi.min())
    return ChainInformation(
        mu=mu,
        kernel=K,
        chi2_mi=float(np.sum(K * K)),
        sigma2=s2,
        chi2_contraction=s2 * s2,
        dobrushin=float(0.5 * np.abs(pi[:, None, :] - pi[None, :, :]).sum(axis=2).max()),
        deviation_norm2=dev,
        trace=float(np.trace(pi)),
        gamma_min_entry=gmin,
        gamma=float(min(gmin, np.sqrt(S * dev))),
    )


# ------------------------------------------------------------ graph tables
def lca_distances(graph: CausalGraph) -> np.ndarray:
    """Distances from lowest common ancestors, for all pairs, in ``O(T²)``.

    Parameters
    ----------
    graph : CausalGraph

    Returns
    -------
    D : ndarray of int64, shape (T, T)
        ``D[x, y]`` = number of edges from ``LCA(x, y)`` down to ``x``, and
        ``-1`` when ``x`` and ``y`` lie in different trees. So for a pair
        ``(i, j)``: ``d_i = D[i, j]``, ``d_j = D[j, i]`` (as returned by
        :meth:`CausalGraph.lowest_common_ancestor`).

    Notes
    -----
    Row by row: for a non-root ``i`` with parent ``p`` and ``j < i``,
    ``LCA(i, j) = LCA(p, j)`` (``i`` cannot be an ancestor of an earlier
    position), so ``D[i, j] = D[p, j] + 1`` and ``D[j, i] = D[j, p]``.
    """
    if not isinstance(graph, CausalGraph):
        raise ValueError(f"graph must be a popgrad.CausalGraph, got {type(graph).__name__}")
    parents = graph.parents
    T = graph.T
    D = np.full((T, T), -1, dtype=np.int64)
    for i in range(T):
        D[i, i] = 0
        p = int(parents[i])
        if p < 0:
            continue
        row = D[p, :i]
        same = row >= 0
        D[i, :i] = np.where(same, row + 1, -1)
        D[:i, i] = np.where(same, D[:i, p], -1)
    return D


def pairwise_joint(graph: CausalGraph, pi, i: int, j: int, mu=None) -> np.ndarray:
    """Joint ``P[s_j = a, s_i = b | π]`` of two positions, from the graph.

    Parameters
    ----------
    graph : CausalGraph
    pi : array_like, shape (S, S)
        Irreducible transition matrix.
    i, j : int
        Positions in ``0 .. T-1`` (any order; ``i = j`` allowed).
    mu : array_like, shape (S,), optional

    Returns
    -------
    P : ndarray, shape (S, S)
        ``P[a, b] = P[s_j = a, s_i = b]``:
        ``(π^{d_j})ᵀ D π^{d_i}`` in one tree (LCA at distances ``d_i, d_j``),
        ``m_j ⊗ m_i`` otherwise, with marginal ``m = μ`` except the query's
        ``m = 1/S``; ``diag(m_i)`` when ``i = j``.
    """
    if not isinstance(graph, CausalGraph):
        raise ValueError(f"graph must be a popgrad.CausalGraph, got {type(graph).__name__}")
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    T, S = graph.T, pi.shape[0]
    for name, v in (("i", i), ("j", j)):
        if not is_int(v) or not 0 <= v < T:
            raise ValueError(f"{name} = {v!r} must be a position in 0..{T - 1}")
    i, j = int(i), int(j)
    uniform = np.full(S, 1.0 / S)
    m_i = uniform if i == T - 1 else mu
    m_j = uniform if j == T - 1 else mu
    if i == j:
        return np.diag(m_i)
    lca = graph.lowest_common_ancestor(i, j)
    if lca is None:
        return np.outer(m_j, m_i)
    _, d_i, d_j = lca
    return np.linalg.matrix_power(pi, d_j).T @ (mu[:, None] * np.linalg.matrix_power(pi, d_i))


# ---------------------------------------------------- idealized gradient
def _h_table(atoms, mu, weights, rows, cols) -> np.ndarray:
    """``h[m, n] = Σ_k w_k ⟨(K_k^{rows[m]})ᵀ K_k^{cols[n]}, K_k⟩_F`` (``K^0 := I - r rᵀ``).

    ``rows`` holds the distances ``d_j`` and ``cols`` the distances ``d_i``
    that occur (a chain needs ``d_j = 0`` only). One matrix product per
    chunk of atoms: ``h += U Wᵀ`` with ``U[m, (k,x,a)] = w_k K_k^{rows[m]}[x,a]``
    and ``W[n, (k,x,a)] = (K_k (K_k^{cols[n]})ᵀ)[a, x]``; chunks keep the
    stacked powers below ``_CHUNK_FLOATS`` numbers.
    """
    nK, S, _ = atoms.shape
    dmax = int(max(rows.max(), cols.max()))
    h = np.zeros((len(rows), len(cols)))
    step = max(1, _CHUNK_FLOATS // (2 * (dmax + 1) * S * S))
    eye = np.eye(S)[None]
    for start in range(0, nK, step):
        sl = slice(start, min(nK, start + step))
        kern = _kernels(atoms[sl], mu[sl])
        r = np.sqrt(mu[sl])
        powers = np.empty((kern.shape[0], dmax + 1, S, S))
        powers[:, 0] = eye - r[:, :, None] * r[:, None, :]
        if dmax >= 1:
            powers[:, 1] = kern
        for d in range(2, dmax + 1):
            powers[:, d] = powers[:, d - 1] @ kern
        U = (weights[sl, None, None, None] * powers[:, rows]).transpose(1, 0, 2, 3).reshape(len(rows), -1)
        V = kern[:, None] @ np.swapaxes(powers[:, cols], 2, 3)  # K (K^d)^T
        W = V.transpose(1, 0, 3, 2).reshape(len(cols), -1)
        h += U @ W.T
    return h


def _idealized_from_graph(D, atoms, mu, weights) -> np.ndarray:
    """``g`` from the LCA table ``D``: ``g[i, j] = h(D[j, i], D[i, j])`` on the lower triangle."""
    T = D.shape[0]
    lower = np.tril(np.ones((T, T), dtype=bool))
    lower[T - 1, :] = False  # query row: 0 by design
    same = lower & (D >= 0)
    di, dj = D[same], D.T[same]
    rows, cols = np.unique(dj), np.unique(di)
    h = _h_table(atoms, mu, weights, rows, cols)
    g = np.zeros((T, T))
    g[same] = h[np.searchsorted(rows, dj), np.searchsorted(cols, di)]
    return g


def idealized_gradient_single(graph: CausalGraph, pi, mu=None) -> np.ndarray:
    """Idealized gradient ``g(π)`` for one transition matrix (DESIGN §5).

    Parameters
    ----------
    graph : CausalGraph
    pi : array_like, shape (S, S)
        Irreducible transition matrix (``μ > 0``).
    mu : array_like, shape (S,), optional
        Stationary distribution; GTH when omitted.

    Returns
    -------
    g : ndarray, shape (T, T)
        ``g[i, j] = Σ_{a,b} P[s_j=a, s_i=b | π] π(b|a)/μ(b) - 1`` for
        ``j ≤ i < T-1``, computed as ``⟨(K^{d_j})ᵀK^{d_i}, K⟩_F`` (0 across
        trees); zero above the diagonal and on the query row ``T-1``.
    """
    if not isinstance(graph, CausalGraph):
        raise ValueError(f"graph must be a popgrad.CausalGraph, got {type(graph).__name__}")
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    return _idealized_from_graph(lca_distances(graph), pi[None], mu[None], np.ones(1))


_G_CACHE: "OrderedDict[tuple, np.ndarray]" = OrderedDict()


def _task_key(task: Task) -> tuple:
    return (task.graph.to_string(), task.prior.fingerprint_bytes())


def query_row_first_order(task: Task) -> np.ndarray:
    """First-order (``β0 → 0``, ``f ≈ μ``) query row of the Stage-1 gradient.

    Returns
    -------
    c : ndarray, shape (T,)
        ``∂L/∂P[T-1, j] ≈ -(β0/(S·T)) · c[j]`` with ``c[j] = E[tr π] - 1`` for
        ``j < T-1`` and ``c[T-1] = E[Σ_a π(a|a)/μ(a)] - S``. The paper's
        formula does not apply to this row (module docstring).
    """
    task = _check_task(task)
    atoms, weights, mu = task.prior.invariant_view()  # invariant under relabeling
    diag = np.diagonal(atoms, axis1=1, axis2=2)
    tr = float(weights @ diag.sum(axis=1))
    ratio = float(weights @ (diag / mu).sum(axis=1))
    c = np.full(task.T, tr - 1.0)
    c[-1] = ratio - task.S
    return c


def idealized_gradient(task: Task, query_row: str = "zero") -> np.ndarray:
    """Idealized gradient ``g = E_π[g(π)]`` of a task (paper Knowl 3, DESIGN §5).

    Parameters
    ----------
    task : Task
        Every prior atom must be irreducible (``μ > 0``). Never enumerates:
        the cost is polynomial in ``T`` (``T = 1000`` is fine).
    query_row : {"zero", "first_order"}
        ``"zero"`` (default, DESIGN §6): the query row is 0.
        ``"first_order"``: the query row is :func:`query_row_first_order`,
        the first-order expansion of the exact gradient (module docstring).

    Returns
    -------
    g : ndarray, shape (T, T), read-only
        ``g[i, j] = E_π[Σ_{a,b} P[s_j=a, s_i=b | π] π(b|a)/μ(b)] - 1`` for
        ``j ≤ i < T-1``; zero above the diagonal. Root rows are 0 off the
        diagonal; every diagonal entry (query excluded) is ``E[tr π] - 1``.
    """
    task = _check_task(task)
    if query_row not in _QUERY_ROWS:
        raise ValueError(f"query_row must be one of {_QUERY_ROWS}, got {query_row!r}")
    key = _task_key(task)
    g = _G_CACHE.get(key)
    if g is None:
        atoms, weights, mu = task.prior.invariant_view()  # g(π) is invariant under relabeling
        g = _idealized_from_graph(lca_distances(task.graph), atoms, mu, weights)
        g.setflags(write=False)
        _G_CACHE[key] = g
        while len(_G_CACHE) > _CACHE_SIZE:
            _G_CACHE.popitem(last=False)
    else:
        _G_CACHE.move_to_end(key)
    if query_row == "first_order":
        g = g.copy()
        g[-1, :] = query_row_first_order(task)
        g.setflags(write=False)
    return g


def idealized_grad_A1(task: Task, A1, beta0: float, g=None, query_row: str = "zero") -> np.ndarray:
    """Predicted Stage-1 gradient ``-(β0/(S·T)) J(P_i) g_i`` for every row (DESIGN §5).

    Parameters
    ----------
    task : Task
    A1 : array_like, shape (T, T)
        First-layer attention logits; entries above the diagonal are ignored
        (masked), as in the model.
    beta0 : float
        Scale of ``A2 = β0 I`` (the prediction is first order in ``β0``).
    g : array_like, shape (T, T), optional
        A precomputed :func:`idealized_gradient` (it is cached anyway).
    query_row : {"zero", "first_order"}
        Passed to :func:`idealized_gradient` when ``g`` is omitted.

    Returns
    -------
    dA1 : ndarray, shape (T, T)
        ``dA1[i, :] = -(β0/(S·T)) · (P_i ⊙ g_i - P_i ⟨P_i, g_i⟩)`` with
        ``P = softmax_rows(MASK(A1))`` and ``J(v) = diag(v) - v vᵀ``: zero
        above the diagonal, every row summing to 0, the same layout as the
        exact ``dA1`` of :func:`popgrad.exact_loss_and_grad`.
    """
    task = _check_task(task)
    T, S = task.T, task.S
    A1 = np.asarray(A1, dtype=np.float64)
    if A1.shape != (T, T):
        raise ValueError(f"A1 must have shape (T, T) = ({T}, {T}) for this task, got {A1.shape}")
    if not np.all(np.isfinite(np.tril(A1))):
        raise ValueError("A1 has non-finite entries on or below the diagonal: attention logits must be finite")
    try:
        beta0 = float(beta0)
    except (TypeError, ValueError):
        raise ValueError(f"beta0 must be a finite number, got {beta0!r}") from None
    if not np.isfinite(beta0):
        raise ValueError(f"beta0 must be a finite number, got {beta0}")
    if g is None:
        g = idealized_gradient(task, query_row=query_row)
    else:
        g = np.asarray(g, dtype=np.float64)
        if g.shape != (T, T):
            raise ValueError(f"g must have shape ({T}, {T}), got {g.shape}: use popgrad.idealized_gradient(task)")
    P = first_layer_attention(A1)
    inner = np.sum(P * g, axis=1, keepdims=True)
    return -(beta0 / (S * T)) * (P * (np.tril(g) - inner))


# ------------------------------------------------------------ assumptions
def assumptions(task: Task) -> Assumptions:
    """Measure the paper's assumptions (Knowl 10) on a task.

    Reuses :meth:`FinitePrior.diagnostics` (γ, non-degeneracy, symmetry,
    uniform mean) and adds the graph's root fraction and ``T_eff`` and a few
    per-atom information quantities.

    Returns
    -------
    Assumptions
    """
    task = _check_task(task)
    pr: FinitePrior = task.prior
    dg = pr.diagnostics()
    rf = task.graph.root_fraction
    atoms, _, mu = pr.invariant_view()  # χ², σ2, Dobrushin: invariant under relabeling
    infos = [chain_information(a, m) for a, m in zip(atoms, mu)]
    return Assumptions(
        gamma=dg.gamma,
        nondegeneracy=dg.nondegeneracy,
        nondegenerate=dg.nondegenerate,
        symmetric=dg.symmetric,
        uniform_mean_error=dg.uniform_mean_error,
        uniform_mean=dg.uniform_mean,
        root_fraction=rf,
        root_fraction_ok=bool(rf <= 1.0 - dg.gamma),
        t_eff=task.t_eff,
        gamma_all=float(min(dg.gamma, np.sqrt(pr.S * dg.nondegeneracy), 1.0 - rf)),
        mu_min=float(mu.min()),
        chi2_mi_min=min(x.chi2_mi for x in infos),
        sigma2_max=max(x.sigma2 for x in infos),
        dobrushin_max=max(x.dobrushin for x in infos),
    )
