"""The official ``bayes`` line, exactly: ``official_bayes_predict(..., root_quirk=True)`` against
``InContextTree.bayes`` restated literally (``counts.at[seq].add(seq[dag] == s)`` on the context, where
``dag[i] = -1`` reads the last context position), in NumPy and, when JAX is installed, in JAX itself;
and ``official_bayes_loss`` with and without the roots, against an enumeration of the same formula."""
import numpy as np
import pytest

import popgrad as pg

GRAPHS = [pg.official_dags("figure2")[2], pg.icl_pairs(9), pg.chain(7), pg.CausalGraph([-1, -1, 0, -1, 2, -1])]


def _literal_numpy(dag, seq, S, alpha):
    """``InContextTree.bayes(seq)`` with ``seq`` the whole sequence (query last), ``dag`` the official one
    (length T-1, -1 for a root)."""
    s, ctx = seq[-1], seq[:-1]
    counts = np.zeros(S)
    np.add.at(counts, ctx, (ctx[dag] == s).astype(float))
    counts += alpha
    return counts / counts.sum()


def _draws(graph, S, n, seed):
    return pg.Task(graph, pg.DirichletPrior(S, 0.1)).sample(n, seed).seqs


@pytest.mark.parametrize("g", range(len(GRAPHS)))
def test_root_quirk_is_in_context_tree_bayes_as_written(g):
    graph, S, alpha = GRAPHS[g], 3, 0.1
    seqs = _draws(graph, S, 300, g)
    dag = np.asarray(graph.parents[:-1])
    want = np.stack([_literal_numpy(dag, s, S, alpha) for s in seqs])
    got = pg.official_bayes_predict(graph, seqs, S, alpha, root_quirk=True)
    assert np.array_equal(got, want)
    edges = pg.official_bayes_predict(graph, seqs, S, alpha)
    if np.any(dag < 0):  # position 0 is always a root: the two lines differ wherever s_{T-2} = s_{T-1}
        hit = seqs[:, -2] == seqs[:, -1]
        assert hit.any() and not np.allclose(edges[hit], got[hit])
        assert np.array_equal(edges[~hit], got[~hit])


def test_root_quirk_matches_jax():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    graph, S, alpha = GRAPHS[0], 10, 0.1
    seqs = _draws(graph, S, 200, 7)
    dag = jnp.asarray(np.asarray(graph.parents[:-1]))

    def bayes(seq):
        s, ctx = seq[-1], seq[:-1]
        counts = jnp.zeros(S).at[ctx].add(ctx[dag] == s) + alpha
        return counts / counts.sum()

    want = np.asarray(jax.vmap(bayes)(jnp.asarray(seqs)), dtype=np.float64)
    got = pg.official_bayes_predict(graph, seqs, S, alpha, root_quirk=True)
    assert np.max(np.abs(got - want)) < 1e-6  # JAX computes in float32 by default


def test_official_bayes_loss_with_and_without_the_roots_is_the_enumerated_formula():
    graph, S, alpha = pg.CausalGraph([-1, 0, -1, 2, -1, -1]), 2, 0.5
    task = pg.Task(graph, pg.DirichletPrior(S, alpha, roots="uniform"))
    dag = np.asarray(graph.parents[:-1])
    for quirk in (False, True):
        total = 0.0
        for seqs, w in task.enumerate(chunk_size=2**16):
            if quirk:
                f = np.stack([_literal_numpy(dag, s, S, alpha) for s in seqs])
            else:
                f = pg.official_bayes_predict(graph, seqs, S, alpha)
            total -= float(np.sum(w * np.log(f)))
        assert pg.official_bayes_loss(task, root_quirk=quirk) == pytest.approx(total, rel=1e-13, abs=1e-13)
    assert pg.official_bayes_loss(task, root_quirk=True) != pg.official_bayes_loss(task)
