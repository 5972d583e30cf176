"""Exact relabeling-orbit reduction (DESIGN §10) and the new fast kernels of the exact engine.

Invariants checked here:

* the orbit reduction reproduces the full enumeration (loss, ``dA1``, ``dA2``)
  on relabeling-closed priors with ``A2 ∈ span{I, 11ᵀ}``, for both numba
  engines and the NumPy reference, and is used exactly when it applies;
* its ``dA2`` lies exactly in the span, so a Stage-2 trajectory keeps ``A2``
  in the span bit for bit;
* its gradients match finite differences along the span;
* canonical sequences: one per orbit, orbit sizes sum to ``S**T``;
* thread-count independence and the weight cache do not change a bit;
* ``fast_log`` is within 1 ulp of ``np.log``; ``stable_argsort`` is
  ``np.argsort(kind="stable")``; the faster ``sup_error_distribution`` is
  bit-identical to the NumPy formulation it replaced.
"""
import itertools
import math
from typing import NamedTuple

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.checks import _kernels as check_kernels, theorems as checks
from popgrad.engine import reference, single, symmetry as sym_mod
from popgrad.engine._kernels import numeric, single as single_kernels
from popgrad.task import _weights
from popgrad.task.tasks import sequence_weights_numpy

from ..strategies import run_engine, tasks


class Tolerances(NamedTuple):
    reduction: float  # orbit reduction vs full enumeration (relative, floored like test_exact)
    finite_difference: float  # directional derivatives along the span
    floor: float  # smallest scale for relative errors (sums of O(1) per-sequence terms)
    log_ulp: float  # fast_log vs np.log, in units in the last place


TOL = Tolerances(reduction=1e-12, finite_difference=1e-6, floor=1e-3, log_ulp=1.0)


def span_A2(draw_or_rng, S, scale=1.0):
    """``α I + β 11ᵀ`` with random ``α, β``."""
    rng = draw_or_rng
    a, b = scale * rng.normal(size=2)
    return a * np.eye(S) + b * np.ones((S, S))


def rel(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), TOL.floor))


def grad_rel(res, ref):
    scale = max(np.max(np.abs(ref.dA1)), np.max(np.abs(ref.dA2)), TOL.floor)
    return max(np.max(np.abs(res.dA1 - ref.dA1)), np.max(np.abs(res.dA2 - ref.dA2))) / scale


def assert_same(res, ref, tol=TOL.reduction):
    assert rel(res.loss, ref.loss) <= tol, (res.loss, ref.loss)
    assert grad_rel(res, ref) <= tol, grad_rel(res, ref)


def in_span_exactly(A):
    S = A.shape[0]
    off = A[~np.eye(S, dtype=bool)]
    return bool(np.all(np.diag(A) == A[0, 0]) and np.all(off == off[0]))


def closed_task(S=3, T=7, graph=None, n_atoms=2, seed=0):
    graph = pg.chain(T) if graph is None else graph
    return pg.Task(graph, pg.dirichlet_prior(S, 1.0, n_atoms, seed, symmetrize=True))


# ============================================== the reduction is exact
@given(st.data())
def test_reduction_matches_full_enumeration(data):
    task = data.draw(tasks(min_S=2, max_S=4, min_T=2, max_T=8, max_sequences=20_000, symmetrize=True))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    A1 = data.draw(st.sampled_from([0.1, 1.0, 3.0])) * rng.normal(size=(task.T, task.T))
    A2 = span_A2(rng, task.S, data.draw(st.sampled_from([0.1, 1.0, 3.0])))
    eps = data.draw(st.sampled_from([None, 0.05]))
    assert sym_mod.symmetry_applies(task, A2)
    full = pg.exact_loss_and_grad(task, A1, A2, eps, symmetry="off")
    red = pg.exact_loss_and_grad(task, A1, A2, eps)  # "auto" uses it
    assert_same(red, full)
    assert_same(pg.exact_loss_and_grad(task, A1, A2, eps, symmetry="on"), full)
    assert rel(pg.exact_loss(task, A1, A2, eps), full.loss) <= TOL.reduction
    ref = reference.exact_loss_and_grad_numpy(task, A1, A2, eps)  # full enumeration, NumPy
    assert_same(red, ref)
    assert_same(reference.exact_loss_and_grad_numpy(task, A1, A2, eps, symmetry="on"), ref)
    assert in_span_exactly(red.dA2)


@settings(max_examples=20)
@given(st.data())
def test_reduction_in_the_direct_engine(data):
    """The fallback engine (huge ``A2`` range) skips non-canonical sequences the same way."""
    task = data.draw(tasks(min_S=2, max_S=3, min_T=2, max_T=6, max_sequences=2_000, symmetrize=True))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    A1 = rng.normal(size=(task.T, task.T))
    A2 = span_A2(rng, task.S)
    e = task.default_eps
    full = run_engine(task, A1, A2, e, True, "direct", symmetry="off")
    assert_same(run_engine(task, A1, A2, e, True, "direct", symmetry="on"), full)
    assert_same(run_engine(task, A1, A2, e, True, "prefix", symmetry="on"), full)


def test_large_range_span_A2_uses_the_direct_engine_with_the_reduction():
    task = closed_task(S=3, T=6)
    A1 = np.random.default_rng(0).normal(size=(6, 6))
    A2 = 600.0 * np.eye(3)  # the Knowl-8 construction at large beta2
    assert sym_mod.symmetry_applies(task, A2)
    assert_same(pg.exact_loss_and_grad(task, A1, A2), reference.exact_loss_and_grad_numpy(task, A1, A2))


@settings(max_examples=25)
@given(st.data())
def test_reduction_for_every_block_and_batch_layout(data):
    task = data.draw(tasks(min_S=2, max_S=3, min_T=2, max_T=8, max_sequences=6_600, symmetrize=True))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    A1, A2 = rng.normal(size=(task.T, task.T)), span_A2(rng, task.S)
    ref = reference.exact_loss_and_grad_numpy(task, A1, A2)
    opts = pg.EngineOptions(
        prefix_block_sequences=data.draw(st.sampled_from([1, task.S**2, 10**9])),
        prefix_batch_groups=data.draw(st.sampled_from([1, task.S, 64, 10**9])),
        sym_min_blocks=data.draw(st.sampled_from([1, 32, 10**9])),
        parallel_min_sequences=data.draw(st.sampled_from([1, 2**15])),
    )
    res = run_engine(task, A1, A2, task.default_eps, True, "prefix", symmetry="on", options=opts)
    assert_same(res, ref)


def test_eps_zero_with_the_reduction():
    """Cyclic-shift atoms (closed under relabeling, uniform μ): every target token occurs in the
    chain, so the ε=0 loss is finite; the slow (np.log) leaf path of the engine."""
    atoms, w = pg.relabel_closure(np.roll(np.eye(3), 1, axis=1)[None])
    task = pg.Task(pg.chain(6), pg.FinitePrior(atoms, w))
    A1 = np.random.default_rng(0).normal(size=(6, 6))
    A2 = 2.0 * np.eye(3)
    assert sym_mod.symmetry_applies(task, A2)
    assert_same(pg.exact_loss_and_grad(task, A1, A2, eps=0.0), reference.exact_loss_and_grad_numpy(task, A1, A2, 0.0))


# ================================================ when it applies
def test_symmetry_applies_only_when_exact():
    task = closed_task(S=3, T=5)
    assert sym_mod.symmetry_applies(task, 0.3 * np.eye(3))
    assert sym_mod.symmetry_applies(task, np.full((3, 3), -2.0))
    assert not sym_mod.symmetry_applies(task, np.diag([1.0, 1.0, 1.1]))
    A2 = np.eye(3)
    A2[0, 1] = 0.1
    assert not sym_mod.symmetry_applies(task, A2)
    # a prior that is not closed: drop one atom of the closure
    atoms, w = task.prior.atoms[1:], task.prior.weights[1:]
    open_task = pg.Task(task.graph, pg.FinitePrior(atoms, w / w.sum()))
    assert not sym_mod.symmetry_applies(open_task, np.eye(3))
    with pytest.raises(ValueError, match="symmetry='on' needs"):
        pg.exact_loss_and_grad(open_task, np.zeros((5, 5)), np.eye(3), symmetry="on")
    with pytest.raises(ValueError, match="symmetry must be one of"):
        pg.exact_loss_and_grad(task, np.zeros((5, 5)), np.eye(3), symmetry="yes")
    # weights unequal within an orbit: not closed even though the atom set is
    w2 = task.prior.weights.copy()
    w2[0] *= 1.5
    assert not sym_mod.symmetry_applies(pg.Task(task.graph, pg.FinitePrior(task.prior.atoms, w2 / w2.sum())), np.eye(3))


def test_closure_check_compares_stationary_distributions():
    """The identity atom is its own relabeling, but GTH gives it μ = e_0: roots are not symmetric."""
    prior = pg.FinitePrior(np.eye(3))
    assert prior.is_relabeling_closed()
    assert not sym_mod.exactly_closed(prior)
    task = pg.Task(pg.chain(5), prior)
    A1 = np.random.default_rng(0).normal(size=(5, 5))
    red = pg.exact_loss_and_grad(task, A1, np.eye(3), eps=0.1)  # must fall back to the full sum
    assert_same(red, reference.exact_loss_and_grad_numpy(task, A1, np.eye(3), eps=0.1))


def test_closure_under_a_subgroup_is_not_enough():
    """Closed under cyclic shifts only, or under one transposition only: not closed (S=4)."""
    A = pg.dirichlet_prior(4, 1.0, 1, 0, symmetrize=False).atoms[0]
    cyclic = np.stack([pg.relabel(A, np.roll(np.arange(4), k)) for k in range(4)])
    swap = np.stack([A, pg.relabel(A, [1, 0, 2, 3])])
    for atoms in (cyclic, swap):
        prior = pg.FinitePrior(atoms)
        assert not sym_mod.exactly_closed(prior) and not prior.is_relabeling_closed()


def test_closure_check_implies_is_relabeling_closed():
    for S in (2, 3, 4):
        prior = pg.dirichlet_prior(S, 0.5, 3, S, symmetrize=True)
        assert sym_mod.exactly_closed(prior) and prior.is_relabeling_closed()
    prior = pg.dirichlet_prior(3, 1.0, 3, 0, symmetrize=True, uniform_mean=True)
    assert sym_mod.exactly_closed(prior)
    assert not sym_mod.exactly_closed(pg.dirichlet_prior(3, 1.0, 3, 0, symmetrize=False))


def test_nearly_span_A2_is_projected_and_still_exact():
    task = closed_task(S=3, T=6)
    rng = np.random.default_rng(4)
    A1 = rng.normal(size=(6, 6))
    A2 = span_A2(rng, 3)
    A2[1, 1] = np.nextafter(A2[1, 1], np.inf)  # one ulp off the span
    A2[2, 0] = np.nextafter(A2[2, 0], -np.inf)
    assert sym_mod.symmetry_applies(task, A2)
    red = pg.exact_loss_and_grad(task, A1, A2)
    assert in_span_exactly(red.dA2)
    assert_same(red, pg.exact_loss_and_grad(task, A1, A2, symmetry="off"))


# ============================================= finite differences
@settings(max_examples=15)
@given(st.data())
def test_reduced_gradient_matches_finite_differences_along_the_span(data):
    """``dA1`` entry by entry; ``dA2`` along ``I`` and ``11ᵀ`` (directions that keep the reduction on)."""
    task = data.draw(tasks(min_S=2, max_S=3, min_T=2, max_T=5, max_sequences=300, symmetrize=True))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    A1, A2 = 0.5 * rng.normal(size=(task.T, task.T)), span_A2(rng, task.S)
    res = pg.exact_loss_and_grad(task, A1, A2)
    scale = max(np.max(np.abs(res.dA1)), np.max(np.abs(res.dA2)), TOL.floor)
    h = 1e-5
    for D in (np.eye(task.S), np.ones((task.S, task.S))):
        fd = (pg.exact_loss(task, A1, A2 + h * D) - pg.exact_loss(task, A1, A2 - h * D)) / (2 * h)
        assert abs(fd - np.sum(res.dA2 * D)) <= TOL.finite_difference * scale * task.S**2
    for i, j in zip(*np.tril_indices(task.T)):
        Ap, Am = A1.copy(), A1.copy()
        Ap[i, j] += h
        Am[i, j] -= h
        fd = (pg.exact_loss(task, Ap, A2) - pg.exact_loss(task, Am, A2)) / (2 * h)
        assert abs(fd - res.dA1[i, j]) <= TOL.finite_difference * scale


# ====================================================== dynamics
def test_stage2_trajectory_keeps_A2_exactly_in_the_span():
    task = closed_task(S=3, T=6, n_atoms=3)
    traj = pg.train_two_stage(task, steps1=20, steps2=40, record_every=1)
    assert traj.status == "completed"
    assert all(in_span_exactly(A2) for A2 in traj.A2)
    assert traj.A2[-1][0, 0] != traj.A2[0][0, 0]  # Stage 2 moved it


def test_trajectory_matches_the_full_enumeration():
    task = closed_task(S=3, T=5, n_atoms=2)
    red = pg.train_two_stage(task, steps1=15, steps2=15, record_every=1)
    saved = sym_mod.MAX_SYMMETRY_S
    try:
        sym_mod.MAX_SYMMETRY_S = 0  # turns the reduction off everywhere
        full = pg.train_two_stage(task, steps1=15, steps2=15, record_every=1)
    finally:
        sym_mod.MAX_SYMMETRY_S = saved
    np.testing.assert_allclose(red.loss, full.loss, rtol=1e-12, atol=0)
    np.testing.assert_allclose(red.A1, full.A1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(red.A2, full.A2, rtol=0, atol=1e-12)


# =================================================== canonical sequences
@pytest.mark.parametrize("S, T", [(2, 1), (2, 6), (3, 5), (4, 5), (3, 1)])
def test_canonical_sequences_are_one_per_orbit(S, T):
    seqs = sym_mod.canonical_sequences(S, T)
    assert len(seqs) == sym_mod.canonical_count(S, T)
    orbit = sym_mod.orbit_sizes(S)
    assert int(orbit[seqs.max(axis=1) + 1].sum()) == S**T
    perms = list(itertools.permutations(range(S)))
    full = np.array(list(itertools.product(range(S), repeat=T)))
    smallest = {tuple(min(tuple(p[x] for x in s) for p in perms)) for s in full}
    assert smallest == {tuple(s) for s in seqs}
    assert np.array_equal(np.concatenate(list(sym_mod.canonical_chunks(S, T, 7))), seqs)


def test_orbit_factor_table():
    S, h = 3, 3
    dig = ((np.arange(S**h)[None, :] // S ** np.arange(h - 1, -1, -1)[:, None]) % S).astype(np.int64)
    ofac = single._orbit_factor_table(S, dig, 32)
    for m in range(S + 1):
        prefix = list(range(m))  # a canonical prefix with m distinct tokens
        for g in range(S**h):
            for q in range(S):
                s = prefix + list(dig[:, g]) + [q]
                mx, ok = -1, True
                for t in s:
                    ok &= t <= mx + 1
                    mx = max(mx, t)
                want = math.perm(S, mx + 1) if ok else 0.0
                assert ofac[m, q, g] == want
    assert np.all(ofac[:, :, S**h:] == 0.0)


# ==================================================== determinism
@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs at least 2 numba threads")
def test_reduction_one_and_two_threads_bit_identical():
    task = closed_task(S=3, T=9, n_atoms=2)
    rng = np.random.default_rng(1)
    A1, A2 = rng.normal(size=(9, 9)), span_A2(rng, 3)
    opts = pg.EngineOptions(parallel_min_sequences=1)  # parallel plan, sym_min_blocks blocks
    before = numba.get_num_threads()
    out = {}
    try:
        assert single._prefix_plan(task, True, opts).parallel
        for n in (1, 2):
            numba.set_num_threads(n)
            out[n] = pg.exact_loss_and_grad(task, A1, A2, options=opts)
    finally:
        numba.set_num_threads(before)
    assert out[1].loss == out[2].loss
    np.testing.assert_array_equal(out[1].dA1, out[2].dA1)
    np.testing.assert_array_equal(out[1].dA2, out[2].dA2)


@pytest.mark.parametrize("symmetry", ["auto", "off"])
def test_weight_cache_does_not_change_a_bit(symmetry):
    task = closed_task(S=3, T=8)
    rng = np.random.default_rng(2)
    A1, A2 = rng.normal(size=(8, 8)), span_A2(rng, 3)
    first = pg.exact_loss_and_grad(task, A1, A2, symmetry=symmetry)  # computes and stores the weights
    second = pg.exact_loss_and_grad(task, A1, A2, symmetry=symmetry)  # reads them
    uncached = pg.exact_loss_and_grad(task, A1, A2, symmetry=symmetry, options=pg.EngineOptions(weight_cache_bytes=0))
    for r in (second, uncached):
        assert r.loss == first.loss
        np.testing.assert_array_equal(r.dA1, first.dA1)
        np.testing.assert_array_equal(r.dA2, first.dA2)


def test_weight_cache_budget_drops_the_least_recently_used():
    tasks_ = [closed_task(S=3, T=7, seed=s) for s in range(3)]
    A1, A2 = np.zeros((7, 7)), np.eye(3)
    first = [pg.exact_loss_and_grad(t, A1, A2, symmetry="off") for t in tasks_]
    nbytes = sum(W.nbytes for W in single._prefix_plan(tasks_[0], False, pg.DEFAULT_OPTIONS).wcache.values())
    opts = pg.EngineOptions(weight_cache_total=2 * nbytes)  # room for two tasks' weights (the plans are shared)
    for t in tasks_:
        single._prefix_plan(t, False, opts).wcache.clear()
    again = [pg.exact_loss_and_grad(t, A1, A2, symmetry="off", options=opts) for t in tasks_]
    held = [bool(single._prefix_plan(t, False, opts).wcache) for t in tasks_]
    assert held == [False, True, True]
    assert [r.loss for r in again] == [r.loss for r in first]


# ============================================ reference losses
@settings(max_examples=20)
@given(st.data())
def test_reference_losses_with_the_reduction(data):
    task = data.draw(tasks(min_S=2, max_S=3, min_T=2, max_T=7, max_sequences=3_000, symmetrize=True))
    eps = data.draw(st.sampled_from([0.0, 0.1]))
    assert rel(pg.bayes_loss(task, eps), pg.bayes_loss(task, eps, symmetry="off")) <= TOL.reduction
    for limit in (False, True):
        a = pg.count_estimator_loss(task, 0.1, model_limit=limit)
        assert rel(a, pg.count_estimator_loss(task, 0.1, model_limit=limit, symmetry="off")) <= TOL.reduction


# ================================================ fast kernels
def test_fast_log_is_within_one_ulp_of_numpy():
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.random(200_000) + 1e-3,
        np.exp(rng.uniform(-700, 700, 200_000)),
        1.0 + rng.uniform(-1e-6, 1e-6, 20_000),
        np.sqrt(2.0) * (1 + rng.uniform(-1e-12, 1e-12, 1000)),
        2.0 ** np.arange(-1022, 1024, dtype=float),
        [np.finfo(float).tiny, np.finfo(float).max, 1.0, np.nextafter(1, 0), np.nextafter(1, 2)],
    ])
    out = np.empty_like(x)
    numeric.fast_log_array(x, out)
    ref = np.log(x)
    ulp = np.abs(out - ref) / np.spacing(np.maximum(np.abs(ref), np.finfo(float).tiny))
    assert np.max(ulp) <= TOL.log_ulp
    assert numeric.fast_log(1.0) == 0.0


@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, np.nan, np.inf, -np.inf, 1e-310, 3.0]), max_size=60),
       st.integers(0, 2**32 - 1))
def test_stable_argsort_is_numpy_stable_argsort(picks, seed):
    rng = np.random.default_rng(seed)
    v = np.concatenate([np.array(picks, dtype=float), rng.normal(size=rng.integers(0, 200)).round(1)])
    rng.shuffle(v)
    np.testing.assert_array_equal(check_kernels.stable_argsort(v), np.argsort(v, kind="stable"))


def _sup_error_distribution_numpy(task, A1, A2, atoms, atom_weights):
    """The formulation ``checks.sup_error_distribution`` had before its kernels (the reference)."""
    atoms = np.ascontiguousarray(atoms, dtype=float)
    mu = pg.stationary_distribution(atoms)
    parents = np.ascontiguousarray(task.graph.parents)
    errs, probs = [], []
    for seqs, _ in task.enumerate(chunk_size=2**15):
        f = pg.predict(A1, A2, seqs)
        q = seqs[:, -1]
        for k in range(atoms.shape[0]):
            w = sequence_weights_numpy(seqs, parents, mu[k:k + 1], atoms[k:k + 1], np.ones(1))
            errs.append(np.abs(f - atoms[k][q]).max(axis=1))
            probs.append(atom_weights[k] * w.sum(axis=1))
    return np.concatenate(errs), np.concatenate(probs)


@pytest.mark.parametrize("S, T", [(2, 8), (3, 6), (4, 5), (8, 3)])
def test_sup_error_distribution_is_bit_identical_to_the_numpy_formulation(S, T):
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 2, 1, symmetrize=S <= 4))
    rng = np.random.default_rng(S)
    A1, A2 = rng.normal(size=(T, T)), rng.normal(size=(S, S))
    for atoms, aw in ((task.prior.atoms, task.prior.weights), (checks.ood_transition(S)[None], np.ones(1))):
        e, p = checks.sup_error_distribution(task, A1, A2, atoms, aw)
        e0, p0 = _sup_error_distribution_numpy(task, A1, A2, atoms, aw)
        np.testing.assert_array_equal(e, e0)
        np.testing.assert_array_equal(p, p0)


@settings(max_examples=20)
@given(st.data())
def test_sampled_loss_and_grad_matches_numpy_on_the_same_sample(data):
    """The Monte-Carlo estimate (numba rows kernel) against the NumPy formulas on the same draws."""
    task = data.draw(tasks(min_S=2, max_S=4, min_T=2, max_T=8, max_sequences=20_000))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    A1, A2 = rng.normal(size=(task.T, task.T)), rng.normal(size=(task.S, task.S))
    n = data.draw(st.sampled_from([1, 100, 5000]))
    seed = data.draw(st.integers(0, 1000))
    est = pg.sampled_loss_and_grad(task, A1, A2, n, seed)
    smp = task.sample(n, seed)
    ref = reference.rows_loss_and_grad_numpy(smp.seqs, smp.targets / n, A1, A2, task.default_eps)
    assert_same(est, ref)


def test_sampled_estimate_converges_to_the_exact_gradient():
    """Unbiased with error ~ n^-1/2: 64x more draws, error at least 3x smaller (8x expected; fixed seeds)."""
    task = closed_task(S=3, T=6)
    rng = np.random.default_rng(3)
    A1, A2 = rng.normal(size=(6, 6)), rng.normal(size=(3, 3))
    ex = pg.exact_loss_and_grad(task, A1, A2)

    def err(n):
        est = pg.sampled_loss_and_grad(task, A1, A2, n, 11)
        return np.sqrt(np.sum((est.dA1 - ex.dA1) ** 2) + np.sum((est.dA2 - ex.dA2) ** 2))

    assert err(2**16) * 3 < err(2**10)


@given(st.integers(1, 400), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.5, 0.99, 1.0]))
def test_weighted_quantile_is_the_numpy_formula(n, seed, q):
    """``checks._weighted_quantile`` (one kernel) against the NumPy code it replaced, bit for bit."""
    rng = np.random.default_rng(seed)
    values = rng.random(n).round(int(rng.integers(1, 4)))  # ties
    weights = rng.random(n) * (rng.random(n) > 0.2)
    weights[0] += 0.1
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(weights[order])
    want = float(values[order][min(int(np.searchsorted(cw, q * cw[-1], side="left")), n - 1)])
    assert checks._weighted_quantile(values, weights, q) == want


@given(st.data())
def test_small_kernels_against_numpy(data):
    task = data.draw(tasks(min_S=2, max_S=4, min_T=2, max_T=7, max_sequences=3_000))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    seqs, w = task.all_sequences()
    out, out_p = np.empty_like(w), np.empty_like(w)
    _weights.rows_weights_serial(seqs, *task.kernel_arrays(), out)
    _weights.rows_weights(seqs, *task.kernel_arrays(), out_p)
    np.testing.assert_array_equal(out, w)  # same arithmetic as chunk_weights
    np.testing.assert_array_equal(out_p, w)
    np.testing.assert_allclose(out, sequence_weights_numpy(seqs, *task.kernel_arrays()), rtol=1e-13, atol=0)
    A1 = 3 * rng.normal(size=(task.T, task.T))
    P = np.empty_like(A1)
    single_kernels.attention(A1, P)
    np.testing.assert_allclose(P, pg.model.first_layer_attention(A1), rtol=1e-14, atol=1e-300)
    G = rng.normal(size=(task.T, task.T))
    dA1 = np.empty_like(G)
    single_kernels.finish_grad(G, P, dA1)
    Gl = np.tril(G)
    np.testing.assert_allclose(dA1, np.tril(P * (Gl - np.sum(P * Gl, axis=1, keepdims=True))), rtol=1e-13, atol=1e-15)
    D = rng.normal(size=(task.S, task.S))
    perms = [np.array(p) for p in itertools.permutations(range(task.S))]
    avg = np.mean([D[np.ix_(np.argsort(p), np.argsort(p))] for p in perms], axis=0)  # mean of σ D σᵀ
    out2 = np.empty_like(D)
    single_kernels.symmetrize_span(D, out2)
    np.testing.assert_allclose(out2, avg, rtol=1e-13, atol=1e-15)
    assert single_kernels.row_range(D) == np.ptp(D, axis=1).max()
    assert single_kernels.span_kind(D, 1e-15) == 0 and single_kernels.span_kind(out2, 0.0) == 1
    assert single_kernels.all_finite(D)
    D[0, -1] = np.nan
    assert not single_kernels.all_finite(D)
