r"""Data-processing-inequality gaps of the idealized gradient and the bounds on them (DESIGN §6).

For a non-root row ``i`` with parent ``p = p(i)`` the idealized gradient has
its largest off-diagonal entry at the parent: for every ``j < i``, ``j ≠ p``,
``s_j → s_p → s_i`` is a Markov chain given ``π`` and (notation of
:mod:`popgrad.theory.information`)::

    g[i,p] - g[i,j] = tr((I - Q_j) K Kᵀ) ≥ (1 - ‖Q_j‖₂) ‖K‖_F² ≥ (1 - σ₂(π)) ‖K‖_F²,

with ``Q_j = (K^a)ᵀ K^b`` (``a, b`` the distances of ``j`` and ``p`` to their
lowest common ancestor; ``Q_j = 0`` across trees), so ``‖Q_j‖₂ ≤ σ₂^{a+b}``.
These two bounds are theorems; the reports call them ``dpi_Q`` and
``dpi_sigma2``. The diagonal is not covered (``g[i,i](π) = tr π - 1`` can
exceed ``‖K‖_F²`` for a lazy chain); it is reported separately and only
vanishes in expectation under a uniform-mean prior.

The paper's stated bound, and what we found
-------------------------------------------
Knowl 3 states ``g[i,p] - g[i,j] ≥ (1-α(π))/2 ‖B_π‖_F² ≥ γ³/(2S)`` with
``α(π) ≤ 1-γ`` "the Markov contraction coefficient" and ``‖B_π‖_F² ≥ γ²/S``
"the non-degeneracy of the chain"; the exact definitions are not in our copy
of the paper. We implement every combination (``paper[α/B]``) of

* ``α`` ∈ ``dobrushin`` (``δ(π)``), ``sigma2`` (``σ₂(π)``), ``chi2``
  (``η_χ² = σ₂²``, stationary input);
* ``B`` ∈ ``plain`` (``π - 1μᵀ``, the non-degeneracy quantity of Knowl 10),
  ``chi2`` (``D^{1/2}(π - 1μᵀ)D^{-1/2} = K``, so ``‖B‖² = I_χ²``),
  ``row`` (``D^{1/2}(π - 1μᵀ)``), ``col`` (``(π - 1μᵀ)D^{-1/2}``);

and ``γ(π) = min(S·min π, sqrt(S·‖π - 1μᵀ‖_F²))``, the largest ``γ`` for
which ``π`` meets Assumptions 1–2. Results (property tests in
``tests/test_dpi.py``; each failure is kept there as an explicit
counterexample with ``γ ≥ 0.3``):

* ``gap ≥ (1-α)/2 ‖B‖²`` **holds** for ``B ∈ {chi2, row}`` and every ``α``
  (proof: ``‖B_row‖² ≤ ‖K‖²``, and ``(1-α)/2 ≤ 1-σ₂`` for each ``α`` because
  ``σ₂² ≤ δ``); it **fails** for ``B ∈ {plain, col}`` and every ``α``
  (``‖π - 1μᵀ‖²`` can be much larger than ``‖K‖²`` when a state is rare).
* ``(1-α)/2 ‖B‖² ≥ γ³/(2S)`` **holds** for ``α ∈ {dobrushin, chi2}`` with
  ``B ∈ {plain, col}`` (proof: ``α ≤ 1-γ`` and ``‖B‖² ≥ ‖π - 1μᵀ‖² ≥ γ²/S``),
  and for ``(sigma2, col)`` empirically only; it **fails** for
  ``(sigma2, plain)`` and for ``B ∈ {chi2, row}`` with every ``α``.
* ``α ≤ 1-γ`` holds for ``dobrushin`` and ``chi2``, fails for ``sigma2``
  (``σ₂`` of a non-reversible chain can exceed both ``δ`` and ``1-γ``).
* ``‖B‖² ≥ γ²/S`` holds for ``plain`` (definition of ``γ``) and ``col``,
  fails for ``chi2`` and ``row``.
* The end points, ``gap ≥ γ³/(2S)``: no counterexample found (20,000
  hypothesis examples and Nelder-Mead searches over ``S = 2..5``; the
  smallest ratio ``gap / (γ³/(2S))`` found was 1.52, at ``S = 3``).

So no single reading makes *both* halves of the paper's chain hold for
every ``π``, although its end points ``gap ≥ γ³/(2S)`` held in every search.
The reports give every reading's value and whether it holds, row by row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .._validation import is_int
from ..task.graphs import CausalGraph
from .information import (
    ChainInformation,
    _as_mu,
    _as_transition,
    _check_task,
    _kernels,
    chain_information,
    idealized_gradient,
    idealized_gradient_single,
    lca_distances,
)
from ..task.tasks import Task

__all__ = [
    "ALPHAS",
    "NORMS",
    "BOUND_NAMES",
    "Reading",
    "BoundReadings",
    "Bound",
    "RowGap",
    "DpiReport",
    "bound_readings",
    "dpi_report",
    "dpi_report_pi",
]

#: Contraction coefficients tried for the paper's ``α(π)``.
ALPHAS = ("dobrushin", "sigma2", "chi2")
#: Matrices tried for the paper's ``B_π``.
NORMS = ("plain", "chi2", "row", "col")
#: Every bound a row reports, in order: the two DPI theorems, the twelve
#: readings of the paper's bound, and ``γ³/(2S)``.
BOUND_NAMES = ("dpi_Q", "dpi_sigma2") + tuple(f"paper[{a}/{b}]" for a in ALPHAS for b in NORMS) + ("gamma3",)
#: Slack of every "holds" comparison: ``gap ≥ bound - BOUND_TOL · max(1, |bound|)``.
BOUND_TOL = 1e-12


# ------------------------------------------------------------------ results
class Reading(NamedTuple):
    """One reading ``(1-α)/2 · ‖B‖_F²`` of the paper's bound for one ``π``.

    Attributes
    ----------
    name : str
        ``"paper[<alpha>/<B>]"``.
    alpha_name, norm_name : str
        Members of :data:`ALPHAS` and :data:`NORMS`.
    alpha : float
        ``α(π)``.
    norm2 : float
        ``‖B_π‖_F²``.
    value : float
        ``(1 - alpha) / 2 · norm2``.
    alpha_ok : bool
        ``α ≤ 1 - γ(π)`` (the paper's claim on α).
    norm_ok : bool
        ``‖B‖² ≥ γ(π)²/S`` (the paper's claim on B).
    at_least_gamma3 : bool
        ``value ≥ γ(π)³/(2S)`` (second half of the paper's chain).
    """

    name: str
    alpha_name: str
    norm_name: str
    alpha: float
    norm2: float
    value: float
    alpha_ok: bool
    norm_ok: bool
    at_least_gamma3: bool


@dataclass(frozen=True)
class BoundReadings:
    """All readings of the paper's bound for one ``π``.

    Attributes
    ----------
    info : ChainInformation
        The information quantities of ``π``.
    gamma : float
        ``γ(π) = min(S·min π, sqrt(S·‖π - 1μᵀ‖²))``.
    gamma3 : float
        ``γ(π)³ / (2S)``.
    readings : tuple of Reading
        In the order of :data:`ALPHAS` × :data:`NORMS`.
    """

    info: ChainInformation
    gamma: float
    gamma3: float
    readings: tuple

    def get(self, name: str) -> Reading:
        """The reading called ``name`` (``"paper[sigma2/chi2]"``) or ``(alpha, B)``."""
        if isinstance(name, tuple):
            name = f"paper[{name[0]}/{name[1]}]"
        for r in self.readings:
            if r.name == name:
                return r
        raise KeyError(f"no reading {name!r}; known: {[r.name for r in self.readings]}")


class Bound(NamedTuple):
    """A lower bound on a row's gap and whether it holds.

    ``holds`` is ``gap ≥ value - BOUND_TOL·max(1, |value|)``.
    """

    name: str
    value: float
    holds: bool


class RowGap(NamedTuple):
    """The DPI gap of one non-root row ``i``.

    Attributes
    ----------
    i, parent : int
    parent_value : float
        ``g[i, p(i)]`` (``= I_χ²`` for a single π).
    argmax_j : int
        ``argmax_{j < i, j ≠ p(i)} g[i, j]`` (``-1`` when ``i`` has no such ``j``).
    max_nonparent : float
        That maximum (``-inf`` when there is no ``j``).
    gap : float
        ``parent_value - max_nonparent`` (``+inf`` when there is no ``j``).
    normalized_gap : float
        ``gap / parent_value``.
    diagonal_value : float
        ``g[i, i]`` (``E[tr π] - 1``).
    diagonal_gap : float
        ``parent_value - diagonal_value`` (may be negative for a single lazy π).
    bounds : tuple of Bound
        In the order of :data:`BOUND_NAMES`.
    """

    i: int
    parent: int
    parent_value: float
    argmax_j: int
    max_nonparent: float
    gap: float
    normalized_gap: float
    diagonal_value: float
    diagonal_gap: float
    bounds: tuple

    def bound(self, name: str) -> Bound:
        """The bound called ``name`` (one of :data:`BOUND_NAMES`)."""
        for b in self.bounds:
            if b.name == name:
                return b
        raise KeyError(f"no bound {name!r}; known: {BOUND_NAMES}")


@dataclass(frozen=True)
class DpiReport:
    """DPI gaps of every non-root row of a task (or of one ``π``).

    Attributes
    ----------
    scope : str
        ``"expectation over K atoms"``, ``"atom k"`` or ``"single pi"``.
    S, T : int
    gamma : float
        ``γ`` used by ``gamma3``: ``γ(π)`` for one π, ``min_k γ(π_k)`` for a prior.
    rows : tuple of RowGap
        One per non-root position, increasing.
    readings : tuple of BoundReadings
        One per atom (a single entry for one π).
    """

    scope: str
    S: int
    T: int
    gamma: float
    rows: tuple
    readings: tuple

    def holds(self, name: str) -> bool:
        """Whether bound ``name`` holds on every row (vacuously for no rows)."""
        return all(r.bound(name).holds for r in self.rows)

    def min_margin(self, name: str) -> float:
        """``min_rows (gap - bound)`` (``+inf`` without rows or competitors)."""
        return min((r.gap - r.bound(name).value for r in self.rows), default=np.inf)

    def parent_is_argmax(self) -> bool:
        """Whether every non-root row's parent entry beats every other ``j < i``."""
        return all(r.gap > 0 for r in self.rows)

    def diagonal_below_parent(self) -> bool:
        """Whether ``g[i,i] < g[i,p(i)]`` on every non-root row."""
        return all(r.diagonal_gap > 0 for r in self.rows)

    def to_markdown(self, bounds=("dpi_Q", "dpi_sigma2", "gamma3")) -> str:
        """Two markdown tables: per-row gaps with ``bounds``, and every bound's summary."""
        for name in bounds:
            if name not in BOUND_NAMES:
                raise ValueError(f"unknown bound {name!r}; choose from {BOUND_NAMES}")

        def f(x):
            return "—" if not np.isfinite(x) else f"{x:.4g}"

        head = ["i", "p(i)", "g[i,p]", "argmax j", "max g[i,j]", "gap", "gap/g[i,p]", "g[i,i]"] + list(bounds)
        lines = [
            f"DPI report ({self.scope}), S={self.S}, T={self.T}, gamma={self.gamma:.4g}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for r in self.rows:
            cells = [
                str(r.i), str(r.parent), f(r.parent_value),
                "—" if r.argmax_j < 0 else str(r.argmax_j),
                f(r.max_nonparent), f(r.gap), f(r.normalized_gap), f(r.diagonal_value),
            ]
            for name in bounds:
                b = r.bound(name)
                cells.append(f"{b.value:.3g} {'✓' if b.holds else '✗'}")
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "| bound | holds on every row | min (gap - bound) |", "|---|---|---|"]
        for name in BOUND_NAMES:
            lines.append(f"| {name} | {self.holds(name)} | {f(self.min_margin(name))} |")
        return "\n".join(lines)


# ------------------------------------------------------------- readings
def _gamma(info: ChainInformation) -> float:
    return info.gamma


def bound_readings(pi, mu=None) -> BoundReadings:
    """Every reading ``(1-α)/2 ‖B_π‖_F²`` of the paper's bound for one ``π``.

    Parameters
    ----------
    pi : array_like, shape (S, S)
        Irreducible transition matrix.
    mu : array_like, shape (S,), optional
        Its stationary distribution; computed from ``pi`` when omitted.

    Returns
    -------
    BoundReadings
        With ``α`` from :data:`ALPHAS`, ``B`` from :data:`NORMS` (module
        docstring) and the claims ``α ≤ 1-γ``, ``‖B‖² ≥ γ²/S``,
        ``(1-α)/2‖B‖² ≥ γ³/(2S)`` evaluated with ``γ = γ(π)``.
    """
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    info = chain_information(pi, mu)
    return _readings_from_info(pi, info)


def _readings_from_info(pi, info: ChainInformation) -> BoundReadings:
    S = pi.shape[0]
    mu = info.mu
    dev2 = (pi - mu[None, :]) ** 2
    norms = {
        "plain": float(dev2.sum()),
        "chi2": info.chi2_mi,
        "row": float((mu[:, None] * dev2).sum()),
        "col": float((dev2 / mu[None, :]).sum()),
    }
    alphas = {"dobrushin": info.dobrushin, "sigma2": info.sigma2, "chi2": info.chi2_contraction}
    gamma = _gamma(info)
    gamma3 = gamma**3 / (2 * S)
    out = []
    for a in ALPHAS:
        for b in NORMS:
            val = (1.0 - alphas[a]) / 2.0 * norms[b]
            out.append(
                Reading(
                    name=f"paper[{a}/{b}]",
                    alpha_name=a,
                    norm_name=b,
                    alpha=alphas[a],
                    norm2=norms[b],
                    value=val,
                    alpha_ok=bool(alphas[a] <= 1.0 - gamma + BOUND_TOL),
                    norm_ok=bool(norms[b] >= gamma**2 / S - BOUND_TOL),
                    at_least_gamma3=bool(val >= gamma3 - BOUND_TOL),
                )
            )
    return BoundReadings(info=info, gamma=gamma, gamma3=gamma3, readings=tuple(out))


# --------------------------------------------------------------- reports
def _holds(gap, value) -> bool:
    return bool(gap >= value - BOUND_TOL * max(1.0, abs(value)))


def _q_norms(kern, mu, D, j_star, parents, rows) -> np.ndarray:
    """``‖Q_{j*}‖₂`` per atom and row: ``Q = (K^a)ᵀ K^b``, 0 across trees. Shape ``(nK, n_rows)``."""
    nK, S, _ = kern.shape
    out = np.zeros((nK, len(rows)))
    r = np.sqrt(mu)
    proj = np.eye(S)[None] - r[:, :, None] * r[:, None, :]
    cache = {}
    for n, i in enumerate(rows):
        j = int(j_star[n])
        if j < 0:
            continue
        p = int(parents[i])
        a, b = int(D[j, p]), int(D[p, j])
        if a < 0:
            continue  # different trees: Q = 0
        if (a, b) not in cache:
            Ka = proj if a == 0 else np.linalg.matrix_power(kern, a)
            Kb = proj if b == 0 else np.linalg.matrix_power(kern, b)
            cache[a, b] = np.linalg.svd(np.swapaxes(Ka, 1, 2) @ Kb, compute_uv=False)[:, 0]
        out[:, n] = cache[a, b]
    return out


def _build_report(scope, graph, g, atoms, mu, weights, S) -> DpiReport:
    T = graph.T
    parents = graph.parents
    rows = [int(i) for i in graph.non_roots]
    D = lca_distances(graph)
    infos = [chain_information(a, m) for a, m in zip(atoms, mu)]
    readings = tuple(_readings_from_info(a, inf) for a, inf in zip(atoms, infos))
    kern = _kernels(atoms, mu)
    I = np.array([x.chi2_mi for x in infos])
    s2 = np.array([x.sigma2 for x in infos])
    paper_vals = np.array([[r.value for r in br.readings] for br in readings])  # (nK, 12)
    gamma = min(br.gamma for br in readings)
    gamma3 = gamma**3 / (2 * S)

    j_star = np.full(len(rows), -1)
    out_rows = []
    maxes = []
    for n, i in enumerate(rows):
        p = int(parents[i])
        cand = np.arange(i)
        cand = cand[cand != p]
        if cand.size:
            vals = g[i, cand]
            m = int(np.argmax(vals))
            j_star[n] = int(cand[m])
            maxes.append(float(vals[m]))
        else:
            maxes.append(-np.inf)
    qn = _q_norms(kern, mu, D, j_star, parents, rows)
    for n, i in enumerate(rows):
        p = int(parents[i])
        pv = float(g[i, p])
        mx = maxes[n]
        gap = pv - mx
        values = [
            float(weights @ ((1.0 - qn[:, n]) * I)),
            float(weights @ ((1.0 - s2) * I)),
        ] + [float(v) for v in weights @ paper_vals] + [gamma3]
        bounds = tuple(Bound(name, v, _holds(gap, v)) for name, v in zip(BOUND_NAMES, values))
        dv = float(g[i, i])
        out_rows.append(
            RowGap(
                i=i,
                parent=p,
                parent_value=pv,
                argmax_j=int(j_star[n]),
                max_nonparent=mx,
                gap=gap,
                normalized_gap=gap / pv if pv != 0 else np.nan,
                diagonal_value=dv,
                diagonal_gap=pv - dv,
                bounds=bounds,
            )
        )
    return DpiReport(scope=scope, S=S, T=T, gamma=gamma, rows=tuple(out_rows), readings=readings)


def dpi_report_pi(graph: CausalGraph, pi, mu=None) -> DpiReport:
    """DPI report of ``g(π)`` for one transition matrix.

    Parameters
    ----------
    graph : CausalGraph
    pi : array_like, shape (S, S)
        Irreducible transition matrix.
    mu : array_like, shape (S,), optional

    Returns
    -------
    DpiReport
        Rows for every non-root ``i``: ``g[i,p(i)] = ‖K‖²``, the largest
        other ``g[i,j]`` (``j < i``), the gap, ``g[i,i] = tr π - 1``, and every
        bound of :data:`BOUND_NAMES` with whether it holds.
    """
    if not isinstance(graph, CausalGraph):
        raise ValueError(f"graph must be a popgrad.CausalGraph, got {type(graph).__name__}")
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    g = idealized_gradient_single(graph, pi, mu)
    return _build_report("single pi", graph, g, pi[None], mu[None], np.ones(1), pi.shape[0])


def dpi_report(task: Task, atom: int | None = None) -> DpiReport:
    """DPI report of a task: in expectation over the prior, or for one atom.

    Parameters
    ----------
    task : Task
    atom : int, optional
        ``None`` (default): the expected ``g`` of :func:`popgrad.idealized_gradient`
        and the expected bounds ``E[(1-‖Q_j‖)‖K‖²]``, ``E[(1-σ₂)‖K‖²]``,
        ``E[(1-α)/2 ‖B‖²]`` (each a valid lower bound of the expected gap when
        its per-π version is), with ``γ = min_k γ(π_k)`` for ``gamma3``.
        An int ``k``: the report of :func:`dpi_report_pi` for ``π_k``.

    Returns
    -------
    DpiReport
    """
    task = _check_task(task)
    pr = task.prior
    if atom is not None:
        if not is_int(atom) or not 0 <= atom < pr.K:
            raise ValueError(f"atom must be None or an atom index in 0..{pr.K - 1}, got {atom!r}")
        rep = dpi_report_pi(task.graph, pr.atoms[atom], pr.stationary[atom])
        return DpiReport(f"atom {int(atom)}", rep.S, rep.T, rep.gamma, rep.rows, rep.readings)
    g = idealized_gradient(task)
    return _build_report(
        f"expectation over {pr.K} atoms", task.graph, g, pr.atoms, pr.stationary, pr.weights, task.S
    )
