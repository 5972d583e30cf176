"""The one exact front end (``popgrad.loss_and_grad``) and the generic engine (DESIGN §26): the fast engines stay
behind it bit for bit, the generic engine on a model's rows equals them to rounding (finite and continuous
priors), loss-only calls, ``ε = 0``, the HVP dispatch, and every bad input in one line."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.engine import front, generic


class Plain:
    """A model the front end does not know (no fast engine): any model's rows, through the generic engine."""

    def __init__(self, inner, complex_safe=True):
        self.inner, self.S, self.T, self.complex_safe = inner, inner.S, inner.T, complex_safe

    def param_shapes(self):
        return self.inner.param_shapes()

    def init(self, scale, seed):
        return dict(self.inner.init(scale, seed).items())

    def predict(self, p, seqs):
        return self.inner.predict(p, seqs)

    def loss_and_grad_rows(self, p, seqs, w, eps):
        return self.inner.loss_and_grad_rows(p, seqs, w, eps)

    def layer1_attention(self, p, seqs):
        return self.inner.layer1_attention(p, seqs)

    def default_eps(self, task):
        return self.inner.default_eps(task)


def _task(T=5, S=3, seed=0):
    return pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=3, seed=seed))


def _multi():
    return pg.MultiParentTask(pg.ngram(5, 3), pg.dirichlet_tensor_prior(S=2, k=2, alpha=1.0, n_atoms=2, seed=0))


def _close(a, b, rtol=1e-11):
    assert a.loss == pytest.approx(b.loss, rel=rtol)
    for k in a.grads:
        np.testing.assert_allclose(a.grads[k], b.grads[k], rtol=rtol, atol=1e-14 * (1 + np.max(np.abs(b.grads[k]))))


def test_reduced_model_is_the_old_engine_bit_for_bit():
    task = _task()
    m = pg.ReducedModel(3, 5)
    p = m.init(0.5, 1)
    old = pg.exact_loss_and_grad(task, p["A1"], p["A2"])
    new = pg.loss_and_grad(task, m, p)
    assert new.engine == "reduced" and new.loss == old.loss
    assert np.array_equal(new.grads["A1"], old.dA1) and np.array_equal(new.grads["A2"], old.dA2)
    mt, mm = _multi(), pg.ReducedModel(2, 5, heads=2)
    pm = mm.init(0.5, 2)
    old = pg.exact_loss_and_grad(mt, pm["A1"], pm["A2"])
    new = pg.loss_and_grad(mt, mm, pm)
    assert new.engine == "k-head" and new.loss == old.loss and np.array_equal(new.grads["A1"], old.dA1)


def test_catformer_is_the_old_engine_bit_for_bit():
    task, model = _task(4, 2), pg.CatFormer(2, 4)
    p = model.init(0.3, 0)
    old = pg.catformer_loss_and_grad(task, model, p)
    for params in (p, dict(p.items())):  # the CatFormerParams or the mapping
        new = pg.loss_and_grad(task, model, params)
        assert new.engine == "catformer" and new.loss == old.loss
        assert all(np.array_equal(new.grads[f"A_{i + 1}"], a) for i, a in enumerate(old.dA))
        assert np.array_equal(new.grads["W"], old.dW)


@pytest.mark.parametrize("which", ["single", "multi", "catformer", "continuous"])
def test_generic_engine_equals_the_fast_ones(which):
    if which == "multi":
        task, inner = _multi(), pg.ReducedModel(2, 5, heads=2)
    elif which == "catformer":
        task, inner = _task(4, 2), pg.CatFormer(2, 4)
    elif which == "continuous":
        task, inner = pg.Task(pg.chain(5), pg.DirichletPrior(S=2, alpha=0.5)), pg.ReducedModel(2, 5)
    else:
        task, inner = _task(), pg.ReducedModel(3, 5)
    p = dict(inner.init(0.4, 3).items())
    fast, slow = pg.loss_and_grad(task, inner, p), pg.loss_and_grad(task, Plain(inner), p)
    assert slow.engine == "generic"
    _close(slow, fast)
    assert generic.exact(task, Plain(inner), p, inner.default_eps(task), want_grad=False).loss == \
        pytest.approx(fast.loss, rel=1e-12)


def test_the_generic_engine_never_builds_a_finite_tables():
    """Building a finite prior's weight table would change the other engines' path (and rounding) afterwards."""
    task = _task()
    assert task.prior.K >= 16
    inner = pg.ReducedModel(3, 5)
    p = inner.init(0.5, 1)
    before = pg.exact_loss_and_grad(task, p["A1"], p["A2"])
    pg.loss_and_grad(task, Plain(inner), p)
    after = pg.exact_loss_and_grad(task, p["A1"], p["A2"])
    assert np.array_equal(before.dA1, after.dA1) and task._table is None


def test_eps_zero_infinite_loss_gives_nan_gradients():
    """A sequence without token c predicts f_c = 0 exactly: with ε = 0 the loss is infinite (warned, NaN gradients)."""
    task, inner = _task(4, 2), pg.ReducedModel(2, 4)
    p = inner.init(0.5, 1)
    with pytest.warns(RuntimeWarning, match="infinite"):
        res = pg.loss_and_grad(task, Plain(inner), p, eps=0.0)
    assert np.isinf(res.loss) and all(np.all(np.isnan(g)) for g in res.grads.values())
    with pytest.warns(RuntimeWarning):
        assert np.isinf(pg.loss_and_grad(task, inner, p, eps=0.0).loss)  # as the fast engine


def test_hvp_dispatch():
    task = _task(4, 2)
    m = pg.ReducedModel(2, 4)
    p, v = m.init(0.5, 1), m.init(1.0, 2)
    old = pg.hvp(task, p["A1"], p["A2"], (v["A1"], v["A2"]))
    new = pg.hvp(task, m, p, v)
    assert np.array_equal(new["A1"], old[0]) and np.array_equal(new["A2"], old[1])
    gen = pg.hvp(task, Plain(m), p, v)
    np.testing.assert_allclose(gen["A2"], old[1], rtol=1e-10, atol=1e-14)
    c = pg.CatFormer(2, 4)
    pc, vc = c.init(0.3, 0), c.init(1.0, 1)
    oldc = pg.catformer_hvp(task, c, pc, vc)
    newc = pg.hvp(task, c, pc, vc)
    assert np.array_equal(newc["W"], oldc.W) and np.array_equal(newc["A_1"], oldc.A[0])
    with pytest.raises(TypeError, match="complex_safe = True"):
        pg.hvp(task, Plain(m, complex_safe=False), p, v)
    with pytest.raises(ValueError, match=r"v lacks 'A2'"):
        pg.hvp(task, m, p, {"A1": v["A1"]})


def test_hessian_spectrum_of_any_model():
    """The Model dispatch of hessian_spectrum: a ReducedModel is model='reduced' bit for bit (one head, k heads
    and their antisymmetric subspace), a model without a fast engine runs the seam's HVP (its spectrum the dense
    Hessian's), and a subspace without a known head swap is refused in one line."""
    task = _task(4, 2)
    m = pg.ReducedModel(2, 4)
    p = m.init(0.5, 1)
    old = pg.hessian_spectrum(task, "reduced", (p["A1"], p["A2"]), k=2)
    new = pg.hessian_spectrum(task, m, p, k=2)
    assert np.array_equal(old.values, new.values) and np.array_equal(old.vectors, new.vectors)
    assert new.dim == 20 and new.n_products == old.n_products
    mt, mm = _multi(), pg.ReducedModel(2, 5, heads=2)
    pm = mm.init(0.3, 0)
    for sub in (None, "head_antisymmetric"):
        a = pg.hessian_spectrum(mt, "reduced", (pm["A1"], pm["A2"]), k=2, subspace=sub)
        b = pg.hessian_spectrum(mt, mm, pm, k=2, subspace=sub)
        assert np.array_equal(a.values, b.values) and a.dim == b.dim
    gen = Plain(m)
    g = pg.hessian_spectrum(task, gen, p, k=2)
    cols = [front.hvp(task, gen, p, dict(zip(("A1", "A2"), (e[:16].reshape(4, 4), e[16:].reshape(2, 2)))))
            for e in np.eye(20)]
    H = np.stack([np.concatenate([c["A1"].ravel(), c["A2"].ravel()]) for c in cols], axis=1)
    want = np.linalg.eigvalsh((H + H.T) / 2)
    np.testing.assert_allclose(g.values, np.concatenate([want[:2], want[-2:]]), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(g.values, new.values, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="subspace= needs a head swap.*subspace=None"):
        pg.hessian_spectrum(task, gen, p, k=2, subspace="head_antisymmetric")
    with pytest.raises(ValueError, match="subspace needs two heads"):
        pg.hessian_spectrum(task, m, p, k=2, subspace="head_antisymmetric")
    with pytest.raises(TypeError, match="complex_safe = True"):
        pg.hessian_spectrum(task, Plain(m, complex_safe=False), p, k=2)
    with pytest.raises(ValueError, match=r"params lacks 'A2'"):
        pg.hessian_spectrum(task, m, {"A1": p["A1"]}, k=2)


def test_rows_loss_and_grad_is_the_batch_call():
    task, m = _task(4, 2), pg.ReducedModel(2, 4)
    p = m.init(0.5, 1)
    s = task.sample(50, 0)
    w = s.targets / 50
    fast = front.rows_loss_and_grad(m, p, s.seqs, w, 0.3)
    slow = front.rows_loss_and_grad(Plain(m), p, s.seqs, w, 0.3)
    assert fast.engine == "reduced" and slow.engine == "generic"
    _close(slow, fast)


def test_bad_input_one_line():
    task, m = _task(4, 2), pg.ReducedModel(2, 4)
    p = m.init(0.5, 1)
    cases = [
        ({"A1": p["A1"]}, ValueError, r"params lacks 'A2' \(shape \(2, 2\)\): pass every parameter"),
        ({**p, "B": np.zeros(2)}, ValueError, r"params has 'B', not a parameter of ReducedModel"),
        ({**p, "A2": np.zeros((3, 3))}, ValueError, r"params\['A2'\] must have shape \(2, 2\), got \(3, 3\)"),
        ({**p, "A1": np.full((4, 4), np.nan)}, ValueError, r"params\['A1'\]\[0, 0\] = nan is not finite"),
        ({**p, "A1": "x"}, TypeError, r"params\['A1'\] must be a real array"),
        ([1, 2], TypeError, r"params must be a mapping"),
    ]
    for params, kind, match in cases:
        with pytest.raises(kind, match=match) as info:
            pg.loss_and_grad(task, m, params)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"the model has S = 3, T = 4 but the task has S = 2, T = 4"):
        pg.loss_and_grad(task, pg.ReducedModel(3, 4), p)
    with pytest.raises(TypeError, match=r"model must implement popgrad.Model .* object lacks S, T, param_shapes"):
        pg.loss_and_grad(task, object(), p)
    with pytest.raises(TypeError, match="got the class ReducedModel: instantiate it"):
        pg.loss_and_grad(task, pg.ReducedModel, p)
    with pytest.raises(TypeError, match="task must be"):
        pg.loss_and_grad("task", m, p)
    with pytest.raises(pg.TaskTooLargeError):
        pg.loss_and_grad(pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 2, 0), max_sequences=8), Plain(m), p)


def test_a_model_too_large_is_refused_with_its_size():
    class Huge(Plain):
        def param_shapes(self):
            return {"A1": (4, 4), "A2": (2, 2), "big": (2**40,)}

    with pytest.raises(ValueError, match=r"has 1,099,511,627,796 parameters \(training holds about .*\), more than"):
        pg.loss_and_grad(_task(4, 2), Huge(pg.ReducedModel(2, 4)), {})
