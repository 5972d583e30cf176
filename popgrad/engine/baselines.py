"""Reference losses (DESIGN §7), exact for the finite prior, for every task kind.

These sit beside the engine, not in :mod:`popgrad.theory`: all but the
single-parent ``L*`` enumerate the ``S**T`` sequences (or their orbits), and
the construction loss *is* an engine call. ``popgrad.theory.baselines`` and
the names on ``popgrad.theory`` still import, with a ``DeprecationWarning``,
for one release.

* :func:`optimal_loss` ``L* = -E_π[(1/S) Σ_{a,b} π(b|a) log π(b|a)]`` (knows π);
* :func:`bayes_loss` ``H(y | s) = -Σ_s Σ_c w log(w / Σ_c' w)``;
* :func:`count_estimator_loss`: the in-context transition-count estimator of
  "Knowl 8", and :func:`construction_loss`: the model's exact loss at
  ``A1 = β1·adjacency``, ``A2 = β2·I``.

``L* ≤ L_Bayes ≤ L(A1, A2)`` when ``ε = 0``.

For k-parent tasks (DESIGN §9) the same functions compute:
* :func:`optimal_loss`: ``L* = -E_{π,s}[Σ_c π(c|s_tp) log π(c|s_tp)]`` (knows π);
* :func:`bayes_loss`: ``H(y | s) = -Σ_s Σ_c w log(w / Σ_c' w)``;
* :func:`count_estimator_loss`: the multi-parent transition-count
  estimator of "Knowl 9" (or, ``model_limit=True``, the ``β → ∞`` limit of
  the model at the construction);
* :func:`construction_loss`: the model's loss at ``A1^h = β1·adjacency(h)``,
  ``A2^h = β2·I``.

The ``*_multi`` names are deprecated aliases (one release).
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from .._validation import ArgumentTypeError, as_eps, as_real, as_seqs, warn_inf
from ..task import _weights
from ..task.graphs import CausalGraph
from ..task.multigraphs import MultiParentGraph
from ..task.tasks import MultiParentTask, check_task
from .api import exact_loss
from .floor import sum_over_sequences
from .symmetry import weighted_sequences

__all__ = [
    "optimal_loss", "bayes_loss", "count_estimator_predict", "count_estimator_loss", "construction_params",
    "construction_loss",
    "optimal_loss_multi", "bayes_loss_multi", "count_estimator_loss_multi", "construction_loss_multi",
    "count_estimator_predict_multi", "official_bayes_predict", "official_bayes_loss",
]


def optimal_loss(task, eps=0.0) -> float:
    """``L* = -E_π[(1/S) Σ_{a,b} π(b|a) log π(b|a)]``: the loss of a predictor that knows π.

    Exact for the finite prior (a sum over atoms, ``0 log 0 = 0``); no
    enumeration.

    Parameters
    ----------
    task : Task
    eps : float, default 0
        ``0`` gives ``L*`` of DESIGN §7. ``ε > 0`` gives the perturbed loss
        ``-E_π[(1/S) Σ_{a,b} π(b|a) log(π(b|a) + ε)]`` of the same oracle
        predictor, to compare with a model loss at the same ``ε`` (it is
        then not a lower bound). ``None`` means ``task.default_eps``.

    Returns
    -------
    float
    """
    check_task(task)
    eps = as_eps(task, eps)
    if task.continuous:  # every row Dirichlet(α1): E[Σ_b π_b log π_b] = ψ(α+1) - ψ(Sα+1), whatever the row
        a = task.prior.alpha
        if eps != 0:
            return -_size_biased_log_mean(a + 1.0, (task.S - 1) * a, eps)
        from scipy.special import digamma

        return float(digamma(task.S * a + 1.0) - digamma(a + 1.0))
    if isinstance(task, MultiParentTask):
        return _optimal_loss_multi(task, eps)
    atoms, weights, _ = task.prior.invariant_view()  # invariant under relabeling: base draws suffice
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(atoms > 0, atoms * np.log(np.where(atoms > 0, atoms, 1.0) + eps), 0.0)
    return float(-np.dot(weights, plogp.sum(axis=(1, 2))) / task.S)


def _size_biased_log_mean(a, b, eps) -> float:
    """``E[log(X + ε)]``, ``X ~ Beta(a, b)``, by adaptive quadrature (``ε > 0``).

    For one row ``π ~ Dirichlet(α1_S)`` each entry is ``Beta(α, (S-1)α)`` and ``x f(x) Beta(α, β)(x) =
    (α/(α+β)) f(x) Beta(α+1, β)(x)``, so ``E[Σ_b π_b log(π_b + ε)] = S·E[X log(X + ε)] = E[log(X' + ε)]``
    with ``X' ~ Beta(α+1, (S-1)α)``: the continuous prior's ``L*_ε`` is minus this at ``a = α+1``. The
    integrand ``log(x + ε)`` is smooth on ``[0, 1]``; the weight ``x^(a-1) (1-x)^(b-1)`` is integrated by
    QUADPACK's algebraic-weight rule (exact endpoint singularities, ``b < 1``) when an exponent is below 1
    and both are moderate, else as a log-space density over mean ± 40 standard deviations with break points
    around its mass. Either way the integral is divided by the same rule's integral of the weight alone. Checked against the
    ``ε → 0`` closed form and Monte Carlo (tests/engine/test_baselines_continuous.py)."""
    from scipy import integrate
    from scipy.stats import beta as beta_dist

    if a + b >= SERIES_CONCENTRATION:
        return _log_mean_series(a, b, eps)
    f = (lambda x: np.log(x + eps))
    one = (lambda x: 1.0)
    if min(a, b) < 2.0 and max(a, b) <= 20.0:  # an endpoint singularity or kink: the exact algebraic weight
        def integral(g):
            return _checked(integrate.quad(g, 0.0, 1.0, weight="alg", wvar=(a - 1.0, b - 1.0), epsabs=0.0,
                                           epsrel=1e-13, limit=500, full_output=1))
    else:  # a smooth bump (a, b >= 2) or a concentrated one: the log-space density, over its mass
        dist = beta_dist(a, b)
        m, sd = dist.mean(), dist.std()
        lo, hi = max(0.0, m - 40 * sd), min(1.0, m + 40 * sd)  # beyond 40 sd the Beta's mass is below 1e-300
        points = sorted({v for v in (m - 8 * sd, m - 2 * sd, m, m + 2 * sd, m + 8 * sd) if lo < v < hi})

        def integral(g):
            return _checked(integrate.quad(lambda x: g(x) * np.exp(dist.logpdf(x)), lo, hi, points=points or None,
                                           epsabs=0.0, epsrel=1e-13, limit=500, full_output=1))

    return float(integral(f) / integral(one))


#: Largest error estimate (relative, absolute below 1) :func:`_size_biased_log_mean` accepts from QUADPACK (it asks for 1e-13; where
#: rounding stops it short, as in about 1 of 1,500 smooth cases, the estimate is still near 1e-15).
QUAD_RTOL = 1e-11


def _checked(out) -> float:
    """The value of ``quad(..., full_output=1)`` when its error estimate is within :data:`QUAD_RTOL`, else an error."""
    val, err = out[0], out[1]
    if not err <= QUAD_RTOL * max(abs(val), 1.0):  # L*_eps is an O(1) loss: relative, or absolute near 0
        raise ValueError(f"optimal_loss: the quadrature of the continuous prior's L*_eps did not converge (estimate "
                         f"{val!r}, error estimate {err:.3g}): {out[-1] if len(out) > 3 else 'no message'}")
    return float(val)


#: From this ``a + b`` on, :func:`_size_biased_log_mean` sums the series of :func:`_log_mean_series` (the
#: Beta's standard deviation is below ``1/(2√(a+b))``; its fifth-order term is below 1e-16 there).
SERIES_CONCENTRATION = 1e6


def _log_mean_series(a, b, eps) -> float:
    """``E[log(X + ε)]``, ``X ~ Beta(a, b)`` concentrated: ``log c − μ₂/(2c²) + μ₃/(3c³) − μ₄/(4c⁴)``,
    ``c = E[X] + ε``, ``μ_k`` the central moments (exact rational forms)."""
    n = a + b
    m = a / n
    var = a * b / (n * n * (n + 1))
    mu3 = 2 * (b - a) * np.sqrt(n + 1) / ((n + 2) * np.sqrt(a * b)) * var ** 1.5
    kurt = 6 * ((a - b) ** 2 * (n + 1) - a * b * (n + 2)) / (a * b * (n + 2) * (n + 3))  # excess
    mu4 = (kurt + 3) * var * var
    c = m + eps
    return float(np.log(c) - var / (2 * c * c) + mu3 / (3 * c**3) - mu4 / (4 * c**4))


def _optimal_loss_multi(task, eps) -> float:
    """``L* = -E_{π, s}[Σ_c π(c | s_tp) log(π(c | s_tp) + ε)]``: the loss of a predictor that knows ``π``.

    The target's parent tuple is not uniform in general, so unlike
    :func:`popgrad.optimal_loss` this enumerates (the weights kernel with the
    per-row entropies in place of the target distribution).

    Parameters
    ----------
    task : MultiParentTask
    eps : float, default 0
        ``None`` means ``task.default_eps``.
    """
    task.check_size()
    parents, tp, atoms, pk0 = task.kernel_arrays()
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(atoms > 0, atoms * np.log(np.where(atoms > 0, atoms, 1.0) + eps), 0.0)
    ent = np.ascontiguousarray(-plogp.sum(axis=2)[:, :, None])  # (K, S**k, 1)
    total = 0.0
    T = task.T
    chunk = 2**16
    for start in range(0, task.n_sequences, chunk):
        n = min(chunk, task.n_sequences - start)
        seqs, out = np.empty((n, T), dtype=np.int64), np.empty((n, 1))
        _weights.chunk_weights_multi(start, parents, tp, atoms, ent, pk0, seqs, out)
        total += float(out.sum())
    return total


def bayes_loss(task, eps=0.0, symmetry="auto") -> float:
    """Bayes loss ``H(y | s) = -Σ_s Σ_c w(s,c) log(w(s,c) / Σ_c' w(s,c'))``.

    The conditional entropy of the target given the sequence under the
    finite prior: the smallest loss any predictor of ``s`` can reach
    (``ε = 0``). Terms with ``w = 0`` are 0.

    Parameters
    ----------
    task : Task or MultiParentTask
    eps : float, default 0
        ``0`` gives ``H(y | s)`` of DESIGN §7. ``ε > 0`` gives the perturbed
        loss ``-Σ w log(w/Σ_c' w + ε)`` of the same (posterior-predictive)
        predictor, to compare with a model loss at the same ``ε`` (it is
        then not a lower bound). ``None`` means ``task.default_eps``.
    symmetry : {"auto", "off"}, default "auto"
        With a prior exactly closed under relabeling the sum is invariant
        under relabeling ``(s, c) → (σs, σc)``: ``"auto"`` sums over one
        canonical sequence per orbit, times the orbit size (about ``S!``
        fewer terms; equal up to rounding).

    Returns
    -------
    float

    Raises
    ------
    TaskTooLargeError
        If ``S**T`` exceeds ``task.max_sequences``.
    """
    return sum_over_sequences(task, eps, symmetry, _bayes_chunk)


def _bayes_chunk(w, mult, eps) -> float:
    """One chunk's ``-Σ w log(w/Σ_c' w + ε)`` (``x - y`` and ``x + (-y)`` are the same float)."""
    ws = w.sum(axis=1, keepdims=True)
    pos = w > 0
    if mult is None:
        return -float(np.sum(w[pos] * np.log((w / np.where(ws > 0, ws, 1.0))[pos] + eps)))
    terms = np.where(pos, w * np.log(np.where(pos, w / np.where(ws > 0, ws, 1.0), 1.0) + eps), 0.0)
    return -float(terms.sum(axis=1) @ mult)


def count_estimator_predict(graph, seqs, S, model_limit=False) -> np.ndarray:
    """The in-context transition-count estimator of "Knowl 8" for given sequences.

    With ``q = s_{T-1}`` and the graph's edges ``j → i`` (``j = p(i)``)::

        f_c = #{edges j→i : s_j = q, s_i = c} / #{edges j→i : s_j = q}

    When no edge starts at a ``q`` (zero denominator) the estimator is
    replaced by the limit of the model itself (below), so that ``f`` is
    always a distribution.

    **The model limit** (``model_limit=True`` for every sequence): the
    reduced model at ``A1 = β1·adjacency`` (root rows zero) and
    ``A2 = β2·I`` converges, as ``β1, β2 → ∞`` with ``β2·exp(-β1) → 0``, to
    uniform attention over the positions of maximal score, where a non-root
    ``i`` scores ``[s_{p(i)} = q]`` (layer 1 copies the parent) and a root
    ``i`` (its layer 1 averages ``s_0 … s_i``) scores
    ``ρ_i = #{j ≤ i : s_j = q} / (i + 1)``. When some edge matches, that set
    is the matching children *plus* every root whose whole prefix
    ``s_0 … s_i`` equals ``q`` (position 0 whenever ``s_0 = q``): an
    ``O(1/#matches)`` difference from the count estimator that the reduced
    model cannot avoid (``u_0 = A2[q, s_0]`` for every ``A1``). Otherwise the
    set is the roots of largest ``ρ_i`` (the query position is a root with
    ``ρ > 0``).

    Parameters
    ----------
    graph : CausalGraph or MultiParentGraph
        A k-parent graph uses the multi-parent estimator of "Knowl 9"
        (:func:`_count_estimator_predict_multi`).
    seqs : int array, shape (n, T)
    S : int
        Alphabet size.
    model_limit : bool, default False
        Return the model limit for every sequence instead of the estimator.

    Returns
    -------
    f : ndarray of float64, shape (n, S)
    """
    if isinstance(graph, MultiParentGraph):
        return _count_estimator_predict_multi(graph, seqs, S, model_limit)
    parents = np.asarray(graph.parents)
    seqs = np.asarray(seqs, dtype=np.int64)
    n, T = seqs.shape
    q = seqs[:, T - 1]
    nr = np.flatnonzero(parents >= 0)
    roots = np.flatnonzero(parents < 0)
    match = seqs[:, parents[nr]] == q[:, None]  # (n, |nr|)
    is_q = seqs == q[:, None]
    rho = np.cumsum(is_q, axis=1)[:, roots] / (roots + 1.0)  # exact order: distinct rationals, denominators ≤ T
    score = np.zeros((n, T))
    score[:, nr] = match
    score[:, roots] = rho
    top = score == score.max(axis=1, keepdims=True)
    onehot = seqs[:, :, None] == np.arange(S)
    f_limit = np.einsum("ni,nic->nc", top.astype(np.float64), onehot) / top.sum(axis=1)[:, None]
    if model_limit:
        return f_limit
    den = match.sum(axis=1)
    num = np.einsum("ni,nic->nc", match.astype(np.float64), onehot[:, nr, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        f = num / den[:, None]
    empty = den == 0
    f[empty] = f_limit[empty]
    return f


def _count_estimator_predict_multi(graph, seqs, S, model_limit=False) -> np.ndarray:
    """The multi-parent transition-count estimator of "Knowl 9" for given sequences.

    With ``q = (s_{tp_1}, …, s_{tp_k})`` the target's parent tokens and
    ``M(s) = {non-root i ≤ T-2 : s_{p(i)_h} = q_h for every h}``::

        f_c = #{i ∈ M(s) : s_i = c} / |M(s)|

    (the paper counts ``i < T`` in 1-based positions: the last position,
    whose layer-1 row serves the target, is not counted). When ``M(s)`` is
    empty the estimator is replaced by the model limit below.

    **The model limit** (``model_limit=True`` for every sequence): at
    ``A1^h = β1·adjacency(h)`` (root rows zero), ``A2^h = β2·I`` and
    ``β1, β2 → ∞`` with ``β2·exp(-β1) → 0``, the model attends uniformly to
    the positions whose score ``Σ_h H^h_i[q_h]`` is maximal (``= k``): the
    matching non-roots of ``M(s)``, **the last position** (its layer-1 output
    *is* the query: it always matches) and every root ``i < T-1`` whose
    prefix ``s_0 … s_i`` is constant and equal to ``q_1 = … = q_k`` (its
    uniform layer-1 average then matches every head). So the model adds
    ``e_{s_{T-1}}`` (and the rare constant-prefix roots) to the counts, an
    ``O(1/|M|)`` difference from the estimator that the architecture cannot
    avoid.

    Parameters
    ----------
    graph : MultiParentGraph
    seqs : int array (n, T)
    S : int
    model_limit : bool, default False

    Returns
    -------
    f : float64 (n, S)
    """
    seqs = as_seqs(seqs, graph.T, S)
    n, T = seqs.shape
    parents, tp = graph.parents, graph.target_parents
    q = seqs[:, tp]  # (n, k)
    ctx = np.array([i for i in graph.non_roots if i < T - 1], dtype=np.int64)
    root_ctx = np.array([i for i in graph.roots if i < T - 1], dtype=np.int64)
    if ctx.size:
        match = np.all(seqs[:, parents[ctx]] == q[:, None, :], axis=2)  # (n, |ctx|)
    else:
        match = np.zeros((n, 0), dtype=bool)
    onehot = (seqs[:, :, None] == np.arange(S)).astype(np.float64)
    top = np.zeros((n, T), dtype=bool)
    top[:, ctx] = match
    top[:, T - 1] = True
    if root_ctx.size:
        same_q = np.all(q == q[:, :1], axis=1)
        const = np.logical_and.accumulate(seqs == q[:, :1], axis=1)
        top[:, root_ctx] = same_q[:, None] & const[:, root_ctx]
    f_limit = np.einsum("ni,nic->nc", top.astype(np.float64), onehot) / top.sum(axis=1)[:, None]
    if model_limit:
        return f_limit
    den = match.sum(axis=1)
    num = np.einsum("ni,nic->nc", match.astype(np.float64), onehot[:, ctx, :])
    with np.errstate(divide="ignore", invalid="ignore"):
        f = num / den[:, None]
    empty = den == 0
    f[empty] = f_limit[empty]
    return f


def official_bayes_predict(graph, seqs, S, alpha, root_quirk=False) -> np.ndarray:
    """The official code's ``bayes`` estimators (``problems.py``): in-context counts plus ``α``, normalised.

    Default: the *edges-only count estimator*. ``f̂_c(s) = (n[q, c] + α) / (n[q, ·] + Sα)`` with ``n[q, c]``
    the edges ``j → i`` of the context whose parent tokens equal the query's (``s_{T-1}`` for a single parent,
    ``s_tp`` for ``k`` parents) and whose child token is ``c``; roots are not counted (``InContextDAG.bayes``,
    the official multi-parent line, exactly; for a single parent, what ``InContextTree.bayes`` means). Under
    :class:`popgrad.DirichletPrior` with uniform roots (and :class:`popgrad.DirichletTensorPrior`) this *is*
    the exact posterior predictive (conjugacy), so its loss equals :func:`bayes_loss`.

    ``root_quirk=True`` (single parent) reproduces ``InContextTree.bayes`` as written, the official
    single-parent ``bayes`` line: ``seq[dag]`` with ``dag[i] = -1`` reads position ``T-2`` (Python's
    wrap-around of ``-1`` on the context), so every non-query root ``i`` (position 0 included) counts as a
    child of position ``T-2`` whenever ``s_{T-2} = s_{T-1}``.

    Returns ``(n, S)`` float64.
    """
    seqs = np.asarray(seqs, dtype=np.int64)
    n = seqs.shape[0]
    counts = np.zeros((n, S))
    rows = np.arange(n)
    if isinstance(graph, MultiParentGraph):
        par, tp = graph.parents, graph.target_parents
        key = seqs[:, tp]
        for i in range(graph.T):
            if par[i, 0] >= 0 and len(par[i]) == len(tp):
                hit = np.all(seqs[:, par[i]] == key, axis=1)
                counts[rows, seqs[:, i]] += hit
    else:
        par = graph.parents
        T = graph.T
        q = seqs[:, T - 1]
        for i in range(T - 1):
            if par[i] >= 0:
                counts[rows, seqs[:, i]] += seqs[:, par[i]] == q
            elif root_quirk:
                counts[rows, seqs[:, i]] += seqs[:, T - 2] == q
    counts += float(alpha)
    return counts / counts.sum(axis=1, keepdims=True)


def official_bayes_loss(task, eps=0.0, alpha=None, root_quirk=False) -> float:
    """``-Σ_s Σ_c w(s, c) log(f̂_c(s) + ε)`` of :func:`official_bayes_predict`, exact (enumerated).

    Default (``root_quirk=False``): the *edges-only count estimator* (in-context counts of the edges plus
    ``α``; what ``InContextDAG.bayes`` computes, and what ``InContextTree.bayes`` means). ``root_quirk=True``
    (single parent): the official ``bayes`` line as ``InContextTree.bayes`` computes it (``seq[dag]`` with
    ``dag[i] = -1`` reads position ``T-2``, so every non-query root counts when ``s_{T-2}`` equals the
    query), the line the official Figure 2 draws; above the default in every case measured under stationary
    roots (DESIGN §20: +0.007 to +0.03 nats at T = 20).

    ``alpha``: the estimator's pseudo-count; default the prior's ``alpha`` (a continuous prior), required for
    a finite prior. The default equals :func:`bayes_loss` under uniform roots (conjugacy); under stationary
    roots the exact Bayes loss is lower (the roots carry information about ``π`` through ``μ_π``).
    """
    check_task(task)
    eps = as_eps(task, eps)
    if alpha is None:
        if not task.continuous:
            raise ValueError("official_bayes_loss: give alpha= (the estimator's pseudo-count) for a finite prior")
        alpha = task.prior.alpha
    alpha = as_real(alpha, "alpha", minimum=0, strict=True)
    task.check_size()
    total = 0.0
    for seqs, w in task.enumerate(chunk_size=2**16):
        f = official_bayes_predict(task.graph, seqs, task.S, alpha, root_quirk=bool(root_quirk))
        total -= float(np.sum(w * np.log(f + eps)))
    return total


def count_estimator_loss(task, eps=None, model_limit=False, symmetry="auto") -> float:
    """Exact loss of the in-context transition-count estimator ("Knowl 8").

    ``L = -Σ_s Σ_c w(s,c) log(f̂_c(s) + ε)`` with ``f̂`` from
    :func:`count_estimator_predict` (the estimator; on sequences where no
    edge starts at the query token, the model's ``β → ∞`` limit). The
    perturbed loss with the same ``ε`` as the model is used so the two are
    comparable: the estimator often predicts 0 for a possible token, so
    with ``ε = 0`` this loss is usually ``inf`` (RuntimeWarning).

    Parameters
    ----------
    task : Task or MultiParentTask
    eps : float, optional
        Default ``task.default_eps``.
    model_limit : bool, default False
        Score the model's ``β1, β2 → ∞`` limit on every sequence instead:
        this is the limit of :func:`construction_loss`.
    symmetry : {"auto", "off"}, default "auto"
        The estimator is equivariant under token relabeling, so with a prior
        exactly closed under relabeling ``"auto"`` sums over one canonical
        sequence per orbit times the orbit size (equal up to rounding).

    Returns
    -------
    float
    """
    check_task(task)
    eps = as_eps(task, eps)
    task.check_size()
    total = 0.0
    S = task.S
    for seqs, w, mult in weighted_sequences(task, symmetry):
        f = count_estimator_predict(task.graph, seqs, S, model_limit=model_limit)
        pos = w > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            if mult is None:
                total -= float(np.sum(w[pos] * np.log(f[pos] + eps)))
            else:
                terms = np.where(pos, w * np.log(np.where(pos, f, 1.0) + eps), 0.0)
                total -= float(terms.sum(axis=1) @ mult)
    if math.isinf(total):
        warn_inf("count_estimator_loss")
    return total


def construction_params(graph, S, beta1, beta2):
    """The constructions of "Knowl 8" / "Knowl 9": ``A1 = β1·adjacency``, ``A2 = β2·I`` (per head for k parents).

    Returns
    -------
    A1 : float64 (T, T), or (k, T, T) for a :class:`MultiParentGraph`
    A2 : float64 (S, S), or (k, S, S)
    """
    b1 = as_real(beta1, "beta1")
    b2 = as_real(beta2, "beta2")
    if isinstance(graph, CausalGraph):
        return b1 * graph.adjacency(), b2 * np.eye(S)
    if not isinstance(graph, MultiParentGraph):
        raise ArgumentTypeError(f"graph must be a popgrad.CausalGraph or MultiParentGraph, got {type(graph).__name__}")
    A1 = np.stack([b1 * graph.adjacency(h) for h in range(graph.k)])
    A2 = np.stack([b2 * np.eye(S) for _ in range(graph.k)])
    return A1, A2


def construction_loss(task, beta1, beta2, eps=None) -> float:
    """Exact loss of the model at the "Knowl 8" construction.

    ``A1 = β1 · adjacency`` (``A1[i, p(i)] = β1``, root rows zero) and
    ``A2 = β2 · I``. As ``β1, β2 → ∞`` with ``β2·exp(-β1) → 0`` it converges
    to ``count_estimator_loss(task, eps, model_limit=True)``.

    Parameters
    ----------
    task : Task or MultiParentTask
    beta1, beta2 : float
        Finite scales.
    eps : float, optional
        Default ``task.default_eps``.

    Returns
    -------
    float
    """
    check_task(task)
    A1, A2 = construction_params(task.graph, task.S, beta1, beta2)
    return exact_loss(task, A1, A2, eps)

# ------------------------------------------------------- deprecated aliases (one release)
def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"popgrad.{old} is deprecated and will be removed in popgrad 0.3: use popgrad.{new} "
                  "(it serves every task kind)", DeprecationWarning, stacklevel=3)


def _multi_only(task):
    check_task(task, MultiParentTask)


def optimal_loss_multi(task, eps=0.0) -> float:
    """Deprecated alias of :func:`optimal_loss`."""
    _deprecated("optimal_loss_multi", "optimal_loss")
    _multi_only(task)
    return optimal_loss(task, eps)


def bayes_loss_multi(task, eps=0.0) -> float:
    """Deprecated alias of :func:`bayes_loss`."""
    _deprecated("bayes_loss_multi", "bayes_loss")
    _multi_only(task)
    return bayes_loss(task, eps)


def count_estimator_loss_multi(task, eps=None, model_limit=False) -> float:
    """Deprecated alias of :func:`count_estimator_loss`."""
    _deprecated("count_estimator_loss_multi", "count_estimator_loss")
    _multi_only(task)
    return count_estimator_loss(task, eps, model_limit=model_limit)


def construction_loss_multi(task, beta1, beta2, eps=None) -> float:
    """Deprecated alias of :func:`construction_loss`."""
    _deprecated("construction_loss_multi", "construction_loss")
    _multi_only(task)
    return construction_loss(task, beta1, beta2, eps)


def count_estimator_predict_multi(graph, seqs, S, model_limit=False) -> np.ndarray:
    """Deprecated alias of :func:`count_estimator_predict`."""
    _deprecated("count_estimator_predict_multi", "count_estimator_predict")
    if not isinstance(graph, MultiParentGraph):
        raise ValueError(f"graph must be a popgrad.MultiParentGraph, got {type(graph).__name__}")
    return count_estimator_predict(graph, seqs, S, model_limit=model_limit)
