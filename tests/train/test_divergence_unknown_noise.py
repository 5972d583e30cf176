"""A sampled loss without a standard error (a batch of one sequence) is never "diverged" by its noise."""
import math

import numpy as np

import popgrad as pg
from popgrad.train.loop import DivergenceTracker


def _feed(losses, ses, sampled, patience=5):
    tr = DivergenceTracker()
    for t, (loss, se) in enumerate(zip(losses, ses)):
        why = tr.observe(t, loss, se, patience, "lower lr", sampled=sampled)
        if why:
            return t, why
    return None, tr.end_stage(len(losses) - 1, "lower lr")


def test_a_sampled_loss_without_se_is_never_above():
    rng = np.random.default_rng(1)
    losses = list(0.69 + 0.05 * rng.standard_normal(400))
    losses[0] = 0.5  # an unlucky low start: every later estimate is above it
    stop, why = _feed(losses, [math.nan] * len(losses), sampled=True)
    assert stop is None and why == ""
    # the same numbers read as exact losses are a divergence (the rule itself is unchanged)
    stop, why = _feed(losses, [math.nan] * len(losses), sampled=False)
    assert stop is not None and "stayed above" in why
    # with a finite SE the 4-SE rule still stops a real rise
    stop, why = _feed([0.5] + [0.9] * 10, [0.01] * 11, sampled=True)
    assert stop == 5


def test_two_losses_printed_as_above_differ_on_the_page():
    stop, why = _feed([0.6931471805, 0.6931471805 + 1e-7], [math.nan] * 2, sampled=False, patience=100)
    assert "0.6931473 (step 1)" in why and "0.6931472 (step 0)" in why  # not "0.693147 ... above ... 0.693147"


def test_a_batch_of_one_at_a_tiny_step_completes():
    """The case of the report: batches of 1, lr 1e-9 (the parameters barely move): completed, not diverged."""
    task = pg.Task(pg.chain(3), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=3, seed=0))
    traj = pg.train_catformer(task, pg.CatFormer(2, 3), 60, gradient="sampled", batch_size=1, lr=1e-9,
                              init=("normal", 10.0, 14), record_every=1)
    assert traj.status == "completed", traj.message
    assert np.all(np.isnan(traj.loss_se))  # no SE is claimed for a batch of one
