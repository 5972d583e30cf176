"""Hypothesis strategies shared by the test modules.

* :func:`parents_lists` / :func:`graphs` -- any valid single-parent graph;
* :func:`transition_matrices` -- row-stochastic matrices, optionally sparse
  (small Dirichlet α) or bounded away from zero;
* :func:`priors` -- finite priors (random atoms and weights, optionally
  closed under relabeling);
* :func:`tasks` -- a graph and a prior with ``S**T`` small enough to
  enumerate quickly;
* :func:`multi_graphs` / :func:`tensor_priors` / :func:`multi_tasks` -- the same for
  k-parent graphs (:class:`popgrad.MultiParentTask`);
* :func:`run_engine` -- one named engine through the public API (what the old
  private ``popgrad.exact._exact`` did).
"""
import numpy as np
from hypothesis import strategies as st

import popgrad as pg


@st.composite
def parents_lists(draw, min_T=2, max_T=8):
    T = draw(st.integers(min_T, max_T))
    parents = [-1]
    for i in range(1, T - 1):
        parents.append(draw(st.integers(-1, i - 1)))
    parents.append(-1)
    return parents[:T] if T > 1 else parents


@st.composite
def graphs(draw, min_T=2, max_T=8):
    return pg.CausalGraph(draw(parents_lists(min_T, max_T)))


@st.composite
def transition_matrices(draw, S, alpha=None, min_entry=0.0):
    """A row-stochastic ``(S, S)`` matrix from a seeded Dirichlet draw."""
    seed = draw(st.integers(0, 2**32 - 1))
    if alpha is None:
        alpha = draw(st.sampled_from([0.05, 0.3, 1.0, 5.0]))
    rng = np.random.default_rng(seed)
    pi = rng.dirichlet(np.full(S, alpha), size=S)
    if min_entry > 0:
        pi = min_entry + (1.0 - S * min_entry) * pi
    return pi / pi.sum(axis=1, keepdims=True)


@st.composite
def priors(draw, S=None, min_S=2, max_S=4, max_atoms=4, symmetrize=None):
    if S is None:
        S = draw(st.integers(min_S, max_S))
    K = draw(st.integers(1, max_atoms))
    atoms = np.stack([draw(transition_matrices(S)) for _ in range(K)])
    raw = np.array(draw(st.lists(st.floats(0.1, 1.0), min_size=K, max_size=K)))
    weights = raw / raw.sum()
    if symmetrize is None:
        symmetrize = draw(st.booleans()) and S <= 3
    if symmetrize:
        atoms, weights = pg.relabel_closure(atoms, weights)
    return pg.FinitePrior(atoms, weights)


@st.composite
def tasks(draw, min_S=2, max_S=4, min_T=2, max_T=8, max_sequences=20_000, symmetrize=None):
    S = draw(st.integers(min_S, max_S))
    T_cap = max_T
    while S**T_cap > max_sequences and T_cap > min_T:
        T_cap -= 1
    graph = draw(graphs(min_T, T_cap))
    prior = draw(priors(S=S, symmetrize=symmetrize))
    return pg.Task(graph, prior)


@st.composite
def multi_graphs(draw, min_T=2, max_T=7, max_k=3):
    k = draw(st.integers(1, max_k))
    T = draw(st.integers(max(min_T, k, 2), max(max_T, k, 2)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    root_prob = draw(st.sampled_from([0.0, 0.3]))
    parents = np.full((T, k), -1, dtype=np.int64)
    for i in range(k, T):
        if rng.random() >= root_prob:
            parents[i] = np.sort(rng.choice(i, size=k, replace=False))
    target = np.sort(rng.choice(T, size=k, replace=False))
    return pg.MultiParentGraph(parents, target)


@st.composite
def tensor_priors(draw, S, k, max_atoms=3):
    K = draw(st.integers(1, max_atoms))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    alpha = draw(st.sampled_from([0.1, 1.0, 5.0]))
    atoms = rng.dirichlet(np.full(S, alpha), size=(K, S**k))
    atoms /= atoms.sum(axis=2, keepdims=True)
    raw = rng.uniform(0.1, 1.0, size=K)
    return pg.TensorPrior(atoms, raw / raw.sum(), k=k)


@st.composite
def multi_tasks(draw, max_S=3, max_T=7, max_k=3, max_sequences=3_000):
    S = draw(st.integers(2, max_S))
    T_cap = max_T
    while S**T_cap > max_sequences and T_cap > 2:
        T_cap -= 1
    graph = draw(multi_graphs(2, T_cap, max_k))
    return pg.MultiParentTask(graph, draw(tensor_priors(S, graph.k)))


def run_engine(task, A1, A2, eps, want_grad, engine, symmetry="auto", options=None):
    """One engine through the public API: ``exact_loss_and_grad`` or, without the gradient, ``exact_loss``.

    ``engine`` is ``"auto"``, ``"prefix"`` or ``"direct"`` (ignored for k-parent tasks, which have one engine).
    """
    if want_grad:
        return pg.exact_loss_and_grad(task, A1, A2, eps, symmetry=symmetry, engine=engine, options=options)
    return pg.LossAndGrad(pg.exact_loss(task, A1, A2, eps, symmetry=symmetry, engine=engine, options=options),
                          None, None)
