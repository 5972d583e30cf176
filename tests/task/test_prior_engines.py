"""Every engine on a continuous-prior task reads the weight table (DESIGN §20): NumPy references fed the same
weights, finite differences, and table path = per-atom path on a finite prior."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.engine import table as _table
from popgrad.engine.catformer import catformer_loss, catformer_loss_and_grad, catformer_loss_and_grad_numpy
from popgrad.engine.reference import exact_loss_and_grad_numpy


def _max_diff(r, ref):
    return max(abs(r.loss - ref.loss), float(np.abs(r.dA1 - ref.dA1).max()), float(np.abs(r.dA2 - ref.dA2).max()))


def _fd(f, x, idx, h=1e-5):
    xp, xm = x.copy(), x.copy()
    xp[idx] += h
    xm[idx] -= h
    return (f(xp) - f(xm)) / (2 * h)


@pytest.mark.parametrize("roots", ["uniform", "stationary"])
def test_reduced_single(roots):
    task = pg.Task(pg.random_tree(6, 4, 0.5), pg.DirichletPrior(2, 0.1, roots))
    rng = np.random.default_rng(1)
    A1, A2 = rng.normal(size=(6, 6)), rng.normal(size=(2, 2))
    r = pg.exact_loss_and_grad(task, A1, A2)
    assert _max_diff(r, exact_loss_and_grad_numpy(task, A1, A2)) < 1e-12
    assert abs(_fd(lambda a: pg.exact_loss(task, a, A2), A1, (4, 2)) - r.dA1[4, 2]) < 1e-8
    assert abs(_fd(lambda a: pg.exact_loss(task, A1, a), A2, (1, 0)) - r.dA2[1, 0]) < 1e-8
    assert abs(pg.exact_loss(task, A1, A2) - r.loss) < 1e-14
    # A2's row range past the prefix engine's limit: the rows path over the table
    big = 600.0 * np.eye(2)
    assert _max_diff(pg.exact_loss_and_grad(task, A1, big), exact_loss_and_grad_numpy(task, A1, big)) < 1e-12


def test_kheads():
    task = pg.MultiParentTask(pg.two_parent(5), pg.DirichletTensorPrior(2, 2, 0.1))
    rng = np.random.default_rng(2)
    A1, A2 = rng.normal(size=(2, 5, 5)), rng.normal(size=(2, 2, 2))
    r = pg.exact_loss_and_grad(task, A1, A2)
    assert _max_diff(r, exact_loss_and_grad_numpy(task, A1, A2)) < 1e-12
    assert abs(_fd(lambda a: pg.exact_loss(task, a, A2), A1, (1, 3, 1)) - r.dA1[1, 3, 1]) < 1e-8
    assert abs(_fd(lambda a: pg.exact_loss(task, A1, a), A2, (0, 1, 0)) - r.dA2[0, 1, 0]) < 1e-8


@pytest.mark.parametrize("task", [
    pg.Task(pg.random_tree(5, 1, 0.5), pg.DirichletPrior(2, 0.1)),
    pg.MultiParentTask(pg.two_parent(5), pg.DirichletTensorPrior(2, 2, 0.1)),
], ids=["single-stationary", "two-parent"])
def test_catformer(task):
    heads = (1, 1) if isinstance(task, pg.Task) else (1, 2)
    model = pg.CatFormer(task.S, task.T, heads=heads)
    params = model.init(0.7, 3)
    r = catformer_loss_and_grad(task, model, params)
    ref = catformer_loss_and_grad_numpy(task, model, params)
    assert abs(r.loss - ref.loss) < 1e-12
    assert max(float(np.abs(a - b).max()) for a, b in zip(r.dA, ref.dA)) < 1e-12
    assert float(np.abs(r.dW - ref.dW).max()) < 1e-12
    W = params.W.copy()

    def loss_W(x):
        return catformer_loss(task, model, params._replace(W=x))

    assert abs(_fd(loss_W, W, (1, 0)) - r.dW[1, 0]) < 1e-8


def test_table_equals_per_atom_path(monkeypatch):
    """On a finite prior the one rule's two paths agree to 1e-13 (k-head and full model)."""
    mt = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(2, 2, 0.3, 80, 0))
    st = pg.Task(pg.random_tree(5, 2, 0.5), pg.dirichlet_prior(2, 0.3, 40, 1))
    assert mt.prior.K >= _table.TABLE_MIN_ATOMS and st.prior.K >= _table.TABLE_MIN_ATOMS
    assert not _table.use_table(mt, per_atom=True)  # one-off calls: the per-atom path until the table is prepared
    assert _table.prepare_table(mt) and _table.prepare_table(st)
    rng = np.random.default_rng(5)
    A1, A2 = rng.normal(size=(2, 5, 5)), rng.normal(size=(2, 2, 2))
    model = pg.CatFormer(2, 5)
    params = model.init(0.7, 1)
    B1, B2 = rng.normal(size=(5, 5)), rng.normal(size=(2, 2))  # not in span{I, 11^T}: no orbit reduction
    via_table = (pg.exact_loss_and_grad(mt, A1, A2), catformer_loss_and_grad(st, model, params),
                 pg.exact_loss_and_grad(st, B1, B2))
    monkeypatch.setattr(_table, "TABLE_MIN_ATOMS", 10**9)
    assert not _table.use_table(mt, per_atom=True)
    per_atom = (pg.exact_loss_and_grad(mt, A1, A2), catformer_loss_and_grad(st, model, params),
                pg.exact_loss_and_grad(st, B1, B2))
    assert _max_diff(via_table[0], per_atom[0]) < 1e-13
    assert _max_diff(via_table[2], per_atom[2]) < 1e-13
    a, b = via_table[1], per_atom[1]
    assert abs(a.loss - b.loss) < 1e-13
    assert max(float(np.abs(x - y).max()) for x, y in zip(a.dA, b.dA)) < 1e-13
    assert float(np.abs(a.dW - b.dW).max()) < 1e-13


def test_finite_table_equals_enumeration():
    task = pg.Task(pg.chain(5), pg.dirichlet_prior(3, 0.3, 4, 0))
    _, w = task.all_sequences()
    np.testing.assert_array_equal(task.weight_table(), w)


def test_sampled_on_continuous_prior():
    task = pg.Task(pg.chain(6), pg.DirichletPrior(2, 0.1))
    rng = np.random.default_rng(0)
    A1, A2 = rng.normal(size=(6, 6)), rng.normal(size=(2, 2))
    r = pg.sampled_loss_and_grad(task, A1, A2, 4000, 1)
    ex = pg.exact_loss_and_grad(task, A1, A2)
    assert np.isfinite(r.loss) and abs(r.loss - ex.loss) < 0.1


def test_hypotheses_name_the_continuous_prior():
    from popgrad.checks.hypotheses import measure_hypotheses, within_hypotheses
    from popgrad.checks.results import _result

    task = pg.Task(pg.chain(4), pg.DirichletPrior(3, 0.1))
    h = measure_hypotheses(task)
    assert h.items["gamma"].met is False and not h.all_met
    res = within_hypotheses(_result("graph_recovery", 1.0, 0.5, ">=", "Knowl 1.1", {}), h, needs=("gamma",))
    assert res.status == "inconclusive" and "continuous prior" in res.reason


def test_field_refuses_continuous_prior():
    task = pg.Task(pg.chain(4), pg.DirichletPrior(3, 0.1))
    with pytest.raises(ValueError, match="finite stand-in"):
        pg.stage1_field(task)


def test_atom_computations_refuse_in_one_line():
    task = pg.Task(pg.chain(4), pg.DirichletPrior(2, 0.1))
    for f in (lambda: pg.assumptions(task), lambda: task.prior.atoms):
        with pytest.raises(ValueError, match="continuous"):
            f()
