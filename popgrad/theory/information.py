r"""The idealized gradient and the paper's assumptions measured on a task (DESIGN §5–§6).

The notation (``μ``, ``D``, ``r = √μ``, the normalized kernel ``K``) and the quantities of one transition
matrix (χ² mutual information, ``σ₂``, contraction coefficients) are in :mod:`popgrad.theory.chain`; the
pairwise joints and the LCA distances in :mod:`popgrad.theory.joints`. Both are re-exported here.

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

from .._validation import as_real
from ..model.reduced import first_layer_attention
from ..task.graphs import CausalGraph
from ..task.priors import FinitePrior
from ..task.tasks import Task, check_task
from .chain import (MU_MIN, ChainInformation, _as_mu, _as_transition, _kernels, chain_information,
                    chi2_contraction_coefficient, chi2_mutual_information, deviation_norm2, dobrushin_coefficient,
                    normalized_kernel, sigma2)
from .joints import lca_distances, pairwise_joint

__all__ = [
    "Assumptions", "assumptions", "has_idealized_gradient", "idealized_gradient", "idealized_gradient_single",
    "idealized_grad_A1", "query_row_first_order",
    # re-exported from .chain and .joints (their home before the split)
    "ChainInformation", "chain_information", "normalized_kernel", "chi2_mutual_information", "sigma2",
    "dobrushin_coefficient", "chi2_contraction_coefficient", "deviation_norm2", "lca_distances", "pairwise_joint",
]

#: Largest number of floats in the stacked matrix powers of one chunk of atoms.
_CHUNK_FLOATS = 4_000_000
#: Number of task-level idealized gradients kept in the cache.
_CACHE_SIZE = 8
_QUERY_ROWS = ("zero", "first_order")


# ------------------------------------------------------------------ results
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
    beta0 = as_real(beta0, "beta0", minimum=0, strict=True, hint=" (the scale of A2 = beta0*I)")
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
