r"""χ² information quantities of one transition matrix ``π`` (DESIGN §5–§6).

Notation (one transition matrix ``π``, ``pi[a, b] = π(b | a)``)
----------------------------------------------------------------
``μ`` is the stationary distribution (GTH, :func:`popgrad.stationary_distribution`),
``D = diag(μ)``, ``r = √μ`` and

    N = D^{1/2} π D^{-1/2},        K = N - r rᵀ        (the *normalized kernel*).

Because ``μ π = μ`` and ``π 1 = 1`` we have ``N r = r``, ``Nᵀ r = r``, hence
``K r = Kᵀ r = 0``, ``N = r rᵀ + K`` (orthogonal pieces) and ``N^d = r rᵀ + K^d``.
Everything below follows from that decomposition.

* χ² mutual information of one transition (the paper's ``I_χ²(s_i; s_{p(i)} | π)``)::

      I_χ²(π) = Σ_{a,b} μ(a) π(a,b)² / μ(b) - 1 = ‖N‖_F² - 1 = ‖K‖_F².

* ``σ₂(π)``: the second singular value of ``N``; the top one is 1 (left and
  right vector ``r``), so ``σ₂ = ‖K‖₂`` (computed that way, no sign ambiguity).
* χ² contraction coefficient, computed **at the stationary input**::

      η_χ²(π, μ) = sup_{ν ≠ μ} χ²(ν π ‖ μ) / χ²(ν ‖ μ) = σ₂(π)²

  (maximal correlation squared of the pair ``(s_{p(i)}, s_i)``; the supremum is
  attained at ``ν = μ + t D^{1/2} u`` with ``u`` the top left singular vector
  of ``K``; the tests check both directions). It is *not* the
  input-independent ``sup_μ η_χ²(π, μ)``, which equals the KL contraction
  coefficient. Always ``σ₂² ≤ δ(π)`` (Cohen et al. 1993, the paper's ref. 11).
* Dobrushin coefficient ``δ(π) = ½ max_{a,a'} ‖π(a,·) - π(a',·)‖₁``.
* ``‖π - 1μᵀ‖_F² = Σ_a ‖π(·|a) - μ‖²`` (the paper's non-degeneracy quantity).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._validation import ArgumentTypeError
from ..task.priors import ROW_SUM_TOL, stationary_distribution

__all__ = [
    "ChainInformation",
    "chain_information",
    "normalized_kernel",
    "chi2_mutual_information",
    "sigma2",
    "dobrushin_coefficient",
    "chi2_contraction_coefficient",
    "deviation_norm2",
]

#: Smallest stationary probability accepted: the formulas divide by ``μ(b)``.
MU_MIN = 1e-300


# ------------------------------------------------------------------ results
class ChainInformation(NamedTuple):
    """Information quantities of one transition matrix ``π`` (module docstring).

    Attributes
    ----------
    mu : ndarray, shape (S,)
        Stationary distribution (GTH).
    kernel : ndarray, shape (S, S)
        ``K = D^{1/2} π D^{-1/2} - √μ√μᵀ``.
    chi2_mi : float
        ``I_χ² = ‖K‖_F²``.
    sigma2 : float
        Second singular value of ``D^{1/2} π D^{-1/2}`` (``= ‖K‖₂``).
    chi2_contraction : float
        ``η_χ²(π, μ) = σ₂²`` (stationary input).
    dobrushin : float
        ``δ(π) = ½ max_{a,a'} ‖π(a,·) - π(a',·)‖₁``.
    deviation_norm2 : float
        ``‖π - 1μᵀ‖_F²`` (non-degeneracy quantity of Knowl 10).
    trace : float
        ``tr π`` (``g[i,i](π) = tr π - 1``).
    gamma_min_entry : float
        ``S · min π`` (Assumption 1 holds for every ``γ`` up to this).
    gamma : float
        ``min(S·min π, sqrt(S·‖π - 1μᵀ‖_F²))``: the largest ``γ`` for which
        ``π`` meets Assumptions 1 and 2 of Knowl 10 (``min π ≥ γ/S`` and
        ``‖π - 1μᵀ‖_F² ≥ γ²/S``).
    """

    mu: np.ndarray
    kernel: np.ndarray
    chi2_mi: float
    sigma2: float
    chi2_contraction: float
    dobrushin: float
    deviation_norm2: float
    trace: float
    gamma_min_entry: float
    gamma: float


# ---------------------------------------------------------- validation
def _as_transition(pi, name="pi") -> np.ndarray:
    if hasattr(pi, "prior") and hasattr(pi, "graph"):  # a task where a matrix belongs: say so, not float()'s words
        raise ArgumentTypeError(f"{name} must be an (S, S) transition matrix, got a {type(pi).__name__}: pass one "
                                "matrix, e.g. task.prior.atoms[k] of a finite prior")
    try:
        arr = np.asarray(pi, dtype=np.float64)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{name} must be an (S, S) transition matrix of real numbers, got "
                                f"{type(pi).__name__}") from None
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] < 2:
        raise ValueError(f"{name} must be a square (S, S) transition matrix with S >= 2, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has non-finite entries: transition probabilities must be finite")
    if np.any(arr < 0):
        a, b = (int(x) for x in np.argwhere(arr < 0)[0])
        raise ValueError(f"{name}[{a}, {b}] = {arr[a, b]} is negative: transition probabilities must be >= 0")
    err = np.abs(arr.sum(axis=1) - 1.0)
    if err.max() > ROW_SUM_TOL:
        a = int(err.argmax())
        raise ValueError(
            f"row {a} of {name} sums to {arr[a].sum()!r}, not 1 (tolerance {ROW_SUM_TOL}): "
            f"normalize the rows, pi / pi.sum(axis=1, keepdims=True)"
        )
    return arr


def _as_mu(mu, pi, name="pi") -> np.ndarray:
    S = pi.shape[0]
    if mu is None:
        mu = stationary_distribution(pi)
    else:
        mu = np.asarray(mu, dtype=np.float64)
        if mu.shape != (S,):
            raise ValueError(f"mu must have shape ({S},) to match {name}, got {mu.shape}")
        if np.abs(mu @ pi - mu).max() > 1e-10 or abs(mu.sum() - 1.0) > 1e-10:
            raise ValueError("mu is not the stationary distribution of pi (mu @ pi != mu or sum != 1): pass mu=None")
    if not mu.min() > MU_MIN:
        raise ValueError(
            f"{name} has stationary probability mu[{int(mu.argmin())}] = {mu.min():.3g}: the chi-squared "
            f"quantities divide by mu, so the chain must be irreducible with mu > 0 everywhere "
            f"(e.g. mix with the uniform matrix, (1-t)*pi + t/S)"
        )
    return mu


# ------------------------------------------------------ single-π quantities
def _kernels(atoms, mu) -> np.ndarray:
    """``K = D^{1/2} π D^{-1/2} - √μ√μᵀ`` for a stack ``(K, S, S)``."""
    r = np.sqrt(mu)
    return r[:, :, None] * atoms / r[:, None, :] - r[:, :, None] * r[:, None, :]


def normalized_kernel(pi, mu=None) -> np.ndarray:
    """Normalized kernel ``K = D^{1/2} π D^{-1/2} - √μ√μᵀ``, shape ``(S, S)``.

    Parameters
    ----------
    pi : array_like, shape (S, S)
        Irreducible row-stochastic matrix, ``pi[a, b] = π(b | a)``.
    mu : array_like, shape (S,), optional
        Its stationary distribution (computed by GTH when omitted).
    """
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    return _kernels(pi[None], mu[None])[0]


def chi2_mutual_information(pi, mu=None) -> float:
    """``I_χ²(s_i; s_{p(i)} | π) = Σ μ(a)π(a,b)²/μ(b) - 1 = ‖K‖_F²``."""
    K = normalized_kernel(pi, mu)
    return float(np.sum(K * K))


def sigma2(pi, mu=None) -> float:
    """Second singular value of ``D^{1/2} π D^{-1/2}``, computed as ``‖K‖₂``."""
    return float(np.linalg.norm(normalized_kernel(pi, mu), 2))


def chi2_contraction_coefficient(pi, mu=None) -> float:
    """χ² contraction coefficient at the stationary input, ``η_χ²(π, μ) = σ₂²``.

    ``sup_{ν ≠ μ} χ²(νπ ‖ μ) / χ²(ν ‖ μ)`` (maximal correlation squared).
    """
    return sigma2(pi, mu) ** 2


def dobrushin_coefficient(pi) -> float:
    """Dobrushin coefficient ``δ(π) = ½ max_{a,a'} ‖π(a,·) - π(a',·)‖₁`` in ``[0, 1]``."""
    pi = _as_transition(pi)
    return float(0.5 * np.abs(pi[:, None, :] - pi[None, :, :]).sum(axis=2).max())


def deviation_norm2(pi, mu=None) -> float:
    """``‖π - 1μᵀ‖_F² = Σ_a ‖π(·|a) - μ‖²`` (the non-degeneracy quantity)."""
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    return float(np.sum((pi - mu[None, :]) ** 2))


def chain_information(pi, mu=None) -> ChainInformation:
    """All information quantities of one transition matrix (module docstring).

    Parameters
    ----------
    pi : array_like, shape (S, S)
        Irreducible row-stochastic matrix.
    mu : array_like, shape (S,), optional
        Stationary distribution; GTH when omitted.

    Returns
    -------
    ChainInformation
    """
    pi = _as_transition(pi)
    mu = _as_mu(mu, pi)
    S = pi.shape[0]
    K = _kernels(pi[None], mu[None])[0]
    s2 = float(np.linalg.norm(K, 2))
    dev = float(np.sum((pi - mu[None, :]) ** 2))
    gmin = float(S * pi.min())
    return ChainInformation(
        mu=mu,
        kernel=K,
        chi2_mi=float(np.sum(K * K)),
        sigma2=s2,
        chi2_contraction=s2 * s2,
        dobrushin=float(0.5 * np.abs(pi[:, None, :] - pi[None, :, :]).sum(axis=2).max()),
        deviation_norm2=dev,
        trace=float(np.trace(pi)),
        gamma_min_entry=gmin,
        gamma=float(min(gmin, np.sqrt(S * dev))),
    )
