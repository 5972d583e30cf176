"""The Stage-1 field (DESIGN §12): counts vs enumeration vs the NumPy reference, the engine contract."""
import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import field as fieldmod
from popgrad.engine.field import (
    Stage1Field,
    field_atoms,
    stage1_field,
    stage1_field_from_atoms,
    stage1_field_numpy,
)
from popgrad import exact_loss_and_grad
from popgrad.task.priors import dirichlet_prior, relabel_closure

from ..strategies import parents_lists, priors

TOL = 1e-12


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def _three(task, eps=None):
    ref = stage1_field_numpy(task, eps)
    enum = stage1_field(task, eps, method="enumerate")
    cnt = stage1_field(task, eps, method="counts")
    return ref, enum, cnt


@st.composite
def forest_tasks(draw):
    S = draw(st.integers(2, 4))
    max_T = {2: 9, 3: 8, 4: 6}[S]
    parents = draw(parents_lists(2, max_T))
    prior = draw(priors(S=S, max_atoms=3, symmetrize=False))
    return pg.Task(pg.CausalGraph(parents), prior)


@settings(deadline=None, max_examples=30)
@given(forest_tasks(), st.sampled_from([None, 0.05, 1.0]))
def test_counts_enumerate_numpy_agree(task, eps):
    ref, enum, cnt = _three(task, eps)
    assert enum.method == "enumerate" and cnt.method == "counts"
    assert _rel(enum.M, ref) <= TOL
    assert _rel(cnt.M, ref) <= TOL
    assert np.all(np.triu(cnt.M, 1) == 0) and np.all(np.triu(enum.M, 1) == 0)


@pytest.mark.parametrize(
    "graph",
    [
        pg.chain(8),
        pg.icl_pairs(8),
        pg.icl_pairs(7),
        pg.random_tree(8, seed=2, root_prob=0.2),
        pg.CausalGraph([-1] * 7),  # all roots
        pg.chain(2),  # T = 2
        pg.CausalGraph([-1, 0, 0, 0, 0, 1, -1]),  # star
    ],
    ids=lambda g: g.to_string(),
)
def test_named_graphs(graph):
    task = pg.Task(graph, dirichlet_prior(3, 0.5, 3, seed=4, symmetrize=False))
    ref, enum, cnt = _three(task)
    assert _rel(enum.M, ref) <= TOL
    assert _rel(cnt.M, ref) <= TOL
    assert cnt.eps == task.default_eps


@pytest.mark.parametrize("graph", [pg.chain(14), pg.random_tree(14, seed=5, root_prob=0.1)], ids=["chain", "tree"])
def test_moderate_T_roots_of_unity(graph):
    """T = 14, S = 2: the N = T grid (even N, k = N/2 included) stays exact, sharp and symmetric priors."""
    for prior in (dirichlet_prior(2, 0.1, 3, seed=0, symmetrize=False), dirichlet_prior(2, 1.0, 2, seed=1)):
        task = pg.Task(graph, prior)
        enum = stage1_field(task, method="enumerate")
        cnt = stage1_field(task, method="counts")
        assert _rel(cnt.M, enum.M) <= TOL


def test_odd_T_and_per_atom():
    task = pg.Task(pg.random_tree(9, seed=1, root_prob=0.3), dirichlet_prior(2, 0.3, 3, seed=2, symmetrize=False))
    cnt = stage1_field(task, method="counts", per_atom=True)
    assert cnt.per_atom.shape == (3, 9, 9)
    assert np.allclose(np.tensordot(task.prior.weights, cnt.per_atom, axes=1), cnt.M, rtol=0, atol=1e-15)
    assert _rel(cnt.M, stage1_field_numpy(task)) <= TOL


def _softmax_rows_masked(A1):
    T = A1.shape[0]
    A = np.where(np.tri(T, dtype=bool), A1, -np.inf)
    P = np.exp(A - A.max(axis=1, keepdims=True))
    return P / P.sum(axis=1, keepdims=True)


@pytest.mark.parametrize(
    "graph", [pg.chain(7), pg.icl_pairs(7), pg.random_tree(7, seed=3, root_prob=0.2)], ids=["chain", "icl", "tree"]
)
def test_engine_contract(graph):
    """exact dA1[i] = J(P_i) (-(β0/T) M_i) to first order in β0 (DESIGN §12)."""
    S, T, beta0 = 3, graph.T, 1e-7
    task = pg.Task(graph, dirichlet_prior(S, 1.0, 3, seed=1, symmetrize=False))
    F = stage1_field(task, method="counts")
    A1 = np.random.default_rng(0).normal(size=(T, T))
    dA1 = exact_loss_and_grad(task, A1, beta0 * np.eye(S), F.eps).dA1
    P = _softmax_rows_masked(A1)
    for i in range(1, T):  # row 0: P_0 = e_0, J = 0 and dA1[0] = 0
        J = np.diag(P[i]) - np.outer(P[i], P[i])
        pred = J @ (-(beta0 / T) * F.M[i])
        assert _rel(pred, dA1[i]) <= 1e-5, i
    assert np.all(dA1[0] == 0)


def test_relabeling_invariance():
    base = dirichlet_prior(3, 0.5, 2, seed=7, symmetrize=False)
    atoms, weights = relabel_closure(base.atoms, base.weights)
    closed = pg.FinitePrior(atoms, weights)
    graph = pg.random_tree(7, seed=0, root_prob=0.2)
    fb = stage1_field(pg.Task(graph, base), method="counts").M
    # field_atoms reduces the closure to its base draws
    ha, hw = field_atoms(closed)
    assert np.array_equal(ha, base.atoms) and np.allclose(hw, base.weights, rtol=0, atol=1e-16)
    # full closure, no reduction: counts and enumeration
    fc = stage1_field_from_atoms(graph, atoms, weights).M
    fe = stage1_field(pg.Task(graph, closed), method="enumerate").M
    fr = stage1_field(pg.Task(graph, closed), method="counts").M
    for other in (fc, fe, fr):
        assert _rel(other, fb) <= 1e-13
    # field_atoms leaves a non-closed prior alone
    a, w = field_atoms(base)
    assert a is base.atoms or np.array_equal(a, base.atoms)


@pytest.mark.parametrize("name", ["enumerate", "counts_tree", "counts_chain"])
def test_thread_count_independence(name):
    parallel = pg.EngineOptions(field_parallel_min_work=0)  # always the parallel kernels
    serial = pg.EngineOptions(field_parallel_min_work=10**18)  # always the serial twins
    if name == "enumerate":
        task = pg.Task(pg.random_tree(9, seed=1, root_prob=0.2), dirichlet_prior(3, 0.5, 2, seed=3, symmetrize=False))
        run = lambda opts: stage1_field(task, method="enumerate", options=opts).M  # noqa: E731
    else:
        g = pg.chain(30) if name == "counts_chain" else pg.random_tree(30, seed=2)
        task = pg.Task(g, dirichlet_prior(3, 0.5, 2, seed=3, symmetrize=False))
        run = lambda opts: stage1_field(task, method="counts", options=opts).M  # noqa: E731
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        m1 = run(parallel)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        m2 = run(parallel)
    finally:
        numba.set_num_threads(old)
    m3 = run(serial)
    assert np.array_equal(m1, m2) and np.array_equal(m1, m3)


def test_auto_method():
    small = pg.Task(pg.chain(2), dirichlet_prior(4, 1.0, 1, seed=0, symmetrize=False))
    assert stage1_field(small).method == "enumerate"
    big = pg.Task(pg.chain(40), dirichlet_prior(3, 1.0, 1, seed=0, symmetrize=False))
    out = stage1_field(big)
    assert out.method == "counts" and isinstance(out, Stage1Field) and out.M.shape == (40, 40)


def test_validation():
    task = pg.Task(pg.chain(4), dirichlet_prior(2, 1.0, 1, seed=0, symmetrize=False))
    with pytest.raises(TypeError, match="task"):
        stage1_field("not a task")
    with pytest.raises(TypeError, match="eps"):
        stage1_field(task, eps="0.1")
    with pytest.raises(TypeError, match="eps"):
        stage1_field(task, eps=True)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps"):
            stage1_field(task, eps=bad)
    with pytest.raises(TypeError, match="method"):
        stage1_field(task, method=3)
    with pytest.raises(ValueError, match="method must be one of"):
        stage1_field(task, method="fft")
    with pytest.raises(ValueError, match="per_atom"):
        stage1_field(task, method="enumerate", per_atom=True)
    with pytest.raises(TypeError, match="graph"):
        stage1_field_from_atoms("-1,0,-1", task.prior.atoms)
    with pytest.raises(pg.TaskTooLargeError):
        stage1_field(pg.Task(pg.chain(30), task.prior), method="enumerate")

    mtask = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(2, 2, 1.0, 1, seed=0, symmetrize=False))
    with pytest.raises(ValueError, match="single-parent"):
        stage1_field(mtask)


def test_chain_kernel_matches_forest_kernel_at_large_T():
    """No enumeration at T = 120: the chain (Toeplitz) and forest (clamped-pass) kernels agree."""
    g = pg.chain(120)
    pr = dirichlet_prior(2, 0.1, 1, seed=0, symmetrize=False)
    pi, mu, eps = np.ascontiguousarray(pr.atoms[0]), np.ascontiguousarray(pr.stationary[0]), g.t_eff**-0.5
    a = fieldmod._atom_field_counts(g, pi, mu, eps, None, True, pg.DEFAULT_OPTIONS)
    b = fieldmod._atom_field_counts(g, pi, mu, eps, fieldmod._forest_arrays(g.parents), False, pg.DEFAULT_OPTIONS)
    assert _rel(a, b) <= 1e-12
