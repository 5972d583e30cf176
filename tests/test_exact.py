"""Exact population loss and gradients (popgrad.exact, DESIGN §3, §4, §7)."""
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
from popgrad import exact

from .strategies import tasks


class Tolerances(NamedTuple):
    engines: float  # numba engines vs the NumPy reference (relative)
    finite_difference: float  # gradients vs central differences (relative to the gradient's max entry)
    threads: float  # 1 thread vs 2 threads (relative)
    invariant: float  # exact identities (row sums, shifts), relative
    floor: float  # smallest scale for relative errors: losses and gradient entries are sums of O(1)
    # per-sequence terms, and a result far below that size carries an absolute rounding error


TOL = Tolerances(engines=1e-12, finite_difference=1e-6, threads=1e-13, invariant=1e-12, floor=1e-3)
FD_STEP = 1e-5
ENGINES = ("prefix", "direct")


@st.composite
def params(draw, task, scales=(0.1, 1.0, 3.0)):
    """Random ``A1`` (full matrix; its upper triangle must not matter) and non-symmetric ``A2``."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    s1 = draw(st.sampled_from(scales))
    s2 = draw(st.sampled_from(scales))
    return s1 * rng.normal(size=(task.T, task.T)), s2 * rng.normal(size=(task.S, task.S))


def rel_err(a, b):
    """``max|a - b| / max(max|b|, TOL.floor)``."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), TOL.floor))


def grad_err(res, ref):
    """Max-norm error of the whole gradient ``(dA1, dA2)``, relative to its max-norm.

    One scale for both blocks, floored at ``TOL.floor``: an entry far below
    the size of the per-sequence terms it sums is the result of cancellation and
    carries an absolute (not relative) rounding error.
    """
    scale = max(np.max(np.abs(ref.dA1)), np.max(np.abs(ref.dA2)), TOL.floor)
    return max(np.max(np.abs(res.dA1 - ref.dA1)), np.max(np.abs(res.dA2 - ref.dA2))) / scale


def assert_close(res, ref, tol):
    assert rel_err(res.loss, ref.loss) <= tol, (res.loss, ref.loss)
    assert grad_err(res, ref) <= tol, grad_err(res, ref)


def small_task(S=3, T=6, graph=None, n_atoms=3, seed=0, symmetrize=False):
    graph = pg.chain(T) if graph is None else graph
    return pg.Task(graph, pg.dirichlet_prior(S, 1.0, n_atoms, seed, symmetrize=symmetrize))


def brute_force_loss(task, A1, A2, eps):
    """``-Σ_s Σ_c w log(f + ε)`` with ``f`` from :func:`popgrad.predict` over all sequences."""
    seqs, w = task.all_sequences()
    f = pg.predict(A1, A2, seqs)
    pos = w > 0
    return float(-np.sum(w[pos] * np.log(f[pos] + eps)))


# ======================================================= engines agree
@given(st.data())
def test_numba_engines_match_numpy_reference(data):
    task = data.draw(tasks(min_S=2, max_S=4, min_T=2, max_T=8, max_sequences=20_000))
    A1, A2 = data.draw(params(task))
    eps = data.draw(st.sampled_from([None, 0.05]))
    ref = exact.exact_loss_and_grad_numpy(task, A1, A2, eps)
    assert_close(pg.exact_loss_and_grad(task, A1, A2, eps), ref, TOL.engines)
    e = task.default_eps if eps is None else eps
    for engine in ENGINES:
        assert_close(exact._exact(task, A1, A2, e, True, engine), ref, TOL.engines)
        assert rel_err(exact._exact(task, A1, A2, e, False, engine).loss, ref.loss) <= TOL.engines
    assert rel_err(pg.exact_loss(task, A1, A2, eps), ref.loss) <= TOL.engines


@settings(max_examples=25)
@given(st.data())
def test_loss_matches_predict_over_all_sequences(data):
    task = data.draw(tasks(min_S=2, max_S=3, min_T=2, max_T=6, max_sequences=2_000))
    A1, A2 = data.draw(params(task))
    ref = brute_force_loss(task, A1, A2, task.default_eps)
    assert rel_err(pg.exact_loss(task, A1, A2), ref) <= TOL.engines


def test_large_A2_range_uses_the_safe_engine_and_matches_reference():
    task = small_task(S=3, T=5)
    rng = np.random.default_rng(3)
    A1 = rng.normal(size=(5, 5))
    A2 = rng.normal(size=(3, 3))
    A2[0, 2] = -600.0  # row 0 spans more than A2_RANGE_LIMIT: keys "2" are ignored by query 0
    assert np.ptp(A2, axis=1).max() > exact.A2_RANGE_LIMIT
    ref = exact.exact_loss_and_grad_numpy(task, A1, A2)
    res = pg.exact_loss_and_grad(task, A1, A2)
    assert np.isfinite(res.loss) and np.all(np.isfinite(res.dA1)) and np.all(np.isfinite(res.dA2))
    assert_close(res, ref, TOL.engines)
    direct = exact._exact(task, A1, A2, task.default_eps, True, "direct")
    assert res.loss == direct.loss and np.array_equal(res.dA1, direct.dA1)


@settings(max_examples=25)
@given(st.data())
def test_prefix_engine_for_every_block_and_batch_layout(data):
    """Blocks from one sequence group to the whole task; weight batches from 1 group to all."""
    task = data.draw(tasks(min_S=2, max_S=3, min_T=2, max_T=7, max_sequences=3_000))
    A1, A2 = data.draw(params(task))
    block = data.draw(st.sampled_from([1, task.S**2, 10**9]))
    batch = data.draw(st.sampled_from([1, task.S, 64, 10**9]))
    table = data.draw(st.sampled_from([1, exact.PREFIX_TABLE_MAX]))
    ref = exact.exact_loss_and_grad_numpy(task, A1, A2)
    saved = exact.PREFIX_BLOCK_SEQUENCES, exact.PREFIX_BATCH_GROUPS, exact.PREFIX_TABLE_MAX
    try:
        exact.PREFIX_BLOCK_SEQUENCES, exact.PREFIX_BATCH_GROUPS, exact.PREFIX_TABLE_MAX = block, batch, table
        res = exact._exact(task, A1, A2, task.default_eps, True, "prefix")
    finally:
        exact.PREFIX_BLOCK_SEQUENCES, exact.PREFIX_BATCH_GROUPS, exact.PREFIX_TABLE_MAX = saved
    assert_close(res, ref, TOL.engines)


@pytest.mark.parametrize("R", [100.0, 490.0])
def test_prefix_engine_near_its_range_limit_with_eps_zero(R):
    """Identity atoms (finite ε=0 loss); the query's own token scores lowest: tiny exponentials."""
    task = pg.Task(pg.chain(6), pg.FinitePrior(np.eye(3)))
    A1 = np.random.default_rng(0).normal(size=(6, 6))
    A2 = np.array([[-R, -R / 2, 0.0], [0.0, -R, -R / 2], [-R / 2, 0.0, -R]])
    assert np.ptp(A2, axis=1).max() <= exact.A2_RANGE_LIMIT
    ref = exact.exact_loss_and_grad_numpy(task, A1, A2, eps=0.0)
    res = exact._exact(task, A1, A2, 0.0, True, "prefix")
    assert np.isfinite(res.loss) and np.all(np.isfinite(res.dA1)) and np.all(np.isfinite(res.dA2))
    assert_close(res, ref, TOL.engines)


@pytest.mark.parametrize("graph", [pg.chain(9), pg.icl_pairs(9), pg.random_tree(9, seed=4, root_prob=0.3)])
def test_multi_block_tasks_match_reference(graph):
    """Tasks large enough for several blocks and weight batches with prefix context."""
    task = small_task(S=3, T=9, graph=graph, n_atoms=2, symmetrize=True)
    rng = np.random.default_rng(1)
    A1, A2 = rng.normal(size=(9, 9)), rng.normal(size=(3, 3))
    ref = exact.exact_loss_and_grad_numpy(task, A1, A2)
    assert_close(pg.exact_loss_and_grad(task, A1, A2), ref, TOL.engines)


# ================================================== finite differences
def central_differences(task, A1, A2, eps, h=FD_STEP):
    T, S = task.T, task.S
    g1, g2 = np.zeros((T, T)), np.zeros((S, S))
    for i in range(T):
        for j in range(i + 1):
            Ap, Am = A1.copy(), A1.copy()
            Ap[i, j] += h
            Am[i, j] -= h
            g1[i, j] = (pg.exact_loss(task, Ap, A2, eps) - pg.exact_loss(task, Am, A2, eps)) / (2 * h)
    for a in range(S):
        for b in range(S):
            Ap, Am = A2.copy(), A2.copy()
            Ap[a, b] += h
            Am[a, b] -= h
            g2[a, b] = (pg.exact_loss(task, A1, Ap, eps) - pg.exact_loss(task, A1, Am, eps)) / (2 * h)
    return g1, g2


@settings(max_examples=25)
@given(st.data())
def test_gradients_match_central_differences(data):
    task = data.draw(tasks(min_S=2, max_S=3, min_T=2, max_T=5, max_sequences=300))
    A1, A2 = data.draw(params(task, scales=(0.3, 1.0)))
    eps = data.draw(st.sampled_from([None, 0.01]))
    g1, g2 = central_differences(task, A1, A2, eps)
    tril = np.tril_indices(task.T)
    for res in (pg.exact_loss_and_grad(task, A1, A2, eps), exact.exact_loss_and_grad_numpy(task, A1, A2, eps)):
        scale = max(np.max(np.abs(res.dA1)), np.max(np.abs(res.dA2)), TOL.floor)
        assert np.max(np.abs(res.dA1[tril] - g1[tril])) <= TOL.finite_difference * scale
        assert np.max(np.abs(res.dA2 - g2)) <= TOL.finite_difference * scale


# ============================================================ invariants
@given(st.data())
def test_gradient_invariants(data):
    task = data.draw(tasks(min_S=2, max_S=4, min_T=2, max_T=8, max_sequences=20_000))
    A1, A2 = data.draw(params(task))
    res = pg.exact_loss_and_grad(task, A1, A2)
    T = task.T
    # dA1 is exactly zero above the diagonal
    assert np.all(res.dA1[np.triu_indices(T, 1)] == 0.0)
    # rows of dA1 and dA2 sum to zero (softmax rows are shift invariant); entries are sums of
    # O(1) terms, hence the floor on the scale
    scale = max(np.max(np.abs(res.dA1)), np.max(np.abs(res.dA2)), TOL.floor)
    assert np.max(np.abs(res.dA1.sum(axis=1))) <= TOL.invariant * scale * T
    assert np.max(np.abs(res.dA2.sum(axis=1))) <= TOL.invariant * scale * task.S
    assert res.dA1.shape == (T, T) and res.dA2.shape == (task.S, task.S)


@given(st.data())
def test_row_shifts_leave_the_loss_unchanged(data):
    task = data.draw(tasks(min_S=2, max_S=4, min_T=2, max_T=7, max_sequences=5_000))
    A1, A2 = data.draw(params(task))
    i = data.draw(st.integers(0, task.T - 1))
    q = data.draw(st.integers(0, task.S - 1))
    c = data.draw(st.floats(-3, 3))
    A1s, A2s = A1.copy(), A2.copy()
    A1s[i] += c
    A2s[q] += c
    L0 = pg.exact_loss(task, A1, A2)
    assert rel_err(pg.exact_loss(task, A1s, A2, None), L0) <= TOL.invariant
    assert rel_err(pg.exact_loss(task, A1, A2s, None), L0) <= TOL.invariant


@settings(max_examples=25)
@given(st.data())
def test_zero_parameters_predict_the_empirical_frequency(data):
    task = data.draw(tasks(min_S=2, max_S=3, min_T=2, max_T=6, max_sequences=2_000))
    seqs, w = task.all_sequences()
    S, T = task.S, task.T
    freq = np.stack([np.bincount(s, minlength=S) / T for s in seqs])
    np.testing.assert_allclose(pg.predict(np.zeros((T, T)), np.zeros((S, S)), seqs), freq, rtol=0, atol=1e-15)
    eps = task.default_eps
    expected = -np.sum(w * np.log(freq + eps))
    assert rel_err(pg.exact_loss(task, np.zeros((T, T)), np.zeros((S, S))), expected) <= TOL.engines


@given(st.data())
def test_reference_loss_ordering(data):
    """``L* ≤ L_Bayes ≤ L(A1, A2)`` at ``ε = 0`` (the loss may be +inf, never NaN)."""
    task = data.draw(tasks(min_S=2, max_S=3, min_T=2, max_T=7, max_sequences=3_000))
    A1, A2 = data.draw(params(task))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        loss = pg.exact_loss(task, A1, A2, eps=0.0)
    assert not np.isnan(loss)
    l_star, l_bayes = pg.optimal_loss(task), pg.bayes_loss(task)
    assert l_star <= l_bayes * (1 + TOL.invariant) + TOL.invariant
    assert l_bayes <= loss


def test_reference_loss_ordering_with_finite_model_loss():
    """Identity atoms: the target is the query token, always present, so the ε=0 loss is finite."""
    S, T = 3, 5
    prior = pg.FinitePrior(np.stack([np.eye(S), np.roll(np.eye(S), 1, axis=1)]), [0.6, 0.4])
    task = pg.Task(pg.CausalGraph([-1, 0, 1, 2, -1]), prior)
    rng = np.random.default_rng(0)
    A1, A2 = rng.normal(size=(T, T)), rng.normal(size=(S, S))
    prior_id = pg.Task(task.graph, pg.FinitePrior(np.eye(S)))
    loss = pg.exact_loss(prior_id, A1, A2, eps=0.0)
    assert np.isfinite(loss)
    assert pg.optimal_loss(prior_id) == 0.0 and pg.bayes_loss(prior_id) == 0.0 < loss
    assert pg.optimal_loss(task) <= pg.bayes_loss(task)


# =========================================================== determinism
def test_two_calls_are_bit_identical():
    task = small_task(S=3, T=9, n_atoms=4, symmetrize=True)
    rng = np.random.default_rng(2)
    A1, A2 = rng.normal(size=(9, 9)), rng.normal(size=(3, 3))
    for engine in ENGINES:
        a = exact._exact(task, A1, A2, 0.1, True, engine)
        b = exact._exact(task, A1, A2, 0.1, True, engine)
        assert a.loss == b.loss
        np.testing.assert_array_equal(a.dA1, b.dA1)
        np.testing.assert_array_equal(a.dA2, b.dA2)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs at least 2 numba threads")
def test_one_and_two_threads_agree():
    task = small_task(S=3, T=10, n_atoms=2, symmetrize=True)  # 59,049 sequences, 9 prefix blocks
    assert exact._parallel(9, task.n_sequences)
    rng = np.random.default_rng(7)
    A1, A2 = rng.normal(size=(10, 10)), rng.normal(size=(3, 3))
    before = numba.get_num_threads()
    try:
        out = {}
        for n in (1, 2):
            numba.set_num_threads(n)
            out[n] = [exact._exact(task, A1, A2, 0.1, True, engine) for engine in ENGINES]
    finally:
        numba.set_num_threads(before)
    for one, two in zip(out[1], out[2]):
        assert_close(two, one, TOL.threads)
        # the design guarantees more: a fixed block structure makes them bit-identical
        assert one.loss == two.loss
        np.testing.assert_array_equal(one.dA1, two.dA1)
        np.testing.assert_array_equal(one.dA2, two.dA2)


def test_thread_count_independence_in_a_fresh_process():
    """NUMBA_NUM_THREADS=1 and =2 in separate processes give the same bits (59,049 sequences: parallel path)."""
    code = textwrap.dedent(
        """
        import numpy as np, popgrad as pg
        task = pg.Task(pg.chain(10), pg.dirichlet_prior(3, 1.0, 2, 0, symmetrize=False))
        rng = np.random.default_rng(7)
        r = pg.exact_loss_and_grad(task, rng.normal(size=(10, 10)), rng.normal(size=(3, 3)))
        print(repr(r.loss), r.dA1.tobytes().hex()[:4000], r.dA2.tobytes().hex())
        """
    )
    outs = []
    for n in ("1", "2"):
        env = {**__import__("os").environ, "NUMBA_NUM_THREADS": n}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1]


# ============================================================= ε = 0 and errors
def test_eps_zero_gives_inf_not_nan_with_a_warning():
    task = small_task(S=3, T=4)
    A1, A2 = np.zeros((4, 4)), np.eye(3)
    with pytest.warns(RuntimeWarning, match="infinite"):
        res = pg.exact_loss_and_grad(task, A1, A2, eps=0)
    assert res.loss == np.inf
    assert np.all(np.isnan(res.dA1)) and np.all(np.isnan(res.dA2))
    with pytest.warns(RuntimeWarning, match="infinite"):
        assert pg.exact_loss(task, A1, A2, eps=0.0) == np.inf
    for engine in ENGINES:
        with pytest.warns(RuntimeWarning, match="infinite") as record:
            assert exact._exact(task, A1, A2, 0.0, False, engine).loss == np.inf
        assert record[0].filename == __file__  # attributed to the caller, not to popgrad
    with pytest.warns(RuntimeWarning, match="infinite"):
        assert exact.exact_loss_and_grad_numpy(task, A1, A2, eps=0).loss == np.inf


def test_default_eps_is_t_eff_to_the_minus_half():
    task = pg.Task(pg.icl_pairs(6), pg.dirichlet_prior(2, 1.0, 2, 0, symmetrize=False))
    A1, A2 = np.zeros((6, 6)), np.eye(2)
    assert pg.exact_loss(task, A1, A2) == pg.exact_loss(task, A1, A2, eps=task.t_eff**-0.5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(A1=np.zeros((3, 3))), r"A1 must have shape \(T, T\) = \(4, 4\)"),
        (dict(A2=np.zeros((2, 2))), r"A2 must have shape \(S, S\) = \(3, 3\)"),
        (dict(A1=np.zeros((4, 3))), "A1 must be a square matrix"),
        (dict(A1=np.full((4, 4), np.nan)), r"A1\[0, 0\] = nan is not finite"),
        (dict(A2=np.diag([1.0, np.inf, 1.0])), r"A2\[1, 1\] = inf is not finite"),
        (dict(eps=-0.1), "eps must be a finite number >= 0"),
        (dict(eps=float("nan")), "eps must be a finite number >= 0"),
        (dict(eps=True), "eps must be a finite number >= 0"),
        (dict(eps="small"), "eps must be a finite number >= 0"),
        (dict(task="not a task"), "task must be a popgrad.Task"),
    ],
)
@pytest.mark.parametrize("fn", [pg.exact_loss_and_grad, pg.exact_loss, exact.exact_loss_and_grad_numpy])
def test_validation_errors(fn, kwargs, match):
    args = dict(task=small_task(S=3, T=4), A1=np.zeros((4, 4)), A2=np.eye(3), eps=None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fn(args["task"], args["A1"], args["A2"], args["eps"])


def test_size_guard_runs_before_enumeration():
    task = pg.Task(pg.chain(12), pg.dirichlet_prior(3, 1.0, 2, 0), max_sequences=1000)
    for fn in (lambda: pg.exact_loss_and_grad(task, np.zeros((12, 12)), np.eye(3)),
               lambda: pg.exact_loss(task, np.zeros((12, 12)), np.eye(3)),
               lambda: pg.bayes_loss(task),
               lambda: pg.count_estimator_loss(task),
               lambda: pg.construction_loss(task, 1.0, 1.0)):
        with pytest.raises(pg.TaskTooLargeError):
            fn()
    assert np.isfinite(pg.optimal_loss(task))  # no enumeration needed


def test_result_is_a_frozen_named_tuple():
    res = pg.exact_loss_and_grad(small_task(S=2, T=3), np.zeros((3, 3)), np.eye(2))
    assert isinstance(res, pg.LossAndGrad) and isinstance(res.loss, float)
    with pytest.raises(AttributeError):
        res.loss = 0.0


# ====================================================== reference losses
def test_optimal_loss_formula():
    pi = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    task = pg.Task(pg.chain(4), pg.FinitePrior(pi))
    expected = -(2 * 0.5 * np.log(0.5) + 0.2 * np.log(0.2) + 0.3 * np.log(0.3) + 0.5 * np.log(0.5)) / 3
    assert rel_err(pg.optimal_loss(task), expected) <= TOL.invariant


@given(st.data())
def test_bayes_loss_of_a_single_atom_is_optimal_loss(data):
    task = data.draw(tasks(min_S=2, max_S=4, min_T=2, max_T=6, max_sequences=3_000))
    single = pg.Task(task.graph, pg.FinitePrior(task.prior.atoms[0]))
    assert rel_err(pg.bayes_loss(single), pg.optimal_loss(single)) <= 1e-10


def test_bayes_loss_matches_direct_formula():
    task = small_task(S=2, T=5, n_atoms=3)
    seqs, w = task.all_sequences()
    post = w / w.sum(axis=1, keepdims=True)
    assert rel_err(pg.bayes_loss(task), -np.sum(w * np.log(post))) <= TOL.invariant
    # the perturbed variant scores the same predictor with the loss of the model
    eps = task.default_eps
    assert rel_err(pg.bayes_loss(task, eps=eps), -np.sum(w * np.log(post + eps))) <= TOL.invariant
    assert pg.bayes_loss(task, eps=None) == pg.bayes_loss(task, eps=eps)


def test_perturbed_optimal_loss():
    task = small_task(S=3, T=4, n_atoms=2)
    atoms, wk = task.prior.atoms, task.prior.weights
    expected = -np.einsum("k,kab->", wk, atoms * np.log(atoms + 0.1)) / 3
    assert rel_err(pg.optimal_loss(task, eps=0.1), expected) <= TOL.invariant
    assert pg.optimal_loss(task, eps=0.1) < pg.optimal_loss(task)


def test_count_estimator_on_hand_built_sequences():
    g = pg.chain(5)  # edges 0→1, 1→2, 2→3; query at 4
    seqs = np.array(
        [
            [0, 1, 0, 2, 0],  # q=0: edges 0→1 (1) and 2→3 (2) match
            [1, 1, 1, 1, 0],  # q=0: no edge starts at 0 → model limit: the query position
            [2, 0, 0, 1, 0],  # q=0: edges 1→2 (0) and 2→3 (1)
        ]
    )
    f = exact.count_estimator_predict(g, seqs, 3)
    np.testing.assert_allclose(f, [[0, 0.5, 0.5], [1, 0, 0], [0.5, 0.5, 0]], rtol=0, atol=1e-15)
    lim = exact.count_estimator_predict(g, seqs, 3, model_limit=True)
    # the limit also attends to root 0 when s_0 = q (its prefix is all q)
    np.testing.assert_allclose(lim, [[1 / 3, 1 / 3, 1 / 3], [1, 0, 0], [0.5, 0.5, 0]], rtol=0, atol=1e-15)


def test_count_estimator_matches_the_model_at_huge_beta_on_sequences():
    g = pg.random_tree(8, seed=2, root_prob=0.3)
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, 3, size=(200, 8))
    beta = 2000.0
    f = pg.predict(beta * g.adjacency(), beta * np.eye(3), seqs)
    np.testing.assert_allclose(f, exact.count_estimator_predict(g, seqs, 3, model_limit=True), rtol=0, atol=1e-12)


@pytest.mark.parametrize("graph", [pg.chain(6), pg.icl_pairs(6), pg.CausalGraph([-1, 0, 0, 1, -1, -1])])
def test_construction_loss_approaches_the_count_estimator_limit(graph):
    task = pg.Task(graph, pg.dirichlet_prior(3, 1.0, 2, 0, symmetrize=True))
    limit = pg.count_estimator_loss(task, model_limit=True)
    gaps = [abs(pg.construction_loss(task, b, b) - limit) for b in (10.0, 40.0, 1000.0)]
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] <= 1e-12
    # and the paper's estimator is close to that limit (they differ on root ties only)
    assert abs(pg.count_estimator_loss(task) - limit) < 0.1


def test_count_estimator_loss_with_eps_zero_is_inf_with_warning():
    task = small_task(S=3, T=5)
    with pytest.warns(RuntimeWarning, match="infinite"):
        assert pg.count_estimator_loss(task, eps=0.0) == np.inf
