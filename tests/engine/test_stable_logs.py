"""Stable logs (issue 27 item 3): for any finite parameters every reported loss is at or above its exact floor.

The floor ``Σ_s min_{f∈Δ} -Σ_c w(s,c) log(f_c + ε)`` (engine/floor.py) bounds every predictor's loss from below;
a loss below it can only come from a log taken after an underflow. Parameter scales up to 1e300.
"""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import catformer as E
from popgrad.engine.catformer_rows import catformer_batch_loss_and_grad
from popgrad.engine.floor import floor_rows
from popgrad.engine.noise import gradient_noise
from popgrad.model.catformer import CatFormerParams

SCALES = [1.0, 1e3, 1e10, 1e50, 1e100, 1e200, 1e300]
TOL = 1e-12  # relative rounding of a sum of logs


def at_or_above(loss, floor):
    assert loss >= floor - TOL * abs(floor), (loss, floor)


def big_params(model, seed, scale_a, scale_w, pattern):
    rng = np.random.default_rng(seed)
    a_shapes, w_shape = model.shapes()
    if pattern == "ones":
        A = [scale_a * np.ones(s) for s in a_shapes]
        W = scale_w * np.ones(w_shape)
    elif pattern == "sign":
        A = [scale_a * np.sign(rng.standard_normal(s)) for s in a_shapes]
        W = scale_w * np.sign(rng.standard_normal(w_shape))
    else:
        A = [scale_a * rng.standard_normal(s) for s in a_shapes]
        W = scale_w * rng.standard_normal(w_shape)
    bound = 1e300 / 4 / max(model.dims) ** 2  # the logits stay finite: |z| ≤ Σ|W| (rows of h are ≤ 1)
    return CatFormerParams([np.clip(a, -bound, bound) for a in A], np.clip(W, -bound, bound))


def test_full_model_w_1e100_ones_is_not_below_the_floor():
    """The case of the issue: W = 1e100·ones gave 0.0 below the floor 0.5576."""
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 0.5, 3, seed=0))
    model = pg.CatFormer(2, 4)
    p = model.zeros()
    params = CatFormerParams(p.A, 1e100 * np.ones(p.W.shape))
    loss = pg.catformer_loss(task, model, params)
    assert loss >= pg.floor_loss(task, 0.0) * (1 - TOL)
    assert abs(loss - np.log(2)) <= 1e-12  # identical logits: f uniform, L = log 2 (weights sum to 1)


@given(S=st.integers(2, 3), T=st.integers(2, 4), heads=st.sampled_from([(1, 1), (2, 1), (1,)]),
       scale_a=st.sampled_from(SCALES), scale_w=st.sampled_from(SCALES),
       pattern=st.sampled_from(["ones", "sign", "normal"]), seed=st.integers(0, 2**31),
       eps=st.sampled_from([0.0, 0.01]))
@settings(max_examples=40, deadline=None)
def test_full_model_losses_at_or_above_the_floor(S, T, heads, scale_a, scale_w, pattern, seed, eps):
    task = pg.Task(pg.random_tree(T, seed=seed % 11), pg.dirichlet_prior(S, 0.5, 2, seed=seed % 7))
    model = pg.CatFormer(S, T, heads=heads)
    params = big_params(model, seed, scale_a, scale_w, pattern)
    floor = pg.floor_loss(task, eps)
    with warnings.catch_warnings():  # at these scales the gradient may overflow (warned; not this test's subject)
        warnings.filterwarnings("ignore", "catformer_loss_and_grad: the loss is finite but", RuntimeWarning)
        r = pg.catformer_loss_and_grad(task, model, params, eps=eps)
    at_or_above(r.loss, floor)
    with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():  # the gradient may overflow
        warnings.simplefilter("ignore", RuntimeWarning)
        assert E.catformer_loss_and_grad_numpy(task, model, params, eps).loss >= floor - TOL * floor
    seqs, w = task.all_sequences()
    rows = E.catformer_rows_loss_and_grad(seqs, w, model, params, eps, want_grad=False)
    at_or_above(rows.loss, float(np.sum(floor_rows(w, eps))))


@given(S=st.integers(2, 3), T=st.integers(2, 5), scale1=st.sampled_from(SCALES), scale2=st.sampled_from(SCALES),
       seed=st.integers(0, 2**31), eps=st.sampled_from([0.0, 0.01, None]))
@settings(max_examples=40, deadline=None)
def test_reduced_model_losses_at_or_above_the_floor(S, T, scale1, scale2, seed, eps):
    task = pg.Task(pg.random_tree(T, seed=seed % 11), pg.dirichlet_prior(S, 0.5, 2, seed=seed % 7))
    rng = np.random.default_rng(seed)
    A1, A2 = scale1 * rng.standard_normal((T, T)), scale2 * rng.standard_normal((S, S))
    e = task.default_eps if eps is None else eps
    floor = pg.floor_loss(task, e)
    auto, direct = pg.exact_loss(task, A1, A2, eps), pg.exact_loss(task, A1, A2, eps, engine="direct")
    at_or_above(auto, floor)
    at_or_above(direct, floor)
    assert np.isfinite(auto) == np.isfinite(direct)  # infinite only when a token of weight > 0 is absent
    at_or_above(gradient_noise(task, A1, A2, eps).mean.loss, floor)
    sample = task.sample(64, seed % 1000)
    w = sample.targets / 64
    from popgrad.engine.single import rows_loss_and_grad
    at_or_above(rows_loss_and_grad(sample.seqs, w, A1, A2, e).loss, float(np.sum(floor_rows(w, e))))


@given(T=st.integers(3, 4), scale1=st.sampled_from(SCALES), scale2=st.sampled_from(SCALES),
       seed=st.integers(0, 2**31), eps=st.sampled_from([0.0, 0.01]))
@settings(max_examples=20, deadline=None)
def test_k_head_losses_at_or_above_the_floor(T, scale1, scale2, seed, eps):
    task = pg.MultiParentTask(pg.two_parent(T), pg.dirichlet_tensor_prior(2, 2, 1.0, 2, seed=seed % 5))
    rng = np.random.default_rng(seed)
    A1, A2 = scale1 * rng.standard_normal((2, T, T)), scale2 * rng.standard_normal((2, 2, 2))
    floor = pg.floor_loss(task, eps)
    at_or_above(pg.exact_loss(task, A1, A2, eps), floor)
    at_or_above(gradient_noise(task, A1, A2, eps).mean.loss, floor)


def test_full_model_gradient_overflow_warns():
    """A finite loss whose gradient is not (the backward pass overflows float64: here tied scores whose adjoints
    are rounding noise times parameters of 1e296) is reported, on the trie and the rows paths; a finite
    gradient never warns, on any path."""
    task = pg.Task(pg.random_tree(3, seed=2), pg.dirichlet_prior(2, 0.5, 2, seed=2))
    model = pg.CatFormer(2, 3)
    huge = big_params(model, 2, 1e50, 1e300, "ones")
    seqs, w = task.all_sequences()
    calls = [lambda p: pg.catformer_loss_and_grad(task, model, p, eps=0.01),
             lambda p: E.catformer_rows_loss_and_grad(seqs, w, model, p, 0.01),
             lambda p: catformer_batch_loss_and_grad(seqs, w, model, p, 0.01)]
    for call in calls[:2]:
        with pytest.warns(RuntimeWarning, match=r"gradient entries are inf or NaN.*largest \|entry\| 6.25e\+296") as rec:
            r = call(huge)
        assert rec[0].filename == __file__  # attributed to the caller outside popgrad
        assert np.isfinite(r.loss)
        assert not all(np.isfinite(a).all() for a in [*r.dA, r.dW])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in calls:
            r = call(big_params(model, 0, 1.0, 1.0, "normal"))
            assert all(np.isfinite(a).all() for a in [*r.dA, r.dW])
