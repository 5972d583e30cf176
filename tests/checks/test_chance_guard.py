"""The chance guard (popgrad/checks/chance.py): a pass that a random start reaches too often is inconclusive.

The bound is checked against its null distribution (exchangeable random rows: exact values and a Monte-Carlo
frequency), and the guarded full-model checks against many random starts at each small T (no pass), the case
of the report (S = 2, T = 3, scale 10, seed 14), and at the smallest size the guard decides: untrained,
random and barely trained models rejected, the trained construction passes.
"""
from fractions import Fraction

import numpy as np
import pytest

import popgrad as pg
from popgrad.checks import catformer as cc
from popgrad.checks.catformer_sampled import sampled_catformer_checks, sampled_readouts
from popgrad.checks.chance import CHANCE_LEVEL, chance_guard, chance_of_passing, row_pass_chance
from popgrad.checks.results import ATTENTION_LIFT, CheckResult

SCALES = (0.1, 1.0, 10.0, 100.0)


def _prior(S=2):
    return pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=4, seed=0, floor=0.15, uniform_mean=True)


def test_row_bound_exact_values():
    assert row_pass_chance(2) == Fraction(1, 2) and row_pass_chance(7) == Fraction(1, 7)
    assert row_pass_chance(1) == 1  # one key: always "attends" to it
    assert row_pass_chance(4, lift=0.0) == 1  # the uniform value itself: every row reaches it
    assert row_pass_chance(6, lift=0.1) == Fraction(1, 6) * 4  # a_min = 1/4: four keys can reach it
    assert chance_of_passing([2, 3, 4]) == pytest.approx(1 / 24) and chance_of_passing([]) == 1.0
    assert chance_of_passing(range(2, 9)) == pytest.approx(1 / 40320) and chance_of_passing([2], choices=3) == 1.0
    with pytest.raises(ValueError, match="n_keys"):
        row_pass_chance(0)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_row_bound_against_the_null_distribution(n):
    """Softmax rows of i.i.d. Gaussian scores: at every scale the pass frequency is below the bound, and at a
    large scale it reaches it (the bound is the null's supremum, not a loose constant)."""
    rng = np.random.default_rng(n)
    a_min = 1 / n + ATTENTION_LIFT * (1 - 1 / n)
    draws = 20000
    bound = float(row_pass_chance(n))
    for scale in (0.3, 3.0, 300.0):
        z = scale * rng.standard_normal((draws, n))
        a = np.exp(z - z.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        freq = float(np.mean(a[:, 0] >= a_min))
        se = np.sqrt(bound * (1 - bound) / draws)
        assert freq <= bound + 4 * se, (scale, freq, bound)
        if scale == 300.0:
            assert abs(freq - bound) <= 4 * se, (freq, bound)


def test_the_guard_changes_a_pass_only():
    res = CheckResult("x", 1.0, 0.5, True, ">=", "s", {"rule": "r"})
    out = chance_guard(res, [2])
    assert out.status == "inconclusive" and "chance" in out.reason and out.details["chance_of_passing_at_random"] == 0.5
    assert out.details["rule"] == "r" and "chance_rule" in out.details
    fail = chance_guard(res._replace(passed=False), [2])
    assert fail.status == "fail" and fail.details["chance_of_passing_at_random"] == 0.5
    assert chance_guard(res, range(2, 9)).status == "pass"  # 1/8! <= 1e-3: decided


def test_the_case_of_the_report():
    """S = 2, T = 3, init scale 10, seed 14, one step at lr 1e-9: the loss of a uniform predictor, and both
    checks used to pass; now inconclusive by chance (one scored row with two keys: chance 1/2)."""
    task = pg.Task(pg.chain(3), _prior())
    model = pg.CatFormer(2, 3)
    tr = pg.train_catformer(task, model, 1, lr=1e-9, init=("normal", 10.0, 14))
    assert tr.loss[-1] == pytest.approx(np.log(2), abs=1e-6)
    for r in (cc.check_catformer_graph_recovery(task, model, tr.final), cc.check_induction_head(task, model, tr.final)):
        assert r.value >= ATTENTION_LIFT  # the rule alone is cleared ...
        assert r.status == "inconclusive" and "chance" in r.reason, (r.name, r.status)  # ... by luck


@pytest.mark.parametrize("T", [3, 4, 5, 6, 7, 8])
def test_no_random_start_passes(T):
    """200 random starts at each small T, four scales (0.1 to 100): no graph recovery or induction head passes;
    a start that clears the rule is inconclusive (T <= 7, where chance is above the level)."""
    task = pg.Task(pg.chain(T), _prior())
    model = pg.CatFormer(2, T)
    cleared = 0
    for seed in range(200):
        params = model.init(SCALES[seed % 4], seed)
        for r in (cc.check_catformer_graph_recovery(task, model, params), cc.check_induction_head(task, model, params)):
            assert r.status != "pass", (T, seed, r.name, r.value)
            cleared += r.status == "inconclusive"
            assert r.details["chance_of_passing_at_random"] == pytest.approx(chance_of_passing(range(2, T)))
    if T == 3:
        assert cleared > 0  # the guard is what stops them (at T = 3 about one start in eight clears the rule)


@pytest.mark.parametrize("T", [4, 5, 6])
def test_no_random_start_passes_head_specialization(T):
    """Two heads on a two-parent graph: 200 random starts per T, none passes."""
    task = pg.MultiParentTask(pg.two_parent(T), pg.dirichlet_tensor_prior(S=2, k=2, alpha=1.0, n_atoms=2, seed=0,
                                                                           symmetrize="full"))
    model = pg.CatFormer(2, T, heads=(2, 1))
    for seed in range(200):
        params = model.init(SCALES[seed % 4], seed)
        for r in (cc.check_catformer_head_specialization(task, model, params),
                  cc.check_induction_head(task, model, params)):
            assert r.status != "pass", (T, seed, r.name, r.value)


@pytest.mark.parametrize("T", [3, 4, 8])
def test_no_random_start_passes_the_sampled_check(T):
    task = pg.Task(pg.chain(T), _prior())
    model = pg.CatFormer(2, T)
    for seed in range(200):
        params = model.init(SCALES[seed % 4], seed)
        ro = sampled_readouts(task, model, params, n=64, seed=seed, alpha=1.0, bayes=False)
        for r in sampled_catformer_checks(task, model, params, ro):
            assert r.status != "pass", (T, seed, r.name, r.value)


def _construction(task, T, S=2, c=8.0):
    A1 = np.zeros((T, T))
    for i, p in enumerate(task.graph.parents):
        if p >= 0:
            A1[i, p] = c
    return pg.catformer_from_reduced(A1, c * np.eye(S), S, T)


def test_at_the_smallest_decided_size_nulls_fail_and_the_trained_model_passes():
    """T = 8 is the smallest chain the guard decides (1/7! = 2e-4 <= 1e-3); T = 7 is not (1/6! = 1.4e-3)."""
    T = 8
    task = pg.Task(pg.chain(T), _prior())
    model, built = _construction(task, T)
    trained = pg.train_catformer(task, model, 10, optimizer="sgd", lr=0.1, lr_schedule="constant", init=built).final
    barely = pg.train_catformer(task, model, 10, optimizer="sgd", lr=1.0, lr_schedule="constant").final
    nulls = {"untrained": model.zeros(), "random": model.init(1.0, 0), "barely trained": barely}
    for name, params in nulls.items():
        for r in (cc.check_catformer_graph_recovery(task, model, params), cc.check_induction_head(task, model, params)):
            assert r.status == "fail", (name, r.name, r.status, r.value)
    for params in (built, trained):
        for r in (cc.check_catformer_graph_recovery(task, model, params), cc.check_induction_head(task, model, params)):
            assert r.status == "pass", (r.name, r.value, r.reason)
            assert r.details["chance_of_passing_at_random"] <= CHANCE_LEVEL
    # one position less: the same construction is no longer evidence
    task7 = pg.Task(pg.chain(7), _prior())
    m7, p7 = _construction(task7, 7)
    r = cc.check_catformer_graph_recovery(task7, m7, p7)
    assert r.status == "inconclusive" and r.value > 0.9 and "0.00139" in r.reason
