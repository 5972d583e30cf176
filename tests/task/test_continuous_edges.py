"""The continuous prior at its edges (DESIGN §20): its weights are right at every α a flag accepts, or refused.

Uniform roots and the tensor prior have a closed form whose ``ln α`` parts cancel as integers
(``task.dirichlet._log_rising``); it is checked against the same rising factorials evaluated in
50-digit decimal arithmetic. Stationary roots: S = 2 by Gauss rules (split square, full square past
``S2_FULL_ALPHA``), S >= 3 by seeded Monte Carlo; below the smallest α with a method a one-line refusal.
"""
from __future__ import annotations

import decimal
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import popgrad as pg
from popgrad.app import cli
from popgrad.engine.baselines import bayes_loss
from popgrad.task import dirichlet as D

#: α from 1e-300 to 1e300, log-uniform (hypothesis, derandomized: the same examples every run).
ALPHA = st.floats(min_value=-300.0, max_value=300.0, allow_nan=False).map(lambda e: float(10.0**e))
FAST = settings(max_examples=30, deadline=None, derandomize=True, database=None)


def _decimal_weight(counts, n_roots, S, alpha):
    """``S^-n_roots Π_rows Π_b (α)_{n_b} / (Sα)_{N}`` in 50-digit decimals (``counts``: rows of label-edge counts)."""
    ctx = decimal.Context(prec=50, Emin=-10**8, Emax=10**8)
    a = decimal.Decimal(alpha)
    w = ctx.divide(decimal.Decimal(1), ctx.power(decimal.Decimal(S), n_roots))
    for row in counts:
        for x in row:
            for j in range(x):
                w = ctx.multiply(w, ctx.add(a, j))
        for j in range(sum(row)):
            w = ctx.divide(w, ctx.add(ctx.multiply(a, S), j))
    return w


def _reference(task, m, c):
    """Decimal weight of sequence ``m`` and label ``c`` of a single-parent uniform-roots task."""
    S, T = task.S, task.T
    s = next(itertools.islice(itertools.product(range(S), repeat=T), m, None))
    par = task.graph.parents
    counts, roots = {}, 1
    for i in range(T - 1):
        if par[i] < 0:
            roots += 1
        else:
            counts.setdefault(s[par[i]], [0] * S)[s[i]] += 1
    counts.setdefault(s[T - 1], [0] * S)[c] += 1
    return _decimal_weight(counts.values(), roots, S, task.prior.alpha)


@FAST
@given(S=st.integers(2, 5), alpha=ALPHA)
def test_uniform_roots_weights_over_every_alpha(S, alpha):
    task = pg.Task(pg.chain(3 if S > 3 else 4), pg.DirichletPrior(S, alpha, roots="uniform"))
    w = task.weight_table()
    assert task.weight_accuracy.exact
    assert abs(w.sum() - 1.0) <= 1e-12, w.sum()
    assert bayes_loss(task) <= math.log(S) + 1e-12
    rng = np.random.default_rng(0)
    for m in rng.choice(S**task.T, size=4, replace=False):
        for c in range(S):
            ref = _reference(task, int(m), c)
            if ref > decimal.Decimal("1e-290"):  # below: float64 underflow, not the formula
                assert abs(w[m, c] / float(ref) - 1.0) <= 1e-12, (m, c, w[m, c], ref)


@FAST
@given(S=st.integers(2, 4), alpha=ALPHA)
def test_tensor_prior_weights_over_every_alpha(S, alpha):
    task = pg.MultiParentTask(pg.two_parent(3), pg.DirichletTensorPrior(S, 2, alpha))
    w = task.weight_table()
    assert task.weight_accuracy.exact
    assert abs(w.sum() - 1.0) <= 1e-12, w.sum()
    assert bayes_loss(task) <= math.log(S) + 1e-12


@pytest.mark.parametrize("alpha", [1e6, 1e12, 1e20, 1e300])
def test_large_alpha_is_the_uniform_chain(alpha):
    """The issue's example: α → ∞ is the uniform chain, w = S^-(T+1) per (s, c) (it summed to 8.0 at 1e20)."""
    for S in (2, 3):
        w = pg.Task(pg.chain(5), pg.DirichletPrior(S, alpha, roots="uniform")).weight_table()
        np.testing.assert_allclose(w, S ** -6.0, rtol=1e-12 if alpha > 1e12 else 1e-5)


@FAST
@given(alpha=ALPHA)
def test_stationary_s2_weights_or_refusal(alpha):
    task = pg.Task(pg.chain(4), pg.DirichletPrior(2, alpha))
    if alpha < D.S2_MIN_ALPHA:
        with pytest.raises(ValueError, match=r"alpha = .* use alpha >= .*roots='uniform'"):
            task.weight_table()
        return
    w = task.weight_table()
    acc = task.weight_accuracy
    assert not acc.exact and acc.bound <= 1e-10, acc
    assert abs(w.sum() - 1.0) <= 1e-12, w.sum()
    assert bayes_loss(task) <= math.log(2) + 1e-12


@pytest.mark.parametrize("alpha", [10.0, 50.0, 1000.0, 1e20, 1e300])
def test_stationary_s2_large_alpha_against_monte_carlo(alpha):
    """The full-square rule against an independent seeded average over draws of π (z < 5), and α → ∞."""
    task = pg.Task(pg.chain(3), pg.DirichletPrior(2, alpha))
    w = task.weight_table()
    rng = np.random.default_rng(3)
    pi = task.prior.draw(20000, rng)
    p, q = pi[:, 0, 1], pi[:, 1, 0]
    mu = np.stack([q, p], axis=1) / (p + q)[:, None]
    for m, s in enumerate(itertools.product(range(2), repeat=3)):
        lik = 0.5 * mu[:, s[0]] * pi[:, s[0], s[1]]
        draws = lik[:, None] * pi[:, s[2], :]  # label c from the query's row
        mean, se = draws.mean(axis=0), draws.std(axis=0, ddof=1) / math.sqrt(len(draws))
        assert np.all(np.abs(mean - w[m]) <= 5 * se + 1e-14), (m, mean, w[m], se)
    if alpha >= 1e20:
        np.testing.assert_allclose(w, 2.0 ** -4, rtol=1e-13)


@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(S=st.integers(3, 5), alpha=ALPHA)
def test_stationary_monte_carlo_weights_or_refusal(S, alpha):
    task = pg.Task(pg.chain(3), pg.DirichletPrior(S, alpha))
    if alpha < D.MC_MIN_ALPHA:
        with pytest.raises(ValueError, match=r"alpha = .*underflow.*roots='uniform'"):
            task.weight_table()
        return
    w = task.weight_table()
    assert task.weight_accuracy.statistical and not task.weight_accuracy.exact
    assert abs(w.sum() - 1.0) <= 1e-12, w.sum()
    assert bayes_loss(task) <= math.log(S) + 1e-12


@pytest.mark.parametrize("S,alpha", [(2, 1e-12), (2, 1e-300), (3, 1e-3), (3, 1e-300), (5, 0.01)])
def test_draws_at_tiny_alpha_are_rows_of_a_point_mass(S, alpha):
    """Every gamma underflows: the row is a point mass at a uniform token (was a ZeroDivisionError)."""
    d = pg.DirichletPrior(S, alpha).draw(500, np.random.default_rng(1))
    assert np.all(np.abs(d.sum(axis=2) - 1.0) <= 1e-15)
    assert np.all(np.isfinite(d)) and d.min() >= 0


def test_draws_at_huge_alpha_are_uniform_rows():
    d = pg.DirichletPrior(3, 1.7e308).draw(10, np.random.default_rng(1))
    np.testing.assert_allclose(d, 1.0 / 3, rtol=1e-15)


def _run(tmp_path, capsys, *args):
    try:
        rc = cli.main(["run", "--prior", "continuous", "--T", "4", "--steps1", "2", "--steps2", "2", "--no-sweep",
                       "--no-progress", "--out", str(tmp_path / "o"), *args])
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr()


@pytest.mark.parametrize("S,alpha,works", [("2", "1e-12", ">= 0.001"), ("2", "1e-300", ">= 0.001"),
                                           ("3", "0.001", ">= 0.05"), ("4", "1e-30", ">= 0.05")])
def test_cli_refuses_alpha_without_a_method_in_one_line(tmp_path, capsys, S, alpha, works):
    rc, out = _run(tmp_path, capsys, "--S", S, "--alpha", alpha)
    err = out.err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"--alpha {float(alpha):g}" in err and f"use --alpha {works}" in err and "--roots uniform" in err, err
    assert not (tmp_path / "o").exists()


def test_cli_large_alpha_stationary_runs_with_its_bound(tmp_path, capsys):
    """S = 2, --alpha 1000 (an OverflowError traceback before): runs; the summary gives the rule and bound."""
    rc, out = _run(tmp_path, capsys, "--S", "2", "--alpha", "1000")
    assert rc in (0, 1), out.err
    assert "full-square Gauss-Beta" in out.out and "relative error bound" in out.out, out.out


def _log_beta(a, b):
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


@pytest.mark.parametrize("alpha", [D.S2_MIN_ALPHA, 1e-2, 0.1, 1.0, 5.0, 9.99])
@pytest.mark.parametrize("order", [D.S2_ORDER, 2 * D.S2_ORDER])
def test_jacobi_rules_integrate_their_polynomials(alpha, order):
    """The split square's rules (weights ``x^{pa-1} (1-x)^{pb-1}``, ``pa, pb`` in {α, 2α, 1}) are exact on
    polynomials of degree < 2·order: the moments ``E x^k = Π_{j<k} (pa + j)/(pa + pb + j)`` of Beta(pa, pb)
    (no lgamma). scipy's ``roots_jacobi`` was off by 6.5e-10 at α = 1e-3."""
    for pa, pb in ((alpha, 1.0), (1.0, alpha), (2 * alpha, 1.0), (alpha, alpha)):
        x, w, log_mass = D.gauss_beta01(order, pa, pb)
        assert abs(log_mass - _log_beta(pa, pb)) <= 1e-14 * max(1.0, abs(log_mass))
        for k in range(2 * order):
            exact = math.prod((pa + j) / (pa + pb + j) for j in range(k))
            assert abs(float(w @ x**k) / exact - 1) <= 1e-11, (pa, pb, k)
    x, w = D.gauss_jacobi01(order, alpha - 1, 0.0)  # the (a, b) form: the mass B(a + 1, b + 1)
    assert abs(w.sum() * (alpha - 1 + 1) - 1) <= 1e-13


@pytest.mark.parametrize("pa, pb", [(0.5, 0.5), (0.25, 0.75), (0.1, 0.9)])
def test_jacobi_rule_at_exponent_sum_one_warns_nothing(pa, pb):
    """``pa + pb = 1`` (α = 0.5 in the stationary S = 2 table): the general recurrence's k = 1 term is 0/0
    there; it is never formed (it leaked "invalid value encountered in divide" into users' runs)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x, w, _ = D.gauss_beta01(D.S2_ORDER, pa, pb)
    for k in range(2 * D.S2_ORDER):
        exact = math.prod((pa + j) / (pa + pb + j) for j in range(k))
        assert abs(float(w @ x**k) / exact - 1) <= 1e-11, k


@pytest.mark.parametrize("alpha", [10.0, 1e3, 1e6, 1e20, 1e300])
def test_beta_rule_moments_at_large_alpha(alpha):
    x, w = D.gauss_beta_symmetric(2 * D.S2_ORDER, alpha)
    assert abs(w.sum() - 1) <= 1e-14 and np.all(np.isfinite(x)) and np.all((0 < x) & (x < 1))
    for k in range(2 * D.S2_ORDER * 2 - 1):
        exact = math.prod((alpha + j) / (2 * alpha + j) for j in range(k))  # E x^k, Beta(α, α): no lgamma
        assert abs(float(w @ x**k) / exact - 1) <= 1e-12, k


def test_sweep_cell_without_a_method_is_refused_before_anything(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text('[fixed]\nprior = "continuous"\nS = 3\nT = 4\n[axes]\nalpha = [0.1, 0.001]\n')
    try:
        rc = cli.main(["sweep", str(spec), "--out", str(tmp_path / "o")])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "cell 1 (alpha=0.001)" in err and "use --alpha >= 0.05" in err, err
    assert not (tmp_path / "o").exists()
