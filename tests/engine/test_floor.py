"""The exact floor of the ε-perturbed loss (popgrad.engine.floor, issue 17): water-filling per sequence."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from scipy.optimize import minimize

import popgrad as pg
from popgrad.engine.floor import floor_predictor, floor_rows, floor_rows_numpy

from ..strategies import multi_tasks, tasks


def brute_force_row(w, eps):
    """min_{f in simplex} -sum_c w_c log(f_c + eps) by SLSQP from several starts (an independent solver)."""
    S = len(w)

    def obj(f):
        return -np.sum(w * np.log(np.maximum(f, 0.0) + eps))

    best = np.inf
    starts = [np.full(S, 1.0 / S)] + [np.eye(S)[c] * 0.9 + 0.1 / S for c in range(S)]
    if w.sum() > 0:
        starts.append(w / w.sum())
    for x0 in starts:
        res = minimize(obj, x0, method="SLSQP", bounds=[(0.0, 1.0)] * S,
                       constraints=[{"type": "eq", "fun": lambda f: f.sum() - 1.0}],
                       options={"ftol": 1e-14, "maxiter": 500})
        best = min(best, obj(np.clip(res.x, 0, None) / np.clip(res.x, 0, None).sum()))
    return best


@pytest.mark.parametrize("eps", [0.0, 0.05, 0.3, 1.0, 3.0])
def test_floor_rows_against_brute_force(eps):
    rng = np.random.default_rng(1)
    w = rng.dirichlet(np.full(4, 0.4), size=12) * rng.random((12, 1))
    w[3, 2] = 0.0
    got = floor_rows(w, eps)
    for i in range(len(w)):
        ref = brute_force_row(w[i], eps) if eps > 0 else -np.sum(w[i][w[i] > 0] * np.log(w[i][w[i] > 0] / w[i].sum()))
        assert got[i] <= ref + 1e-9  # the closed form is at least as good as the solver ...
        assert got[i] == pytest.approx(ref, abs=1e-7)  # ... and the solver reaches it


def test_floor_rows_derivable_cases():
    # one row w = (a, b), eps: both active iff b > eps * (a + b) / (1 + 2 eps)
    a, b, eps = 0.6, 0.1, 0.5
    lam2 = (a + b) / (1 + 2 * eps)
    assert b <= eps * lam2  # so only the top token is active: f = (1, 0), floor = -a log(1 + eps) - b log(eps)
    assert floor_rows(np.array([[a, b]]), eps)[0] == pytest.approx(-a * np.log(1 + eps) - b * np.log(eps), rel=1e-15)
    a, b, eps = 0.4, 0.3, 0.1  # both active: f_c + eps = w_c / lam
    lam = (a + b) / (1 + 2 * eps)
    assert floor_rows(np.array([[a, b]]), eps)[0] == pytest.approx(-a * np.log(a / lam) - b * np.log(b / lam),
                                                                   rel=1e-14)
    assert floor_rows(np.zeros((1, 3)), 0.2)[0] == 0.0


@given(st.integers(0, 2**31), st.integers(2, 6), st.sampled_from([0.0, 1e-3, 0.2, 1.0, 10.0]),
       st.sampled_from([0.05, 1.0, 5.0]))
def test_floor_rows_numba_equals_numpy_and_predictor_attains(seed, S, eps, alpha):
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.full(S, alpha), size=20) * rng.random((20, 1))
    w[0] = 0.0
    a, b = floor_rows(w, eps), floor_rows_numpy(w, eps)
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    f = floor_predictor(w, eps)
    np.testing.assert_allclose(f.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(f >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        val = -np.where(w > 0, w * np.log(f + eps), 0.0).sum(axis=1)
    np.testing.assert_allclose(val, a, rtol=1e-12, atol=1e-15)
    # no other point of the simplex does better
    for _ in range(5):
        g = rng.dirichlet(np.ones(S), size=20)
        with np.errstate(divide="ignore", invalid="ignore"):
            other = -np.where(w > 0, w * np.log(g + eps), 0.0).sum(axis=1)
        assert np.all(other >= a - 1e-12)


@given(st.integers(0, 2**31), st.integers(2, 5), st.sampled_from([0.05, 0.5, 2.0]))
def test_floor_gradient_is_the_envelope(seed, S, eps):
    """Finite differences: d floor / d w_c = -log(f*_c + eps) (envelope theorem)."""
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.ones(S), size=1) * 0.5 + 0.01
    f = floor_predictor(w, eps)
    h = 1e-7
    for c in range(S):
        wp, wm = w.copy(), w.copy()
        wp[0, c] += h
        wm[0, c] -= h
        fd = (floor_rows(wp, eps)[0] - floor_rows(wm, eps)[0]) / (2 * h)
        assert fd == pytest.approx(-np.log(f[0, c] + eps), abs=1e-6)


@pytest.mark.filterwarnings("ignore:exact_loss")
@given(tasks(max_T=6, max_sequences=3000), st.sampled_from([None, 0.0, 0.7]), st.integers(0, 2**31))
def test_floor_loss_is_a_lower_bound(task, eps, seed):
    e = task.default_eps if eps is None else eps
    floor = pg.floor_loss(task, eps)
    assert floor == pytest.approx(pg.floor_loss(task, eps, symmetry="off"), rel=1e-12, abs=1e-14)
    rng = np.random.default_rng(seed)
    for scale in (0.0, 1.0, 5.0):
        A1 = scale * rng.standard_normal((task.T, task.T))
        A2 = scale * rng.standard_normal((task.S, task.S))
        assert pg.exact_loss(task, A1, A2, e) >= floor - 1e-12
    assert pg.bayes_loss(task, eps=e) >= floor - 1e-12
    if e == 0:
        assert floor == pytest.approx(pg.bayes_loss(task), rel=1e-12, abs=1e-14)


def test_floor_loss_multi_parent_and_below_the_references():
    task = pg.MultiParentTask(pg.two_parent(6), pg.dirichlet_tensor_prior(2, 2, 1.0, 2, 0, symmetrize="full"))
    floor = pg.floor_loss(task)
    assert floor <= pg.bayes_loss(task, eps=task.default_eps) + 1e-15
    assert floor <= pg.count_estimator_loss(task) + 1e-15
    seqs, w = task.all_sequences()
    assert floor == pytest.approx(float(floor_rows_numpy(w, task.default_eps).sum()), rel=1e-13)


@given(multi_tasks())
def test_floor_loss_multi_is_the_sum_of_rows(task):
    seqs, w = task.all_sequences()
    assert pg.floor_loss(task, 0.3) == pytest.approx(float(floor_rows_numpy(w, 0.3).sum()), rel=1e-12, abs=1e-14)


def test_floor_loss_bad_input():
    with pytest.raises(TypeError, match="task must be"):
        pg.floor_loss("chain")
    task = pg.Task(pg.chain(3), pg.dirichlet_prior(2, 1.0, 2, 0))
    with pytest.raises(ValueError, match="eps must be"):
        pg.floor_loss(task, -1.0)
    with pytest.raises(pg.TaskTooLargeError):
        pg.floor_loss(pg.Task(pg.chain(30), pg.dirichlet_prior(2, 1.0, 2, 0), max_sequences=1000))
