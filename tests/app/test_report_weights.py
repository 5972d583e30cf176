"""report.json / report.md say which weights are exact and the bound of the others (issue 28 item 2)."""
import json

import pytest

import popgrad as pg
from popgrad.app.report import build_report, render_markdown


def _report(task):
    traj = pg.train_two_stage(task, config=pg.TrainConfig(steps1=1, steps2=1, record_every=1))
    return json.loads(json.dumps(build_report({"S": task.S, "T": task.T}, task, traj, [], {})))


@pytest.mark.parametrize("roots, exact", [("uniform", True), ("stationary", False)])
def test_continuous_prior_weights_are_reported(roots, exact):
    task = pg.Task(pg.chain(3), pg.DirichletPrior(2, 0.5, roots=roots))
    rep = _report(task)
    w = rep["task"]["weights"]
    acc = task.weight_accuracy
    assert w["prior"] == "continuous" and w["exact"] is exact and w["exact"] == acc.exact
    assert w["bound"] == acc.bound and w["method"] == acc.method and w["summary"] == acc.summary()
    assert (w["bound"] == 0.0) if exact else (0.0 < w["bound"] < 1e-6)
    assert "finite prior" not in rep["task"]["note"]
    md = render_markdown(rep)
    assert f"Weights: {acc.summary()}." in md and "continuous prior." in md


def test_finite_prior_weights_are_exact():
    rep = _report(pg.Task(pg.chain(3), pg.dirichlet_prior(2, 1.0, 3, seed=0)))
    w = rep["task"]["weights"]
    assert w == {"prior": "finite", "exact": True, "bound": 0.0, "method": "sum over the finite prior's atoms",
                 "statistical": False, "summary": "weights exact to rounding (sum over the finite prior's atoms)"}
    assert "Weights: weights exact to rounding" in render_markdown(rep)
