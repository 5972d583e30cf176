"""Minibatch SGD in train_two_stage (issue 22): fresh seeded batches, the population run's step sizes,
and a large batch tracks the exact run within the linear-response spread of checks.sgd_spread."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.checks.sample_complexity import sgd_spread
from popgrad.engine.single import rows_loss_and_grad

PAIR = pg.FinitePrior([[[.8, .2], [.2, .8]], [[.2, .8], [.8, .2]]])
KW = dict(beta0=1e-3, lr1=2.0, steps1=15, lr2=2.0, steps2=15)


@pytest.fixture(scope="module")
def task():
    return pg.Task(pg.chain(5), PAIR)


def test_first_steps_are_fresh_seeded_batches_with_the_population_step_sizes(task):
    B, seed = 64, 3
    traj = pg.train_two_stage(task, gradient="sgd", batch_size=B, sample_seed=seed, record_every=1,
                              beta0=1e-3, lr1=2.0, steps1=2, lr2=2.0, steps2=1)
    cfg = traj.config
    A1, A2 = np.zeros((5, 5)), 1e-3 * np.eye(2)
    for t in range(2):  # Stage 1: A1 moves on the batch of step t
        b = task.sample(B, np.random.SeedSequence([seed, t]))
        A1 = A1 - cfg.eta1(task) * rows_loss_and_grad(b.seqs, b.targets / B, A1, A2, task.default_eps).dA1
        assert np.array_equal(traj.A1[t + 1], A1)
    b = task.sample(B, np.random.SeedSequence([seed, 2]))  # Stage 2 starts at step steps1
    A2 = A2 - cfg.eta2(task) * rows_loss_and_grad(b.seqs, b.targets / B, A1, A2, task.default_eps).dA2
    assert np.array_equal(traj.A2[3], A2)
    # the recorded loss is the exact population loss at the SGD parameters
    assert traj.loss[3] == pg.exact_loss(task, traj.A1[3], traj.A2[3])


def test_deterministic_per_seed(task):
    a = pg.train_two_stage(task, gradient="sgd", batch_size=32, sample_seed=1, **KW)
    b = pg.train_two_stage(task, gradient="sgd", batch_size=32, sample_seed=1, **KW)
    c = pg.train_two_stage(task, gradient="sgd", batch_size=32, sample_seed=2, **KW)
    assert np.array_equal(a.A1, b.A1) and np.array_equal(a.A2, b.A2)
    assert not np.array_equal(a.A1, c.A1)


def test_large_batch_tracks_the_exact_run_within_the_predicted_spread(task):
    gd = pg.train_two_stage(task, record_every=1, **KW)
    B = 20_000
    spread = sgd_spread(task, gd, B)
    sg = pg.train_two_stage(task, gradient="sgd", batch_size=B, sample_seed=0, record_every=1, **KW)
    d1 = np.linalg.norm(sg.A1 - gd.A1, axis=(1, 2))
    d2 = np.linalg.norm(sg.A2 - gd.A2, axis=(1, 2))
    assert np.all(d1[1:] <= 4 * spread.rms_A1[1:])
    assert np.all(d2[16:] <= 4 * spread.rms_A2[16:])
    # not vacuous: the predicted spread is the right size (a wrong covariance scale fails here)
    end1 = gd.stage1_end
    assert 0.3 * spread.rms_A1[end1] <= d1[end1]
    assert spread.rms_A1[end1] < 0.05 and np.all(np.abs(sg.loss - gd.loss) <= 4 * spread.loss_sd + 1e-12)
    # the random walk ignores the contraction of Stage 1 and predicts more
    assert spread.rms_A1_random_walk[end1] >= spread.rms_A1[end1]


def test_sgd_arguments(task):
    with pytest.raises(ValueError, match="batch_size >= 1"):
        pg.train_two_stage(task, gradient="sgd", **KW)
    with pytest.raises(ValueError, match="only used with gradient='sgd'"):
        pg.train_two_stage(task, batch_size=10, **KW)
    with pytest.raises(ValueError, match="stage2"):
        pg.train_two_stage(task, gradient="sgd", batch_size=10, stage2="sampled", **KW)
    with pytest.raises(ValueError, match="record_every=1"):
        sgd_spread(task, pg.train_two_stage(task, record_every=5, **KW), 100)


def test_joint_sgd_moves_both_layers(task):
    traj = pg.train_two_stage(task, gradient="sgd", batch_size=128, schedule="joint", sample_seed=0, steps1=5,
                              steps2=5, record_every=1)
    assert np.any(traj.A1[-1] != 0) and not np.allclose(traj.A2[-1], traj.A2[0])
    assert np.all(np.isfinite(traj.loss))
