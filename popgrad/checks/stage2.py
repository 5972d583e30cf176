r"""Stage 2 run to convergence, exactly, by a one-dimensional minimization (DESIGN §15).

Under a relabeling-closed prior the population ``dA2`` lies in
``span{I, 11ᵀ}`` whenever ``A2`` does, so Stage 2 of Algorithm 1 started at
``A2 = β0·I`` never leaves the span: ``A2 = α·I + β·11ᵀ``. The ``11ᵀ`` part adds
``β·Σ_l P[k, l] = β`` to every second-layer score ``u_k`` (rows of ``P`` sum to
one), which the softmax removes: only ``α`` changes the model. The limit of
Stage 2 (gradient descent to convergence, ``A1`` frozen) is therefore

    α* = argmin_α L_ε(A1, α·I),

a minimization over one real number: exact where the task enumerates
(:func:`popgrad.exact_loss`), and on a fixed sample elsewhere
(:class:`popgrad.engine.sampled.SampledObjective`: the sample-average loss is
minimized, the minimum is reported with its standard error).

* :func:`converge_stage2` -- ``α*``, the loss there and ``dL/dα`` (a certificate: 0 at the optimum);
* :func:`converged_loss_sweep` -- Knowl 1.2 over a sweep of ``T``: Stage 1 (field or exact), then
  :func:`converge_stage2`; ``L_ε(θ̂) - L*`` against ``T_eff`` with the fitted exponent and its interval.
"""
from __future__ import annotations

import math
import time
from typing import Callable, NamedTuple

import numpy as np

from ..engine.api import exact_loss, exact_loss_and_grad
from ..engine.sampled import SampledObjective
from ..task.tasks import Task
from ..engine.baselines import optimal_loss
from .._validation import as_real, as_square
from .results import fit_power_law

__all__ = ["Stage2Optimum", "converge_stage2", "converged_loss_sweep"]


class Stage2Optimum(NamedTuple):
    """Stage 2 at convergence: ``A2 = alpha·I`` minimizing the loss at frozen ``A1``.

    Attributes
    ----------
    alpha : float
        ``α*``.
    loss : float
        ``L_ε(A1, α*·I)`` (exact, or the sample average).
    loss_se : float
        Its standard error (NaN when exact).
    dloss_dalpha : float
        ``dL/dα`` at ``α*`` (``⟨dA2, I⟩``; about 0 at an interior optimum).
    kind : {"exact", "sampled"}
    n : int
        Sample size (0 when exact).
    evaluations : int
        Loss evaluations spent.
    A2 : ndarray, shape (S, S)
        ``α*·I``.
    """

    alpha: float
    loss: float
    loss_se: float
    dloss_dalpha: float
    kind: str
    n: int
    evaluations: int
    A2: np.ndarray


def converge_stage2(task: Task, A1, eps=None, objective: SampledObjective | None = None,
                    alpha_max: float = 1e4, xtol: float = 1e-9) -> Stage2Optimum:
    """The limit of Stage 2 at frozen ``A1`` for a relabeling-closed prior (module docstring).

    Parameters
    ----------
    task : popgrad.Task
        Single-parent task with a relabeling-closed prior.
    A1 : array_like, shape (T, T)
        The first layer (frozen).
    eps : float, optional
        Loss perturbation; default ``task.default_eps`` (ignored with ``objective``, which has its own).
    objective : SampledObjective, optional
        Minimize its sample-average loss instead of the exact one (required when the task does not
        enumerate).
    alpha_max : float, default 1e4
        Upper end of the search (the loss is minimized over ``0 ≤ α ≤ alpha_max``).
    xtol : float, default 1e-9
        Relative tolerance on ``α*``.

    Returns
    -------
    Stage2Optimum
    """
    from scipy.optimize import minimize_scalar

    if not isinstance(task, Task):
        raise TypeError(f"task must be a single-parent popgrad.Task, got {type(task).__name__}")
    if not task.prior.is_relabeling_closed():
        raise ValueError("converge_stage2 needs a relabeling-closed prior (then A2 stays in span{I, 11^T} and "
                         "only its I coefficient matters): use dirichlet_prior(..., symmetrize=True)")
    A1 = as_square(A1, "A1")
    if A1.shape != (task.T, task.T):
        raise ValueError(f"A1 must have shape ({task.T}, {task.T}) for this task, got {A1.shape}")
    alpha_max = as_real(alpha_max, "alpha_max", minimum=0, strict=True)
    if objective is None and not task.enumerable:
        raise ValueError("the task does not enumerate: pass objective=SampledObjective(task, n, seed) "
                         "(a sampled Stage 2)")
    S = task.S
    eye = np.eye(S)
    count = [0]
    if objective is None:
        eps = task.default_eps if eps is None else float(eps)

        def L(a):
            count[0] += 1
            return float(exact_loss(task, A1, a * eye, eps))
    else:
        def L(a):
            count[0] += 1
            return float(np.mean(objective.per_sequence_losses(A1, a * eye)))

    # bracket on a geometric grid, then Brent inside the best cell
    grid = np.concatenate([[0.0], np.geomspace(1e-2, alpha_max, 1 + int(round(6 * math.log10(alpha_max / 1e-2))))])
    vals = np.array([L(a) for a in grid])
    k = int(np.argmin(vals))
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    if hi > lo:
        res = minimize_scalar(L, bounds=(lo, hi), method="bounded",
                              options={"xatol": xtol * max(1.0, abs(grid[k])), "maxiter": 500})
        alpha, loss = (float(res.x), float(res.fun)) if res.fun <= vals[k] else (float(grid[k]), float(vals[k]))
    else:
        alpha, loss = float(grid[k]), float(vals[k])
    A2 = alpha * eye
    if objective is None:
        d = float(np.trace(exact_loss_and_grad(task, A1, A2, eps).dA2))
        return Stage2Optimum(alpha, loss, float("nan"), d, "exact", 0, count[0], A2)
    est = objective.loss(A1, A2)
    d = float(np.trace(objective.loss_and_grad(A1, A2, want_dA1=False).dA2))
    return Stage2Optimum(alpha, float(est.value), float(est.se), d, "sampled", objective.n, count[0], A2)


def converged_loss_sweep(graph_for_T: Callable, prior, T_values, beta0: float = 1e-3, lr1: float = 2.0,
                         steps1: int = 300, gradient: str = "auto", samples: int = 100_000, sample_seed: int = 0,
                         level: float = 0.95) -> dict:
    """Knowl 1.2 over ``T``: Stage 1, then Stage 2 to convergence (:func:`converge_stage2`).

    For each ``T``: Stage 1 of Algorithm 1 (``gradient="auto"``: exact when the task enumerates, else the
    Stage-1 field), then ``α*``, exact or on ``samples`` sequences. Returns a dict of lists ``T``,
    ``t_eff``, ``loss`` (``L_ε(θ̂)``, ``ε = T_eff^{-1/2}``), ``loss_se``, ``kind``, ``alpha``,
    ``L_star`` and ``L_star_eps`` (exact), ``excess`` (``L_ε(θ̂) - L*``), ``excess_eps``
    (``L_ε(θ̂) - L*_ε``, the same-ε comparison), ``seconds``, and ``fit`` (:class:`SweepFit` of
    ``excess_eps`` against ``T_eff``; ``fit_star`` of ``excess``) with ``exponent_interval``
    (``level`` interval from the fit's standard error, normal quantile) and ``excess_se`` (the
    sampled SE; ``L*`` and ``L*_ε`` are exact).

    ``L_ε - L*`` mixes two effects: the model's excess and the perturbation, which lowers every
    ε-loss (``log(f + ε) > log f``) by an amount that shrinks as ``ε = T_eff^{-1/2}`` does; so it can
    be negative at small ``T`` and grow with ``T``. ``L_ε(θ̂) - L*_ε`` compares at the same ``ε``.
    """
    from statistics import NormalDist

    from ..train.algorithm1 import train_two_stage

    rows = {k: [] for k in ("T", "t_eff", "loss", "loss_se", "kind", "alpha", "L_star", "L_star_eps", "excess",
                            "excess_eps", "seconds")}
    for T in T_values:
        t0 = time.perf_counter()
        task = Task(graph_for_T(int(T)), prior)
        g = gradient if gradient != "auto" else ("exact" if task.enumerable else "field")
        A1 = train_two_stage(task, gradient=g, beta0=beta0, lr1=lr1, steps1=steps1, steps2=0,
                             record_every=max(1, steps1)).final_A1
        obj = None if task.enumerable else SampledObjective(task, samples, sample_seed)
        opt = converge_stage2(task, A1, objective=obj)
        Ls = optimal_loss(task)
        Lse = optimal_loss(task, eps=task.default_eps if obj is None else obj.eps)
        rows["T"].append(int(T))
        rows["t_eff"].append(float(task.t_eff))
        rows["loss"].append(opt.loss)
        rows["loss_se"].append(opt.loss_se)
        rows["kind"].append(opt.kind)
        rows["alpha"].append(opt.alpha)
        rows["L_star"].append(float(Ls))
        rows["L_star_eps"].append(float(Lse))
        rows["excess"].append(opt.loss - Ls)
        rows["excess_eps"].append(opt.loss - Lse)
        rows["seconds"].append(time.perf_counter() - t0)
    fit = fit_power_law(rows["t_eff"], rows["excess_eps"])
    z = NormalDist().inv_cdf(0.5 + level / 2)
    rows["fit"] = fit
    rows["fit_star"] = fit_power_law(rows["t_eff"], rows["excess"])
    rows["exponent_interval"] = (fit.exponent - z * fit.stderr, fit.exponent + z * fit.stderr)
    rows["excess_se"] = list(rows["loss_se"])
    return rows

