"""Beyond enumeration: sample-average approximation (SAA) of Stage 2 and sampled reference losses.

When ``S**T`` is too large to enumerate, the population is replaced by a
*fixed* sample of ``n`` sequences drawn once from the task (seeded,
:meth:`popgrad.Task.sample`), each with the soft label ``y_m = π_m(·|q_m)`` of
the atom that drew it. The sample-average loss

    L̂(A1, A2) = (1/n) Σ_m ℓ_m,    ℓ_m = -Σ_c y_m[c] log(f_c(s_m) + ε)

is an unbiased estimate of the population loss for every ``(A1, A2)``
(``E[y_m[c] [s_m = s]] = w(s, c)``), and its gradient is the gradient of a
deterministic objective: Stage 2 runs plain gradient descent on it. Every
number that comes from the sample is reported with its standard error
``sd(ℓ)/√n`` and ``n`` and labelled *sampled*; nothing here is exact.

The soft label is the drawing atom's ``π(·|q)`` (not the posterior mean over
the prior, which would lower the variance but needs the posterior over all
``K`` atoms per sequence: ``K = n_atoms · S!`` for a relabeling-closed prior,
3.6 M relabelings per draw at ``S = 10``).

Projection (DESIGN §10): for a relabeling-closed prior the population
``dA2`` lies in ``span{I, 11ᵀ}`` whenever ``A2`` does; the sampled ``dA2``
does not, so it is projected onto the span (its mean diagonal on the
diagonal, mean off-diagonal elsewhere). This removes sampling noise in the
directions where the population gradient is exactly zero.

Reference losses by the same sample (common random numbers): the
count-estimator loss and, when the prior's atoms can be listed, the Bayes
loss (posterior predictive over every atom); a difference such as
``L(θ̂) - L_Bayes`` is estimated by the mean of the per-sequence differences,
whose standard error is much smaller than either term's.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import as_int
from ..model.reduced import _predict, first_layer_attention
from ..task import _weights
from ..task.priors import MAX_CLOSURE_ATOMS
from ..task.tasks import Sample, Task, check_task
from ._args import options_or_default
from .baselines import count_estimator_predict
from .result import LossAndGrad
from .single import rows_loss_and_grad, rows_losses
from .symmetry import symmetrize_dA2

__all__ = ["Estimate", "SampledObjective", "estimate", "default_samples", "sampled_reference_losses",
           "quantile_interval", "DEFAULT_SE_TARGET"]

#: The standard error the default sample size aims at for the Stage-2 loss (issue: ≤ 1e-3).
DEFAULT_SE_TARGET = 1e-3
#: Bounds of the default sample size.
MIN_SAMPLES, MAX_SAMPLES = 10_000, 1_000_000
#: Largest ``K·n`` (atoms × sequences) for the sampled Bayes loss (posterior over every atom).
BAYES_MAX_WORK = 2 * 10**9


class Estimate(NamedTuple):
    """A sampled estimate: ``value ± se`` from ``n`` draws (``kind`` is always ``"sampled"``)."""

    value: float
    se: float
    n: int
    kind: str = "sampled"

    def to_dict(self) -> dict:
        return {"value": float(self.value), "se": float(self.se), "n": int(self.n), "kind": self.kind}


def estimate(x) -> Estimate:
    """Mean of per-sequence values with its standard error ``sd/√n``."""
    x = np.asarray(x, dtype=np.float64)
    n = x.size
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return Estimate(float(x.mean()), se, int(n))


class SampledObjective:
    """The SAA objective of Stage 2 on a fixed sample (module docstring).

    Parameters
    ----------
    task : Task
        Single-parent task (any size: only ``task.sample`` is used).
    n : int
        Number of sequences.
    seed : int
        Seed of the sample (the same seed gives the same objective).
    eps : float, optional
        Loss perturbation; default ``task.default_eps``.
    project : bool, optional
        Project ``dA2`` onto ``span{I, 11ᵀ}`` (default: when the prior is
        relabeling-closed; only valid then).
    """

    def __init__(self, task: Task, n: int, seed: int, eps=None, project=None, options=None):
        check_task(task, Task, "sampled Stage 2 (single-parent)")
        self.task = task
        self.n = as_int(n, "samples", minimum=2)
        self.seed = seed
        self.eps = float(task.default_eps if eps is None else eps)
        self.project = bool(task.prior.is_relabeling_closed() if project is None else project)
        self.options = options_or_default(options)
        self.sample: Sample = task.sample(self.n, seed)
        self._w = np.ascontiguousarray(self.sample.targets / self.n)

    def loss_and_grad(self, A1, A2, want_dA1=True) -> LossAndGrad:
        """``L̂`` and its gradients (numba rows kernel; ``dA2`` projected when ``project``).

        ``want_dA1=False`` (Stage 2, ``A1`` frozen) skips ``dA1`` (then ``None``), half the work.
        """
        res = rows_loss_and_grad(self.sample.seqs, self._w, A1, A2, self.eps, self.options, want_dA1)
        if self.project and _in_span(A2):
            return LossAndGrad(res.loss, res.dA1, symmetrize_dA2(res.dA2))
        return res

    def per_sequence_losses(self, A1, A2) -> np.ndarray:
        """``ℓ_m = -Σ_c y_m[c] log(f_c(s_m) + ε)`` for every sequence of the sample (numba forward pass;
        :meth:`per_sequence_losses_numpy` is its NumPy reference)."""
        return rows_losses(self.sample.seqs, self.sample.targets, A1, A2, self.eps)

    def per_sequence_losses_numpy(self, A1, A2) -> np.ndarray:
        """NumPy reference of :meth:`per_sequence_losses` (the model of :mod:`popgrad.model.reduced`)."""
        P = first_layer_attention(A1)
        out = np.empty(self.n)
        for lo in range(0, self.n, 2**15):
            hi = min(lo + 2**15, self.n)
            f = _predict(P, np.asarray(A2, dtype=np.float64), self.sample.seqs[lo:hi])
            out[lo:hi] = _cross_entropy(self.sample.targets[lo:hi], f, self.eps)
        return out

    def loss(self, A1, A2) -> Estimate:
        """The sampled population loss at ``(A1, A2)`` with its standard error."""
        return estimate(self.per_sequence_losses(A1, A2))


def _cross_entropy(y, f, eps) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(y > 0, y * np.log(f + eps), 0.0)
    return -terms.sum(axis=1)


def _in_span(A2) -> bool:
    A2 = np.asarray(A2)
    S = A2.shape[0]
    eye = np.eye(S, dtype=bool)
    d, o = A2[eye], A2[~eye]
    scale = max(1.0, float(np.abs(A2).max()))
    return bool(np.ptp(d) <= 1e-12 * scale and (o.size == 0 or np.ptp(o) <= 1e-12 * scale))


def default_samples(task: Task, A1, A2, eps=None, se_target: float = DEFAULT_SE_TARGET, seed: int = 2**31 - 7,
                    pilot: int = 4096) -> tuple:
    """Sample size for a Stage-2 loss standard error ``≤ se_target``, from a pilot sample.

    The per-sequence loss's standard deviation ``σ`` is measured on ``pilot``
    draws (a seed distinct from the run's) at the start of Stage 2 and at the
    construction ``A2 = 3·I`` (the loss spread grows as ``A2`` sharpens);
    ``n = ceil((1.2·max σ / se_target)²)``, clipped to
    ``[MIN_SAMPLES, MAX_SAMPLES]``. Returns ``(n, σ_max)``.
    """
    obj = SampledObjective(task, pilot, seed, eps, project=False)
    S = task.S
    sig = max(float(obj.per_sequence_losses(A1, A2).std(ddof=1)),
              float(obj.per_sequence_losses(A1, 3.0 * np.eye(S)).std(ddof=1)))
    n = int(math.ceil((1.2 * sig / se_target) ** 2))
    return int(min(max(n, MIN_SAMPLES), MAX_SAMPLES)), sig


def _listed_atoms(task: Task):
    """``(parents, mu, atoms, weights)`` of every atom when they can be listed, else ``None``."""
    prior = task.prior
    if task.continuous or prior.K > MAX_CLOSURE_ATOMS:
        return None
    return task.kernel_arrays()


def sampled_reference_losses(objective: SampledObjective, A1, A2) -> dict:
    """Reference losses and the model's loss on the objective's sample (common random numbers).

    Returns a dict of :class:`Estimate` dicts: ``L_model`` (at ``A1, A2``),
    ``L_count`` (count estimator), ``L_bayes_eps`` (posterior predictive over
    every atom, when they can be listed and ``K·n ≤ BAYES_MAX_WORK``, else a
    ``reason``), and the differences ``model_minus_count``,
    ``model_minus_bayes_eps`` with their own standard errors.
    """
    task, eps = objective.task, objective.eps
    seqs, y = objective.sample.seqs, objective.sample.targets
    model = objective.per_sequence_losses(A1, A2)
    count = _cross_entropy(y, count_estimator_predict(task.graph, seqs, task.S), eps)
    out = {"L_model": estimate(model).to_dict(), "L_count": estimate(count).to_dict(),
           "model_minus_count": estimate(model - count).to_dict()}
    listed = _listed_atoms(task)
    if task.continuous:  # the exact posterior predictive from the sufficient statistics (DESIGN §20)
        w = task._continuous_rows(np.ascontiguousarray(seqs))[0]
        bayes = _cross_entropy(y, w / w.sum(axis=1, keepdims=True), eps)
        out["L_bayes_eps"] = estimate(bayes).to_dict()
        out["model_minus_bayes_eps"] = estimate(model - bayes).to_dict()
    elif listed is not None and listed[2].shape[0] * objective.n <= BAYES_MAX_WORK:
        parents, mu, atoms, prior_w = listed
        w = np.empty((objective.n, task.S))
        _weights.rows_weights(np.ascontiguousarray(seqs), parents, mu, atoms, prior_w, w)
        post = w / w.sum(axis=1, keepdims=True)
        bayes = _cross_entropy(y, post, eps)
        out["L_bayes_eps"] = estimate(bayes).to_dict()
        out["model_minus_bayes_eps"] = estimate(model - bayes).to_dict()
    else:
        reason = (f"the Bayes predictive needs the posterior over all K = {task.prior.K:,} atoms per sequence "
                  f"(n = {objective.n:,}); not computed")
        out["L_bayes_eps"] = {"value": None, "se": None, "n": objective.n, "kind": "sampled", "reason": reason}
        out["model_minus_bayes_eps"] = dict(out["L_bayes_eps"])
    return out


def quantile_interval(values, q: float, level: float = 0.95) -> dict:
    """The ``q``-quantile of an i.i.d. sample with its exact distribution-free confidence interval.

    The number ``B`` of sample points below the true quantile is ``Binomial(n, q)`` (a continuous
    distribution), and ``x_(l) ≤ ξ_q ≤ x_(u)`` (1-based order statistics) exactly when ``l ≤ B ≤ u - 1``.
    ``l`` is the largest with ``P(B < l) ≤ (1 - level)/2`` and ``u`` the smallest with ``P(B ≥ u) ≤
    (1 - level)/2`` (``scipy.stats.binom.ppf``), so the coverage is at least ``level`` at every ``n``. When
    the sample is too small for an end (``l = 0``, or ``u > n``: e.g. ``n = 100``, ``q = 0.99``, where the
    normal approximation's interval, clipped to the sample's maximum, covered 62 %), that end is
    ``∓inf``: the sample does not bound the quantile on that side.
    """
    from scipy.stats import binom

    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    tail = (1.0 - level) / 2.0
    lo = int(binom.ppf(tail, n, q))  # l: P(B < l) = cdf(l - 1) < tail
    hi = int(binom.ppf(1.0 - tail, n, q)) + 1  # u: P(B >= u) = 1 - cdf(u - 1) <= tail
    ci_low = float(x[lo - 1]) if lo >= 1 else -math.inf
    ci_high = float(x[hi - 1]) if hi <= n else math.inf
    k = int(min(n - 1, max(0, math.ceil(n * q) - 1)))
    return {"value": float(x[k]), "ci_low": ci_low, "ci_high": ci_high, "level": level, "n": int(n),
            "kind": "sampled"}
