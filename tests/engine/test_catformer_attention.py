"""Exact population-average layer-1 attention of the disentangled transformer (popgrad.engine.catformer_attention)."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.model.catformer import CatFormerParams, catformer_forward

TOL = 1e-12


def _params(model, seed):
    rng = np.random.default_rng(seed)
    p = model.init(1.0, seed)
    return CatFormerParams(p.A, rng.standard_normal(p.W.shape))


@pytest.mark.parametrize("multi", [False, True])
def test_mean_is_the_weighted_average_of_the_reference_attention(multi):
    if multi:
        task = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(3, 2, 1.0, 2, 0))
    else:
        task = pg.Task(pg.random_tree(5, seed=3), pg.dirichlet_prior(3, 0.5, 2, seed=1))
    model = pg.CatFormer(3, 5, heads=(2, 1))
    params = _params(model, 4)
    att = pg.catformer_attention(task, model, params, chunk=50)
    seqs, w = task.all_sequences()
    probs = catformer_forward(model, params, seqs)[3][0]  # (n, 2, T, T)
    expected = np.einsum("n,nhij->hij", w.sum(axis=1), probs)
    np.testing.assert_allclose(att.mean, expected, rtol=0, atol=TOL)
    np.testing.assert_allclose(att.mean.sum(axis=2), 1.0, atol=TOL)
    slots = pg.engine.catformer_attention.parent_slots(task)
    for i in range(5):
        for r in range(slots.shape[1]):
            if slots[i, r] < 0:
                assert np.all(np.isnan(att.parent_mass[:, i, r]))
            else:
                np.testing.assert_array_equal(att.parent_mass[:, i, r], att.mean[:, i, slots[i, r]])
    if multi:
        np.testing.assert_array_equal(slots[-1], task.graph.target_parents)


def test_blocks_rebuild_the_scores():
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 1, seed=0))
    model = pg.CatFormer(2, 4, heads=(1, 1))
    params = _params(model, 0)
    att = pg.catformer_attention(task, model, params)
    A = np.zeros((4 + 2, 4 + 2))
    A[:2, :2], A[:2, 2:], A[2:, :2], A[2:, 2:] = (att.token_token[0], att.token_position[0], att.position_token[0],
                                                  att.position_position[0])
    np.testing.assert_array_equal(A, params.A[0][0])


def test_reduced_model_attention_is_its_first_layer():
    """Knowl 8: the embedded reduced model's layer-1 attention does not depend on the sequence."""
    rng = np.random.default_rng(2)
    task = pg.Task(pg.random_tree(6, seed=0), pg.dirichlet_prior(3, 1.0, 2, seed=0))
    A1 = 2.0 * rng.standard_normal((6, 6))
    model, params = pg.catformer_from_reduced(A1, np.eye(3), 3, 6)
    att = pg.catformer_attention(task, model, params)
    P = pg.model.first_layer_attention(A1)
    np.testing.assert_allclose(att.mean[0], P, rtol=0, atol=TOL)
    np.testing.assert_allclose(att.position[0], P, rtol=0, atol=TOL)
    parents = np.asarray(task.graph.parents)
    for i in range(6):
        if parents[i] >= 0:
            assert att.parent_mass[0, i, 0] == pytest.approx(P[i, parents[i]], abs=TOL)


def test_bad_arguments():
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 1, seed=0))
    with pytest.raises(TypeError, match="CatFormer"):
        pg.catformer_attention(task, None, None)
    with pytest.raises(ValueError, match="S = 2, T = 5"):
        pg.catformer_attention(task, pg.CatFormer(2, 5), pg.CatFormer(2, 5).zeros())
