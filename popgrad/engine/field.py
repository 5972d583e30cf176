"""The Stage-1 field: the exact first-order (in ``β0``) Stage-1 gradient (DESIGN §12).

At ``A2 = β0·I`` and to first order in ``β0`` (``a_k = 1/T``, ``f = n/T``
with ``n`` the token counts of all ``T`` positions, the query included)::

    ∂L/∂P[i,j] = -(β0/T) · M[i,j] + O(β0²)                               (j ≤ i)
    M[i,j]     = E[ Σ_c π(c|q) · ([s_i = c] - n_c/T) / (n_c/T + ε) · [s_j = q] ]
    ∇_{A1[i,:]} L = -(β0/T) · J(P[i,:]) · M[i,:] + O(β0²),   J(v) = diag(v) - v vᵀ

``M`` does not depend on ``A1``. The expectation is over the task's exact
distribution (DESIGN §2): the prior mixture, roots other than the query
``~ μ_π``, non-roots ``~ π(·|s_parent)``, the query ``q = s_{T-1} ~ Unif``.

Three ways to compute it, all exact up to rounding:

* ``"enumerate"``: one numba pass over the ``S**T`` sequences with the exact
  weights of :mod:`popgrad.task._weights` (bounded by ``task.check_size()``);
* ``"counts"``: count generating functions evaluated at the ``N = T`` roots
  of unity, no ``S**T`` anywhere (algorithm below);
* :func:`stage1_field_numpy`: the plain-NumPy brute-force reference.

The counts algorithm
--------------------
Write ``C = T - 1`` (context positions ``0..C-1``) and ``m_c`` the count of
``c`` among them, so ``n_c = m_c + [c = q]``. With
``g_δ(m) = 1/((m+δ)/T + ε)`` and ``e_δ(m) = ((m+δ)/T) g_δ(m)`` (``δ ∈ {0, 1}``)::

    Σ_c π(c|q)([s_i=c] - n_c/T)/(n_c/T+ε) = π(s_i|q) g_{[s_i=q]}(m_{s_i}) - Σ_c π(c|q) e_{[c=q]}(m_c)

so per atom, marked symbol ``c`` and query ``q`` only the joint law of
``(s_i, s_j, m_c)`` is needed. Mark ``c`` with ``D(x) = diag(1,…,x,…,1)`` on
every context node; the joint generating functions
``W_ij(x)[b] = E[[s_i=c][s_j=b] x^{m_c}]``, ``V_j(x)[b] = E[[s_j=b] x^{m_c}]``
and ``Z(x) = E[x^{m_c}]`` are polynomials of degree ``≤ C < N`` with
non-negative coefficients, evaluated at ``x_k = e^{2πik/N}``. For a real
``f``, ``E[f(m_c)·stuff] = Σ_k f̂(k) E[stuff·x_k^{m_c}]`` with
``f̂(k) = (1/N) Σ_m f(m) x_k^{-m}`` (one FFT), exactly since the degree is
below ``N``; conjugate symmetry halves the grid
(``k = 0..N//2``, weight ``ω_k = 2`` except ``k = 0`` and ``k = N/2``, and
the real part). With
``φ[c,k,b] = ω_k π(c|b) ĝ_{[b=c]}(k)/S``,
``ψ[c,k,b] = ω_k π(c|b) ê_{[b=c]}(k)/S``, ``χ[c,k] = φ[c,k,c]``::

    M[i,j]     = Re Σ_{c,k,b} φ W_ij(x_k)[b] - T2[j]          context j ≤ i
    M[T-1,j]   = Re Σ_{c,k}   χ V_j(x_k)[c] - T2[j]            (query row: s_i = q)
    M[T-1,T-1] = Re Σ_{c,k} (χ - Σ_b ψ) Z(x_k)
    T2[j]      = Re Σ_{c,k,b} ψ V_j(x_k)[b]

*Forests* (any single-parent graph): roots are independent given ``π``, so
``Z`` is a product over trees. Inside vectors
``U_v[y] = D[y] Π_{children h} (π U_h)[y]``, tree factors
``Z_r = μ·U_r``, sibling products ``EX_h = Π_{h' ≠ h} π U_{h'}`` and
root products ``ER_r = Π_{r' ≠ r} Z_{r'}`` (prefix/suffix products: never a
division, a factor may vanish on the unit circle), outside vectors
``O_r = μ ER_r``, ``O_h = (O_p ⊙ D ⊙ EX_h) π``, so ``V_v = O_v ⊙ U_v``.
For a row ``i`` clamp ``s_i = c`` (``U'_i = e_c U_i[c]``), redo the
inside vectors on the path from ``i`` to its root, the sibling and root
products touched by it, and the outside vectors of nodes ``0..i``; then
``W_ij = O'_j ⊙ U'_j`` for every ``j ≤ i``. Cost per atom
``O(S · N/2 · T² · S²) = O(S³T³/2)`` for any forest (``i·S²`` per clamped
pass, ``S·N/2`` passes per row).

*Chains* (the context is the path ``0 → … → C-1``): with ``A = π D(x)``,
``W_ij[b] = α_j[b] (A^{i-j})[b,c] β_i[c]`` (``α_j = μᵀ D A^j``,
``β_i = A^{C-1-i} 1``): the path product depends on ``i - j`` only, so the
pair term costs ``O(S)`` per pair and grid point, ``O(S²T³/2)`` per atom,
in elementwise loops that vectorize.

Relabeling: the per-atom field is invariant under token relabeling of
``π`` (it sums over ``c`` and a uniform ``q``); :func:`field_atoms` reduces a
prior laid out as :func:`popgrad.relabel_closure` builds it to its
base draws.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import numpy as np

from .._validation import ArgumentTypeError
from ..model.reduced import first_layer_attention
from ..task.graphs import CausalGraph
from ..task.priors import FinitePrior, relabel, stationary_distribution
from ..task.tasks import Task, check_task
from ._args import options_or_default
from ._kernels import field as fk
from .options import DEFAULT_OPTIONS

__all__ = [
    "Stage1Field",
    "stage1_field",
    "stage1_field_from_atoms",
    "stage1_field_numpy",
    "field_atoms",
    "METHODS",
]

#: Accepted values of ``method``.
METHODS = ("auto", "enumerate", "counts")
#: Fixed block structure of the enumeration kernel (depends on ``S**T`` only).
_ENUM_MIN_BLOCK = 4096
_ENUM_MAX_BLOCKS = 256
#: Rows of the chain pair kernel per cache block.
_CHAIN_DBLOCK = 16
#: Relative cost of one enumerated sequence-position vs one counts inner step (``auto`` rule).
_ENUM_COST_FACTOR = 1.0


class Stage1Field(NamedTuple):
    """The Stage-1 field of a task (DESIGN §12).

    ``M[i,j] = E[ Σ_c π(c|q) ([s_i = c] - n_c/T) / (n_c/T + ε) [s_j = q] ]``
    for ``j ≤ i`` (query ``q = s_{T-1}``, ``n_c`` counts over all ``T``
    positions). To first order in ``β0`` at ``A2 = β0·I``:
    ``∇_{A1[i,:]} L = -(β0/T) J(P[i,:]) M[i,:]``; in natural units a Stage-1
    step is ``A1_i ← A1_i + lr1·S·J(P_i) M_i``.

    Attributes
    ----------
    M : ndarray, shape (T, T), float64
        Lower triangular (diagonal included); zero above the diagonal.
        Includes root rows and the query row ``T-1``.
    eps : float
        The loss perturbation ``ε`` used.
    method : str
        ``"enumerate"`` or ``"counts"`` (what ``"auto"`` resolved to).
    per_atom : ndarray, shape (K, T, T), or None
        The field of each atom (unweighted), when requested.
    """

    M: np.ndarray
    eps: float
    method: str
    per_atom: Optional[np.ndarray] = None


# ================================================================ validation
def _check_task(task):
    task = check_task(task, Task, "the Stage-1 field (defined for single-parent graphs: one first-layer head)")
    if task.continuous:  # the field is a sum over atoms (DESIGN §12): refuse in one line (DESIGN §20)
        raise ValueError(f"the Stage-1 field sums over the prior's atoms, but {task.prior!r} is continuous: use a "
                         "finite stand-in, e.g. Task(graph, popgrad.dirichlet_prior(S, alpha, n_atoms, seed)) "
                         "(its field differs from the continuous prior's by the Monte-Carlo error of n_atoms draws)")
    return task


def _check_eps(task_or_teff, eps) -> float:
    """``ε``: ``None`` → ``T_eff**-0.5``; else a finite number ``> 0``.

    ``ε = 0`` is refused (unlike the exact loss, which allows it): the field
    is the first-order expansion of the loss, which is infinite at ``ε = 0``
    as soon as a token with positive target mass is absent from a sequence.
    """
    if eps is None:
        return float(task_or_teff) ** -0.5 if not isinstance(task_or_teff, Task) else float(task_or_teff.default_eps)
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise ArgumentTypeError(f"eps must be a real number > 0 (or None for T_eff**-0.5), got {type(eps).__name__}")
    v = float(eps)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(
            f"eps must be finite and > 0 (or None for T_eff**-0.5), got {v}: the first-order field "
            "divides by n_c/T + eps, and the loss it expands is infinite at eps = 0"
        )
    return v


def _check_method(method) -> str:
    if not isinstance(method, str):
        raise ArgumentTypeError(f"method must be a string, one of {METHODS}, got {type(method).__name__}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


# ================================================================ relabeling
def field_atoms(prior):
    """Atoms and weights on which to compute the field of ``prior``.

    The per-atom field is invariant under token relabeling of ``π``. When
    ``prior`` is laid out as :func:`popgrad.relabel_closure` builds
    it (``K = K0·S!`` atoms in blocks of ``S!`` consecutive relabelings of
    the block's first atom, permutations in lexicographic order, equal
    weights in a block; checked bit for bit), the block heads with the
    block weights summed are returned: ``S!`` times fewer atoms, same field
    up to rounding. An implicit closure (:meth:`FinitePrior.relabeling_closure`,
    what ``dirichlet_prior(symmetrize=True)`` returns) gives its base draws
    directly. Otherwise the prior's own atoms and weights.

    Parameters
    ----------
    prior : FinitePrior, or a pair ``(atoms (K,S,S), weights (K,))``

    Returns
    -------
    atoms : ndarray (K', S, S), weights : ndarray (K',)
    """
    if isinstance(prior, FinitePrior) and prior.implicit_closure:  # the base draws, never the S! relabelings
        return np.asarray(prior.base.atoms), np.asarray(prior.base.weights)
    if isinstance(prior, FinitePrior):
        atoms, weights = (np.asarray(x) for x in prior.expand())
    elif isinstance(prior, tuple) and len(prior) == 2:
        atoms = np.asarray(prior[0], dtype=np.float64)
        weights = np.asarray(prior[1], dtype=np.float64)
    else:
        raise ArgumentTypeError(f"prior must be a FinitePrior or a pair (atoms, weights), got {type(prior).__name__}")
    K, S, _ = atoms.shape
    n_perm = math.factorial(S)
    if S > 8 or K % n_perm or K == 0:
        return atoms, weights
    import itertools

    perms = list(itertools.permutations(range(S)))
    heads = atoms[::n_perm]
    for b in range(K // n_perm):
        blk = slice(b * n_perm, (b + 1) * n_perm)
        wb = weights[blk]
        if not np.all(wb == wb[0]):
            return atoms, weights
        for m, perm in enumerate(perms):
            if not np.array_equal(atoms[b * n_perm + m], relabel(heads[b], perm)):
                return atoms, weights
    return np.ascontiguousarray(heads), weights.reshape(-1, n_perm).sum(axis=1)


# ================================================================ public API
def stage1_field(task, eps=None, method="auto", per_atom=False, options=None) -> Stage1Field:
    """The Stage-1 field ``M`` of a task, exactly (DESIGN §12).

    Parameters
    ----------
    task : Task
        Single-parent graph and finite prior.
    eps : float, optional
        ``ε > 0``; default ``task.default_eps`` (``T_eff**-0.5``).
    method : {"auto", "enumerate", "counts"}
        ``"enumerate"``: one pass over the ``S**T`` sequences (respects
        ``task.max_sequences``). ``"counts"``: count generating functions,
        polynomial in ``T`` (``O(K·S³·T³/2)`` for any forest,
        ``O(K·S²·T³/2)`` for a chain), on :func:`field_atoms` of the prior.
        ``"auto"``: ``"enumerate"`` when ``S**T`` is within the size limit
        and its work estimate ``S**T·T·(K + T)`` is below the counts
        estimate ``K'·S·(T/2+1)·T²·(S² or S)`` (``K'`` the atoms after
        relabeling reduction; ``S²`` for forests, ``S`` for chains),
        else ``"counts"``.
    per_atom : bool
        ``"counts"`` only: also return the field of every atom actually
        computed (:func:`field_atoms`), unweighted, in ``per_atom``.

    Returns
    -------
    Stage1Field

    Raises
    ------
    TypeError
        ``task`` not a Task, ``eps`` or ``method`` of a wrong type.
    ValueError
        Invalid ``eps``/``method``; a multi-parent task.
    TaskTooLargeError
        ``method="enumerate"`` and ``S**T`` above ``task.max_sequences``.
    """
    task = _check_task(task)
    eps = _check_eps(task, eps)
    method = _check_method(method)
    opts = options_or_default(options)
    if method == "auto":
        method = _auto_method(task)
    if method == "enumerate":
        if per_atom:
            raise ValueError("per_atom=True needs method='counts'")
        return Stage1Field(_field_enumerate(task, eps, opts), eps, "enumerate", None)
    atoms, weights = field_atoms(task.prior)
    if task.prior.implicit_closure:
        mu = np.asarray(task.prior.base.stationary)
    else:
        mu = np.asarray(task.prior.stationary)
        if len(weights) != task.prior.K:  # reduced to the heads of the relabeling blocks
            mu = mu[:: task.prior.K // len(weights)]
    M, pa = _field_counts(task.graph, atoms, weights, eps, per_atom, mu=mu, opts=opts)
    return Stage1Field(M, eps, "counts", pa)


def stage1_field_from_atoms(graph, atoms, weights=None, eps=None, per_atom=False, options=None) -> Stage1Field:
    """The counts-method field of ``graph`` for given atoms (e.g. base draws of a closed prior).

    Parameters
    ----------
    graph : CausalGraph
    atoms : array_like (K, S, S)
        Row-stochastic transition matrices (validated by :class:`FinitePrior`).
    weights : array_like (K,), optional
        Default uniform.
    eps : float, optional
        Default ``graph.t_eff ** -0.5``.
    per_atom : bool

    Returns
    -------
    Stage1Field
        ``method = "counts"``; no relabeling reduction is applied.
    """
    if not isinstance(graph, CausalGraph):
        raise ArgumentTypeError(f"graph must be a popgrad.CausalGraph, got {type(graph).__name__}")
    prior = FinitePrior(atoms, weights)
    eps = _check_eps(graph.t_eff, eps)
    M, pa = _field_counts(graph, np.asarray(prior.atoms), np.asarray(prior.weights), eps, per_atom,
                          opts=options_or_default(options),
                          mu=np.asarray(prior.stationary))
    return Stage1Field(M, eps, "counts", pa)


def stage1_field_numpy(task, eps=None, chunk_size=2**14) -> np.ndarray:
    """Plain-NumPy brute-force reference: the field by enumeration of ``task.enumerate``.

    Per chunk of sequences ``s`` with weights ``w(s, c)``:
    ``r_c = w/(n_c/T + ε)``, ``r̄ = Σ_c r_c n_c/T``,
    ``M += (r_{s_i} - r̄)ᵀ [s_j = q]`` (a matrix product), lower triangle kept.

    Returns
    -------
    M : ndarray (T, T)
    """
    task = _check_task(task)
    eps = _check_eps(task, eps)
    T, S = task.T, task.S
    M = np.zeros((T, T))
    for seqs, w in task.enumerate(chunk_size):
        n = (seqs[:, :, None] == np.arange(S)).sum(axis=1).astype(np.float64)  # (n, S)
        f = n / T
        r = w / (f + eps)
        rbar = (r * f).sum(axis=1)
        val = np.take_along_axis(r, seqs, axis=1) - rbar[:, None]  # (n, T)
        ind = (seqs == seqs[:, -1:]).astype(np.float64)
        M += val.T @ ind
    return np.tril(M)


# ================================================================ internals
def _is_chain(parents) -> bool:
    C = len(parents) - 1
    return C >= 1 and parents[0] == -1 and all(parents[v] == v - 1 for v in range(1, C))


def _auto_method(task) -> str:
    S, T = task.S, task.T
    n = task.n_sequences
    if n > task.max_sequences:
        return "counts"
    K = len(field_atoms(task.prior)[1])
    per_pair = S if _is_chain(task.graph.parents) else S * S
    counts_work = K * S * (T // 2 + 1) * T * T * per_pair
    enum_work = _ENUM_COST_FACTOR * n * T * (task.prior.K + T)
    return "enumerate" if enum_work < counts_work else "counts"


def _kernel(name, work, opts):
    """The parallel kernel ``name`` or its serial twin, by the work estimate against
    ``opts.field_parallel_min_work`` (same iterations, same bits either way)."""
    return getattr(fk, name if work >= opts.field_parallel_min_work else name + "_serial")


def _field_enumerate(task, eps, opts) -> np.ndarray:
    task.check_size()
    parents, mu, atoms, prior_w = task.kernel_arrays()
    n_total, T = task.n_sequences, task.T
    n_blocks = max(1, min(_ENUM_MAX_BLOCKS, -(-n_total // _ENUM_MIN_BLOCK)))
    block = -(-n_total // n_blocks)
    n_blocks = -(-n_total // block)
    slots = np.empty((n_blocks, T, T))
    kern = _kernel("field_enumerate", n_total * T * (task.prior.K + T) if n_blocks > 1 else 0, opts)
    kern(block, n_total, T, float(eps), parents, mu, atoms, prior_w, slots)
    M = np.empty((T, T))
    fk.sum_slots(slots, M)
    return M


def _fft_tables(pi, T, eps):
    """``φ, ψ (S, NH, S)`` and ``χ (S, NH)`` complex, and the half grid ``xs (NH,)``."""
    S = pi.shape[0]
    N = T
    NH = N // 2 + 1
    m = np.arange(N, dtype=np.float64)
    g0 = 1.0 / (m / T + eps)
    g1 = 1.0 / ((m + 1.0) / T + eps)
    e0 = (m / T) * g0
    e1 = ((m + 1.0) / T) * g1
    hat = [np.fft.fft(v)[:NH] / N for v in (g0, g1, e0, e1)]
    omega = np.full(NH, 2.0)
    omega[0] = 1.0
    if N % 2 == 0:
        omega[-1] = 1.0
    k = np.arange(NH)
    xs = np.exp(2j * np.pi * k / N)
    eye = np.eye(S, dtype=bool)
    # pi[b, c] = π(c|b); φ[c,k,b] = ω_k π(c|b) ĝ_{[b=c]}(k) / S
    piT = pi.T  # [c, b]
    gsel = np.where(eye[:, None, :], hat[1][None, :, None], hat[0][None, :, None])  # [c,k,b]
    esel = np.where(eye[:, None, :], hat[3][None, :, None], hat[2][None, :, None])
    phi = (omega[None, :, None] / S) * piT[:, None, :] * gsel
    psi = (omega[None, :, None] / S) * piT[:, None, :] * esel
    chi = np.ascontiguousarray(phi[np.arange(S), :, np.arange(S)])  # [c, k]
    return (np.ascontiguousarray(phi), np.ascontiguousarray(psi), chi, np.ascontiguousarray(xs))


def _forest_arrays(parents):
    parents = np.ascontiguousarray(parents[:-1], dtype=np.int64)  # context forest
    C = len(parents)
    counts = np.zeros(C + 1, dtype=np.int64)
    for v in range(C):
        if parents[v] >= 0:
            counts[parents[v] + 1] += 1
    ch_ptr = np.cumsum(counts)
    ch_idx = np.empty(max(1, ch_ptr[-1]), dtype=np.int64)
    fill = ch_ptr[:-1].copy()
    for v in range(C):  # increasing v: children listed in increasing order
        p = parents[v]
        if p >= 0:
            ch_idx[fill[p]] = v
            fill[p] += 1
    roots = np.ascontiguousarray(np.flatnonzero(parents < 0), dtype=np.int64)
    return parents, ch_ptr, ch_idx, roots


def _atom_field_counts(graph, pi, mu, eps, forest, chain, opts):
    T = graph.T
    S = pi.shape[0]
    C = T - 1
    phi, psi, chi, xs = _fft_tables(pi, T, eps)
    NH = xs.shape[0]
    X = np.zeros((C, C))
    V = np.empty((S, NH, C, S), dtype=np.complex128)
    Z = np.empty((S, NH), dtype=np.complex128)
    if chain:
        Gr = np.empty((S, NH, S, C))
        Gi = np.empty((S, NH, S, C))
        Pm = np.empty((S, NH, C, S), dtype=np.complex128)
        Br = np.empty((S, NH, C))
        Bi = np.empty((S, NH, C))
        _kernel("chain_prepass", 3 * S * NH * C * S * S, opts)(pi, mu, xs, phi, V, Z, Gr, Gi, Pm, Br, Bi)
        Y = np.zeros((C, C))
        _kernel("chain_pairs", S * NH * C * C * (S + 1) // 2, opts)(Gr, Gi, np.ascontiguousarray(Pm.real), np.ascontiguousarray(Pm.imag), Br, Bi,
                       _CHAIN_DBLOCK, Y)
        fk.chain_unskew(Y, X)
    else:
        par, ch_ptr, ch_idx, roots = forest
        shape = (S, NH, C, S)
        U = np.empty(shape, dtype=np.complex128)
        PU = np.empty(shape, dtype=np.complex128)
        EX = np.empty(shape, dtype=np.complex128)
        O = np.empty(shape, dtype=np.complex128)
        Zt = np.zeros((S, NH, C), dtype=np.complex128)
        ER = np.zeros((S, NH, C), dtype=np.complex128)
        _kernel("tree_prepass", 3 * S * NH * C * S * S, opts)(par, ch_ptr, ch_idx, roots, pi, mu, xs, U, PU, EX, O, Zt, ER, Z)
        fk.tree_marginals(O, U, V)
        _kernel("tree_pairs", S * NH * C * C * S * S // 2, opts)(par, ch_ptr, ch_idx, roots, pi, mu, xs, U, PU, EX, Zt, phi, X)
    out = np.empty((T, T))
    fk.assemble(X, V, Z, psi, chi, out)
    return out


def _field_counts(graph, atoms, weights, eps, per_atom=False, mu=None, opts=DEFAULT_OPTIONS):
    atoms = np.ascontiguousarray(atoms, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if mu is None:
        mu = stationary_distribution(atoms)
    mu = np.ascontiguousarray(mu, dtype=np.float64).reshape(atoms.shape[0], -1)
    chain = _is_chain(graph.parents)
    forest = None if chain else _forest_arrays(graph.parents)
    T = graph.T
    M = np.zeros((T, T))
    pa = np.empty((len(weights), T, T)) if per_atom else None
    for k in range(len(weights)):
        Mk = _atom_field_counts(graph, atoms[k], mu[k], eps, forest, chain, opts)
        if pa is not None:
            pa[k] = Mk
        M += weights[k] * Mk
    return M, pa


def field_grad_A1(M, A1, beta0) -> np.ndarray:
    """The first-order Stage-1 gradient from the field: ``dA1[i] = -(β0/T) J(P_i) M_i`` (DESIGN §12).

    ``P = softmax_rows(MASK(A1))``, ``J(v) = diag(v) - v vᵀ``; rows sum to 0, zero above the diagonal.
    Exact to first order in ``β0`` at ``A2 = β0·I`` for every ``A1``.

    Parameters
    ----------
    M : ndarray (T, T)
        The field (``stage1_field(task).M``).
    A1 : ndarray (T, T)
    beta0 : float
    """
    P = first_layer_attention(A1)
    T = P.shape[0]
    G = np.tril(M)
    return -(float(beta0) / T) * P * (G - np.sum(P * G, axis=1, keepdims=True))
