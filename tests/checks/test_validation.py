"""Issue 13, families 9 and 10: the checks validate their arguments and never PASS or NaN on nothing."""
from __future__ import annotations

import numpy as np
import pytest

import popgrad
from popgrad import checks as C


@pytest.fixture(scope="module")
def task():
    return popgrad.Task(popgrad.chain(4), popgrad.dirichlet_prior(2, 1.0, 2, seed=0, symmetrize=True))


@pytest.mark.parametrize("A1", [np.zeros((3, 3)), np.zeros((4, 5)), [[np.nan] * 4] * 4, "x"])
def test_wrong_A1_is_named(task, A1):
    with pytest.raises((TypeError, ValueError), match="A1"):
        C.check_graph_recovery(task, A1)
    with pytest.raises((TypeError, ValueError), match="A1"):
        C.check_roots(task, A1)


def test_wrong_pi_is_named(task):
    A1, A2 = np.zeros((4, 4)), np.eye(2)
    for pi in (np.ones((3, 3)) / 3, np.ones((2, 2))):
        with pytest.raises(ValueError, match="pi_ood"):
            C.check_ood(task, A1, A2, pi_ood=pi)
    with pytest.raises(TypeError, match="task"):
        C.check_graph_recovery("task", A1)


def test_all_roots_not_applicable():
    t = popgrad.Task(popgrad.CausalGraph([-1, -1, -1]), popgrad.dirichlet_prior(2, 1.0, 2, seed=0, symmetrize=True))
    for res in (C.check_graph_recovery(t, np.zeros((3, 3))), C.check_gradient_alignment(t)):
        assert res.applicable is False
