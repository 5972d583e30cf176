"""The block runner of every engine (popgrad.engine.blocks): any split of the block range gives the same bits.

``blocks`` → ``run_blocks(lo, hi)`` per range → concatenated in block order → ``finish_blocks`` is what
``client=`` does over Dask workers; here the ranges run in this process, so every engine's runner is
checked without a cluster (tests/engine/test_distributed.py runs the same over workers).
"""
import numpy as np
import pytest

import popgrad as pg
from popgrad.engine import multi, single
from popgrad.engine.blocks import Partials, concat_partials

# many small blocks on small tasks, so a split has several blocks per range
MANY = pg.EngineOptions(prefix_block_sequences=64, direct_block_sequences=256, multi_block_sequences=64,
                        parallel_min_sequences=1)


def _single_case(closed, span, seed=0):
    prior = pg.dirichlet_prior(3, 1.0, 3, seed=seed, symmetrize=closed)
    task = pg.Task(pg.random_tree(8, seed=seed), prior)
    rng = np.random.default_rng(seed + 1)
    A2 = 0.7 * np.eye(3) + 0.2 if span else rng.normal(size=(3, 3))
    return task, rng.normal(size=(8, 8)), A2


def _splits(n):
    """Splits of ``0 … n`` into consecutive ranges: whole, halves, uneven thirds, single blocks."""
    cuts = [[], [n // 2], [1, max(1, (2 * n) // 3)], list(range(1, n))]
    for c in cuts:
        edges = [0] + sorted(set(x for x in c if 0 < x < n)) + [n]
        yield list(zip(edges[:-1], edges[1:]))


def _run_split(runner, task, job, ranges):
    return concat_partials(runner.run_blocks(task, job, lo, hi) for lo, hi in ranges)


def _assert_bits(a, b):
    assert a.loss == b.loss
    for x, y in ((a.dA1, b.dA1), (a.dA2, b.dA2)):
        assert (x is None and y is None) or np.array_equal(x, y)


@pytest.mark.parametrize("want_grad", [True, False])
@pytest.mark.parametrize("engine", ["prefix", "direct"])
@pytest.mark.parametrize("closed,span", [(False, False), (True, True)], ids=["plain", "orbits"])
def test_single_parent_runner_any_split_same_bits(engine, closed, span, want_grad):
    task, A1, A2 = _single_case(closed, span)
    ref = pg.exact_loss_and_grad(task, A1, A2, engine=engine, options=MANY)
    job = single.blocks(task, A1, A2, task.default_eps, want_grad, engine, "auto", MANY)
    work = single.block_work(task, job)
    n = len(work)
    assert job.engine == engine and job.sym == (closed and span) and n > 4
    assert work.dtype == np.int64 and np.all(work > 0)
    whole = single.run_blocks(task, job)
    assert len(whole.loss) == n
    for ranges in _splits(n):
        parts = _run_split(single, task, job, ranges)
        assert all(np.array_equal(p, w) for p, w in zip(parts, whole))  # slot for slot
        r = single.finish_blocks(job, parts)
        if want_grad:
            _assert_bits(r, ref)
        else:
            assert r.loss == pg.exact_loss(task, A1, A2, engine=engine, options=MANY) and r.dA1 is None


@pytest.mark.parametrize("want_grad", [True, False])
def test_k_head_runner_any_split_same_bits(want_grad):
    task = pg.MultiParentTask(pg.ngram(6, 3), pg.dirichlet_tensor_prior(3, 2, 1.0, 2, seed=0))
    rng = np.random.default_rng(3)
    A1, A2 = rng.normal(size=(2, 6, 6)), rng.normal(size=(2, 3, 3))
    ref = pg.exact_loss_and_grad(task, A1, A2, options=MANY)
    job = multi.blocks(task, A1, A2, task.default_eps, want_grad, MANY)
    n = len(multi.block_work(task, job))
    assert job.engine == "multi" and n > 4 and len(multi.run_blocks(task, job).loss) == n
    assert np.array_equal(multi.block_work(task, job), np.ones(n, dtype=np.int64))
    for ranges in _splits(n):
        r = multi.finish_blocks(job, _run_split(multi, task, job, ranges))
        if want_grad:
            _assert_bits(r, ref)
        else:
            assert r.loss == ref.loss and r.dA1 is None


def test_range_weights_are_cached_per_range_and_change_no_bit():
    """The prefix engine keeps the leaf weights of each range it ran (a worker runs the same chunk every call)."""
    task, A1, A2 = _single_case(False, False, seed=5)
    pg.clear_caches()
    job = single.blocks(task, A1, A2, task.default_eps, True, "prefix", "off", MANY)
    n = len(single.block_work(task, job))
    before = single.cache_stats()
    first = [single.run_blocks(task, job, lo, hi) for lo, hi in ((0, n // 2), (n // 2, n))]
    mid = single.cache_stats()
    again = [single.run_blocks(task, job, lo, hi) for lo, hi in ((0, n // 2), (n // 2, n))]
    after = single.cache_stats()
    assert mid["weight_builds"] == before["weight_builds"] + 2 and after["weight_builds"] == mid["weight_builds"]
    assert after["weight_caches_held"] == 2 and after["weight_bytes"] > 0
    for a, b in zip(first, again):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    pg.clear_caches()
    assert single.cache_stats()["plans_held"] == 0


def test_concat_partials_keeps_block_order():
    a = Partials(np.array([1.0, 2.0]), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)))
    b = Partials(np.array([3.0]), np.ones((1, 1, 1)), np.ones((1, 1, 1)))
    c = concat_partials([a, b])
    assert c.loss.tolist() == [1.0, 2.0, 3.0] and c.G[:, 0, 0].tolist() == [0.0, 0.0, 1.0]
    assert concat_partials([a]) is a
