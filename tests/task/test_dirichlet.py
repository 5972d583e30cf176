"""The official continuous prior (DESIGN §20): exact weights, sampling, graph generators."""
import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import betaln, gammaln, hyp1f1

import popgrad as pg
from popgrad.task import dirichlet as D
from popgrad.task.priors import stationary_distribution


def _closed_form(task):
    """w(s, c) for uniform roots, one (s, c) at a time with math.lgamma (single-parent or k-parent)."""
    S, T, a = task.S, task.T, task.prior.alpha
    multi = isinstance(task, pg.MultiParentTask)
    out = np.empty((S**T, S))
    for m, s in enumerate(itertools.product(range(S), repeat=T)):
        for c in range(S):
            counts = {}
            n_roots = 0
            if multi:
                par = task.graph.parents
                for i in range(T):
                    if par[i, 0] < 0:
                        n_roots += 1
                    else:
                        row = tuple(s[j] for j in par[i])
                        counts.setdefault(row, [0] * S)[s[i]] += 1
                row = tuple(s[j] for j in task.graph.target_parents)
            else:
                par = task.graph.parents
                n_roots = 1  # the query
                for i in range(T - 1):
                    if par[i] < 0:
                        n_roots += 1
                    else:
                        counts.setdefault(s[par[i]], [0] * S)[s[i]] += 1
                row = s[T - 1]
            counts.setdefault(row, [0] * S)[c] += 1
            lw = -n_roots * math.log(S)
            for v in counts.values():
                lw += sum(math.lgamma(a + x) - math.lgamma(a) for x in v)
                lw -= math.lgamma(S * a + sum(v)) - math.lgamma(S * a)
            out[m, c] = math.exp(lw)
    return out


def _likelihood(task, pi):
    """P(s, c | π) for every (s, c): the generative process of the task at one π (stationary or uniform roots)."""
    S, T = task.S, task.T
    par = task.graph.parents
    mu = stationary_distribution(pi) if task.prior.roots == "stationary" else np.full(S, 1.0 / S)
    out = np.empty((S**T, S))
    for m, s in enumerate(itertools.product(range(S), repeat=T)):
        p = 1.0 / S
        for i in range(T - 1):
            p *= mu[s[i]] if par[i] < 0 else pi[s[par[i]], s[i]]
        out[m] = p * pi[s[T - 1]]
    return out


@pytest.mark.parametrize("S,graph", [(2, pg.random_tree(5, 3, 0.5)), (3, pg.chain(4))])
def test_uniform_roots_equal_closed_form(S, graph):
    task = pg.Task(graph, pg.DirichletPrior(S, 0.1, roots="uniform"))
    w = task.weight_table()
    assert task.weight_accuracy.exact
    np.testing.assert_allclose(w, _closed_form(task), rtol=1e-13, atol=0)
    assert abs(w.sum() - 1.0) < 1e-13


def test_tensor_prior_equals_closed_form():
    task = pg.MultiParentTask(pg.two_parent(5), pg.DirichletTensorPrior(2, 2, 0.3))
    w = task.weight_table()
    np.testing.assert_allclose(w, _closed_form(task), rtol=1e-13, atol=0)
    assert abs(w.sum() - 1.0) < 1e-13


@pytest.mark.parametrize("roots", ["uniform", "stationary"])
def test_weights_match_monte_carlo_over_pi(roots):
    """w(s, c) = E_π[P(s, c | π)]: a seeded z-test against the average over 4000 draws of π."""
    task = pg.Task(pg.random_tree(4, 1, 0.5), pg.DirichletPrior(2, 0.5, roots=roots))
    rng = np.random.default_rng(7)
    draws = np.stack([_likelihood(task, pi) for pi in task.prior.draw(4000, rng)[:, :, :]])
    mean, se = draws.mean(axis=0), draws.std(axis=0, ddof=1) / math.sqrt(len(draws))
    z = (mean - task.weight_table()) / se
    assert np.abs(z).max() < 4.5, np.abs(z).max()


def _kummer(n, r, a):
    """Independent S = 2 reference: the Laplace/Kummer one-dimensional integral (DESIGN §20), adaptive quad."""
    (n00, n01), (n10, n11) = n
    r0, r1 = r
    R = r0 + r1
    a1, b1, a2, b2 = a + n01 + r1, a + n00, a + n10 + r0, a + n11
    c = betaln(a1, b1) + betaln(a2, b2) - 2 * betaln(a, a) - gammaln(R)

    def f(t):
        return t ** (R - 1) * hyp1f1(a1, a1 + b1, -t) * hyp1f1(a2, a2 + b2, -t)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v1 = integrate.quad(f, 0, 1, epsabs=0, epsrel=1e-13, limit=200)[0]
        v2 = integrate.quad(lambda x: f(1 / x) / x**2 if x > 0 else 0.0, 0, 1, epsabs=0, epsrel=1e-13, limit=500)[0]
    return (v1 + v2) * math.exp(c)


def test_stationary_s2_matches_adaptive_quadrature():
    task = pg.Task(pg.random_tree(5, 2, 0.5), pg.DirichletPrior(2, 0.1))
    w = task.weight_table()
    acc = task.weight_accuracy
    assert not acc.exact and acc.bound <= 1e-10
    S, T = 2, task.T
    par = task.graph.parents
    rng = np.random.default_rng(0)
    for m in rng.choice(S**T, size=6, replace=False):
        s = np.array(list(itertools.product(range(S), repeat=T))[m])
        for c in range(S):
            n = np.zeros((2, 2), dtype=int)
            r = np.zeros(2, dtype=int)
            for i in range(T - 1):
                if par[i] < 0:
                    r[s[i]] += 1
                else:
                    n[s[par[i]], s[i]] += 1
            n[s[T - 1], c] += 1
            ref = _kummer(n, r, 0.1) / S
            assert abs(w[m, c] / ref - 1.0) <= 1e-10, (m, c, w[m, c], ref)
    assert abs(w.sum() - 1.0) < 1e-10


def test_stationary_s3_monte_carlo_weights():
    """S >= 3 stationary roots: seeded Monte-Carlo weights (a relabeling-closed finite prior), their standard
    error reported, and an independent average over other draws of π agrees within the two errors."""
    task = pg.Task(pg.chain(3), pg.DirichletPrior(3, 0.5))
    w = task.weight_table()
    assert abs(w.sum() - 1.0) < 1e-12
    acc = task.weight_accuracy
    assert not acc.exact and acc.statistical and 0.0 < acc.bound < 0.05
    assert "standard error" in task.summary()
    np.testing.assert_array_equal(pg.Task(pg.chain(3), pg.DirichletPrior(3, 0.5)).weight_table(), w)  # seeded
    draws = np.stack([_likelihood(task, pi) for pi in task.prior.draw(3000, np.random.default_rng(5))])
    mean, se = draws.mean(axis=0), draws.std(axis=0, ddof=1) / math.sqrt(len(draws))
    assert np.all(np.abs(mean - w) < 5 * np.sqrt(se**2 + (acc.bound * w) ** 2))


@pytest.mark.parametrize("roots", ["uniform", "stationary"])
def test_sample_agrees_with_weights(roots):
    """Seeded chi-square on the sequences and a z-test on the soft labels."""
    task = pg.Task(pg.random_tree(4, 1, 0.5), pg.DirichletPrior(2, 0.3, roots=roots))
    n = 40_000
    smp = task.sample(n, seed=11)
    np.testing.assert_array_equal(smp.seqs, task.sample(n, seed=11).seqs)  # deterministic for a seed
    w = task.weight_table()
    idx = smp.seqs @ (2 ** np.arange(task.T - 1, -1, -1))
    counts = np.bincount(idx, minlength=2**task.T)
    assert stats.chisquare(counts, w.sum(axis=1) * n).pvalue > 1e-4
    # E[y_c [s_m = s]] = w(s, c)
    Y = np.zeros_like(w)
    np.add.at(Y, idx, smp.targets)
    Y2 = np.zeros_like(w)
    np.add.at(Y2, idx, smp.targets**2)
    se = np.sqrt(np.maximum(Y2 / n - (Y / n) ** 2, 1e-300) / n)
    assert np.abs((Y / n - w) / se).max() < 4.5
    np.testing.assert_allclose(smp.targets.sum(axis=1), 1.0, rtol=1e-12)


def test_multi_sample_agrees_with_weights():
    task = pg.MultiParentTask(pg.two_parent(4), pg.DirichletTensorPrior(2, 2, 0.3))
    n = 40_000
    smp = task.sample(n, seed=3)
    idx = smp.seqs @ (2 ** np.arange(task.T - 1, -1, -1))
    counts = np.bincount(idx, minlength=2**task.T)
    assert stats.chisquare(counts, task.weight_table().sum(axis=1) * n).pvalue > 1e-4


def test_errors_one_line():
    with pytest.raises(ValueError, match="roots must be"):
        pg.DirichletPrior(3, 0.1, roots="mu")
    with pytest.raises(ValueError, match="alpha"):
        pg.DirichletPrior(3, -1.0)
    with pytest.raises(TypeError, match="S must be an integer"):
        pg.DirichletPrior(2.5, 0.1)
    task = pg.Task(pg.chain(3), pg.DirichletPrior(2, 0.1))
    with pytest.raises(ValueError, match="continuous"):
        task.kernel_arrays()
    with pytest.raises(ValueError, match="roots uniformly"):
        pg.MultiParentTask(pg.two_parent(4).__class__.from_single(pg.chain(4)), pg.DirichletPrior(2, 0.1))
    with pytest.raises(ValueError, match="no atoms|has none"):
        pg.exact_loss_and_grad(task, np.zeros((3, 3)), np.eye(2), engine="prefix")


def test_task_api():
    p = pg.DirichletPrior(3, 0.1)
    t1, t2 = pg.Task(pg.chain(4), p), pg.Task(pg.chain(4), pg.DirichletPrior(3, 0.1))
    assert t1.fingerprint == t2.fingerprint
    assert t1.fingerprint != pg.Task(pg.chain(4), pg.DirichletPrior(3, 0.1, roots="uniform")).fingerprint
    assert t1.continuous and t1.prior.K is None
    d = p.diagnostics()
    assert d.gamma == 0.0 and d.symmetric and d.uniform_mean
    seqs, w = next(iter(pg.Task(pg.chain(3), pg.DirichletPrior(2, 0.1, "uniform")).enumerate(chunk_size=3)))
    assert seqs.shape == (3, 3) and w.shape == (3, 2)
    # MultiParentTask takes a uniform-roots DirichletPrior as k = 1
    mt = pg.MultiParentTask(pg.chain(4), pg.DirichletPrior(2, 0.2, roots="uniform"))
    st = pg.Task(pg.chain(4), pg.DirichletPrior(2, 0.2, roots="uniform"))
    np.testing.assert_allclose(mt.weight_table(), st.weight_table(), rtol=1e-13)


# ---------------------------------------------------------------- graph generators
def test_official_random_tree_distribution():
    """single_parent.py's random: parent of i uniform over {none, 0, …, i-1} (counts over seeds, chi-square)."""
    T, n = 7, 3000
    counts = np.zeros((T - 1, T))
    for seed in range(n):
        par = pg.official_random_tree(T, seed).parents
        assert par[T - 1] == -1 and par[0] == -1
        for i in range(1, T - 1):
            counts[i, par[i] + 1] += 1
    for i in range(1, T - 1):
        assert stats.chisquare(counts[i, : i + 1]).pvalue > 1e-4


def test_random_tree_half_is_figure9_generator():
    """many_graphs.ipynb's get_random_DAG(p=0.5): a root w.p. 1/2, else a parent uniform over 0 … i-1."""
    T, n = 7, 3000
    counts = np.zeros((T - 1, T))
    for seed in range(n):
        par = pg.random_tree(T, seed, root_prob=0.5).parents
        for i in range(1, T - 1):
            counts[i, par[i] + 1] += 1
    for i in range(1, T - 1):
        expect = np.concatenate([[0.5], np.full(i, 0.5 / i)]) * n
        assert stats.chisquare(counts[i, : i + 1], expect).pvalue > 1e-4


# ---------------------------------------------------------------- official references
@pytest.mark.parametrize("task", [
    pg.Task(pg.random_tree(5, 2, 0.5), pg.DirichletPrior(3, 0.1, roots="uniform")),
    pg.MultiParentTask(pg.two_parent(5), pg.DirichletTensorPrior(2, 2, 0.3)),
], ids=["single-uniform", "two-parent"])
def test_official_bayes_equals_bayes_under_uniform_roots(task):
    assert abs(pg.official_bayes_loss(task) - pg.bayes_loss(task)) < 1e-13


def test_official_bayes_above_bayes_under_stationary_roots():
    task = pg.Task(pg.chain(5), pg.DirichletPrior(2, 0.1))
    assert pg.official_bayes_loss(task) > pg.bayes_loss(task) + 1e-6


def test_official_bayes_root_quirk():
    """InContextTree.bayes: a root counts as a child of position T-2 when s_{T-2} equals the query."""
    g = pg.CausalGraph([-1, 0, -1, 2, -1])  # T = 5, context 0..3, root 2
    seqs = np.array([[0, 1, 1, 0, 0], [0, 1, 1, 1, 0]])
    plain = pg.official_bayes_predict(g, seqs, 2, 1.0)
    quirk = pg.official_bayes_predict(g, seqs, 2, 1.0, root_quirk=True)
    # query 0: edges with parent 0: (0->1) at i=1, (1->0)? parent of 3 is 2 (token 1): no. -> n[0] = (0, 1)
    np.testing.assert_allclose(plain[0], [1 / 3, 2 / 3])
    # s_{T-2} = s_3 = 0 = query: roots 0 (token 0) and 2 (token 1) count -> n[0] = (1, 2)
    np.testing.assert_allclose(quirk[0], [2 / 5, 3 / 5])
    np.testing.assert_allclose(quirk[1], plain[1])  # s_3 = 1 != query


def test_optimal_loss_continuous():
    from scipy.special import digamma

    rng = np.random.default_rng(0)
    task = pg.Task(pg.chain(4), pg.DirichletPrior(3, 0.2))
    pis = task.prior.draw(200_000, rng)
    mc = -np.mean(np.sum(pis * np.log(np.where(pis > 0, pis, 1.0)), axis=2))
    assert abs(pg.optimal_loss(task) - mc) < 5e-3
    assert pg.optimal_loss(task) < pg.bayes_loss(task)
