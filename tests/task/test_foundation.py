"""Foundation invariants: graphs, priors, task enumeration and sampling."""
import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st
from scipy import stats

import popgrad as pg
from popgrad.task import sequence_weights_numpy

from ..strategies import graphs, parents_lists, priors, tasks, transition_matrices

TOL = 1e-12


# ----------------------------------------------------------------- graphs
def test_chain_parents():
    assert pg.chain(6).parents.tolist() == [-1, 0, 1, 2, 3, -1]
    assert pg.chain(2).parents.tolist() == [-1, -1]


def test_icl_pairs_parents():
    assert pg.icl_pairs(6).parents.tolist() == [-1, 0, -1, 2, -1, -1]
    assert pg.icl_pairs(7).parents.tolist() == [-1, 0, -1, 2, -1, 4, -1]


def test_random_tree_is_valid_and_seeded():
    g1 = pg.random_tree(30, seed=3, root_prob=0.2)
    g2 = pg.random_tree(30, seed=3, root_prob=0.2)
    assert g1 == g2
    p = g1.parents
    assert p[0] == -1 and p[-1] == -1
    assert all(p[i] < i for i in range(30))
    assert pg.random_tree(30, seed=0, root_prob=1.0).non_roots.size == 0
    assert pg.random_tree(30, seed=0, root_prob=0.0).roots.tolist() == [0, 29]


@pytest.mark.parametrize(
    "parents, t_eff, max_leaves",
    [
        ([-1, 0, 1, 2, -1], 5.0, 1),  # chain: one leaf per tree
        ([-1, 0, -1, 2, -1], 5.0, 1),  # icl pairs
        ([-1, 0, 0, 1, 1, -1], 2.0, 3),  # T=6, root 0 -> {1, 2}, 1 -> {3, 4}: leaves 2, 3, 4
        ([-1, -1, -1, -1], 4.0, 1),  # all isolated roots
        ([-1, 0, 0, 0, 0, -1], 1.5, 4),  # star
    ],
)
def test_t_eff_hand_checked(parents, t_eff, max_leaves):
    g = pg.CausalGraph(parents)
    assert g.max_leaves == max_leaves
    assert g.t_eff == pytest.approx(t_eff, abs=0)


def test_trees_and_leaves():
    g = pg.CausalGraph([-1, 0, 0, -1, 1, -1])
    trees = g.trees()
    assert [t.root for t in trees] == [0, 3, 5]
    assert trees[0].nodes == (0, 1, 2, 4) and trees[0].leaves == (2, 4)
    assert trees[1].leaves == (3,) and trees[2].leaves == (5,)


def test_lowest_common_ancestor():
    g = pg.CausalGraph([-1, 0, 0, 1, 1, -1, -1])
    assert g.lowest_common_ancestor(3, 4) == (1, 1, 1)
    assert g.lowest_common_ancestor(3, 2) == (0, 2, 1)
    assert g.lowest_common_ancestor(3, 1) == (1, 1, 0)
    assert g.lowest_common_ancestor(4, 4) == (4, 0, 0)
    assert g.lowest_common_ancestor(3, 5) is None


def test_adjacency():
    g = pg.CausalGraph([-1, 0, 0, -1])
    adj = g.adjacency()
    expected = np.zeros((4, 4))
    expected[1, 0] = expected[2, 0] = 1
    np.testing.assert_array_equal(adj, expected)


@given(parents_lists(2, 12))
def test_graph_text_round_trip(parents):
    g = pg.CausalGraph(parents)
    assert pg.CausalGraph.from_string(g.to_string()) == g
    assert g.parents.tolist() == parents


@pytest.mark.parametrize(
    "parents, match",
    [
        ([-1, 0, 2, -1], r"parents\[2\] = 2 must be < 2"),
        ([-1, 0, 1, 0], r"parents\[3\] = 0 must be -1: the last position is the query"),
        ([-1, -2, -1], r"parents\[1\] = -2 is invalid"),
        ([-1], r"length T >= 2"),
        ([[-1, -1]], r"1-D"),
        ([-1, 0.5, -1], r"integers"),
        (["a", "b"], r"integers"),
    ],
)
def test_bad_parents_raise(parents, match):
    with pytest.raises(ValueError, match=match):
        pg.CausalGraph(parents)


@pytest.mark.parametrize("text", ["-1,x,-1", "", "1;2"])
def test_bad_graph_text_raises(text):
    with pytest.raises(ValueError, match="comma-separated integers"):
        pg.CausalGraph.from_string(text)


@pytest.mark.parametrize("builder", [pg.chain, pg.icl_pairs])
@pytest.mark.parametrize("T", [1, 0, -3, 2.5, True])
def test_builders_reject_bad_T(builder, T):
    with pytest.raises(ValueError, match="T must be"):
        builder(T)


def test_graph_is_immutable():
    g = pg.chain(4)
    with pytest.raises(ValueError):
        g.parents[1] = -1


# ----------------------------------------------------------------- priors
@given(st.integers(2, 6), st.integers(0, 2**32 - 1), st.sampled_from([0.05, 0.2, 1.0, 10.0]))
def test_stationary_is_stationary_and_nonnegative(S, seed, alpha):
    pi = np.random.default_rng(seed).dirichlet(np.full(S, alpha), size=S)
    pi /= pi.sum(axis=1, keepdims=True)
    mu = pg.stationary_distribution(pi)
    assert np.all(mu >= 0)
    assert abs(mu.sum() - 1) <= TOL
    np.testing.assert_allclose(mu @ pi, mu, rtol=0, atol=TOL)


def test_stationary_nearly_reducible_dirichlet_005():
    prior = pg.dirichlet_prior(4, 0.05, 50, seed=1, symmetrize=False)
    mu = prior.stationary
    assert np.all(mu >= 0)
    np.testing.assert_allclose(np.einsum("ka,kab->kb", mu, prior.atoms), mu, rtol=0, atol=TOL)
    np.testing.assert_allclose(mu.sum(axis=1), 1.0, rtol=0, atol=TOL)


def test_stationary_of_reducible_chain_is_a_stationary_vector():
    pi = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    mu = pg.stationary_distribution(pi)
    assert np.all(mu >= 0)
    np.testing.assert_allclose(mu @ pi, mu, atol=TOL)


def test_dirichlet_prior_seeded_and_symmetrized():
    a = pg.dirichlet_prior(3, 0.7, 5, seed=11)
    b = pg.dirichlet_prior(3, 0.7, 5, seed=11)
    np.testing.assert_array_equal(a.atoms, b.atoms)
    assert a.K == 5 * 6
    assert a.is_relabeling_closed()
    assert not pg.dirichlet_prior(3, 0.7, 5, seed=11, symmetrize=False).is_relabeling_closed()
    np.testing.assert_allclose(a.weights.sum(), 1.0, atol=TOL)


@given(priors(symmetrize=True))
def test_relabel_closure_is_closed(prior):
    assert prior.is_relabeling_closed()
    d = prior.diagnostics()
    assert d.symmetric is True
    # a closed prior has E[pi] invariant under relabeling: constant diagonal and off-diagonal
    m = prior.mean()
    S = prior.S
    off = m[~np.eye(S, dtype=bool)]
    np.testing.assert_allclose(np.diag(m), np.diag(m)[0], atol=1e-12)
    np.testing.assert_allclose(off, off[0], atol=1e-12)


def test_uniform_mean_diagnostic():
    S = 3
    lazy = np.full((S, S), 0.1) + 0.7 * np.eye(S)
    anti = (np.ones((S, S)) - np.eye(S)) / (S - 1)
    # mix so that E[pi] = 11^T/S: t*lazy_diag + (1-t)*0 = 1/S -> t = (1/S)/0.8
    t = (1 / S) / 0.8
    prior = pg.FinitePrior(np.stack([lazy, anti]), [t, 1 - t])
    d = prior.diagnostics()
    assert d.uniform_mean and d.uniform_mean_error <= 1e-12
    assert d.gamma == pytest.approx(0.0)
    assert not pg.FinitePrior(lazy).diagnostics().uniform_mean


def test_gamma_and_nondegeneracy():
    S = 3
    pi = np.full((S, S), 0.2) + 0.4 * np.eye(S)
    d = pg.FinitePrior(pi).diagnostics()
    assert d.gamma == pytest.approx(0.6)
    # mu uniform: sum_a ||pi(.|a) - mu||^2 = S * ((0.6-1/3)^2 + 2 (0.2-1/3)^2)
    assert d.nondegeneracy == pytest.approx(S * ((0.6 - 1 / 3) ** 2 + 2 * (0.2 - 1 / 3) ** 2))
    assert d.nondegenerate
    assert "gamma" in d.summary()


@pytest.mark.parametrize(
    "atoms, weights, match",
    [
        (np.ones((2, 3)), None, r"shape \(K, S, S\)"),
        (np.array([[0.5, 0.6], [0.5, 0.5]]), None, r"row 0 of atoms\[0\] sums to"),
        (np.array([[1.5, -0.5], [0.5, 0.5]]), None, r"atoms\[0\]\[0, 1\] = -0.5 is negative"),
        (np.array([[np.nan, 1.0], [0.5, 0.5]]), None, "non-finite"),
        (np.array([[1.0]]), None, "S >= 2"),
        (np.eye(2)[None].repeat(2, 0), [0.5, 0.6], "weights sum to"),
        (np.eye(2)[None].repeat(2, 0), [1.0], r"weights must have shape \(2,\)"),
        (np.eye(2)[None].repeat(2, 0), [1.5, -0.5], "non-negative"),
    ],
)
def test_bad_priors_raise(atoms, weights, match):
    with pytest.raises(ValueError, match=match):
        pg.FinitePrior(atoms, weights)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(S=1, alpha=1.0, n_atoms=2, seed=0), "S must be an integer >= 2"),
        (dict(S=3, alpha=-1.0, n_atoms=2, seed=0), "alpha must be a positive"),
        (dict(S=3, alpha=float("nan"), n_atoms=2, seed=0), "alpha must be a positive"),
        (dict(S=3, alpha="x", n_atoms=2, seed=0), "alpha must be a positive"),
        (dict(S=3, alpha=1.0, n_atoms=0, seed=0), "n_atoms must be"),
    ],
)
def test_bad_dirichlet_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pg.dirichlet_prior(**kwargs)


# ------------------------------------------------------------------- task
@given(tasks())
def test_weights_sum_to_one(task):
    total = sum(w.sum() for _, w in task.enumerate(chunk_size=997))
    assert abs(total - 1.0) <= TOL


@given(tasks(max_sequences=3000))
def test_kernel_weights_match_numpy_reference(task):
    seqs, w = task.all_sequences()
    ref = sequence_weights_numpy(seqs, *task.kernel_arrays())
    np.testing.assert_allclose(w, ref, rtol=TOL, atol=0)
    assert np.all(w >= 0)


@given(tasks(max_sequences=3000))
def test_enumeration_order_is_lexicographic_and_chunking_invariant(task):
    seqs, w = task.all_sequences()
    expected = np.array(list(itertools.product(range(task.S), repeat=task.T)))
    np.testing.assert_array_equal(seqs, expected)
    chunks = list(task.enumerate(chunk_size=7))
    np.testing.assert_array_equal(np.concatenate([c[0] for c in chunks]), seqs)
    np.testing.assert_array_equal(np.concatenate([c[1] for c in chunks]), w)
    assert max(len(c[0]) for c in chunks) <= 7


@given(graphs(2, 7), st.integers(2, 3), st.data())
def test_marginals_stationary_and_query_uniform(graph, S, data):
    """Under one atom, every non-query position has marginal mu; the query is uniform."""
    pi = data.draw(transition_matrices(S))
    task = pg.Task(graph, pg.FinitePrior(pi))
    mu = task.prior.stationary[0]
    seqs, w = task.all_sequences()
    p_seq = w.sum(axis=1)
    for i in range(task.T):
        marginal = np.bincount(seqs[:, i], weights=p_seq, minlength=S)
        expected = np.full(S, 1.0 / S) if i == task.T - 1 else mu
        np.testing.assert_allclose(marginal, expected, rtol=0, atol=1e-12)
    # the target given the query is pi(. | q)
    for q in range(S):
        sel = seqs[:, -1] == q
        np.testing.assert_allclose(w[sel].sum(axis=0) * S, pi[q], atol=1e-12)


def test_size_guard_message():
    task = pg.Task(pg.chain(12), pg.dirichlet_prior(3, 1.0, 1, 0), max_sequences=1000)
    with pytest.raises(pg.TaskTooLargeError) as info:
        next(task.enumerate())
    msg = str(info.value)
    for needle in ["3**12", "531,441", "max_sequences", "smaller S or T", "idealized gradient", "s per exact"]:
        assert needle in msg
    # constructing a huge task is fine; only enumeration is guarded
    big = pg.Task(pg.chain(1000), pg.dirichlet_prior(3, 1.0, 1, 0))
    assert big.n_sequences == 3**1000
    with pytest.raises(pg.TaskTooLargeError):
        big.check_size()


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_chunk_size(bad):
    task = pg.Task(pg.chain(3), pg.dirichlet_prior(2, 1.0, 1, 0))
    with pytest.raises(ValueError, match="chunk_size"):
        next(task.enumerate(chunk_size=bad))


def test_task_rejects_wrong_types():
    with pytest.raises(ValueError, match="graph must be"):
        pg.Task([-1, -1], pg.dirichlet_prior(2, 1.0, 1, 0))
    with pytest.raises(ValueError, match="prior must be"):
        pg.Task(pg.chain(3), np.eye(2))


def test_sampler_matches_exact_weights_chi_square():
    task = pg.Task(pg.CausalGraph([-1, 0, 0, -1]), pg.dirichlet_prior(2, 0.8, 3, seed=5))
    seqs, w = task.all_sequences()
    expected = w.sum(axis=1)
    n = 200_000
    sample = task.sample(n, seed=123)
    idx = (sample.seqs * task.S ** np.arange(task.T - 1, -1, -1)).sum(axis=1)
    counts = np.bincount(idx, minlength=task.n_sequences)
    chi2 = stats.chisquare(counts, n * expected)
    assert chi2.pvalue > 1e-3
    # soft labels are the atoms' rows at the query
    np.testing.assert_array_equal(sample.targets, task.prior.atoms[sample.atoms, sample.seqs[:, -1]])
    # the joint weight of (s, c) equals E[target_c ; s]
    tw = np.zeros_like(w)
    np.add.at(tw, idx, sample.targets)
    np.testing.assert_allclose(tw / n, w, atol=5e-3)


def test_sampler_seeded():
    task = pg.Task(pg.chain(5), pg.dirichlet_prior(3, 1.0, 2, 0))
    a, b = task.sample(100, seed=7), task.sample(100, seed=7)
    np.testing.assert_array_equal(a.seqs, b.seqs)
    with pytest.raises(ValueError, match="n must be"):
        task.sample(0, seed=1)


def test_summary_mentions_everything():
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 2, 0))
    s = task.summary()
    for needle in ["S=2", "T=4", "S**T=16", "T_eff", "gamma", "relabeling-symmetric"]:
        assert needle in s


def test_size_guard_message_for_astronomical_sizes():
    big = pg.Task(pg.chain(1000), pg.dirichlet_prior(3, 1.0, 1, 0))
    with pytest.raises(pg.TaskTooLargeError, match=r"3\*\*1000 = about 10\^477"):
        big.check_size()


@pytest.mark.parametrize("S", [2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_uniform_mean_reweighting(S, seed):
    prior = pg.dirichlet_prior(S, 1.0, 8, seed=seed, uniform_mean=True)
    d = prior.diagnostics()
    assert d.uniform_mean and d.uniform_mean_error <= 1e-12
    assert prior.is_relabeling_closed()
    plain = pg.dirichlet_prior(S, 1.0, 8, seed=seed)
    np.testing.assert_array_equal(prior.atoms, plain.atoms)  # same draws, new weights only


def test_uniform_mean_needs_both_sides_and_symmetry():
    with pytest.raises(ValueError, match="needs symmetrize=True"):
        pg.dirichlet_prior(3, 1.0, 4, seed=0, symmetrize=False, uniform_mean=True)
    with pytest.raises(ValueError, match="every draw has trace"):
        pg.dirichlet_prior(3, 0.05, 1, seed=0, uniform_mean=True)


def test_large_relabeling_closure_is_implicit_and_refused_only_when_materialized():
    """dirichlet_prior(S=9, symmetrize=True) stores its 2 draws; the 2 * 9! atoms are refused on use, by size."""
    prior = pg.dirichlet_prior(S=9, alpha=1.0, n_atoms=2, seed=0)
    assert prior.implicit_closure and prior.K == 2 * 362880 and prior.is_relabeling_closed()
    assert prior.base.K == 2
    with pytest.raises(ValueError, match="relabelings would create"):
        prior.atoms
    small = pg.dirichlet_prior(S=3, alpha=1.0, n_atoms=2, seed=0)
    atoms, weights = pg.relabel_closure(small.base.atoms, small.base.weights)
    assert np.array_equal(small.atoms, atoms) and np.array_equal(small.weights, weights)
    np.testing.assert_allclose(small.mean(), np.einsum("k,kab->ab", weights, atoms), rtol=0, atol=1e-15)
