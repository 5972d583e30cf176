"""Out-of-distribution generalization ("Knowl 4"), exact for the task's finite prior.

:func:`check_ood`: for a ``π̃`` outside the prior's support with
``min π̃ ≥ γ/S``, the exact 0.99-quantile of ``sup_c |f(s)_c - π̃(c | s_{T-1})|``
compared with the same quantile of references that can fail (module
constants and DESIGN §15).
"""
from __future__ import annotations

import numpy as np

from .._validation import as_real, as_square
from ..engine.baselines import count_estimator_predict
from ..model.reduced import predict
from ..task.priors import stationary_distribution
from ..task.tasks import Task, decode_sequences
from . import _kernels
from ._common import _as_A1, _as_A2, _check_task, _hypotheses
from .hypotheses import within_hypotheses
from .results import CheckResult, fit_power_law, inconclusive, not_applicable

__all__ = ["ood_transition", "sup_error_distribution", "ood_verdict", "check_ood", "SHRINK_RTOL", "OOD_FRACTION",
           "in_distribution_quantile", "IN_DISTRIBUTION_PAIRS", "context_free_table", "context_free_loss", "context_free_predictor", "count_predictor"]


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


def sup_error_distribution(task: Task, A1, A2, atoms, atom_weights, predictor=None):
    """Exact distribution of ``sup_c |f(s)_c - π(c | s_{T-1})|`` under a finite set of ``π``.

    ``f`` is the reduced model at ``(A1, A2)``, or ``predictor(seqs) -> f`` (``(n, S)``) when given
    (then ``A1``, ``A2`` are not read). Returns ``(errors, probabilities)``, each flattened over
    (atom, sequence).
    """
    task.check_size()
    atoms = np.ascontiguousarray(atoms, dtype=float)
    mu = stationary_distribution(atoms)
    parents = np.ascontiguousarray(task.graph.parents, dtype=np.int64)
    errs, probs = [], []
    S, T = task.S, task.T
    for start in range(0, task.n_sequences, 2**15):
        seqs = decode_sequences(start, min(start + 2**15, task.n_sequences), S, T)
        f = predict(A1, A2, seqs) if predictor is None else np.ascontiguousarray(predictor(seqs), dtype=np.float64)
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
        aw = np.asarray(atom_weights, dtype=float)
        kb = max(1, 2**21 // (len(seqs) * S))  # atoms per NumPy block: the same rows, reduced the same way
        for k0 in range(0, atoms.shape[0], kb):
            a = atoms[k0:k0 + kb][:, q]  # (kb, n, S): π_k(· | q_m)
            errs.extend(np.abs(f[None] - a).max(axis=2))
            probs.extend(aw[k0:k0 + kb, None] * (p[k0:k0 + kb, :, None] * a).sum(axis=2))
    return np.concatenate(errs), np.concatenate(probs)


#: The in-distribution errors of :func:`check_ood` are held at once for at most this many (atom, sequence)
#: pairs (then :func:`sup_error_distribution` and one weighted quantile, the same bits as ever); past it they
#: are streamed over chunks of atoms of about this many pairs (:func:`in_distribution_quantile`), so a
#: relabeling closure of 40,320 atoms needs memory for one chunk, not for 165 million pairs.
IN_DISTRIBUTION_PAIRS = 2**22
_BINS = 4096


def in_distribution_quantile(task, A1, A2, quantile: float) -> tuple:
    """``(q_in, m_in)``: the ``quantile`` and the mean of :func:`sup_error_distribution` over the task's own
    atoms, in memory for one chunk of atoms (:data:`IN_DISTRIBUTION_PAIRS`).

    Small enough (``K · S**T`` pairs at most :data:`IN_DISTRIBUTION_PAIRS`): the whole distribution and one
    weighted quantile. Past it: exact selection by passes over chunks of atoms -- the total weight, then a
    histogram of the weights over a value range that shrinks around the quantile until the range holds at
    most :data:`IN_DISTRIBUTION_PAIRS` pairs (or a single value), whose candidates are sorted and summed from
    the weight below the range (three passes when the errors are spread), each pass in the one kernel
    (for ``S ≥ 8`` its label sums run in order, not NumPy's pairwise order: a weight within an ulp). The same
    quantile as the whole-distribution rule, except where a running sum is within rounding of
    ``quantile · total`` (the sums run in another order); the mean within rounding.
    """
    atoms, weights = task.prior.atoms, task.prior.weights
    K, n = atoms.shape[0], task.n_sequences
    if K * n <= IN_DISTRIBUTION_PAIRS:
        e, p = sup_error_distribution(task, A1, A2, atoms, weights)
        return _weighted_quantile(e, p, quantile), float(e @ p / p.sum())
    atoms = np.ascontiguousarray(atoms, dtype=float)
    weights = np.asarray(weights, dtype=float)
    mu = stationary_distribution(atoms)
    parents = np.ascontiguousarray(task.graph.parents, dtype=np.int64)
    S, T = task.S, task.T
    rows = min(n, 2**15)
    # atoms per chunk: the chunk's pairs within the budget, its matrices within a core's cache (256 KB)
    per = max(1, min(IN_DISTRIBUTION_PAIRS // rows, 2**18 // (8 * S * S)))

    def chunks():  # the pairs of sup_error_distribution, sequences outer (one prediction each), atoms inner
        for start in range(0, n, rows):
            seqs = decode_sequences(start, min(start + rows, n), S, T)
            f = np.ascontiguousarray(predict(A1, A2, seqs), dtype=np.float64)
            q = seqs[:, -1]
            for k0 in range(0, K, per):
                a = atoms[k0:k0 + per]
                p = np.empty((a.shape[0], len(seqs)))
                _kernels.atom_prefix_probs(seqs, parents, mu[k0:k0 + per], a, p)
                e, pr = np.empty_like(p), np.empty_like(p)
                _kernels.sup_error_rows(f, q, a, p, weights[k0:k0 + per], e, pr)
                e = e.ravel()
                yield np.where(np.isnan(e), np.inf, e), pr.ravel()  # NaN sorts last, as in the whole rule

    total = ep = None
    nan = False
    lo, hi = 0.0, 1.0  # sup errors of probability vectors; anything else lands in the end bins
    for _ in range(64):  # each pass narrows the range 1365-fold; floats run out long before 64
        if lo > hi:
            break
        binw = np.zeros(_BINS + 2)  # bin 0: below lo; 1..BINS: [lo, hi]; BINS + 1: above hi (and inf)
        count = np.zeros(_BINS + 2, dtype=np.int64)
        first = total is None
        if first:
            total = ep = 0.0
        for e, p in chunks():
            if first:  # the first pass also sums the total weight and the mean
                fin = np.isfinite(e)
                total += float(p.sum())
                ep += float(e[fin] @ p[fin])
                nan = nan or not fin.all()
            idx = np.ones(e.shape, dtype=np.int64)
            if hi > lo:
                with np.errstate(invalid="ignore"):
                    idx = np.clip(np.floor((e - lo) / (hi - lo) * _BINS), 0, _BINS - 1).astype(np.int64) + 1
            idx = np.where(e < lo, 0, np.where(e > hi, _BINS + 1, idx))
            binw += np.bincount(idx, weights=p, minlength=_BINS + 2)
            count += np.bincount(idx, minlength=_BINS + 2)
        if first:
            target = quantile * total
            mean = float("nan") if nan else ep / total
        # the first bin holding a value whose running sum reaches the target (zero-weight values count, as in
        # the sorted rule); past every finite error (up to rounding): a NaN error, else the largest finite one
        held = count > 0
        reach = np.flatnonzero((np.cumsum(binw) >= target) & held)
        b = int(reach[0]) if reach.size else _BINS + 1
        if b > _BINS:
            if nan:
                return float("nan"), mean
            b = int(np.flatnonzero(held[:_BINS + 1])[-1])
        if hi == lo:
            return lo, mean
        if count[1:_BINS + 1].sum() <= IN_DISTRIBUTION_PAIRS:  # the candidates fit what one chunk holds
            return _collect(chunks, lo, hi, target), mean
        # the quantile lies in bin b up to rounding of the sums (which run in another order): keep b-1 .. b+1
        width = (hi - lo) / _BINS
        b = max(b, 1)
        lo, hi = lo + max(b - 2, 0) * width, min(hi, lo + (b + 1) * width)
    return (_collect(chunks, lo, hi, target) if lo <= hi else float("nan")), mean


def _collect(chunks, lo, hi, target):
    """The candidates in ``[lo, hi]`` sorted, summed from the weight below ``lo``: the first reaching ``target``."""
    below = 0.0
    vals, ws = [], []
    for e, p in chunks():
        below += float(p[e < lo].sum())
        inside = (e >= lo) & (e <= hi)
        vals.append(e[inside])
        ws.append(p[inside])
    v, w = np.concatenate(vals), np.concatenate(ws)
    if not v.size:
        return float("nan")
    order = np.argsort(v, kind="stable")
    cw = below + np.cumsum(w[order])
    i = int(min(np.searchsorted(cw, target, "left"), len(v) - 1))
    return float(v[order][i])


def context_free_table(task, joint: bool = False):
    """``p(c | q)``, ``(S, S)``: the best predictor that sees the query token ``q = s_{T-1}`` only (exact, from
    the task's weights; uniform under a uniform-mean, relabeling-closed prior). ``joint=True`` also returns
    the joint ``p(q, c)`` (the weights summed by query token)."""
    S = task.S
    W = np.zeros((S, S))
    for seqs, w in task.enumerate(chunk_size=2**15):
        np.add.at(W, seqs[:, -1], w)
    tot = W.sum(axis=1, keepdims=True)
    table = np.where(tot > 0, W / np.where(tot > 0, tot, 1.0), 1.0 / S)
    return (table, W) if joint else table


def context_free_loss(task, eps: float) -> float:
    """Exact ε-loss ``-Σ_{q,c} p(q, c) log(p(c|q) + ε)`` of :func:`context_free_table`'s predictor."""
    table, W = context_free_table(task, joint=True)
    return float(-np.sum(W * np.log(table + eps)))


def context_free_predictor(table):
    """``seqs -> table[s_{T-1}]``: the context-free predictor of :func:`context_free_table`."""
    table = np.asarray(table, dtype=np.float64)
    return lambda seqs: table[np.asarray(seqs)[:, -1]]


def count_predictor(graph, S, model_limit=True):
    """``seqs -> f``: the in-context count estimator of Knowl 8
    (:func:`popgrad.engine.baselines.count_estimator_predict`); ``model_limit=True`` (default): the limit
    the reduced model approaches at Knowl 8's construction (the matching positions plus the roots whose
    prefix is the query token), ``False``: the estimator proper."""
    return lambda seqs: count_estimator_predict(graph, seqs, S, model_limit=model_limit)


#: "Shrinks": the last value is below the first by more than this fraction (rounding is not a trend).
SHRINK_RTOL = 1e-9

#: Knowl 4: the trained model's out-of-distribution error must be closer to the construction's (the count
#: estimator in the model's limit) than to the best context-free predictor's: value ``(q - q_count) / (q_cf - q_count) <= 1/2``.
OOD_FRACTION = 0.5

#: The in/out-of-distribution ratio of the 0.99-quantiles (reported in the details; it decides nothing: a model
#: that learned nothing has a ratio near 1).
OOD_RATIO = 2.0


def _quantile(task, pi_ood, quantile, A1=None, A2=None, predictor=None):
    e, p = sup_error_distribution(task, A1, A2, pi_ood[None], np.ones(1), predictor)
    return _weighted_quantile(e, p, quantile), float(e @ p / p.sum())


def ood_verdict(name, statement, T, t_eff, q_model, q_count, q_cf, details, kind="exact",
                interval=None) -> CheckResult:
    """The Knowl 4 verdict (DESIGN §15) from the out-of-distribution quantiles of the model (at every ``T`` of
    the sweep, the task's last) and of the two references at the task's ``T``.

    Value: ``(q_model − q_count) / (q_cf − q_count)``: 0 for Knowl 8's construction (``q_count``: the count
    estimator in the limit the reduced model reaches, :func:`count_predictor`), 1
    for the best context-free predictor; threshold :data:`OOD_FRACTION`. When the construction is no better
    than context-free (``q_count ≥ q_cf``, small ``T_eff``) no threshold separates learning from not
    learning: the verdict is ``"inconclusive"`` (pre-asymptotic; value ``q − q_cf``). With two or more ``T`` the model's quantile must also shrink with ``T_eff``
    (fitted exponent ``< 0``, last below first). ``interval`` (sampled): the ``(low, high)`` 95 % interval
    of ``q_model``; then pass needs ``high`` at or below the threshold quantile and fail ``low`` above it,
    else inconclusive.
    """
    gap = q_cf - q_count
    thr_q = q_count + OOD_FRACTION * gap
    value = (q_model[-1] - q_count) / gap if gap > 0 else float("nan")
    qq = details.get("quantile", 0.99)
    rule = (f"passes when (q - q_count) / (q_cf - q_count) <= {OOD_FRACTION:g} (q the model's {qq:g}-quantile of "
            "sup_c |f - pi~|; q_count Knowl 8's construction's, q_cf the context-free predictor's)")
    details = dict(details, ood_quantile_construction=q_count, ood_quantile_context_free=q_cf,
                   ood_quantile_threshold=thr_q, rule=rule)
    ok = bool(gap > 0 and value <= OOD_FRACTION)
    if len(T) >= 2:
        fit = fit_power_law(t_eff, q_model)
        shrinks = bool(q_model[-1] < q_model[0] * (1 - SHRINK_RTOL) and fit.exponent < 0)
        details.update(sweep_T=list(T), sweep_t_eff=list(t_eff), sweep_ood_quantile=list(q_model),
                       ood_quantile_exponent=fit.exponent, ood_quantile_exponent_stderr=fit.stderr,
                       ood_quantile_shrinks=shrinks)
        details["rule"] = rule + ", and q shrinks over the T sweep"
        ok = ok and shrinks
    else:
        details["trend"] = "not measured (one T): the comparison with the references alone decides"
    if not gap > 0:
        # the construction Knowl 4's model approaches does not separate from context-free at this T: the theorem
        # is asymptotic, so a model's OOD error cannot tell learning from not learning here (a model worse than
        # context-free is what every in-context estimator is at small T_eff); never decided
        q = q_model[-1]
        details["rule"] = (f"the construction is no better than the context-free predictor here (q_count = "
                           f"{q_count:.4g} >= q_cf = {q_cf:.4g}): no threshold separates learning from not "
                           "learning at this T_eff, so the check is not decided (value q - q_cf)")
        res = CheckResult(name, float(q - q_cf), 0.0, False, "<", statement, details, kind=kind)
        return inconclusive(res, f"pre-asymptotic: the construction (count estimator) is no better than the "
                                 f"context-free predictor out of distribution at T = {T[-1]} (0.99-quantiles "
                                 f"{q_count:.3g} >= {q_cf:.3g}; the model's {q:.3g}): Knowl 4 is a large-T_eff "
                                 "statement, raise T")
    res = CheckResult(name, float(value), OOD_FRACTION, ok, "<=", statement, details, kind=kind)
    if interval is not None:
        lo, hi = interval
        details["rule"] = (details["rule"] + f"; sampled: decided when the 95% interval of q, [{lo:.4g}, {hi:.4g}], "
                           f"lies on one side of q_count + {OOD_FRACTION:g}(q_cf - q_count) = {thr_q:.4g}")
        res = res._replace(details=details)
        if lo <= thr_q < hi:
            return inconclusive(res, f"sampled quantile not resolved: its 95% interval [{lo:.4g}, {hi:.4g}] "
                                     f"contains the threshold {thr_q:.4g}; use more samples")
    return res


def check_ood(task: Task, A1, A2, pi_ood=None, gamma: float = 0.3, quantile: float = 0.99, sweep=None,
              hypotheses="auto") -> CheckResult:
    """Out-of-distribution generalization ("Knowl 4"; DESIGN §15).

    For a transition matrix ``π̃`` outside the prior's support with ``min π̃ ≥ γ/S``: the exact
    ``quantile`` of ``sup_c |f(s)_c - π̃(c|s_{T-1})|`` over sequences drawn from ``π̃`` for the trained
    model (``q``), for Knowl 8's construction (``q_count``: the count estimator in the limit the theorem's
    model approaches, :func:`count_predictor`; the estimator proper is in the details) and for the best context-free predictor ``p(·|s_{T-1})`` (``q_cf``: what a model that
    ignores the context can do). Value: ``(q − q_count)/(q_cf − q_count)``, threshold
    :data:`OOD_FRACTION` (:func:`ood_verdict`); a model no better than the context-free predictor fails.
    With ``sweep`` (a list of ``(task_T, A1_T, A2_T)`` trained at smaller ``T``, e.g. :func:`loss_sweep`'s
    ``params``) ``q`` must also shrink over the sweep. The in-distribution quantile and the old ratio are in
    the details. ``"not_applicable"`` when the graph has no non-root (nothing learned); ``"inconclusive"``
    when the references do not separate (small ``T_eff``) or a Knowl 10 assumption fails (``hypotheses``).
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
    statement = ("sup_c |f(s)_c - pi~(c|s_T)| for an unseen pi~ with min pi~ >= gamma/S is small and shrinks with "
                 "T_eff (Knowl 4): closer to the count estimator's than to the context-free predictor's")
    if task.graph.non_roots.size == 0:
        return not_applicable("ood_generalization", statement,
                              "the graph has no non-root position: nothing in context to learn, so nothing "
                              "to generalize")
    points = [(t, a1, a2) for (t, a1, a2) in (sweep or []) if t.T < task.T] + [(task, A1, A2)]
    T, te, qo = [], [], []
    for t, a1, a2 in points:
        T.append(int(t.T))
        te.append(float(t.t_eff))
        qo.append(_quantile(t, pi_ood, quantile, a1, a2)[0])
    m_ood = _quantile(task, pi_ood, quantile, A1, A2)[1]
    q_count, m_count = _quantile(task, pi_ood, quantile, predictor=count_predictor(task.graph, S))
    q_est = _quantile(task, pi_ood, quantile, predictor=count_predictor(task.graph, S, model_limit=False))[0]
    table = context_free_table(task)
    q_cf, m_cf = _quantile(task, pi_ood, quantile, predictor=context_free_predictor(table))
    if task.continuous:  # no atoms to weigh the in-distribution errors by; every π̃ lies in the Dirichlet's support
        q_in = m_in = distance = None
    else:
        q_in, m_in = in_distribution_quantile(task, A1, A2, quantile)  # streamed over atoms past a size
        distance = float(np.abs(task.prior.atoms - pi_ood[None]).max(axis=(1, 2)).min())
    details = {
        "quantile": quantile,
        "ood_quantile": qo[-1],
        "ood_mean": m_ood,
        "ood_mean_construction": m_count,
        "ood_quantile_count_estimator_proper": q_est,
        "ood_mean_context_free": m_cf,
        "context_free_table": table,
        "in_distribution_quantile": q_in,
        "in_distribution_mean": m_in,
        "ood_in_ratio": None if q_in is None else qo[-1] / q_in if q_in > 0 else float("inf"),
        "pi_ood": pi_ood,
        "pi_ood_min_times_S": float(pi_ood.min() * S),
        "pi_ood_distance_to_prior_support": distance,
    }
    if task.continuous:
        details["in_distribution_note"] = ("not computed: the continuous prior has no atoms to weigh the "
                                           "in-distribution errors by, and its support (every transition matrix) "
                                           "contains pi~; the verdict uses q, q_count and q_cf only")
    res = ood_verdict("ood_generalization", statement, T, te, qo, q_count, q_cf, details)
    return within_hypotheses(res, _hypotheses(task, hypotheses))
