"""pytest-benchmark cases for the exact engine (run: ``pytest benchmarks/``).

Not part of the test suite (``testpaths = tests``); the printed comparison
table is ``python benchmarks/bench_exact.py``.
"""
import numpy as np
import pytest

import popgrad as pg
from popgrad import exact

pytest.importorskip("pytest_benchmark")


@pytest.fixture(scope="module", params=[(3, 10), (3, 12), (2, 16)], ids=lambda p: f"S{p[0]}T{p[1]}")
def case(request):
    S, T = request.param
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 8, 0, symmetrize=True))
    rng = np.random.default_rng(0)
    A1, A2 = rng.normal(size=(T, T)), rng.normal(size=(S, S))
    pg.exact_loss_and_grad(task, A1, A2)  # JIT warm-up
    return task, A1, A2


def test_exact_loss_and_grad(benchmark, case):
    task, A1, A2 = case
    res = benchmark(pg.exact_loss_and_grad, task, A1, A2)
    assert np.isfinite(res.loss)


def test_exact_loss(benchmark, case):
    task, A1, A2 = case
    assert np.isfinite(benchmark(pg.exact_loss, task, A1, A2))


def test_direct_engine(benchmark, case):
    task, A1, A2 = case
    benchmark.pedantic(exact._exact, args=(task, A1, A2, task.default_eps, True, "direct"), rounds=3, warmup_rounds=1)
