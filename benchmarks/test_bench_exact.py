"""pytest-benchmark cases for the exact engine (run: ``pytest benchmarks/``).

Not part of the test suite (``testpaths = tests``); the comparison table
with peers is ``python benchmarks/run.py`` (``make bench``).
"""
import numpy as np
import pytest

import popgrad as pg
from popgrad.engine import symmetry

pytest.importorskip("pytest_benchmark")


@pytest.fixture(scope="module", params=[(3, 10), (3, 12), (2, 16), (4, 10)], ids=lambda p: f"S{p[0]}T{p[1]}")
def case(request):
    S, T = request.param
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 8, 0, symmetrize=True))
    rng = np.random.default_rng(0)
    A1, A2 = rng.normal(size=(T, T)), rng.normal(size=(S, S))
    A2_span = 0.8 * np.eye(S) - 0.1
    for a2, sym in ((A2, "off"), (A2_span, "auto")):  # JIT warm-up and leaf-weight cache
        pg.exact_loss_and_grad(task, A1, a2, symmetry=sym)
    return task, A1, A2, A2_span


def test_exact_loss_and_grad(benchmark, case):
    task, A1, A2, _ = case
    res = benchmark(pg.exact_loss_and_grad, task, A1, A2, None, "off")
    assert np.isfinite(res.loss)


def test_exact_loss_and_grad_orbit_reduction(benchmark, case):
    task, A1, _, A2_span = case
    assert symmetry.symmetry_applies(task, A2_span)
    res = benchmark(pg.exact_loss_and_grad, task, A1, A2_span)
    assert np.isfinite(res.loss)


def test_exact_loss(benchmark, case):
    task, A1, A2, _ = case
    assert np.isfinite(benchmark(pg.exact_loss, task, A1, A2, None, "off"))


def test_direct_engine(benchmark, case):
    task, A1, A2, _ = case
    benchmark.pedantic(pg.exact_loss_and_grad, args=(task, A1, A2, task.default_eps, "off", "direct"), rounds=3,
                       warmup_rounds=1)
