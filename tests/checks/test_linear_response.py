"""The linear-response prediction of sampled full-model SGD around the exact run (popgrad.checks.linear_response).

Tiny sizes: every reference is independent of the code under test (per-row engine gradients, finite-difference
Hessians, a closed-form Dirichlet moment, a Monte Carlo of the linearised recursion driven by real batches).
"""
import numpy as np
import pytest

import popgrad as pg
from popgrad.checks import linear_response as lr
from popgrad.engine.hvp import flatten_params, unflatten_params


def _task(prior, T=3, graph=None):
    return pg.Task(graph if graph is not None else pg.chain(T), prior)


def _flat(res):
    return flatten_params((res.dA, res.dW))


@pytest.mark.parametrize("prior", [pg.DirichletPrior(2, 0.5), pg.DirichletPrior(2, 0.3, roots="uniform"),
                                   pg.DirichletPrior(3, 0.5), pg.dirichlet_prior(2, 1.0, 3, seed=0)],
                         ids=["stationary-S2", "uniform", "stationary-S3", "finite"])
def test_soft_label_moments_sum_to_the_weights_and_are_psd(prior):
    task = _task(prior, T=4 if prior.S == 2 else 3)
    seqs, w = task.all_sequences()
    M = lr.soft_label_moments(task, seqs)
    np.testing.assert_allclose(M.sum(axis=2), w, rtol=1e-10, atol=1e-15)
    np.testing.assert_array_equal(M, M.transpose(0, 2, 1))
    assert np.linalg.eigvalsh(M).min() > -1e-14


def test_soft_label_moments_uniform_roots_closed_form():
    """Uniform roots: the query row's posterior is Dirichlet(α + counts), whose second moment is known."""
    S, T, alpha = 3, 4, 0.4
    task = _task(pg.DirichletPrior(S, alpha, roots="uniform"), T=T, graph=pg.random_tree(T, seed=1, root_prob=0.5))
    seqs, w = task.all_sequences()
    M = lr.soft_label_moments(task, seqs)
    par = np.asarray(task.graph.parents)
    for m in range(0, len(seqs), 7):
        s = seqs[m]
        q = s[T - 1]
        n = np.zeros(S)
        for i in range(T - 1):
            if par[i] >= 0 and s[par[i]] == q:
                n[s[i]] += 1
        a = alpha + n
        A = a.sum()
        second = (np.outer(a, a) + np.diag(a)) / (A * (A + 1))
        np.testing.assert_allclose(M[m], w[m].sum() * second, rtol=1e-12)


def test_soft_label_moments_one_atom():
    """One atom: the label is the atom's row, so M = w ⊗ π(·|q)."""
    pi = np.array([[0.7, 0.3], [0.2, 0.8]])
    task = _task(pg.FinitePrior(pi[None], [1.0]), T=4)
    seqs, w = task.all_sequences()
    M = lr.soft_label_moments(task, seqs)
    np.testing.assert_allclose(M, w[:, :, None] * pi[seqs[:, -1]][:, None, :], rtol=1e-12, atol=1e-18)


def test_logit_jacobian_matches_the_rows_kernel():
    task = _task(pg.DirichletPrior(3, 0.5), T=4, graph=pg.random_tree(4, seed=1, root_prob=0.5))
    model = pg.CatFormer(3, 4, heads=(2, 1))
    p = model.init(0.4, 2)
    seqs = task.all_sequences()[0][::9]
    J = lr.logit_jacobian(model, p, seqs)
    f = pg.model.catformer.catformer_forward(model, p, seqs)[0]
    y = np.random.default_rng(0).dirichlet(np.ones(3), size=len(seqs))
    for m in range(len(seqs)):
        ref = _flat(pg.catformer_rows_loss_and_grad(seqs[m:m + 1], y[m:m + 1], model, p))
        np.testing.assert_allclose(J[m].T @ (f[m] - y[m]), ref, rtol=1e-10, atol=1e-14)


def test_noise_covariance_finite_prior_against_the_pairs():
    """Finite prior: Σ over every (sequence, atom) pair with its probability, each draw's gradient from the
    rows kernel — an independent sum."""
    task = _task(pg.dirichlet_prior(2, 0.7, 3, seed=4), T=3)
    model = pg.CatFormer(2, 3)
    p = model.init(0.5, 1)
    gbar, Sig = lr.gradient_noise_covariance(task, model, p)
    np.testing.assert_allclose(gbar, _flat(pg.catformer_loss_and_grad(task, model, p)), rtol=1e-10, atol=1e-15)
    atoms, weights = task.prior.expand()
    single = [pg.Task(task.graph, pg.FinitePrior(atoms[k:k + 1], [1.0])) for k in range(len(weights))]
    second = np.zeros_like(Sig)
    for k, tk in enumerate(single):
        seqs, w = tk.all_sequences()
        ps = w.sum(axis=1)
        for m in range(len(seqs)):
            y = atoms[k, seqs[m, -1]]
            g = _flat(pg.catformer_rows_loss_and_grad(seqs[m:m + 1], y[None], model, p))
            second += weights[k] * ps[m] * np.outer(g, g)
    np.testing.assert_allclose(Sig, second - np.outer(gbar, gbar), rtol=1e-9, atol=1e-14)
    # the soft label matters: hard labels (a one-hot draw c ~ y) would give a strictly larger covariance
    assert np.trace(Sig) > 0


def test_noise_covariance_continuous_prior_against_samples():
    """Continuous prior: the covariance of 40,000 seeded single-draw gradients (task.sample) within 4 %."""
    task = _task(pg.DirichletPrior(2, 0.3), T=3)
    model = pg.CatFormer(2, 3)
    p = model.init(0.5, 3)
    gbar, Sig = lr.gradient_noise_covariance(task, model, p)
    smp = task.sample(40000, 11)
    f = pg.model.catformer.catformer_forward(model, p, smp.seqs)[0]
    G = np.einsum("ncp,nc->np", lr.logit_jacobian(model, p, smp.seqs), f - smp.targets)
    emp = np.cov(G.T)
    assert abs(np.trace(emp) / np.trace(Sig) - 1) < 0.04
    top = np.linalg.eigh(Sig)[1][:, -1]
    assert abs(top @ emp @ top / (top @ Sig @ top) - 1) < 0.04


def _fd_hessian(task, model, p, h=1e-5):
    x = flatten_params(p)
    cols = []
    for i in range(x.size):
        e = np.zeros_like(x)
        e[i] = h
        gp = _flat(pg.catformer_loss_and_grad(task, model, unflatten_params(model, x + e)))
        gm = _flat(pg.catformer_loss_and_grad(task, model, unflatten_params(model, x - e)))
        cols.append((gp - gm) / (2 * h))
    H = np.stack(cols, axis=1)
    return 0.5 * (H + H.T)


@pytest.fixture(scope="module")
def tiny_run():
    task = _task(pg.DirichletPrior(2, 0.3), T=3, graph=pg.CausalGraph([-1, 0, -1]))
    model = pg.CatFormer(2, 3)
    steps = 6
    ex = pg.train_catformer(task, model, steps, optimizer="sgd", lr=1.0, lr_schedule="constant", init="zero",
                            record_every=1)
    return task, model, ex


def test_covariance_against_a_dense_finite_difference_recursion(tiny_run):
    task, model, ex = tiny_run
    res = lr.catformer_linear_response(task, model, ex, batch_size=[1, 8], keep_cov=True)
    P = flatten_params(ex.params(0)).size
    C = np.zeros((P, P))
    for t in range(len(ex.step)):
        p = ex.params(t)
        H = _fd_hessian(task, model, p)
        np.testing.assert_allclose(res.cov[t], C, rtol=1e-6, atol=1e-9 * max(1.0, np.abs(C).max()))
        assert res.sq_dist[1, t] == pytest.approx(np.trace(C) / 8, rel=1e-6, abs=1e-15)
        g = _flat(pg.catformer_loss_and_grad(task, model, p))
        sd = np.sqrt(g @ C @ g + 0.5 * np.sum((H @ C) * (H @ C).T))
        assert res.loss_sd[0, t] == pytest.approx(sd, rel=1e-5, abs=1e-14)
        assert res.loss_bias[0, t] == pytest.approx(0.5 * np.sum(H * C), rel=1e-5, abs=1e-14)
        Sig = lr.gradient_noise_covariance(task, model, p)[1]
        M = np.eye(P) - H
        C = M @ C @ M.T + Sig
    np.testing.assert_allclose(res.sq_dist[0, 1:] / res.sq_dist[1, 1:], 8.0, rtol=1e-12)


def test_prediction_matches_a_monte_carlo_of_the_linearised_recursion(tiny_run):
    """δ_{t+1} = (I − ηH_t) δ_t − η ξ_t driven by real batches (task.sample, centred at the exact gradient):
    E‖δ‖² at two batch sizes against tr C / B (the 1/B scaling), within 4 Monte-Carlo standard errors."""
    task, model, ex = tiny_run
    res = lr.catformer_linear_response(task, model, ex, batch_size=[2, 8])
    steps = len(ex.step) - 1
    P = flatten_params(ex.params(0)).size
    Hs = [_fd_hessian(task, model, ex.params(t)) for t in range(steps)]
    R = 600
    for bi, B in enumerate((2, 8)):
        delta = np.zeros((R, P))
        rng = np.random.default_rng(100 + B)
        for t in range(steps):
            p = ex.params(t)
            smp = task.sample(R * B, rng)
            f = pg.model.catformer.catformer_forward(model, p, smp.seqs)[0]
            G = np.einsum("ncp,nc->np", lr.logit_jacobian(model, p, smp.seqs), f - smp.targets)
            xi = G.reshape(R, B, P).mean(axis=1) - _flat(pg.catformer_loss_and_grad(task, model, p))
            delta = delta - delta @ Hs[t].T - xi
        sq = np.sum(delta**2, axis=1)
        z = (sq.mean() - res.sq_dist[bi, -1]) / (sq.std(ddof=1) / np.sqrt(R))
        assert abs(z) < 4, (B, sq.mean(), res.sq_dist[bi, -1], z)
    assert res.sq_dist[0, -1] == pytest.approx(4 * res.sq_dist[1, -1], rel=1e-12)


def test_a_wrong_noise_model_is_detected(tiny_run):
    """Hard labels (a one-hot draw per sequence) have more noise than soft ones: the Monte Carlo above
    with one-hot labels lands well away from the soft-label prediction (the test above can fail)."""
    task, model, ex = tiny_run
    res = lr.catformer_linear_response(task, model, ex, batch_size=4)
    p = ex.params(0)
    rng = np.random.default_rng(5)
    smp = task.sample(20000, rng)
    hard = np.eye(2)[(rng.random(20000)[:, None] > np.cumsum(smp.targets, axis=1)).sum(axis=1).clip(0, 1)]
    f = pg.model.catformer.catformer_forward(model, p, smp.seqs)[0]
    J = lr.logit_jacobian(model, p, smp.seqs)
    soft = np.einsum("ncp,nc->np", J, f - smp.targets)
    hardg = np.einsum("ncp,nc->np", J, f - hard)
    Sig = lr.gradient_noise_covariance(task, model, p)[1]
    assert np.trace(np.cov(soft.T)) == pytest.approx(np.trace(Sig), rel=0.05)
    assert np.trace(np.cov(hardg.T)) > 1.3 * np.trace(Sig)
    assert res.sq_dist[0, 1] == pytest.approx(np.trace(Sig) / 4, rel=1e-10)  # one step: C_1 = η² Σ / B


def test_grid_refinement_converges(tiny_run):
    """H, Σ held constant between grid points: a coarse grid differs from the every-step one, a finer one less."""
    task, model, ex = tiny_run
    every = lr.catformer_linear_response(task, model, ex, batch_size=1)
    coarse = lr.catformer_linear_response(task, model, [ex.params(0), ex.params(6)], 1.0, 1, steps=[0, 6])
    mid = lr.catformer_linear_response(task, model, [ex.params(t) for t in (0, 2, 4, 6)], 1.0, 1, steps=[0, 2, 4, 6])
    e_coarse = abs(coarse.sq_dist[0, -1] / every.sq_dist[0, -1] - 1)
    e_mid = abs(mid.sq_dist[0, -1] / every.sq_dist[0, -1] - 1)
    assert e_mid < e_coarse


def test_bad_input(tiny_run):
    task, model, ex = tiny_run
    with pytest.raises(ValueError, match="batch_size"):
        lr.catformer_linear_response(task, model, ex, batch_size=0)
    with pytest.raises(ValueError, match="steps must be"):
        lr.catformer_linear_response(task, model, [ex.params(0), ex.params(1)], 1.0, 4, steps=[1, 1])
    with pytest.raises(ValueError, match="lr is required"):
        lr.catformer_linear_response(task, model, [ex.params(0), ex.params(1)], None, 4)
    with pytest.raises(TypeError, match="trajectory"):
        lr.catformer_linear_response(task, model, "run.npz", 1.0, 4)
    sampled = pg.train_catformer(task, model, 2, lr_schedule="constant", init="zero", gradient="sampled",
                                 batch_size=4)
    with pytest.raises(ValueError, match="exact run"):
        lr.catformer_linear_response(task, model, sampled, batch_size=4)
    adam = pg.train_catformer(task, model, 2, optimizer="adam", lr=0.1, init="zero")
    with pytest.raises(ValueError, match="plain SGD"):
        lr.catformer_linear_response(task, model, adam, batch_size=4)
    with pytest.raises(ValueError, match="plain SGD"):
        lr.catformer_linear_response(task, model, adam, 0.1, batch_size=4)
    multi = pg.MultiParentTask(pg.two_parent(4), pg.DirichletTensorPrior(2, 2, 0.1))
    with pytest.raises(TypeError, match="single-parent"):
        lr.catformer_linear_response(multi, pg.CatFormer(2, 4), [pg.CatFormer(2, 4).zeros()], 1.0, 4)


def test_learning_rates_come_from_the_trajectory_schedule():
    task = _task(pg.DirichletPrior(2, 0.3), T=3, graph=pg.CausalGraph([-1, 0, -1]))
    model = pg.CatFormer(2, 3)
    ex = pg.train_catformer(task, model, 4, optimizer="sgd", lr=0.8, lr_schedule="cosine", weight_decay=0.01,
                            init="zero", record_every=2)
    res = lr.catformer_linear_response(task, model, ex, batch_size=16)
    etas = [pg.train.optim.learning_rate(0.8, "cosine", 4, t) for t in range(4)]
    plist = [ex.params(r) for r in range(len(ex.step))]
    same = lr.catformer_linear_response(task, model, plist, etas, 16, steps=ex.step, weight_decay=0.01)
    np.testing.assert_allclose(res.sq_dist, same.sq_dist, rtol=1e-12)
    other = lr.catformer_linear_response(task, model, plist, 0.8, 16, steps=ex.step, weight_decay=0.01)
    assert abs(other.sq_dist[0, -1] / res.sq_dist[0, -1] - 1) > 1e-3
