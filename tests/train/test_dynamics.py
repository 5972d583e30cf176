"""Algorithm 1: hand-stepped reference, checkpoint/resume, divergence, modes."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.engine.reference import exact_loss_and_grad_numpy
from popgrad.train import algorithm1 as dynamics

TINY = dict(beta0=1e-2, lr1=1.0, steps1=4, lr2=1.0, steps2=3, record_every=1)


@pytest.fixture(scope="module")
def tiny_task():
    return pg.Task(pg.CausalGraph([-1, 0, 1, -1]), pg.dirichlet_prior(2, 1.0, 2, seed=4))


def test_matches_hand_stepped_numpy_reference(tiny_task):
    task = tiny_task
    traj = pg.train_two_stage(task, **TINY)
    S, T = task.S, task.T
    eta1 = TINY["lr1"] * S * T / TINY["beta0"]
    eta2 = TINY["lr2"] * S
    A1, A2 = np.zeros((T, T)), TINY["beta0"] * np.eye(S)
    losses, A1s, A2s = [], [], []
    for t in range(TINY["steps1"] + TINY["steps2"] + 1):
        loss, dA1, dA2 = exact_loss_and_grad_numpy(task, A1, A2)
        losses.append(loss)
        A1s.append(A1.copy())
        A2s.append(A2.copy())
        if t < TINY["steps1"]:
            A1 = A1 - eta1 * dA1
        elif t < TINY["steps1"] + TINY["steps2"]:
            A2 = A2 - eta2 * dA2
    np.testing.assert_array_equal(traj.step, np.arange(8))
    np.testing.assert_array_equal(traj.stage, [1, 1, 1, 1, 1, 2, 2, 2])
    np.testing.assert_allclose(traj.loss, losses, rtol=1e-11)
    np.testing.assert_allclose(traj.A1, np.array(A1s), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(traj.A2, np.array(A2s), rtol=1e-9, atol=1e-12)
    assert traj.status == "completed"
    # Stage 1 leaves A2 alone, Stage 2 leaves A1 alone
    assert np.all(traj.A2[:5] == traj.A2[0])
    assert np.all(traj.A1[4:] == traj.A1[4])


def test_records_and_stage_end(tiny_task):
    traj = pg.train_two_stage(tiny_task, beta0=1e-2, steps1=7, steps2=5, record_every=3)
    assert traj.step.tolist() == [0, 3, 6, 7, 8, 9, 12]
    assert traj.stage1_end == 3
    assert np.all(np.isfinite(traj.cosine[traj.stage == 1]))
    assert np.all(np.isnan(traj.cosine[traj.stage == 2]))
    assert np.isnan(traj.attn_parent[0, 0]) and traj.attn_parent[0, 1] == pytest.approx(0.5)


def test_checkpoint_resume_is_bit_identical(tiny_task, tmp_path, monkeypatch):
    kwargs = dict(TINY, steps1=9, steps2=8, record_every=2)
    full = pg.train_two_stage(tiny_task, **kwargs)
    ckpt = tmp_path / "ck.npz"
    real = dynamics.exact_loss_and_grad
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 13:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(dynamics, "exact_loss_and_grad", flaky)
    with pytest.raises(KeyboardInterrupt):
        pg.train_two_stage(tiny_task, **kwargs, checkpoint_path=ckpt, checkpoint_every=5)
    monkeypatch.setattr(dynamics, "exact_loss_and_grad", real)
    assert ckpt.exists()
    resumed = pg.train_two_stage(tiny_task, **kwargs, checkpoint_path=ckpt, checkpoint_every=5, resume=True)
    for name, a in full.arrays().items():
        np.testing.assert_array_equal(getattr(resumed, name), a, err_msg=name)
    with pytest.raises(ValueError, match="different task or configuration"):
        pg.train_two_stage(tiny_task, **dict(kwargs, lr1=3.0), checkpoint_path=ckpt, resume=True)


def test_trajectory_save_load_round_trip(tiny_task, tmp_path):
    traj = pg.train_two_stage(tiny_task, **TINY)
    traj.save(tmp_path / "t.npz")
    back = pg.Trajectory.load(tmp_path / "t.npz")
    for name, a in traj.arrays().items():
        np.testing.assert_array_equal(getattr(back, name), a)
    assert back.config == traj.config and back.status == traj.status


def test_loss_above_its_start_stops_the_run(tiny_task, monkeypatch):
    """Gradient *ascent* (a sign error, say) raises the loss above its start at every step."""
    real = dynamics.exact_loss_and_grad

    def ascent(*a, **k):
        r = real(*a, **k)
        return r._replace(dA1=-r.dA1, dA2=-r.dA2)

    monkeypatch.setattr(dynamics, "exact_loss_and_grad", ascent)
    traj = pg.train_two_stage(tiny_task, beta0=1e-2, lr1=0.1, steps1=40, steps2=0,
                              record_every=1, divergence_patience=5)
    assert traj.status == "diverged"
    assert "stayed above its value at the start of the stage" in traj.message and "for 5 steps" in traj.message
    assert traj.step[-1] == 5 and len(traj.step) == 6  # everything up to the stop is kept
    assert np.all(np.diff(traj.loss) > 0)


def test_non_finite_loss_stops_the_run(tiny_task, monkeypatch):
    real = dynamics.exact_loss_and_grad
    calls = {"n": 0}

    def poisoned(*a, **k):
        calls["n"] += 1
        r = real(*a, **k)
        return r._replace(loss=float("nan")) if calls["n"] == 4 else r

    monkeypatch.setattr(dynamics, "exact_loss_and_grad", poisoned)
    traj = pg.train_two_stage(tiny_task, beta0=1e-2, steps1=10, steps2=0, record_every=1)
    assert traj.status == "diverged" and "non-finite" in traj.message
    assert traj.step[-1] == 3 and np.isnan(traj.loss[-1]) and np.all(np.isfinite(traj.loss[:-1]))


def test_idealized_stage1_runs_beyond_enumeration():
    task = pg.Task(pg.chain(200), pg.dirichlet_prior(3, 1.0, 2, seed=0))
    traj = pg.train_two_stage(task, gradient="idealized", steps1=20, steps2=0, record_every=10)
    assert traj.status == "completed"
    assert np.all(np.isnan(traj.loss))
    nr = task.graph.non_roots
    assert np.all(traj.attn_parent[-1, nr] > traj.attn_parent[0, nr])  # every row moved toward its parent
    with pytest.raises(pg.TaskTooLargeError):
        pg.train_two_stage(task, gradient="idealized", steps1=2, steps2=1)


def test_idealized_and_exact_stage1_agree_in_direction(tiny_task):
    a = pg.train_two_stage(tiny_task, gradient="exact", beta0=1e-4, steps1=5, steps2=0)
    b = pg.train_two_stage(tiny_task, gradient="idealized", beta0=1e-4, steps1=5, steps2=0)
    assert np.all(np.isfinite(b.loss))
    nr = tiny_task.graph.non_roots
    assert np.all(np.sign(a.final_A1[nr, tiny_task.graph.parents[nr]]) == np.sign(b.final_A1[nr, tiny_task.graph.parents[nr]]))


def test_idealized_stage1_then_exact_stage2(tiny_task):
    a = pg.train_two_stage(tiny_task, gradient="idealized", beta0=1e-3, steps1=4, steps2=3, record_every=1)
    assert a.status == "completed" and np.all(np.isfinite(a.loss)) and np.all(np.isfinite(a.grad_norm))
    # Stage 2 is the same exact descent from the same A1, whichever gradient drove Stage 1
    b = pg.train_two_stage(tiny_task, gradient="exact", beta0=1e-3, steps1=4, steps2=3, record_every=1)
    assert np.all(a.A2[:5] == b.A2[:5])


def test_joint_schedule_moves_both(tiny_task):
    traj = pg.train_two_stage(tiny_task, schedule="joint", beta0=1e-2, lr1=1e-3, steps1=3, lr2=1.0, steps2=2)
    assert set(traj.stage.tolist()) == {0}
    assert not np.array_equal(traj.final_A1, traj.A1[0])
    assert not np.array_equal(traj.final_A2, traj.A2[0])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(beta0=0.0), "beta0 must be a positive"),
        (dict(lr1=-1.0), "lr1 must be"),
        (dict(steps1=-1), "steps1 must be"),
        (dict(steps2=1.5), "steps2 must be"),
        (dict(gradient="sampled"), "gradient must be one of"),
        (dict(schedule="joint", gradient="idealized"), "joint"),
        (dict(record_every=0), "record_every"),
        (dict(resume=True), "checkpoint_path"),
    ],
)
def test_bad_arguments(tiny_task, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pg.train_two_stage(tiny_task, **kwargs)
