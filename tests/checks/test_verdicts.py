"""Verdicts users can trust (issue 17): every check driven into each of its statuses through the API,
with its value and threshold pinned on small tasks whose answer is derivable."""
import json

import numpy as np
import pytest

import popgrad as pg
from popgrad import checks as C
from popgrad.checks import scale
from popgrad.engine.baselines import construction_params

PAIR = pg.FinitePrior(np.array([[[.8, .2], [.2, .8]], [[.2, .8], [.8, .2]]]))  # uniform mean, gamma = 0.4
STICKY = pg.FinitePrior.relabeling_closure(np.array([[.8, .2], [.3, .7]]))  # gamma = 0.6, E[tr pi] = 1.5
INSIDE = pg.dirichlet_prior(2, 1.0, 8, seed=0, uniform_mean=True, floor=0.2)  # every Knowl 10 assumption


# ------------------------------------------------------------------ CheckResult and hypotheses
def test_check_result_status_contract():
    ok = C.CheckResult("x", 1.0, 2.0, True, "<=", "s", {})
    assert ok.status == "pass" and ok.passed is True and ok.applicable and ok.reason == ""
    bad = ok._replace(passed=False)
    assert bad.status == "fail" and bad.passed is False
    inc = C.inconclusive(ok, "pre-asymptotic")
    assert inc.status == "inconclusive" and inc.passed is None and inc.applicable and inc.value == 1.0
    na = C.not_applicable("x", "s", "nothing to test")
    assert na.status == "not_applicable" and na.passed is None and not na.applicable and na.reason == "nothing to test"
    d = json.loads(json.dumps(inc.to_dict()))
    assert d["status"] == "inconclusive" and d["passed"] is None and d["reason"] == "pre-asymptotic"
    assert C.all_passed([ok, inc, na]) is True and C.all_passed([ok, bad, inc]) is False
    with pytest.raises(ValueError, match="status must be one of"):
        C.CheckResult("x", 1.0, 2.0, True, "<=", "s", {}, status="maybe")
    with pytest.raises(ValueError, match="needs a reason"):
        C.CheckResult("x", 1.0, 2.0, None, "<=", "s", {}, status="inconclusive")


def test_measure_hypotheses_names_the_figures():
    h = C.measure_hypotheses(pg.Task(pg.chain(6), pg.dirichlet_prior(3, 1.0, 8, seed=0)))
    assert h.items["gamma"].met is False
    assert h.items["gamma"].value == pytest.approx(pg.dirichlet_prior(3, 1.0, 8, seed=0).diagnostics().gamma)
    assert h.items["uniform_mean"].met is False and h.items["symmetric"].met is True
    assert "uniform mean fails (error 0.0" in h.items["uniform_mean"].describe()
    inside = C.measure_hypotheses(pg.Task(pg.chain(6), INSIDE))
    assert inside.all_met and inside.items["gamma"].value >= 0.2 - 1e-12
    assert inside.items["root_fraction"].value == pytest.approx(2 / 6)  # position 0 and the query
    forest = C.measure_hypotheses(pg.Task(pg.CausalGraph([-1] * 10), INSIDE))
    assert forest.items["root_fraction"].met is False  # 1 > 1 - gamma


def test_floor_prior_knob():
    raw = pg.dirichlet_prior(3, 1.0, 8, seed=0)
    fl = pg.dirichlet_prior(3, 1.0, 8, seed=0, floor=0.15)
    np.testing.assert_allclose(fl.base.atoms, 0.85 * raw.base.atoms + 0.05, atol=1e-15)
    assert fl.diagnostics().gamma >= 0.15
    um = pg.dirichlet_prior(3, 1.0, 8, seed=0, floor=0.15, uniform_mean=True).diagnostics()
    assert um.uniform_mean_error <= 1e-15 and um.nondegenerate
    with pytest.raises(ValueError, match="floor must be in"):
        pg.dirichlet_prior(3, 1.0, 8, seed=0, floor=1.0)
    with pytest.raises(ValueError, match="floor"):
        pg.dirichlet_prior(3, 1.0, 8, seed=0, floor=-0.1)


# ------------------------------------------------------------------ alignment
def test_rate_status_thresholds():
    assert C.rate_status(-0.45, True) == ("pass", "")
    assert C.rate_status(-0.4, True)[0] == "pass"
    st, why = C.rate_status(-0.32, True, "over T_eff 10-100")
    assert st == "inconclusive" and "pre-asymptotic: local exponent -0.320 over T_eff 10-100" in why
    assert C.rate_status(-0.5, False)[0] == "fail" and C.rate_status(0.1, True)[0] == "fail"


def test_alignment_rate_pass_inconclusive_fail(monkeypatch):
    res = C.check_alignment_rate(pg.chain, PAIR, [100, 200, 400])
    direct = C.fit_power_law(res.details["sweep_t_eff"], res.details["sweep_distance"]).exponent
    assert res.status == "pass" and res.threshold == -0.4 and res.value == pytest.approx(direct, rel=1e-12)
    assert res.value <= -0.4
    pre = C.check_alignment_rate(pg.chain, INSIDE, [10, 20, 40])
    assert pre.status == "inconclusive" and "pre-asymptotic" in pre.reason and -0.4 < pre.value < 0
    old = C.check_alignment_rate(pg.chain, pg.dirichlet_prior(2, 1.0, 8, seed=0), [10, 20, 40])
    assert old.status == "inconclusive" and "gamma fails (measured 0.000783" in old.reason and "Knowl 10.1" in old.reason

    def rising(graph_for_T, prior, T_values, eps=None):  # a distance that grows with T: the statement fails
        T = [int(t) for t in T_values]
        d = [0.1 * (t / T[0]) ** 0.2 for t in T]
        return {"T": T, "t_eff": [float(t) for t in T], "distance": d, "scaled": list(np.sqrt(T) * d),
                "cosine": [1.0] * len(T), "seconds": [0.0] * len(T)}

    monkeypatch.setattr(scale, "alignment_rate_sweep", rising)
    fail = C.check_alignment_rate(pg.chain, PAIR, [10, 20, 40, 80])
    assert fail.status == "fail" and fail.passed is False and fail.value == pytest.approx(0.2, rel=1e-12)


def test_gradient_alignment_enumeration_statuses():
    task = pg.Task(pg.chain(6), INSIDE)
    one = C.check_gradient_alignment(task)
    assert one.status == "inconclusive" and "no T sweep" in one.reason and np.isnan(one.value)
    sw = C.check_gradient_alignment(task, graph_for_T=pg.chain, T_values=[4, 5, 6, 7])
    assert sw.status in ("pass", "inconclusive", "fail") and sw.threshold == -0.4
    err = sw.details["sweep_angle_error"]
    expect = C.rate_status(sw.value, err[-1] < err[0])[0]
    assert sw.status == expect
    na = C.check_gradient_alignment(pg.Task(pg.CausalGraph([-1, -1, -1, -1]), INSIDE))
    assert na.status == "not_applicable"


# ------------------------------------------------------------------ roots
def test_root_drive_ratio_matches_the_enumerated_field():
    task = pg.Task(pg.icl_pairs(8), PAIR)
    M = pg.engine.stage1_field_numpy(task)
    assert scale.root_drive_ratio(task) == pytest.approx(scale.root_drive_ratio(task, M=M), rel=1e-9)
    assert scale.root_drive_ratio(pg.Task(pg.icl_pairs(10), PAIR)) == pytest.approx(0.1493, abs=5e-5)


def test_roots_statuses():
    assert C.check_roots_at_scale(pg.chain, PAIR, [10, 20]).status == "not_applicable"
    ok = C.check_roots_at_scale(pg.icl_pairs, PAIR, [10, 20, 40], steps1=50)
    r = ok.details["sweep"]["root_drive_ratio"]
    assert ok.status == "pass" and ok.threshold == 0.0 and r[-1] < r[0]
    assert ok.value == pytest.approx(C.fit_power_law([10, 20, 40], r).exponent, rel=1e-12) and ok.value < -0.8
    sticky = C.check_roots_at_scale(pg.icl_pairs, STICKY, [10, 20, 40], steps1=50)
    assert sticky.status == "inconclusive" and "uniform mean fails (error 0.25" in sticky.reason
    assert "Knowl 3.3 assumes Knowl 10.3" in sticky.reason
    raw = C.check_roots_at_scale(pg.icl_pairs, STICKY, [10, 20, 40], steps1=50, hypotheses=None)
    tv = raw.details["sweep"]["root_tv_after_stage1"]
    assert raw.status == "fail" and tv[-1] >= tv[0]  # a sticky mean rewards self-attention: the drift grows


def test_check_roots_single_T():
    task = pg.Task(pg.icl_pairs(6), INSIDE)  # in-context roots 2 and 4
    T = task.T
    learned = np.zeros((T, T))
    for i, p in enumerate(task.graph.parents):
        if p >= 0:
            learned[i, p] = 30.0  # the non-roots learned their parents, the root rows stay at zero
    ok = C.check_roots(task, learned)
    assert ok.status == "pass" and ok.value == 0.0 and ok.threshold == 0.1
    nothing = C.check_roots(task, np.zeros((T, T)))  # uniform roots of a model that learned nothing decide nothing
    assert nothing.status == "inconclusive" and "not learned" in nothing.reason
    A1 = learned.copy()
    A1[4, 4] = 60.0  # row 4 attends to itself: TV to uniform = 4/5
    bad = C.check_roots(task, A1)
    assert bad.status == "fail" and bad.value == pytest.approx(0.8, abs=1e-12)
    assert C.check_roots(pg.Task(pg.chain(6), INSIDE), np.zeros((6, 6))).status == "not_applicable"
    assert C.check_roots(pg.Task(pg.CausalGraph([-1] * 5), INSIDE), np.zeros((5, 5))).status == "not_applicable"
    inc = C.check_roots(pg.Task(pg.icl_pairs(6), STICKY), learned)
    assert inc.status == "inconclusive" and inc.value == 0.0 and "uniform mean" in inc.reason


# ------------------------------------------------------------------ OOD
def test_ood_statuses():
    """Knowl 8's construction at every T of a sweep passes (closer to the construction than to context-free, and
    shrinking); the copy predictor f = e_q, no better than context-free, fails; the default unseen pi~ at these
    T does not separate the references: then nothing is decided (pre-asymptotic), not even for the construction."""
    anti = np.array([[0.05, 0.95], [0.95, 0.05]])
    tasks = [pg.Task(pg.chain(T), INSIDE) for T in (8, 10, 12)]
    pts = [(t, *construction_params(t.graph, 2, 12.0, 30.0)) for t in tasks]
    task, A1, A2 = pts[-1]
    ok = C.check_ood(task, A1, A2, pi_ood=anti, sweep=pts[:-1])
    q = ok.details["sweep_ood_quantile"]
    assert ok.status == "pass" and ok.threshold == C.ood.OOD_FRACTION and q[-1] < q[0]
    d = ok.details
    assert ok.value == pytest.approx((d["ood_quantile"] - d["ood_quantile_construction"])
                                     / (d["ood_quantile_context_free"] - d["ood_quantile_construction"]), rel=1e-12)
    assert d["ood_quantile_context_free"] == pytest.approx(0.45, rel=1e-12)  # uniform mean: p(c|q) = 1/2
    flat = [(t, 60.0 * np.eye(t.T), 60.0 * np.eye(2)) for (t, _, _) in pts]
    bad = C.check_ood(task, flat[-1][1], flat[-1][2], pi_ood=anti, sweep=flat[:-1])
    assert bad.status == "fail" and bad.value >= 1 and bad.details["ood_quantile_shrinks"] is False
    assert bad.details["ood_quantile"] == pytest.approx(0.95, rel=1e-9)
    # the default unseen pi~ at T = 12: the construction does not beat context-free; failing it would blame
    # Knowl 4 (a large-T_eff statement) for its regime: inconclusive, with the value q - q_cf
    same = C.check_ood(task, A1, A2)
    d = same.details
    assert d["ood_quantile_construction"] >= d["ood_quantile_context_free"]
    assert same.status == "inconclusive" and same.passed is None and same.value >= 0
    assert "pre-asymptotic" in same.reason



# ------------------------------------------------------------------ loss convergence and Stage 2
def test_converge_stage2_is_the_limit_of_stage2():
    task = pg.Task(pg.chain(6), INSIDE)
    A1, _ = construction_params(task.graph, 2, 4.0, 1.0)
    opt = C.converge_stage2(task, A1)
    assert opt.kind == "exact" and abs(opt.dloss_dalpha) < 1e-7
    for a in (opt.alpha * 0.9, opt.alpha * 1.1, 0.0):
        assert pg.exact_loss(task, A1, a * np.eye(2)) > opt.loss
    # the 11^T part does not change the model
    assert pg.exact_loss(task, A1, opt.A2 + 3.0) == pytest.approx(opt.loss, rel=1e-12)
    # sampled: the same optimum on a large sample, within its standard error
    obj = pg.engine.sampled.SampledObjective(task, 20000, 0)
    so = C.converge_stage2(task, A1, objective=obj)
    assert so.kind == "sampled" and abs(so.loss - opt.loss) < 5 * so.loss_se
    with pytest.raises(ValueError, match="relabeling-closed"):
        C.converge_stage2(pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 2, 0, symmetrize=False)), np.zeros((4, 4)))


def test_loss_convergence_statuses():
    task = pg.Task(pg.chain(7), INSIDE)
    eps = task.default_eps
    refs = C.reference_losses(task)
    assert refs["L_floor_eps"] <= min(refs["L_bayes_eps"], refs["L_count"])
    # the copy predictor f = e_q: L = -(1/S) log(1 + eps) - (1 - 1/S) log(eps) under a uniform mean
    # (P(y = q) = E[tr pi]/S = 1/S); without convergence information: fail
    bad = C.check_loss_convergence(task, 60.0 * np.eye(7), 60.0 * np.eye(2), 1e-3)
    assert bad.status == "fail" and bad.threshold == 0.0
    assert bad.value == pytest.approx(-0.5 * np.log(1 + eps) - 0.5 * np.log(eps) - refs["L_count"], rel=1e-12)
    # Stage 2 stopped after 2 steps: its gradient has not fallen -> inconclusive, not fail
    short = pg.train_two_stage(task, steps1=0, steps2=2, record_every=1)
    inc = C.check_loss_convergence(task, short.final_A1, short.final_A2, 1e-3, trajectory=short)
    assert inc.status == "inconclusive" and inc.reason.startswith("Stage 2 not converged")
    # run to convergence at the same A1 (= 0): the fail stands
    opt = C.converge_stage2(task, np.zeros((7, 7)))
    done = C.check_loss_convergence(task, np.zeros((7, 7)), opt.A2, 1e-3, optimum=opt)
    assert done.status == "fail" and done.details["stage2_convergence"]["remaining_decrease"] < 1e-9
    # a good A1 with a bad A2: the converged A2 would decide, so not a fail
    A1, _ = construction_params(task.graph, 2, 6.0, 1.0)
    far = C.check_loss_convergence(task, A1, -2.0 * np.eye(2), 1e-3, optimum=C.converge_stage2(task, A1))
    assert far.status in ("inconclusive", "pass") and (far.status == "pass" or "Stage 2 not converged" in far.reason)
    trained = pg.train_two_stage(task, steps1=200, steps2=200, record_every=10)
    good = C.check_loss_convergence(task, trained.final_A1, trained.final_A2, 1e-3, trajectory=trained)
    assert good.status == "pass" and good.value <= 0
    assert good.details["excess_over_floor_eps"] >= 0
    na = C.check_loss_convergence(pg.Task(pg.CausalGraph([-1] * 5), INSIDE), np.zeros((5, 5)), np.eye(2), 1e-3)
    assert na.status == "not_applicable"
    sticky = C.check_loss_convergence(pg.Task(pg.chain(7), STICKY), np.zeros((7, 7)), np.zeros((2, 2)), 1e-3)
    assert sticky.status == "inconclusive" and "uniform mean" in sticky.reason and sticky.value > 0


def test_sampled_checks_statuses():
    task = pg.Task(pg.chain(7), INSIDE)
    obj = pg.engine.sampled.SampledObjective(task, 5000, 0)
    small = C.check_loss_convergence_sampled(obj, np.zeros((7, 7)), np.zeros((2, 2)))
    assert small.status == "inconclusive" and small.kind == "sampled" and "SE" in small.reason
    big = pg.Task(pg.chain(12), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=4, seed=0, floor=0.15, uniform_mean=True))
    obj12 = pg.engine.sampled.SampledObjective(big, 200_000, 0)  # 2 SE resolves 0.1 of the margin
    bad = C.check_loss_convergence_sampled(obj12, np.zeros((12, 12)), np.zeros((2, 2)))
    assert bad.status == "fail" and bad.kind == "sampled" and "rule" in bad.details
    tr = pg.train_two_stage(big, steps1=100, steps2=100)
    assert C.check_loss_convergence_sampled(obj12, tr.final_A1, tr.final_A2).status == "pass"
    few = pg.engine.sampled.SampledObjective(big, 2000, 0)
    res = C.check_loss_convergence_sampled(few, tr.final_A1, tr.final_A2)
    assert res.status == "inconclusive" and "SE" in res.reason
    A1, _ = construction_params(task.graph, 2, 6.0, 1.0)
    far = C.check_loss_convergence_sampled(obj, A1, -2.0 * np.eye(2), optimum=C.converge_stage2(task, A1, objective=obj))
    assert far.status in ("inconclusive", "pass")
    ood = C.check_ood_sampled(task, A1, 3.0 * np.eye(2), n=4000)
    assert ood.threshold in (C.ood.OOD_FRACTION, 0.0) and "rule" in ood.details


def test_converged_loss_sweep_exact():
    rows = C.converged_loss_sweep(pg.chain, INSIDE, [4, 5, 6], steps1=50)
    assert rows["kind"] == ["exact"] * 3 and rows["T"] == [4, 5, 6]
    for T, L, a in zip(rows["T"], rows["loss"], rows["alpha"]):
        task = pg.Task(pg.chain(T), INSIDE)
        A1 = pg.train_two_stage(task, steps1=50, steps2=0, record_every=50).final_A1
        assert L == pytest.approx(pg.exact_loss(task, A1, a * np.eye(2)), rel=1e-12)
        assert L >= pg.floor_loss(task) - 1e-12
    np.testing.assert_allclose(np.array(rows["loss"]) - rows["L_star_eps"], rows["excess_eps"], rtol=0, atol=1e-15)
    assert rows["fit"].exponent == pytest.approx(C.fit_power_law(rows["t_eff"], rows["excess_eps"]).exponent)
    lo, hi = rows["exponent_interval"]
    assert lo <= rows["fit"].exponent <= hi
