"""The k-head engine specifics (issue 7): k = 1 equivalence, head permutations, large scores, references.

The invariants every engine and task kind shares are in ``test_exact.py`` (parametrized over the task kind).
"""
import itertools
from typing import NamedTuple

import numpy as np
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import reference
from popgrad.task.multigraphs import MultiParentGraph
from popgrad.task.tasks import sequence_weights_multi_numpy
from popgrad.task.tensor_priors import TensorPrior
from popgrad.engine import baselines

from ..strategies import graphs, multi_tasks


class Tolerances(NamedTuple):
    engines: float  # numba vs NumPy reference (relative to the gradient's max entry)
    equivalence: float  # k = 1 model vs the single-parent engine
    finite_difference: float  # gradients vs central differences (relative)
    invariant: float  # exact identities
    grad_floor: float  # smallest gradient scale (entries are sums of O(1) terms with cancellation)


TOL = Tolerances(engines=1e-12, equivalence=1e-12, finite_difference=1e-6, invariant=1e-12, grad_floor=1e-3)
FD_STEP = 1e-5


@st.composite
def params(draw, task, scales=(0.1, 1.0, 3.0)):
    """Random ``A1 (k, T, T)`` (full: the upper triangles must not matter) and non-symmetric ``A2 (k, S, S)``."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    s1, s2 = draw(st.sampled_from(scales)), draw(st.sampled_from(scales))
    return s1 * rng.normal(size=(task.k, task.T, task.T)), s2 * rng.normal(size=(task.k, task.S, task.S))


def rel_err(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def grad_err(res, ref):
    scale = max(np.max(np.abs(ref.dA1)), np.max(np.abs(ref.dA2)), TOL.grad_floor)
    return max(np.max(np.abs(res.dA1 - ref.dA1)), np.max(np.abs(res.dA2 - ref.dA2))) / scale


def assert_close(res, ref, tol):
    assert rel_err(res.loss, ref.loss) <= tol, (res.loss, ref.loss)
    assert grad_err(res, ref) <= tol, grad_err(res, ref)


def small_task(graph=None, S=2, n_atoms=2, seed=0, symmetrize=True):
    graph = pg.two_parent(6) if graph is None else graph
    return pg.MultiParentTask(graph, pg.dirichlet_tensor_prior(S, graph.k, 1.0, n_atoms, seed, symmetrize=symmetrize))


# ================================================================ engines
def test_large_scores_are_safe():
    """The per-sequence max shift: A2 ~ 1e3 (the construction at large β2) stays finite and exact."""
    task = small_task(pg.ngram(6, 3))
    A1, A2 = baselines.construction_params(task.graph, 2, 30.0, 2000.0)
    A2[0, 0, 1] = -1500.0
    res, ref = pg.exact_loss_and_grad(task, A1, A2), reference.exact_loss_and_grad_numpy(task, A1, A2)
    assert np.isfinite(res.loss) and np.all(np.isfinite(res.dA1)) and np.all(np.isfinite(res.dA2))
    assert_close(res, ref, TOL.engines)


# =========================================================== k = 1 model
def doubly_stochastic_prior(S, n_atoms, seed):
    """Mixtures of permutation matrices: ``μ_π`` is uniform, so the single-parent roots draw uniformly too."""
    rng = np.random.default_rng(seed)
    perms = [np.eye(S)[list(p)] for p in itertools.permutations(range(S))]
    atoms = np.array([np.tensordot(rng.dirichlet(np.ones(len(perms))), perms, axes=1) for _ in range(n_atoms)])
    return pg.FinitePrior(atoms / atoms.sum(axis=2, keepdims=True))


@settings(max_examples=20)
@given(st.data())
def test_k1_model_is_the_single_parent_model(data):
    """One head whose last row attends to itself: loss, dA1, dA2 and f equal the single-parent engine's."""
    S = data.draw(st.integers(2, 3))
    g = data.draw(graphs(2, 7 if S == 2 else 6))
    prior = doubly_stochastic_prior(S, data.draw(st.integers(1, 3)), data.draw(st.integers(0, 1000)))
    single = pg.Task(g, prior)
    multi = pg.MultiParentTask(MultiParentGraph.from_single(g), TensorPrior.from_finite(prior))
    assert multi.default_eps == single.default_eps
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    T = g.T
    A1, A2 = rng.normal(size=(T, T)), rng.normal(size=(S, S))
    A1[T - 1, : T - 1] = -1000.0  # P[T-1] = e_{T-1} exactly in float64 (exp(-1000) = 0)
    eps = data.draw(st.sampled_from([None, 0.05]))
    ref = pg.exact_loss_and_grad(single, A1, A2, eps)
    res = pg.exact_loss_and_grad(multi, A1[None], A2[None], eps)
    assert rel_err(res.loss, ref.loss) <= TOL.equivalence
    scale = max(np.abs(ref.dA1).max(), np.abs(ref.dA2).max(), TOL.grad_floor)
    assert np.abs(res.dA1[0] - ref.dA1).max() <= TOL.equivalence * scale
    assert np.abs(res.dA2[0] - ref.dA2).max() <= TOL.equivalence * scale
    seqs, _ = single.all_sequences()
    np.testing.assert_allclose(pg.predict_multi(A1[None], A2[None], seqs), pg.predict(A1, A2, seqs),
                               rtol=0, atol=TOL.equivalence)


# ============================================================ invariants
@settings(max_examples=25)
@given(st.data())
def test_shifts_and_head_permutations_leave_the_loss_unchanged(data):
    task = data.draw(multi_tasks(max_S=3, max_T=6, max_k=3, max_sequences=2_000))
    A1, A2 = data.draw(params(task))
    h = data.draw(st.integers(0, task.k - 1))
    i = data.draw(st.integers(0, task.T - 1))
    b = data.draw(st.integers(0, task.S - 1))
    c = data.draw(st.floats(-3, 3))
    L0 = pg.exact_loss(task, A1, A2)
    A1s, A2s = A1.copy(), A2.copy()
    A1s[h, i] += c
    A2s[h, b] += c  # a row of A2^h: every score moves by c·Q^h[b]
    assert rel_err(pg.exact_loss(task, A1s, A2), L0) <= TOL.invariant
    assert rel_err(pg.exact_loss(task, A1, A2s), L0) <= TOL.invariant
    perm = np.random.default_rng(h).permutation(task.k)
    res, resp = pg.exact_loss_and_grad(task, A1, A2), pg.exact_loss_and_grad(task, A1[perm], A2[perm])
    assert rel_err(resp.loss, res.loss) <= TOL.invariant
    assert grad_err(resp, res._replace(dA1=res.dA1[perm], dA2=res.dA2[perm])) <= TOL.invariant


# ======================================================= reference losses
def test_optimal_loss_by_enumeration():
    task = small_task(pg.two_parent(5), n_atoms=2, symmetrize=False)
    seqs, _ = task.all_sequences()
    parents, tp, atoms, _ = task.kernel_arrays()
    total = 0.0
    for m, wm in enumerate(task.prior.weights):
        p = sequence_weights_multi_numpy(seqs, parents, tp, atoms[m : m + 1], np.ones(1)).sum(axis=1)
        rows = atoms[m][seqs[:, tp[0]] * 2 + seqs[:, tp[1]]]
        total -= wm * np.sum(p * np.sum(rows * np.log(rows + 0.1), axis=1))
    assert rel_err(pg.optimal_loss(task, eps=0.1), total) <= 1e-12


def test_model_at_huge_beta_is_the_model_limit_on_sequences():
    g = pg.random_multi_parent(8, 2, seed=2, root_prob=0.3)
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, 2, size=(300, 8))
    seqs[:20] = seqs[:20, :1]  # constant sequences exercise the root ties
    A1, A2 = baselines.construction_params(g, 2, 4000.0, 4000.0)
    np.testing.assert_allclose(pg.predict_multi(A1, A2, seqs),
                               baselines.count_estimator_predict(g, seqs, 2, model_limit=True), rtol=0, atol=1e-12)


