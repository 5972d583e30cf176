"""Every DPI reading pinned to its closed form, computed here in a few lines of NumPy (issue 23).

Nothing below calls :mod:`popgrad.theory.information` to build the expected
values: ``μ`` is a linear solve, the joints of two positions are marginals of
the full joint over all ``S^T`` sequences, ``σ₂`` is the second singular value
of ``D^{1/2} π D^{-1/2}`` and every ``‖B‖²`` is the double sum of its
definition. The readings (``popgrad.theory.dpi``) must equal them to 1e-12 on
the kept counterexamples and on a few random chains; a reading that divides
by ``μ`` along the wrong axis is 4.4 times off on ``CE_RARE``.
"""
import itertools

import numpy as np
import pytest

import popgrad as pg
from popgrad.theory import dpi

from .test_dpi import CE_RARE, CE_SIGMA2, RICH

RTOL = 1e-12


# ------------------------------------------------------------ closed forms
def stationary(pi):
    """``μ π = μ``, ``Σ μ = 1`` by one linear solve."""
    S = pi.shape[0]
    A = pi.T - np.eye(S)
    A[-1] = 1.0
    b = np.zeros(S)
    b[-1] = 1.0
    return np.linalg.solve(A, b)


def closed_forms(pi):
    """``{α name: α}``, ``{B name: ‖B‖²}``, ``γ``, ``I_χ²`` of one ``π`` from their definitions."""
    S = pi.shape[0]
    mu = stationary(pi)
    dev = pi - mu[None, :]  # dev[a, b] = π(b|a) - μ(b)
    sv = np.linalg.svd(np.sqrt(mu)[:, None] * pi / np.sqrt(mu)[None, :], compute_uv=False)
    sigma2 = sv[1]  # the top one is 1 (eigenvector √μ)
    dob = 0.5 * max(np.abs(pi[a] - pi[b]).sum() for a in range(S) for b in range(S))
    norms = {
        "plain": sum(dev[a, b] ** 2 for a in range(S) for b in range(S)),
        "chi2": sum(mu[a] * dev[a, b] ** 2 / mu[b] for a in range(S) for b in range(S)),
        "row": sum(mu[a] * dev[a, b] ** 2 for a in range(S) for b in range(S)),
        "col": sum(dev[a, b] ** 2 / mu[b] for a in range(S) for b in range(S)),
    }
    alphas = {"dobrushin": dob, "sigma2": sigma2, "chi2": sigma2**2}
    chi2_mi = sum(mu[a] * pi[a, b] ** 2 / mu[b] for a in range(S) for b in range(S)) - 1.0
    gamma = min(S * pi.min(), np.sqrt(S * norms["plain"]))
    return mu, alphas, norms, gamma, chi2_mi


def full_joint(parents, pi, mu):
    """``(seqs, p)``: every sequence of ``[S]^T`` and its probability (roots ~ μ, the query ~ uniform)."""
    S, T = pi.shape[0], len(parents)
    seqs = np.array(list(itertools.product(range(S), repeat=T)))
    p = np.ones(len(seqs))
    for i, par in enumerate(parents):
        if i == T - 1:
            p = p / S
        elif par < 0:
            p = p * mu[seqs[:, i]]
        else:
            p = p * pi[seqs[:, par], seqs[:, i]]
    return seqs, p


def joint(seqs, p, j, i, S):
    """``J[a, b] = P[s_j = a, s_i = b]`` by marginalizing the full joint."""
    J = np.zeros((S, S))
    np.add.at(J, (seqs[:, j], seqs[:, i]), p)
    return J


def g_brute(parents, pi, mu):
    """``g[i, j] = Σ_{a,b} P[s_j=a, s_i=b] π(b|a)/μ(b) - 1`` (DESIGN §5) for non-roots, ``j ≤ i``."""
    S, T = pi.shape[0], len(parents)
    seqs, p = full_joint(parents, pi, mu)
    g = np.zeros((T, T))
    for i in range(T - 1):
        if parents[i] < 0:
            continue
        for j in range(i + 1):
            g[i, j] = np.sum(joint(seqs, p, j, i, S) * pi / mu[None, :]) - 1.0
    return g, seqs, p


def expected_rows(parents, pi):
    """Per non-root row: ``(parent value, gap, argmax set, {j: ‖Q_j‖₂}, diagonal)`` from the brute-force joints.

    The argmax set holds every ``j`` within 1e-13 of the largest ``g[i, j]``: a sibling and the
    grandparent tie exactly (``Q = Kᵀ`` and ``Q = K``), so either is the report's argmax.
    """
    S = pi.shape[0]
    mu = stationary(pi)
    g, seqs, p = g_brute(parents, pi, mu)
    r = np.sqrt(mu)
    out = {}
    for i in range(len(parents) - 1):
        par = parents[i]
        if par < 0:
            continue
        others = [j for j in range(i) if j != par]
        if not others:
            out[i] = (g[i, par], np.inf, {-1}, {}, g[i, i])
            continue
        top = max(g[i, j] for j in others)
        ties = {j for j in others if g[i, j] >= top - 1e-13}
        qn = {j: np.linalg.norm(joint(seqs, p, j, par, S) / np.outer(r, r) - np.outer(r, r), 2) for j in ties}
        out[i] = (g[i, par], g[i, par] - top, ties, qn, g[i, i])
    return out


def random_chains():
    rng = np.random.default_rng(20231)
    out = []
    for S, alpha in ((2, 1.0), (3, 0.5), (3, 5.0), (4, 1.0)):
        pi = 0.05 / S + 0.95 * rng.dirichlet(np.full(S, alpha), size=S)
        out.append(pi / pi.sum(axis=1, keepdims=True))
    return out


#: Nearly uniform: γ comes from the deviation, ``γ = sqrt(S‖π - 1μᵀ‖²)``, so ``‖π - 1μᵀ‖² ≥ γ²/S`` is an equality.
NEAR_UNIFORM = np.array([[0.36, 0.33, 0.31], [0.32, 0.35, 0.33], [0.33, 0.31, 0.36]])


def flip(a):
    return np.array([[1.0 - a, a], [a, 1.0 - a]])


#: ``a = 0.2``: ``δ = 1 - 2a = 1 - γ`` (γ = 2a), the paper's ``α ≤ 1-γ`` with equality.
#: ``a = 1/(2+√2)``: also ``(1-δ)/2 ‖π - 1μᵀ‖² = a(1-2a)² = 2a³ = γ³/(2S)``, the second half with equality.
EDGES = [flip(0.2), flip(1.0 / (2.0 + np.sqrt(2.0)))]
CHAINS = [CE_RARE, CE_SIGMA2] + random_chains() + [NEAR_UNIFORM] + EDGES
IDS = ["CE_RARE", "CE_SIGMA2"] + [f"random{k}" for k in range(4)] + ["near_uniform", "flip_0.2", "flip_edge"]


def close(a, b):
    return abs(a - b) <= RTOL * max(1.0, abs(b))


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("pi", CHAINS, ids=IDS)
def test_every_reading_equals_its_closed_form(pi):
    mu, alphas, norms, gamma, _ = closed_forms(pi)
    S = pi.shape[0]
    br = dpi.bound_readings(pi)
    np.testing.assert_allclose(br.info.mu, mu, rtol=1e-12, atol=0)
    assert close(br.gamma, gamma) and close(br.gamma3, gamma**3 / (2 * S))
    assert len(br.readings) == len(dpi.ALPHAS) * len(dpi.NORMS) == 12
    for r in br.readings:
        a, b = r.alpha_name, r.norm_name
        value = (1.0 - alphas[a]) / 2.0 * norms[b]
        assert close(r.alpha, alphas[a]), (r.name, r.alpha, alphas[a])
        assert close(r.norm2, norms[b]), (r.name, r.norm2, norms[b])
        assert close(r.value, value), (r.name, r.value, value)
        slack = 1e-12  # dpi.BOUND_TOL: the claims are compared with this slack (equalities hold)
        assert r.alpha_ok == (alphas[a] <= 1.0 - gamma + slack)
        assert r.norm_ok == (norms[b] >= gamma**2 / S - slack)
        assert r.at_least_gamma3 == (value >= gamma**3 / (2 * S) - slack)
    if gamma == np.sqrt(S * norms["plain"]):
        assert br.get("paper[dobrushin/plain]").norm_ok  # the equality case of Assumption 2


@pytest.mark.parametrize("pi", EDGES, ids=["flip_0.2", "flip_edge"])
def test_equality_cases_of_the_paper_claims_hold(pi):
    """On the flip chains the paper's claims hold with equality (to rounding): they must count as holding."""
    _, alphas, norms, gamma, _ = closed_forms(pi)
    assert abs(alphas["dobrushin"] - (1.0 - gamma)) <= 1e-15
    r = dpi.bound_readings(pi).get("paper[dobrushin/plain]")
    assert r.alpha_ok and r.norm_ok and r.at_least_gamma3
    if pi[0, 1] != 0.2:
        assert abs(r.value - gamma**3 / 4) <= 1e-15 and abs(gamma - np.sqrt(2 * norms["plain"])) <= 1e-15


def test_CE_RARE_pinned_figures():
    """The counterexample's figures, each from its closed form: the rare state makes ``col`` ≫ ``chi2``."""
    _, alphas, norms, gamma, chi2_mi = closed_forms(CE_RARE)
    br = dpi.bound_readings(CE_RARE)
    assert close(br.info.chi2_mi, chi2_mi) and close(norms["chi2"], chi2_mi)
    assert norms["col"] > 4 * norms["chi2"] and norms["plain"] > 4 * norms["chi2"]
    assert close(br.get("paper[dobrushin/col]").value, (1 - alphas["dobrushin"]) / 2 * norms["col"])
    assert close(gamma, 0.3)  # S·min π = 3·0.1


@pytest.mark.parametrize("pi", [c for c in CHAINS if c.shape[0] <= 3], ids=[n for c, n in zip(CHAINS, IDS) if c.shape[0] <= 3])
def test_report_rows_equal_brute_force_gaps_and_bounds(pi):
    """``dpi_report_pi`` on ``RICH`` (S ≤ 3: 3^10 sequences): every row's value, gap, argmax, diagonal, bound."""
    _check_report(RICH, pi)


SMALL = pg.CausalGraph([-1, 0, 0, 1, -1, 4, -1])  # siblings, a grandparent, another tree, the query


@pytest.mark.parametrize("pi", CHAINS, ids=IDS)
def test_report_rows_on_a_small_forest(pi):
    _check_report(SMALL, pi)


def _check_report(graph, pi):
    parents = [int(x) for x in graph.parents]
    _, alphas, norms, gamma, chi2_mi = closed_forms(pi)
    S = pi.shape[0]
    exp = expected_rows(parents, pi)
    rep = dpi.dpi_report_pi(graph, pi)
    assert [r.i for r in rep.rows] == sorted(exp)
    for r in rep.rows:
        pv, gap, ties, qn, diag = exp[r.i]
        assert close(r.parent_value, pv) and close(r.parent_value, chi2_mi)
        assert close(r.diagonal_value, diag) and close(diag, np.trace(pi) - 1.0)
        assert r.argmax_j in ties
        if r.argmax_j < 0:
            assert r.gap == np.inf
            continue
        assert close(r.gap, gap) and close(r.max_nonparent, pv - gap)
        assert abs(r.normalized_gap - gap / pv) <= 1e-9 and close(r.diagonal_gap, pv - diag)  # / pv: looser
        want = {"dpi_Q": (1.0 - qn[r.argmax_j]) * chi2_mi, "dpi_sigma2": (1.0 - alphas["sigma2"]) * chi2_mi,
                "gamma3": gamma**3 / (2 * S)}
        want.update({f"paper[{a}/{b}]": (1.0 - alphas[a]) / 2.0 * norms[b] for a in dpi.ALPHAS for b in dpi.NORMS})
        for name in dpi.BOUND_NAMES:
            b = r.bound(name)
            assert abs(b.value - want[name]) <= 1e-10 * max(1.0, abs(want[name])), (name, b.value, want[name])
            assert b.holds == (gap >= want[name] - 1e-12 * max(1.0, abs(want[name]))), name


def test_expectation_report_equals_weighted_closed_forms():
    """``dpi_report(task)``: expected ``g`` and the prior-weighted bounds of two atoms."""
    atoms = np.stack([CE_RARE, CHAINS[3]])
    weights = np.array([0.3, 0.7])
    task = pg.Task(SMALL, pg.FinitePrior(atoms, weights))
    parents = [int(x) for x in SMALL.parents]
    per = [closed_forms(a) for a in atoms]
    gs, joints = [], []
    for a in atoms:
        mu = stationary(a)
        g, seqs, p = g_brute(parents, a, mu)
        gs.append(g)
        joints.append((seqs, p, mu))
    g = weights[0] * gs[0] + weights[1] * gs[1]
    gamma = min(f[3] for f in per)
    rep = dpi.dpi_report(task)
    assert close(rep.gamma, gamma)
    for r in rep.rows:
        par = parents[r.i]
        others = [j for j in range(r.i) if j != par]
        assert close(r.parent_value, g[r.i, par])
        if not others:
            continue
        top = max(g[r.i, j] for j in others)
        js = r.argmax_j
        assert js in others and g[r.i, js] >= top - 1e-13 and close(r.gap, g[r.i, par] - top)
        qn = []
        for (seqs, p, mu), a in zip(joints, atoms):
            rt = np.sqrt(mu)
            Q = joint(seqs, p, js, par, 3) / np.outer(rt, rt) - np.outer(rt, rt)
            qn.append(np.linalg.norm(Q, 2))
        want_q = sum(w * (1 - q) * f[4] for w, q, f in zip(weights, qn, per))
        want_s = sum(w * (1 - f[1]["sigma2"]) * f[4] for w, f in zip(weights, per))
        assert close(r.bound("dpi_Q").value, want_q) and close(r.bound("dpi_sigma2").value, want_s)
        for a in dpi.ALPHAS:
            for b in dpi.NORMS:
                want = sum(w * (1 - f[1][a]) / 2 * f[2][b] for w, f in zip(weights, per))
                assert close(r.bound(f"paper[{a}/{b}]").value, want)
        assert close(r.bound("gamma3").value, gamma**3 / 6)
