"""Out-of-distribution generalization ("Knowl 4"), exact for the task's finite prior.

:func:`check_ood`: for a ``π̃`` outside the prior's support with
``min π̃ ≥ γ/S``, the exact 0.99-quantile of ``sup_c |f(s)_c - π̃(c | s_{T-1})|``
compared with the same quantile of references that can fail (module
constants and DESIGN §15).
"""
from __future__ import annotations

import numpy as np

from .._validation import as_real, as_square
from ..model.reduced import predict
from ..task.priors import stationary_distribution
from ..task.tasks import Task, decode_sequences
from . import _kernels
from ._common import _as_A1, _as_A2, _check_task, _hypotheses
from .hypotheses import within_hypotheses
from .results import CheckResult, fit_power_law, not_applicable

__all__ = ["ood_transition", "sup_error_distribution", "ood_verdict", "check_ood", "SHRINK_RTOL"]


def ood_transition(S: int, gamma: float = 0.3, seed: int = 2**31 - 1) -> np.ndarray:
    """A transition matrix ``π̃ = (1-γ)·D + γ·11ᵀ/S`` with ``D`` a Dirichlet(1) draw.

    ``min π̃ ≥ γ/S`` by construction; the seed is distinct from the prior's.
    """
    rng = np.random.default_rng(seed)
    D = rng.dirichlet(np.ones(S), size=S)
    pi = (1 - gamma) * D + gamma / S
    return pi / pi.sum(axis=1, keepdims=True)


def _weighted_quantile(values, weights, q):
    # = values[order][min(searchsorted(cumsum(weights[order]), q * total), n - 1)] with
    # order = argsort(values, kind="stable"): same sums, same bits, no n-long temporaries
    return float(_kernels.weighted_quantile(np.ascontiguousarray(values, dtype=np.float64),
                                            np.ascontiguousarray(weights, dtype=np.float64), float(q)))


def sup_error_distribution(task: Task, A1, A2, atoms, atom_weights):
    """Exact distribution of ``sup_c |f(s)_c - π(c | s_{T-1})|`` under a finite set of ``π``.

    Returns ``(errors, probabilities)``, each flattened over (atom, sequence).
    """
    task.check_size()
    atoms = np.ascontiguousarray(atoms, dtype=float)
    mu = stationary_distribution(atoms)
    parents = np.ascontiguousarray(task.graph.parents, dtype=np.int64)
    errs, probs = [], []
    S, T = task.S, task.T
    for start in range(0, task.n_sequences, 2**15):
        seqs = decode_sequences(start, min(start + 2**15, task.n_sequences), S, T)
        f = predict(A1, A2, seqs)
        q = seqs[:, -1]
        # p[k, m]: probability of seqs[m] under atom k alone (bit-identical to sequence_weights_numpy)
        p = np.empty((atoms.shape[0], len(seqs)))
        _kernels.atom_prefix_probs(seqs, parents, mu, atoms, p)
        if S < 8:  # same arithmetic as the NumPy loop below, in one kernel
            e, pr = np.empty_like(p), np.empty_like(p)
            _kernels.sup_error_rows(f, q, atoms, p, np.asarray(atom_weights, dtype=float), e, pr)
            errs.extend(e)
            probs.extend(pr)
            continue
        for k in range(atoms.shape[0]):
            errs.append(np.abs(f - atoms[k][q]).max(axis=1))
            probs.append(atom_weights[k] * (p[k][:, None] * atoms[k][q]).sum(axis=1))
    return np.concatenate(errs), np.concatenate(probs)


#: "Shrinks": the last value is below the first by more than this fraction (rounding is not a trend).
SHRINK_RTOL = 1e-9

#: Knowl 4: the out-of-distribution error is of the order of the in-distribution error; popgrad reads
#: "of the order" as a ratio of the 0.99-quantiles at most this.
OOD_RATIO = 2.0


def _ood_quantiles(task, A1, A2, pi_ood, quantile):
    e_ood, p_ood = sup_error_distribution(task, A1, A2, pi_ood[None], np.ones(1))
    e_in, p_in = sup_error_distribution(task, A1, A2, task.prior.atoms, task.prior.weights)
    return (_weighted_quantile(e_ood, p_ood, quantile), _weighted_quantile(e_in, p_in, quantile),
            float(e_ood @ p_ood / p_ood.sum()), float(e_in @ p_in / p_in.sum()))


def ood_verdict(name, statement, T, t_eff, q_ood, q_in, details, kind="exact") -> CheckResult:
    """The Knowl 4 verdict from the OOD and in-distribution quantiles at one or more ``T`` (the task's last).

    Value: ``q_ood / q_in`` at the task's ``T``, threshold :data:`OOD_RATIO` (``≤``: the OOD error is of
    the order of the in-distribution error). With two or more ``T`` the OOD quantile must also shrink
    with ``T_eff`` (fitted exponent ``< 0``, last below first); a sweep where it does not is a
    ``"fail"``. With one ``T`` the trend is not measured: the ratio alone decides, and the details say so.
    """
    ratio = q_ood[-1] / q_in[-1] if q_in[-1] > 0 else float("inf")
    details = dict(details, ood_in_ratio=ratio, ratio_threshold=OOD_RATIO)
    ok = bool(ratio <= OOD_RATIO)
    if len(T) >= 2:
        fit = fit_power_law(t_eff, q_ood)
        shrinks = bool(q_ood[-1] < q_ood[0] * (1 - SHRINK_RTOL) and fit.exponent < 0)
        details.update(sweep_T=list(T), sweep_t_eff=list(t_eff), sweep_ood_quantile=list(q_ood),
                       sweep_in_distribution_quantile=list(q_in), ood_quantile_exponent=fit.exponent,
                       ood_quantile_exponent_stderr=fit.stderr, ood_quantile_shrinks=shrinks)
        ok = ok and shrinks
    else:
        details["trend"] = "not measured (one T): the ratio alone decides"
    return CheckResult(name, float(ratio), OOD_RATIO, ok, "<=", statement, details, kind=kind)


def check_ood(task: Task, A1, A2, pi_ood=None, gamma: float = 0.3, quantile: float = 0.99, sweep=None,
              hypotheses="auto") -> CheckResult:
    """Out-of-distribution generalization ("Knowl 4").

    For a transition matrix ``π̃`` outside the prior's support with ``min π̃ ≥ γ/S``: the exact
    ``quantile`` of ``sup_c |f(s)_c - π̃(c|s_{T-1})|`` over sequences drawn from ``π̃`` (``q_ood``),
    and the same for in-distribution ``π`` (``q_in``, the prior's atoms with their weights).
    Knowl 4: ``q_ood`` is of the order of ``q_in`` and shrinks as ``T_eff`` grows. Value:
    ``q_ood / q_in``, threshold :data:`OOD_RATIO`; with ``sweep`` (a list of ``(task_T, A1_T, A2_T)``
    trained at smaller ``T``, e.g. :func:`loss_sweep`'s ``params``) ``q_ood`` must also shrink over
    the sweep (:func:`ood_verdict`). ``"not_applicable"`` when the graph has no non-root (nothing
    learned); ``"inconclusive"`` when a Knowl 10 assumption fails (``hypotheses``).
    """
    _check_task(task)
    A1, A2 = _as_A1(task, A1), _as_A2(task, A2)
    S = task.S
    if pi_ood is None:
        pi_ood = ood_transition(S, as_real(gamma, "gamma", minimum=0, strict=True))
    pi_ood = as_square(pi_ood, "pi_ood")
    if pi_ood.shape != (S, S):
        raise ValueError(f"pi_ood must be an S×S transition matrix, S = {S}, got shape {pi_ood.shape}")
    if np.any(pi_ood < 0) or not np.allclose(pi_ood.sum(axis=1), 1.0, atol=1e-9):
        raise ValueError("pi_ood must be a transition matrix: non-negative entries, rows summing to 1")
    quantile = as_real(quantile, "quantile", minimum=0)
    if quantile > 1:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    statement = ("sup_c |f(s)_c - pi~(c|s_T)| for an unseen pi~ with min pi~ >= gamma/S is of the order of the "
                 "in-distribution error and shrinks with T_eff (Knowl 4)")
    if task.graph.non_roots.size == 0:
        return not_applicable("ood_generalization", statement,
                              "the graph has no non-root position: nothing in context to learn, so nothing "
                              "to generalize")
    points = [(t, a1, a2) for (t, a1, a2) in (sweep or []) if t.T < task.T] + [(task, A1, A2)]
    T, te, qo, qi = [], [], [], []
    for t, a1, a2 in points:
        q_ood, q_in, m_ood, m_in = _ood_quantiles(t, a1, a2, pi_ood, quantile)
        T.append(int(t.T))
        te.append(float(t.t_eff))
        qo.append(q_ood)
        qi.append(q_in)
    details = {
        "quantile": quantile,
        "ood_quantile": qo[-1],
        "ood_mean": m_ood,
        "in_distribution_quantile": qi[-1],
        "in_distribution_mean": m_in,
        "pi_ood": pi_ood,
        "pi_ood_min_times_S": float(pi_ood.min() * S),
        "pi_ood_distance_to_prior_support": float(
            np.abs(task.prior.atoms - pi_ood[None]).max(axis=(1, 2)).min()
        ),
    }
    res = ood_verdict("ood_generalization", statement, T, te, qo, qi, details)
    return within_hypotheses(res, _hypotheses(task, hypotheses))

