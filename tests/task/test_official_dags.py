"""``popgrad.official_dags``: the official experiments' graphs, stored as data, against the official generator.

The regeneration tests rebuild the graphs the way the official code draws them (``many_graphs.ipynb``'s
``get_random_DAG`` under ``RNG(0)``; ``single_parent.py``'s ``RNG(seed=0).randint``), restated here with JAX's
own random functions and the threefry stream as the official runs had it (``jax_threefry_partitionable``
off); they skip without JAX and use no network. The data tests check the stored notebook values against
themselves and against the graphs.
"""
import math

import numpy as np
import pytest

import popgrad as pg
from popgrad.task.official import figure9_notebook_values

T = 20


# ---- the official generators, restated (JAX) --------------------------------------------------------------

def _jax():
    jax = pytest.importorskip("jax")
    return jax, jax.numpy, jax.random


def _next(jr, key):
    """The official ``RNG.next()``: split the state, keep the first half, hand out the second."""
    key, sub = jr.split(key)
    return key, sub


def _notebook_dags():
    """``many_graphs.ipynb``: ``rng = RNG(0)``; ``keys = rng.next(20)`` (one ``next`` then a 20-way split);
    per key ``get_random_DAG(key, p=0.5)``: ``key, subkey = split(key)``; parents ``randint(key, (T-2,), 0,
    arange(1, T-1))`` after a leading -1; a root wherever ``bernoulli(subkey, 0.5, (T-1,))`` is true."""
    jax, jnp, jr = _jax()
    with jax.threefry_partitionable(False):
        _, sub = _next(jr, jr.PRNGKey(0))
        out = []
        for key in jr.split(sub, 20):
            key, subkey = jr.split(key)
            dag = jnp.insert(jr.randint(key, (T - 2,), minval=0, maxval=jnp.arange(1, T - 1)), 0, -1)
            mask = jr.bernoulli(subkey, p=0.5, shape=(T - 1,))
            out.append([int(v) for v in jnp.where(mask == 0, dag, -1)] + [-1])
    return out


def _single_parent_random():
    """``single_parent.py``, ``dag="random"``: ``RNG(seed=0).randint((T-1,), minval=-1, maxval=arange(T-1))``
    (``RNG.__getattr__`` hands ``randint`` the key of one ``next``)."""
    jax, jnp, jr = _jax()
    with jax.threefry_partitionable(False):
        _, sub = _next(jr, jr.PRNGKey(0))
        dag = jr.randint(sub, (T - 1,), minval=-1, maxval=jnp.arange(T - 1))
    return [int(v) for v in dag] + [-1]


def test_figure9_graphs_regenerate_from_the_notebooks_generator():
    got = [g.parents.tolist() for g in pg.official_dags("figure9")]
    assert got == _notebook_dags()


def test_figure2_random_graph_regenerates_from_single_parent_py():
    assert pg.official_dags("figure2")[2].parents.tolist() == _single_parent_random()


def test_the_partitionable_stream_draws_other_graphs():
    """The setting matters (the reason it is pinned): the other threefry stream gives other graphs."""
    jax, jnp, jr = _jax()
    with jax.threefry_partitionable(True):
        _, sub = _next(jr, jr.PRNGKey(0))
        dag = [int(v) for v in jr.randint(sub, (T - 1,), minval=-1, maxval=jnp.arange(T - 1))] + [-1]
    assert dag != pg.official_dags("figure2")[2].parents.tolist()


# ---- the stored data (no JAX) --------------------------------------------------------------------------------

def test_figure2_graphs_are_chain_icl_and_the_official_random_graph():
    chain, icl, rnd = pg.official_dags("figure2")
    assert chain == pg.chain(T) and icl == pg.icl_pairs(T)
    assert rnd.to_string() == "-1,-1,1,-1,-1,4,-1,5,3,4,8,6,1,3,5,-1,6,1,3,-1"


def test_figure9_has_twenty_graphs_of_the_notebooks_law():
    graphs = pg.official_dags("figure9")
    assert len(graphs) == 20 and all(g.T == T for g in graphs)
    assert all(g.parents[0] == -1 and g.parents[T - 1] == -1 for g in graphs)
    assert len({g.to_string() for g in graphs}) == 20


def test_notebook_deltas_sit_on_the_graphs_edges_and_give_the_printed_means():
    """A delta is nonzero only at a position with a parent (the notebook's rows 1..T-2); its printed per-graph
    mean is Σ deltas / edges; and the 20 values give the printed 0.83663917 ± 0.054017633."""
    vals = figure9_notebook_values()
    for g, v in zip(pg.official_dags("figure9"), vals):
        assert v["graph"] == g.to_string()
        d = np.array(v["deltas"])
        assert d.shape == (T - 2,)
        par = g.parents[1:T - 1]
        assert np.all(d[par < 0] == 0.0)
        edges = int(np.sum(g.parents >= 0))
        assert math.isclose(d.sum() / edges, v["mean_delta"], rel_tol=1e-5)
        assert v["official"] == 1.0 - v["mean_delta"]
    off = np.array([v["official"] for v in vals])
    assert abs(off.mean() - 0.83663917) < 1e-6
    assert abs(off.std() - 0.054017633) < 1e-6


def test_an_unknown_experiment_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown experiment 'figure7'.*'figure9'.*'figure2'"):
        pg.official_dags("figure7")
    with pytest.raises(ValueError, match="unknown experiment 9"):
        pg.official_dags(9)


def test_the_graphs_are_fresh_objects_of_immutable_parents():
    a, b = pg.official_dags("figure9"), pg.official_dags("figure9")
    assert a == b
    with pytest.raises(ValueError):
        a[0].parents[1] = 0
