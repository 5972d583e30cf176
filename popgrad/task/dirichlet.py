"""The official task's continuous prior (DESIGN §20): every row of ``π`` is ``Dirichlet(α·1)``.

:class:`DirichletPrior` (``problems.InContextTree``: single parent, non-query
roots from ``μ_π`` or uniform) and :class:`DirichletTensorPrior`
(``problems.InContextDAG``: ``k`` parents, roots uniform). A fresh ``π`` per
sequence; there are no atoms, so the exact weights come from the sufficient
statistics of a sequence and label:

* ``n[a, b]``: edges ``j → i`` with ``(s_j, s_i) = (a, b)`` plus the label edge
  ``(s_{T-1}, c)`` (rows are parent tuples for ``k`` parents);
* ``r[a]``: non-query roots with token ``a`` (stationary roots only).

``P(s, c | π) = S⁻¹ Π_a μ_π(a)^{r[a]} Π_{a,b} π(b|a)^{n[a,b]}`` (stationary) or
``S^{-1-R} Π π^n`` (uniform), and ``w(s, c)`` is its prior mean:

* **uniform roots**: ``w = S^{-1-R} Π_a B(α1 + n[a,·]) / B(α1)`` exactly
  (log rising factorials whose ``ln α`` parts cancel as integers, right at every ``α > 0``:
  :func:`_log_rising`; the label factor is the official Bayes predictive
  ``(n[q,c] + α) / (n[q,·] + Sα)`` of the edges);
* **stationary roots, S = 2**: ``π(1|0) = p``, ``π(0|1) = q`` independent
  ``Beta(α, α)``, ``μ = (q, p) / (p + q)``. ``μ`` is analytic on the square
  except at the corner ``p = q = 0``, so the square is split into
  ``[h,1]×[0,1]``, ``[0,h]×[h,1]`` and ``[0,h]²`` (``h = 1/2``), the corner
  square into two triangles mapped by ``q = p v`` (resp. ``p = q v``), which
  makes ``μ = (v, 1)/(1 + v)`` analytic. Every remaining factor is a
  Jacobi weight (the ``x^{α-1}``, ``x^{2α-1}`` end-point singularities) times
  a function analytic on a neighbourhood of its interval, so product
  Gauss–Jacobi converges geometrically; orders ``n`` and ``2n`` give the
  error estimate (measured ≤ 2e-12 relative at ``n = 12, 24`` against two independent adaptive quadratures; higher orders lose digits to the Jacobi rule's rounding).
  For ``α >= S2_FULL_ALPHA`` the whole square by the Gauss rule of ``Beta(α, α)`` itself
  (:func:`_s2_full_square`); ``α < S2_MIN_ALPHA`` is refused (:func:`stationary_alpha_problem`);
* **stationary roots, S ≥ 3**: a seeded Monte-Carlo average over ``MC_DRAWS``
  draws of ``π`` closed under the ``S!`` relabelings (common to every
  statistic; the table is then exactly the weight table of that finite,
  relabeling-closed prior and sums to one), with the relative standard error
  of each statistic's average reported (max over statistics). Product
  Gauss–Jacobi on the stick-breaking sticks was tried first and rejected:
  ``μ`` is not smooth where the chain is nearly reducible, which is where
  small α puts its mass, and at α = 0.1 the rule at order 10 per stick
  (10⁶ nodes) was still off by a factor 2 on some statistics while its
  order-n-versus-2n difference suggested 10 % (DESIGN §20).

``w`` is computed once per distinct statistic and scattered into the table
(:func:`weight_table_single`, :func:`weight_table_multi`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import as_int, as_real
from .priors import PriorDiagnostics

__all__ = ["DirichletPrior", "DirichletTensorPrior", "is_continuous", "weight_table_single", "weight_table_multi",
           "WeightAccuracy", "ROOTS"]

ROOTS = ("stationary", "uniform")
#: Gauss–Jacobi orders (n, 2n) of the S = 2 stationary integral.
S2_ORDER = 12
#: Draws of π of the S >= 3 stationary Monte-Carlo weights (about; closed under the S! relabelings when
#: S! <= MC_DRAWS / 16), and their seed.
MC_DRAWS = 2**16
MC_SEED = 20240101
#: Draws per call of the Monte-Carlo kernel (its partial sums are added in NumPy).
MC_BLOCK = 1024
#: The S = 2 stationary weights: split-square Gauss–Jacobi for ``S2_MIN_ALPHA <= α < S2_FULL_ALPHA``, the
#: full-square rule of the Beta(α, α) measure above; refused below ``S2_MIN_ALPHA`` (bound 3e-12 at 1e-3;
#: below, the rare statistics' weights lose digits: 1e-9 at 1e-6, 1e-3 at 1e-12).
S2_MIN_ALPHA = 1e-3
S2_FULL_ALPHA = 10.0
#: Smallest α of the S >= 3 stationary Monte Carlo: below it gamma draws underflow to exact zeros.
MC_MIN_ALPHA = 0.05


def is_continuous(prior) -> bool:
    """True for :class:`DirichletPrior` and :class:`DirichletTensorPrior` (no atoms: weights from the table)."""
    return isinstance(prior, (DirichletPrior, DirichletTensorPrior))


class WeightAccuracy(NamedTuple):
    """How exact a task's weight table is.

    ``exact``: closed form, exact to rounding. Otherwise ``bound`` is the largest relative difference of
    the two quadrature orders over the distinct statistics (an estimate of the lower order's error; the
    table holds the higher order), and ``method`` names the rule.
    """

    exact: bool
    bound: float
    method: str
    statistical: bool = False

    def summary(self) -> str:
        if self.exact:
            return f"weights exact to rounding ({self.method})"
        if self.statistical:
            return (f"weights by {self.method}: relative standard error up to {self.bound:.2g} "
                    "(max over statistics; exact weights of that finite prior)")
        return f"weights by {self.method}: relative error bound {self.bound:.2g} (orders n vs 2n)"


class _ContinuousPrior:
    """What the two continuous priors share."""

    __slots__ = ("_S", "_alpha", "_roots", "_k")
    continuous = True
    implicit_closure = False

    @property
    def S(self) -> int:
        return self._S

    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def roots(self) -> str:
        return self._roots

    @property
    def k(self) -> int:
        return self._k

    @property
    def K(self):
        """``None``: a continuous prior has no atoms (the engines read the task's weight table)."""
        return None

    @property
    def base(self):
        return self

    def mean(self) -> np.ndarray:
        """``E[π] = 11ᵀ/S`` (flat ``(S**k, S)`` rows)."""
        return np.full((self._S**self._k, self._S), 1.0 / self._S)

    def draw(self, n: int, rng) -> np.ndarray:
        """``n`` independent draws of ``π``, ``(n, S**k, S)``: each row ``Dirichlet(α1)`` (NumPy's gamma ratio)."""
        g = rng.standard_gamma(self._alpha, size=(n, self._S**self._k, self._S))
        if self._alpha > 1e300:  # a row sum of S gammas near α would overflow: scale first
            g /= self._alpha
        if self._S <= 128:  # g / g.sum(axis=2) by a numba loop in NumPy's order (the same bits, no temporaries)
            from ._dirichlet_kernels import normalize_rows

            out = np.empty_like(g)
            try:
                normalize_rows(g, out)
                ok = not np.isnan(out).any()
            except ZeroDivisionError:  # numba's 0/0 of a row of all-zero gammas (tiny α): handled below
                ok = False
            if ok:
                return out
        tot = g.sum(axis=2, keepdims=True)
        bad = tot[..., 0] <= 0  # every gamma underflowed (tiny α): the row is a point mass at a uniform token
        if np.any(bad):
            idx = np.argwhere(bad)
            pick = rng.integers(0, self._S, size=len(idx))
            g[idx[:, 0], idx[:, 1], :] = 0.0
            g[idx[:, 0], idx[:, 1], pick] = 1.0
            tot = g.sum(axis=2, keepdims=True)
        return g / tot

    # -- what needs atoms refuses in one line (a computation that sums over a finite prior's atoms)
    def _no_atoms(self):
        return ValueError(f"this computation sums over the prior's atoms, but {self!r} is continuous (a fresh pi per "
                          "sequence): use a finite stand-in, e.g. popgrad.dirichlet_prior(S, alpha, n_atoms, seed), or "
                          "a computation that reads the task's weight table (the exact engines, the references)")

    def invariant_view(self):
        raise self._no_atoms()

    def expand(self):
        raise self._no_atoms()

    @property
    def atoms(self):
        raise self._no_atoms()

    @property
    def weights(self):
        raise self._no_atoms()

    @property
    def stationary(self):
        raise self._no_atoms()

    def diagnostics(self) -> PriorDiagnostics:
        """Knowl 10 for ``Dirichlet(α1)`` rows: the support reaches ``π(b|a) = 0`` (γ = 0: 10.1 fails) and
        the uniform matrix (non-degeneracy infimum 0); relabeling-symmetric and uniform mean exactly."""
        return PriorDiagnostics(gamma=0.0, nondegeneracy=0.0, nondegenerate=True, symmetric=True,
                                uniform_mean_error=0.0, uniform_mean=True)

    def is_relabeling_closed(self, tol: float = 1e-10) -> bool:
        return True

    def fingerprint_bytes(self) -> bytes:
        return f"{type(self).__name__}:S={self._S}:k={self._k}:alpha={self._alpha!r}:roots={self._roots}".encode()

    def __eq__(self, other):
        return type(other) is type(self) and self.fingerprint_bytes() == other.fingerprint_bytes()

    def __hash__(self):
        return hash(self.fingerprint_bytes())


class DirichletPrior(_ContinuousPrior):
    """The official ``InContextTree`` prior: each row of ``π`` independent ``Dirichlet(α·1)``.

    Parameters
    ----------
    S : int
        Alphabet size, ``>= 2``.
    alpha : float
        Dirichlet concentration ``> 0`` (the official code uses 0.1).
    roots : {"stationary", "uniform"}, default "stationary"
        Non-query roots drawn from the stationary distribution ``μ_π``
        (``InContextTree``) or uniformly (``InContextDAG``). The query is uniform either way.

    A continuous prior has no atoms: :class:`popgrad.Task` computes its exact
    weight table once (DESIGN §20) and every engine reads it.
    """

    __slots__ = ()

    def __init__(self, S, alpha, roots="stationary"):
        self._S = as_int(S, "S", minimum=2)
        self._alpha = as_real(alpha, "alpha", minimum=0, strict=True, hint=" (the Dirichlet concentration)")
        if roots not in ROOTS:
            raise ValueError(f"roots must be 'stationary' (InContextTree) or 'uniform' (InContextDAG), got {roots!r}")
        self._roots = roots
        self._k = 1

    def summary(self) -> str:
        return (f"DirichletPrior S={self._S} alpha={self._alpha:g} roots={self._roots} (continuous, a fresh pi "
                f"per sequence)\n  " + self.diagnostics().summary())

    def __repr__(self):
        return f"DirichletPrior(S={self._S}, alpha={self._alpha!r}, roots={self._roots!r})"


class DirichletTensorPrior(_ContinuousPrior):
    """The official ``InContextDAG`` prior: a ``Dirichlet(α·1)`` row per parent tuple, roots uniform.

    Parameters
    ----------
    S : int
        Alphabet size, ``>= 2``.
    k : int
        Parents per non-root, ``>= 1``.
    alpha : float
        Dirichlet concentration ``> 0``.
    """

    __slots__ = ()

    def __init__(self, S, k, alpha):
        self._S = as_int(S, "S", minimum=2)
        self._k = as_int(k, "k", minimum=1)
        self._alpha = as_real(alpha, "alpha", minimum=0, strict=True, hint=" (the Dirichlet concentration)")
        self._roots = "uniform"

    def summary(self) -> str:
        return (f"DirichletTensorPrior S={self._S} k={self._k} alpha={self._alpha:g} roots=uniform (continuous, a "
                f"fresh pi per sequence)\n  gamma=0 (Knowl 10.1 fails), relabeling-symmetric=True, uniform mean=True")

    def __repr__(self):
        return f"DirichletTensorPrior(S={self._S}, k={self._k}, alpha={self._alpha!r})"


# ============================================================= sufficient statistics
def edge_counts_single(seqs, parents, S) -> tuple:
    """``(n (N, S, S) int64, r (N, S) int64)``: the edges of the context (label edge excluded) and the
    non-query roots' tokens of each sequence of a single-parent graph."""
    seqs = np.asarray(seqs, dtype=np.int64)
    N, T = seqs.shape
    n = np.zeros((N, S * S), dtype=np.int64)
    r = np.zeros((N, S), dtype=np.int64)
    rows = np.arange(N)
    for i in range(T - 1):
        p = int(parents[i])
        if p < 0:
            r[rows, seqs[:, i]] += 1
        else:
            n[rows, seqs[:, p] * S + seqs[:, i]] += 1
    return n.reshape(N, S, S), r


def edge_counts_multi(seqs, parents, S) -> np.ndarray:
    """``n (N, S**k, S)``: the context edges of a k-parent graph (rows = flat parent tuples)."""
    seqs = np.asarray(seqs, dtype=np.int64)
    N, T = seqs.shape
    k = parents.shape[1]
    n = np.zeros((N, S**k * S), dtype=np.int64)
    rows = np.arange(N)
    powers = S ** np.arange(k - 1, -1, -1, dtype=np.int64)
    for i in range(T):
        if parents[i, 0] >= 0:
            n[rows, (seqs[:, parents[i]] @ powers) * S + seqs[:, i]] += 1
    return n.reshape(N, S**k, S)


def _log_rising(alpha, scale, m):
    """``lnΓ(x + j) − lnΓ(x) = c[j]·ln α + L[j]`` (``j = 0 … m``) for ``x = scale·α``, without cancellation.

    The log rising factorial ``Σ_{i<j} ln(x + i)`` with its ``ln α`` part kept apart as the integer
    ``c[j]`` (``ln x = ln scale + ln α`` is folded into ``L``): for ``x >= 1``, ``ln(x + i) = ln x +
    log1p(i/x)`` (``c[j] = j``; ``i/x`` formed as ``(i/scale)/α``, never overflowing); for ``x < 1``,
    ``ln x`` for ``i = 0`` (``c[j] = 1``) and ``ln(i + x)`` otherwise. The ``ln α`` of the numerator and
    denominator of a Dirichlet-multinomial then cancel as integers (:func:`_log_dm`), exactly, at every
    ``α > 0``: the difference ``lnΓ(α + j) − lnΓ(α)`` of two large ``lgamma`` values (``α ≥ 1e6``) lost
    every digit.
    """
    j = np.arange(m + 1, dtype=np.float64)
    L = np.zeros(m + 1)
    if alpha >= 1.0 / scale:  # x >= 1
        c = np.arange(m + 1, dtype=np.int64)
        L[1:] = np.cumsum(np.log1p((j[:-1] / scale) / alpha))
        L += j * math.log(scale)
    else:
        c = np.minimum(np.arange(m + 1, dtype=np.int64), 1)
        x = scale * alpha
        L[1:] = math.log(scale)
        if m >= 2:
            L[2:] += np.cumsum(np.log(j[1:-1] + x))
    return c, L


def _log_dm(n, alpha, S):
    """``Σ_rows ln[B(α1 + n_row)/B(α1)]`` of counts ``n (N, R, S)`` (exact Dirichlet-multinomial).

    ``B(α1 + n_row)/B(α1) = Π_b (α)_{n_b} / (Sα)_{N_row}`` (rising factorials, :func:`_log_rising`): the
    ``ln α`` terms collected into one integer coefficient per sequence, so nothing cancels at any ``α``.
    """
    m = int(n.max()) if n.size else 0
    tot = n.sum(axis=2)
    ca, La = _log_rising(alpha, 1.0, m)
    cs, Ls = _log_rising(alpha, float(S), int(tot.max()) if tot.size else 0)
    coef = ca[n].sum(axis=(1, 2)) - cs[tot].sum(axis=1)
    rest = La[n].sum(axis=(1, 2)) - Ls[tot].sum(axis=1)
    return np.where(coef == 0, 0.0, coef * math.log(alpha)) + rest


def _uniform_table(n, q_row, alpha, S, log_root):
    """``w[m, c] = exp(log_root[m] + ln DM(n_m)) · (n_m[q, c] + α) / (n_m[q, ·] + Sα)`` (label edge).

    The label factor is formed as ``(n/α + 1)/(N/α + S)`` for ``α >= 1`` (no overflow of ``Sα``)."""
    base = np.exp(log_root + _log_dm(n, alpha, S))
    nq = n[np.arange(len(n)), q_row].astype(np.float64)  # (N, S)
    if alpha >= 1.0:
        label = (nq / alpha + 1.0) / (nq.sum(axis=1, keepdims=True) / alpha + S)
    else:
        label = (nq + alpha) / (nq.sum(axis=1, keepdims=True) + S * alpha)
    return base[:, None] * label


# ============================================================= tables
def weight_table_single(prior: DirichletPrior, parents, seqs) -> tuple:
    """``(w (N, S), WeightAccuracy)`` for given sequences of a single-parent graph under ``prior``."""
    S, alpha = prior.S, prior.alpha
    seqs = np.asarray(seqs, dtype=np.int64)
    N, T = seqs.shape
    n, r = edge_counts_single(seqs, parents, S)
    q = seqs[:, T - 1]
    if prior.roots == "uniform":
        R = r.sum(axis=1)
        w = _uniform_table(n, q, alpha, S, -(1.0 + R) * math.log(S))
        return w, WeightAccuracy(True, 0.0, "Dirichlet-multinomial closed form")
    # stationary roots: one integral per distinct (n + label edge, r)
    nl = np.repeat(n[:, None], S, axis=1).reshape(N * S, S, S)
    nl[np.arange(N * S), np.repeat(q, S), np.tile(np.arange(S), N)] += 1
    key = np.concatenate([nl.reshape(N * S, S * S), np.repeat(r, S, axis=0)], axis=1)
    uniq, inv = np.unique(key, axis=0, return_inverse=True)
    un = uniq[:, :S * S].reshape(-1, S, S)
    ur = uniq[:, S * S:]
    vals, bound, method = stationary_expectations(un, ur, alpha)
    w = (vals[inv.reshape(-1)] / S).reshape(N, S)
    return w, WeightAccuracy(False, bound, method, statistical=S > 2)


def weight_table_multi(prior: DirichletTensorPrior, parents, target_parents, seqs) -> tuple:
    """``(w (N, S), WeightAccuracy)`` for given sequences of a k-parent graph (roots uniform, closed form)."""
    S, alpha = prior.S, prior.alpha
    seqs = np.asarray(seqs, dtype=np.int64)
    n = edge_counts_multi(seqs, parents, S)
    powers = S ** np.arange(len(target_parents) - 1, -1, -1, dtype=np.int64)
    rt = seqs[:, np.asarray(target_parents)] @ powers
    n_roots = int(np.sum(parents[:, 0] < 0))
    w = _uniform_table(n, rt, alpha, S, np.full(len(seqs), -n_roots * math.log(S)))
    return w, WeightAccuracy(True, 0.0, "Dirichlet-multinomial closed form")


# ============================================================= stationary roots
def stationary_expectations(n, r, alpha):
    """``E[Π_a μ_π(a)^{r[a]} Π_{a,b} π(b|a)^{n[a,b]}]`` under rows ``Dirichlet(α1)``, per statistic.

    ``n (M, S, S)``, ``r (M, S)`` integers. Returns ``(values (M,), bound, method)``: the higher-order
    values, the largest relative difference between orders ``n`` and ``2n``, the rule's name.
    """
    S = n.shape[1]
    out = np.empty(len(n))
    R = r.sum(axis=1)
    no_roots = R == 0
    if np.any(no_roots):  # closed form
        out[no_roots] = np.exp(_log_dm(n[no_roots], alpha, S))
    bound = 0.0
    sel = ~no_roots
    problem = stationary_alpha_problem(S, alpha)
    if problem is not None and np.any(sel):
        raise ValueError(problem + ", or roots='uniform' (exact at every alpha)")
    if S == 2:
        full = alpha >= S2_FULL_ALPHA
        rule = _s2_full_square if full else _s2_expectation
        lo = rule(n[sel], r[sel], alpha, S2_ORDER)
        hi = rule(n[sel], r[sel], alpha, 2 * S2_ORDER)
        method = (f"{'full-square Gauss-Beta' if full else 'split-square Gauss-Jacobi'}, S = 2, orders {S2_ORDER} "
                  f"and {2 * S2_ORDER}")
        out[sel] = hi
        if np.any(sel):
            bound = float(np.max(np.abs(hi - lo) / np.abs(hi)))
        return out, bound, method
    PI = _mc_atoms(S, alpha)
    mean, rse = _mc_expectation(n[sel], r[sel], PI)
    out[sel] = mean
    bound = float(rse.max()) if len(rse) else 0.0
    closed = math.factorial(S) * 16 <= MC_DRAWS
    method = f"Monte Carlo over {len(PI):,} seeded draws of pi" + (" (closed under relabeling)" if closed else "")
    return out, bound, method


def stationary_alpha_problem(S, alpha):
    """``None`` when the stationary-root weights have a method at ``(S, α)``; else why not (one line, no fix).

    S = 2: the split-square Gauss–Jacobi rule for ``S2_MIN_ALPHA <= α < S2_FULL_ALPHA`` (below, the
    table still sums to one within 1e-14 down to 1e-150, but the rare statistics' weights lose digits:
    orders 12 and 24 differ by 5e-11 at 1e-4, 1e-9 at 1e-6, 1e-3 at 1e-12), the full-square rule of the
    Beta(α, α) measure above (any finite α). S >= 3: the seeded Monte Carlo needs ``α >= MC_MIN_ALPHA``: below it the gamma draws
    underflow to exact zeros, a row of π becomes a point mass, the chain reducible and ``μ_π`` undefined.
    """
    if S == 2 and alpha < S2_MIN_ALPHA:
        return (f"alpha = {alpha:g} is below {S2_MIN_ALPHA:g}, where the S = 2 stationary-root weights "
                f"(Gauss-Jacobi with the end-point weight x^(alpha-1)) lose their accuracy: use alpha >= "
                f"{S2_MIN_ALPHA:g}")
    if S >= 3 and alpha < MC_MIN_ALPHA:
        return (f"alpha = {alpha:g} is below {MC_MIN_ALPHA:g}, where the Dirichlet draws of the S >= 3 "
                f"stationary-root weights underflow to exact zeros (a reducible chain, no stationary "
                f"distribution): use alpha >= {MC_MIN_ALPHA:g}")
    return None


_MC_CACHE = {}


def _mc_atoms(S, alpha):
    """The ``MC_DRAWS · S!`` relabeling-closed draws of the S >= 3 stationary weights (kept per ``(S, α)``)."""
    key = (S, float(alpha))
    if key not in _MC_CACHE:
        from .relabeling import _inverse_perms

        rng = np.random.default_rng(MC_SEED)
        n_perm = math.factorial(S)
        if n_perm * 16 <= MC_DRAWS:
            draws = DirichletPrior(S, alpha).draw(-(-MC_DRAWS // n_perm), rng)
            inv = _inverse_perms(S)
            draws = draws[:, inv[:, :, None], inv[:, None, :]].reshape(-1, S, S)
        else:
            draws = DirichletPrior(S, alpha).draw(MC_DRAWS, rng)
        if not np.all(draws > 0):  # a row with an exact zero (an underflowed gamma): μ_π may be undefined
            raise ValueError(f"alpha = {alpha:g}: the Dirichlet draws of the S >= 3 stationary-root weights "
                             f"underflow to exact zeros (no stationary distribution): use a larger alpha, or "
                             f"roots='uniform' (exact at every alpha)")
        _MC_CACHE.clear()
        _MC_CACHE[key] = draws
    return _MC_CACHE[key]


def _mc_expectation(n, r, PI):
    """Per statistic: the mean over the draws ``PI (K, S, S)`` of ``Π π^n Π μ^r`` and its relative standard error."""
    from ._dirichlet_kernels import mc_moments

    M = len(n)
    if M == 0:
        return np.zeros(0), np.zeros(0)
    K, S, _ = PI.shape
    with np.errstate(divide="ignore"):
        lp = np.log(PI).reshape(K, S * S)
        lm = np.log(_gth_batch(PI))
    nn = np.ascontiguousarray(n.reshape(M, S * S), dtype=np.int64)
    rr = np.ascontiguousarray(r, dtype=np.int64)
    lp, lm = np.ascontiguousarray(lp), np.ascontiguousarray(lm)
    # the kernel sums its draws in order: in blocks of MC_BLOCK, so that the rounding of a sum of K nearly
    # equal terms (K·eps relative: 1.2e-12 off a table's sum at α = 1e300) stays below (MC_BLOCK + K/MC_BLOCK)·eps
    s1, s2 = np.zeros(M), np.zeros(M)
    b1, b2 = np.empty(M), np.empty(M)
    for lo in range(0, K, MC_BLOCK):
        mc_moments(nn, rr, lp[lo:lo + MC_BLOCK], lm[lo:lo + MC_BLOCK], b1, b2)
        s1 += b1
        s2 += b2
    mean = s1 / K
    var = np.maximum(s2 / K - mean**2, 0.0)
    return mean, np.sqrt(var / K) / mean


def gauss_beta01(n, pa, pb):
    """Gauss rule of the weight ``x^{pa-1} (1-x)^{pb-1}`` on ``[0, 1]`` (``pa, pb > 0``): ``(x, w, log_mass)``.

    ``w`` sums to one (the ``Beta(pa, pb)`` probability measure), ``log_mass = ln B(pa, pb)``
    (``math.lgamma``). Golub–Welsch on the monic Jacobi recurrence written in ``pa, pb`` themselves
    (``scipy.linalg.eigh_tridiagonal``): the exponents are never formed as ``α - 1`` and shifted back,
    which loses ``eps/α`` relative (the S = 2 table's sum drifted by 4e-11 at α = 1e-6, 4e-5 at 1e-12), and
    not scipy's ``roots_jacobi``, whose rule for ``x^{α-1}`` loses digits as ``α → 0`` (moments off by
    6.5e-10 at α = 1e-3, order 24).
    """
    from scipy.linalg import eigh_tridiagonal

    pa, pb = float(pa), float(pb)
    sig = pa + pb
    k = np.arange(n, dtype=np.float64)
    sk = 2.0 * k - 2.0 + sig  # 2k + A + B of the standard (1 - t)^A (1 + t)^B, A = pb - 1, B = pa - 1
    diag = np.empty(n)
    diag[0] = (pa - pb) / sig
    diag[1:] = (pa - pb) * (sig - 2.0) / (sk[1:] * (sk[1:] + 2.0))
    off = np.empty(max(n - 1, 0))
    if n > 1:  # k = 1: its factors (σ - 1) cancel (σ = 1 would give 0/0 in the general form)
        off[0] = 4.0 * pa * pb / (sig * sig * (sig + 1.0))
    kk, s1 = k[2:], sk[2:]
    off[1:] = 4.0 * kk * (kk - 1.0 + pb) * (kk - 1.0 + pa) * (kk - 2.0 + sig) / (s1 * s1 * (s1 + 1.0) * (s1 - 1.0))
    t, v = eigh_tridiagonal(diag, np.sqrt(off))
    w = v[0] ** 2
    return (1.0 + t) / 2.0, w / w.sum(), math.lgamma(pa) + math.lgamma(pb) - math.lgamma(sig)


def gauss_jacobi01(n, a, b):
    """Nodes and weights on ``[0, 1]`` for the weight ``x^a (1-x)^b`` (``a, b > -1``): ``Σ w f(x) ≈ ∫ x^a (1-x)^b f``
    (:func:`gauss_beta01` with ``pa = a + 1``, ``pb = b + 1``; the weights sum to ``B(a + 1, b + 1)``)."""
    x, w, log_mass = gauss_beta01(n, a + 1.0, b + 1.0)
    return x, w * math.exp(log_mass)


def gauss_beta_symmetric(n, alpha):
    """Gauss rule of the ``Beta(α, α)`` probability measure on ``[0, 1]``: ``(nodes, weights)``, weights sum 1.

    Golub–Welsch on the monic Gegenbauer recurrence of ``(1 - t²)^{α-1}`` on ``[-1, 1]`` (``t = 2x - 1``),
    ``β_1 = 1/(2α + 1)``, ``β_k = k (k + 2α - 2) / (4 (k + α - 1/2)(k + α - 3/2))`` formed as a product of
    two bounded ratios, so no normalising constant (``B(α, α)``, ``2^{2α}``) is ever formed: finite at every
    ``α > 0`` (scipy's ``roots_jacobi`` overflows at α ≈ 300 and returns NaN past 1e20).
    """
    from scipy.linalg import eigh_tridiagonal

    k = np.arange(1, n, dtype=np.float64)
    beta = (k / (k + alpha - 0.5)) * ((k + 2.0 * alpha - 2.0) / (4.0 * (k + alpha - 1.5)))
    beta[0] = 1.0 / (2.0 * alpha + 1.0)
    e = np.sqrt(beta)
    scale = float(e.max())
    t, v = eigh_tridiagonal(np.zeros(n), e / scale)
    w = v[0] ** 2
    return (1.0 + t * scale) / 2.0, w / w.sum()


def _s2_full_square(n, r, alpha, order):
    """S = 2 stationary-root expectation for large α (``α >= S2_FULL_ALPHA``), ``(M,)``.

    ``p, q ~ Beta(α, α)`` on the whole square by the product Gauss rule of that measure
    (:func:`gauss_beta_symmetric`): the corner singularity of ``μ`` at ``p = q = 0`` carries the weight
    ``(pq)^{α-1}``, so the integrand is smooth to order α there and the rule converges geometrically
    (orders 12 vs 24 differ by ≤ 3e-14 for α ≥ 10, measured on chains of T ≤ 6); the split square's
    Jacobi weights ``x^{α-1}`` are ill-conditioned there (2.4e-8 at α = 50, overflow at 300).
    """
    M = len(n)
    if M == 0:
        return np.zeros(0)
    x, w = gauss_beta_symmetric(order, alpha)
    p, q = x[None, :, None], x[None, None, :]
    n00, n01, n10, n11 = (n[:, i, j][:, None, None].astype(float) for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
    r0, r1 = (r[:, i][:, None, None].astype(float) for i in (0, 1))
    f = p ** (n01 + r1) * (1 - p) ** n00 * q ** (n10 + r0) * (1 - q) ** n11 / (p + q) ** (r0 + r1)
    return np.einsum("mij,i,j->m", f, w, w)


def _s2_expectation(n, r, alpha, order):
    """S = 2 stationary-root expectation on the split square (module docstring), ``(M,)``."""
    M = len(n)
    if M == 0:
        return np.zeros(0)
    h = 0.5
    n00, n01, n10, n11 = (n[:, i, j][:, None, None].astype(float) for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
    r0, r1 = (r[:, i][:, None, None].astype(float) for i in (0, 1))
    R = r0 + r1
    am1 = alpha - 1.0
    # probability rules and their log masses: every region's factor exp(prefactor + masses - 2 ln B(α, α)) is
    # O(1) at every α (the masses alone, ~1/α, overflow their product below α ≈ 1e-154)
    x0, w0, l0 = gauss_beta01(order, alpha, 1.0)  # x^{α-1}
    x1, w1, l1 = gauss_beta01(order, 1.0, alpha)  # (1-x)^{α-1}
    xb, wb, lb = gauss_beta01(order, alpha, alpha)  # x^{α-1}(1-x)^{α-1}
    x2, w2, l2 = gauss_beta01(order, 2.0 * alpha, 1.0)  # x^{2α-1}
    lh, l1h = math.log(h), math.log(1 - h)

    def grid(xa, xb_):
        return xa[None, :, None], xb_[None, None, :]

    total = np.zeros(M)
    # A: p in [h, 1] (weight (1-p)^{α-1}), q in [0, 1] (weight q^{α-1}(1-q)^{α-1})
    p, q = grid(h + (1 - h) * x1, xb)
    f = (p ** (am1 + n01) * (1 - p) ** n00 * q ** n10 * (1 - q) ** n11 * q ** r0 * p ** r1 / (p + q) ** R)
    total += math.exp(alpha * l1h + l1 + lb - 2 * lb) * np.einsum("mij,i,j->m", f, w1, wb)
    # B: p in [0, h] (weight p^{α-1}), q in [h, 1] (weight (1-q)^{α-1})
    p, q = grid(h * x0, h + (1 - h) * x1)
    f = (p ** n01 * (1 - p) ** (am1 + n00) * q ** (am1 + n10) * (1 - q) ** n11 * q ** r0 * p ** r1 / (p + q) ** R)
    total += math.exp(alpha * (lh + l1h) + l0 + l1 - 2 * lb) * np.einsum("mij,i,j->m", f, w0, w1)
    # C1: p in [0, h] (weight p^{2α-1}), q = p v, v in [0, 1] (weight v^{α-1})
    corner = math.exp(2 * alpha * lh + l2 + l0 - 2 * lb)
    p, v = grid(h * x2, x0)
    f = (p ** (n01 + n10) * (1 - p) ** (am1 + n00) * v ** (n10 + r0) * (1 - p * v) ** (am1 + n11) / (1 + v) ** R)
    total += corner * np.einsum("mij,i,j->m", f, w2, w0)
    # C2: q in [0, h] (weight q^{2α-1}), p = q v
    q, v = grid(h * x2, x0)
    f = (q ** (n01 + n10) * (1 - q) ** (am1 + n11) * v ** (n01 + r1) * (1 - q * v) ** (am1 + n00) / (1 + v) ** R)
    total += corner * np.einsum("mij,i,j->m", f, w2, w0)
    return total


def _gth_batch(pi):
    """Stationary distributions of ``(N, S, S)`` chains with positive off-diagonal row sums (GTH).

    The numba kernel :func:`popgrad.task._dirichlet_kernels.gth_batch` (the same bits as the vectorized
    NumPy reference :func:`_gth_batch_numpy`, several times faster: the sampler's roots); a reducible chain
    (a zero pivot) goes to the per-matrix GTH, as there.
    """
    from ._dirichlet_kernels import gth_batch

    A = np.ascontiguousarray(pi, dtype=np.float64)
    N, S, _ = A.shape
    if S > 128:  # the kernel's sum follows NumPy's pairwise order up to 128 terms
        return _gth_batch_numpy(pi)
    x = np.empty((N, S))
    stuck = np.empty(N, dtype=np.bool_)
    gth_batch(A, x, stuck)
    if np.any(stuck):
        from .priors import stationary_distribution

        x[stuck] = stationary_distribution(np.asarray(pi)[stuck])
    return x


def _gth_batch_numpy(pi):
    """NumPy reference of :func:`_gth_batch` (vectorized over the chains)."""
    A = np.array(pi, dtype=np.float64)
    N, S, _ = A.shape
    # a zero pivot (a reducible chain: possible when a Dirichlet draw underflows) goes to the per-matrix GTH
    stuck = np.zeros(N, dtype=bool)
    for k in range(S - 1):
        stuck |= A[:, k, k + 1:].sum(axis=1) <= 0.0
        if np.any(stuck):
            A[stuck] = np.eye(S)[None] * 0.5 + 0.5 / S  # placeholder, replaced below
        scale = A[:, k, k + 1:].sum(axis=1)
        A[:, k + 1:, k] /= scale[:, None]
        A[:, k + 1:, k + 1:] += A[:, k + 1:, k, None] * A[:, k, None, k + 1:]
    x = np.zeros((N, S))
    x[:, S - 1] = 1.0
    for k in range(S - 2, -1, -1):
        x[:, k] = np.einsum("nj,nj->n", x[:, k + 1:], A[:, k + 1:, k])
    x /= x.sum(axis=1, keepdims=True)
    if np.any(stuck):
        from .stationary import stationary_distribution

        x[stuck] = stationary_distribution(np.asarray(pi)[stuck])
    return x
