"""The official optimizers (popgrad/train/optim.py): their statements in NumPy, and optax itself when installed."""
import math

import numpy as np
import pytest

from popgrad.train.optim import Optimizer, learning_rate

RTOL = 1e-12


def _shapes():
    return [(2, 4, 4), (3,), (5, 2)]


def _params(seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in _shapes()]


def _grad(params, t, rng):
    """A gradient that depends on the parameters (a quadratic pull) plus a fresh random part."""
    return [0.3 * p + rng.standard_normal(p.shape) * (1 + t % 3) for p in params]


def _run(opt, params, steps, seed):
    rng = np.random.default_rng(seed)
    state = opt.init(params)
    out = []
    for t in range(steps):
        params, state = opt.step(t, params, _grad(params, t, rng), state)
        out.append([p.copy() for p in params])
    return out


# ------------------------------------------------------------------ statements (NumPy only)
def test_cosine_schedule_values():
    steps = 8
    lrs = [learning_rate(2.0, "cosine", steps, t) for t in range(steps + 3)]
    assert lrs[0] == 2.0
    assert lrs[4] == pytest.approx(1.0, rel=1e-15)
    assert lrs[2] == pytest.approx(1.0 + math.sqrt(0.5), rel=1e-15)
    assert lrs[8] == 0.0 and lrs[9] == 0.0 and lrs[10] == 0.0  # clipped at decay_steps
    assert all(a > b for a, b in zip(lrs[:8], lrs[1:9]))
    assert learning_rate(2.0, "constant", steps, 5) == 2.0


def test_sgd_is_coupled_decay():
    opt = Optimizer("sgd", lr=0.5, lr_schedule="constant", steps=3, weight_decay=0.1)
    p = [np.array([2.0, -1.0])]
    g = [np.array([1.0, 1.0])]
    new, _ = opt.step(0, p, g, opt.init(p))
    np.testing.assert_allclose(new[0], p[0] - 0.5 * (g[0] + 0.1 * p[0]), rtol=RTOL)
    assert Optimizer("gd", lr=0.5, lr_schedule="constant", steps=3, weight_decay=0.1).step(0, p, g, opt.init(p))[0][0] \
        .tolist() == new[0].tolist()


def test_adam_bias_correction_constant_gradient():
    """With a constant gradient, m̂ = g and v̂ = g² at every step: each step moves lr_t·g/(|g|+eps)."""
    opt = Optimizer("adam", lr=0.1, lr_schedule="cosine", steps=10)
    g = np.array([3.0, -0.5, 1e-3])
    p = [np.zeros(3)]
    state = opt.init(p)
    for t in range(10):
        before = p[0]
        p, state = opt.step(t, p, [g], state)
        np.testing.assert_allclose(before - p[0], opt.lr_at(t) * g / (np.abs(g) + 1e-8), rtol=1e-12)
    assert state.count == 10


def test_adamw_decay_is_decoupled_and_adam_decay_coupled():
    """Zero gradient: AdamW shrinks θ by (1 − lr_t·wd) per step; Adam with wd sees g = wd·θ instead."""
    wd, lr = 0.1, 0.05
    p0 = [np.array([1.0, -2.0])]
    opt = Optimizer("adamw", lr=lr, lr_schedule="cosine", steps=5, weight_decay=wd)
    p, state = p0, opt.init(p0)
    expect = p0[0].copy()
    for t in range(5):
        p, state = opt.step(t, p, [np.zeros(2)], state)
        expect = expect * (1 - opt.lr_at(t) * wd)
        np.testing.assert_allclose(p[0], expect, rtol=1e-14)
    adam = Optimizer("adam", lr=lr, lr_schedule="constant", steps=5, weight_decay=wd)
    q, _ = adam.step(0, p0, [np.zeros(2)], adam.init(p0))
    # first Adam step on g = wd·θ: lr·sign(θ) (bias-corrected), up to eps
    np.testing.assert_allclose(q[0], p0[0] - lr * np.sign(p0[0]), rtol=1e-6)


def test_adam_second_step_by_hand():
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.01
    opt = Optimizer("adam", lr=lr, lr_schedule="constant", steps=2)
    g1, g2 = np.array([1.0]), np.array([-2.0])
    p, s = opt.step(0, [np.zeros(1)], [g1], opt.init([np.zeros(1)]))
    p, s = opt.step(1, p, [g2], s)
    m = (1 - b1) * (b1 * g1 + g2)
    v = (1 - b2) * (b2 * g1**2 + g2**2)
    u2 = (m / (1 - b1**2)) / (np.sqrt(v / (1 - b2**2)) + eps)
    np.testing.assert_allclose(p[0], -lr * g1 / (1 + eps) - lr * u2, rtol=1e-13)


@pytest.mark.parametrize("kw, match", [
    (dict(name="momentum"), "optimizer must be one of"),
    (dict(lr_schedule="linear"), "lr_schedule must be one of"),
    (dict(lr=0.0), "lr must be a positive"),
    (dict(steps=0), "steps must be an integer >= 1"),
    (dict(weight_decay=-1.0), "weight_decay must be a finite number >= 0"),
    (dict(b2=1.0), r"b2 must be in \[0, 1\)"),
])
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        Optimizer(**kw)


def test_deterministic():
    opt = Optimizer("adamw", lr=1e-2, steps=20, weight_decay=1e-4)
    a = _run(opt, _params(0), 20, seed=1)
    b = _run(opt, _params(0), 20, seed=1)
    assert all(np.array_equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


# ------------------------------------------------------------------ against optax (the `bench` extra)
def _optax_run(name, lr, schedule, steps, wd, params, seed):
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    import jax.numpy as jnp

    with jax.enable_x64(True):
        sched = optax.cosine_decay_schedule(lr, steps) if schedule == "cosine" else lr
        if name == "adamw":
            opt = optax.adamw(sched, b1=0.9, b2=0.999, eps=1e-8, weight_decay=wd)
        elif name == "adam":
            opt = optax.chain(optax.add_decayed_weights(wd), optax.adam(sched, b1=0.9, b2=0.999, eps=1e-8))
        else:
            opt = optax.chain(optax.add_decayed_weights(wd), optax.sgd(sched))
        p = [jnp.asarray(x, dtype=jnp.float64) for x in params]
        state = opt.init(p)
        rng = np.random.default_rng(seed)
        out = []
        for t in range(steps):
            g = [jnp.asarray(x) for x in _grad([np.asarray(q) for q in p], t, rng)]
            u, state = opt.update(g, state, p)
            p = optax.apply_updates(p, u)
            out.append([np.asarray(q, dtype=np.float64) for q in p])
    return out


@pytest.mark.parametrize("name, lr, schedule, wd", [
    ("adamw", 1e-2, "cosine", 1e-4),
    ("adamw", 3e-2, "constant", 0.0),
    ("adam", 1e-2, "cosine", 1e-3),
    ("sgd", 0.2, "cosine", 2e-4),
    ("sgd", 0.1, "constant", 0.0),
])
def test_equals_optax(name, lr, schedule, wd):
    steps = 60
    want = _optax_run(name, lr, schedule, steps, wd, _params(3), seed=7)
    got = _run(Optimizer(name, lr=lr, lr_schedule=schedule, steps=steps, weight_decay=wd), _params(3), steps, seed=7)
    for t, (rg, rw) in enumerate(zip(got, want)):
        for x, y in zip(rg, rw):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14, err_msg=f"step {t}")
