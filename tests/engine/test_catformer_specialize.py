"""The full model's walks compiled for one layout (popgrad.engine._kernels.specialize): the same bits as the
general kernels on every path that runs them, the rewrite complete, the ``"auto"`` rule and its errors."""
import re
import warnings

import numpy as np
import pytest

import popgrad as pg
from popgrad.engine import catformer as E
from popgrad.engine import catformer_symmetry as Y
from popgrad.engine._kernels import specialize as SP
from popgrad.engine.options import DEFAULT_OPTIONS

ON = pg.EngineOptions(catformer_specialize="on")
OFF = pg.EngineOptions(catformer_specialize="off")


def _params(model, seed, equivariant, scale=0.3):
    p = model.init(scale, seed)
    W = scale * np.random.default_rng(seed).standard_normal(p.W.shape)
    if equivariant:
        A, W = Y.symmetrize_params(model, p.A, W)
        return pg.CatFormerParams(A, W)
    return pg.CatFormerParams(p.A, W)


def _same(a, b):
    assert np.isfinite(a.loss) and a.loss == b.loss
    for x, y in zip(a.dA + [a.dW], b.dA + [b.dW]):
        assert np.array_equal(x, y)


def _job(model, params):
    return E.blocks(None, model, params, 0.0, True, OFF)


@pytest.mark.parametrize("S, T, heads, readout", [(3, 6, (1, 1), "softmax"), (2, 5, (2, 1, 1), "linear")])
def test_specialized_walks_give_the_general_kernels_bits(S, T, heads, readout):
    """Trie walk (general and canonical; the first layout), weight-table rows (general and orbit-summed) and
    sampled rows with repeats: bit for bit the general kernels' loss and gradient (the second layout, L = 3
    and the linear readout, runs the rows walk only: one compile less)."""
    graph = pg.random_tree(T, seed=1, root_prob=0.5)
    model = pg.CatFormer(S, T, heads=heads, readout=readout)
    finite = pg.Task(graph, pg.dirichlet_prior(S, 0.5, 6, 0, symmetrize=True))
    table = pg.Task(graph, pg.DirichletPrior(S, 0.5))
    eps, scale = (None, 0.3) if readout == "softmax" else (3.0, 0.1)  # linear: every f_c + eps > 0
    ran = 0
    for task in (finite, table) if readout == "softmax" else (table,):
        for eq in (False, True):
            params = _params(model, 2, eq, scale)
            a = pg.catformer_loss_and_grad(task, model, params, eps=eps, options=OFF)
            b = pg.catformer_loss_and_grad(task, model, params, eps=eps, options=ON)
            _same(a, b)
            ran += 1
    rng = np.random.default_rng(3)
    seqs = rng.integers(0, S, size=(300, T))
    seqs[100:200] = seqs[:100]  # repeated rows are separate leaves
    w = rng.random((300, S))
    params = _params(model, 4, False, scale)
    _same(pg.catformer_rows_loss_and_grad(seqs, w, model, params, eps=eps, options=OFF),
          pg.catformer_rows_loss_and_grad(seqs, w, model, params, eps=eps, options=ON))
    assert ran == (4 if readout == "softmax" else 2) and SP.loaded(_job(model, params).sizes, _job(model, params).hinfo)


def test_specialized_parallel_walk_gives_the_serial_general_bits():
    """The parallel twin of the specialized walk (many blocks, the pool on) against the general serial one."""
    import numba

    if numba.get_num_threads() < 2:
        pytest.skip("needs 2 numba threads (CI runs with NUMBA_NUM_THREADS=2)")
    S, T = 3, 6
    model = pg.CatFormer(S, T, heads=(1, 1))
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 4, 0))
    params = _params(model, 5, False)
    par = pg.EngineOptions(catformer_specialize="on", prefix_block_sequences=9, parallel_min_sequences=1)
    ser = pg.EngineOptions(catformer_specialize="off", prefix_block_sequences=9,
                           parallel_min_sequences=10**9)
    job = E.blocks(task, model, params, 0.0, True, par)
    assert job.parallel and job.n_blocks > 1 and job.specialized
    _same(pg.catformer_loss_and_grad(task, model, params, options=ser),
          pg.catformer_loss_and_grad(task, model, params, options=par))


def test_source_rewrites_every_layout_read_and_names_the_kernels_digest():
    from popgrad.engine._kernels.cache import kernels_digest

    jobs = [_job(pg.CatFormer(S, T, heads=h), pg.CatFormer(S, T, heads=h).init(0.1, 0))
            for S, T, h in ((3, 6, (1, 1)), (3, 7, (1, 1)), (3, 6, (2, 1)))]
    texts = [SP.source(j.sizes, j.hinfo) for j in jobs]
    assert texts[0] == SP.source(jobs[0].sizes, jobs[0].hinfo)  # a function of the layout (and the kernels)
    assert len(set(texts)) == 3
    for text in texts:
        code = re.sub(r'"""(?:.|\n)*?"""', "", text)
        assert not re.search(r"\bz\.\w", code) and not re.search(r"\bhinfo\[[^\]]*,", code)
        assert "HINFO[" in code and "Z.S" in code and kernels_digest() in text
        assert not re.search(r"^from \.", code, flags=re.M)
        compile(text, "<generated>", "exec")
    assert "T=np.uint64(7)" in texts[1] and "HINFO = ((1, 9, 9, 0), (1, 9, 18, 81), (2, 27, 27, 162))" in texts[2]


def test_a_layouts_new_module_replaces_its_older_versions(tmp_path, monkeypatch):
    """The module is written once per text (layout and kernels), loads without compiling, and a new version
    removes the layout's older ones with their cache files (other layouts' files stay)."""
    monkeypatch.setenv("POPGRAD_KERNEL_DIR", str(tmp_path))
    model = pg.CatFormer(2, 3, heads=(3, 2))
    job = _job(model, model.init(0.1, 0))
    key = SP._layout_key(job.sizes, job.hinfo)
    mod = SP._load(key, job.sizes, job.hinfo)
    assert (int(mod.Z.S), int(mod.Z.T), mod.HINFO) == (2, 3, tuple(tuple(int(x) for x in r) for r in job.hinfo))
    assert all(callable(getattr(mod, f)) for f in ("run_blocks", "run_blocks_serial", "run_rows", "run_rows_serial"))
    (current,) = tmp_path.glob("*.py")
    layout = current.stem.rsplit("_", 1)[0]
    cache = tmp_path / "__pycache__"
    cache.mkdir(exist_ok=True)
    stale = [tmp_path / f"{layout}_000000000000.py", cache / f"{layout}_000000000000._block-114.py311.nbi"]
    other = [tmp_path / "catformer_S2_T3_ffffffff_000000000000.py",
             cache / "catformer_S2_T3_ffffffff_000000000000._block-114.py311.nbi"]
    for f in stale + other:
        f.write_text("x")
    SP._load(key, job.sizes, job.hinfo)  # the same text: nothing written, nothing removed
    assert all(f.exists() for f in stale + other)
    current.unlink()
    SP._load(key, job.sizes, job.hinfo)  # written again: the older version goes
    assert current.exists() and not any(f.exists() for f in stale) and all(f.exists() for f in other)
    assert current.read_text() == SP.source(job.sizes, job.hinfo)


def test_auto_specializes_once_the_general_walks_have_spent_the_threshold():
    model = pg.CatFormer(2, 3, heads=(3, 2))  # a layout no other test loads
    job = _job(model, model.init(0.1, 0))
    opts = pg.EngineOptions(catformer_specialize_seconds=2.5)
    SP.reset_counts()
    assert not SP.loaded(job.sizes, job.hinfo) and SP.spent(job.sizes, job.hinfo) == 0.0
    seen = []
    for dt in (1.0, 1.0, 0.4, 0.1, 5.0):  # what run() counts after each general call
        seen.append(SP.decide(job.sizes, job.hinfo, opts))
        SP._SPENT[SP._layout_key(job.sizes, job.hinfo)] = SP.spent(job.sizes, job.hinfo) + dt
    seen.append(SP.decide(job.sizes, job.hinfo, opts))
    assert seen == [False, False, False, False, True, True]
    assert not SP.decide(job.sizes, job.hinfo, OFF) and SP.decide(job.sizes, job.hinfo, ON)
    assert SP.decide(job.sizes, job.hinfo, pg.EngineOptions(catformer_specialize_seconds=0))
    SP.reset_counts()
    assert not SP.decide(job.sizes, job.hinfo, opts)
    assert (DEFAULT_OPTIONS.catformer_specialize, DEFAULT_OPTIONS.catformer_specialize_seconds) == ("auto", 30.0)


def test_engine_counts_the_general_walks_time_and_switches():
    """Every path adds its general walk's wall time to its layout; the next job past the threshold is
    specialized, and a job decided specialized adds nothing."""
    S, T = 3, 6
    model = pg.CatFormer(S, T, heads=(1, 1))  # compiled by the bits test above
    graph = pg.random_tree(T, seed=1, root_prob=0.5)
    finite = pg.Task(graph, pg.dirichlet_prior(S, 1.0, 4, 0, symmetrize=True))
    table = pg.Task(graph, pg.DirichletPrior(S, 0.5))
    gen, eq = _params(model, 0, False), _params(model, 0, True)
    job = _job(model, gen)
    rows = (np.zeros((7, T), dtype=int), np.ones((7, S)))
    calls = [lambda o: pg.catformer_loss_and_grad(finite, model, gen, options=o),
             lambda o: pg.catformer_loss_and_grad(finite, model, eq, options=o),
             lambda o: pg.catformer_loss_and_grad(table, model, eq, options=o),
             lambda o: pg.catformer_loss_and_grad(table, model, gen, options=o),
             lambda o: pg.catformer_rows_loss_and_grad(*rows, model, gen, options=o)]
    saved = SP._MODULES.pop(SP._layout_key(job.sizes, job.hinfo), None)
    try:
        never = pg.EngineOptions(catformer_specialize_seconds=1e9)
        for call in calls:
            call(never)  # compiled (or loaded) in this process: a first call's compile does not count
            SP.reset_counts()
            call(never)
            assert SP.spent(job.sizes, job.hinfo) > 0.0
        before = SP.spent(job.sizes, job.hinfo)
        assert not _job(model, gen).specialized  # default 30 s: not reached
        soon = pg.EngineOptions(catformer_specialize_seconds=before)
        assert E.blocks(None, model, gen, 0.0, True, soon).specialized
        calls[0](soon)  # runs specialized: counts nothing
        assert SP.spent(job.sizes, job.hinfo) == before
    finally:
        if saved is not None:
            SP._MODULES[SP._layout_key(job.sizes, job.hinfo)] = saved


def test_a_call_that_compiles_the_walk_does_not_count(monkeypatch):
    """The first call of a general walk, which compiles it (or loads it from numba's cache), adds nothing to
    the layout's time: a cold first gradient must not specialize because of its own compile."""
    import types
    import time as _time

    model = pg.CatFormer(2, 3, heads=(3, 2))
    job = _job(model, model.init(0.1, 0))

    class Walk:  # a dispatcher that "compiles" (one more signature) on its first call, then just runs
        signatures = []

        def __call__(self, *args):
            _time.sleep(0.05)
            if not self.signatures:
                self.signatures.append("compiled")
            return 0.0

    walk = Walk()
    monkeypatch.setattr(SP, "walks", lambda job: types.SimpleNamespace(run_rows_serial=walk))
    SP.reset_counts()
    try:
        SP.run(job, "run_rows", False)
        assert SP.spent(job.sizes, job.hinfo) == 0.0
        SP.run(job, "run_rows", False)
        assert SP.spent(job.sizes, job.hinfo) >= 0.04
    finally:
        SP.reset_counts()


def test_an_unusable_kernel_folder_is_one_clear_error_or_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("POPGRAD_KERNEL_DIR", str(blocker / "kernels"))
    S, T = 2, 4
    model = pg.CatFormer(S, T, heads=(1, 2))  # a layout no other test loads
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 3, 0))
    params = _params(model, 0, False)
    with pytest.raises(ValueError, match=r"catformer_specialize='on'.*POPGRAD_KERNEL_DIR.*cannot be created.*set "
                                         r"POPGRAD_KERNEL_DIR to a writable folder"):
        pg.catformer_loss_and_grad(task, model, params, options=ON)
    auto = pg.EngineOptions(catformer_specialize_seconds=0)
    monkeypatch.setattr(SP, "_WARNED", [])
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        a = pg.catformer_loss_and_grad(task, model, params, options=auto)
        pg.catformer_loss_and_grad(task, model, params, options=auto)
    msgs = [str(r.message) for r in rec if issubclass(r.category, RuntimeWarning)]
    assert len(msgs) == 1 and "general kernels" in msgs[0] and "POPGRAD_KERNEL_DIR" in msgs[0]
    _same(a, pg.catformer_loss_and_grad(task, model, params, options=OFF))


@pytest.mark.parametrize("bad", ["yes", 1, None, "ON"])
def test_catformer_specialize_option_is_checked(bad):
    with pytest.raises(ValueError, match="catformer_specialize must be 'auto', 'on' or 'off'"):
        pg.EngineOptions(catformer_specialize=bad)


@pytest.mark.parametrize("bad", [-1.0, -1e-9, "30", float("nan")])
def test_catformer_specialize_seconds_is_checked(bad):
    with pytest.raises((ValueError, TypeError), match="catformer_specialize_seconds"):
        pg.EngineOptions(catformer_specialize_seconds=bad)
