"""The per-sample gradient's exact moments (popgrad.engine.noise, issue 22).

Named invariants:
* brute force: the covariance over every (atom, sequence) sample, each sample's gradient from an
  independent reference (the NumPy rows engine; JAX autodiff for k heads), agrees to 1e-10;
* the numba kernels equal the NumPy reference; the mean equals exact_loss_and_grad;
* per-sample gradient rows of dA1 and dA2 sum to 0, so cov annihilates those directions; cov is PSD;
* stage1_row_noise equals gradient_noise's row_cov; results do not depend on the thread count;
* a Monte-Carlo covariance of sampled gradients agrees within its sampling error.
"""
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import popgrad as pg
from popgrad.engine.noise import flatten_grad, gradient_noise_numpy, stage1_row_noise
from popgrad.engine.reference import rows_loss_and_grad_numpy
from popgrad.engine.single import rows_loss_and_grad
from popgrad.task.tasks import decode_sequences, parent_rows

from ..strategies import multi_tasks, tasks

TOL = 1e-10


def _params(task, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    T, S = task.T, task.S
    if isinstance(task, pg.MultiParentTask):
        return scale * rng.normal(size=(task.k, T, T)), scale * rng.normal(size=(task.k, S, S))
    return scale * rng.normal(size=(T, T)), scale * rng.normal(size=(S, S))


def _samples(task):
    """Every sample (atom k, sequence s) with its probability ρ_k p_k(s) and its label π_k(·|target)."""
    S, T = task.S, task.T
    seqs = decode_sequences(0, task.n_sequences, S, T)
    if isinstance(task, pg.MultiParentTask):
        parents, tp, atoms, pk0 = task.kernel_arrays()
        for k in range(atoms.shape[0]):
            p = np.full(len(seqs), pk0[k])
            for i in range(T):
                if parents[i, 0] >= 0:
                    p *= atoms[k, parent_rows(seqs, parents[i], S), seqs[:, i]]
            yield seqs, p, atoms[k, parent_rows(seqs, tp, S)]
        return
    parents, mu, atoms, prior_w = task.kernel_arrays()
    for k in range(atoms.shape[0]):
        p = np.full(len(seqs), prior_w[k] / S)
        for i in range(T - 1):
            p *= mu[k, seqs[:, i]] if parents[i] < 0 else atoms[k, seqs[:, parents[i]], seqs[:, i]]
        yield seqs, p, atoms[k, seqs[:, T - 1]]


def _brute_force(task, A1, A2, eps, grad_of_sample):
    m = 0.0
    M2 = 0.0
    L1 = L2 = 0.0
    for seqs, p, y in _samples(task):
        for n in np.flatnonzero(p > 0):
            loss, g = grad_of_sample(seqs[n], y[n])
            m = m + p[n] * g
            M2 = M2 + p[n] * np.outer(g, g)
            L1 += p[n] * loss
            L2 += p[n] * loss**2
    return m, M2 - np.outer(m, m), L2 - L1**2


def _single_sample_grad(A1, A2, eps):
    def grad(s, y):
        r = rows_loss_and_grad_numpy(s[None], y[None], A1, A2, eps)
        return r.loss, flatten_grad(r.dA1, r.dA2)
    return grad


def _jax_multi_sample_grad(A1, A2, eps):
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    k, T, _ = A1.shape
    S = A2.shape[1]
    mask = jnp.tril(jnp.ones((T, T), dtype=bool))

    def loss(A1, A2, s, y):
        X = jax.nn.one_hot(s, S, dtype=jnp.float64)
        P = jax.nn.softmax(jnp.where(mask, A1, -jnp.inf), axis=-1)  # (k, T, T)
        H = jnp.einsum("hij,jc->hic", P, X)
        kap = jnp.einsum("hb,hbc->hc", H[:, -1, :], A2)
        u = jnp.einsum("hic,hc->i", H, kap)
        f = jax.nn.softmax(u) @ X
        return -jnp.sum(y * jnp.log(f + eps))

    vg = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    def grad(s, y):
        val, (g1, g2) = vg(A1, A2, jnp.asarray(s), jnp.asarray(y))
        return float(val), flatten_grad(np.asarray(g1), np.asarray(g2))
    return grad


@pytest.mark.parametrize("build", [
    lambda: pg.Task(pg.random_tree(5, seed=1), pg.dirichlet_prior(3, 1.0, 2, seed=0)),
    lambda: pg.Task(pg.chain(7), pg.FinitePrior([[[.8, .2], [.2, .8]], [[.2, .8], [.8, .2]]])),
    lambda: pg.Task(pg.icl_pairs(6), pg.dirichlet_prior(2, 0.5, 3, seed=2)),
])
def test_cov_equals_per_sample_brute_force(build):
    task = build()
    A1, A2 = _params(task, 0)
    eps = task.default_eps
    gn = pg.gradient_noise(task, A1, A2)
    m, cov, lvar = _brute_force(task, A1, A2, eps, _single_sample_grad(A1, A2, eps))
    scale = max(1.0, np.abs(cov).max())
    assert np.abs(gn.cov - cov).max() <= TOL * scale
    assert np.abs(flatten_grad(gn.mean.dA1, gn.mean.dA2) - m).max() <= TOL
    assert abs(gn.loss_var - lvar) <= TOL * max(1.0, lvar)


def test_cov_equals_jax_brute_force_k_heads():
    task = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(2, 2, 1.0, 2, seed=0))
    A1, A2 = _params(task, 1)
    eps = task.default_eps
    gn = pg.gradient_noise(task, A1, A2)
    m, cov, lvar = _brute_force(task, A1, A2, eps, _jax_multi_sample_grad(A1, A2, eps))
    assert np.abs(gn.cov - cov).max() <= TOL * max(1.0, np.abs(cov).max())
    assert np.abs(flatten_grad(gn.mean.dA1, gn.mean.dA2) - m).max() <= TOL
    assert abs(gn.loss_var - lvar) <= TOL * max(1.0, lvar)


def _check_invariants(task, gn, A1, A2):
    exact = pg.exact_loss_and_grad(task, A1, A2)
    assert abs(gn.mean.loss - exact.loss) <= 1e-12 * max(1, abs(exact.loss))
    assert np.allclose(gn.mean.dA1, exact.dA1, rtol=0, atol=1e-12)
    assert np.allclose(gn.mean.dA2, exact.dA2, rtol=0, atol=1e-12)
    cov = gn.cov
    scale = max(1e-300, np.abs(cov).max())
    assert np.allclose(cov, cov.T, rtol=0, atol=0)
    assert np.linalg.eigvalsh(cov).min() >= -1e-12 * scale
    assert gn.loss_var >= -1e-12
    # every per-sample row of dA1 (and of dA2) sums to zero: cov annihilates the row-sum directions
    zero1 = np.zeros_like(exact.dA1)
    zero2 = np.zeros_like(exact.dA2)
    heads = zero1.reshape(-1, task.T, task.T).shape[0]
    for h in range(heads):
        for i in range(task.T):
            d1 = zero1.copy().reshape(heads, task.T, task.T)
            d1[h, i, : i + 1] = 1.0
            v = flatten_grad(d1.reshape(zero1.shape), zero2)
            assert np.abs(cov @ v).max() <= 1e-12 * max(1.0, scale)
        for b in range(task.S):
            d2 = zero2.copy().reshape(heads, task.S, task.S)
            d2[h, b, :] = 1.0
            v = flatten_grad(zero1, d2.reshape(zero2.shape))
            assert np.abs(cov @ v).max() <= 1e-12 * max(1.0, scale)


@given(tasks(max_T=6, max_S=3, max_sequences=800), st.integers(0, 100))
@settings(max_examples=15)
def test_kernel_equals_numpy_reference(task, seed):
    A1, A2 = _params(task, seed)
    gn = pg.gradient_noise(task, A1, A2)
    ref = gradient_noise_numpy(task, A1, A2, chunk=97)
    scale = max(1.0, np.abs(ref.cov).max())
    assert np.abs(gn.cov - ref.cov).max() <= 1e-12 * scale
    assert np.abs(gn.row_cov - ref.row_cov).max() <= 1e-12 * scale
    assert abs(gn.loss_var - ref.loss_var) <= 1e-12 * max(1.0, ref.loss_var)
    _check_invariants(task, gn, A1, A2)
    rows = stage1_row_noise(task, A1, A2)
    assert np.abs(rows.row_cov - gn.row_cov).max() <= 1e-12 * scale
    assert np.abs(rows.dA1 - gn.mean.dA1).max() <= 1e-13


@given(multi_tasks(max_T=5, max_k=2, max_sequences=300), st.integers(0, 100))
@settings(max_examples=8)
def test_kernel_equals_numpy_reference_k_heads(task, seed):
    A1, A2 = _params(task, seed)
    gn = pg.gradient_noise(task, A1, A2)
    ref = gradient_noise_numpy(task, A1, A2, chunk=53)
    scale = max(1.0, np.abs(ref.cov).max())
    assert np.abs(gn.cov - ref.cov).max() <= 1e-12 * scale
    assert gn.row_cov.shape == (task.k, task.T, task.T, task.T)
    _check_invariants(task, gn, A1, A2)


def test_thread_count_independent():
    task = pg.Task(pg.chain(12), pg.dirichlet_prior(2, 1.0, 2, seed=0))  # 4096 sequences: two blocks
    A1, A2 = _params(task, 3)
    before = numba.get_num_threads()
    opts = pg.EngineOptions(parallel_min_sequences=1)  # the parallel twin whenever there are 2 threads
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


def test_monte_carlo_covariance_agrees():
    """Sampled per-sample gradients (task.sample + the rows engine) have the exact mean and covariance."""
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 2, seed=1))
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
    # variances: relative error of a sample variance ~ sqrt(2/n)·sqrt(kurtosis); 25 % is > 5 sd here
    v = G.var(0, ddof=1)[live]
    assert np.abs(v / sd[live] ** 2 - 1).max() < 0.25


def test_errors():
    task = pg.Task(pg.chain(3), pg.dirichlet_prior(2, 1.0, 1, seed=0))
    with pytest.raises(ValueError, match="A1 must have shape"):
        pg.gradient_noise(task, np.zeros((2, 2)), np.zeros((2, 2)))
    with pytest.raises(TypeError, match="task must be"):
        pg.gradient_noise("chain", np.zeros((3, 3)), np.zeros((2, 2)))
    with pytest.raises(pg.TaskTooLargeError):
        pg.gradient_noise(pg.Task(pg.chain(30), pg.dirichlet_prior(2, 1.0, 1, seed=0)),
                          np.zeros((30, 30)), np.zeros((2, 2)))


def test_mean_matches_finite_differences_of_the_loss():
    task = pg.Task(pg.random_tree(5, seed=2), pg.dirichlet_prior(2, 1.0, 2, seed=3))
    A1, A2 = _params(task, 7, scale=0.5)
    gn = pg.gradient_noise(task, A1, A2)
    h = 1e-6
    for (i, j) in [(2, 1), (3, 0), (4, 4)]:
        E = np.zeros_like(A1)
        E[i, j] = h
        fd = (pg.exact_loss(task, A1 + E, A2) - pg.exact_loss(task, A1 - E, A2)) / (2 * h)
        assert abs(fd - gn.mean.dA1[i, j]) <= 1e-8
    for (a, b) in [(0, 1), (1, 0)]:
        E = np.zeros_like(A2)
        E[a, b] = h
        fd = (pg.exact_loss(task, A1, A2 + E) - pg.exact_loss(task, A1, A2 - E)) / (2 * h)
        assert abs(fd - gn.mean.dA2[a, b]) <= 1e-8


def test_eps_zero_with_an_unpredictable_token_warns_and_gives_nan():
    task = pg.Task(pg.chain(3), pg.FinitePrior([[[.8, .2], [.2, .8]]]))  # s = (0,0,0) with label mass on 1
    with pytest.warns(RuntimeWarning):
        gn = pg.gradient_noise(task, np.zeros((3, 3)), np.eye(2), eps=0.0)
    assert np.isinf(gn.mean.loss) and np.all(np.isnan(gn.cov)) and np.isnan(gn.loss_var)
