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
  (``lgamma``; the label factor is the official Bayes predictive
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
  error estimate (measured ≤ 2e-12 relative at ``n = 12, 24`` against two independent adaptive quadratures; higher orders lose digits to the Jacobi rule's rounding);
* **stationary roots, S ≥ 3**: product Gauss–Jacobi on the stick-breaking
  sticks of every row (``Dirichlet(α1)`` = independent ``Beta(α, (S-1-j)α)``
  sticks), orders ``n`` and ``2n``; the bound is ``|Q_2n - Q_n|`` (relative,
  max over statistics). ``μ`` is not smooth where the chain is nearly
  reducible, where small α puts its mass, so the convergence is algebraic:
  the bound is reported, never hidden.

``w`` is computed once per distinct statistic and scattered into the table
(:func:`weight_table_single`, :func:`weight_table_multi`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy.special import gammaln, roots_jacobi

from .._validation import as_int, as_real
from .priors import PriorDiagnostics

__all__ = ["DirichletPrior", "DirichletTensorPrior", "is_continuous", "weight_table_single", "weight_table_multi",
           "WeightAccuracy", "ROOTS"]

ROOTS = ("stationary", "uniform")
#: Gauss–Jacobi orders (n, 2n) of the S = 2 stationary integral.
S2_ORDER = 12
#: Gauss–Jacobi order n per stick at S >= 3 (2n is the check); the product rule has (2n)^(S(S-1)) nodes.
STICK_ORDER = {3: 4, 4: 2}
#: Largest number of product-rule nodes the S >= 3 stationary quadrature may use.
MAX_PRODUCT_NODES = 300_000


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

    def summary(self) -> str:
        if self.exact:
            return f"weights exact to rounding ({self.method})"
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
        tot = g.sum(axis=2, keepdims=True)
        bad = tot[..., 0] <= 0  # every gamma underflowed (tiny α): the row is a point mass at a uniform token
        if np.any(bad):
            idx = np.argwhere(bad)
            pick = rng.integers(0, self._S, size=len(idx))
            g[idx[:, 0], idx[:, 1], :] = 0.0
            g[idx[:, 0], idx[:, 1], pick] = 1.0
            tot = g.sum(axis=2, keepdims=True)
        return g / tot

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

    @property
    def atoms(self):
        raise ValueError("a DirichletTensorPrior is continuous and has no atoms: use the task's weight table "
                         "(MultiParentTask.weight_table) or a finite prior (dirichlet_tensor_prior)")

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


def _dm_log_tables(alpha, S, m):
    """``lg[x] = lnΓ(α + x) - lnΓ(α)``, ``lgs[x] = lnΓ(Sα + x) - lnΓ(Sα)`` for ``x = 0 … m``."""
    x = np.arange(m + 1, dtype=np.float64)
    return gammaln(alpha + x) - gammaln(alpha), gammaln(S * alpha + x) - gammaln(S * alpha)


def _log_dm(n, alpha, S):
    """``Σ_rows ln[B(α1 + n_row)/B(α1)]`` of counts ``n (N, R, S)`` (exact Dirichlet-multinomial)."""
    m = int(n.max()) if n.size else 0
    lg, lgs = _dm_log_tables(alpha, S, m + 1)
    return lg[n].sum(axis=(1, 2)) - lgs[n.sum(axis=2)].sum(axis=1)


def _uniform_table(n, q_row, alpha, S, log_root):
    """``w[m, c] = exp(log_root[m] + ln DM(n_m)) · (n_m[q, c] + α) / (n_m[q, ·] + Sα)`` (label edge)."""
    base = np.exp(log_root + _log_dm(n, alpha, S))
    nq = n[np.arange(len(n)), q_row]  # (N, S)
    return base[:, None] * (nq + alpha) / (nq.sum(axis=1, keepdims=True) + S * alpha)


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
    return w, WeightAccuracy(False, bound, method)


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
    if S == 2:
        lo = _s2_expectation(n[sel], r[sel], alpha, S2_ORDER)
        hi = _s2_expectation(n[sel], r[sel], alpha, 2 * S2_ORDER)
        method = f"split-square Gauss-Jacobi, S = 2, orders {S2_ORDER} and {2 * S2_ORDER}"
    else:
        order = STICK_ORDER.get(S)
        if order is None or (2 * order) ** (S * (S - 1)) > MAX_PRODUCT_NODES:
            raise ValueError(f"stationary roots at S = {S}: the stick-breaking product rule would need more than "
                             f"{MAX_PRODUCT_NODES:,} nodes; use DirichletPrior(S, alpha, roots='uniform') "
                             "(closed form) or S <= 4")
        lo = _stick_expectation(n[sel], r[sel], alpha, order)
        hi = _stick_expectation(n[sel], r[sel], alpha, 2 * order)
        method = f"stick-breaking product Gauss-Jacobi, orders {order} and {2 * order} per stick"
    out[sel] = hi
    if np.any(sel):
        bound = float(np.max(np.abs(hi - lo) / np.abs(hi)))
    return out, bound, method


def gauss_jacobi01(n, a, b):
    """Nodes and weights on ``[0, 1]`` for the weight ``x^a (1-x)^b`` (``a, b > -1``): ``Σ w f(x) ≈ ∫ x^a (1-x)^b f``."""
    t, w = roots_jacobi(n, b, a)  # weight (1-t)^b (1+t)^a on [-1, 1]
    return (1.0 + t) / 2.0, w / 2.0 ** (a + b + 1.0)


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
    lognorm = 2.0 * (2.0 * gammaln(alpha) - gammaln(2.0 * alpha))  # B(α, α)^2
    x0, w0 = gauss_jacobi01(order, am1, 0.0)  # x^{α-1}
    x1, w1 = gauss_jacobi01(order, 0.0, am1)  # (1-x)^{α-1}
    xb, wb = gauss_jacobi01(order, am1, am1)  # x^{α-1}(1-x)^{α-1}
    x2, w2 = gauss_jacobi01(order, 2 * alpha - 1.0, 0.0)  # x^{2α-1}

    def grid(xa, xb_):
        return xa[None, :, None], xb_[None, None, :]

    total = np.zeros(M)
    # A: p in [h, 1] (weight (1-p)^{α-1}), q in [0, 1] (weight q^{α-1}(1-q)^{α-1})
    p, q = grid(h + (1 - h) * x1, xb)
    f = (p ** (am1 + n01) * (1 - p) ** n00 * q ** n10 * (1 - q) ** n11 * q ** r0 * p ** r1 / (p + q) ** R)
    total += (1 - h) ** alpha * np.einsum("mij,i,j->m", f, w1, wb)
    # B: p in [0, h] (weight p^{α-1}), q in [h, 1] (weight (1-q)^{α-1})
    p, q = grid(h * x0, h + (1 - h) * x1)
    f = (p ** n01 * (1 - p) ** (am1 + n00) * q ** (am1 + n10) * (1 - q) ** n11 * q ** r0 * p ** r1 / (p + q) ** R)
    total += h ** alpha * (1 - h) ** alpha * np.einsum("mij,i,j->m", f, w0, w1)
    # C1: p in [0, h] (weight p^{2α-1}), q = p v, v in [0, 1] (weight v^{α-1})
    p, v = grid(h * x2, x0)
    f = (p ** (n01 + n10) * (1 - p) ** (am1 + n00) * v ** (n10 + r0) * (1 - p * v) ** (am1 + n11) / (1 + v) ** R)
    total += h ** (2 * alpha) * np.einsum("mij,i,j->m", f, w2, w0)
    # C2: q in [0, h] (weight q^{2α-1}), p = q v
    q, v = grid(h * x2, x0)
    f = (q ** (n01 + n10) * (1 - q) ** (am1 + n11) * v ** (n01 + r1) * (1 - q * v) ** (am1 + n00) / (1 + v) ** R)
    total += h ** (2 * alpha) * np.einsum("mij,i,j->m", f, w2, w0)
    return total * math.exp(-lognorm)


def _simplex_rule(S, alpha, order):
    """Product Gauss–Jacobi rule for one ``Dirichlet(α1_S)`` row by stick breaking: ``(points (N1, S), weights)``."""
    pts = np.ones((1, S))
    rest = np.ones(1)
    wts = np.ones(1)
    P = np.zeros((1, 0))
    for j in range(S - 1):
        b = (S - 1 - j) * alpha
        x, w = gauss_jacobi01(order, alpha - 1.0, b - 1.0)
        w = w / math.exp(gammaln(alpha) + gammaln(b) - gammaln(alpha + b))  # Beta(α, b) probabilities
        P = np.concatenate([np.repeat(P, order, axis=0), np.outer(rest, x).reshape(-1, 1)], axis=1)
        rest = np.outer(rest, 1.0 - x).reshape(-1)
        wts = np.outer(wts, w).reshape(-1)
    pts = np.concatenate([P, rest[:, None]], axis=1)
    return pts, wts


def _stick_expectation(n, r, alpha, order):
    """S >= 3 stationary-root expectation by the product rule over all rows (chunked by BLAS), ``(M,)``."""
    M, S, _ = n.shape
    pts, wts = _simplex_rule(S, alpha, order)
    N1 = len(pts)
    idx = np.stack(np.meshgrid(*([np.arange(N1)] * S), indexing="ij"), axis=-1).reshape(-1, S)  # (N1^S, S)
    PI = pts[idx]  # (N, S, S): row a = pts[idx[:, a]]
    mu = _gth_batch(PI)
    logmu = np.log(np.maximum(mu, 1e-300))
    logpts = np.log(np.maximum(pts, 1e-300))
    out = np.zeros(M)
    G = np.prod(wts[idx], axis=1)  # (N,)
    # per statistic: Σ_nodes G · Π_a f_a(node_a) · Π μ^r, f_a(x) = Π_b x_b^{n[a,b]}
    logf = np.einsum("xb,mab->max", logpts, n.astype(float))  # (M, S, N1)
    for lo in range(0, M, 64):
        hi = min(M, lo + 64)
        lr = r[lo:hi].astype(float) @ logmu.T  # (m, N)
        lf = sum(logf[lo:hi, a][:, idx[:, a]] for a in range(S))  # (m, N)
        out[lo:hi] = np.exp(lr + lf) @ G
    return out


def _gth_batch(pi):
    """Stationary distributions of ``(N, S, S)`` chains with positive off-diagonal row sums (GTH, vectorized)."""
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
        from .priors import stationary_distribution

        x[stuck] = stationary_distribution(np.asarray(pi)[stuck])
    return x
