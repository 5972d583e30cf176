"""The sampler's stationary distributions: the numba GTH kernel gives the NumPy reference's bits."""
import numpy as np
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.task import dirichlet as D


@given(st.integers(2, 12), st.sampled_from([0.01, 0.1, 1.0, 10.0]), st.integers(0, 2**32 - 1))
@settings(max_examples=30, deadline=None)
def test_gth_kernel_is_bit_identical_to_the_numpy_reference(S, alpha, seed):
    pis = pg.DirichletPrior(S, alpha).draw(64, np.random.default_rng(seed))
    x = D._gth_batch(pis)
    np.testing.assert_array_equal(x, D._gth_batch_numpy(pis))
    np.testing.assert_allclose(np.einsum("ni,nij->nj", x, pis), x, atol=1e-12)  # stationary
    np.testing.assert_allclose(x.sum(axis=1), 1.0, rtol=1e-14)


def test_gth_kernel_reducible_chains_go_to_the_per_matrix_solver():
    pis = pg.DirichletPrior(3, 1.0).draw(3, np.random.default_rng(0))
    pis[1] = [[1.0, 0.0, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]  # a zero pivot at k = 0
    np.testing.assert_array_equal(D._gth_batch(pis), D._gth_batch_numpy(pis))
    np.testing.assert_allclose(D._gth_batch(pis)[1], [1.0, 0.0, 0.0], atol=1e-15)


def test_sample_of_the_continuous_prior_is_unchanged_by_the_kernel(monkeypatch):
    task = pg.Task(pg.chain(6), pg.DirichletPrior(4, 0.1))
    new = task.sample(200, 3)
    monkeypatch.setattr(D, "_gth_batch", D._gth_batch_numpy)
    old = task.sample(200, 3)
    np.testing.assert_array_equal(new.seqs, old.seqs)
    np.testing.assert_array_equal(new.targets, old.targets)


def _sample_numpy(task, n, seed):
    """The NumPy loop :meth:`Task.sample` ran for a continuous prior before its numba kernels (reference)."""
    rng = np.random.default_rng(seed)
    prior, S, T = task.prior, task.S, task.T
    parents = task.graph.parents
    g = rng.standard_gamma(prior.alpha, size=(n, S, S))
    pis = g / g.sum(axis=2, keepdims=True)
    rows = np.arange(n)
    if prior.roots == "stationary":
        mu_cdf = np.cumsum(D._gth_batch_numpy(pis), axis=1)
    else:
        mu_cdf = np.broadcast_to(np.arange(1, S + 1) / S, (n, S))
    pi_cdf = np.cumsum(pis, axis=2)
    seqs = np.empty((n, T), dtype=np.int64)
    for i in range(T - 1):
        u = rng.random(n)[:, None]
        cdf = mu_cdf if parents[i] < 0 else pi_cdf[rows, seqs[:, parents[i]]]
        seqs[:, i] = np.minimum((u >= cdf).sum(axis=1), S - 1)
    seqs[:, T - 1] = rng.integers(0, S, size=n)
    return seqs, pis[rows, seqs[:, T - 1]]


@given(st.integers(2, 12), st.integers(2, 9), st.sampled_from([0.01, 0.1, 1.0]),
       st.sampled_from(["stationary", "uniform"]), st.sampled_from(["chain", "tree"]), st.integers(0, 2**32 - 1))
@settings(max_examples=25, deadline=None)
def test_continuous_sample_is_the_numpy_loops_sample_bit_for_bit(S, T, alpha, roots, graph, seed):
    g = pg.chain(T) if graph == "chain" else pg.random_tree(T, seed % 1000, root_prob=0.3)
    task = pg.Task(g, pg.DirichletPrior(S, alpha, roots=roots))
    b = task.sample(50, seed)
    seqs, y = _sample_numpy(task, 50, seed)
    np.testing.assert_array_equal(b.seqs, seqs)
    np.testing.assert_array_equal(b.targets, y)


def test_dirichlet_draw_normalization_is_numpys():
    for S, k in ((3, 1), (9, 1), (17, 1), (3, 2)):
        prior = pg.DirichletPrior(S, 0.1) if k == 1 else pg.DirichletTensorPrior(S, k, 0.1)
        rng = np.random.default_rng(S)
        g = rng.standard_gamma(0.1, size=(40, S**k, S))
        np.testing.assert_array_equal(prior.draw(40, np.random.default_rng(S)), g / g.sum(axis=2, keepdims=True))
