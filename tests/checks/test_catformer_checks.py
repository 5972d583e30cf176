"""Checks of the full model (popgrad/checks/catformer.py): on constructions where the answer is known."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.checks import catformer as cc
from popgrad.model.catformer import catformer_forward
from popgrad.model.reduced import first_layer_attention

RTOL = 1e-12


@pytest.fixture(scope="module")
def task():
    return pg.Task(pg.chain(5), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=3, seed=0))


@pytest.fixture(scope="module")
def task8():  # the smallest chain the chance guard decides (checks/chance.py: 1/7! <= 1e-3)
    return pg.Task(pg.chain(8), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=3, seed=0))


@pytest.fixture(scope="module")
def two_parent_task():
    return pg.MultiParentTask(pg.two_parent(6), pg.dirichlet_tensor_prior(S=2, k=2, alpha=1.0, n_atoms=2, seed=0,
                                                                               symmetrize="full"))


def _parent_A1(parents, T, c=6.0):
    A1 = np.zeros((T, T))
    for i, p in enumerate(parents):
        if p >= 0:
            A1[i, p] = c
    return A1


def test_population_attention_positional_is_softmax_of_A1(task):
    """With Ã^(1) in the position-position block only, attention is the same for every sequence."""
    A1 = np.tril(np.random.default_rng(0).standard_normal((5, 5)))
    model, params = pg.catformer_from_reduced(A1, np.eye(2), 2, 5)
    P = cc.population_attention(task, model, params)
    np.testing.assert_allclose(P[0], first_layer_attention(A1), rtol=RTOL, atol=1e-15)
    np.testing.assert_allclose(cc.positional_attention(model, params)[0], first_layer_attention(A1), rtol=RTOL)


def test_population_attention_equals_weighted_forward(two_parent_task):
    """Token-dependent scores: the weighted mean of the model's own forward attention over every sequence."""
    model = pg.CatFormer(2, 6, heads=(2, 1))
    params = model.init(1.0, 4)
    want = np.zeros((2, 6, 6))
    for seqs, w in two_parent_task.enumerate():
        probs = catformer_forward(model, params, seqs)[3][0]
        want += np.einsum("n,nhij->hij", w.sum(axis=1), probs)
    got = cc.population_attention(two_parent_task, model, params)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.sum(axis=2), 1.0, rtol=1e-12)
    assert np.all(np.triu(got, 1) == 0)


def test_graph_recovery_and_induction_head_on_the_construction(task8):
    task = task8
    T, S = 8, 2
    model, params = pg.catformer_from_reduced(_parent_A1(task.graph.parents, T), 3.0 * np.eye(S), S, T)
    rec = cc.check_catformer_graph_recovery(task, model, params)
    assert rec.passed and rec.details["fraction_of_rows_with_argmax_parent"] == 1.0
    assert rec.details["mean_attention_to_parent"] > 0.9 and rec.value >= cc.ATTENTION_LIFT
    ind = cc.check_induction_head(task, model, params)
    assert ind.passed and ind.value >= cc.ATTENTION_LIFT
    d = ind.details
    assert d["query_attention_on_matching_parent_tokens"] > d["same_under_uniform_attention"]
    # anti-induction (query prefers the other token) and no second layer signal both fail
    _, anti = pg.catformer_from_reduced(_parent_A1(task.graph.parents, T), -3.0 * np.eye(S), S, T)
    assert not cc.check_induction_head(task, model, anti).passed
    _, flat = pg.catformer_from_reduced(_parent_A1(task.graph.parents, T), np.zeros((S, S)), S, T)
    assert not cc.check_induction_head(task, model, flat).passed
    # a first layer attending to the previous-but-one position misses the chain's parents
    wrong = _parent_A1([-1, -1] + list(range(T - 2)), T)
    _, p_wrong = pg.catformer_from_reduced(wrong, np.eye(S), S, T)
    bad = cc.check_catformer_graph_recovery(task, model, p_wrong)
    assert not bad.passed and bad.details["rows_with_argmax_not_parent"]


def test_head_specialization_of_the_full_model(two_parent_task):
    T, S = 6, 2
    g = two_parent_task.graph
    model = pg.CatFormer(S, T, heads=(2, 1))
    params = model.zeros()
    for h in range(2):
        params.A[0][h, S:, S:] = _parent_A1(g.slot_parents(h), T, c=8.0)
    res = cc.check_catformer_head_specialization(two_parent_task, model, params)
    assert res.passed and res.details["one_to_one"]
    same = model.zeros()
    for h in range(2):
        same.A[0][h, S:, S:] = _parent_A1(g.slot_parents(1), T, c=8.0)
    assert cc.check_catformer_head_specialization(two_parent_task, model, same).passed is False
    assert not cc.check_catformer_head_specialization(two_parent_task, pg.CatFormer(S, T, heads=(1, 1)),
                                                      pg.CatFormer(S, T, heads=(1, 1)).zeros()).applicable


def test_heads_difference():
    A = np.zeros((3, 2, 4, 4))
    A[1, 0, 0, 0] = 3.0
    A[2, 1, 1, 1] = 4.0
    A[2, 0, 0, 0] = 3.0
    np.testing.assert_allclose(cc.heads_difference(A), [0.0, 3.0, 5.0])
    with pytest.raises(ValueError, match="record stack"):
        cc.heads_difference(np.zeros((3, 1, 4, 4)))


def test_bad_arguments(task):
    with pytest.raises(TypeError, match="model must be a popgrad.CatFormer"):
        cc.population_attention(task, "m", None)
    with pytest.raises(ValueError, match="the task has"):
        m = pg.CatFormer(2, 6)
        cc.population_attention(task, m, m.zeros())


def test_slot_attention_and_soft_split(two_parent_task):
    g = two_parent_task.graph
    T = g.T
    P = np.zeros((2, T, T))
    for h in range(2):
        par = g.slot_parents(h)
        for i in range(T):
            P[h, i, par[i] if par[i] >= 0 else 0] = 1.0
    M = cc.slot_attention(g, P)
    np.testing.assert_allclose(M, np.eye(2))
    assert cc.soft_split(M) and cc.soft_split(M[::-1])
    assert not cc.soft_split(np.array([[0.6, 0.4], [0.7, 0.3]]))
    assert not cc.soft_split(np.array([[0.5, 0.5], [0.2, 0.7]]))
