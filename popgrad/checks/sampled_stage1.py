"""Graph recovery after a *sampled* Stage 1: the finite-sample theorem's event (issue 30, item 5).

:func:`popgrad.checks.check_sample_complexity` measures one event: the
``N``-sample Stage-1 gradient *at* ``A1 = 0`` ranks the parent first in every
non-root row. The paper's finite-sample statement (``N ≳ T_eff log T``) is
about a different event: Stage 1 run for its whole length on sampled
gradients, then **graph recovery** (Knowl 1.1: ``softmax(A1)[i, p(i)] ≥
1 - C/T`` and the parent is the argmax, in every non-root row;
:func:`popgrad.checks.check_graph_recovery`). This module measures that event.

Stage 1 here is Algorithm 1's Stage 1 as :func:`popgrad.train_two_stage` runs
it: ``A1(0) = 0``, ``A2 = β0·I`` frozen, ``A1 ← A1 - η1 ∇_{A1} L̂`` for
``steps1`` steps with ``η1 = lr1·S·T/β0`` (:class:`popgrad.TrainConfig`;
defaults ``β0 = 1e-3``, ``lr1 = 2``, ``steps1 = 300``, the trainer's). ``L̂``
is the mean soft-label loss of a sample (the rows engine,
:func:`popgrad.engine.single.rows_loss_and_grad`). Two ways to sample:

* ``mode="fixed"``: gradient descent on the empirical loss of **one** sample
  of ``N`` sequences, drawn once (``task.sample(N, seed)``, the sample of
  :class:`popgrad.engine.sampled.SampledObjective`) and reused at every step.
  ``N`` is the whole data set: the usual reading of a finite-sample theorem.
* ``mode="fresh"``: a fresh batch of ``N`` at every step
  (``task.sample(N, SeedSequence([seed, t]))``), bit-identical to
  ``train_two_stage(task, gradient="sgd", batch_size=N, sample_seed=seed,
  steps2=0)``. The run sees ``steps1·N`` samples in all, and the noise of
  successive batches averages out along the run.

:func:`population_stage1_recovery` gives the reference (``N = ∞``): the
exact gradient (enumeration) or the Stage-1 field (exact to first order in
``β0``, any ``T``; :func:`popgrad.stage1_field`). When the population run
itself fails the event, no ``N`` reaches it and :func:`recovery_n_min` says so.

:func:`recovery_n_min` estimates the smallest ``N`` at which the event's
frequency over seeds reaches ``level``: a doubling search from ``n_start``
until the frequency over ``seeds`` seeds is ``≥ level`` at two successive
doublings, a geometric refinement of the last octave, then (i) the grid
answer (the smallest evaluated ``N`` from which on every evaluated frequency
is ``≥ level``, Wilson 95 % intervals) and (ii) a probit fit
``P(event | N) = Φ(a + b log N)`` to the seeded outcomes within a factor
``fit_window`` of that crossing (maximum likelihood; a frequency curve can
have a plateau or a long tail far from it), whose ``N_level = exp((Φ⁻¹(level) - a)/b)`` carries a
delta-method standard error from the Fisher information. Different ``N``
use different samples (seed entropy ``(seed, N)``), so the outcomes are
independent Bernoulli trials. When the outcomes separate perfectly (no ``N``
with a mixed result) the probit slope is unbounded; ``N_level`` is then the
geometric midpoint of the last all-fail and the first all-pass ``N`` with a
uniform-width error (``separated=True``).

:func:`fit_n_min_laws` fits ``N_min(T_eff)`` by the log law ``a + b log T_eff``,
the power law ``c·T_eff^e`` and the paper's ``C·T_eff·log T`` by weighted least
squares with the probit standard errors, and reports ``χ²/dof`` of each, so
that a reader sees whether the data can tell the laws apart.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from .._validation import as_int, as_real
from ..engine.single import rows_loss_and_grad
from ..task.tasks import Task
from ..train.algorithm1 import train_two_stage
from ..train.config import TrainConfig
from .recovery import check_graph_recovery

__all__ = ["wilson_interval", "SAMPLED_MODES", "RECOVERY_EVENTS", "Stage1Outcome", "sampled_stage1_recovery",
           "population_stage1_recovery", "recovery_rate", "recovery_n_min", "probit_level", "fit_n_min_laws"]

#: How a sampled Stage 1 draws its data (module docstring).
SAMPLED_MODES = ("fixed", "fresh")
#: ``"recovered"``: Knowl 1.1 (attention ``≥ 1 - C/T`` on the parent and argmax, every non-root row);
#: ``"parent_first"``: the parent is the argmax of every non-root row of ``softmax(A1)`` (weaker).
RECOVERY_EVENTS = ("recovered", "parent_first")
#: Largest ``S**T`` for which ``gradient="auto"`` gives the population reference by enumeration.
EXACT_REFERENCE_MAX = 2**14


class Stage1Outcome(NamedTuple):
    """One Stage-1 run and its recovery verdict.

    Attributes
    ----------
    recovered : bool
        Knowl 1.1's event (:func:`popgrad.checks.check_graph_recovery` passes, hypotheses not measured).
    parent_first : bool
        The parent is the argmax of every non-root row of ``softmax(A1)``.
    min_attention : float
        ``min_i softmax(A1)[i, p(i)]`` over non-roots.
    threshold : float
        ``1 - C/T``.
    A1 : float64 (T, T)
        ``A1`` after Stage 1.
    N : float
        Samples (``"fixed"``) or samples per step (``"fresh"``); ``inf`` for the population.
    seed : int or tuple
    mode : str
        ``"fixed"``, ``"fresh"``, ``"exact"`` or ``"field"``.
    steps1 : int
    kind : str
        ``"sampled"`` or ``"exact"`` (the field is exact to first order in ``β0``).
    """

    recovered: bool
    parent_first: bool
    min_attention: float
    threshold: float
    A1: np.ndarray
    N: float
    seed: object
    mode: str
    steps1: int
    kind: str

    def event(self, name: str) -> bool:
        """The outcome of event ``name`` (:data:`RECOVERY_EVENTS`)."""
        if name not in RECOVERY_EVENTS:
            raise ValueError(f"event must be one of {RECOVERY_EVENTS}, got {name!r}")
        return bool(getattr(self, name))


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple:
    """Wilson score interval of a binomial proportion ``k / n`` (95 % for ``z = 1.96``)."""
    if n <= 0:
        return (float("nan"), float("nan"))
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def _settings(task, beta0, lr1, steps1, C, eps):
    if not isinstance(task, Task):
        raise TypeError(f"task must be a single-parent popgrad.Task, got {type(task).__name__}")
    if task.graph.non_roots.size == 0:
        raise ValueError("the graph has no non-root position: there is no parent to recover")
    beta0 = as_real(beta0, "beta0", minimum=0, strict=True)
    lr1 = as_real(lr1, "lr1", minimum=0, strict=True)
    steps1 = as_int(steps1, "steps1", minimum=1)
    C = as_real(C, "C", minimum=0, strict=True)
    eps = task.default_eps if eps is None else as_real(eps, "eps", minimum=0)
    eta1 = TrainConfig(beta0=beta0, lr1=lr1).eta1(task)
    return beta0, lr1, steps1, C, float(eps), eta1


def _entropy(seed) -> list:
    """``seed`` (a non-negative int or a tuple of them) as a list of ints for :class:`numpy.random.SeedSequence`."""
    parts = list(seed) if isinstance(seed, (tuple, list)) else [seed]
    if not parts:
        raise ValueError("seed must be a non-negative integer or a non-empty tuple of them")
    return [as_int(p, "seed", minimum=0) for p in parts]


def _outcome(task, A1, C, N, seed, mode, steps1, kind) -> Stage1Outcome:
    res = check_graph_recovery(task, A1, C=C, hypotheses=None)
    return Stage1Outcome(bool(res.passed), bool(res.details["argmax_is_parent_all_rows"]), float(res.value),
                         float(res.threshold), A1, N, seed, mode, steps1, kind)


def sampled_stage1_recovery(task: Task, N: int, seed=0, *, mode: str = "fixed", beta0: float = TrainConfig.beta0,
                            lr1: float = TrainConfig.lr1, steps1: int = TrainConfig.steps1, C: float = 1.0,
                            eps=None) -> Stage1Outcome:
    """Run Stage 1 on sampled gradients, then give the graph-recovery verdict (module docstring).

    Parameters
    ----------
    task : Task
        Single-parent, any size (only ``task.sample`` and the rows engine are used).
    N : int
        ``mode="fixed"``: the size of the one sample; ``"fresh"``: the batch size of every step.
    seed : int or tuple of int
        ``"fixed"``: the sample is ``task.sample(N, seed)`` (a tuple: ``SeedSequence(seed)``);
        ``"fresh"``: step ``t``'s batch is ``task.sample(N, SeedSequence([*seed, t]))``.
    mode : {"fixed", "fresh"}
    beta0, lr1, steps1 : float, float, int
        Stage 1 as :func:`popgrad.train_two_stage` runs it (``η1 = lr1·S·T/β0``, ``A2 = β0·I``).
    C : float
        Knowl 1.1's constant: recovery needs ``softmax(A1)[i, p(i)] ≥ 1 - C/T``.
    eps : float, optional
        Loss perturbation, default ``task.default_eps``.

    Returns
    -------
    Stage1Outcome
        ``kind="sampled"``.
    """
    beta0, lr1, steps1, C, eps, eta1 = _settings(task, beta0, lr1, steps1, C, eps)
    N = as_int(N, "N", minimum=1)
    if mode not in SAMPLED_MODES:
        raise ValueError(f"mode must be one of {SAMPLED_MODES}, got {mode!r}")
    ent = _entropy(seed)
    T, S = task.T, task.S
    A1 = np.zeros((T, T))
    A2 = beta0 * np.eye(S)
    if mode == "fixed":
        smp = task.sample(N, ent[0] if len(ent) == 1 else np.random.SeedSequence(ent))
        seqs, w = smp.seqs, smp.targets / N
        for _ in range(steps1):
            A1 = A1 - eta1 * rows_loss_and_grad(seqs, w, A1, A2, eps).dA1
    else:
        for t in range(steps1):
            b = task.sample(N, np.random.SeedSequence([*ent, t]))
            A1 = A1 - eta1 * rows_loss_and_grad(b.seqs, b.targets / N, A1, A2, eps).dA1
    if not np.all(np.isfinite(A1)):
        raise FloatingPointError(f"sampled Stage 1 diverged (N={N}, seed={seed}, mode={mode!r}): lower lr1")
    return _outcome(task, A1, C, float(N), seed, mode, steps1, "sampled")


def population_stage1_recovery(task: Task, *, gradient: str = "auto", beta0: float = TrainConfig.beta0,
                               lr1: float = TrainConfig.lr1, steps1: int = TrainConfig.steps1, C: float = 1.0,
                               eps=None) -> Stage1Outcome:
    """The reference ``N = ∞``: Stage 1 on the population gradient, then the recovery verdict.

    ``gradient``: ``"exact"`` (enumeration), ``"field"`` (the exact first-order field, any ``T``) or
    ``"auto"`` (exact when ``S**T ≤ EXACT_REFERENCE_MAX``, else the field). Same settings as
    :func:`sampled_stage1_recovery`.
    """
    beta0, lr1, steps1, C, eps, _ = _settings(task, beta0, lr1, steps1, C, eps)
    if gradient == "auto":
        gradient = "exact" if task.S ** task.T <= EXACT_REFERENCE_MAX else "field"
    if gradient not in ("exact", "field"):
        raise ValueError(f"gradient must be 'exact', 'field' or 'auto', got {gradient!r}")
    tr = train_two_stage(task, beta0=beta0, lr1=lr1, steps1=steps1, steps2=0, gradient=gradient, eps=eps,
                         record_every=steps1)
    if tr.status != "completed":
        raise FloatingPointError(f"population Stage 1 ({gradient}) stopped: {tr.status} ({tr.message})")
    return _outcome(task, tr.A1[-1].copy(), C, math.inf, None, gradient, steps1, "exact")


def recovery_rate(task: Task, N: int, seeds: int = 20, *, seed0: int = 0, **kw) -> dict:
    """The frequency of both events over ``seeds`` independent sampled Stage-1 runs at ``N``.

    Run ``r`` uses seed entropy ``(seed0 + r, N)`` (independent across ``N``). ``kw`` go to
    :func:`sampled_stage1_recovery`. Returns ``{"N", "n", "recovered", "parent_first"`` (success
    counts), ``"ci95"`` (Wilson, per event), ``"min_attention"`` (per run), ``"kind": "sampled"}``.
    """
    N = as_int(N, "N", minimum=1)
    seeds = as_int(seeds, "seeds", minimum=1)
    seed0 = as_int(seed0, "seed0", minimum=0)
    outs = [sampled_stage1_recovery(task, N, (seed0 + r, N), **kw) for r in range(seeds)]
    k = {e: sum(o.event(e) for o in outs) for e in RECOVERY_EVENTS}
    return {"N": N, "n": seeds, **k, "ci95": {e: wilson_interval(k[e], seeds) for e in RECOVERY_EVENTS},
            "min_attention": [o.min_attention for o in outs], "kind": "sampled"}


def probit_level(N, k, n, level: float) -> dict:
    """Maximum-likelihood probit ``P = Φ(a + b log N)`` of binomial counts ``k`` of ``n`` at each ``N``,
    and the ``N`` where it reaches ``level`` with a delta-method standard error of its log.

    Returns ``{"N_level", "log_se", "ci95", "a", "b", "separated", "converged"}``. With perfectly
    separated outcomes (every ``N`` all-fail or all-pass, the passes above the fails) the slope is
    unbounded: ``N_level`` is then the geometric midpoint of the last all-fail and first all-pass ``N``
    and ``log_se`` the standard deviation of a uniform law on that log-interval (``separated=True``).
    """
    from scipy.optimize import minimize
    from scipy.special import log_ndtr, ndtr, ndtri

    x = np.log(np.asarray(N, dtype=float))
    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    if not (x.size == k.size == n.size and x.size >= 1) or np.any(k < 0) or np.any(k > n):
        raise ValueError("N, k, n must have the same length >= 1 and 0 <= k <= n")
    level = as_real(level, "level", minimum=0, strict=True)
    if not level < 1:
        raise ValueError(f"level must be < 1, got {level}")
    zl = float(ndtri(level))
    nan = float("nan")
    fails = x[k == 0]
    passes = x[k == n]
    mixed = (k > 0) & (k < n)
    if not mixed.any():
        if fails.size and passes.size and fails.max() < passes.min():
            lo, hi = float(fails.max()), float(passes.min())
            xm = 0.5 * (lo + hi)
            se = (hi - lo) / math.sqrt(12)
            return {"N_level": math.exp(xm), "log_se": se, "ci95": (math.exp(lo), math.exp(hi)), "a": nan,
                    "b": math.inf, "separated": True, "converged": True}
        return {"N_level": nan, "log_se": nan, "ci95": (nan, nan), "a": nan, "b": nan, "separated": False,
                "converged": False}
    xc = float(np.average(x, weights=n))

    def nll(p):
        u = p[0] + p[1] * (x - xc)
        return -float(np.sum(k * log_ndtr(u) + (n - k) * log_ndtr(-u)))

    def grad(p):
        u = p[0] + p[1] * (x - xc)
        phi = np.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)
        r = k * phi / np.maximum(ndtr(u), 1e-300) - (n - k) * phi / np.maximum(ndtr(-u), 1e-300)
        return -np.array([r.sum(), (r * (x - xc)).sum()])

    best = None
    for b0 in (1.0, 4.0, 16.0):
        r = minimize(nll, np.array([0.0, b0]), jac=grad, method="BFGS", options={"gtol": 1e-10, "maxiter": 500})
        if best is None or r.fun < best.fun:
            best = r
    a_c, b = float(best.x[0]), float(best.x[1])
    if not b > 0:
        return {"N_level": nan, "log_se": nan, "ci95": (nan, nan), "a": a_c - b * xc, "b": b, "separated": False,
                "converged": False}
    u = a_c + b * (x - xc)
    phi = np.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)
    wgt = n * phi**2 / np.maximum(ndtr(u) * ndtr(-u), 1e-300)
    X = np.column_stack([np.ones_like(x), x - xc])
    info = X.T @ (wgt[:, None] * X)
    cov = np.linalg.inv(info)
    xl = xc + (zl - a_c) / b
    g = np.array([-1.0 / b, -(zl - a_c) / b**2])
    se = float(math.sqrt(max(0.0, g @ cov @ g)))
    return {"N_level": _exp(xl), "log_se": se, "ci95": (_exp(xl - 1.96 * se), _exp(xl + 1.96 * se)),
            "a": a_c - b * xc, "b": b, "separated": False, "converged": bool(best.success)}


def _exp(x: float) -> float:
    """``exp(x)``, ``inf`` beyond the float range (a flat frequency curve puts ``N_level`` there)."""
    return math.exp(x) if x < 709.0 else math.inf


def recovery_n_min(task: Task, level: float = 0.9, seeds: int = 20, *, event: str = "recovered",
                   mode: str = "fixed", seed0: int = 0, n_start: int = 1, n_max: int = 2**15, refine: int = 4,
                   fit_window: float = 4.0, population=None, population_gradient: str = "auto",
                   beta0: float = TrainConfig.beta0,
                   lr1: float = TrainConfig.lr1, steps1: int = TrainConfig.steps1, C: float = 1.0,
                   eps=None) -> dict:
    """The smallest ``N`` at which a sampled Stage 1 reaches ``event`` with frequency ``≥ level`` (module docstring).

    Parameters
    ----------
    task : Task
    level : float in (0, 1)
    seeds : int
        Independent runs per evaluated ``N``.
    event : {"recovered", "parent_first"}
        The event searched for; both are recorded at every ``N``.
    mode : {"fixed", "fresh"}
    seed0 : int
        Runs use seed entropy ``(seed0 + r, N)``.
    n_start, n_max : int
        The doubling search starts at ``n_start`` and gives up above ``n_max``.
    refine : int
        The last octave ``[N/2, N]`` is split into ``refine`` geometric steps (and ``N·2^(1/refine)``
        is evaluated as well).
    fit_window : float
        The probit is fitted to the evaluated ``N`` within this factor of the grid ``N_min`` (the
        crossing; a frequency curve can have a plateau or a long tail far from it).
    population : Stage1Outcome, optional
        The ``N = ∞`` reference (default: :func:`population_stage1_recovery` with ``population_gradient``).
    beta0, lr1, steps1, C, eps
        As :func:`sampled_stage1_recovery`.

    Returns
    -------
    dict
        ``N_min`` (grid: the smallest evaluated ``N`` from which on *every* evaluated frequency is
        ``≥ level``, or ``inf``), its Wilson
        interval ``ci95_at_N_min``, ``N_below`` / ``rate_below`` (the largest evaluated ``N`` below it),
        ``fit`` (:func:`probit_level` on the outcomes of ``event`` within ``fit_window`` of ``N_min``) and
        ``fit_other`` (the other event around its own crossing; ``None`` when the population fails it),
        ``curve`` (per ``N``: counts of both events), ``population`` (its verdict and minimum attention),
        ``reason`` (why there is no ``N_min``, else ``""``), the settings, ``runs`` and ``cpu_seconds``.
    """
    level = as_real(level, "level", minimum=0, strict=True)
    if not level < 1:
        raise ValueError(f"level must be < 1, got {level}")
    if event not in RECOVERY_EVENTS:
        raise ValueError(f"event must be one of {RECOVERY_EVENTS}, got {event!r}")
    if mode not in SAMPLED_MODES:
        raise ValueError(f"mode must be one of {SAMPLED_MODES}, got {mode!r}")
    seeds = as_int(seeds, "seeds", minimum=1)
    n_start = as_int(n_start, "n_start", minimum=1)
    n_max = as_int(n_max, "n_max", minimum=n_start)
    refine = as_int(refine, "refine", minimum=1)
    fit_window = as_real(fit_window, "fit_window", minimum=1)
    stage = dict(beta0=beta0, lr1=lr1, steps1=steps1, C=C, eps=eps)
    cpu0 = time.process_time()
    if population is None:
        population = population_stage1_recovery(task, gradient=population_gradient, **stage)
    other = [e for e in RECOVERY_EVENTS if e != event][0]
    out = {"event": event, "mode": mode, "level": level, "seeds": seeds, "T": task.T, "S": task.S,
           "t_eff": float(task.t_eff), "steps1": int(steps1), "beta0": float(beta0), "lr1": float(lr1), "C": float(C),
           "population": {"gradient": population.mode, "recovered": population.recovered,
                          "parent_first": population.parent_first, "min_attention": population.min_attention,
                          "threshold": population.threshold},
           "N_min": math.inf, "ci95_at_N_min": (math.nan, math.nan), "N_below": None, "rate_below": None,
           "fit": None, "fit_other": None, "curve": [], "reason": "", "kind": "sampled"}
    if not population.event(event):
        out["reason"] = (f"the population Stage 1 ({population.mode}) fails the event (min attention "
                         f"{population.min_attention:.4f} vs {population.threshold:.4f}): no N reaches it")
        out["cpu_seconds"] = time.process_time() - cpu0
        out["runs"] = 0
        return out
    curve = {}

    def run(N):
        if N not in curve:
            curve[N] = recovery_rate(task, N, seeds, seed0=seed0, mode=mode, **stage)
        return curve[N][event] / seeds

    N = n_start
    while True:  # double until a hit, and a hit that the next doubling confirms
        while run(N) < level and N < n_max:
            N = min(2 * N, n_max)
        if run(N) < level or 2 * N > n_max or run(2 * N) >= level:
            break
        N = 2 * N
    if run(N) >= level:
        lo = max(n_start, N // 2)
        grid = {int(round(lo * (N / lo) ** (j / refine))) for j in range(1, refine)}
        grid.add(int(round(N * 2 ** (1 / refine))))
        for m in sorted(grid):
            run(m)
    Ns = sorted(curve)
    rows = [curve[m] for m in Ns]
    out["curve"] = [{"N": m, "n": r["n"], "recovered": r["recovered"], "parent_first": r["parent_first"],
                     "ci95": r["ci95"], "min_attention_median": float(np.median(r["min_attention"]))}
                    for m, r in zip(Ns, rows)]
    ok = [curve[m][event] / seeds >= level for m in Ns]
    first = next((j for j in range(len(Ns)) if all(ok[j:])), None)
    if first is not None:
        m = Ns[first]
        out["N_min"] = m
        out["ci95_at_N_min"] = curve[m]["ci95"][event]
        if first > 0:
            out["N_below"] = Ns[first - 1]
            out["rate_below"] = curve[Ns[first - 1]][event] / seeds
    else:
        out["reason"] = f"no N <= n_max = {n_max} reached frequency {level} of {event!r}"
    for key, ev in (("fit", event), ("fit_other", other)):
        centre = out["N_min"] if ev == event else None
        if ev == other and not population.event(other):
            continue
        if centre is None or not math.isfinite(centre):  # the other event: its own crossing on the same grid
            okv = [curve[m][ev] / seeds >= level for m in Ns]
            j = next((j for j in range(len(Ns)) if all(okv[j:])), None)
            centre = Ns[j] if j is not None else None
        if centre is None:
            continue
        win = [m for m in Ns if centre / fit_window <= m <= centre * fit_window]
        try:
            out[key] = probit_level(win, [curve[m][ev] for m in win], [seeds] * len(win), level)
        except ValueError:
            out[key] = None
    out["runs"] = seeds * len(Ns)
    out["cpu_seconds"] = time.process_time() - cpu0
    return out


def fit_n_min_laws(t_eff, n_min, log_se, T=None) -> dict:
    """Weighted least-squares fits of ``N_min`` against ``T_eff`` with known errors (module docstring).

    Parameters
    ----------
    t_eff, n_min : sequences of float
    log_se : sequence of float
        Standard error of ``log N_min`` (the probit's ``log_se``); ``N_min``'s is ``N_min·log_se``.
    T : sequence of float, optional
        For the paper's ``C·T_eff·log T`` (default ``T = T_eff``).

    Returns
    -------
    dict
        ``log_law``: ``{"a", "b", "se_a", "se_b", "chi2", "dof"}`` of ``N = a + b log T_eff`` (weights
        ``1/(N·log_se)²``); ``power_law``: ``{"c", "e", "se_e", "chi2", "dof"}`` of
        ``log N = log c + e log T_eff`` (weights ``1/log_se²``); ``paper``: ``{"C", "se_logC", "chi2",
        "dof"}`` of ``log N = log C + log(T_eff log T)``; ``n`` points. Standard errors are from the
        given errors (not rescaled by ``χ²/dof``; rescale when ``χ²/dof`` is well above 1).
    """
    te = np.asarray(t_eff, dtype=float)
    y = np.asarray(n_min, dtype=float)
    s = np.asarray(log_se, dtype=float)
    Tv = te if T is None else np.asarray(T, dtype=float)
    if not (te.size == y.size == s.size == Tv.size) or te.size < 3:
        raise ValueError("t_eff, n_min, log_se (and T) must have the same length >= 3")
    if np.any(~np.isfinite(y)) or np.any(y <= 0) or np.any(~(s > 0)) or np.any(te <= 1):
        raise ValueError("n_min must be finite and > 0, log_se > 0 and t_eff > 1")

    def wls(X, z, sd):
        W = 1.0 / sd**2
        A = X.T @ (W[:, None] * X)
        cov = np.linalg.inv(A)
        beta = cov @ (X.T @ (W * z))
        r = (z - X @ beta) / sd
        return beta, cov, float(r @ r)

    lt = np.log(te)
    X = np.column_stack([np.ones_like(lt), lt])
    n = te.size
    (a, b), cov, chi = wls(X, y, y * s)
    log_law = {"a": float(a), "b": float(b), "se_a": float(math.sqrt(cov[0, 0])), "se_b": float(math.sqrt(cov[1, 1])),
               "chi2": chi, "dof": n - 2}
    (lc, e), cov, chi = wls(X, np.log(y), s)
    power = {"c": float(math.exp(lc)), "e": float(e), "se_e": float(math.sqrt(cov[1, 1])), "chi2": chi, "dof": n - 2}
    (lC,), cov, chi = wls(np.ones((n, 1)), np.log(y) - np.log(te * np.log(Tv)), s)
    paper = {"C": float(math.exp(lC)), "se_logC": float(math.sqrt(cov[0, 0])), "chi2": chi, "dof": n - 1}
    return {"log_law": log_law, "power_law": power, "paper": paper, "n": n}
