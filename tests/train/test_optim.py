"""The official optimizers (popgrad/train/optim.py): their statements in NumPy, and optax itself when installed."""
import math

import numpy as np
import pytest

from popgrad.train import optim as O
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
    assert int(state["0"]["count"]) == 10 and int(state["1"]["count"]) == 10  # scale_by_adam, the schedule


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
            np.testing.assert_array_equal(x, y, err_msg=f"step {t}")  # 0.0 difference


# ------------------------------------------------------------------ the transformations (optax's names)
def _tx_run(tx, params, steps, seed):
    """Step an optax-style transformation on a mapping of parameters: update, then apply_updates."""
    rng = np.random.default_rng(seed)
    p = {f"p{i}": x for i, x in enumerate(params)}
    state = tx.init(p)
    out = []
    for t in range(steps):
        g = dict(zip(p, _grad(list(p.values()), t, rng)))
        u, state = tx.update(g, state, p)
        p = O.apply_updates(p, u)
        out.append([x.copy() for x in p.values()])
    return out, state


def _optax_tx(build, params, steps, seed):
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    import jax.numpy as jnp

    with jax.enable_x64(True):
        opt = build(optax)
        p = {f"p{i}": jnp.asarray(x, dtype=jnp.float64) for i, x in enumerate(params)}
        state = opt.init(p)
        rng = np.random.default_rng(seed)
        out = []
        for t in range(steps):
            g = dict(zip(p, [jnp.asarray(x) for x in _grad([np.asarray(q) for q in p.values()], t, rng)]))
            u, state = opt.update(g, state, p)
            p = optax.apply_updates(p, u)
            out.append([np.asarray(q, dtype=np.float64) for q in p.values()])
    return out


@pytest.mark.parametrize("case", ["sgd", "adam", "adamw", "chain_decay_sgd", "chain_decay_adam", "schedule"])
def test_transformations_equal_optax_bit_for_bit(case):
    steps, lr, wd = 40, 2e-2, 1e-3

    def build(lib):
        sched = lib.cosine_decay_schedule(lr, steps)
        return {
            "sgd": lambda: lib.sgd(sched),
            "adam": lambda: lib.adam(sched),
            "adamw": lambda: lib.adamw(sched, weight_decay=wd),
            "chain_decay_sgd": lambda: lib.chain(lib.add_decayed_weights(wd), lib.sgd(lr)),
            "chain_decay_adam": lambda: lib.chain(lib.add_decayed_weights(wd), lib.scale_by_adam(),
                                                  lib.scale_by_learning_rate(sched)),
            "schedule": lambda: lib.chain(lib.scale_by_adam(b1=0.8, b2=0.99, eps=1e-6),
                                          lib.scale_by_schedule(lambda c: -lr / (1.0 + c))),
        }[case]()

    want = _optax_tx(build, _params(5), steps, seed=2)
    got, _ = _tx_run(build(O), _params(5), steps, seed=2)
    for t, (rg, rw) in enumerate(zip(got, want)):
        for x, y in zip(rg, rw):
            np.testing.assert_array_equal(x, y, err_msg=f"{case}, step {t}")


def test_string_form_is_its_transformation():
    """Optimizer(name, ...) is the chain of the named pieces (coupled decay first for sgd/adam)."""
    steps = 12
    for name, tx in [("sgd", O.chain(O.add_decayed_weights(0.01), O.sgd(O.cosine_decay_schedule(0.3, steps)))),
                     ("adam", O.chain(O.add_decayed_weights(0.01), O.adam(O.cosine_decay_schedule(0.3, steps)))),
                     ("adamw", O.adamw(O.cosine_decay_schedule(0.3, steps), weight_decay=0.01))]:
        a, _ = _tx_run(Optimizer(name, lr=0.3, steps=steps, weight_decay=0.01), _params(1), steps, seed=4)
        b, _ = _tx_run(tx, _params(1), steps, seed=4)
        assert all(np.array_equal(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)), name


def test_schedules_are_functions_of_the_step():
    s = O.cosine_decay_schedule(2.0, 8)
    assert [s(t) for t in (0, 4, 8, 20)] == [2.0, pytest.approx(1.0, rel=1e-15), 0.0, 0.0]
    assert O.constant_schedule(0.5)(123) == 0.5
    assert Optimizer("sgd", lr=2.0, steps=8).learning_rate(4) == s(4)


def test_state_is_a_flat_mapping_of_arrays():
    tx = O.adamw(0.1, weight_decay=0.1)
    st = tx.init({"A_1": np.zeros((2, 2)), "W": np.zeros(3)})
    flat = O.flatten_state(st)
    assert set(flat) == {"0.count", "0.mu.A_1", "0.mu.W", "0.nu.A_1", "0.nu.W", "2.count"}
    back = O.unflatten_state(flat, st)
    assert O.flatten_state(back).keys() == flat.keys()
    with pytest.raises(ValueError, match="without '.'"):
        O.flatten_state({"a.b": np.zeros(1)})
    with pytest.raises(ValueError, match="needs params"):
        O.add_decayed_weights(0.1).update({"W": np.ones(1)}, {}, None)
    with pytest.raises(TypeError, match="init and update"):
        O.chain(O.sgd(0.1), "adam")


def test_every_named_rule_carries_its_linearisation():
    from popgrad.train import optim as O

    want = {"gd": ("gd", "coupled"), "sgd": ("gd", "coupled"), "adam": ("adam", "coupled"),
            "adamw": ("adam", "decoupled")}
    assert set(O.LINEARISED) == set(O.NAMED) == set(want)  # a new named rule must say how it linearises
    for name, (kind, decay) in want.items():
        lin = O.Optimizer(name, 0.3, "cosine", 10, 1e-3, b1=0.8).linearisation
        assert (lin.kind, lin.decay, lin.weight_decay) == (kind, decay, 1e-3)
        assert [lin.learning_rate(t) for t in range(11)] == [O.Optimizer(name, 0.3, "cosine", 10).learning_rate(t)
                                                            for t in range(11)]
        assert kind == "gd" or lin.b1 == 0.8
    assert O.sgd(0.1).linearisation.kind == "gd" and O.adamw(0.1, weight_decay=0.2).linearisation.decay == "decoupled"
    assert O.chain(O.add_decayed_weights(0.1), O.sgd(0.1)).linearisation is None  # a chain does not guess
    with pytest.raises(ValueError, match="kind must be 'gd' or 'adam'"):
        O.Linearisation("momentum", O.constant_schedule(0.1))
