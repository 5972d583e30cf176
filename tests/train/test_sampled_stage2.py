"""Stage 2 by sample-average approximation (SAA) against exact Stage 2, and the calibration of its errors."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.engine.sampled import SampledObjective, estimate, quantile_interval
from popgrad.engine.symmetry import symmetrize_dA2
from popgrad.task.sampling import sample_relabeled


@pytest.fixture(scope="module")
def small_task():
    return pg.Task(pg.chain(6), pg.dirichlet_prior(3, 1.0, 3, seed=2))


@pytest.fixture(scope="module")
def exact_run(small_task):
    return pg.train_two_stage(small_task, beta0=1e-3, lr1=2.0, steps1=80, lr2=2.0, steps2=60, record_every=20)


def test_saa_stage2_lands_within_standard_errors_of_exact_stage2(small_task, exact_run):
    kw = dict(beta0=1e-3, lr1=2.0, steps1=80, lr2=2.0, steps2=60, record_every=20)
    saa = pg.train_two_stage(small_task, **kw, stage2="sampled", samples=200_000, sample_seed=3)
    assert saa.stage2_samples == 200_000 and saa.config.stage2 == "sampled"
    np.testing.assert_array_equal(saa.A1[saa.stage1_end], exact_run.A1[exact_run.stage1_end])  # Stage 1 unchanged
    kinds = saa.loss_kind
    assert set(kinds[saa.stage == 1][:-1]) == {"exact"} and set(kinds[saa.stage == 2]) == {"sampled"}
    se = saa.loss_se[-1]
    assert 0 < se < 2e-3
    # the exact population loss at the SAA parameters is within a few standard errors of exact Stage 2's
    L_saa = pg.exact_loss(small_task, saa.final_A1, saa.final_A2)
    L_exact = exact_run.loss[-1]
    assert abs(L_saa - L_exact) <= 3 * se, (L_saa, L_exact, se)
    # the sampled loss estimates the exact one within a few standard errors
    assert abs(saa.loss[-1] - L_saa) <= 4 * se
    rel = np.abs(saa.final_A2 - exact_run.final_A2).max() / np.abs(exact_run.final_A2).max()
    assert rel <= 0.05, rel


def test_sampled_loss_standard_errors_are_calibrated(small_task, exact_run):
    """Over 40 seeds, (L_hat - L) / SE at fixed parameters has mean ~ 0 and spread ~ 1."""
    A1, A2 = exact_run.final_A1, exact_run.final_A2
    L = pg.exact_loss(small_task, A1, A2)
    z = []
    for seed in range(40):
        est = SampledObjective(small_task, 3000, seed).loss(A1, A2)
        z.append((est.value - L) / est.se)
    z = np.asarray(z)
    assert abs(z.mean()) <= 0.5, z.mean()
    assert 0.65 <= z.std(ddof=1) <= 1.4, z.std(ddof=1)
    assert np.mean(np.abs(z) <= 1.96) >= 0.85


def test_sampled_gradient_is_unbiased_and_projected(small_task, exact_run):
    A1, A2 = exact_run.A1[exact_run.stage1_end], 0.5 * np.eye(3)
    exact = pg.exact_loss_and_grad(small_task, A1, A2)
    obj = SampledObjective(small_task, 200_000, 0)
    assert obj.project  # the prior is relabeling-closed
    res = obj.loss_and_grad(A1, A2)
    np.testing.assert_array_equal(res.dA2, symmetrize_dA2(res.dA2))  # exactly in span{I, 11^T}
    assert np.abs(res.dA2 - exact.dA2).max() <= 0.05 * np.abs(exact.dA2).max()
    # the kernel's loss is the mean of the per-sequence losses
    np.testing.assert_allclose(res.loss, obj.per_sequence_losses(A1, A2).mean(), rtol=1e-12)


def test_implicit_closure_sampler_matches_exact_weights():
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(3, 1.0, 2, seed=0))
    n = 300_000
    smp = sample_relabeled(task, n, np.random.default_rng(1))
    np.testing.assert_array_equal(smp.targets, task.prior.atoms[smp.atoms, smp.seqs[:, -1]])
    idx = smp.seqs @ 3 ** np.arange(3, -1, -1)
    seqs, w = next(task.enumerate())
    joint = np.zeros_like(w)
    np.add.at(joint, idx, smp.targets / n)
    z = (joint - w) / np.sqrt(w / n)
    assert np.abs(z).max() < 5.0


def test_quantile_interval_covers():
    rng = np.random.default_rng(0)
    cover = 0
    for _ in range(200):
        q = quantile_interval(rng.exponential(size=2000), 0.9)
        truth = np.log(10.0)
        cover += q["ci_low"] <= truth <= q["ci_high"]
    assert 0.88 <= cover / 200 <= 0.995


def test_estimate():
    e = estimate([1.0, 2.0, 3.0])
    assert e.value == 2.0 and e.n == 3 and e.kind == "sampled" and abs(e.se - 1 / np.sqrt(3)) < 1e-15


def test_per_sequence_losses_kernel_matches_numpy_reference(small_task, exact_run):
    obj = SampledObjective(small_task, 5000, 7)
    for A2 in (0.3 * np.eye(3), exact_run.final_A2, np.random.default_rng(0).normal(size=(3, 3))):
        A1 = exact_run.final_A1
        np.testing.assert_allclose(obj.per_sequence_losses(A1, A2), obj.per_sequence_losses_numpy(A1, A2),
                                   rtol=1e-12, atol=1e-14)
    full = obj.loss_and_grad(exact_run.final_A1, exact_run.final_A2)
    a2only = obj.loss_and_grad(exact_run.final_A1, exact_run.final_A2, want_dA1=False)
    assert a2only.dA1 is None and a2only.loss == full.loss
    np.testing.assert_array_equal(a2only.dA2, full.dA2)
