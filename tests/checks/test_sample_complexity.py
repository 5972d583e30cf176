"""Stage-1 sample complexity (checks.sample_complexity, issue 22).

* the bivariate orthant terms (Owen's T) equal scipy's bivariate normal CDF;
* the Hunter / Dawson-Sankoff bracket contains Genz's value;
* the Gaussian limit agrees with a seeded simulation of the event (at N where it predicts 0.5 and at N_min);
* the T log T fit recovers a planted constant.
"""
import math

import numpy as np
import pytest
from scipy.stats import multivariate_normal

import popgrad as pg
from popgrad import checks
from popgrad.checks.sample_complexity import (_bvn_lower, fit_t_log_t, ranking_model, sample_complexity_sweep,
                                             simulate_ranking, wilson_interval)

PAIR = pg.FinitePrior([[[.8, .2], [.2, .8]], [[.2, .8], [.8, .2]]])


def test_bivariate_terms_equal_scipy():
    rng = np.random.default_rng(0)
    h = -rng.uniform(0.5, 4, size=4)
    rho = np.array([[1, .3, -.4, .9], [.3, 1, .1, .5], [-.4, .1, 1, -.2], [.9, .5, -.2, 1]])
    got = _bvn_lower(h, h, rho)
    for a in range(4):
        for b in range(4):
            if a != b:
                want = multivariate_normal.cdf([h[a], h[b]], cov=[[1, rho[a, b]], [rho[a, b], 1]],
                                               abseps=1e-12, releps=1e-12)
                assert abs(got[a, b] - want) <= 1e-9 * max(want, 1e-6)


@pytest.mark.parametrize("graph", [pg.chain(8), pg.random_tree(8, seed=0)])
def test_bracket_contains_genz(graph):
    model = ranking_model(pg.Task(graph, PAIR))
    N = model.n_min(0.99)
    lo, hi = model.row_fail_bounds(N)
    genz = model.row_fail_genz(N, rel=1e-4)  # quasi-Monte Carlo: its error estimate is not a bound
    assert np.all(lo <= genz * (1 + 5e-3)) and np.all(genz <= hi * (1 + 5e-3))
    assert np.all(hi - lo <= 0.05 * hi)  # tight here
    assert model.probability(N) >= 0.99 > model.probability(N - 1)
    assert model.n_min(0.99, optimistic=True) <= N


def test_gaussian_limit_agrees_with_simulation():
    task = pg.Task(pg.chain(7), PAIR)
    model = ranking_model(task)
    N = model.n_min(0.5)
    sim = simulate_ranking(task, N, 1500, seed=1)
    # positive cross-row correlation (ignored by the per-row product) raises the joint frequency a little
    assert abs(sim["frequency"] - model.probability(N)) < 0.08
    # a wrong variance scale would move it far: with twice the variance the probability at N is much lower
    assert model.probability(N / 2) < sim["ci95"][0] - 0.1


def test_check_sample_complexity():
    task = pg.Task(pg.icl_pairs(7), PAIR)
    res = checks.check_sample_complexity(task, beta0=1e-3, level=0.99, replicates=400)
    d = res.details
    assert res.kind == "sampled" and res.passed and d["beta0"] == 1e-3 and d["N_min"] >= 1
    assert d["gaussian_at_N_min"] >= 0.99
    lo, hi = d["gaussian_bracket_at_N_min"]
    assert lo <= d["gaussian_genz_at_N_min"] + 1e-4 and d["gaussian_genz_at_N_min"] <= hi + 1e-4
    assert [s["N"] for s in d["simulation"]][-1] == d["N_min"]
    # the first-order Stage-1 problem does not depend on β0: N_min at β0 = 1e-5 is the same
    assert checks.check_sample_complexity(task, beta0=1e-5, simulate=False).details["N_min"] == d["N_min"]


def test_fit_and_sweep():
    x = np.array([5.0, 10, 20, 40])
    f = fit_t_log_t(x, 3 * x * np.log(x))
    assert abs(f["C"] - 3) < 1e-12 and np.allclose(f["residuals"], 0, atol=1e-12)
    sw = sample_complexity_sweep(pg.chain, PAIR, [5, 6, 7])
    assert sw["T"] == [5, 6, 7] and all(n > 0 for n in sw["N_min"]) and sw["fit"]["C"] > 0
    lo, hi = wilson_interval(50, 100)
    assert lo < 0.5 < hi and math.isclose(lo + hi, 1.0)


def test_errors():
    with pytest.raises(TypeError, match="single-parent"):
        checks.check_sample_complexity("chain")
    with pytest.raises(ValueError, match="level must be < 1"):
        checks.check_sample_complexity(pg.Task(pg.chain(4), PAIR), level=1.0)


def test_full_covariance_gaussian_matches_simulation():
    """With the cross-row covariance (gradient_noise) the Gaussian limit matches the simulated joint event."""
    from popgrad.checks.sample_complexity import joint_gaussian_probability

    task = pg.Task(pg.chain(6), PAIR)
    N = ranking_model(task).n_min(0.5)
    jg = joint_gaussian_probability(task, N, draws=100_000, seed=0)
    sim = simulate_ranking(task, N, 2000, seed=3)
    assert abs(jg["value"] - sim["frequency"]) < 4 * math.sqrt(0.25 / 2000) + 4 * jg["se"]
