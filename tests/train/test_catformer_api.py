"""train_catformer's open API (issue 26 items 2, 4; issue 30 item 1; issue 33 item 5): a hand-written optimizer,
one validated config, the sampled gradient, trajectories as data frames."""
from __future__ import annotations

import json

import numpy as np
import pytest

import popgrad as pg
from popgrad.checks import catformer as cc
from popgrad.model.catformer import catformer_backward
from popgrad.train import catformer as cf_train
from popgrad.train import optim as O
from popgrad.train.catformer import CatFormerTrainConfig, batch_loss_and_grad


@pytest.fixture(scope="module")
def task():
    return pg.Task(pg.chain(4), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=3, seed=0))


def _leaves(p):
    return [*p.A, p.W]


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(_leaves(a.final), _leaves(b.final))) and \
        np.array_equal(a.loss, b.loss, equal_nan=True) and np.array_equal(a.loss_se, b.loss_se, equal_nan=True)


# ------------------------------------------------------------------ a user's own optimizer
class Momentum:
    """Heavy-ball momentum, written by hand: v ← β v + g, θ ← θ − lr v (the state: one array per parameter)."""

    name = "momentum(lr=0.5, beta=0.9)"

    def __init__(self, lr=0.5, beta=0.9):
        self.lr, self.beta = lr, beta

    def init(self, params):
        return {"velocity": {k: np.zeros_like(v) for k, v in params.items()}}

    def update(self, grads, state, params=None):
        vel = {k: self.beta * state["velocity"][k] + g for k, g in grads.items()}
        return {k: -self.lr * v for k, v in vel.items()}, {"velocity": vel}


def test_a_hand_written_momentum_trains_and_resumes(task, tmp_path, monkeypatch):
    model = pg.CatFormer(2, 4)
    traj = pg.train_catformer(task, model, 12, optimizer=Momentum(), init=("normal", 0.2, 3), record_every=1)
    # the same steps by hand on the exact gradients
    p = model.init(0.2, 3)
    vel = [np.zeros_like(a) for a in _leaves(p)]
    for t in range(12):
        res = pg.catformer_loss_and_grad(task, model, p)
        assert res.loss == traj.loss[t]
        vel = [0.9 * v + g for v, g in zip(vel, [*res.dA, res.dW])]
        new = [a - 0.5 * v for a, v in zip(_leaves(p), vel)]
        p = pg.CatFormerParams(new[:-1], new[-1])
    assert all(np.array_equal(x, y) for x, y in zip(_leaves(traj.final), _leaves(p)))
    assert traj.status == "completed" and traj.loss[-1] < traj.loss[0]
    assert np.all(np.isnan(traj.lr))  # the object names no learning rate
    assert traj.config.to_dict()["optimizer"] == Momentum.name
    traj.save(tmp_path / "m.npz")
    back = pg.CatFormerTrajectory.load(tmp_path / "m.npz").config
    assert back.optimizer == Momentum.name
    with pytest.raises(ValueError, match="cannot be rebuilt from its name"):
        back.optimizer_rule()
    # its state is checkpointed whole, and a resumed run is bit-identical
    real, calls = cf_train.catformer_loss_and_grad, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 8:
            raise KeyboardInterrupt
        return real(*a, **k)

    ck = tmp_path / "c.npz"
    monkeypatch.setattr(cf_train, "catformer_loss_and_grad", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pg.train_catformer(task, model, 12, optimizer=Momentum(), init=("normal", 0.2, 3), record_every=1,
                           checkpoint_path=ck, checkpoint_every=5)
    monkeypatch.setattr(cf_train, "catformer_loss_and_grad", real)
    with np.load(ck) as z:
        assert "opt.velocity.W" in z.files and "opt.velocity.A_1" in z.files
    resumed = pg.train_catformer(task, model, 12, optimizer=Momentum(), init=("normal", 0.2, 3), record_every=1,
                                 checkpoint_path=ck, resume=True)
    assert _same(traj, resumed)
    with pytest.raises(ValueError, match="different task or configuration"):
        pg.train_catformer(task, model, 12, optimizer="sgd", init=("normal", 0.2, 3), record_every=1,
                           checkpoint_path=ck, resume=True)


def test_optax_style_objects_equal_the_names(task):
    model = pg.CatFormer(2, 4)
    kw = dict(init=("normal", 0.1, 0), record_every=2)
    a = pg.train_catformer(task, model, 8, optimizer="adamw", lr=1e-2, weight_decay=1e-3, **kw)
    b = pg.train_catformer(task, model, 8, optimizer=O.adamw(O.cosine_decay_schedule(1e-2, 8), weight_decay=1e-3), **kw)
    assert _same(a, b) and np.array_equal(a.lr, b.lr)
    with pytest.raises(ValueError, match="lr, weight_decay: part of the optimizer object"):
        pg.train_catformer(task, model, 8, optimizer=O.sgd(0.1), lr=0.1, weight_decay=0.1)
    with pytest.raises(TypeError, match="optimizer must be one of"):
        pg.train_catformer(task, model, 8, optimizer=3)


def test_a_state_layout_that_changes_is_refused(task):
    class Bad(Momentum):
        def update(self, grads, state, params=None):
            u, s = super().update(grads, state, params)
            return u, {"velocity": s["velocity"], "extra": np.zeros(1)}

    with pytest.raises(ValueError, match="layout differs"):
        pg.train_catformer(task, pg.CatFormer(2, 4), 3, optimizer=Bad())


# ------------------------------------------------------------------ one config, validated once
def test_config_object_and_overrides(task):
    model = pg.CatFormer(2, 4)
    cfg = CatFormerTrainConfig(S=2, T=4, steps=6, optimizer="adam", lr=1e-2, lr_schedule="constant",
                               record_every=None)
    assert cfg.record_every == 1  # resolved where the config is built
    a = pg.train_catformer(task, model, 6, cfg, init=("normal", 0.1, 1))
    b = pg.train_catformer(task, model, 6, optimizer="adam", lr=1e-2, lr_schedule="constant", init=("normal", 0.1, 1))
    assert _same(a, b) and a.config == b.config
    c = pg.train_catformer(task, model, 6, cfg, init=("normal", 0.1, 1), lr=2e-2)
    assert c.config.lr == 2e-2 and not _same(a, c)
    with pytest.raises(ValueError, match="config has T = 5 but the model has T = 4"):
        pg.train_catformer(task, model, 6, CatFormerTrainConfig(S=2, T=5))
    with pytest.raises(TypeError, match="config must be"):
        pg.train_catformer(task, model, 6, "adam")
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        pg.train_catformer(task, model, 6, learning_rate=0.1)
    with pytest.raises(ValueError, match="config.init is 'given'"):
        pg.train_catformer(task, model, 6, CatFormerTrainConfig(S=2, T=4, init="given"))


@pytest.mark.parametrize("kw, match", [
    (dict(lr=0.0), "lr must be a positive"),
    (dict(optimizer="rmsprop"), "optimizer must be one of"),
    (dict(gradient="sgd"), "gradient must be one of"),
    (dict(gradient="sampled", batch_size=0), "batch_size must be an integer >= 1"),
    (dict(gradient="sampled", sample_seed=-1), "sample_seed must be an integer >= 0"),
    (dict(batch_size=64), "batch_size is only used with gradient='sampled'"),
    (dict(sample_seed=3), "sample_seed is only used with gradient='sampled'"),
    (dict(divergence_patience=0), "divergence_patience must be an integer >= 1"),
])
def test_config_errors_are_one_line(kw, match):
    with pytest.raises(ValueError, match=match) as exc:
        CatFormerTrainConfig(S=2, T=4, **kw)
    assert "\n" not in str(exc.value)


# ------------------------------------------------------------------ the sampled gradient
def test_sampled_gradients_average_to_the_exact_gradient(task):
    """z-test per coordinate: the mean of 300 seeded batch gradients (64 sequences each) against the exact one."""
    model = pg.CatFormer(2, 4)
    p = model.init(0.7, 2)
    p = pg.CatFormerParams(p.A, np.random.default_rng(5).standard_normal(p.W.shape))
    exact = pg.catformer_loss_and_grad(task, model, p)
    want = np.concatenate([g.ravel() for g in (*exact.dA, exact.dW)])
    R, n = 300, 64
    draws, losses = np.empty((R, want.size)), np.empty(R)
    for r in range(R):
        b = task.sample(n, np.random.SeedSequence([11, r]))
        loss, dA, dW, _ = batch_loss_and_grad(model, p, b.seqs, b.targets, 0.0)
        draws[r] = np.concatenate([g.ravel() for g in (*dA, dW)])
        losses[r] = loss
    mean, se = draws.mean(axis=0), draws.std(axis=0, ddof=1) / np.sqrt(R)
    moving = se > 0
    assert moving.sum() > 50
    z = (mean[moving] - want[moving]) / se[moving]
    assert np.max(np.abs(z)) < 6.0, np.max(np.abs(z))  # Bonferroni over the coordinates: never flaky
    np.testing.assert_allclose(mean[~moving], want[~moving], atol=1e-12)
    assert abs(losses.mean() - exact.loss) < 6 * losses.std(ddof=1) / np.sqrt(R)


def test_sampled_batch_rows_match_the_reference_backward(task):
    model = pg.CatFormer(2, 4)
    p = model.init(0.5, 0)
    b = task.sample(32, 3)
    mean, dA, dW, ls = batch_loss_and_grad(model, p, b.seqs, b.targets, 0.0, per_row=True)
    loss, dA_ref, dW_ref = catformer_backward(model, p, b.seqs, b.targets / 32, 0.0)
    np.testing.assert_allclose([mean, ls.mean()], [loss, loss], rtol=1e-12)
    for x, y in zip((*dA, dW), (*dA_ref, dW_ref)):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-14)


def test_sampled_training_is_deterministic_and_resumes(task, tmp_path, monkeypatch):
    model = pg.CatFormer(2, 4)
    kw = dict(gradient="sampled", batch_size=64, sample_seed=5, lr=0.5, lr_schedule="constant", record_every=1)
    a = pg.train_catformer(task, model, 10, **kw)
    b = pg.train_catformer(task, model, 10, **kw)
    assert _same(a, b) and np.all(np.isfinite(a.loss_se)) and np.all(a.loss_se[1:] > 0)
    assert a.loss_se[0] == 0  # zero start: every sequence's loss is ln 2
    assert a.config.batch_size == 64 and a.config.sample_seed == 5
    c = pg.train_catformer(task, model, 10, **{**kw, "sample_seed": 6})
    assert not _same(a, c)
    real, calls = cf_train.batch_loss_and_grad, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 8:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    ck = tmp_path / "c.npz"
    monkeypatch.setattr(cf_train, "batch_loss_and_grad", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pg.train_catformer(task, model, 10, **kw, checkpoint_path=ck, checkpoint_every=3)
    monkeypatch.setattr(cf_train, "batch_loss_and_grad", real)
    with np.load(ck) as z:
        assert json.loads(str(z["meta_json"]))["t"] == 6
    resumed = pg.train_catformer(task, model, 10, **kw, checkpoint_path=ck, resume=True)
    assert _same(a, resumed)


def test_sampled_training_needs_no_enumeration():
    """S = 10, T = 20 (10^20 sequences): the exact gradient is refused, the sampled one runs."""
    big = pg.Task(pg.chain(20), pg.dirichlet_prior(S=10, alpha=0.1, n_atoms=2, seed=0))
    model = pg.CatFormer(10, 20)
    traj = pg.train_catformer(big, model, 2, gradient="sampled", batch_size=8, record_every=1)
    assert traj.status == "completed" and np.all(np.isfinite(traj.loss)) and np.any(traj.final.W != 0)
    with pytest.raises(ValueError):
        pg.train_catformer(big, model, 2)


# ------------------------------------------------------------------ trajectories as data frames
def test_catformer_to_frame(task, tmp_path):
    model = pg.CatFormer(2, 4)
    traj = pg.train_catformer(task, model, 6, init=("normal", 0.3, 0), record_every=2)
    df = traj.to_frame()
    assert list(df.columns[:6]) == ["step", "stage", "loss", "loss_se", "grad_norm", "lr"]
    assert df["step"].tolist() == [0, 2, 4, 6] and np.array_equal(df["loss"].to_numpy(), traj.loss)
    want = cc.attention_to_parent_per_position(task.graph, cc.positional_attention(model, traj.params(-1)))[0]
    got = df[[f"attn_parent_{i}" for i in range(4)]].to_numpy()[-1]
    np.testing.assert_allclose(got, want, rtol=1e-14)
    assert np.isnan(got[0])  # position 0 is a root
    traj.save(tmp_path / "t.npz")
    assert pg.CatFormerTrajectory.load(tmp_path / "t.npz").to_frame().equals(df)


def test_reduced_to_frame(task):
    traj = pg.train_two_stage(task, beta0=1e-2, lr1=1.0, steps1=4, lr2=1.0, steps2=3, record_every=1)
    df = traj.to_frame()
    assert df["step"].tolist() == list(range(8)) and df["stage"].tolist() == [1] * 5 + [2] * 3
    assert np.array_equal(df["grad_norm"].to_numpy(), traj.grad_norm)
    assert df["lr1"].notna().tolist() == [True] * 4 + [False] * 4  # steps 0-3 move A1, 4-6 move A2
    assert df["lr2"].notna().tolist() == [False] * 4 + [True] * 4
    np.testing.assert_array_equal(df["attn_parent_2"].to_numpy(), traj.attn_parent[:, 2])


_THREADS_SCRIPT = """
import hashlib, numpy as np, popgrad as pg
task = pg.Task(pg.chain(6), pg.dirichlet_prior(S=3, alpha=0.5, n_atoms=4, seed=0))
traj = pg.train_catformer(task, pg.CatFormer(3, 6), 4, gradient="sampled", batch_size=256, sample_seed=1,
                          record_every=1)
h = hashlib.sha256()
for a in (*traj.final.A, traj.final.W, traj.loss, traj.loss_se):
    h.update(np.ascontiguousarray(a).tobytes())
print(h.hexdigest())
"""


def test_sampled_training_is_independent_of_the_thread_count():
    import os
    import subprocess
    import sys

    out = []
    for n in ("1", "3"):
        env = {**os.environ, "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n,
               "NUMBA_NUM_THREADS": n}
        r = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT], env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr
        out.append(r.stdout.strip())
    assert out[0] == out[1] and len(out[0]) == 64
