"""Idealized gradient, pairwise joints and χ² information (DESIGN §5–§6).

Named invariants, each over hypothesis-drawn graphs and transition matrices:

* identities per π: ``g[i,p(i)] = ‖K‖²``, ``g[i,j] = tr(Q_j K Kᵀ)``,
  ``g[i,i] = tr π - 1``, root rows 0 below the diagonal, query row 0;
* pairwise joints and ``g`` against brute force over every sequence of
  small tasks (``Task.enumerate``), to 1e-12;
* the information quantities against their definitions;
* ``idealized_grad_A1`` against ``-(β0/(ST)) J(P_i) g_i`` written out;
* against the exact engine: sign pattern and rising cosine (chain graph).
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.theory import information as inf

from ..strategies import graphs

TOL = 1e-12


def many(n):
    """``n`` examples (``thorough`` multiplies them: tests/profiles.py)."""
    return settings(max_examples=n)


# ------------------------------------------------------------ strategies
@st.composite
def chains(draw, min_S=2, max_S=4):
    """An irreducible ``(S, S)`` transition matrix, sometimes with a rare state.

    Dirichlet rows (seeded), a floor ``≥ 1e-4/S`` on every entry (so μ > 0),
    and optionally column 0 scaled down so that ``μ`` is far from uniform.
    """
    S = draw(st.integers(min_S, max_S))
    seed = draw(st.integers(0, 2**32 - 1))
    alpha = draw(st.sampled_from([0.1, 0.5, 1.0, 5.0]))
    floor = draw(st.sampled_from([1e-4, 1e-2, 0.1, 0.5, 0.8]))
    rare = draw(st.sampled_from([1.0, 1.0, 0.2, 0.02]))
    rng = np.random.default_rng(seed)
    pi = rng.dirichlet(np.full(S, alpha), size=S)
    pi[:, 0] *= rare
    pi = pi / pi.sum(axis=1, keepdims=True)
    pi = floor / S + (1.0 - floor) * pi
    return pi / pi.sum(axis=1, keepdims=True)


@st.composite
def small_tasks(draw, max_sequences=3000, max_atoms=3):
    """A task with ``S**T ≤ max_sequences`` and irreducible atoms."""
    S = draw(st.integers(2, 4))
    max_T = int(math.floor(math.log(max_sequences) / math.log(S)))
    graph = draw(graphs(2, min(max_T, 8)))
    K = draw(st.integers(1, max_atoms))
    atoms = np.stack([draw(chains(S, S)) for _ in range(K)])
    w = np.array(draw(st.lists(st.floats(0.1, 1.0), min_size=K, max_size=K)))
    return pg.Task(graph, pg.FinitePrior(atoms, w / w.sum()))


def lazy_chain(S, stay):
    """``stay · I + (1 - stay) · 11ᵀ/S``: a lazy (doubly stochastic) chain."""
    return stay * np.eye(S) + (1.0 - stay) * np.full((S, S), 1.0 / S)


def uniform_mean_prior(atoms):
    """A relabeling-closed prior with ``E[π] = 11ᵀ/S`` exactly, built from ``atoms``.

    The relabeling closure has mean ``d·I + o·(11ᵀ - I)``; mixing in one
    permutation-invariant atom whose diagonal lies on the other side of
    ``1/S`` (the lazy chain, or the "never stay" chain ``(11ᵀ - I)/(S-1)``)
    with the right weight makes ``d = 1/S``, hence every entry ``1/S``.
    """
    closed, w = pg.relabel_closure(atoms)
    S = closed.shape[1]
    d = float(w @ np.diagonal(closed, axis1=1, axis2=2).mean(axis=1))
    if abs(d - 1.0 / S) < 1e-15:
        return pg.FinitePrior(closed, w)
    extra = lazy_chain(S, 0.9) if d < 1.0 / S else (np.ones((S, S)) - np.eye(S)) / (S - 1)
    d_extra = float(np.diagonal(extra).mean())
    lam = (1.0 / S - d_extra) / (d - d_extra)
    return pg.FinitePrior(np.concatenate([closed, extra[None]]), np.concatenate([lam * w, [1.0 - lam]]))


def brute_force_g(task):
    """``E_π[Σ_s P(s|π) π(s_i|s_j)/μ(s_i)] - 1`` by enumerating every sequence, per atom.

    Returns the full ``(T, T)`` lower triangle *including* the query row as
    the formula gives it (the public ``g`` sets that row to 0).
    """
    T, pr = task.T, task.prior
    g = np.zeros((T, T))
    for pi, mu, wk in zip(pr.atoms, pr.stationary, pr.weights):
        seqs, w = pg.Task(task.graph, pg.FinitePrior(pi[None])).all_sequences()
        p = w.sum(axis=1)  # P(s | π): the soft label sums out
        for i in range(T):
            for j in range(i + 1):
                g[i, j] += wk * (p @ (pi[seqs[:, j], seqs[:, i]] / mu[seqs[:, i]]) - 1.0)
    return g


def brute_force_joint(task_single, i, j):
    seqs, w = task_single.all_sequences()
    S = task_single.S
    J = np.zeros((S, S))
    np.add.at(J, (seqs[:, j], seqs[:, i]), w.sum(axis=1))
    return J


# --------------------------------------------------- LCA distance table
@given(graph=graphs(2, 12))
@many(100)
def test_lca_distances_match_graph(graph):
    D = inf.lca_distances(graph)
    for i in range(graph.T):
        for j in range(graph.T):
            lca = graph.lowest_common_ancestor(i, j)
            if lca is None:
                assert D[i, j] == -1 and D[j, i] == -1
            else:
                assert (D[i, j], D[j, i]) == (lca[1], lca[2])


# ------------------------------------------------------ identities per π
@given(graph=graphs(2, 9), pi=chains())
@many(150)
def test_parent_entry_is_chi2_mutual_information(graph, pi):
    g = inf.idealized_gradient_single(graph, pi)
    mu = pg.stationary_distribution(pi)
    direct = float(np.sum(mu[:, None] * pi**2 / mu[None, :]) - 1.0)
    K = inf.normalized_kernel(pi)
    assert abs(np.sum(K * K) - direct) <= TOL
    for i in graph.non_roots:
        assert abs(g[i, graph.parents[i]] - direct) <= TOL


@given(graph=graphs(3, 9), pi=chains())
@many(150)
def test_nonparent_entry_is_trace_QKK(graph, pi):
    """``g[i,j] = tr(Q_j K Kᵀ)``, ``Q_j`` from the joint of ``(s_j, s_{p(i)})`` (pairwise_joint)."""
    g = inf.idealized_gradient_single(graph, pi)
    mu = pg.stationary_distribution(pi)
    r = np.sqrt(mu)
    K = inf.normalized_kernel(pi)
    KK = K @ K.T
    for i in graph.non_roots:
        p = int(graph.parents[i])
        for j in range(i):
            if j == p:
                continue
            M = inf.pairwise_joint(graph, pi, p, j)  # M[a, x] = P[s_j = a, s_p = x]
            Q = M / np.outer(r, r) - np.outer(r, r)
            assert abs(g[i, j] - np.trace(Q @ KK)) <= TOL


@given(graph=graphs(2, 9), pi=chains())
@many(150)
def test_diagonal_root_rows_query_row_and_upper_triangle(graph, pi):
    g = inf.idealized_gradient_single(graph, pi)
    T = graph.T
    for i in range(T - 1):
        assert abs(g[i, i] - (np.trace(pi) - 1.0)) <= TOL  # roots included
    for i in graph.roots:
        assert np.all(g[i, :i] == 0.0)  # s_j independent of a root s_i
    assert np.all(g[T - 1] == 0.0)  # query row: 0 by design (module docstring)
    assert np.all(np.triu(g, 1) == 0.0)


# --------------------------------------------------------- brute force
@given(task=small_tasks())
@many(60)
def test_idealized_gradient_equals_brute_force(task):
    g = inf.idealized_gradient(task)
    gb = brute_force_g(task)
    T = task.T
    assert np.abs(g[: T - 1] - gb[: T - 1]).max() <= TOL
    # The query row of the formula: 0 off the diagonal, (1/S) Σ π(a|a)/μ(a) - 1 on it;
    # the public g sets it to 0 (see popgrad.information).
    assert np.abs(gb[T - 1, : T - 1]).max(initial=0.0) <= TOL
    pr = task.prior
    diag = np.diagonal(pr.atoms, axis1=1, axis2=2)
    expected = pr.weights @ ((diag / pr.stationary).mean(axis=1)) - 1.0
    assert abs(gb[T - 1, T - 1] - expected) <= TOL


@given(task=small_tasks(max_atoms=1))
@many(60)
def test_pairwise_joint_equals_brute_force(task):
    pi = task.prior.atoms[0]
    for i in range(task.T):
        for j in range(task.T):
            J = inf.pairwise_joint(task.graph, pi, i, j)
            assert np.abs(J - brute_force_joint(task, i, j)).max() <= TOL


@given(task=small_tasks(max_atoms=2))
@many(40)
def test_formula_is_the_first_order_gradient_with_f_equal_mu(task):
    """``S·E[[s_j = q](π(s_i|q)/μ(s_i) - 1)]`` (the β0 → 0, f → μ gradient) by enumeration.

    It equals ``g[i, j]`` on every non-query row (roots' diagonals included)
    and :func:`query_row_first_order` on the query row.
    """
    T, S, pr = task.T, task.S, task.prior
    first = np.zeros((T, T))
    for pi, mu, wk in zip(pr.atoms, pr.stationary, pr.weights):
        seqs, w = pg.Task(task.graph, pg.FinitePrior(pi[None])).all_sequences()
        p, q = w.sum(axis=1), seqs[:, T - 1]
        for i in range(T):
            for j in range(i + 1):
                term = (seqs[:, j] == q) * (pi[q, seqs[:, i]] / mu[seqs[:, i]] - 1.0)
                first[i, j] += wk * S * (p @ term)
    g = inf.idealized_gradient(task)
    assert np.abs(first[: T - 1] - g[: T - 1]).max() <= 1e-11
    c = inf.query_row_first_order(task)
    assert np.abs(first[T - 1] - c).max() <= 1e-11
    g1 = inf.idealized_gradient(task, query_row="first_order")
    assert np.array_equal(g1[T - 1], c) and np.array_equal(g1[: T - 1], g[: T - 1])


# ----------------------------------------------- large T, polynomial cost
def test_idealized_gradient_at_T_1000_matches_small_T():
    """T = 1000 works; on a chain, entry (i, i-d) depends on d only."""
    prior = pg.dirichlet_prior(3, 1.0, 4, 0)
    big = inf.idealized_gradient(pg.Task(pg.chain(1000), prior))
    small = inf.idealized_gradient(pg.Task(pg.chain(12), prior))
    assert big.shape == (1000, 1000)
    assert np.abs(big[:11, :11] - small[:11, :11]).max() <= TOL
    assert np.abs(big[900, 890:901] - small[10, :11]).max() <= TOL
    tree = pg.Task(pg.random_tree(1000, seed=2, root_prob=0.05), prior)
    assert inf.idealized_gradient(tree).shape == (1000, 1000)


def test_cache_returns_read_only_and_equal_results():
    task = pg.Task(pg.chain(7), pg.dirichlet_prior(2, 1.0, 3, 1))
    g1 = inf.idealized_gradient(task)
    g2 = inf.idealized_gradient(pg.Task(pg.chain(7), pg.dirichlet_prior(2, 1.0, 3, 1)))
    assert np.array_equal(g1, g2) and not g1.flags.writeable
    with pytest.raises(ValueError):
        g1[0, 0] = 1.0


# ------------------------------------------------- information quantities
@given(pi=chains())
@many(200)
def test_information_quantities_match_definitions(pi):
    info = inf.chain_information(pi)
    S = pi.shape[0]
    mu = info.mu
    assert np.abs(mu @ pi - mu).max() <= TOL
    N = np.sqrt(mu)[:, None] * pi / np.sqrt(mu)[None, :]
    sv = np.linalg.svd(N, compute_uv=False)
    assert abs(sv[0] - 1.0) <= 1e-10  # N is a contraction with top singular value 1
    assert abs(info.sigma2 - sv[1]) <= 1e-10
    assert abs(info.chi2_contraction - info.sigma2**2) <= TOL
    assert abs(info.chi2_mi - (np.sum(N**2) - 1.0)) <= 1e-10
    overlap = min(np.minimum(pi[a], pi[b]).sum() for a in range(S) for b in range(S))
    assert abs(info.dobrushin - (1.0 - overlap)) <= TOL
    assert abs(info.deviation_norm2 - np.sum((pi - mu) ** 2)) <= TOL
    assert abs(info.trace - np.trace(pi)) <= TOL
    assert info.gamma <= info.gamma_min_entry + TOL
    # σ₂² ≤ δ (Cohen et al. 1993); σ₂ alone may exceed δ (see test_dpi).
    assert info.chi2_contraction <= info.dobrushin + 1e-12
    assert info.dobrushin <= 1.0 - info.gamma_min_entry + TOL


@given(pi=chains(), seed=st.integers(0, 2**32 - 1))
@many(150)
def test_chi2_contraction_is_the_supremum_of_the_chi2_ratio(pi, seed):
    """``χ²(νπ‖μ)/χ²(ν‖μ) ≤ σ₂²`` for any ν, with equality at ``ν = μ + t D^{1/2} u``."""
    mu = pg.stationary_distribution(pi)
    eta = inf.chi2_contraction_coefficient(pi)
    K = inf.normalized_kernel(pi)

    def ratio(nu):
        return np.sum((nu @ pi - mu) ** 2 / mu) / np.sum((nu - mu) ** 2 / mu)

    rng = np.random.default_rng(seed)
    nu = rng.dirichlet(np.ones(len(mu)))
    if np.abs(nu - mu).max() > 1e-6:
        assert ratio(nu) <= eta + 1e-10
    u = np.linalg.svd(K)[0][:, 0]  # top left singular vector, orthogonal to √μ ...
    r = np.sqrt(mu)
    u = u - (u @ r) * r  # ... exactly so, also when K = 0 (rank-1 π: any u is "top", SVD may pick r)
    u /= np.linalg.norm(u)
    direction = r * u  # Σ direction = 0: ν stays a distribution
    t = 0.5 * mu.min() / np.abs(direction).max()  # keeps ν a distribution
    assert abs(ratio(mu + t * direction) - eta) <= 1e-9 * max(1.0, eta)


def test_information_rejects_bad_input():
    with pytest.raises(ValueError, match="mu"):
        inf.chi2_mutual_information(np.array([[1.0, 0.0], [0.5, 0.5]]))  # μ = (1, 0)
    with pytest.raises(ValueError, match="sums to"):
        inf.normalized_kernel(np.array([[0.5, 0.4], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="square"):
        inf.sigma2(np.ones((2, 3)) / 3)
    with pytest.raises(ValueError, match="position"):
        inf.pairwise_joint(pg.chain(4), np.full((2, 2), 0.5), 4, 0)
    reducible = pg.FinitePrior(np.array([[[1.0, 0.0], [0.5, 0.5]]]))
    with pytest.raises(ValueError, match="atom 0"):
        inf.idealized_gradient(pg.Task(pg.chain(4), reducible))
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 2, 0))
    with pytest.raises(ValueError, match="query_row"):
        inf.idealized_gradient(task, query_row="paper")
    with pytest.raises(ValueError, match=r"A1 must have shape \(T, T\)"):
        inf.idealized_grad_A1(task, np.zeros((3, 3)), 1e-3)
    with pytest.raises(ValueError, match="beta0"):
        inf.idealized_grad_A1(task, np.zeros((4, 4)), float("nan"))


# --------------------------------------------------- uniform mean, lazy π
@given(atoms=st.integers(2, 3).flatmap(lambda S: st.lists(chains(S, S), min_size=1, max_size=3)),
       T=st.integers(3, 40), seed=st.integers(0, 1000))
@many(60)
def test_diagonal_vanishes_in_expectation_under_uniform_mean(atoms, T, seed):
    """With ``E[π] = 11ᵀ/S``: ``g[i,i] = 0``, whole root rows 0, parent is the strict row maximum."""
    prior = uniform_mean_prior(np.stack(atoms))
    assert prior.diagnostics().uniform_mean
    graph = pg.random_tree(T, seed=seed, root_prob=0.3)
    task = pg.Task(graph, prior)
    g = inf.idealized_gradient(task)
    assert np.abs(np.diagonal(g)).max() <= TOL
    for i in graph.roots:
        assert np.abs(g[i]).max() <= TOL
    for i in graph.non_roots:
        p = graph.parents[i]
        others = np.delete(g[i, : i + 1], p)
        assert g[i, p] > others.max()


@pytest.mark.parametrize("S", [2, 3, 5])
def test_single_lazy_pi_has_diagonal_above_parent(S):
    """Expected, not a bug: for one lazy π, ``g[i,i] = tr π - 1 > ‖K‖² = g[i,p(i)]``.

    ``π = 0.9 I + 0.1·11ᵀ/S`` is symmetric with eigenvalues 1 and 0.9 (S-1 times):
    ``tr π - 1 = 0.9 (S-1) > 0.81 (S-1) = ‖K‖_F²``. The DPI says nothing about
    ``j = i``; only the expectation over a uniform-mean prior removes the diagonal.
    """
    pi = lazy_chain(S, 0.9)
    g = inf.idealized_gradient_single(pg.chain(6), pi)
    assert abs(g[3, 3] - 0.9 * (S - 1)) <= TOL
    assert abs(g[3, 2] - 0.81 * (S - 1)) <= TOL
    assert g[3, 3] > g[3, 2]


# ------------------------------------------------------- idealized_grad_A1
@given(task=small_tasks(max_sequences=10**6), seed=st.integers(0, 2**32 - 1),
       beta0=st.floats(1e-8, 1.0), scale=st.sampled_from([0.0, 0.1, 3.0]))
@many(80)
def test_idealized_grad_A1_is_minus_beta_J_g(task, seed, beta0, scale):
    T, S = task.T, task.S
    A1 = scale * np.random.default_rng(seed).normal(size=(T, T))
    out = inf.idealized_grad_A1(task, A1, beta0)
    g = inf.idealized_gradient(task)
    for i in range(T):
        z = A1[i, : i + 1] - A1[i, : i + 1].max()
        v = np.exp(z) / np.exp(z).sum()
        J = np.diag(v) - np.outer(v, v)
        expected = -(beta0 / (S * T)) * (J @ g[i, : i + 1])
        assert np.abs(out[i, : i + 1] - expected).max() <= 1e-15 + TOL * np.abs(expected).max()
    assert np.all(np.triu(out, 1) == 0.0)
    assert np.abs(out.sum(axis=1)).max() <= 1e-14 * max(1.0, np.abs(out).max())
    # a constant added to a row of A1, or junk above the diagonal, changes nothing
    shifted = A1 + np.arange(T)[:, None] + np.triu(np.full((T, T), 1e300), 1)
    assert np.allclose(inf.idealized_grad_A1(task, shifted, beta0), out, rtol=1e-12, atol=1e-300)


# ------------------------------------------------------------ assumptions
@given(task=small_tasks())
@many(30)
def test_assumptions_reuse_prior_diagnostics_and_graph(task):
    a = inf.assumptions(task)
    d = task.prior.diagnostics()
    assert (a.gamma, a.nondegeneracy, a.symmetric, a.uniform_mean) == (
        d.gamma, d.nondegeneracy, d.symmetric, d.uniform_mean)
    assert a.root_fraction == task.graph.root_fraction and a.t_eff == task.t_eff
    assert a.root_fraction_ok == (a.root_fraction <= 1 - a.gamma)
    assert a.gamma_all <= min(a.gamma, 1 - a.root_fraction) + TOL
    assert a.mu_min >= a.gamma / task.S - TOL  # min π ≥ γ/S implies μ ≥ γ/S
    assert a.dobrushin_max <= 1 - a.gamma + TOL
    assert "T_eff" in a.summary()


# ------------------------------------------------ against the exact engine
def _exact_dA1(task, beta0):
    T, S = task.T, task.S
    return pg.exact_loss_and_grad(task, np.zeros((T, T)), beta0 * np.eye(S)).dA1


def _cosine(a, b):
    return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("S, T", [(2, 5), (2, 9), (3, 5), (3, 8)])
def test_exact_and_idealized_agree_in_sign_on_parent_entries(S, T):
    beta0 = 1e-6
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 8, 0))
    exact = _exact_dA1(task, beta0)
    ideal = inf.idealized_grad_A1(task, np.zeros((T, T)), beta0)
    i = np.arange(1, T - 1)
    assert np.all(ideal[i, i - 1] < 0)  # descent raises the attention to the parent
    assert np.array_equal(np.sign(exact[i, i - 1]), np.sign(ideal[i, i - 1]))


@pytest.mark.parametrize("S, Ts", [(2, range(6, 13)), (3, range(6, 11))])
def test_exact_idealized_cosine_rises_with_T_on_the_chain(S, Ts):
    """Cosine of exact and idealized dA1 rises with T (from T = 6; see docs/gradient_alignment.md
    for the dip at T = 4..6)."""
    beta0 = 1e-6
    prior = pg.dirichlet_prior(S, 1.0, 8, 0)
    cos = []
    for T in Ts:
        task = pg.Task(pg.chain(T), prior)
        cos.append(_cosine(_exact_dA1(task, beta0), inf.idealized_grad_A1(task, np.zeros((T, T)), beta0)))
    assert np.all(np.diff(cos) > 0), cos
    assert cos[0] > 0.85


def test_chain_information_names_a_wrong_argument():
    # a Task (or text) where the matrix belongs used to surface as float()'s "not 'Task'"
    from popgrad._validation import ArgumentTypeError

    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 2, 0))
    for bad, needle in ((task, "got a Task"), ("abc", "of real numbers, got str"), ([[0.5, 0.5], [0.5, "x"]], "got list")):
        with pytest.raises(ArgumentTypeError, match=needle):
            inf.chain_information(bad)
