"""The ``popgrad.Model`` protocol (DESIGN §26): the reduced model and the CatFormer implement it, ``CatFormerParams``
is its mapping (tuple behaviour unchanged), and ``popgrad.testing.check_model`` catches every kind of broken model."""
import pickle

import numpy as np
import pytest

import popgrad as pg
from popgrad.model.protocol import as_model, check_params
from popgrad.testing import ModelCheckError, check_model


def _task(T=4, S=2):
    return pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=2, seed=0))


def test_the_models_implement_the_protocol():
    for m in (pg.ReducedModel(2, 4), pg.ReducedModel(2, 4, heads=2), pg.CatFormer(2, 4), pg.CatFormer(2, 4, (2, 1))):
        assert isinstance(m, pg.Model) and as_model(m) is m
    assert not isinstance(object(), pg.Model)
    assert check_model(pg.ReducedModel(2, 4), _task())["complex_step"] == "ok"
    mt = pg.MultiParentTask(pg.ngram(5, 3), pg.dirichlet_tensor_prior(S=2, k=2, alpha=1.0, n_atoms=2, seed=0))
    assert check_model(pg.ReducedModel(2, 5, heads=2), mt)["gradient"] == "ok"
    assert check_model(pg.CatFormer(2, 4), _task())["complex_step"].startswith("skipped")
    with pytest.raises(ModelCheckError, match=r"\[predict\]"):  # the linear readout is no distribution off its
        check_model(pg.CatFormer(2, 4, readout="linear"), _task(), scale=0.1)  # construction (DESIGN §18)


def test_catformer_params_are_the_mapping_and_still_a_tuple():
    m = pg.CatFormer(2, 3, heads=(1, 2))
    p = m.init(0.1, 0)
    assert p.keys() == ("A_1", "A_2", "W") == tuple(m.param_shapes())
    assert dict(p)["W"] is p.W and p["A_2"] is p.A[1] and p[1] is p.W and len(p) == 2
    A, W = p
    assert A is p.A
    with pytest.raises(KeyError):
        p["A_3"]
    back = m.check_params(dict(p.items()))
    assert isinstance(back, pg.CatFormerParams) and np.array_equal(back.A[1], p.A[1])
    assert np.array_equal(m.predict(dict(p.items()), [[0, 1, 1]]), m.predict(p, [[0, 1, 1]]))
    with pytest.raises(ValueError, match=r"params lacks 'W'"):
        m.check_params({"A_1": p.A[0], "A_2": p.A[1]})


def test_reduced_model_rows_are_the_reference():
    task = _task(5, 3)
    m = pg.ReducedModel(3, 5)
    p = m.init(0.7, 2)
    seqs, w = task.all_sequences()
    loss, g = m.loss_and_grad_rows(p, seqs, w, 0.2)
    ref = pg.engine.reference.exact_loss_and_grad_numpy(task, p["A1"], p["A2"], eps=0.2)
    assert loss == pytest.approx(ref.loss, rel=1e-13)
    np.testing.assert_allclose(g["A1"], ref.dA1, atol=1e-15)
    np.testing.assert_allclose(g["A2"], ref.dA2, atol=1e-15)
    assert np.allclose(m.layer1_attention(p, seqs[:2])[1, 0], pg.model.first_layer_attention(p["A1"]))
    s = m.start(0.5)
    assert np.array_equal(s["A2"], 0.5 * np.eye(3)) and not s["A1"].any()
    assert pickle.loads(pickle.dumps(m)) == m


class _Good:
    complex_safe = False

    def __init__(self, S=2, T=4):
        self.inner = pg.ReducedModel(S, T)
        self.S, self.T = S, T

    def param_shapes(self):
        return self.inner.param_shapes()

    def init(self, scale, seed):
        return self.inner.init(scale, seed)

    def predict(self, p, seqs):
        return self.inner.predict(p, seqs)

    def loss_and_grad_rows(self, p, seqs, w, eps):
        return self.inner.loss_and_grad_rows(p, seqs, w, eps)

    def layer1_attention(self, p, seqs):
        return self.inner.layer1_attention(p, seqs)


class _WrongGradient(_Good):
    def loss_and_grad_rows(self, p, seqs, w, eps):
        loss, g = super().loss_and_grad_rows(p, seqs, w, eps)
        return loss, {"A1": g["A1"], "A2": 1.01 * g["A2"]}


class _Mean(_Good):
    def loss_and_grad_rows(self, p, seqs, w, eps):
        loss, g = super().loss_and_grad_rows(p, seqs, w, eps)
        n = len(seqs)
        return loss / n * 24, {k: v / n * 24 for k, v in g.items()}


class _NotNormalized(_Good):
    def predict(self, p, seqs):
        return 2 * super().predict(p, seqs)


class _Unseeded(_Good):
    def init(self, scale, seed):
        return self.inner.init(scale, None)


class _FalseComplex(_Good):
    complex_safe = True

    def loss_and_grad_rows(self, p, seqs, w, eps):
        loss, g = super().loss_and_grad_rows({k: np.real(v) for k, v in p.items()}, seqs, w, eps)
        return loss, g


class _Unpicklable(_Good):
    def __init__(self):
        super().__init__()
        self.hook = lambda x: x


class _BadAttention(_Good):
    def layer1_attention(self, p, seqs):
        return np.ones((len(seqs), 1, self.T, self.T)) / self.T


class _NoLayer1:
    S, T = 2, 4


@pytest.mark.parametrize("model, check", [
    (_NoLayer1(), "protocol"), (_Good(3, 4), "sizes"), (_WrongGradient(), "gradient"), (_Mean(), "additivity"),
    (_NotNormalized(), "predict"), (_Unseeded(), "seeds"), (_FalseComplex(), "complex_step"),
    (_Unpicklable(), "pickle"), (_BadAttention(), "layer1_attention"),
])
def test_check_model_names_what_is_wrong(model, check):
    assert check_model(_Good(), _task())["pickle"] == "ok"
    with pytest.raises(ModelCheckError, match=rf"check_model \[{check}\]") as info:
        check_model(model, _task())
    assert "\n" not in str(info.value)


def test_check_params_dtype_and_names():
    m = pg.ReducedModel(2, 3)
    with pytest.raises(TypeError, match="must be real"):
        check_params(m, {"A1": np.zeros((3, 3)) + 0j, "A2": np.zeros((2, 2))})
    out = check_params(m, {"A2": np.eye(2).astype(np.float32), "A1": np.zeros((3, 3), dtype=int)})
    assert list(out) == ["A1", "A2"] and all(v.dtype == np.float64 for v in out.values())
