"""Multi-parent graphs, transition-tensor priors and their exact weights (popgrad.task.multigraphs, tensor_priors, tasks; issue 7)."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings

import popgrad as pg
from popgrad.task.multigraphs import MultiParentGraph
from popgrad.task.tasks import sequence_weights_multi_numpy
from popgrad.task.tensor_priors import TensorPrior, relabel_tensor

from ..strategies import graphs, multi_graphs, multi_tasks

TOL_WEIGHTS = 1e-12  # numba vs NumPy weights, relative (same products in the same order: usually bit-equal)


# ================================================================ graphs
def test_builders():
    g = pg.ngram(6, 3)
    assert g.k == 2 and g.T == 6
    np.testing.assert_array_equal(g.parents, [[-1, -1], [-1, -1], [0, 1], [1, 2], [2, 3], [3, 4]])
    np.testing.assert_array_equal(g.target_parents, [4, 5])
    g = pg.two_parent(7)
    expected = [[-1, -1], [-1, -1], [0, 1], [1, 2], [1, 3], [2, 4], [2, 5]]
    np.testing.assert_array_equal(g.parents, expected)
    np.testing.assert_array_equal(g.target_parents, [3, 6])  # ((T-1)//2, T-1)
    # the released notebook's dag for seq_len = T
    dag = [[], []] + [[(i - 1) // 2, i - 1] for i in range(2, 7 + 1)]
    assert [list(r) for r in expected[2:]] == dag[2:7] and dag[7] == list(g.target_parents)
    a, b = pg.random_multi_parent(9, 3, seed=5, root_prob=0.2), pg.random_multi_parent(9, 3, seed=5, root_prob=0.2)
    assert a == b and hash(a) == hash(b) and a.k == 3
    assert pg.random_multi_parent(9, 3, seed=6) != a


def test_slot_adjacency_and_edges():
    g = pg.two_parent(6)
    for h in range(2):
        adj = g.adjacency(h)
        np.testing.assert_array_equal(adj.sum(axis=1), [0, 0, 1, 1, 1, 1])
        assert adj[5, g.target_parents[h]] == 1.0  # the last row carries the target's parents
    assert g.adjacency(1)[5, 5] == 1.0  # slot i-1 of the target is position T-1 itself
    edges = g.edge_adjacency()
    assert edges[5, 2] == edges[5, 4] == 1.0 and edges.sum() == 2 * len(g.non_roots)
    with pytest.raises(ValueError, match="parent slot h must be an integer in 0..1"):
        g.adjacency(2)


@given(multi_graphs())
def test_text_form_round_trips(g):
    assert MultiParentGraph.from_string(g.to_string()) == g


@given(graphs(2, 9))
def test_k1_graph_has_the_single_parent_t_eff(g):
    m = MultiParentGraph.from_single(g)
    assert m.k == 1 and m.t_eff == g.t_eff
    np.testing.assert_array_equal(m.roots, g.roots)


def test_t_eff_of_multi_parent_graphs():
    assert pg.ngram(8, 3).t_eff == 8.0  # one component, one sink
    assert pg.two_parent(9).t_eff == 9.0
    g = MultiParentGraph([[-1, -1], [-1, -1], [0, 1], [0, 1], [-1, -1]], [2, 3])
    # components {0,1,2,3} (sinks 2, 3) and {4} (sink 4)
    assert g.max_sinks == 2 and g.t_eff == 2.5


@pytest.mark.parametrize(
    "parents, target, match",
    [
        ([-1, 0, 1], [2], r"parents must have shape \(T, k\), got a 1-D array.*reshape\(-1, 1\)"),
        ([[-1, -1], [-1, -1], [-1, 0]], [0, 1], r"parents\[2\] = \[-1, 0\] mixes -1 with parents"),
        ([[-1, -1], [-1, -1], [0, 2]], [0, 1], r"parents\[2\] = \[0, 2\]: parent 2 must be < 2"),
        ([[-1, -1], [0, 0], [0, 1]], [0, 1], r"parents\[1\] = \[0, 0\]: parent 0|parents\[1\] = \[0, 0\] repeats"),
        ([[-1, -1], [-1, -1], [1, 0]], [0, 1], r"parents\[2\] = \[1, 0\] must be strictly increasing.*sort"),
        ([[-1, -1], [-1, -1], [1, 1]], [0, 1], r"parents\[2\] = \[1, 1\] repeats a position"),
        ([[-1, -1], [-1, -1], [0, 1]], [0, 3], r"target_parents\[1\] = 3 is out of range.*0..2"),
        ([[-1, -1], [-1, -1], [0, 1]], [1, 0], r"target_parents = \[1, 0\] must be strictly increasing"),
        ([[-1, -1], [-1, -1], [0, 1]], [1, 1], r"target_parents = \[1, 1\] repeats"),
        ([[-1, -1], [-1, -1], [0, 1]], [1], r"target_parents must have shape \(k,\) = \(2,\)"),
        ([[-1, -1]], [0, 1], "T >= 2"),
        ([[-1, -1], [-1, -1], [0.5, 1]], [0, 1], "must hold integers"),
    ],
)
def test_graph_validation_names_index_and_fix(parents, target, match):
    with pytest.raises(ValueError, match=match):
        MultiParentGraph(parents, target)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: pg.ngram(5, 1), "n must be an integer >= 2"),
        (lambda: pg.ngram(2, 4), r"the target needs n-1 = 3 parents, use T >= 3"),
        (lambda: pg.two_parent(1), "T must be an integer >= 2"),
        (lambda: pg.random_multi_parent(5, 2, 0, root_prob=2), r"root_prob must be in \[0, 1\]"),
        (lambda: MultiParentGraph.from_string("0,1;2"), "must look like"),
        (lambda: MultiParentGraph.from_string("-;-;0,x>0,1"), "cannot parse"),
    ],
)
def test_builder_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ================================================================ priors
def test_tensor_prior_forms_and_k1_equivalence():
    rng = np.random.default_rng(0)
    flat = rng.dirichlet(np.ones(3), size=(2, 9))
    flat /= flat.sum(axis=2, keepdims=True)
    p1, p2 = TensorPrior(flat), TensorPrior(flat.reshape(2, 3, 3, 3))
    assert p1.k == p2.k == 2 and p1.K == 2 and p1.S == 3
    np.testing.assert_array_equal(p1.atoms, p2.atoms)
    np.testing.assert_array_equal(p1.tensors[1, 2, 0], flat[1, 6])  # row r = a1*S + a2
    assert TensorPrior(flat[0].reshape(3, 3, 3), k=2).K == 1
    assert TensorPrior(flat[0]).k == 2  # a single flat atom
    # k = 1: the same draws as the single-parent Dirichlet prior
    single = pg.dirichlet_prior(3, 1.0, 4, seed=7, symmetrize=False)
    tensor = pg.dirichlet_tensor_prior(3, 1, 1.0, 4, seed=7, symmetrize=False)
    np.testing.assert_array_equal(single.atoms, tensor.atoms)
    np.testing.assert_array_equal(
        pg.dirichlet_prior(3, 1.0, 2, seed=1).atoms, pg.dirichlet_tensor_prior(3, 1, 1.0, 2, seed=1).atoms
    )


@pytest.mark.parametrize(
    "atoms, kwargs, match",
    [
        (np.full((1, 4, 2), 0.5) - np.array([0, 0, 0, 1.0])[None, :, None] * [1, -1],
         {}, r"row π\(· \| 1, 1\) of atoms\[0\] is|is -0.5 < 0"),
        (np.full((1, 4, 2), 0.6), {}, r"row π\(· \| 0, 0\) of atoms\[0\] sums to 1.2"),
        (np.full((1, 5, 2), 0.5), {}, "flat atoms need S\\*\\*k rows"),
        (np.full((1, 4, 2), np.nan), {}, "non-finite"),
        (np.full((2, 4, 2), 0.5), dict(weights=[0.5, 0.6]), "weights sum to"),
        (np.full((2, 4, 2), 0.5), dict(weights=[1.0]), r"weights must have shape \(2,\)"),
        (np.full((1, 4, 2), 0.5), dict(k=3), "do not hold k = 3"),
    ],
)
def test_tensor_prior_validation(atoms, kwargs, match):
    with pytest.raises(ValueError, match=match):
        TensorPrior(atoms, **kwargs)


def test_relabeling_closures():
    p = pg.dirichlet_tensor_prior(3, 2, 1.0, 2, seed=0)
    assert p.K == 12 and p.is_relabeling_closed()
    assert not pg.dirichlet_tensor_prior(3, 2, 1.0, 2, seed=0, symmetrize=False).is_relabeling_closed()
    full = pg.dirichlet_tensor_prior(3, 2, 1.0, 1, seed=0, symmetrize="full")
    d = full.diagnostics()
    assert full.K == 36 and d.symmetric and d.uniform_mean and d.uniform_mean_error <= 1e-15
    assert not p.diagnostics().uniform_mean  # relabeling alone leaves E[π] non-uniform for finite draws
    # relabel_tensor is the single-parent relabel for k = 1
    pi = pg.dirichlet_prior(3, 1.0, 1, seed=3, symmetrize=False).atoms[0]
    np.testing.assert_array_equal(relabel_tensor(pi, (2, 0, 1)), pg.relabel(pi, (2, 0, 1)))
    with pytest.raises(ValueError, match="symmetrize must be"):
        pg.dirichlet_tensor_prior(2, 2, 1.0, 1, seed=0, symmetrize="yes")


# ============================================================ the task
@settings(max_examples=25)
@given(multi_tasks())
def test_numba_weights_match_numpy_and_sum_to_one(task):
    seqs, w = task.all_sequences()
    parents, tp, atoms, _ = task.kernel_arrays()
    ref = sequence_weights_multi_numpy(seqs, parents, tp, atoms, task.prior.weights)
    assert np.max(np.abs(w - ref)) <= TOL_WEIGHTS * max(ref.max(), 1e-300)
    assert abs(w.sum() - 1.0) <= 1e-12
    assert np.all(w >= 0)
    # lexicographic order, position T-1 fastest
    np.testing.assert_array_equal(seqs, np.array(list(itertools.product(range(task.S), repeat=task.T))))


def test_weights_by_hand():
    """T = 3, k = 2: roots 0, 1 uniform, s_2 ~ π(·|s_0, s_1), target ~ π(·|s_1, s_2)."""
    g = MultiParentGraph([[-1, -1], [-1, -1], [0, 1]], [1, 2])
    rng = np.random.default_rng(4)
    atoms = rng.dirichlet(np.ones(2), size=(2, 4))
    atoms /= atoms.sum(axis=2, keepdims=True)
    task = pg.MultiParentTask(g, TensorPrior(atoms, [0.3, 0.7]))
    seqs, w = task.all_sequences()
    for s, row in zip(seqs, w):
        expected = sum(
            pk * 0.25 * atoms[m, 2 * s[0] + s[1], s[2]] * atoms[m, 2 * s[1] + s[2], :]
            for m, pk in enumerate([0.3, 0.7])
        )
        np.testing.assert_allclose(row, expected, rtol=1e-14)


def test_chunked_enumeration_equals_one_chunk():
    task = pg.MultiParentTask(pg.two_parent(6), pg.dirichlet_tensor_prior(3, 2, 1.0, 1, seed=0))
    seqs, w = task.all_sequences()
    parts = list(task.enumerate(chunk_size=100))
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), seqs)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), w)


def test_sampling_matches_exact_weights():
    task = pg.MultiParentTask(pg.ngram(4, 3), pg.dirichlet_tensor_prior(2, 2, 1.0, 2, seed=1))
    seqs, w = task.all_sequences()
    sample = task.sample(40_000, seed=3)
    idx = sample.seqs @ (2 ** np.arange(3, -1, -1))
    freq = np.bincount(idx, minlength=16) / 40_000
    p = w.sum(axis=1)
    assert np.max(np.abs(freq - p)) < 5 * np.sqrt(p.max() / 40_000)
    rows = sample.seqs[:, 2] * 2 + sample.seqs[:, 3]
    np.testing.assert_array_equal(sample.targets, task.prior.atoms[sample.atoms, rows])
    a, b = task.sample(10, seed=1), task.sample(10, seed=1)
    np.testing.assert_array_equal(a.seqs, b.seqs)


def test_task_validation_and_summary():
    g = pg.two_parent(5)
    with pytest.raises(ValueError, match="the prior's tensors have k = 1 parents but the graph has k = 2"):
        pg.MultiParentTask(g, pg.dirichlet_prior(2, 1.0, 1, 0))
    with pytest.raises(ValueError, match="graph must be a popgrad.MultiParentGraph"):
        pg.MultiParentTask("g", pg.dirichlet_tensor_prior(2, 2, 1.0, 1, 0))
    task = pg.MultiParentTask(pg.chain(4), pg.dirichlet_prior(2, 1.0, 1, 0))  # k = 1 from single-parent pieces
    assert task.k == 1 and task.t_eff == pg.chain(4).t_eff and task.default_eps == task.t_eff**-0.5
    text = pg.MultiParentTask(g, pg.dirichlet_tensor_prior(2, 2, 1.0, 1, 0)).summary()
    assert "k=2" in text and "T_eff" in text and "relabeling-symmetric" in text


def test_size_guard_runs_before_any_work():
    task = pg.MultiParentTask(pg.ngram(14, 3), pg.dirichlet_tensor_prior(3, 2, 1.0, 1, 0), max_sequences=1000)
    A1, A2 = np.zeros((2, 14, 14)), np.zeros((2, 3, 3))
    calls = [
        lambda: next(task.enumerate()),
        lambda: pg.exact_loss_and_grad(task, A1, A2),
        lambda: pg.exact_loss(task, A1, A2),
        lambda: pg.bayes_loss(task),
        lambda: pg.optimal_loss(task),
        lambda: pg.count_estimator_loss(task),
        lambda: pg.construction_loss(task, 1.0, 1.0),
        lambda: pg.train_multi_head(task, steps1=1),
    ]
    for call in calls:
        with pytest.raises(pg.TaskTooLargeError, match=r"S\*\*T = 3\*\*14 = 4,782,969 sequences exceeds"):
            call()
    assert math.isfinite(task.t_eff)
