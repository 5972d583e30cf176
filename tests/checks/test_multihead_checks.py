"""The checks of the k-head model (popgrad.checks.theorems, issue 7): head specialization, loss, roots."""
import numpy as np

import popgrad as pg
from popgrad import checks
from popgrad.engine import baselines


def small_task(graph=None, S=2, n_atoms=2, seed=0, symmetrize=True):
    graph = pg.two_parent(6) if graph is None else graph
    return pg.MultiParentTask(graph, pg.dirichlet_tensor_prior(S, graph.k, 1.0, n_atoms, seed, symmetrize=symmetrize))


def test_head_specialization_check():
    task = small_task(pg.two_parent(7), symmetrize="full")  # uniform mean: inside the hypotheses
    A1, _ = baselines.construction_params(task.graph, 2, 8.0, 1.0)
    res = checks.check_head_specialization(task, A1)
    assert res.passed and res.value >= checks.ATTENTION_LIFT and res.applicable and res.status == "pass"
    assert res.details["agreement_fraction"] == 1.0
    # the same heads under a prior without a uniform mean: the value stands, the verdict is withheld
    off = checks.check_head_specialization(small_task(pg.two_parent(7)), A1)
    assert off.status == "inconclusive" and off.passed is None and off.value == res.value
    assert "uniform mean fails" in off.reason and "Knowl 10.3" in off.reason
    assert res.details["assignment_head_to_slot"] == {0: 0, 1: 1}
    assert res.details["slot_by_head_and_row"][1] == {i: 1 for i in (2, 3, 4, 5, 6)}
    swapped = checks.check_head_specialization(task, A1[::-1])
    assert swapped.passed and swapped.details["assignment_head_to_slot"] == {0: 1, 1: 0}
    both = checks.check_head_specialization(task, np.stack([A1[1], A1[1]]))
    assert not both.passed and both.details["agreement_fraction"] == 0.5 and both.details["disagreeing_head_row_pairs"]
    diag = checks.check_head_specialization(task, np.stack([8.0 * np.eye(7)] * 2))
    assert not diag.passed and -1 in diag.details["slot_by_head_and_row"][0].values()
    na = checks.not_applicable("gradient_alignment", "stmt", "no idealized gradient for k heads")
    d = na.to_dict()
    assert d["applicable"] is False and d["value"] is None and d["details"]["reason"].startswith("no idealized")
    assert d["status"] == "not_applicable" and d["passed"] is None and d["reason"].startswith("no idealized")


def test_loss_convergence_and_roots_multi():
    task = small_task(pg.two_parent(6))
    refs = checks.reference_losses(task)
    assert refs["L_star"] <= refs["L_bayes"]
    A1, A2 = baselines.construction_params(task.graph, 2, 8.0, 3.0)
    res = checks.check_loss_convergence(task, A1, A2, beta0=1.0, references=refs)
    assert res.name == "loss_convergence" and res.details["loss_final"] == pg.exact_loss(task, A1, A2)
    roots = checks.check_roots(task, A1)  # root 1 attends to {0, 1} uniformly at the construction
    assert roots.status == "inconclusive" and roots.value == 0.0 and "uniform mean" in roots.reason
    full = small_task(pg.two_parent(6), symmetrize="full")
    roots = checks.check_roots(full, A1)
    assert roots.passed and roots.value == 0.0 and roots.status == "pass"
