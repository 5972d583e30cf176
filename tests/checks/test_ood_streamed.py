"""The OOD check's in-distribution quantile over a closure-heavy finite prior, in memory for one chunk of atoms
(``popgrad.checks.ood.in_distribution_quantile``): the same quantile as the whole distribution, and a peak
that does not grow with the number of (atom, sequence) pairs."""
import tracemalloc

import numpy as np
import pytest

import popgrad as pg
from popgrad.checks import ood


@pytest.fixture(scope="module")
def case():
    S, T = 5, 4
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=2, seed=0))  # 240 atoms x 625
    rng = np.random.default_rng(0)
    return task, np.tril(rng.standard_normal((T, T))), 2 * np.eye(S) + 0.3 * rng.standard_normal((S, S))


@pytest.mark.parametrize("q", [0.0, 0.3, 0.9, 0.99, 1.0])
def test_streamed_quantile_is_the_whole_distribution_quantile(case, q, monkeypatch):
    task, A1, A2 = case
    e, p = ood.sup_error_distribution(task, A1, A2, task.prior.atoms, task.prior.weights)
    want = ood._weighted_quantile(e, p, q)
    monkeypatch.setattr(ood, "IN_DISTRIBUTION_PAIRS", 3000, raising=False)  # 4 atoms a chunk: 60 chunks; the
    # candidates collected once a value range holds at most 3,000 of the 150,000 pairs (narrowing passes first)
    got, mean = ood.in_distribution_quantile(task, A1, A2, q)
    assert got == want
    assert mean == pytest.approx(float(e @ p / p.sum()), rel=1e-13)


def test_check_ood_peak_memory_does_not_grow_with_the_pairs(monkeypatch):
    """S = 6, T = 4 and one draw: 720 relabelled atoms x 1,296 sequences. Held at once the in-distribution
    errors need tens of MB (the 9 GB of S = 8); streamed in chunks of 2**14 pairs, a few MB."""
    S, T = 6, 4
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=1, seed=0))
    A1, A2 = np.zeros((T, T)), np.eye(S)
    monkeypatch.setattr(ood, "IN_DISTRIBUTION_PAIRS", 2**14, raising=False)
    ood.check_ood(task, A1, A2, hypotheses=None)  # warm (compiles, caches)
    tracemalloc.start()
    try:
        res = ood.check_ood(task, A1, A2, hypotheses=None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    pairs = task.prior.K * task.n_sequences
    assert peak < pairs * 8, (peak, pairs)  # less than one float per pair
    e, p = ood.sup_error_distribution(task, A1, A2, task.prior.atoms, task.prior.weights)
    assert res.details["in_distribution_quantile"] == ood._weighted_quantile(e, p, 0.99)
