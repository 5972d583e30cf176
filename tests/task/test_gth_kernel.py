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
