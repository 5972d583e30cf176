"""One trainer for every model (``popgrad.train_model``, DESIGN §26): Algorithm 1 as a schedule over the parameter
names is ``train_two_stage`` bit for bit, one stage over every name is ``train_catformer`` bit for bit (exact and
sampled), the field and idealized sources, checkpoint and resume across stages, and bad settings in one line."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.train.model_trainer import Stage, algorithm1_stages


def _task(T=5, S=3):
    return pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=3, seed=0))


def test_algorithm1_is_train_two_stage_bit_for_bit():
    task, m = _task(), pg.ReducedModel(3, 5)
    new = pg.train_model(task, m, 12, init=m.start(0.5), stages=algorithm1_stages(task, 6, 6, 1.0, 1.0, 0.5),
                         optimizer="gd", record_every=1)
    old = pg.train_two_stage(task, config=pg.TrainConfig(beta0=0.5, lr1=1.0, steps1=6, lr2=1.0, steps2=6,
                                                         record_every=1))
    assert new.status == old.status == "completed"
    assert np.array_equal(new.loss, old.loss) and np.array_equal(new.stage + 1, old.stage)
    assert np.array_equal(new.params["A1"], old.A1) and np.array_equal(new.params["A2"], old.A2)


@pytest.mark.parametrize("gradient", ["field", "idealized"])
def test_field_and_idealized_stage1_are_train_two_stage(gradient):
    task, m = _task(), pg.ReducedModel(3, 5)
    new = pg.train_model(task, m, 8, init=m.start(1e-3), stages=algorithm1_stages(task, 4, 4, 2.0, 2.0, 1e-3),
                         optimizer="gd", gradient=gradient, record_every=1)
    old = pg.train_two_stage(task, gradient=gradient, beta0=1e-3, lr1=2.0, steps1=4, lr2=2.0, steps2=4,
                             record_every=1)
    assert np.array_equal(new.params["A1"], old.A1) and np.array_equal(new.params["A2"], old.A2)
    with pytest.raises(ValueError, match="reduced single-parent model's Stage 1"):
        pg.train_model(task, pg.CatFormer(3, 5), 2, gradient=gradient)
    with pytest.raises(ValueError, match="start from model.start"):
        pg.train_model(task, m, 8, stages=algorithm1_stages(task, 4, 4, 2.0, 2.0, 1e-3), gradient=gradient)


@pytest.mark.parametrize("kw", [dict(optimizer="sgd", lr=2.0, lr_schedule="cosine"),
                                dict(optimizer="adamw", lr=0.05, lr_schedule="cosine", weight_decay=1e-2)])
def test_one_stage_is_train_catformer_bit_for_bit(kw):
    task, model = _task(4, 2), pg.CatFormer(2, 4)
    old = pg.train_catformer(task, model, 6, init=("normal", 0.1, 2), record_every=1, **kw)
    new = pg.train_model(task, model, 6, init=model.init(0.1, 2), record_every=1, **kw)
    assert np.array_equal(new.loss, old.loss) and np.array_equal(new.lr, old.lr)
    assert np.array_equal(new.params["A_1"], old.A[0]) and np.array_equal(new.params["W"], old.W)


def test_sampled_is_train_catformer_sampled():
    task, model = _task(4, 2), pg.CatFormer(2, 4)
    kw = dict(optimizer="adam", lr=0.05, lr_schedule="constant", gradient="sampled", batch_size=64, sample_seed=3,
              record_every=2)
    old = pg.train_catformer(task, model, 6, **kw)
    new = pg.train_model(task, model, 6, init="zero", **kw)
    assert np.array_equal(new.params["W"], old.W) and np.array_equal(new.params["A_2"], old.A[1])
    np.testing.assert_allclose(new.loss, old.loss, rtol=1e-12)
    np.testing.assert_allclose(new.loss_se, old.loss_se, rtol=1e-10, atol=1e-15)
    assert np.all(new.loss_se[1:] > 0)


def test_stages_with_adam_resume_bit_for_bit(tmp_path, monkeypatch):
    from popgrad.train import model_trainer

    task, m = _task(4, 2), pg.ReducedModel(2, 4)
    kw = dict(init=m.start(1.0), stages=(Stage(("A1",), 5, 0.5), Stage(("A2",), 5, 0.1)), optimizer="adam",
              record_every=1)
    whole = pg.train_model(task, m, 10, **kw)
    assert whole.stage.tolist() == [0] * 6 + [1] * 5
    assert np.array_equal(whole.params["A2"][5], whole.params["A2"][0])  # Stage 1 leaves A2 alone
    assert np.array_equal(whole.params["A1"][-1], whole.params["A1"][5])  # Stage 2 leaves A1 alone
    real, calls = model_trainer._exact, []

    def interrupted(*a):
        calls.append(1)
        if len(calls) > 8:
            raise KeyboardInterrupt
        return real(*a)

    ck = tmp_path / "c.npz"
    monkeypatch.setattr(model_trainer, "_exact", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pg.train_model(task, m, 10, **kw, checkpoint_path=ck, checkpoint_every=7)
    monkeypatch.setattr(model_trainer, "_exact", real)
    resumed = pg.train_model(task, m, 10, **kw, checkpoint_path=ck, resume=True)
    assert np.array_equal(resumed.loss, whole.loss) and np.array_equal(resumed.params["A2"], whole.params["A2"])


def test_bad_settings_one_line():
    task, m = _task(4, 2), pg.ReducedModel(2, 4)
    cases = [
        (dict(stages=(Stage(("A1",), 3),)), ValueError, "the stages take 3 updates in all but steps = 4"),
        (dict(stages=(Stage(("B",), 4),)), ValueError, r"stages\[0\] names 'B', not a parameter of ReducedModel"),
        (dict(optimizer="nope"), ValueError, "optimizer must be one of"),
        (dict(gradient="magic"), ValueError, "gradient must be one of"),
        (dict(batch_size=3), ValueError, "batch_size is only used with gradient='sampled'"),
        (dict(lrr=1.0), TypeError, "unexpected keyword argument"),
        (dict(init={"A1": np.zeros((4, 4))}), ValueError, r"init lacks 'A2'"),
        (dict(init={"A1": np.zeros((4, 4)), "A2": np.full((2, 2), np.inf)}), ValueError, "is not finite"),
        (dict(config="x"), TypeError, "config must be a popgrad.ModelTrainConfig"),
    ]
    for kw, kind, match in cases:
        with pytest.raises(kind, match=match) as info:
            pg.train_model(task, m, 4, **kw)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="the model has S = 3"):
        pg.train_model(task, pg.ReducedModel(3, 4), 4)
    with pytest.raises(TypeError, match="must implement popgrad.Model"):
        pg.train_model(task, "model", 4)


def test_trajectory_saves_and_loads(tmp_path):
    task, m = _task(4, 2), pg.ReducedModel(2, 4)
    traj = pg.train_model(task, m, 6, init=m.start(1.0), stages=(Stage(("A1",), 3, 0.5), Stage(("A2",), 3)),
                          optimizer="adam", lr=0.1, record_every=2)
    traj.save(tmp_path / "t.npz")
    back = pg.ModelTrajectory.load(tmp_path / "t.npz")
    assert back.config == traj.config and back.status == traj.status and back.model == "ReducedModel(S=2, T=4)"
    assert np.array_equal(back.loss, traj.loss) and np.array_equal(back.params["A2"], traj.params["A2"])
    assert "ModelTrajectory(ReducedModel(S=2, T=4): " in str(traj)
    (tmp_path / "x.npz").write_bytes(b"nope")
    with pytest.raises(ValueError, match="is not a popgrad model trajectory file"):
        pg.ModelTrajectory.load(tmp_path / "x.npz")


def test_a_config_object_and_overrides():
    task, m = _task(4, 2), pg.ReducedModel(2, 4)
    cfg = pg.ModelTrainConfig(steps=3, optimizer="adam", lr=0.1, init_scale=0.2, record_every=1)
    a = pg.train_model(task, m, 3, config=cfg)
    b = pg.train_model(task, m, 3, optimizer="adam", lr=0.1, init_scale=0.2, record_every=1)
    assert a.config == b.config and np.array_equal(a.loss, b.loss)
    c = pg.train_model(task, m, 5, config=cfg, lr=0.05)
    assert c.config.steps == 5 and c.config.lr == 0.05 and len(c.step) == 6
    with pytest.raises(ValueError, match="lr: part of the optimizer object"):
        pg.train_model(task, m, 3, optimizer=pg.train.optim.adamw(0.1), lr=0.1)
