"""The gradient-noise engine on the weight table (DESIGN §20, issue 28).

Named invariants:
* on a continuous prior the kernels equal gradient_noise_numpy fed the same tables (1e-12), the mean is the
  exact gradient, stage1_row_noise equals gradient_noise's row_cov;
* the second-moment table: symmetric, rows sum to the weight table (Σ_c' Y2[c, c'] = w(s, c)), under uniform
  roots equal to the Dirichlet-multinomial formula with two label edges evaluated term by term with lgamma,
  and the same bits whatever the chunk;
* an independent check of Y2: the Monte-Carlo covariance of per-sample gradients drawn by task.sample
  (a fresh pi per sequence) agrees with the exact covariance;
* on a finite prior the table path equals the per-atom path (1e-13); options, blocks and thread count
  change rounding only.
"""
import math

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import popgrad as pg
from popgrad.engine import table as _table
from popgrad.engine.noise import flatten_grad, gradient_noise_numpy, stage1_row_noise
from popgrad.engine.single import rows_loss_and_grad
from popgrad.task.tasks import decode_sequences

from ..strategies import tasks

CONTINUOUS = [
    pg.Task(pg.random_tree(5, 4, 0.5), pg.DirichletPrior(2, 0.1, "uniform")),
    pg.Task(pg.random_tree(5, 3, 0.5), pg.DirichletPrior(2, 0.3, "stationary")),
    pg.Task(pg.random_tree(4, 4, 0.5), pg.DirichletPrior(3, 0.1, "stationary")),
    pg.MultiParentTask(pg.two_parent(5), pg.DirichletTensorPrior(2, 2, 0.1)),
]
IDS = ["uniform", "stationary-S2", "stationary-S3", "two-parent"]


def _params(task, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    T, S = task.T, task.S
    if isinstance(task, pg.MultiParentTask):
        return scale * rng.normal(size=(task.k, T, T)), scale * rng.normal(size=(task.k, S, S))
    return scale * rng.normal(size=(T, T)), scale * rng.normal(size=(S, S))


@pytest.mark.parametrize("task", CONTINUOUS, ids=IDS)
def test_continuous_kernels_equal_the_reference(task):
    A1, A2 = _params(task, 1)
    gn = pg.gradient_noise(task, A1, A2)
    ref = gradient_noise_numpy(task, A1, A2, chunk=7)
    scale = max(1.0, np.abs(ref.cov).max())
    assert np.abs(gn.cov - ref.cov).max() <= 1e-12 * scale
    assert abs(gn.loss_var - ref.loss_var) <= 1e-12 * max(1.0, ref.loss_var)
    assert np.abs(gn.row_cov - ref.row_cov).max() <= 1e-12 * scale
    ex = pg.exact_loss_and_grad(task, A1, A2)
    assert abs(gn.mean.loss - ex.loss) <= 1e-12
    assert np.abs(gn.mean.dA1 - ex.dA1).max() <= 1e-12 and np.abs(gn.mean.dA2 - ex.dA2).max() <= 1e-12
    assert np.linalg.eigvalsh(gn.cov).min() >= -1e-12 * scale
    if isinstance(task, pg.Task):
        rows = stage1_row_noise(task, A1, A2)
        assert np.abs(rows.row_cov - gn.row_cov).max() <= 1e-12 * scale
        assert np.abs(rows.dA1 - gn.mean.dA1).max() <= 1e-13


@pytest.mark.parametrize("task", CONTINUOUS, ids=IDS)
def test_second_moment_table(task):
    y2 = _table.second_moment_table(task)
    w = task.weight_table()
    assert y2.shape == (task.n_sequences, task.S, task.S) and not y2.flags.writeable
    assert np.array_equal(y2, np.swapaxes(y2, 1, 2))
    assert np.abs(y2.sum(axis=2) - w).max() <= 1e-13 * w.max()
    assert np.all(y2 >= 0)
    parts = np.concatenate([_table._second_moment_rows(task, lo, min(task.n_sequences, lo + 5))
                            for lo in range(0, task.n_sequences, 5)])
    assert np.array_equal(parts, y2)  # a row is a function of its sequence only


def _lbeta(x):
    return sum(math.lgamma(v) for v in x) - math.lgamma(sum(x))


def test_uniform_second_moments_equal_the_formula():
    """Y2[c, c'] = S^{-1-R} Π_a B(α1 + n_a)/B(α1), the counts n with the label edges (q, c) and (q, c')."""
    S, alpha, T = 2, 0.3, 5
    graph = pg.random_tree(T, 2, 0.5)
    task = pg.Task(graph, pg.DirichletPrior(S, alpha, "uniform"))
    y2 = _table.second_moment_table(task)
    seqs = decode_sequences(0, task.n_sequences, S, T)
    par = graph.parents
    for m in range(0, task.n_sequences, 3):
        s = seqs[m]
        R = sum(1 for i in range(T - 1) if par[i] < 0)
        for c in range(S):
            for d in range(S):
                n = np.zeros((S, S))
                for i in range(T - 1):
                    if par[i] >= 0:
                        n[s[par[i]], s[i]] += 1
                n[s[T - 1], c] += 1
                n[s[T - 1], d] += 1
                lw = -(1 + R) * math.log(S) + sum(_lbeta(alpha + n[a]) - _lbeta([alpha] * S) for a in range(S))
                assert abs(y2[m, c, d] - math.exp(lw)) <= 1e-13 * math.exp(lw)


def test_continuous_covariance_agrees_with_sampled_gradients():
    """Independent of Y2's formulas: per-sample gradients of task.sample draws (a fresh pi per sequence)."""
    task = pg.Task(pg.chain(4), pg.DirichletPrior(2, 0.5, "stationary"))
    A1, A2 = _params(task, 5)
    gn = pg.gradient_noise(task, A1, A2)
    n = 4000
    smp = task.sample(n, seed=11)
    G = np.array([flatten_grad(*rows_loss_and_grad(smp.seqs[m:m + 1], smp.targets[m:m + 1], A1, A2,
                                                   task.default_eps)[1:]) for m in range(n)])
    sd = np.sqrt(np.diag(gn.cov))
    mean = flatten_grad(gn.mean.dA1, gn.mean.dA2)
    live = sd > 1e-12
    z = (G.mean(0) - mean)[live] / (sd[live] / np.sqrt(n))
    assert np.abs(z).max() < 5
    v = G.var(0, ddof=1)[live]
    assert np.abs(v / sd[live] ** 2 - 1).max() < 0.25


@pytest.mark.parametrize("multi", [False, True])
def test_finite_prior_table_equals_per_atom(monkeypatch, multi):
    if multi:
        task = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(2, 2, 0.3, 80, 0))
    else:
        task = pg.Task(pg.random_tree(6, 2, 0.5), pg.dirichlet_prior(2, 0.3, 40, 1))
    A1, A2 = _params(task, 3)
    monkeypatch.setattr(_table, "TABLE_MIN_ATOMS", 1)
    assert not _table.use_table(task, per_atom=True)  # a one-off call never builds the table
    assert _table.prepare_table(task) and _table.use_table(task, per_atom=True)
    a = pg.gradient_noise(task, A1, A2)
    ra = None if multi else stage1_row_noise(task, A1, A2)
    monkeypatch.setattr(_table, "TABLE_MIN_ATOMS", 10**9)
    assert not _table.use_table(task, per_atom=True)
    b = pg.gradient_noise(task, A1, A2)
    scale = max(1.0, np.abs(b.cov).max())
    assert np.abs(a.cov - b.cov).max() <= 1e-13 * scale
    assert abs(a.mean.loss - b.mean.loss) <= 1e-13 and abs(a.loss_var - b.loss_var) <= 1e-13
    if not multi:
        rb = stage1_row_noise(task, A1, A2)
        assert np.abs(ra.row_cov - rb.row_cov).max() <= 1e-13 * scale


def test_options_and_threads_on_the_table():
    task = pg.Task(pg.chain(7), pg.DirichletPrior(2, 0.1, "uniform"))
    A1, A2 = _params(task, 4)
    few = pg.gradient_noise(task, A1, A2)
    opts = pg.EngineOptions(noise_block_sequences=16, noise_max_blocks=64, parallel_min_sequences=1)
    many = pg.gradient_noise(task, A1, A2, options=opts)
    assert np.abs(few.cov - many.cov).max() <= 1e-12 * np.abs(few.cov).max()
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        a = pg.gradient_noise(task, A1, A2, options=opts)
        ra = stage1_row_noise(task, A1, A2, options=opts)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        b = pg.gradient_noise(task, A1, A2, options=opts)
        rb = stage1_row_noise(task, A1, A2, options=opts)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(a.cov, b.cov) and np.array_equal(ra.row_cov, rb.row_cov)


@given(tasks(max_T=5, max_S=3, max_sequences=300), st.integers(0, 100))
@settings(max_examples=10, deadline=None)
def test_table_path_equals_per_atom_path_property(task, seed):
    """Any finite task: the prepared table's path and the per-atom path agree to 1e-13 (relative)."""
    A1, A2 = _params(task, seed)
    saved = _table.TABLE_MIN_ATOMS
    try:
        _table.TABLE_MIN_ATOMS = 10**9
        a = pg.gradient_noise(task, A1, A2)
        _table.TABLE_MIN_ATOMS = 1
        _table.prepare_table(task)
        assert _table.use_table(task, per_atom=True)
        b = pg.gradient_noise(task, A1, A2)
    finally:
        _table.TABLE_MIN_ATOMS = saved
    scale = max(1.0, np.abs(a.cov).max())
    assert np.abs(a.cov - b.cov).max() <= 1e-13 * scale
    assert abs(a.mean.loss - b.mean.loss) <= 1e-13 * max(1.0, abs(a.mean.loss))


def test_continuous_mean_matches_finite_differences():
    task = pg.Task(pg.random_tree(5, 2, 0.5), pg.DirichletPrior(2, 0.1))
    A1, A2 = _params(task, 7, scale=0.5)
    gn = pg.gradient_noise(task, A1, A2)
    h = 1e-6
    for (i, j) in [(2, 1), (4, 0)]:
        E = np.zeros_like(A1)
        E[i, j] = h
        fd = (pg.exact_loss(task, A1 + E, A2) - pg.exact_loss(task, A1 - E, A2)) / (2 * h)
        assert abs(fd - gn.mean.dA1[i, j]) <= 1e-8
    E = np.zeros_like(A2)
    E[1, 0] = h
    fd = (pg.exact_loss(task, A1, A2 + E) - pg.exact_loss(task, A1, A2 - E)) / (2 * h)
    assert abs(fd - gn.mean.dA2[1, 0]) <= 1e-8
