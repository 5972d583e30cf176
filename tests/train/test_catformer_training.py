"""train_catformer (issue 21): equal to optax on the same exact gradients, deterministic, resumable, one loop."""
from __future__ import annotations

import json

import numpy as np
import pytest

import popgrad as pg
from popgrad.train import CheckpointError, catformer as cf_train

RTOL = 1e-8  # the bound for "equals an independent optax run"


@pytest.fixture(scope="module")
def chain_task():
    return pg.Task(pg.chain(5), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=3, seed=0))


@pytest.fixture(scope="module")
def two_parent_task():
    return pg.MultiParentTask(pg.two_parent(6), pg.dirichlet_tensor_prior(S=2, k=2, alpha=1.0, n_atoms=2, seed=0))


def _leaves(p):
    return [*p.A, p.W]


def _assert_params_close(a, b, rtol):
    for x, y in zip(_leaves(a), _leaves(b)):
        scale = max(np.max(np.abs(y)), 1e-300)
        assert np.max(np.abs(x - y)) <= rtol * scale, np.max(np.abs(x - y)) / scale


# ------------------------------------------------------------------ done-when: an independent optax run
def _optax_catformer(task, model, steps, name, lr, wd, start):
    """optax's own optimizer, stepped on popgrad's exact gradients at optax's parameters."""
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    import jax.numpy as jnp

    with jax.enable_x64(True):
        sched = optax.cosine_decay_schedule(lr, steps)
        if name == "adamw":
            opt = optax.adamw(sched, b1=0.9, b2=0.999, eps=1e-8, weight_decay=wd)
        else:  # the loop of single_parent.py: g + wd·θ, then θ − lr_t·g
            opt = optax.chain(optax.add_decayed_weights(wd), optax.sgd(sched))
        params = {"A": [jnp.asarray(a) for a in start.A], "W": jnp.asarray(start.W)}
        state = opt.init(params)
        losses = []
        for _ in range(steps):
            p = pg.CatFormerParams([np.asarray(a, dtype=np.float64) for a in params["A"]],
                                   np.asarray(params["W"], dtype=np.float64))
            res = pg.catformer_loss_and_grad(task, model, p)
            losses.append(res.loss)
            g = {"A": [jnp.asarray(a) for a in res.dA], "W": jnp.asarray(res.dW)}
            updates, state = opt.update(g, state, params)
            params = optax.apply_updates(params, updates)
        final = pg.CatFormerParams([np.asarray(a, dtype=np.float64) for a in params["A"]],
                                   np.asarray(params["W"], dtype=np.float64))
    return final, np.array(losses)


def test_adamw_cosine_equals_optax(two_parent_task):
    model = pg.CatFormer(2, 6, heads=(2, 1))
    init = ("normal", 1e-2, 3)
    traj = pg.train_catformer(two_parent_task, model, 60, optimizer="adamw", lr=2e-2, lr_schedule="cosine",
                              weight_decay=1e-3, init=init, record_every=1)
    want, losses = _optax_catformer(two_parent_task, model, 60, "adamw", 2e-2, 1e-3, model.init(1e-2, 3))
    assert traj.status == "completed"
    _assert_params_close(traj.final, want, RTOL)
    np.testing.assert_allclose(traj.loss[:-1], losses, rtol=RTOL)
    assert traj.loss[-1] < traj.loss[0] - 1e-3  # it trained


def test_sgd_cosine_equals_optax(chain_task):
    model = pg.CatFormer(2, 5)
    traj = pg.train_catformer(chain_task, model, 60, optimizer="sgd", lr=1.0, lr_schedule="cosine",
                              weight_decay=1e-2, init="zero", record_every=1)
    want, losses = _optax_catformer(chain_task, model, 60, "sgd", 1.0, 1e-2, model.zeros())
    _assert_params_close(traj.final, want, RTOL)
    np.testing.assert_allclose(traj.loss[:-1], losses, rtol=RTOL)


# ------------------------------------------------------------------ the recipe by hand (no optax)
def test_sgd_steps_are_the_official_loop(chain_task):
    """θ_{t+1} = θ_t − lr_t (∇L(θ_t) + wd·θ_t), lr_t = lr·½(1 + cos(πt/steps)), recomputed from records."""
    model = pg.CatFormer(2, 5)
    steps, lr, wd = 6, 0.7, 0.05
    traj = pg.train_catformer(chain_task, model, steps, lr=lr, weight_decay=wd, init=("normal", 0.1, 1),
                              record_every=1)
    assert list(traj.step) == list(range(steps + 1))
    for t in range(steps):
        p = traj.params(t)
        g = pg.catformer_loss_and_grad(chain_task, model, p)
        lr_t = lr * 0.5 * (1 + np.cos(np.pi * t / steps))
        assert traj.lr[t] == pytest.approx(lr_t, rel=1e-15)
        assert traj.loss[t] == pytest.approx(g.loss, rel=1e-14)
        want = pg.CatFormerParams([a - lr_t * (d + wd * a) for a, d in zip(p.A, g.dA)], p.W - lr_t * (g.dW + wd * p.W))
        _assert_params_close(traj.params(t + 1), want, 1e-14)
    _assert_params_close(traj.final, traj.params(-1), 0.0)


def test_zero_start_w_moves_first(chain_task):
    """From the zero start every Ã gradient vanishes (uniform attention, constant output): only W moves at step 0."""
    model = pg.CatFormer(2, 5)
    traj = pg.train_catformer(chain_task, model, 2, record_every=1)
    assert all(np.all(a[1] == 0) for a in traj.A) and np.any(traj.W[1] != 0)
    assert any(np.any(a[2] != 0) for a in traj.A)


# ------------------------------------------------------------------ determinism, checkpoints, divergence
def test_bit_identical_runs(two_parent_task):
    model = pg.CatFormer(2, 6, heads=(2, 1))
    kw = dict(optimizer="adamw", lr=1e-2, weight_decay=1e-4, init=("normal", 1e-4, 0), record_every=4)
    a = pg.train_catformer(two_parent_task, model, 12, **kw)
    b = pg.train_catformer(two_parent_task, model, 12, **kw)
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(a.final), _leaves(b.final)))
    assert np.array_equal(a.loss, b.loss) and all(np.array_equal(x, y) for x, y in zip(a.A, b.A))


def test_interrupted_run_resumes_bit_identically(two_parent_task, tmp_path, monkeypatch):
    model = pg.CatFormer(2, 6, heads=(2, 1))
    kw = dict(optimizer="adamw", lr=1e-2, weight_decay=1e-4, init=("normal", 1e-4, 0), record_every=3)
    full = pg.train_catformer(two_parent_task, model, 20, **kw)
    real = cf_train.catformer_loss_and_grad
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 13:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    ck = tmp_path / "c.npz"
    monkeypatch.setattr(cf_train, "catformer_loss_and_grad", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pg.train_catformer(two_parent_task, model, 20, **kw, checkpoint_path=ck, checkpoint_every=5)
    monkeypatch.setattr(cf_train, "catformer_loss_and_grad", real)
    with np.load(ck) as z:
        assert json.loads(str(z["meta_json"]))["t"] == 10 and "opt.0.mu.A_1" in z.files
    resumed = pg.train_catformer(two_parent_task, model, 20, **kw, checkpoint_path=ck, resume=True)
    assert np.array_equal(full.step, resumed.step) and np.array_equal(full.loss, resumed.loss)
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(full.final), _leaves(resumed.final)))
    with pytest.raises(ValueError, match="different task or configuration"):
        pg.train_catformer(two_parent_task, model, 20, **{**kw, "lr": 2e-2}, checkpoint_path=ck, resume=True)


def test_damaged_checkpoint_is_refused(chain_task, tmp_path):
    model = pg.CatFormer(2, 5)
    ck = tmp_path / "c.npz"
    pg.train_catformer(chain_task, model, 4, optimizer="adam", lr=1e-2, checkpoint_path=ck, checkpoint_every=2)
    with np.load(ck) as z:
        arrays = {k: z[k] for k in z.files if k != "opt.0.nu.W"}
    with open(ck, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(CheckpointError, match="no array 'opt.0.nu.W'"):
        pg.train_catformer(chain_task, model, 4, optimizer="adam", lr=1e-2, checkpoint_path=ck, resume=True)


def test_divergence(chain_task):
    traj = pg.train_catformer(chain_task, pg.CatFormer(2, 5), 300, lr=1e6, lr_schedule="constant",
                              init=("normal", 1.0, 0), divergence_patience=5)
    assert traj.status == "diverged" and "lower lr" in traj.message
    assert np.all(np.isfinite(traj.loss))


def test_client_is_bit_identical(client, chain_task):
    model = pg.CatFormer(2, 5)
    a = pg.train_catformer(chain_task, model, 3, init=("normal", 0.1, 0))
    b = pg.train_catformer(chain_task, model, 3, init=("normal", 0.1, 0), client=client)
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(a.final), _leaves(b.final)))


def test_save_load_roundtrip(two_parent_task, tmp_path):
    traj = pg.train_catformer(two_parent_task, pg.CatFormer(2, 6, heads=(2, 1)), 5, optimizer="adamw", lr=1e-2,
                              init=("normal", 1e-4, 2), record_every=2)
    traj.save(tmp_path / "t.npz")
    back = pg.CatFormerTrajectory.load(tmp_path / "t.npz")
    assert back.config == traj.config and back.model == pg.CatFormer(2, 6, heads=(2, 1))
    assert np.array_equal(back.loss, traj.loss) and all(np.array_equal(x, y) for x, y in zip(back.A, traj.A))
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(back.final), _leaves(traj.final)))
    with pytest.raises(ValueError, match="not a popgrad catformer trajectory"):
        pg.CatFormerTrajectory.load(tmp_path / "missing.npz")


def test_given_start_and_its_fingerprint(chain_task):
    model = pg.CatFormer(2, 5)
    p = model.init(0.3, 5)
    a = pg.train_catformer(chain_task, model, 3, init=p)
    b = pg.train_catformer(chain_task, model, 3, init=("normal", 0.3, 5))
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(a.final), _leaves(b.final)))
    assert a.config.init == "given" and len(a.config.init_fingerprint) == 64 and b.config.init == "normal"


@pytest.mark.parametrize("kw, exc, match", [
    (dict(optimizer="momentum"), ValueError, "optimizer must be one of"),
    (dict(lr_schedule="step"), ValueError, "lr_schedule must be one of"),
    (dict(lr=-1.0), ValueError, "lr must be a positive"),
    (dict(weight_decay=-1.0), ValueError, "weight_decay must be"),
    (dict(init="ones"), ValueError, "init must be 'zero'"),
    (dict(init=("normal", -1.0, 0)), ValueError, "init scale"),
    (dict(init=3), TypeError, "init must be 'zero'"),
    (dict(record_every=0), ValueError, "record_every must be an integer >= 1"),
    (dict(steps=0), ValueError, "steps must be an integer >= 1"),
])
def test_bad_arguments(chain_task, kw, exc, match):
    kw = {"steps": 2, **kw}
    with pytest.raises(exc, match=match):
        pg.train_catformer(chain_task, pg.CatFormer(2, 5), **kw)


def test_model_must_fit_task(chain_task):
    with pytest.raises(ValueError, match="use CatFormer"):
        pg.train_catformer(chain_task, pg.CatFormer(2, 6), 2)
    with pytest.raises(TypeError, match="model must be a popgrad.CatFormer"):
        pg.train_catformer(chain_task, "catformer", 2)
