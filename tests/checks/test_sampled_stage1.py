"""Graph recovery after a sampled Stage 1 (checks.sampled_stage1, issue 30 item 5).

* fresh batches are bit-identical to ``train_two_stage(gradient="sgd")``; the fixed sample is
  SampledObjective's sample;
* a single sample ranks the parent wrongly and Stage 1 on it fails; a large sample recovers with the
  population's attention;
* the N_min search is consistent with its own rates; the probit and the law fits recover planted values;
* one-line errors for bad input; a population that fails gives N_min = inf without sampling.
"""
import math

import numpy as np
import pytest
from scipy.special import ndtr

import popgrad as pg
from popgrad.checks.sample_complexity import (fit_n_min_laws, population_stage1_recovery, probit_level,
                                             recovery_n_min, recovery_rate, sampled_stage1_recovery)
from popgrad.engine.sampled import SampledObjective
from popgrad.engine.single import rows_loss_and_grad

PAIR = pg.FinitePrior([[[.8, .2], [.2, .8]], [[.2, .8], [.8, .2]]])


@pytest.fixture(scope="module")
def task():
    return pg.Task(pg.chain(5), PAIR)


def test_fresh_mode_is_the_trainers_sgd(task):
    out = sampled_stage1_recovery(task, 8, 3, mode="fresh", steps1=25)
    tr = pg.train_two_stage(task, gradient="sgd", batch_size=8, sample_seed=3, steps1=25, steps2=0, record_every=25)
    assert np.array_equal(out.A1, tr.A1[-1])
    assert out.kind == "sampled" and out.N == 8 and out.mode == "fresh"


def test_fixed_mode_descends_on_one_sample(task):
    beta0, lr1 = 1e-3, 2.0
    out = sampled_stage1_recovery(task, 16, 5, mode="fixed", steps1=2, beta0=beta0, lr1=lr1)
    obj = SampledObjective(task, 16, 5)
    eta1 = pg.TrainConfig(beta0=beta0, lr1=lr1).eta1(task)
    A1 = np.zeros((5, 5))
    A2 = beta0 * np.eye(2)
    for _ in range(2):  # the same sample at both steps
        A1 = A1 - eta1 * obj.loss_and_grad(A1, A2).dA1
    np.testing.assert_allclose(out.A1, A1, rtol=1e-12, atol=1e-14)


def test_single_sample_fails_large_sample_recovers(task):
    parents = task.graph.parents
    for seed in range(10):
        smp = task.sample(1, seed)
        dA1 = rows_loss_and_grad(smp.seqs, smp.targets, np.zeros((5, 5)), 1e-3 * np.eye(2), task.default_eps).dA1
        ranked = all(np.all(-dA1[i, parents[i]] > np.delete(-dA1[i, : i + 1], parents[i])) for i in range(1, 5))
        assert not ranked  # one sequence cannot rank the parent strictly first in every row
        out = sampled_stage1_recovery(task, 1, seed)
        assert not out.recovered and not out.parent_first
    pop = population_stage1_recovery(task, gradient="exact")
    assert pop.recovered and pop.kind == "exact" and math.isinf(pop.N)
    big = sampled_stage1_recovery(task, 4000, 0)
    assert big.recovered and big.parent_first
    assert abs(big.min_attention - pop.min_attention) < 2e-3


def test_population_field_matches_exact(task):
    ex = population_stage1_recovery(task, gradient="exact")
    fi = population_stage1_recovery(task, gradient="field")
    assert ex.mode == "exact" and fi.mode == "field"
    np.testing.assert_allclose(fi.A1, ex.A1, atol=1e-3)


def test_n_min_search_is_consistent(task):
    res = recovery_n_min(task, level=0.8, seeds=10)
    assert math.isfinite(res["N_min"]) and res["reason"] == ""
    curve = {c["N"]: c for c in res["curve"]}
    # N_min: the smallest evaluated N from which on every frequency is >= level; the one below it is not
    assert all(c["recovered"] >= 8 for N, c in curve.items() if N >= res["N_min"])
    assert curve[res["N_below"]]["recovered"] < 8 and res["rate_below"] < 0.8
    assert max(curve) >= 2 * res["N_min"]  # the hit was confirmed a doubling above
    assert curve[1]["recovered"] == 0  # N = 1 never recovers (test above)
    fit = res["fit"]
    assert 0.5 < fit["N_level"] / res["N_min"] < 2
    # the same seeds give the same counts
    r = recovery_rate(task, res["N_min"], 10)
    assert r["recovered"] == curve[res["N_min"]]["recovered"]


def test_population_failure_means_no_n(task):
    res = recovery_n_min(task, level=0.9, seeds=5, C=1e-9)  # threshold 1 - 2e-10: Stage 1 cannot reach it
    assert math.isinf(res["N_min"]) and res["runs"] == 0 and "population" in res["reason"]


def test_probit_recovers_planted_curve():
    a, b = -6.0, 2.0
    N = np.array([2.0, 4, 8, 16, 32, 64, 128, 256])
    n = np.full(N.size, 10**6)
    k = np.round(n * ndtr(a + b * np.log(N)))
    fit = probit_level(N, k, n, 0.9)
    want = math.exp((1.2815515655446004 - a) / b)
    assert abs(fit["N_level"] / want - 1) < 1e-2 and fit["log_se"] < 1e-2
    assert abs(fit["b"] - b) < 1e-2 * b
    sep = probit_level([4, 8, 16, 32], [0, 0, 10, 10], [10, 10, 10, 10], 0.9)
    assert sep["separated"] and sep["N_level"] == pytest.approx(math.sqrt(8 * 16))


def test_probit_flat_curve_does_not_overflow():
    # a frequency stuck near one half: the slope is tiny, N_level and its interval run off the float range
    fit = probit_level([1, 2, 4, 8, 16], [5, 5, 5, 5, 5], [10] * 5, 0.99)
    assert fit["N_level"] == math.inf and fit["ci95"][1] == math.inf
    slow = probit_level([1, 2, 4, 8, 16], [5, 5, 6, 5, 6], [10] * 5, 0.99)
    assert slow["N_level"] > 1e6 and slow["log_se"] > 10


def test_law_fits_recover_planted_laws():
    te = np.array([6.0, 8, 10, 12, 16, 20, 24, 32])
    se = np.full(te.size, 0.05)
    log_data = 13.0 + 25.0 * np.log(te)
    f = fit_n_min_laws(te, log_data, se)
    assert abs(f["log_law"]["b"] - 25.0) < 1e-8 and f["log_law"]["chi2"] < 1e-12
    assert f["power_law"]["chi2"] > 0
    pow_data = 20.0 * te**0.4
    g = fit_n_min_laws(te, pow_data, se)
    assert abs(g["power_law"]["e"] - 0.4) < 1e-10 and g["power_law"]["chi2"] < 1e-12
    assert g["power_law"]["se_e"] == pytest.approx(f["power_law"]["se_e"])


def test_bad_input(task):
    with pytest.raises(ValueError, match="mode must be one of"):
        sampled_stage1_recovery(task, 4, mode="batch")
    with pytest.raises(ValueError, match="N must be"):
        sampled_stage1_recovery(task, 0)
    with pytest.raises(TypeError, match="single-parent"):
        sampled_stage1_recovery("chain", 4)
    with pytest.raises(ValueError, match="no non-root"):
        sampled_stage1_recovery(pg.Task(pg.CausalGraph([-1, -1, -1]), PAIR), 4)
    with pytest.raises(ValueError, match="event must be one of"):
        recovery_n_min(task, event="ranked")
    with pytest.raises(ValueError, match="gradient must be"):
        population_stage1_recovery(task, gradient="sgd")
    with pytest.raises(ValueError, match="level must be < 1"):
        probit_level([1, 2], [0, 1], [1, 1], 1.0)
