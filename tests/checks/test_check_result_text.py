"""``print(check)`` and ``repr(check)`` read right; the statement is named first; trajectories print short."""
import numpy as np

import popgrad as pg
from popgrad.checks.results import STATEMENT_LABELS, CheckResult, statement_label


def test_str_and_repr_of_a_check():
    c = CheckResult("gradient_alignment", -0.30487, -0.4, None, "<=", "the statement", {"big": list(range(100))},
                    status="inconclusive", reason="pre-asymptotic")
    text = str(c)
    assert text.splitlines()[0] == ("INCONCLUSIVE gradient_alignment: attention gradients compute the χ² mutual "
                                    "information (Knowl 3)")
    assert "  outcome: -0.3049 > -0.4: not met" in text and "  reason: pre-asymptotic" in text
    assert repr(c) == ("CheckResult(name='gradient_alignment', status='inconclusive', value=-0.3049, rule='<= -0.4', "
                       "kind='exact', reason='pre-asymptotic')")
    assert "99" not in repr(c) + text  # the details stay in .details
    assert c.label == statement_label("gradient_alignment") and c.outcome == "-0.3049 > -0.4: not met"
    # the fields are unchanged: a named tuple of the same 11
    assert c._fields == ("name", "value", "threshold", "passed", "comparison", "statement", "details", "applicable",
                         "kind", "status", "reason")
    na = pg.checks.not_applicable("roots_uniform", "s", "a chain")
    assert str(na).startswith("N/A roots_uniform: in-context roots stay near uniform (Knowl 3.3)")
    assert "outcome: n/a" in str(na)


def test_every_label_names_the_statement_first():
    for name, label in STATEMENT_LABELS.items():
        assert not label.startswith("Knowl") and "(Knowl" in label or "finite-sample" in label, name
    assert statement_label("no_such_check") == "no_such_check"


def test_trajectories_print_short():
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=8, seed=0, floor=0.15, uniform_mean=True))
    traj = pg.train_two_stage(task, steps1=4, steps2=4, record_every=2)
    r = repr(traj)
    assert r.startswith("Trajectory(two-stage, S=2, T=4: ") and "steps 0..8, completed; ε-loss " in r
    assert "array" not in r and "\n" not in r and len(r) < 200
    assert str(traj).splitlines()[1:] == ["  Stage 1 ends at record 2 (step 4)", "  loss curve: monotone"]
    ct = pg.train_catformer(task, pg.CatFormer(2, 4), 3)
    r = repr(ct)
    assert r.startswith("CatFormerTrajectory(S=2, T=4, heads=(1, 1), sgd, exact: 4 records, steps 0..3, completed")
    assert f"loss {float(ct.loss[0]):.6g} -> {float(ct.loss[-1]):.6g} nats" in r and np.isfinite(ct.loss[-1])


def test_a_raw_dirichlet_prior_is_inconclusive_and_says_how_to_meet_the_hypotheses():
    """The API's prior defaults (raw draws) differ from popgrad run's (floor 0.15, uniform mean): said where it shows."""
    raw = pg.Task(pg.chain(4), pg.dirichlet_prior(S=2, alpha=0.1, n_atoms=4, seed=0))
    A1 = np.zeros((4, 4))
    A1[np.arange(1, 3), np.arange(0, 2)] = 12.0
    res = pg.checks.check_graph_recovery(raw, A1)
    assert res.status == "inconclusive" and "floor=0.15, uniform_mean=True" in res.reason
    inside = pg.Task(pg.chain(4), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=8, seed=0, floor=0.15, uniform_mean=True))
    assert pg.checks.check_graph_recovery(inside, A1).status == "pass"
