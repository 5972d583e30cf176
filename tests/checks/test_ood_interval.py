"""The sampled OOD quantile's confidence interval (``popgrad.engine.sampled.quantile_interval``), pinned.

Against an independent reference: the exact distribution-free interval from the binomial law of the number
``B`` of sample points below the true quantile, its probabilities summed here term by term (``math.lgamma``,
no scipy): ``x_(l) ≤ ξ_q ≤ x_(u)`` iff ``l ≤ B ≤ u - 1``. And by a seeded Monte-Carlo coverage count whose
tolerance is five binomial standard errors around the exact coverage (deterministic: the seed fixes it;
a wrong width of one order statistic at these sizes moves the count by more).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from popgrad.checks.ood import ood_verdict
from popgrad.engine.sampled import quantile_interval


def _pmf(n, q):
    """``P(B = k)``, ``B ~ Binomial(n, q)``, ``k = 0 … n`` (log-gamma, term by term)."""
    lq, lp = math.log(q), math.log1p(-q)
    return np.array([math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lq
                              + (n - k) * lp) for k in range(n + 1)])


def _reference(n, q, level):
    """``(l, u, coverage)``: 1-based order statistics of the exact equal-tailed interval (``l = 0``: no lower
    end, ``u = n + 1``: no upper end) and its exact coverage ``P(l <= B <= u - 1)``."""
    pmf = _pmf(n, q)
    cdf = np.cumsum(pmf)
    tail = (1 - level) / 2
    # l: the largest with P(B < l) = cdf[l - 1] <= tail; u: the smallest with P(B >= u) = 1 - cdf[u - 1] <= tail
    l = max([0] + [j for j in range(1, n + 1) if cdf[j - 1] <= tail])
    u = min([n + 1] + [j for j in range(1, n + 1) if 1.0 - cdf[j - 1] <= tail])
    cover = float(pmf[max(l, 0):u].sum())
    return l, u, cover


CASES = [(n, q, level) for n in (20, 50, 100, 200, 500, 1000, 3000) for q in (0.5, 0.9, 0.99)
         for level in (0.9, 0.95)]


@pytest.mark.parametrize("n,q,level", CASES)
def test_order_statistics_are_the_exact_binomial_interval(n, q, level):
    x = np.arange(1.0, n + 1.0)  # x_(j) = j: the returned ends are the order statistics' indices
    got = quantile_interval(np.random.default_rng(n).permutation(x), q, level)
    l, u, cover = _reference(n, q, level)
    assert got["ci_low"] == (l if l >= 1 else -math.inf), (got, l)
    assert got["ci_high"] == (u if u <= n else math.inf), (got, u)
    assert cover >= level - 1e-12  # exact coverage at every n, however small
    assert got["value"] == math.ceil(n * q) and got["n"] == n and got["level"] == level


def test_half_width_at_large_n_is_the_normal_one():
    """At n = 100,000 the exact interval's half width is z·sqrt(nq(1-q)) order statistics (within 2)."""
    n, q = 100_000, 0.99
    got = quantile_interval(np.arange(1.0, n + 1.0), q)
    half = (got["ci_high"] - got["ci_low"]) / 2
    assert abs(half - 1.959964 * math.sqrt(n * q * (1 - q))) <= 2.0, half


def test_too_small_a_sample_has_no_upper_end_and_decides_nothing():
    """n = 100, q = 0.99: P(B = 100) = 0.37, so no order statistic bounds ξ from above at 95 %."""
    got = quantile_interval(np.linspace(0.0, 1.0, 100), 0.99)
    assert got["ci_high"] == math.inf and math.isfinite(got["ci_low"])
    res = ood_verdict("ood_generalization", "s", [8], [4.0], [got["value"]], 0.0, 10.0, {"quantile": 0.99},
                      kind="sampled", interval=(got["ci_low"], got["ci_high"]))
    assert res.status == "inconclusive" and "not resolved" in res.reason, res


@pytest.mark.parametrize("n,q", [(100, 0.9), (200, 0.99), (1000, 0.99), (2000, 0.9)])
def test_monte_carlo_coverage_is_the_exact_one(n, q):
    """2000 seeded samples of Exp(1) (true quantile -ln(1-q)): the covering count is Binomial(R, p) with p
    the exact coverage; deterministic (seeded), tolerance 5 standard errors (would flake once in 3e6 seeds)."""
    R, level = 2000, 0.95
    truth = -math.log1p(-q)
    rng = np.random.default_rng(20260 + n)
    draws = rng.exponential(size=(R, n))
    hits = 0
    for row in draws:
        got = quantile_interval(row, q, level)
        hits += got["ci_low"] <= truth <= got["ci_high"]
    _, _, p = _reference(n, q, level)
    se = math.sqrt(p * (1 - p) / R)
    assert abs(hits / R - p) <= 5 * se + 1e-12, (hits / R, p, se)
    assert hits / R >= level - 5 * math.sqrt(level * (1 - level) / R)
