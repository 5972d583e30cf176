"""The k-head model: exact loss and gradients, k = 1 equivalence, references, training, checks (issue 7)."""
import itertools
import os
import subprocess
import sys
import textwrap
import warnings
from typing import NamedTuple

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad import checks, multihead as mh
from popgrad.multiparent import MultiParentGraph, TensorPrior

from .strategies import graphs
from .test_multiparent import multi_tasks


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
@settings(max_examples=30)
@given(st.data())
def test_numba_matches_numpy_reference(data):
    task = data.draw(multi_tasks(max_S=3, max_T=7, max_k=3, max_sequences=3_000))
    A1, A2 = data.draw(params(task))
    eps = data.draw(st.sampled_from([None, 0.05]))
    ref = mh.exact_loss_and_grad_multi_numpy(task, A1, A2, eps)
    assert_close(pg.exact_loss_and_grad_multi(task, A1, A2, eps), ref, TOL.engines)
    assert rel_err(pg.exact_loss_multi(task, A1, A2, eps), ref.loss) <= TOL.engines


@settings(max_examples=15)
@given(st.data())
def test_loss_matches_predict_multi_over_all_sequences(data):
    task = data.draw(multi_tasks(max_S=3, max_T=6, max_k=2, max_sequences=1_000))
    A1, A2 = data.draw(params(task))
    seqs, w = task.all_sequences()
    f = pg.predict_multi(A1, A2, seqs)
    pos = w > 0
    ref = float(-np.sum(w[pos] * np.log(f[pos] + task.default_eps)))
    assert rel_err(pg.exact_loss_multi(task, A1, A2), ref) <= TOL.engines


@pytest.mark.parametrize("graph", [pg.two_parent(9), pg.ngram(9, 3), pg.random_multi_parent(9, 2, seed=1, root_prob=0.3)])
def test_multi_block_tasks_match_reference(graph, monkeypatch):
    """Several blocks (a smaller block size) on the parallel path: same sums as the reference."""
    monkeypatch.setattr(mh, "BLOCK_SEQUENCES", 64)
    monkeypatch.setattr(mh, "PARALLEL_MIN_SEQUENCES", 1)
    task = small_task(graph, S=2, n_atoms=2)
    assert mh._n_fixed(2, 9) >= 2
    rng = np.random.default_rng(1)
    A1, A2 = rng.normal(size=(2, 9, 9)), rng.normal(size=(2, 2, 2))
    assert_close(pg.exact_loss_and_grad_multi(task, A1, A2), mh.exact_loss_and_grad_multi_numpy(task, A1, A2),
                 TOL.engines)


def test_large_scores_are_safe():
    """The per-sequence max shift: A2 ~ 1e3 (the construction at large β2) stays finite and exact."""
    task = small_task(pg.ngram(6, 3))
    A1, A2 = mh.construction_params(task.graph, 2, 30.0, 2000.0)
    A2[0, 0, 1] = -1500.0
    res, ref = pg.exact_loss_and_grad_multi(task, A1, A2), mh.exact_loss_and_grad_multi_numpy(task, A1, A2)
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
    res = pg.exact_loss_and_grad_multi(multi, A1[None], A2[None], eps)
    assert rel_err(res.loss, ref.loss) <= TOL.equivalence
    scale = max(np.abs(ref.dA1).max(), np.abs(ref.dA2).max(), TOL.grad_floor)
    assert np.abs(res.dA1[0] - ref.dA1).max() <= TOL.equivalence * scale
    assert np.abs(res.dA2[0] - ref.dA2).max() <= TOL.equivalence * scale
    seqs, _ = single.all_sequences()
    np.testing.assert_allclose(pg.predict_multi(A1[None], A2[None], seqs), pg.predict(A1, A2, seqs),
                               rtol=0, atol=TOL.equivalence)


# ===================================================== finite differences
@settings(max_examples=15)
@given(st.data())
def test_gradients_match_central_differences(data):
    task = data.draw(multi_tasks(max_S=3, max_T=5, max_k=2, max_sequences=250))
    A1, A2 = data.draw(params(task, scales=(0.3, 1.0)))
    eps = data.draw(st.sampled_from([None, 0.01]))
    res = pg.exact_loss_and_grad_multi(task, A1, A2, eps)
    k, T, S = task.k, task.T, task.S
    scale = max(np.abs(res.dA1).max(), np.abs(res.dA2).max(), TOL.grad_floor)

    def fd(M, idx, other_first):
        Mp, Mm = M.copy(), M.copy()
        Mp[idx] += FD_STEP
        Mm[idx] -= FD_STEP
        args = ((Mp, A2), (Mm, A2)) if other_first else ((A1, Mp), (A1, Mm))
        return (pg.exact_loss_multi(task, *args[0], eps) - pg.exact_loss_multi(task, *args[1], eps)) / (2 * FD_STEP)

    for h in range(k):
        for i in range(T):
            for j in range(i + 1):
                assert abs(fd(A1, (h, i, j), True) - res.dA1[h, i, j]) <= TOL.finite_difference * scale
        for a, b in itertools.product(range(S), repeat=2):
            assert abs(fd(A2, (h, a, b), False) - res.dA2[h, a, b]) <= TOL.finite_difference * scale


# ============================================================ invariants
@settings(max_examples=25)
@given(st.data())
def test_gradient_invariants(data):
    task = data.draw(multi_tasks(max_S=3, max_T=7, max_k=3, max_sequences=3_000))
    A1, A2 = data.draw(params(task))
    res = pg.exact_loss_and_grad_multi(task, A1, A2)
    T, S = task.T, task.S
    assert res.dA1.shape == (task.k, T, T) and res.dA2.shape == (task.k, S, S)
    assert np.all(res.dA1[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0.0)
    scale = max(np.abs(res.dA1).max(), np.abs(res.dA2).max(), TOL.grad_floor)
    assert np.abs(res.dA1.sum(axis=2)).max() <= TOL.invariant * scale * T
    assert np.abs(res.dA2.sum(axis=2)).max() <= TOL.invariant * scale * S


@settings(max_examples=25)
@given(st.data())
def test_shifts_and_head_permutations_leave_the_loss_unchanged(data):
    task = data.draw(multi_tasks(max_S=3, max_T=6, max_k=3, max_sequences=2_000))
    A1, A2 = data.draw(params(task))
    h = data.draw(st.integers(0, task.k - 1))
    i = data.draw(st.integers(0, task.T - 1))
    b = data.draw(st.integers(0, task.S - 1))
    c = data.draw(st.floats(-3, 3))
    L0 = pg.exact_loss_multi(task, A1, A2)
    A1s, A2s = A1.copy(), A2.copy()
    A1s[h, i] += c
    A2s[h, b] += c  # a row of A2^h: every score moves by c·Q^h[b]
    assert rel_err(pg.exact_loss_multi(task, A1s, A2), L0) <= TOL.invariant
    assert rel_err(pg.exact_loss_multi(task, A1, A2s), L0) <= TOL.invariant
    perm = np.random.default_rng(h).permutation(task.k)
    res, resp = pg.exact_loss_and_grad_multi(task, A1, A2), pg.exact_loss_and_grad_multi(task, A1[perm], A2[perm])
    assert rel_err(resp.loss, res.loss) <= TOL.invariant
    assert grad_err(resp, res._replace(dA1=res.dA1[perm], dA2=res.dA2[perm])) <= TOL.invariant


# =========================================================== determinism
def test_two_calls_are_bit_identical():
    task = small_task(pg.two_parent(8), S=3, n_atoms=1)
    rng = np.random.default_rng(2)
    A1, A2 = rng.normal(size=(2, 8, 8)), rng.normal(size=(2, 3, 3))
    a, b = pg.exact_loss_and_grad_multi(task, A1, A2), pg.exact_loss_and_grad_multi(task, A1, A2)
    assert a.loss == b.loss
    np.testing.assert_array_equal(a.dA1, b.dA1)
    np.testing.assert_array_equal(a.dA2, b.dA2)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs at least 2 numba threads")
def test_one_and_two_threads_are_bit_identical(monkeypatch):
    monkeypatch.setattr(mh, "BLOCK_SEQUENCES", 256)
    monkeypatch.setattr(mh, "PARALLEL_MIN_SEQUENCES", 1)
    task = small_task(pg.two_parent(8), S=3, n_atoms=1)  # 6,561 sequences, 9 blocks
    assert mh._n_fixed(3, 8) == 2
    rng = np.random.default_rng(7)
    A1, A2 = rng.normal(size=(2, 8, 8)), rng.normal(size=(2, 3, 3))
    before = numba.get_num_threads()
    try:
        out = {}
        for n in (1, 2):
            numba.set_num_threads(n)
            out[n] = pg.exact_loss_and_grad_multi(task, A1, A2)
    finally:
        numba.set_num_threads(before)
    assert out[1].loss == out[2].loss
    np.testing.assert_array_equal(out[1].dA1, out[2].dA1)
    np.testing.assert_array_equal(out[1].dA2, out[2].dA2)


def test_thread_count_independence_in_a_fresh_process():
    """NUMBA_NUM_THREADS=1 and =2 in separate processes (59,049 sequences: 9 blocks on the parallel path)."""
    code = textwrap.dedent(
        """
        import numpy as np, popgrad as pg
        task = pg.MultiParentTask(pg.two_parent(10), pg.dirichlet_tensor_prior(3, 2, 1.0, 1, 0, symmetrize=False))
        rng = np.random.default_rng(7)
        r = pg.exact_loss_and_grad_multi(task, rng.normal(size=(2, 10, 10)), rng.normal(size=(2, 3, 3)))
        print(repr(r.loss), r.dA1.tobytes().hex(), r.dA2.tobytes().hex())
        """
    )
    outs = []
    for n in ("1", "2"):
        env = {**os.environ, "NUMBA_NUM_THREADS": n}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1]


# ==================================================== ε = 0 and errors
def test_eps_zero_gives_inf_not_nan_with_a_warning():
    task = small_task(pg.two_parent(5))
    A1, A2 = np.zeros((2, 5, 5)), np.stack([np.eye(2)] * 2)
    A2[:, 0, 0] = A2[:, 1, 1] = 50.0  # sharp: some possible tokens get (numerically) zero mass
    A1 = mh.construction_params(task.graph, 2, 50.0, 50.0)[0]
    with pytest.warns(RuntimeWarning, match="infinite"):
        res = pg.exact_loss_and_grad_multi(task, A1, A2, eps=0)
    assert res.loss == np.inf and np.all(np.isnan(res.dA1)) and np.all(np.isnan(res.dA2))
    with pytest.warns(RuntimeWarning, match="infinite") as record:
        assert pg.exact_loss_multi(task, A1, A2, eps=0.0) == np.inf
    assert record[0].filename == __file__


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(A1=np.zeros((2, 4, 4))), r"A1 must have shape \(k, T, T\) = \(2, 5, 5\)"),
        (dict(A1=np.zeros((5, 5))), r"A1 must have shape \(k, n, n\)"),
        (dict(A2=np.zeros((1, 2, 2))), r"A2 must have shape \(k, S, S\) = \(2, 2, 2\)"),
        (dict(A1=np.full((2, 5, 5), np.nan)), r"A1\[0, 0, 0\] = nan is not finite"),
        (dict(eps=-1.0), "eps must be a finite number >= 0"),
        (dict(task=pg.Task(pg.chain(5), pg.dirichlet_prior(2, 1.0, 1, 0))), "task must be a popgrad.MultiParentTask"),
    ],
)
@pytest.mark.parametrize("fn", [pg.exact_loss_and_grad_multi, pg.exact_loss_multi, mh.exact_loss_and_grad_multi_numpy])
def test_validation_errors(fn, kwargs, match):
    args = dict(task=small_task(pg.two_parent(5)), A1=np.zeros((2, 5, 5)), A2=np.zeros((2, 2, 2)), eps=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fn(args["task"], args["A1"], args["A2"], args["eps"])


def test_result_is_a_frozen_named_tuple():
    res = pg.exact_loss_and_grad_multi(small_task(pg.two_parent(3)), np.zeros((2, 3, 3)), np.zeros((2, 2, 2)))
    assert isinstance(res, pg.MultiLossAndGrad) and isinstance(res.loss, float)
    with pytest.raises(AttributeError):
        res.loss = 0.0


# ======================================================= reference losses
@settings(max_examples=15)
@given(st.data())
def test_reference_loss_ordering(data):
    """``L* ≤ L_Bayes ≤ L(A1, A2)`` at ``ε = 0``; a single atom's Bayes loss is ``L*``."""
    task = data.draw(multi_tasks(max_S=3, max_T=6, max_k=2, max_sequences=1_000))
    A1, A2 = data.draw(params(task))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        loss = pg.exact_loss_multi(task, A1, A2, eps=0.0)
    l_star, l_bayes = pg.optimal_loss_multi(task), pg.bayes_loss_multi(task)
    assert l_star <= l_bayes * (1 + 1e-12) + 1e-12 and l_bayes <= loss
    single = pg.MultiParentTask(task.graph, TensorPrior(task.prior.atoms[:1]))
    # a single atom's Bayes loss is L*: equal up to the rounding of a sum of O(1) terms (the value may be ~1e-7)
    assert abs(pg.bayes_loss_multi(single) - pg.optimal_loss_multi(single)) <= 1e-10 * max(pg.optimal_loss_multi(single), 1e-3)


def test_optimal_loss_by_enumeration():
    task = small_task(pg.two_parent(5), n_atoms=2, symmetrize=False)
    seqs, _ = task.all_sequences()
    parents, tp, atoms, _ = task.kernel_arrays()
    total = 0.0
    for m, wm in enumerate(task.prior.weights):
        p = mh.sequence_weights_multi_numpy(seqs, parents, tp, atoms[m : m + 1], np.ones(1)).sum(axis=1)
        rows = atoms[m][seqs[:, tp[0]] * 2 + seqs[:, tp[1]]]
        total -= wm * np.sum(p * np.sum(rows * np.log(rows + 0.1), axis=1))
    assert rel_err(pg.optimal_loss_multi(task, eps=0.1), total) <= 1e-12


def test_count_estimator_on_hand_built_sequences():
    g = pg.two_parent(6)  # parents 2:(0,1) 3:(1,2) 4:(1,3) 5:(2,4); target (2, 5)
    seqs = np.array(
        [
            [0, 1, 0, 1, 1, 0],  # q = (0, 0): no context row has parents (0, 0) -> model limit
            [1, 0, 1, 1, 0, 1],  # q = (1, 1): rows 3 (0,1)? no; 4 (0,1) no; 5 (1,0) no -> limit
            [0, 1, 1, 0, 2, 1],  # q = (1, 1): row 3 has parents (1, 1) -> s_3 = 0
        ]
    )
    f = mh.count_estimator_predict_multi(g, seqs, 3)
    lim = mh.count_estimator_predict_multi(g, seqs, 3, model_limit=True)
    # limit = uniform over {matching rows} ∪ {T-1} ∪ {roots with constant prefix equal to q_1 = q_2}
    np.testing.assert_allclose(lim[0], [0.5, 0, 0] + np.array([0.5, 0, 0]), atol=1e-15)  # root 0 (s_0 = 0 = q) and T-1
    np.testing.assert_allclose(lim[1], [0, 1, 0], atol=1e-15)  # only the last position (s_5 = 1)
    np.testing.assert_allclose(lim[2], [0.5, 0.5, 0], atol=1e-15)  # row 3 (token 0) and T-1 (token 1)
    np.testing.assert_allclose(f[2], [1, 0, 0], atol=1e-15)  # the estimator counts row 3 only
    np.testing.assert_allclose(f[:2], lim[:2], atol=1e-15)


def test_model_at_huge_beta_is_the_model_limit_on_sequences():
    g = pg.random_multi_parent(8, 2, seed=2, root_prob=0.3)
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, 2, size=(300, 8))
    seqs[:20] = seqs[:20, :1]  # constant sequences exercise the root ties
    A1, A2 = mh.construction_params(g, 2, 4000.0, 4000.0)
    np.testing.assert_allclose(pg.predict_multi(A1, A2, seqs),
                               mh.count_estimator_predict_multi(g, seqs, 2, model_limit=True), rtol=0, atol=1e-12)


@pytest.mark.parametrize("graph", [pg.two_parent(6), pg.ngram(6, 3), pg.random_multi_parent(6, 2, seed=3, root_prob=0.3)])
def test_construction_loss_approaches_the_count_estimator_limit(graph):
    task = small_task(graph, S=2, n_atoms=2)
    limit = pg.count_estimator_loss_multi(task, model_limit=True)
    gaps = [abs(pg.construction_loss_multi(task, b, b) - limit) for b in (3.0, 8.0, 1000.0)]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] <= 1e-12
    # the estimator of Knowl 9 differs from the limit by the last position's self-match only
    assert abs(pg.count_estimator_loss_multi(task) - limit) < 0.2


# ================================================================ dynamics
TINY = dict(beta0=0.5, lr1=1.0, steps1=3, lr2=1.0, steps2=2, record_every=1, init_seed=3, init_scale=0.2)


@pytest.fixture(scope="module")
def tiny_task():
    return small_task(pg.two_parent(4), S=2, n_atoms=1)


@pytest.mark.parametrize("schedule", ["two-stage", "joint"])
def test_training_matches_hand_stepped_numpy_reference(tiny_task, schedule):
    task = tiny_task
    traj = pg.train_multi_head(task, schedule=schedule, **TINY)
    S, T = task.S, task.T
    A1 = TINY["init_scale"] * np.random.default_rng(TINY["init_seed"]).standard_normal((2, T, T))
    A1 = np.where(np.tri(T, dtype=bool), A1, 0.0)
    A2 = np.stack([TINY["beta0"] * np.eye(S)] * 2)
    eta1 = TINY["lr1"] * S * T * (1.0 if schedule == "joint" else 1.0 / TINY["beta0"])
    eta2 = TINY["lr2"] * S
    losses, A1s, A2s = [], [], []
    for t in range(TINY["steps1"] + TINY["steps2"] + 1):
        loss, dA1, dA2 = mh.exact_loss_and_grad_multi_numpy(task, A1, A2)
        losses.append(loss)
        A1s.append(A1.copy())
        A2s.append(A2.copy())
        if schedule == "joint":
            A1, A2 = A1 - eta1 * dA1, A2 - eta2 * dA2
        elif t < TINY["steps1"]:
            A1 = A1 - eta1 * dA1
        else:
            A2 = A2 - eta2 * dA2
    np.testing.assert_allclose(traj.loss, losses, rtol=1e-11)
    np.testing.assert_allclose(traj.A1, np.array(A1s), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(traj.A2, np.array(A2s), rtol=1e-9, atol=1e-12)
    assert traj.attn_parent.shape == (6, 2, T) and np.all(np.isnan(traj.cosine))
    assert np.isnan(traj.attn_parent[0, 0, 0]) and np.isfinite(traj.attn_parent[0, 0, T - 1])
    assert isinstance(traj.config, pg.MultiHeadTrainConfig) and traj.status == "completed"


def test_identical_heads_stay_identical_and_the_seed_breaks_the_symmetry(tiny_task):
    same = pg.train_multi_head(tiny_task, **dict(TINY, init_scale=0.0, steps1=5))
    np.testing.assert_array_equal(same.A1[:, 0], same.A1[:, 1])
    np.testing.assert_array_equal(same.A2[:, 0], same.A2[:, 1])
    broken = pg.train_multi_head(tiny_task, **TINY)
    assert not np.array_equal(broken.final_A1[0], broken.final_A1[1])
    again = pg.train_multi_head(tiny_task, **TINY)
    np.testing.assert_array_equal(again.A1, broken.A1)


def test_trajectory_round_trip_and_resume(tiny_task, tmp_path):
    kwargs = dict(TINY, steps1=6, steps2=4, record_every=2)
    full = pg.train_multi_head(tiny_task, **kwargs)
    full.save(tmp_path / "t.npz")
    back = pg.Trajectory.load(tmp_path / "t.npz")
    assert back.config == full.config and isinstance(back.config, pg.MultiHeadTrainConfig)
    for name, a in full.arrays().items():
        np.testing.assert_array_equal(getattr(back, name), a)
    ckpt = tmp_path / "ck.npz"
    pg.train_multi_head(tiny_task, **dict(kwargs, steps2=1), checkpoint_path=ckpt)  # a shorter run...
    with pytest.raises(ValueError, match="different task or configuration"):
        pg.train_multi_head(tiny_task, **kwargs, checkpoint_path=ckpt, resume=True)
    part = pg.train_multi_head(tiny_task, **kwargs, checkpoint_path=ckpt, checkpoint_every=3)
    resumed = pg.train_multi_head(tiny_task, **kwargs, checkpoint_path=ckpt, resume=True)
    for name, a in part.arrays().items():
        np.testing.assert_array_equal(getattr(resumed, name), a)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(init_scale=-1.0), "init_scale must be a finite number >= 0"),
        (dict(init_seed=-1), "init_seed must be an integer >= 0"),
        (dict(beta0=0.0), "beta0 must be a positive"),
        (dict(schedule="adam"), "schedule must be one of"),
        (dict(resume=True), "checkpoint_path"),
    ],
)
def test_bad_training_arguments(tiny_task, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pg.train_multi_head(tiny_task, **kwargs)
    with pytest.raises(ValueError, match="MultiParentTask"):
        pg.train_multi_head(pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 1, 0)))


# ================================================================= checks
def test_head_specialization_check():
    task = small_task(pg.two_parent(7))
    A1, _ = mh.construction_params(task.graph, 2, 8.0, 1.0)
    res = checks.check_head_specialization(task, A1)
    assert res.passed and res.value == 1.0 and res.applicable
    assert res.details["assignment_head_to_slot"] == {0: 0, 1: 1}
    assert res.details["slot_by_head_and_row"][1] == {i: 1 for i in (2, 3, 4, 5, 6)}
    swapped = checks.check_head_specialization(task, A1[::-1])
    assert swapped.passed and swapped.details["assignment_head_to_slot"] == {0: 1, 1: 0}
    both = checks.check_head_specialization(task, np.stack([A1[1], A1[1]]))
    assert not both.passed and both.value == 0.5 and both.details["disagreeing_head_row_pairs"]
    diag = checks.check_head_specialization(task, np.stack([8.0 * np.eye(7)] * 2))
    assert not diag.passed and -1 in diag.details["slot_by_head_and_row"][0].values()
    na = checks.not_applicable("gradient_alignment", "stmt", "no idealized gradient for k heads")
    d = na.to_dict()
    assert d["applicable"] is False and d["value"] is None and d["details"]["reason"].startswith("no idealized")


def test_loss_convergence_and_roots_multi():
    task = small_task(pg.two_parent(6))
    refs = checks.reference_losses_multi(task)
    assert refs["L_star"] <= refs["L_bayes"]
    A1, A2 = mh.construction_params(task.graph, 2, 8.0, 3.0)
    res = checks.check_loss_convergence_multi(task, A1, A2, beta0=1.0, references=refs)
    assert res.name == "loss_convergence" and res.details["loss_final"] == pg.exact_loss_multi(task, A1, A2)
    roots = checks.check_roots_multi(task, A1)
    assert roots.passed and roots.value == 0.0
