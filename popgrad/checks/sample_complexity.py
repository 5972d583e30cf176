"""Finite samples, exactly: how many samples Stage 1 needs, and how far SGD strays (issue 22).

Everything starts from the exact moments of the per-sample gradient
(:func:`popgrad.gradient_noise`, :func:`popgrad.engine.noise.stage1_row_noise`):
a batch of ``N`` samples has mean ``E[∇ℓ]`` and covariance ``Cov[∇ℓ]/N``.

**Stage 1 at initialization** (:func:`check_sample_complexity`). At
``A1 = 0``, ``A2 = β0·I`` Stage 1 moves row ``i`` of ``A1`` along
``-∇_{A1[i,:]} L̂_N``; it *ranks the parent first* in row ``i`` when
``-∂L̂_N/∂A1[i, p(i)] > -∂L̂_N/∂A1[i, j]`` for every ``j ≤ i``, ``j ≠ p(i)``.
The probability of that event in every non-root row is computed in the
**Gaussian limit** (the central limit theorem for the batch mean, with the
exact mean and the exact per-row covariance): row ``i``'s margins
``d_j = X_p - X_j`` are ``N(√N·μ_i, K_i)``, ``μ_i, K_i`` from one sample, and
``P_i(N) = P(d > 0)`` is a Gaussian orthant probability. It is bracketed by
exact bivariate terms (Owen's T function): Hunter's bound on the failure
``1 - P_i`` (single terms minus a maximum spanning tree of the pair terms)
and the Dawson–Sankoff bound; the Hunter end is used (conservative: ``N_min``
is not underestimated), the bracket is reported, and Genz's algorithm
(:func:`scipy.stats.multivariate_normal.cdf`, seeded) checks it at ``N_min``.
Rows are combined as independent, ``P(N) = Π_i P_i(N)`` (only
per-row covariances enter; the union bound ``1 - Σ_i (1 - P_i)``, valid
whatever the cross-row correlation, is reported beside it and differs by less
than ``(1 - level)²/2`` at the level). A seeded simulation of the event itself
(``R`` batches of ``N`` fresh samples, the exact batch gradient of each,
every row jointly) confirms it at a few ``N``, with Wilson 95 % intervals.
``N_min`` is the smallest integer ``N`` with ``P(N) ≥ level``.

**SGD against population descent** (:func:`sgd_spread`). Along the exact
trajectory ``θ_t`` of a run, a run on batches of ``B`` samples deviates by
``δ_t = θ_t^sgd - θ_t``; to first order (linear response)
``δ_{t+1} = (I - Λ_t H_t) δ_t - Λ_t ξ_t``, ``ξ_t ~ (0, C_t/B)``, with ``Λ_t``
the step sizes of the coordinates the stage moves, ``H_t`` the loss Hessian
(central differences of the exact gradient) and ``C_t`` the exact per-sample
covariance. So ``Σ_{t+1} = F_t Σ_t F_tᵀ + Λ_t C_t Λ_t / B``, and the predicted
RMS distance is ``√tr Σ_t`` over the ``A1`` (or ``A2``) coordinates. The
random-walk prediction (``F = I``: ``cov/B`` summed through the steps) is
given beside it. The loss gap's predicted spread is ``√(∇Lᵀ Σ ∇L)`` (first
order) and its predicted mean ``½ tr(H Σ)`` (the quadratic term only: the
drift of the mean, a third-derivative term, is left out).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import as_int, as_real
from ..engine.api import exact_loss_and_grad
from ..engine.noise import flatten_grad, gradient_noise, stage1_row_noise
from ..engine.single import rows_loss_and_grad
from ..task.tasks import Task
from ..theory.information import has_idealized_gradient
from .hypotheses import measure_hypotheses, within_hypotheses
from .results import CheckResult, inconclusive
# The theorem's event (graph recovery after a sampled Stage 1) lives in its own module (size); re-exported here,
# with the binomial interval both use.
from .sampled_stage1 import (RECOVERY_EVENTS, SAMPLED_MODES, Stage1Outcome, fit_n_min_laws, population_stage1_recovery,
                             probit_level, recovery_n_min, recovery_rate, sampled_stage1_recovery, wilson_interval)

__all__ = ["RankingModel", "ranking_model", "simulate_ranking", "joint_gaussian_probability", "wilson_interval", "check_sample_complexity",
           "sample_complexity_sweep", "fit_t_log_t", "SgdSpread", "sgd_spread", "SAMPLE_COMPLEXITY_STATEMENT",
           "RECOVERY_EVENTS", "SAMPLED_MODES", "Stage1Outcome", "sampled_stage1_recovery", "population_stage1_recovery",
           "recovery_rate", "recovery_n_min", "probit_level", "fit_n_min_laws"]

SAMPLE_COMPLEXITY_STATEMENT = (
    "Finite-sample Stage 1: the N-sample gradient at A1 = 0, A2 = β0·I ranks the parent first in every "
    "non-root row with probability ≥ level once N ≥ N_min, N_min = O(T_eff log T_eff)")
#: Relative precision asked of each row's Gaussian failure probability (Genz's algorithm).
_MVN_REL = 1e-3
#: Competitors failing alone with probability below this fraction of a row's largest enter by their union bound.
_DROP_REL = 1e-4


class RankingModel:
    """Per-row Gaussian model of the Stage-1 ranking event (module docstring).

    Attributes
    ----------
    rows : list of int
        The non-root rows ``i`` (with at least one competitor ``j ≤ i``, ``j ≠ p(i)``).
    mu : list of ndarray
        ``μ_i[r] = E[X_p - X_{j_r}]`` per sample (``X = -∇_{A1[i,:]} ℓ``).
    K : list of ndarray
        ``K_i = Cov[X_p - X_j]`` per sample.
    z : list of ndarray
        ``μ_i / sqrt(diag K_i)``: the per-sample signal-to-noise ratio of each margin.
    """

    def __init__(self, rows, mu, K, competitors, seed=0):
        self.rows, self.mu, self.K, self.competitors = rows, mu, K, competitors
        self.z = [m / np.sqrt(np.diag(k)) for m, k in zip(mu, K)]
        self.seed = seed

    def row_fail_bounds(self, N: float) -> tuple:
        """``(lo, hi)``: bounds on every row's Gaussian-limit failure ``1 - P_i(N)``, exact bivariate terms.

        ``hi`` is Hunter's bound ``Σ_j p_j - Σ_{(j,j') ∈ tree} p_jj'`` (``tree`` the maximum spanning tree of
        the pairwise failure probabilities ``p_jj'``); ``lo`` is the Dawson–Sankoff bound
        ``2S1/(m+1) - 2S2/(m(m+1))``, ``m = 1 + ⌊2S2/S1⌋`` (and ``≥ max_j p_j``). ``p_j = Φ(-√N z_j)``,
        ``p_jj'`` the bivariate normal orthant probability (Owen's T function, exact in double precision).
        """
        lo = np.empty(len(self.rows))
        hi = np.empty(len(self.rows))
        for r, (k, z) in enumerate(zip(self.K, self.z)):
            a = math.sqrt(N) * z
            p1 = _norm_sf(a)
            if a.size == 1:
                lo[r] = hi[r] = float(p1[0])
                continue
            d = np.sqrt(np.diag(k))
            rho = k / np.outer(d, d)
            p2 = _bvn_lower(-a, -a, rho)
            np.fill_diagonal(p2, 0.0)
            S1, S2 = float(p1.sum()), float(np.triu(p2, 1).sum())
            hi[r] = min(S1, max(float(p1.max()), S1 - _max_spanning_tree(p2)))
            if S1 > 0:
                m = 1 + math.floor(2 * S2 / S1)
                lo[r] = max(float(p1.max()), 2 * S1 / (m + 1) - 2 * S2 / (m * (m + 1)))
            else:
                lo[r] = 0.0
        return lo, hi

    def row_fail_genz(self, N: float, rel: float = 1e-3) -> np.ndarray:
        """Every row's Gaussian-limit failure by Genz's algorithm (:func:`scipy.stats.multivariate_normal.cdf`,
        seeded, absolute precision ``rel ×`` the row's union bound): a check on :meth:`row_fail_bounds`."""
        from scipy.stats import multivariate_normal

        out = np.empty(len(self.rows))
        for r, (m, k, z) in enumerate(zip(self.mu, self.K, self.z)):
            sf = _norm_sf(math.sqrt(N) * z)
            if m.size == 1 or sf.sum() < 1e-14:
                out[r] = float(sf.sum())
                continue
            p = multivariate_normal.cdf(np.zeros(m.size), mean=-math.sqrt(N) * m, cov=k, allow_singular=True,
                                        abseps=max(1e-14, rel * float(sf.sum())), releps=0,
                                        maxpts=20_000 * m.size, rng=np.random.default_rng(self.seed))
            out[r] = 1.0 - float(p)
        return out

    def probability(self, N: float) -> float:
        """``Π_i (1 - hi_i)``: the Gaussian-limit probability of the event in every row (rows independent),
        with each row's failure at its Hunter bound (so a lower bound on the per-row product)."""
        return float(np.prod(1.0 - self.row_fail_bounds(N)[1]))

    def probability_bracket(self, N: float) -> tuple:
        """``(Π(1 - hi), Π(1 - lo))`` (the Hunter and Dawson–Sankoff brackets of the per-row product)."""
        lo, hi = self.row_fail_bounds(N)
        return float(np.prod(1.0 - hi)), float(np.prod(1.0 - lo))

    def union_bound(self, N: float) -> float:
        """``1 - Σ_i hi_i``: a lower bound on the event's Gaussian-limit probability whatever the cross-row
        correlation."""
        return float(1.0 - np.sum(self.row_fail_bounds(N)[1]))

    def n_min(self, level: float, optimistic: bool = False) -> int:
        """Smallest integer ``N`` with :meth:`probability` ``≥ level`` (bisection; it increases with ``N``).

        ``optimistic=True`` uses the Dawson–Sankoff end of the bracket instead (a lower bound on ``N_min``).
        Returns -1 when some competitor beats the parent on average (no ``N`` reaches the level).
        """
        if any(np.any(z <= 0) for z in self.z):
            return -1

        def prob(N):
            lo, hi = self.row_fail_bounds(N)
            return float(np.prod(1.0 - (lo if optimistic else hi)))

        zmin = min(float(z.min()) for z in self.z)
        n_pairs = sum(z.size for z in self.z)
        # brackets: one pair alone fails with probability ≤ the event's failure ≤ the union over all pairs
        lo = max(1, int(math.floor((_norm_isf(1 - level) / zmin) ** 2)))
        hi = max(lo + 1, int(math.ceil((_norm_isf((1 - level) / n_pairs) / zmin) ** 2)) + 1)
        while prob(hi) < level:
            hi *= 2
        while lo > 1 and prob(lo) >= level:
            lo = max(1, lo // 2)
        if prob(lo) >= level:
            return lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if prob(mid) >= level:
                hi = mid
            else:
                lo = mid
        return hi


def _norm_sf(x):
    from scipy.special import ndtr

    return ndtr(-np.asarray(x, dtype=float))


def _norm_isf(p):
    from scipy.special import ndtri

    return float(-ndtri(p))


def _bvn_lower(h, k, rho):
    """``P(Y1 < h_j, Y2 < k_j')`` for standard normals with correlation ``rho[j, j']`` (Owen's T; ``h, k ≠ 0``).

    ``Φ2(h, k; ρ) = ½Φ(h) + ½Φ(k) - T(h, a_h) - T(k, a_k) - β``, ``a_h = (k - ρh)/(h√(1-ρ²))``,
    ``β = ½`` when ``hk < 0`` (Owen 1956).
    """
    from scipy.special import ndtr, owens_t

    H = np.asarray(h, dtype=float)[:, None] * np.ones_like(rho)
    Kk = np.asarray(k, dtype=float)[None, :] * np.ones_like(rho)
    r = np.clip(rho, -1 + 1e-15, 1 - 1e-15)
    s = np.sqrt(1 - r * r)
    out = 0.5 * ndtr(H) + 0.5 * ndtr(Kk) - owens_t(H, (Kk - r * H) / (H * s)) - owens_t(Kk, (H - r * Kk) / (Kk * s))
    out = out - np.where(H * Kk < 0, 0.5, 0.0)
    return np.clip(out, 0.0, np.minimum(ndtr(H), ndtr(Kk)))


def _max_spanning_tree(W) -> float:
    """Total weight of a maximum spanning tree of the complete graph with weights ``W`` (Prim, ``O(n²)``)."""
    n = W.shape[0]
    inside = np.zeros(n, dtype=bool)
    inside[0] = True
    best = W[0].copy()
    total = 0.0
    for _ in range(n - 1):
        cand = np.where(inside, -np.inf, best)
        j = int(np.argmax(cand))
        total += float(cand[j])
        inside[j] = True
        best = np.maximum(best, W[j])
    return total


def _stage1_point(task, beta0, A1, eps):
    T, S = task.T, task.S
    A1 = np.zeros((T, T)) if A1 is None else np.asarray(A1, dtype=np.float64)
    return A1, beta0 * np.eye(S), (task.default_eps if eps is None else float(eps))


def ranking_model(task: Task, beta0: float = 1e-3, A1=None, eps=None, seed: int = 0) -> RankingModel:
    """The :class:`RankingModel` of ``task`` at ``A1`` (default 0) and ``A2 = β0·I``, from the exact
    mean ``dA1`` and per-row covariances (:func:`popgrad.engine.noise.stage1_row_noise`)."""
    if not isinstance(task, Task):
        raise TypeError(f"task must be a single-parent popgrad.Task, got {type(task).__name__}")
    beta0 = as_real(beta0, "beta0", minimum=0, strict=True)
    A1, A2, eps = _stage1_point(task, beta0, A1, eps)
    rn = stage1_row_noise(task, A1, A2, eps)
    parents = task.graph.parents
    rows, mus, Ks, comps = [], [], [], []
    for i in range(task.T):
        p = parents[i]
        if p < 0 or i < 1:
            continue
        js = [j for j in range(i + 1) if j != p]
        A = np.zeros((len(js), i + 1))
        A[np.arange(len(js)), p] = 1.0
        A[np.arange(len(js)), js] = -1.0
        X_mean = -rn.dA1[i, : i + 1]
        C = rn.row_cov[i, : i + 1, : i + 1]
        rows.append(i)
        mus.append(A @ X_mean)
        Ks.append(A @ C @ A.T)
        comps.append(js)
    return RankingModel(rows, mus, Ks, comps, seed)


def simulate_ranking(task: Task, N: int, replicates: int, seed: int, beta0: float = 1e-3, A1=None, eps=None,
                     A2=None) -> dict:
    """Seeded simulation of the ranking event: ``replicates`` batches of ``N`` fresh samples.

    Each batch's exact gradient (the rows engine, soft labels) at ``A1`` (default 0) and ``A2``
    (default ``β0·I``) is checked in every non-root row. Returns ``{"N", "replicates", "successes",
    "frequency", "ci95": (lo, hi), "kind": "sampled"}``.
    """
    N = as_int(N, "N", minimum=1)
    replicates = as_int(replicates, "replicates", minimum=1)
    A1, A2d, eps = _stage1_point(task, beta0, A1, eps)
    A2 = A2d if A2 is None else np.asarray(A2, dtype=np.float64)
    parents = task.graph.parents
    rows = [i for i in range(task.T) if parents[i] >= 0 and i >= 1]
    ss = np.random.SeedSequence(seed).spawn(replicates)
    ok = 0
    for r in range(replicates):
        smp = task.sample(N, ss[r])
        dA1 = rows_loss_and_grad(smp.seqs, smp.targets / N, A1, A2, eps).dA1
        good = True
        for i in rows:
            x = -dA1[i, : i + 1]
            p = parents[i]
            others = np.delete(x, p)
            if others.size and not np.all(x[p] > others):
                good = False
                break
        ok += good
    lo, hi = wilson_interval(ok, replicates)
    return {"N": int(N), "replicates": int(replicates), "successes": int(ok), "frequency": ok / replicates,
            "ci95": (lo, hi), "kind": "sampled"}


def joint_gaussian_probability(task: Task, N: int, draws: int = 200_000, seed: int = 0, beta0: float = 1e-3,
                               A1=None, eps=None) -> dict:
    """The ranking event's Gaussian-limit probability with the *full* ``dA1`` covariance (cross-row
    correlations included), by Monte Carlo of that Gaussian (``draws`` seeded draws; small ``T``: it needs
    :func:`popgrad.gradient_noise`). Returns ``{"value", "se", "draws"}``.
    """
    N = as_int(N, "N", minimum=1)
    A1, A2, eps = _stage1_point(task, beta0, A1, eps)
    T = task.T
    gn = gradient_noise(task, A1, A2, eps)
    D1 = T * (T + 1) // 2
    r, c = np.tril_indices(T)
    mean = -gn.mean.dA1[r, c]
    X = np.random.default_rng(seed).multivariate_normal(mean, gn.cov[:D1, :D1] / N, size=int(draws), method="eigh")
    full = np.zeros((int(draws), T, T))
    full[:, r, c] = X
    parents = task.graph.parents
    ok = np.ones(int(draws), dtype=bool)
    for i in range(1, T):
        p = parents[i]
        if p < 0:
            continue
        x = full[:, i, : i + 1]
        ok &= np.all(x[:, [p]] > np.delete(x, p, axis=1), axis=1)
    v = float(ok.mean())
    return {"value": v, "se": math.sqrt(v * (1 - v) / draws), "draws": int(draws)}


def fit_t_log_t(t_eff, n_min) -> dict:
    """Fit ``N_min = C · T_eff log T_eff`` (least squares on logs: ``log C`` = mean of ``log(N / x)``).

    Returns ``{"C", "residuals"}`` (relative: ``N / (C x) - 1``) and, beside it, the fit
    ``N_min = a + b log T_eff`` (``{"a", "b", "residuals"}``) and a free power law (``exponent``).
    """
    from .results import fit_power_law

    x = np.asarray(t_eff, dtype=float)
    y = np.asarray(n_min, dtype=float)
    xl = x * np.log(x)
    C = float(np.exp(np.mean(np.log(y / xl))))
    X = np.column_stack([np.ones_like(x), np.log(x)])
    (a, b), *_ = np.linalg.lstsq(X, y, rcond=None)
    pl = fit_power_law(x, y)
    return {"C": C, "residuals": (y / (C * xl) - 1).tolist(),
            "log_fit": {"a": float(a), "b": float(b), "residuals": (y / (a + b * np.log(x)) - 1).tolist()},
            "power_law": {"exponent": pl.exponent, "stderr": pl.stderr}}


def check_sample_complexity(task: Task, beta0: float = 1e-3, level: float = 0.99, eps=None, replicates: int = 2000,
                            seed: int = 0, simulate: bool = True) -> CheckResult:
    """How many samples Stage 1 needs at initialization (module docstring).

    Parameters
    ----------
    task : Task
        Single-parent, enumerable.
    beta0 : float
        ``A2 = β0·I``.
    level : float in (0, 1)
        Target probability of the ranking event in every non-root row.
    eps : float, optional
        Loss perturbation, default ``task.default_eps``.
    replicates : int
        Batches per simulated ``N``.
    seed : int
        Seed of the simulation (and of the orthant algorithm).
    simulate : bool
        Run the simulation (the verdict needs it).

    Returns
    -------
    CheckResult
        ``value`` = the upper end of the simulation's 95 % interval at ``N_min``, ``threshold`` =
        ``level``, ``passed`` when the simulation does not reject ``P(N_min) ≥ level``; ``kind``
        "sampled". ``details``: ``N_min`` (Gaussian limit), ``beta0``, ``level``, ``t_eff``,
        ``N_min / (T_eff log T_eff)``, the per-row signal-to-noise ``z`` of the closest competitor,
        the Gaussian-limit and union-bound probabilities and the simulation at ``N`` where the
        Gaussian limit predicts about 0.5, 0.9 and ``level``.
    """
    level = as_real(level, "level", minimum=0, strict=True)
    if not level < 1:
        raise ValueError(f"level must be < 1, got {level}")
    replicates = as_int(replicates, "replicates", minimum=1)
    if not isinstance(task, Task):
        raise TypeError(f"task must be a single-parent popgrad.Task, got {type(task).__name__}")
    if task.graph.non_roots.size == 0:
        from .results import not_applicable
        return not_applicable("sample_complexity", SAMPLE_COMPLEXITY_STATEMENT, "the graph has no non-root position")
    hyp = measure_hypotheses(task)
    nan = float("nan")
    if not has_idealized_gradient(task):
        g = hyp.items["gamma"]
        stub = CheckResult("sample_complexity", nan, level, False, ">=", SAMPLE_COMPLEXITY_STATEMENT,
                           {"level": level, "T": task.T, "S": task.S, "hypotheses": hyp.to_dict()}, kind="sampled")
        return inconclusive(stub, f"the prior is reducible (a draw has a zero stationary probability): "
                                  f"{g.describe()}; the Stage-1 signal divides by the stationary probabilities "
                                  f"and Knowl 10.1 (every transition possible) fails")
    model = ranking_model(task, beta0, eps=eps, seed=seed)
    t_eff = float(task.t_eff)
    details = {"beta0": float(beta0), "level": level, "t_eff": t_eff, "T": task.T, "S": task.S,
               "method": ("Gaussian limit (exact mean and per-row covariance; per row Hunter's bound, rows combined as "
                          "independent)")}
    if not model.rows:
        from .results import not_applicable
        return not_applicable("sample_complexity", SAMPLE_COMPLEXITY_STATEMENT, "no non-root row with a competitor")
    n_min = model.n_min(level)
    details["N_min"] = int(n_min)
    details["row_z_min"] = {int(i): float(z.min()) for i, z in zip(model.rows, model.z)}
    if n_min < 0:
        details["reason"] = "a competitor beats the parent on average in some row: no N reaches the level"
        res = CheckResult("sample_complexity", float("nan"), level, False, ">=", SAMPLE_COMPLEXITY_STATEMENT,
                          details, kind="sampled")
        return within_hypotheses(res, hyp)
    details["N_min_over_TlogT"] = n_min / (t_eff * math.log(t_eff)) if t_eff > 1 else float("nan")
    details["N_min_optimistic"] = int(model.n_min(level, optimistic=True))
    details["gaussian_at_N_min"] = model.probability(n_min)
    details["gaussian_bracket_at_N_min"] = model.probability_bracket(n_min)
    details["gaussian_genz_at_N_min"] = float(np.prod(1.0 - model.row_fail_genz(n_min)))
    details["union_bound_at_N_min"] = model.union_bound(n_min)
    value = float("nan")
    if simulate:
        sims = []
        Ns = sorted({max(1, model.n_min(0.5)), max(1, model.n_min(0.9)), n_min})
        for N in Ns:
            sim = simulate_ranking(task, N, replicates, seed + N, beta0, eps=eps)
            sim["gaussian"] = model.probability(N)
            sims.append(sim)
        details["simulation"] = sims
        value = float(sims[-1]["ci95"][1])
    floor = 1 - 2 * (1 - level)
    rule = (f"passes when the upper end of the simulation's 95% interval at N_min is >= level and its lower end "
            f">= 1 - 2(1 - level) = {floor:.4g} (the simulation rules out twice the allowed failure rate); fails "
            "when the upper end is below the level; else inconclusive")
    details["rule"] = rule
    passed = bool(value >= level)
    res = CheckResult("sample_complexity", value, level, passed, ">=", SAMPLE_COMPLEXITY_STATEMENT, details,
                      kind="sampled")
    if not simulate:
        return inconclusive(res, "the simulation was not run (simulate=False): the verdict needs it")
    lo, hi = sims[-1]["ci95"]
    if passed and not lo >= floor:
        return inconclusive(res, f"{replicates} replicate(s) cannot resolve the level: the 95% interval at N_min is "
                                 f"[{lo:.3g}, {hi:.3g}] (its lower end needs >= {floor:.4g}); use more replicates")
    return within_hypotheses(res, hyp)


def sample_complexity_sweep(graph_for_T, prior, T_values, beta0: float = 1e-3, level: float = 0.99,
                            eps=None) -> dict:
    """``N_min`` over a sweep of ``T`` (Gaussian limit, no simulation) and its fit against ``T_eff log T_eff``.

    Parameters
    ----------
    graph_for_T : callable
        ``T -> CausalGraph``.
    prior : FinitePrior
    T_values : sequence of int
        Each ``S**T`` must be enumerable (``S = 2``: ``T ≤ 22`` in seconds to a minute).

    Returns
    -------
    dict
        ``T``, ``t_eff``, ``N_min``, ``z_min`` (smallest per-sample margin SNR), ``fit``
        (:func:`fit_t_log_t`), ``level``, ``beta0``.
    """
    Ts, te, nm, zm = [], [], [], []
    for T in T_values:
        task = Task(graph_for_T(int(T)), prior)
        model = ranking_model(task, beta0, eps=eps)
        if not model.rows:
            continue
        Ts.append(int(T))
        te.append(float(task.t_eff))
        nm.append(model.n_min(level))
        zm.append(min(float(z.min()) for z in model.z))
    ok = [k for k in range(len(nm)) if nm[k] > 0 and te[k] > 1]
    fit = fit_t_log_t([te[k] for k in ok], [nm[k] for k in ok]) if len(ok) >= 2 else None
    return {"T": Ts, "t_eff": te, "N_min": nm, "z_min": zm, "fit": fit, "level": level, "beta0": beta0}


# ====================================================================== SGD vs exact
class SgdSpread(NamedTuple):
    """Predicted deviation of an SGD run from the exact run (linear response; module docstring).

    Attributes
    ----------
    step : int64 (n,)
        Global steps ``0 … steps1 + steps2``.
    rms_A1, rms_A2 : float64 (n,)
        Predicted ``sqrt(E‖A1_sgd - A1_gd‖_F²)`` (and for ``A2``), linear response.
    rms_A1_random_walk, rms_A2_random_walk : float64 (n,)
        The same with ``F = I`` (``cov/B`` summed through the steps).
    loss_sd : float64 (n,)
        Predicted spread of the loss gap, ``sqrt(∇Lᵀ Σ ∇L)``.
    loss_bias : float64 (n,)
        ``½ tr(H Σ)`` (the quadratic part of the mean loss gap).
    batch_size : int
    """

    step: np.ndarray
    rms_A1: np.ndarray
    rms_A2: np.ndarray
    rms_A1_random_walk: np.ndarray
    rms_A2_random_walk: np.ndarray
    loss_sd: np.ndarray
    loss_bias: np.ndarray
    batch_size: int


def _unflatten(theta, T, S):
    D1 = T * (T + 1) // 2
    r, c = np.tril_indices(T)
    A1 = np.zeros((T, T))
    A1[r, c] = theta[:D1]
    return A1, theta[D1:].reshape(S, S).copy()


def sgd_spread(task: Task, trajectory, batch_size: int, fd_step: float = 1e-5) -> SgdSpread:
    """Linear-response prediction of how far SGD with batches of ``batch_size`` strays from ``trajectory``.

    Parameters
    ----------
    task : Task
        Enumerable, single-parent.
    trajectory : Trajectory
        An exact run (``gradient="exact"``) recorded at every step (``record_every=1``).
    batch_size : int
    fd_step : float
        Central-difference step of the Hessian (the parameters are O(1)).

    Returns
    -------
    SgdSpread
    """
    B = as_int(batch_size, "batch_size", minimum=1)
    cfg = trajectory.config
    if cfg.gradient != "exact":
        raise ValueError(f"trajectory must be an exact run (gradient='exact'), got gradient={cfg.gradient!r}")
    total = cfg.steps1 + cfg.steps2
    if len(trajectory.step) != total + 1 or not np.array_equal(trajectory.step, np.arange(total + 1)):
        raise ValueError("trajectory must record every step: run train_two_stage(..., record_every=1) to the end")
    T, S = task.T, task.S
    D1 = T * (T + 1) // 2
    D = D1 + S * S
    eps = task.default_eps if cfg.eps is None else cfg.eps
    eta = np.empty(D)
    eta[:D1], eta[D1:] = cfg.eta1(task), cfg.eta2(task)
    joint = cfg.schedule == "joint"
    Sig = np.zeros((D, D))
    Sig_rw = np.zeros((D, D))
    n = total + 1
    out = {k: np.zeros(n) for k in ("rms_A1", "rms_A2", "rw1", "rw2", "sd", "bias")}

    def grad(theta):
        A1, A2 = _unflatten(theta, T, S)
        r = exact_loss_and_grad(task, A1, A2, eps, symmetry="off")
        return flatten_grad(r.dA1, r.dA2)

    for t in range(n):
        A1, A2 = trajectory.A1[t], trajectory.A2[t]
        theta = flatten_grad(A1, A2)
        gn = gradient_noise(task, A1, A2, eps)
        H = np.empty((D, D))
        for b in range(D):
            e = np.zeros(D)
            e[b] = fd_step
            H[:, b] = (grad(theta + e) - grad(theta - e)) / (2 * fd_step)
        H = 0.5 * (H + H.T)
        g = flatten_grad(gn.mean.dA1, gn.mean.dA2)
        out["rms_A1"][t] = math.sqrt(max(0.0, np.trace(Sig[:D1, :D1])))
        out["rms_A2"][t] = math.sqrt(max(0.0, np.trace(Sig[D1:, D1:])))
        out["rw1"][t] = math.sqrt(max(0.0, np.trace(Sig_rw[:D1, :D1])))
        out["rw2"][t] = math.sqrt(max(0.0, np.trace(Sig_rw[D1:, D1:])))
        out["sd"][t] = math.sqrt(max(0.0, float(g @ Sig @ g)))
        out["bias"][t] = 0.5 * float(np.sum(H * Sig))
        if t == total:
            break
        moving = np.ones(D, dtype=bool) if joint else np.arange(D) < D1 if t < cfg.steps1 else np.arange(D) >= D1
        lam = np.where(moving, eta, 0.0)
        F = np.eye(D) - lam[:, None] * H
        noise = lam[:, None] * gn.cov * lam[None, :] / B
        Sig = F @ Sig @ F.T + noise
        Sig_rw = Sig_rw + noise
    return SgdSpread(np.arange(n), out["rms_A1"], out["rms_A2"], out["rw1"], out["rw2"], out["sd"], out["bias"], B)
