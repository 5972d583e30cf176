"""One exact enumeration split over Dask workers (``client=``): same bits as one process, warm worker caches."""
import pickle
import subprocess
import sys

import numpy as np
import pytest

import popgrad as pg
from popgrad.engine import distributed as D


def _task(T=9, S=3, closed=False, seed=0):
    prior = pg.dirichlet_prior(S, 1.0, 3, seed=seed)
    if closed:
        prior = pg.FinitePrior.relabeling_closure(prior.atoms, prior.weights)
    return pg.Task(pg.random_tree(T, seed=seed), prior)


def _params(task, seed=1, span=False):
    rng = np.random.default_rng(seed)
    A1 = rng.normal(size=(task.T, task.T))
    A2 = 0.8 * np.eye(task.S) + 0.1 if span else rng.normal(size=(task.S, task.S))
    return A1, A2


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(b)), 1e-300))


def _assert_same(r, ref, tol=1e-13):
    assert abs(r.loss - ref.loss) <= tol * abs(ref.loss)
    assert _rel(r.dA1, ref.dA1) <= tol and _rel(r.dA2, ref.dA2) <= tol
    # stronger than the contract: the slots are the single-process slots, summed in the same order
    assert r.loss == ref.loss and np.array_equal(r.dA1, ref.dA1) and np.array_equal(r.dA2, ref.dA2)


# options giving many blocks on a small task, so both workers get several
MANY = pg.EngineOptions(prefix_block_sequences=64, direct_block_sequences=512, multi_block_sequences=64,
                        parallel_min_sequences=1)


@pytest.mark.parametrize("closed,span", [(False, False), (True, True), (True, False)])
@pytest.mark.parametrize("engine", ["prefix", "direct"])
@pytest.mark.parametrize("options", [None, MANY], ids=["default", "many-blocks"])
def test_agrees_with_single_process(client, closed, span, engine, options):
    task = _task(closed=closed)
    A1, A2 = _params(task, span=span)
    ref = pg.exact_loss_and_grad(task, A1, A2, engine=engine, options=options)
    r = pg.exact_loss_and_grad(task, A1, A2, engine=engine, options=options, client=client)
    _assert_same(r, ref)
    assert pg.exact_loss(task, A1, A2, engine=engine, options=options, client=client) == \
        pg.exact_loss(task, A1, A2, engine=engine, options=options)
    if closed and span:  # orbit reduction on: dA2 exactly in the span
        assert np.all(np.diag(r.dA2) == r.dA2[0, 0])
    again = pg.exact_loss_and_grad(task, A1, A2, engine=engine, options=options, client=client)
    assert again.loss == r.loss and np.array_equal(again.dA1, r.dA1) and np.array_equal(again.dA2, r.dA2)


def test_k_head_engine(client):
    task = pg.MultiParentTask(pg.ngram(7, 3), pg.dirichlet_tensor_prior(3, 2, 1.0, 3, seed=0))
    rng = np.random.default_rng(2)
    A1, A2 = rng.normal(size=(2, 7, 7)), rng.normal(size=(2, 3, 3))
    for options in (None, MANY):
        ref = pg.exact_loss_and_grad(task, A1, A2, options=options)
        _assert_same(pg.exact_loss_and_grad(task, A1, A2, options=options, client=client), ref)
        assert pg.exact_loss(task, A1, A2, options=options, client=client) == ref.loss


def test_full_model_engine(client):
    """The full model on the same block protocol: slots over workers = the local slots, bit for bit."""
    task = pg.Task(pg.random_tree(6, seed=2), pg.dirichlet_prior(3, 1.0, 2, seed=1))
    model = pg.CatFormer(3, 6, heads=(2, 1))
    p = model.init(0.5, 4)
    params = pg.CatFormerParams(p.A, np.random.default_rng(0).normal(size=p.W.shape))
    opts = pg.EngineOptions(prefix_block_sequences=9, parallel_min_sequences=1)
    for o in (None, opts):
        ref = pg.catformer_loss_and_grad(task, model, params, options=o)
        r = pg.catformer_loss_and_grad(task, model, params, options=o, client=client)
        assert r.loss == ref.loss and np.array_equal(r.dW, ref.dW)
        assert all(np.array_equal(a, b) for a, b in zip(r.dA, ref.dA))
        assert pg.catformer_loss(task, model, params, options=o, client=client) == \
            pg.catformer_loss(task, model, params, options=o)


def test_full_model_specialized_on_the_workers(client):
    """A job decided specialized runs the specialized walks on the workers: the general kernels' bits."""
    from popgrad.engine import catformer as E
    from popgrad.engine._kernels import specialize as SP

    task = pg.Task(pg.random_tree(6, seed=2), pg.dirichlet_prior(3, 1.0, 2, seed=1))
    model = pg.CatFormer(3, 6, heads=(1, 1))  # the layout tests/engine/test_catformer_specialize.py compiles
    p = model.init(0.5, 4)
    params = pg.CatFormerParams(p.A, np.random.default_rng(0).normal(size=p.W.shape))
    on = pg.EngineOptions(catformer_specialize="on", prefix_block_sequences=9)
    ref = pg.catformer_loss_and_grad(task, model, params, options=pg.EngineOptions(catformer_specialize="off",
                                                                                       prefix_block_sequences=9))
    r = pg.catformer_loss_and_grad(task, model, params, options=on, client=client)
    assert r.loss == ref.loss and np.array_equal(r.dW, ref.dW)
    assert all(np.array_equal(a, b) for a, b in zip(r.dA, ref.dA))
    job = E.blocks(task, model, params, 0.0, True, on)
    loaded = client.run(SP.loaded, job.sizes, job.hinfo)
    assert any(loaded.values()), loaded


def test_full_model_client_calls_count_towards_auto(client):
    """``"auto"`` counts the wall time of a ``client=`` call, whose walks all run on the workers (before, such a
    run never switched): the layout's count grows in the client, and the decision follows it."""
    from popgrad.engine import catformer as E
    from popgrad.engine._kernels import specialize as SP

    task = pg.Task(pg.random_tree(5, seed=2), pg.dirichlet_prior(2, 1.0, 2, seed=1))
    model = pg.CatFormer(2, 5, heads=(1, 1))
    params = model.init(0.5, 4)
    off = pg.EngineOptions(catformer_specialize="off", prefix_block_sequences=4)
    job = E.blocks(task, model, params, 0.0, True, off)
    SP.reset_counts()
    try:
        pg.catformer_loss_and_grad(task, model, params, options=off, client=client)
        spent = SP.spent(job.sizes, job.hinfo)
        assert spent > 0.0
        if not SP.loaded(job.sizes, job.hinfo):  # (a module loaded in this process decides by itself)
            auto = pg.EngineOptions(catformer_specialize_seconds=spent * 1.5)
            assert not SP.decide(job.sizes, job.hinfo, auto)
            pg.catformer_loss_and_grad(task, model, params, options=off, client=client)
            assert SP.spent(job.sizes, job.hinfo) > spent
            assert SP.decide(job.sizes, job.hinfo, auto) == (SP.spent(job.sizes, job.hinfo) >= spent * 1.5)
    finally:
        SP.reset_counts()


def test_a_worker_without_a_kernel_folder_runs_the_general_walks(tmp_path, monkeypatch):
    """A job decided specialized on a machine whose kernel folder cannot be written (a Dask worker's) runs the
    general walks, the same bits, with one warning."""
    from popgrad.engine import catformer as E
    from popgrad.engine._kernels import catformer_walk
    from popgrad.engine._kernels import specialize as SP

    task = pg.Task(pg.random_tree(3, seed=2), pg.dirichlet_prior(2, 1.0, 2, seed=1))
    model = pg.CatFormer(2, 3, heads=(1, 1))
    params = model.init(0.5, 4)
    job = E.blocks(task, model, params, 0.0, True, pg.EngineOptions(catformer_specialize="off"))._replace(specialized=True)
    assert not SP.loaded(job.sizes, job.hinfo)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("POPGRAD_KERNEL_DIR", str(blocker / "kernels"))  # under a file: cannot be created
    monkeypatch.setattr(SP, "_WARNED", [])
    with pytest.warns(RuntimeWarning, match="runs its general kernels.*cannot be created"):
        assert SP.walks(job) is catformer_walk
    ref = pg.catformer_loss_and_grad(task, model, params, options=pg.EngineOptions(catformer_specialize="off"))
    r = E.finish_blocks(job, E.run_blocks(task, job))
    assert r.loss == ref.loss and all(np.array_equal(a, b) for a, b in zip(r.dA + [r.dW], ref.dA + [ref.dW]))


@pytest.mark.parametrize("multi", [False, True])
def test_noise_engine(client, multi):
    """The gradient-noise engine on the block protocol: ``client=`` and ``options=`` honoured, same bits."""
    from popgrad.engine.noise import stage1_row_noise

    if multi:
        task = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(2, 2, 1.0, 2, seed=0))
        A1 = np.random.default_rng(0).normal(size=(2, 5, 5))
        A2 = np.random.default_rng(1).normal(size=(2, 2, 2))
    else:
        task = _task(T=6)
        A1, A2 = _params(task)
    opts = pg.EngineOptions(noise_block_sequences=16, noise_max_blocks=64, parallel_min_sequences=1)
    for o in (None, opts):
        ref = pg.gradient_noise(task, A1, A2, options=o)
        r = pg.gradient_noise(task, A1, A2, options=o, client=client)
        assert np.array_equal(r.cov, ref.cov) and r.mean.loss == ref.mean.loss and r.loss_var == ref.loss_var
        assert np.array_equal(r.row_cov, ref.row_cov)
        if not multi:
            a, b = stage1_row_noise(task, A1, A2, options=o), stage1_row_noise(task, A1, A2, options=o, client=client)
            assert np.array_equal(a.dA1, b.dA1) and np.array_equal(a.row_cov, b.row_cov)
    few = pg.gradient_noise(task, A1, A2)
    many = pg.gradient_noise(task, A1, A2, options=opts)  # other blocks: rounding only
    assert np.max(np.abs(few.cov - many.cov)) <= 1e-12 * np.max(np.abs(few.cov))


def test_eps_zero_inf_loss(client):
    task = _task(T=6)
    A1, _ = _params(task)
    A2 = np.diag([400.0, 0.0, 0.0])
    with pytest.warns(RuntimeWarning):
        ref = pg.exact_loss_and_grad(task, A1, A2, eps=0.0, options=MANY)
    with pytest.warns(RuntimeWarning):
        r = pg.exact_loss_and_grad(task, A1, A2, eps=0.0, options=MANY, client=client)
    assert r.loss == ref.loss
    assert np.array_equal(np.isnan(r.dA1), np.isnan(ref.dA1))


def test_chunks_depend_on_work_and_workers_only():
    assert D.chunk_bounds(np.ones(729), 2) == [(0, 364), (364, 729)]
    assert D.chunk_bounds(np.ones(1), 2) == [(0, 1)]
    assert D.chunk_bounds([1, 1, 1, 9], 2) == [(0, 3), (3, 4)]
    b = D.chunk_bounds(np.arange(1, 50), 3)
    assert b[0][0] == 0 and b[-1][1] == 49 and all(x[1] == y[0] for x, y in zip(b, b[1:]))


def test_worker_caches_are_reused(client):
    task = _task(T=10, seed=3)
    A1, A2 = _params(task, seed=4)
    pg.exact_loss_and_grad(task, A1, A2, options=MANY, client=client)
    before = D.worker_stats(client)
    for seed in (5, 6):
        A1, A2 = _params(task, seed=seed)
        _assert_same(pg.exact_loss_and_grad(task, A1, A2, options=MANY, client=client),
                     pg.exact_loss_and_grad(task, A1, A2, options=MANY))
    after = D.worker_stats(client)
    assert set(after) == set(before) and len(after) == 2
    for w in after:
        assert after[w]["chunks"] == before[w]["chunks"] + 2  # both workers worked, twice
        for k in ("tasks_received", "plan_builds", "weight_builds"):  # nothing resent or rebuilt
            assert after[w][k] == before[w][k], (w, k)
        assert after[w]["weight_caches_held"] >= 1


def test_lost_worker_caches(client):
    task = _task(T=9, seed=7)
    A1, A2 = _params(task, seed=8)
    ref = pg.exact_loss_and_grad(task, A1, A2, options=MANY)
    _assert_same(pg.exact_loss_and_grad(task, A1, A2, options=MANY, client=client), ref)
    D.clear_worker_caches(client)  # the workers forget the task: they answer MISSING, the client resends
    before = D.worker_stats(client)
    _assert_same(pg.exact_loss_and_grad(task, A1, A2, options=MANY, client=client), ref)
    after = D.worker_stats(client)
    assert all(after[w]["tasks_received"] == before[w]["tasks_received"] + 1 for w in after)
    # a restarted worker process (new id) gets the task again
    addr = sorted(client.scheduler_info()["workers"])[0]
    client.restart_workers([addr])
    client.wait_for_workers(2)
    _assert_same(pg.exact_loss_and_grad(task, A1, A2, options=MANY, client=client), ref)


def test_train_two_stage_with_client(client):
    task = _task(T=6, S=2, closed=True, seed=9)
    kw = dict(beta0=0.01, lr1=2.0, steps1=4, lr2=2.0, steps2=4, record_every=1)
    a = pg.train_two_stage(task, **kw)
    b = pg.train_two_stage(task, **kw, client=client)
    assert np.allclose(b.A1, a.A1, rtol=0, atol=1e-12 * np.max(np.abs(a.A1)))
    assert np.allclose(b.A2, a.A2, rtol=0, atol=1e-12 * np.max(np.abs(a.A2)))
    assert np.array_equal(b.loss, a.loss)  # in fact bit for bit


def test_train_multi_head_with_client(client):
    task = pg.MultiParentTask(pg.ngram(5, 3), pg.dirichlet_tensor_prior(2, 2, 1.0, 2, seed=0))
    kw = dict(steps1=3, record_every=1)
    a = pg.train_multi_head(task, **kw)
    b = pg.train_multi_head(task, **kw, client=client)
    assert np.array_equal(a.A1, b.A1) and np.array_equal(a.loss, b.loss)


def test_not_a_client():
    task = _task(T=4)
    A1, A2 = _params(task)
    with pytest.raises(TypeError, match="dask.distributed.Client"):
        pg.exact_loss_and_grad(task, A1, A2, client=object())


def test_tasks_pickle():
    for task in (_task(T=5), _task(T=5, closed=True),
                 pg.MultiParentTask(pg.ngram(5, 3), pg.dirichlet_tensor_prior(2, 2, 1.0, 2, seed=0))):
        fp = task.fingerprint
        copy = pickle.loads(pickle.dumps(task))
        assert copy.fingerprint == fp and type(copy) is type(task)
        copy._fingerprint = None
        assert copy.fingerprint == fp  # recomputed from the unpickled graph and prior
        D._freeze(copy)
        assert not copy.prior.atoms.flags.writeable


def test_import_popgrad_does_not_import_dask():
    code = "import sys, popgrad, popgrad.engine.distributed; print('dask' in sys.modules or 'distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_popgrad_run_scheduler(client, tmp_path):
    from popgrad.app import cli

    tiny = ["--graph", "chain", "--S", "2", "--T", "5", "--atoms", "2", "--steps1", "10", "--steps2", "10",
            "--no-progress", "--no-sweep"]
    assert cli.main(["run", *tiny, "--out", str(tmp_path / "a")]) == 0
    addr = client.scheduler.address
    assert cli.main(["run", *tiny, "--scheduler", addr, "--out", str(tmp_path / "b")]) == 0
    a = np.load(tmp_path / "a" / "trajectory.npz")
    b = np.load(tmp_path / "b" / "trajectory.npz")
    assert np.array_equal(a["A1"], b["A1"]) and np.array_equal(a["A2"], b["A2"])
    assert not client.status == "closed"  # the job closes only the client it opened


def _fresh(task):
    """An equal task (same fingerprint) without its table: the workers, told to forget theirs, build their own."""
    return type(task)(task.graph, task.prior)


@pytest.mark.parametrize("prior", ["uniform", "stationary"])
def test_weight_table_paths(client, prior):
    """Continuous prior (the weight table, DESIGN §20): every engine over workers = local, bit for bit, whether
    the table travelled with the task or each worker built its own."""
    from popgrad.engine.noise import stage1_row_noise

    task = pg.Task(pg.random_tree(6, seed=2), pg.DirichletPrior(3, 0.2, prior))
    model = pg.CatFormer(3, 6, heads=(1, 1))
    params = model.init(0.5, 4)
    A1, A2 = _params(task)
    opts = pg.EngineOptions(prefix_block_sequences=9, direct_block_sequences=64, noise_block_sequences=64,
                            catformer_rows_per_block=64, parallel_min_sequences=1)
    for o in (None, opts):
        ref = pg.catformer_loss_and_grad(task, model, params, options=o)  # builds the table here
        for t in (task, _fresh(task)):
            client.run(D.clear_worker_caches)
            r = pg.catformer_loss_and_grad(t, model, params, options=o, client=client)
            assert r.loss == ref.loss and np.array_equal(r.dW, ref.dW)
            assert all(np.array_equal(a, b) for a, b in zip(r.dA, ref.dA))
        assert pg.catformer_loss(task, model, params, options=o, client=client) == ref.loss
        z = model.zeros()  # equivariant: the orbit reduction on the table (DESIGN §21), the same bits with client=
        ref = pg.catformer_loss_and_grad(task, model, z, options=o)
        r = pg.catformer_loss_and_grad(task, model, z, options=o, client=client)
        assert r.loss == ref.loss and np.array_equal(r.dW, ref.dW)
        assert all(np.array_equal(a, b) for a, b in zip(r.dA, ref.dA))
        _assert_same(pg.exact_loss_and_grad(task, A1, A2, options=o, client=client),
                     pg.exact_loss_and_grad(task, A1, A2, options=o))
        big = 600.0 * np.eye(3)  # past A2's range limit: the rows path over the table
        _assert_same(pg.exact_loss_and_grad(task, A1, big, options=o, client=client),
                     pg.exact_loss_and_grad(task, A1, big, options=o))
        a, b = pg.gradient_noise(task, A1, A2, options=o), pg.gradient_noise(task, A1, A2, options=o, client=client)
        assert np.array_equal(a.cov, b.cov) and a.mean.loss == b.mean.loss and a.loss_var == b.loss_var
        a, b = stage1_row_noise(task, A1, A2, options=o), stage1_row_noise(task, A1, A2, options=o, client=client)
        assert np.array_equal(a.dA1, b.dA1) and np.array_equal(a.row_cov, b.row_cov)


def test_weight_table_paths_k_heads_and_finite(client):
    """k heads on a continuous prior; a finite prior whose table is prepared (the full model, the noise)."""
    from popgrad.engine import table as _table

    task = pg.MultiParentTask(pg.two_parent(5), pg.DirichletTensorPrior(2, 2, 0.1))
    rng = np.random.default_rng(2)
    A1, A2 = rng.normal(size=(2, 5, 5)), rng.normal(size=(2, 2, 2))
    _assert_same(pg.exact_loss_and_grad(task, A1, A2, client=client), pg.exact_loss_and_grad(task, A1, A2))
    a, b = pg.gradient_noise(task, A1, A2), pg.gradient_noise(task, A1, A2, client=client)
    assert np.array_equal(a.cov, b.cov) and a.mean.loss == b.mean.loss
    st = pg.Task(pg.random_tree(6, seed=1), pg.dirichlet_prior(3, 0.3, 4, seed=1))  # 24 atoms
    assert _table.prepare_table(st)
    model = pg.CatFormer(3, 6)
    params = model.init(0.5, 1)
    ref = pg.catformer_loss_and_grad(st, model, params)
    r = pg.catformer_loss_and_grad(st, model, params, client=client)
    assert r.loss == ref.loss and all(np.array_equal(x, y) for x, y in zip(r.dA, ref.dA))
    B1, B2 = _params(st)
    a, b = pg.gradient_noise(st, B1, B2), pg.gradient_noise(st, B1, B2, client=client)
    assert np.array_equal(a.cov, b.cov) and a.mean.loss == b.mean.loss
