"""The tangent (forward-over-reverse) Hessian-vector kernels against the complex-step reference (DESIGN §22).

* ``method="tangent"`` (the default) against ``method="complex_step"`` at 1e-10 relative: the CatFormer over
  an enumeration (heads, depths, readouts, ε, a continuous prior), over given rows (a sampled batch), and the
  reduced single- and k-head models; hypothesis over sizes, points and directions;
* against JAX ``jvp(grad)`` of the independent models of ``test_hvp.py`` (skipped without JAX);
* the scale limit: ``H(c v) = c H v`` from ``c = 1e-300`` to ``1e305`` by both methods, overflow warned;
* the parallel and serial twins give the same bits (thread-count independence);
* ``hessian_spectrum``'s ``tol`` and ``method`` refused in one line when bad.
"""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import hvp as H
from popgrad.engine import tangent as TG
from popgrad.engine._kernels import catformer_hvp as KH
from popgrad.engine._kernels import reduced_hvp as KR

from .test_hvp import _jax, _jax_catformer_loss, _jax_reduced_loss, cat_point, chain_task, rel, two_parent_task


def flat(p):
    return H.flatten_params(p)


def both_cat(task, model, p, v, eps=None):
    got = flat(pg.catformer_hvp(task, model, p, v, eps=eps))
    ref = flat(pg.catformer_hvp(task, model, p, v, eps=eps, method="complex_step"))
    return got, ref


# ------------------------------------------------------------------ the CatFormer over an enumeration
@pytest.mark.parametrize("heads", [(1,), (1, 1), (2, 1), (1, 2), (1, 1, 1)])
@pytest.mark.parametrize("readout,eps", [("softmax", None), ("softmax", 0.05), ("linear", 0.3)])
def test_catformer_tangent_matches_complex_step(heads, readout, eps):
    S, T = 2, 4
    task = two_parent_task(S=S, T=T)
    model = pg.CatFormer(S, T, heads=heads, readout=readout)
    p, v = cat_point(model, 0.5, 1), cat_point(model, 1.0, 2)
    if readout == "linear":  # positive outputs: a finite loss
        p = pg.CatFormerParams(p.A, np.abs(p.W) + 0.5)
    got, ref = both_cat(task, model, p, v, eps)
    assert np.all(np.isfinite(got)) and np.abs(ref).max() > 0
    assert rel(got, ref) < 1e-10


@pytest.mark.parametrize("kind", ["dirichlet", "tensor"])
def test_catformer_tangent_on_a_continuous_prior(kind):
    if kind == "dirichlet":
        task = pg.Task(pg.chain(4), pg.DirichletPrior(3, 0.5))
    else:
        task = pg.MultiParentTask(pg.two_parent(4), pg.DirichletTensorPrior(2, 2, 0.5))
    model = pg.CatFormer(task.S, 4, heads=(2, 1))
    got, ref = both_cat(task, model, cat_point(model, 0.4, 3), cat_point(model, 1.0, 4))
    assert rel(got, ref) < 1e-10


def test_catformer_tangent_at_a_large_point_uses_the_exp_fallback():
    """Large first-layer scores push the exp table below 1e-200: the kernel's exp path, same products."""
    task = two_parent_task(S=2, T=5)
    model = pg.CatFormer(2, 5, heads=(2, 1))
    p = cat_point(model, 0.3, 7)
    A0 = p.A[0].copy()
    A0[:, 0, 1] = 400.0  # token 0 against token 1: e^-400 per factor on other rows
    A0[:, 1, 0] = -400.0
    p = pg.CatFormerParams([A0, p.A[1]], p.W)
    got, ref = both_cat(task, model, p, cat_point(model, 1.0, 8))
    assert rel(got, ref) < 1e-10


# ------------------------------------------------------------------ given rows (a sampled batch)
@pytest.mark.parametrize("readout,eps", [("softmax", None), ("softmax", 0.1), ("linear", 0.2)])
def test_rows_tangent_matches_complex_step(readout, eps):
    rng = np.random.default_rng(0)
    model = pg.CatFormer(3, 5, heads=(1, 2), readout=readout)
    p, v = cat_point(model, 0.5, 11), cat_point(model, 1.0, 12)
    if readout == "linear":
        p = pg.CatFormerParams(p.A, np.abs(p.W) + 0.5)
    seqs = rng.integers(0, 3, size=(700, 5))  # three blocks of PER rows, the last one short
    seqs[5] = seqs[4]  # a repeated row
    w = rng.random((700, 3)) / 700
    w[7] = 0.0  # a row of zero weight
    got = flat(H.catformer_rows_hvp(seqs, w, model, p, v, eps=eps))
    ref = flat(H.catformer_rows_hvp(seqs, w, model, p, v, eps=eps, method="complex_step"))
    assert rel(got, ref) < 1e-10
    empty = H.catformer_rows_hvp(seqs[:0], w[:0], model, p, v, eps=eps)
    assert not np.any(flat(empty))


# ------------------------------------------------------------------ the reduced models
@pytest.mark.parametrize("kind", ["single", "multi", "continuous"])
def test_reduced_tangent_matches_complex_step(kind):
    rng = np.random.default_rng(5)
    if kind == "single":
        task, sh1, sh2 = chain_task(S=3, T=5), (5, 5), (3, 3)
    elif kind == "continuous":
        task, sh1, sh2 = pg.Task(pg.chain(4), pg.DirichletPrior(3, 0.5)), (4, 4), (3, 3)
    else:
        task, sh1, sh2 = two_parent_task(S=2, T=5), (2, 5, 5), (2, 2, 2)
    A1, A2, V1, V2 = (rng.standard_normal(s) for s in (sh1, sh2, sh1, sh2))
    g1, g2 = pg.hvp(task, A1, A2, (V1, V2))
    r1, r2 = pg.hvp(task, A1, A2, (V1, V2), method="complex_step")
    got, ref = np.concatenate([g1.ravel(), g2.ravel()]), np.concatenate([r1.ravel(), r2.ravel()])
    assert rel(got, ref) < 1e-10
    assert not np.any(g1[..., ~np.tri(sh1[-1], dtype=bool)])  # zero above the diagonal


# ------------------------------------------------------------------ hypothesis
@settings(max_examples=12, deadline=None)
@given(S=st.integers(2, 3), T=st.integers(2, 5), heads=st.sampled_from([(1,), (2,), (1, 1), (2, 1), (1, 1, 1)]),
       seed=st.integers(0, 10**6), scale=st.floats(0.05, 2.0))
def test_catformer_tangent_property(S, T, heads, seed, scale):
    if S**T > 300:
        T = 4
    task = two_parent_task(S=S, T=T, seed=seed % 7) if T >= 3 else chain_task(S=S, T=T, seed=seed % 7)
    model = pg.CatFormer(S, T, heads=heads)
    p, u, v = cat_point(model, scale, seed), cat_point(model, 1.0, seed + 1), cat_point(model, 1.0, seed + 2)
    hv, ref = both_cat(task, model, p, v)
    assert rel(hv, ref) < 1e-10
    hu = flat(pg.catformer_hvp(task, model, p, u))
    assert abs(flat(u) @ hv - flat(v) @ hu) <= 1e-10 * (np.linalg.norm(hu) * np.linalg.norm(flat(v)) + 1e-300)
    uv = H.unflatten_params(model, 2.0 * flat(u) - 3.0 * flat(v))
    assert rel(flat(pg.catformer_hvp(task, model, p, uv)), 2.0 * hu - 3.0 * hv) < 1e-12


@settings(max_examples=12, deadline=None)
@given(S=st.integers(2, 3), T=st.integers(2, 5), multi=st.booleans(), seed=st.integers(0, 10**6),
       scale=st.floats(0.1, 3.0))
def test_reduced_tangent_property(S, T, multi, seed, scale):
    T = max(T, 3) if multi else T
    task = two_parent_task(S=S, T=T, seed=seed % 5) if multi else chain_task(S=S, T=T, seed=seed % 5)
    rng = np.random.default_rng(seed)
    sh1, sh2 = ((2, T, T), (2, S, S)) if multi else ((T, T), (S, S))
    A1, A2 = scale * rng.standard_normal(sh1), scale * rng.standard_normal(sh2)
    V1, V2 = rng.standard_normal(sh1), rng.standard_normal(sh2)
    g = np.concatenate([a.ravel() for a in pg.hvp(task, A1, A2, (V1, V2))])
    r = np.concatenate([a.ravel() for a in pg.hvp(task, A1, A2, (V1, V2), method="complex_step")])
    assert rel(g, r) < 1e-10


# ------------------------------------------------------------------ JAX jvp(grad)
@pytest.mark.parametrize("heads", [(2, 1)])  # (1, 1) and the reduced single head: test_hvp.py (the default method)
def test_catformer_tangent_matches_jax(heads):
    jax, jnp = _jax()
    T = 5
    task = two_parent_task(T=T)
    model = pg.CatFormer(2, T, heads=heads)
    seqs, w = next(task.enumerate(chunk_size=task.n_sequences))
    loss = _jax_catformer_loss(jnp, model, seqs, w)
    p, v = cat_point(model, 0.6, 5), cat_point(model, 1.0, 6)
    f = lambda A, W: jax.grad(loss, argnums=(0, 1))(A, W)  # noqa: E731
    _, (tA, tW) = jax.jvp(f, ([jnp.asarray(a) for a in p.A], jnp.asarray(p.W)),
                          ([jnp.asarray(a) for a in v.A], jnp.asarray(v.W)))
    ref = flat(pg.CatFormerParams([np.asarray(a) for a in tA], np.asarray(tW)))
    assert rel(flat(pg.catformer_hvp(task, model, p, v, method="tangent")), ref) < 1e-10


@pytest.mark.parametrize("multi", [True])
def test_reduced_tangent_matches_jax(multi):
    jax, jnp = _jax()
    task = two_parent_task(T=5) if multi else chain_task(S=3, T=5)
    seqs, w = next(task.enumerate(chunk_size=task.n_sequences))
    eps = task.default_eps
    loss = _jax_reduced_loss(jnp, task, seqs, w, eps, multi)
    rng = np.random.default_rng(4)
    sh1 = (2, 5, 5) if multi else (5, 5)
    sh2 = (2, task.S, task.S) if multi else (task.S, task.S)
    A1, A2, V1, V2 = (rng.standard_normal(s) for s in (sh1, sh2, sh1, sh2))
    _, (t1, t2) = jax.jvp(lambda a, b: jax.grad(loss, argnums=(0, 1))(a, b), (A1, A2), (V1, V2))
    t1 = np.where(np.tri(5, dtype=bool), np.asarray(t1), 0.0)
    h1, h2 = pg.hvp(task, A1, A2, (V1, V2), method="tangent")
    assert rel(np.concatenate([h1.ravel(), h2.ravel()]), np.concatenate([t1.ravel(), np.asarray(t2).ravel()])) < 1e-10


# ------------------------------------------------------------------ the scale of v
@pytest.mark.parametrize("method", ["tangent", "complex_step"])
@pytest.mark.parametrize("c", [1e-300, 1e-150, 1e150, 1e305])
def test_products_scale_with_the_direction(method, c):
    task = two_parent_task(S=2, T=4)
    model = pg.CatFormer(2, 4, heads=(2, 1))
    p, v = cat_point(model, 0.5, 1), cat_point(model, 1.0, 2)
    base = flat(pg.catformer_hvp(task, model, p, v, method=method))
    cv = H.unflatten_params(model, c * flat(v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = flat(pg.catformer_hvp(task, model, p, cv, method=method)) / c
    assert rel(got, base) < 1e-12
    rng = np.random.default_rng(0)
    rt = chain_task(S=2, T=4)
    A1, A2, V1, V2 = (rng.standard_normal(s) for s in ((4, 4), (2, 2), (4, 4), (2, 2)))
    b = np.concatenate([a.ravel() for a in pg.hvp(rt, A1, A2, (V1, V2), method=method)])
    g = np.concatenate([a.ravel() for a in pg.hvp(rt, A1, A2, (c * V1, c * V2), method=method)]) / c
    assert rel(g, b) < 1e-12


def test_power_of_two_scale_is_bit_identical_and_overflow_warns():
    task = two_parent_task(S=2, T=4)
    model = pg.CatFormer(2, 4, heads=(2, 1))
    p, v = cat_point(model, 0.5, 1), cat_point(model, 1.0, 2)
    base = flat(pg.catformer_hvp(task, model, p, v))
    big = flat(pg.catformer_hvp(task, model, p, H.unflatten_params(model, 2.0**900 * flat(v))))
    assert np.array_equal(big, base * 2.0**900)
    lin = pg.CatFormer(2, 4, heads=(2, 1), readout="linear")  # curvature w/(f + ε)² ≈ 1e4: H v beyond float64
    q = pg.CatFormerParams(p.A, np.abs(p.W) * 1e-3 + 1e-3)
    huge = H.unflatten_params(lin, 1.7e308 / np.abs(flat(v)).max() * flat(v))
    with pytest.warns(RuntimeWarning, match="overflow float64"):
        out = flat(pg.catformer_hvp(task, lin, q, huge, eps=0.01))
    assert np.any(np.isinf(out))


# ------------------------------------------------------------------ thread-count independence
def test_parallel_and_serial_twins_give_the_same_bits():
    rng = np.random.default_rng(1)
    model = pg.CatFormer(2, 6, heads=(2, 1))
    p, v = cat_point(model, 0.5, 1), cat_point(model, 1.0, 2)
    seqs, w = rng.integers(0, 2, size=(1500, 6)), rng.random((1500, 2))
    job, vj = TG._jobs(model, p, v)
    outs = []
    for kernel in (KH.run_rows_hvp, KH.run_rows_hvp_serial):
        nb = -(-1500 // TG.PER)
        loss_s, HA_s, HW_s = np.zeros(nb), np.zeros((nb, *job.A.shape)), np.zeros((nb, *job.W.shape))
        kernel(seqs, w, TG.PER, job.dims, job.hinfo, job.A, job.AT, job.EA, job.W, job.WT, vj.A, vj.AT, vj.W,
               vj.WT, 0.0, True, loss_s, HA_s, HW_s)
        KH.sum_hvp_slots(loss_s, HA_s, HW_s)
        outs.append((HA_s[0].copy(), HW_s[0].copy()))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
    P = np.tril(rng.random((6, 6)))
    P /= P.sum(axis=1, keepdims=True)
    Pd, A2, V2 = np.tril(rng.standard_normal((6, 6))), rng.standard_normal((2, 2)), rng.standard_normal((2, 2))
    res = []
    for kernel in (KR.run_single, KR.run_single_serial):
        nb = -(-1500 // TG.PER)
        s = [np.zeros(nb), np.zeros((nb, 6, 6)), np.zeros((nb, 6, 6)), np.zeros((nb, 2, 2))]
        kernel(seqs, w, TG.PER, P, Pd, A2, V2, 0.1, *s)
        KR.sum_reduced_slots(*s)
        res.append([a[0].copy() for a in s[1:]])
    assert all(np.array_equal(a, b) for a, b in zip(*res))


# ------------------------------------------------------------------ spectra
def test_spectrum_by_both_methods_agrees():
    task = two_parent_task(S=2, T=4)
    model = pg.CatFormer(2, 4, heads=(2, 1))
    p = cat_point(model, 0.5, 3)
    a = pg.hessian_spectrum(task, model, p, k=2, which="both")
    b = pg.hessian_spectrum(task, model, p, k=2, which="both", method="complex_step")
    assert np.allclose(a.values, b.values, rtol=1e-9, atol=1e-12 * np.abs(b.values).max())


@pytest.mark.parametrize("tol,exc", [(float("nan"), ValueError), (float("inf"), ValueError), (-1e-3, ValueError),
                                     ("1e-6", TypeError), (True, TypeError), (None, TypeError)])
def test_spectrum_tolerance_is_validated(tol, exc):
    task = two_parent_task(S=2, T=4)
    model = pg.CatFormer(2, 4, heads=(2, 1))
    with pytest.raises(exc, match="tol must be a finite real number >= 0") as info:
        pg.hessian_spectrum(task, model, cat_point(model, 0.5, 3), k=2, tol=tol)
    assert "\n" not in str(info.value)


def test_bad_method_is_named():
    task = two_parent_task(S=2, T=4)
    model = pg.CatFormer(2, 4, heads=(2, 1))
    p = cat_point(model, 0.5, 3)
    for call in (lambda: pg.catformer_hvp(task, model, p, p, method="jax"),
                 lambda: pg.hessian_spectrum(task, model, p, method=1),
                 lambda: pg.hvp(chain_task(), np.zeros((4, 4)), np.zeros((2, 2)), (np.ones((4, 4)), np.ones((2, 2))),
                                method="fd")):
        with pytest.raises(ValueError, match="method must be one of"):
            call()


def test_symmetry_study_tolerances_are_validated():
    from popgrad.checks.symmetry_breaking import follow_symmetric_start, preconditioned_spectrum

    task = two_parent_task(S=2, T=4)
    model = pg.CatFormer(2, 4, heads=(2, 1))
    p = cat_point(model, 0.5, 3)
    for call in (lambda: follow_symmetric_start(task, model, p, 2, spectrum_tol=float("nan")),
                 lambda: preconditioned_spectrum(task, model, p, np.ones(H.flatten_params(p).size), tol="x")):
        with pytest.raises((ValueError, TypeError), match="tol must be a finite real number >= 0") as info:
            call()
        assert "\n" not in str(info.value)
