"""Issue 32: the field kernels return to Python often (chunked calls) without changing a bit, and each
parallel kernel and its serial twin are compiled from one body, chosen by one rule."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import field as fieldmod
from popgrad.engine._kernels import field as fk
from popgrad.engine.options import EngineOptions
from popgrad.task.priors import dirichlet_prior

from ..strategies import parents_lists, priors

TWINS = ("field_enumerate", "tree_prepass", "tree_pairs", "chain_prepass", "chain_pairs")


@pytest.mark.parametrize("name", TWINS)
def test_twins_are_one_body_compiled_twice(name):
    par, ser = getattr(fk, name), getattr(fk, name + "_serial")
    assert par.py_func.__code__.co_code == ser.py_func.__code__.co_code
    assert par.py_func.__qualname__ == name and ser.py_func.__qualname__ == name + "_serial"
    assert par.targetoptions.get("parallel") and not ser.targetoptions.get("parallel")


def _many_calls(monkeypatch):
    """Every kernel in calls of one outer iteration (the smallest cut)."""
    monkeypatch.setattr(fieldmod, "_ONE_CALL_WORK", 0)
    monkeypatch.setattr(fieldmod, "CALL_SECONDS", 1e-9)


def _calls(monkeypatch):
    seen = []
    real = fieldmod._kernel

    def counting(name, work, opts):
        kern = real(name, work, opts)

        def call(lo, hi, *args):
            seen.append((name, lo, hi))
            return kern(lo, hi, *args)
        return call
    monkeypatch.setattr(fieldmod, "_kernel", counting)
    return seen


@pytest.mark.parametrize("graph", [pg.chain(9), pg.random_tree(9, seed=1), pg.icl_pairs(9)], ids=str)
@pytest.mark.parametrize("method", ["counts", "enumerate"])
def test_cut_calls_give_the_same_bits(monkeypatch, graph, method):
    task = pg.Task(graph, dirichlet_prior(3, 0.5, 2, seed=0, symmetrize=False))
    whole = fieldmod.stage1_field(task, method=method).M
    _many_calls(monkeypatch)
    seen = _calls(monkeypatch)
    cut = fieldmod.stage1_field(task, method=method).M
    assert len(seen) >= 4 and all(hi - lo == 1 for _, lo, hi in seen)  # really cut into single iterations
    assert np.array_equal(whole, cut)


@settings(max_examples=15)
@given(parents=parents_lists(2, 7), prior=priors(S=3, max_atoms=2, symmetrize=False),
       serial=st.booleans())
def test_cut_calls_same_bits_any_forest(parents, prior, serial):
    task = pg.Task(pg.CausalGraph(parents), prior)
    opts = EngineOptions(field_parallel_min_work=10**18 if serial else 0)
    whole = fieldmod.stage1_field(task, method="counts", options=opts).M
    saved = fieldmod._ONE_CALL_WORK, fieldmod.CALL_SECONDS
    try:
        fieldmod._ONE_CALL_WORK, fieldmod.CALL_SECONDS = 0, 1e-9
        cut = fieldmod.stage1_field(task, method="counts", options=opts).M
    finally:
        fieldmod._ONE_CALL_WORK, fieldmod.CALL_SECONDS = saved
    assert np.array_equal(whole, cut)


def test_calls_are_short(monkeypatch):
    """The step adapts to the measured time: after the first calls, none is far above CALL_SECONDS."""
    monkeypatch.setattr(fieldmod, "_ONE_CALL_WORK", 10_000)
    monkeypatch.setattr(fieldmod, "CALL_SECONDS", 0.01)
    seen = _calls(monkeypatch)
    task = pg.Task(pg.chain(160), dirichlet_prior(2, 0.5, 1, seed=0, symmetrize=False))
    fieldmod.stage1_field(task, method="counts")
    pairs = [s for s in seen if s[0] == "chain_pairs"]
    assert len(pairs) > 3  # the pair kernel returned to Python several times


def test_tiny_eps_refused_not_nan():
    task = pg.Task(pg.chain(5), dirichlet_prior(2, 0.5, 2, seed=0, symmetrize=False))
    with pytest.raises(ValueError, match="eps = 4.94066e-324 is too small"):
        fieldmod.stage1_field(task, eps=5e-324)
    assert np.all(np.isfinite(fieldmod.stage1_field(task, eps=fieldmod.MIN_EPS).M))
