"""The one rule of the weight table (popgrad.engine.table, DESIGN §20): a one-off call keeps the per-atom path,
a trainer prepares the table, and trajectories on finite priors do not move beyond rounding."""
import numpy as np

import popgrad as pg
from popgrad.engine import table as _table


def _finite_task(T=5, draws=4, seed=1):  # draws x 3! atoms (relabeling-closed): 24 >= TABLE_MIN_ATOMS
    return pg.Task(pg.random_tree(T, 2, 0.5), pg.dirichlet_prior(3, 0.3, draws, seed))


def test_one_off_calls_never_build_the_table():
    task = _finite_task()
    assert task.prior.K >= _table.TABLE_MIN_ATOMS
    rng = np.random.default_rng(0)
    model = pg.CatFormer(3, 5)
    pg.catformer_loss_and_grad(task, model, model.init(0.5, 0))
    pg.exact_loss_and_grad(task, rng.normal(size=(5, 5)), rng.normal(size=(3, 3)))
    pg.gradient_noise(task, rng.normal(size=(5, 5)), rng.normal(size=(3, 3)))
    assert not _table.table_built(task) and not _table.use_table(task, per_atom=True)
    assert _table.prepare_table(task) and _table.table_built(task) and _table.use_table(task, per_atom=True)
    assert not _table.use_table(task, per_atom=False)  # engines that never carry atoms per call
    few = _finite_task(draws=1)  # 6 atoms: the per-atom path even with the table built
    assert not _table.prepare_table(few) and not _table.use_table(few, per_atom=True)
    cont = pg.Task(pg.chain(4), pg.DirichletPrior(2, 0.1))
    assert _table.use_table(cont, per_atom=False) and _table.prepare_table(cont) and _table.table_built(cont)


def test_trainers_prepare_the_table():
    task = _finite_task()
    pg.train_catformer(task, pg.CatFormer(3, 5), 2, init=("normal", 0.1, 0))
    assert _table.table_built(task)
    task = _finite_task()
    pg.train_two_stage(task, steps1=1, steps2=1)
    assert _table.table_built(task)
    mt = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(2, 2, 0.3, 20, 0))
    pg.train_multi_head(mt, steps1=1, steps2=1)
    assert _table.table_built(mt)


def _open_prior(S=3, K=20, seed=0):
    """A finite prior that is not closed under relabeling (no orbit reduction: the rule decides the path)."""
    rng = np.random.default_rng(seed)
    return pg.FinitePrior(rng.dirichlet(0.5 * np.ones(S), size=(K, S)), np.full(K, 1.0 / K))


def test_trajectories_unchanged_on_finite_priors(monkeypatch):
    """The table path's trajectory equals the per-atom path's to 1e-13 (full model with Adam, reduced, k heads)."""
    rule = _table.use_table
    taken = []

    def spy(task, per_atom):
        r = rule(task, per_atom)
        if per_atom and not task.continuous:
            taken.append(r)
        return r

    for mod in ("catformer", "single", "multi", "noise"):
        monkeypatch.setattr(f"popgrad.engine.{mod}._table.use_table", spy)
    runs = {}
    for path in ("table", "per-atom"):
        if path == "per-atom":
            monkeypatch.setattr(_table, "TABLE_MIN_ATOMS", 10**9)
        taken.clear()
        full = pg.train_catformer(pg.Task(pg.random_tree(5, 2, 0.5), _open_prior()), pg.CatFormer(3, 5, heads=(2, 1)),
                                  25, init=("normal", 0.3, 1), optimizer="adam", lr=0.05, record_every=1)
        red = pg.train_two_stage(pg.Task(pg.random_tree(6, 2, 0.5), _open_prior(seed=1)), steps1=15, steps2=15,
                                 record_every=1)
        mt = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(2, 2, 0.3, 20, 0))
        multi = pg.train_multi_head(mt, steps1=10, steps2=10, record_every=1)
        assert taken and all(taken) if path == "table" else not any(taken)
        runs[path] = (full, red, multi)
    (f1, r1, m1), (f2, r2, m2) = runs["table"], runs["per-atom"]
    assert np.abs(np.asarray(f1.loss) - np.asarray(f2.loss)).max() <= 1e-13
    assert max(float(np.abs(a - b).max()) for a, b in zip(f1.final.A, f2.final.A)) <= 1e-13
    assert float(np.abs(f1.final.W - f2.final.W).max()) <= 1e-13
    for a, b in ((r1, r2), (m1, m2)):
        assert len(a.loss) == len(b.loss) > 10
        assert np.abs(np.asarray(a.loss) - np.asarray(b.loss)).max() <= 1e-13
        assert np.abs(a.A1[-1] - b.A1[-1]).max() <= 1e-13 and np.abs(a.A2[-1] - b.A2[-1]).max() <= 1e-13
