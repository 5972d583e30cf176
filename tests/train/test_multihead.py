"""The k-head trainer ``train_multi_head`` (popgrad.train.multihead, issue 7): hand-stepped reference, resume."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.engine import reference


def small_task(graph=None, S=2, n_atoms=2, seed=0, symmetrize=True):
    graph = pg.two_parent(6) if graph is None else graph
    return pg.MultiParentTask(graph, pg.dirichlet_tensor_prior(S, graph.k, 1.0, n_atoms, seed, symmetrize=symmetrize))


TINY = dict(beta0=0.5, lr1=1.0, steps1=3, lr2=1.0, steps2=2, record_every=1, init_seed=3, init_scale=0.2)


@pytest.fixture(scope="module")
def tiny_task():
    return small_task(pg.two_parent(4), S=2, n_atoms=1)


@pytest.mark.parametrize("schedule", ["two-stage", "joint"])
def test_training_matches_hand_stepped_numpy_reference(tiny_task, schedule):
    task = tiny_task
    traj = pg.train_multi_head(task, schedule=schedule, **TINY)
    S, T = task.S, task.T
    A1 = TINY["init_scale"] * np.random.default_rng(TINY["init_seed"]).standard_normal((2, T, T))
    A1 = np.where(np.tri(T, dtype=bool), A1, 0.0)
    A2 = np.stack([TINY["beta0"] * np.eye(S)] * 2)
    eta1 = TINY["lr1"] * S * T * (1.0 if schedule == "joint" else 1.0 / TINY["beta0"])
    eta2 = TINY["lr2"] * S
    losses, A1s, A2s = [], [], []
    for t in range(TINY["steps1"] + TINY["steps2"] + 1):
        loss, dA1, dA2 = reference.exact_loss_and_grad_numpy(task, A1, A2)
        losses.append(loss)
        A1s.append(A1.copy())
        A2s.append(A2.copy())
        if schedule == "joint":
            A1, A2 = A1 - eta1 * dA1, A2 - eta2 * dA2
        elif t < TINY["steps1"]:
            A1 = A1 - eta1 * dA1
        else:
            A2 = A2 - eta2 * dA2
    np.testing.assert_allclose(traj.loss, losses, rtol=1e-11)
    np.testing.assert_allclose(traj.A1, np.array(A1s), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(traj.A2, np.array(A2s), rtol=1e-9, atol=1e-12)
    assert traj.attn_parent.shape == (6, 2, T) and np.all(np.isnan(traj.cosine))
    assert np.isnan(traj.attn_parent[0, 0, 0]) and np.isfinite(traj.attn_parent[0, 0, T - 1])
    assert isinstance(traj.config, pg.MultiHeadTrainConfig) and traj.status == "completed"


def test_identical_heads_stay_identical_and_the_seed_breaks_the_symmetry(tiny_task):
    same = pg.train_multi_head(tiny_task, **dict(TINY, init_scale=0.0, steps1=5))
    np.testing.assert_array_equal(same.A1[:, 0], same.A1[:, 1])
    np.testing.assert_array_equal(same.A2[:, 0], same.A2[:, 1])
    broken = pg.train_multi_head(tiny_task, **TINY)
    assert not np.array_equal(broken.final_A1[0], broken.final_A1[1])
    again = pg.train_multi_head(tiny_task, **TINY)
    np.testing.assert_array_equal(again.A1, broken.A1)


def test_trajectory_round_trip_and_resume(tiny_task, tmp_path):
    kwargs = dict(TINY, steps1=6, steps2=4, record_every=2)
    full = pg.train_multi_head(tiny_task, **kwargs)
    full.save(tmp_path / "t.npz")
    back = pg.Trajectory.load(tmp_path / "t.npz")
    assert back.config == full.config and isinstance(back.config, pg.MultiHeadTrainConfig)
    for name, a in full.arrays().items():
        np.testing.assert_array_equal(getattr(back, name), a)
    ckpt = tmp_path / "ck.npz"
    pg.train_multi_head(tiny_task, **dict(kwargs, steps2=1), checkpoint_path=ckpt)  # a shorter run...
    with pytest.raises(ValueError, match="different task or configuration"):
        pg.train_multi_head(tiny_task, **kwargs, checkpoint_path=ckpt, resume=True)
    part = pg.train_multi_head(tiny_task, **kwargs, checkpoint_path=ckpt, checkpoint_every=3)
    resumed = pg.train_multi_head(tiny_task, **kwargs, checkpoint_path=ckpt, resume=True)
    for name, a in part.arrays().items():
        np.testing.assert_array_equal(getattr(resumed, name), a)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(init_scale=-1.0), "init_scale must be a finite number >= 0"),
        (dict(init_seed=-1), "init_seed must be an integer >= 0"),
        (dict(beta0=0.0), "beta0 must be a positive"),
        (dict(schedule="adam"), "schedule must be one of"),
        (dict(resume=True), "checkpoint_path"),
    ],
)
def test_bad_training_arguments(tiny_task, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pg.train_multi_head(tiny_task, **kwargs)
    with pytest.raises(ValueError, match="MultiParentTask"):
        pg.train_multi_head(pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 1, 0)))


