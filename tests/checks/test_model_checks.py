"""The graph-recovery check of any ``popgrad.Model`` (DESIGN §26): inside its hypotheses it rejects an untrained,
a random and a barely trained model at every size it accepts (the smallest included) and passes a trained one;
its population attention is the full model's; outside its scope it says so."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.checks import check_model_graph_recovery, model_population_attention
from popgrad.checks.model_checks import check_model_head_specialization, check_model_induction_head
from popgrad.train.model_trainer import algorithm1_stages


def _task(T, S):
    return pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=4, seed=0, uniform_mean=True, floor=0.15))


def _trained(task, model, steps):
    traj = pg.train_model(task, model, steps + 1, init=model.start(1e-2), optimizer="gd",
                          stages=algorithm1_stages(task, steps, 1, 2.0, 1.0, 1e-2))
    return traj.final


@pytest.mark.parametrize("T, S", [(8, 2), (9, 2), (8, 3)])  # T = 8: the smallest chain the chance guard decides
def test_rejects_untrained_random_barely_trained_and_passes_trained(T, S):
    task, model = _task(T, S), pg.ReducedModel(S, T)
    assert pg.checks.measure_hypotheses(task).failed(pg.checks.NEEDS["graph_recovery"]) == []  # inside
    for params in (model.start(1e-2), model.init(1.0, 0), model.init(1.0, 1), _trained(task, model, 1),
                   _trained(task, model, 20)):
        res = check_model_graph_recovery(task, model, params)
        assert res.status == "fail", (res.value, res.details)
    res = check_model_graph_recovery(task, model, _trained(task, model, 300))
    assert res.status == "pass" and res.value > 0.9 and res.details["hypotheses"]
    assert res.details["chance_of_passing_at_random"] <= 1e-3


@pytest.mark.parametrize("T", [3, 5])
def test_a_pass_chance_explains_is_inconclusive(T):
    """Below T = 8 a random start passes the rows too often: a trained model's pass is withheld, fails stay."""
    task, model = _task(T, 2), pg.ReducedModel(2, T)
    res = check_model_graph_recovery(task, model, _trained(task, model, 300))
    assert res.status == "inconclusive" and "chance" in res.reason and res.value > 0.9
    assert check_model_graph_recovery(task, model, model.start(1e-2)).status == "fail"


def test_population_attention_is_the_full_models():
    task, model = _task(4, 2), pg.CatFormer(2, 4)
    params = model.init(0.5, 3)
    ours = model_population_attention(task, model, params)
    theirs = pg.checks.catformer.population_attention(task, model, params)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-15)
    assert np.allclose(ours.sum(axis=2), 1.0)


def test_outside_its_scope():
    model = pg.ReducedModel(2, 5, heads=2)
    mt = pg.MultiParentTask(pg.ngram(5, 3), pg.dirichlet_tensor_prior(S=2, k=2, alpha=1.0, n_atoms=2, seed=0))
    assert check_model_graph_recovery(mt, model, model.init(0.1, 0)).status == "not_applicable"
    no_parent = pg.Task(pg.CausalGraph([-1, -1, -1]), _task(3, 2).prior)
    assert check_model_graph_recovery(no_parent, pg.ReducedModel(2, 3), pg.ReducedModel(2, 3).init(0.1, 0)).status \
        == "not_applicable"
    sticky = pg.Task(pg.chain(8), pg.dirichlet_prior(S=2, alpha=0.05, n_atoms=3, seed=0))  # γ fails
    m = pg.ReducedModel(2, 8)
    res = check_model_graph_recovery(sticky, m, _trained(sticky, m, 200))
    assert res.status == "inconclusive" and "gamma" in res.reason
    with pytest.raises(ValueError, match="the model has S = 3"):
        check_model_graph_recovery(sticky, pg.ReducedModel(3, 8), {})


# ------------------------------------------------------------ head specialization and induction head (any model)
def _two_parent(T):
    return pg.MultiParentTask(pg.two_parent(T), pg.dirichlet_tensor_prior(S=2, k=2, alpha=1.0, n_atoms=2, seed=0,
                                                                           symmetrize="full"))


def _split_A1(task, c):
    """Head h attends to slot h's parent with logit c (Knowl 9's construction of the first layer)."""
    T = task.T
    A1 = np.zeros((task.k, T, T))
    for h in range(task.k):
        sp = task.graph.slot_parents(h)
        for i in range(T):
            if sp[i] >= 0:
                A1[h, i, sp[i]] = c
    return A1


def _catformer_split(task, c=8.0, second=8.0):
    """The construction inside the full model: layer-1 head h on slot h's positional block, layer 2 matching the
    copied tokens of both heads against the query's."""
    S, T = task.S, task.T
    model = pg.CatFormer(S, T, heads=(2, 1))
    params = model.zeros()
    A1 = _split_A1(task, c)
    for h in range(2):
        params.A[0][h, S:, S:] = A1[h]
    return model, params


def _nulls(task, model):
    """Untrained, random (two seeds) and barely trained (10 joint GD steps from a small random start)."""
    small = model.init(1e-2, 0)
    barely = pg.train_model(task, model, 10, init=small, optimizer="gd", lr=1.0, lr_schedule="constant").final
    zero = {k: np.zeros(s) for k, s in model.param_shapes().items()}
    return {"untrained": zero, "random": model.init(1.0, 0), "random2": model.init(1.0, 1), "barely trained": barely}


@pytest.mark.parametrize("T", [5, 6])  # T = 5: the smallest two-parent graph the chance guard decides (5.6e-4)
def test_head_specialization_rejects_nulls_and_passes_the_trained_split(T):
    task = _two_parent(T)
    assert pg.checks.measure_hypotheses(task).failed(pg.checks.NEEDS["head_specialization"]) == []  # inside
    cat, built = _catformer_split(task)
    for model in (pg.ReducedModel(2, T, heads=2), cat):
        for name, params in _nulls(task, model).items():
            res = check_model_head_specialization(task, model, params)
            assert res.status == "fail", (type(model).__name__, name, res.value)
    # trained: AdamW from the construction (training from a generic start does not split at sizes that
    # enumerate: docs/guide/paper_statements.md); it stays split, and so does the reduced k-head model's
    trained = pg.train_model(task, cat, 20, init=built, optimizer="adamw", lr=1e-2, lr_schedule="constant").final
    for model, params in ((cat, trained), (pg.ReducedModel(2, T, heads=2),
                                           pg.train_model(task, pg.ReducedModel(2, T, heads=2), 20,
                                                          init={"A1": _split_A1(task, 8.0), "A2": np.zeros((2, 2, 2))},
                                                          optimizer="gd", lr=1.0, lr_schedule="constant").final)):
        res = check_model_head_specialization(task, model, params)
        assert res.status == "pass", (type(model).__name__, res.value, res.reason)
        assert res.details["chance_of_passing_at_random"] <= 1e-3 and res.details["hypotheses"]


def test_head_specialization_below_the_decided_size_and_outside_its_scope():
    task = _two_parent(4)  # 2 x 2 rows: chance 1.4e-2
    cat, built = _catformer_split(task)
    res = check_model_head_specialization(task, cat, built)
    assert res.status == "inconclusive" and "chance" in res.reason and res.value > 0.9
    assert check_model_head_specialization(_task(5, 2), pg.ReducedModel(2, 5), pg.ReducedModel(2, 5).init(0.1, 0)
                                           ).status == "not_applicable"
    one = pg.CatFormer(2, 4, heads=(1, 1))
    assert check_model_head_specialization(task, one, one.zeros()).status == "not_applicable"
    off = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(S=2, k=2, alpha=1.0, n_atoms=2, seed=0))
    res = check_model_head_specialization(off, *_catformer_split(off))
    assert res.status == "inconclusive" and "uniform mean" in res.reason  # the hypotheses: outside Knowl 9


@pytest.mark.parametrize("T, S", [(8, 2), (9, 2), (8, 3)])  # T = 8: the smallest chain the guard decides
def test_induction_head_rejects_nulls_at_every_decided_size(T, S):
    task, model = _task(T, S), pg.ReducedModel(S, T)
    for params in (model.start(1e-2), model.init(1.0, 0), model.init(1.0, 1), _trained(task, model, 1),
                   _trained(task, model, 20)):
        res = check_model_induction_head(task, model, params)
        assert res.status == "fail", (res.value, res.details["layer1_copy_lift"])
    cat = pg.CatFormer(S, T)
    for name, params in _nulls(task, cat).items():
        assert check_model_induction_head(task, cat, params).status == "fail", name
    mt = _two_parent(8)  # two heads on the two-parent graph: decided from T = 8 too (2 / 7!·2)
    for name, params in _nulls(mt, pg.ReducedModel(2, 8, heads=2)).items():
        assert check_model_induction_head(mt, pg.ReducedModel(2, 8, heads=2), params).status == "fail", name


def test_induction_head_passes_trained_models():
    """Algorithm 1 (300 + 300 steps) on the chain at S = 3, T = 8 forms the induction head; the full model's
    construction trained further passes too. At S = 2 the same schedule stops short (lift 0.43-0.50)."""
    task = _task(8, 3)
    model = pg.ReducedModel(3, 8)
    params = pg.train_model(task, model, 600, init=model.start(1e-2), optimizer="gd",
                            stages=algorithm1_stages(task, 300, 300, 2.0, 3.0, 1e-2)).final
    res = check_model_induction_head(task, model, params)
    assert res.status == "pass" and res.details["layer1_copy_lift"] > 0.9, (res.value, res.reason)
    assert res.details["chance_of_passing_at_random"] <= 1e-3 and res.details["hypotheses"]
    # below T = 8 the same training is no evidence
    t7 = _task(7, 3)
    m7 = pg.ReducedModel(3, 7)
    p7 = pg.train_model(t7, m7, 600, init=m7.start(1e-2), optimizer="gd",
                        stages=algorithm1_stages(t7, 300, 300, 2.0, 3.0, 1e-2)).final
    r7 = check_model_induction_head(t7, m7, p7)
    assert r7.status == "inconclusive" and "chance" in r7.reason


def _catformer_chain(task, c=8.0):
    T, S = task.T, task.S
    A1 = np.zeros((T, T))
    for i, p in enumerate(task.graph.parents):
        if p >= 0:
            A1[i, p] = c
    return pg.catformer_from_reduced(A1, c * np.eye(S), S, T)


def test_the_catformer_checks_give_the_same_verdicts():
    """On the same trained CatFormers the generic checks give the CatFormer checks' verdicts and values."""
    from popgrad.checks import catformer as cc

    chain = _task(8, 2)
    model, built = _catformer_chain(chain)
    cases = [built, pg.train_model(chain, model, 20, init=built, optimizer="adamw", lr=1e-2,
                                   lr_schedule="constant").final,
             pg.train_model(chain, model, 20, init=model.init(1e-2, 0), optimizer="adamw", lr=1e-2).final]
    for params in cases:
        a, b = cc.check_induction_head(chain, model, params), check_model_induction_head(chain, model, params)
        assert a.status == b.status and abs(a.value - b.value) <= 1e-12, (a.status, b.status, a.value, b.value)
    assert [cc.check_induction_head(chain, model, p).status for p in cases] == ["pass", "pass", "fail"]
    mt = _two_parent(6)
    cat, split = _catformer_split(mt)
    trained = pg.train_model(mt, cat, 20, init=split, optimizer="adamw", lr=1e-2, lr_schedule="constant").final
    away = pg.train_model(mt, cat, 20, init=cat.init(1e-2, 0), optimizer="adamw", lr=1e-2).final
    for params in (trained, away):
        for old, new in ((cc.check_catformer_head_specialization, check_model_head_specialization),
                         (cc.check_induction_head, check_model_induction_head)):
            a, b = old(mt, cat, params), new(mt, cat, params)
            assert a.status == b.status and abs(a.value - b.value) <= 1e-12, (old.__name__, a.status, b.status)
    assert check_model_head_specialization(mt, cat, trained).status == "pass"
    assert check_model_head_specialization(mt, cat, away).status == "fail"


def test_induction_head_needs_the_query_attention():
    class NoQuery:
        S, T = 2, 8
        _m = pg.ReducedModel(2, 8)

        def param_shapes(self):
            return self._m.param_shapes()

        def init(self, scale, seed):
            return self._m.init(scale, seed)

        def predict(self, params, seqs):
            return self._m.predict(params, seqs)

        def loss_and_grad_rows(self, params, seqs, w, eps):
            return self._m.loss_and_grad_rows(params, seqs, w, eps)

        def layer1_attention(self, params, seqs):
            return self._m.layer1_attention(params, seqs)

    m = NoQuery()
    res = check_model_induction_head(_task(8, 2), m, m.init(0.1, 0))
    assert res.status == "not_applicable" and "query_attention" in res.reason
    one = pg.CatFormer(2, 8, heads=(1,))
    assert check_model_induction_head(_task(8, 2), one, one.zeros()).status == "not_applicable"


def test_query_attention_is_the_models_own_layer_2():
    """The reduced model's prediction is its query attention read out on the tokens (one head and k heads);
    the full model's is its forward's layer-2 query row; check_model checks the member when present."""
    from popgrad.model.catformer import catformer_forward
    from popgrad.testing import check_model

    rng = np.random.default_rng(0)
    for model, task in ((pg.ReducedModel(3, 5), _task(5, 3)), (pg.ReducedModel(2, 5, heads=2), _two_parent(5))):
        params = model.init(0.7, 1)
        seqs = rng.integers(0, model.S, size=(40, model.T))
        Q = model.query_attention(params, seqs)
        f = np.stack([np.sum(Q[:, 0] * (seqs == c), axis=1) for c in range(model.S)], axis=1)
        np.testing.assert_allclose(f, model.predict(params, seqs), rtol=1e-13, atol=1e-15)
        assert check_model(model, task)["query_attention"] == "ok"
    cat = pg.CatFormer(2, 5, heads=(1, 2))
    p = cat.init(0.5, 2)
    seqs = rng.integers(0, 2, size=(30, 5))
    assert np.array_equal(cat.query_attention(p, seqs), catformer_forward(cat, p, seqs)[3][1][:, :, 4, :])
    assert cat.query_attention(p, seqs).shape == (30, 2, 5)
