"""Sampled read-outs of the full model (issue 30 item 2) against the exact ones at a size that enumerates."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.checks import catformer as cc
from popgrad.checks.catformer_sampled import sampled_catformer_checks, sampled_readouts
from popgrad.engine.baselines import official_bayes_loss


@pytest.fixture(scope="module")
def setup():
    task = pg.Task(pg.random_tree(6, seed=1, root_prob=0.3), pg.dirichlet_prior(2, 0.5, 4, seed=0))
    model = pg.CatFormer(2, 6)
    params = model.init(0.7, 5)
    params = pg.CatFormerParams(params.A, np.random.default_rng(1).normal(size=params.W.shape))
    return task, model, params, sampled_readouts(task, model, params, n=20000, seed=3, alpha=0.5)


def test_sampled_estimates_agree_with_the_exact_values_within_their_se(setup):
    task, model, params, ro = setup
    L = ro["losses"]
    exact = pg.catformer_loss_and_grad(task, model, params).loss
    assert abs(L["L_model"]["value"] - exact) < 5 * L["L_model"]["se"]
    ob = official_bayes_loss(task, alpha=0.5)
    assert abs(L["L_official_bayes"]["value"] - ob) < 5 * L["L_official_bayes"]["se"]
    bayes = pg.bayes_loss(task)
    assert abs(L["L_bayes"]["value"] - bayes) < 5 * L["L_bayes"]["se"]
    P = cc.population_attention(task, model, params)
    z = (ro["population"]["mean"] - P) / np.where(ro["population"]["se"] > 0, ro["population"]["se"], 1.0)
    low = np.tri(6, dtype=bool)[None]
    assert np.all(np.abs(z[np.broadcast_to(low, z.shape)]) < 6)  # 21 entries, 6 SE: no false alarms
    # the differences are taken on the same sample
    assert L["model_minus_bayes"]["value"] == pytest.approx(L["L_model"]["value"] - L["L_bayes"]["value"], abs=1e-12)


def test_exact_parts_equal_the_exact_readouts(setup):
    task, model, params, ro = setup
    np.testing.assert_array_equal(ro["positional"]["matrix"], cc.positional_attention(model, params))
    ind = cc.check_induction_head(task, model, params)
    assert any(ro["induction"]["margin"] == v for v in ind.details["token_block_margins"].values())
    mm = ro["induction"]["matching_mass"]
    assert abs(mm["value"] - ind.details["query_attention_on_matching_parent_tokens"]) < 5 * mm["se"]


def test_sampled_checks_are_labelled(setup):
    task, model, params, ro = setup
    res = {c.name: c for c in sampled_catformer_checks(task, model, params, ro)}
    exact = cc.check_catformer_graph_recovery(task, model, params)
    assert res["catformer_graph_recovery"].kind == "sampled"
    assert res["catformer_graph_recovery"].value == exact.value  # argmaxes are far apart at this size
    assert res["head_specialization"].status == "not_applicable"
    assert res["induction_head"].kind == "exact" and res["induction_head"].status == "inconclusive"


def test_bad_arguments():
    task = pg.Task(pg.chain(4), pg.DirichletPrior(2, 0.5))
    with pytest.raises(ValueError, match="n"):
        sampled_readouts(task, pg.CatFormer(2, 4), pg.CatFormer(2, 4).zeros(), n=1)
    with pytest.raises(ValueError, match="T = 5"):
        sampled_readouts(task, pg.CatFormer(2, 5), pg.CatFormer(2, 5).zeros())
    with pytest.raises(TypeError, match="task"):
        sampled_readouts("chain", pg.CatFormer(2, 4), pg.CatFormer(2, 4).zeros())
