"""The scale of the idealized Stage-1 gradient, ``β0/(S·T)``, against the exact first-order field (issue 23).

The field's gradient ``-(β0/T) J(P) M`` is exact to first order in ``β0``
(``tests/engine/test_field.py`` checks it against the enumerated ``dA1``, and
the first test here does again, independently of the idealized formula).
Knowl 3 says ``S·M_i = g_i + O(T_eff^{-1/2})``, so the norm ratio
``‖field‖ / ‖idealized‖`` on the non-root context rows must rise towards 1 as
``T`` grows. Cosines and signs ignore scale; this does not: with ``β0/T``
instead of ``β0/(S·T)`` the ratio would tend to ``1/S``.
"""
import numpy as np
import pytest

import popgrad as pg
from popgrad.engine.field import field_grad_A1, stage1_field
from popgrad.theory.information import idealized_grad_A1

#: π = [[.8,.2],[.2,.8]] and its relabeling at equal weights (γ = 0.4, uniform mean).
PRIOR = pg.FinitePrior(np.array([[[.8, .2], [.2, .8]], [[.2, .8], [.8, .2]]]), np.array([.5, .5]))
T_VALUES = (10, 20, 40, 80, 160, 320)


def ratio(T, beta0=1e-6):
    task = pg.Task(pg.chain(T), PRIOR)
    A1 = np.zeros((T, T))
    rows = np.arange(1, T - 1)  # non-root context rows
    field = field_grad_A1(stage1_field(task).M, A1, beta0)[rows]
    ideal = idealized_grad_A1(task, A1, beta0)[rows]
    return float(np.linalg.norm(field) / np.linalg.norm(ideal))


def test_field_gradient_is_the_exact_first_order_gradient():
    """The reference of the ratio: the field's ``dA1`` equals the enumerated one at β0 = 1e-7 (chain, T = 8)."""
    T, beta0 = 8, 1e-7
    task = pg.Task(pg.chain(T), PRIOR)
    A1 = np.random.default_rng(0).normal(size=(T, T))
    exact = pg.exact_loss_and_grad(task, A1, beta0 * np.eye(2)).dA1
    field = field_grad_A1(stage1_field(task).M, A1, beta0)
    assert np.abs(field - exact).max() <= 1e-5 * np.abs(exact).max()


def test_field_to_idealized_norm_ratio_rises_to_one():
    r = np.array([ratio(T) for T in T_VALUES])
    assert np.all(np.diff(r) > 0), r  # monotone increase
    assert np.all(r < 1.0), r
    assert 0.6 < r[0] < 0.8 and r[-1] > 0.88, r
    gap = 1.0 - r  # shrinks with T: at least halved over the sweep, about like T^{-1/4} here
    assert gap[-1] < 0.5 * gap[1], gap
    slope = np.polyfit(np.log(T_VALUES[2:]), np.log(gap[2:]), 1)[0]
    assert -0.6 < slope < -0.15, slope


def test_idealized_scale_is_beta0_over_S_T():
    """At ``A1 = 0`` (``P_i`` uniform over ``j ≤ i``) row ``i`` of the prediction is ``-(β0/(S·T))(g_ij - ḡ_i)/(i+1)``."""
    S, T, beta0 = 3, 7, 0.37
    task = pg.Task(pg.random_tree(T, seed=2, root_prob=0.2), pg.dirichlet_prior(S, 1.0, 3, seed=4))
    g = pg.idealized_gradient(task)
    d = idealized_grad_A1(task, np.zeros((T, T)), beta0)
    for i in range(T):
        row = g[i, : i + 1]
        want = -(beta0 / (S * T)) * (row - row.mean()) / (i + 1)
        np.testing.assert_allclose(d[i, : i + 1], want, rtol=0, atol=1e-15 * max(1.0, np.abs(want).max()))
        assert np.all(d[i, i + 1:] == 0)


def test_a_given_g_is_used_and_checked():
    task = pg.Task(pg.chain(6), PRIOR)
    A1 = np.random.default_rng(5).normal(size=(6, 6))
    g = pg.idealized_gradient(task)
    np.testing.assert_array_equal(idealized_grad_A1(task, A1, 0.1, g=g), idealized_grad_A1(task, A1, 0.1))
    np.testing.assert_array_equal(idealized_grad_A1(task, A1, 0.1, g=2 * g), 2 * idealized_grad_A1(task, A1, 0.1))
    with pytest.raises(ValueError, match="g must have shape"):
        idealized_grad_A1(task, A1, 0.1, g=g[:5, :5])
