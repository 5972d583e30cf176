"""Finite priors over transition matrices (DESIGN §1, §6).

A transition matrix ``pi`` is row-stochastic, ``pi[a, b] = π(b | a)``. Its
stationary distribution (GTH) is in :mod:`popgrad.task.stationary`, the token
relabelings and the closure test in :mod:`popgrad.task.relabeling`; both are
re-exported here.

In the exact engine a prior is a finite set of atoms ``atoms[k]`` (shape
``(K, S, S)``) with weights ``weights[k]`` summing to one. A Dirichlet(α)
prior is represented by ``n_atoms`` row-wise Dirichlet draws from a fixed
seed; ``symmetrize=True`` closes the atom set under all ``S!`` relabelings
``σ π σ⁻¹`` (paper Assumption 3). Every population quantity popgrad computes
is then *exact for that finite prior*.

Diagnostics of the paper's assumptions ("Knowl 10"), per prior:

* ``gamma = S · min_{k,a,b} π_k(b|a)`` (so ``min π ≥ γ/S``);
* non-degeneracy ``min_k Σ_a ‖π_k(·|a) - μ_k‖² ≥ γ²/S``;
* permutation symmetry (the weighted atom set is closed under relabeling);
* uniform mean ``E[π] = 11ᵀ/S``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._validation import as_int, as_real, as_rng
from .relabeling import (MAX_CLOSURE_ATOMS, _inverse_perms, closed_under_relabeling,  # noqa: F401  (old import path)
                         relabel, relabel_closure)
from .stationary import STOCHASTIC_ATOL, _as_stochastic, _gth, stationary_distribution  # noqa: F401  (old path)

__all__ = [
    "FinitePrior",
    "PriorDiagnostics",
    "dirichlet_prior",
    "stationary_distribution",
    "relabel",
    "relabel_closure",
]

#: Tolerance on row sums of transition matrices.
ROW_SUM_TOL = 1e-12


# ---------------------------------------------------------------- the prior
def validated_weights(weights, K: int) -> np.ndarray:
    """Prior weights as a float64 ``(K,)`` array: uniform when ``None``, else checked.

    Raises ``ValueError`` unless the weights have shape ``(K,)``, are finite
    and non-negative and sum to one within :data:`ROW_SUM_TOL`.
    """
    if weights is None:
        return np.full(K, 1.0 / K)
    weights = np.array(weights, dtype=np.float64).reshape(-1)
    if weights.shape != (K,):
        raise ValueError(f"weights must have shape ({K},) to match the {K} atoms, got {weights.shape}")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError("weights must be finite and non-negative")
    if abs(weights.sum() - 1.0) > ROW_SUM_TOL:
        raise ValueError(f"weights sum to {float(weights.sum())!r}, not 1 (tolerance {ROW_SUM_TOL}): normalise them")
    return weights


class PriorDiagnostics(NamedTuple):
    """The paper's assumptions on a prior ("Knowl 10"), measured.

    Attributes
    ----------
    gamma : float
        ``S · min π`` over all atoms and entries: ``min π ≥ γ/S`` holds with
        this ``γ`` (0 when some transition is impossible).
    nondegeneracy : float
        ``min_k Σ_a ‖π_k(·|a) - μ_k‖²`` (paper: ``≥ γ²/S``).
    nondegenerate : bool
        Whether ``nondegeneracy ≥ gamma² / S``.
    symmetric : bool or None
        Whether the weighted atom set is closed under all relabelings.
    uniform_mean_error : float
        ``max |E[π] - 1/S|`` over entries.
    uniform_mean : bool
        Whether ``uniform_mean_error ≤ 1e-12``.
    """

    gamma: float
    nondegeneracy: float
    nondegenerate: bool
    symmetric: bool
    uniform_mean_error: float
    uniform_mean: bool

    def summary(self) -> str:
        sym = str(self.symmetric)
        return (
            f"gamma={self.gamma:.4g} (min pi = gamma/S; Knowl 10.1 with gamma >= 0.1: {self.gamma >= 0.1}), "
            f"non-degeneracy={self.nondegeneracy:.4g} (>= gamma^2/S: {self.nondegenerate}), "
            f"relabeling-symmetric={sym}, "
            f"uniform mean={self.uniform_mean} (max |E[pi]-1/S| = {self.uniform_mean_error:.3g})"
        )


def _row_digits(r: int, S: int, k: int) -> str:
    """The parent tuple of flat row ``r`` (``k`` base-``S`` digits, most significant first), e.g. ``"0, 2"``."""
    digits = []
    for _ in range(k):
        digits.append(r % S)
        r //= S
    return ", ".join(str(d) for d in reversed(digits))


def checked_atoms(atoms, weights, k: int = 1, tensor_rows: bool = False) -> tuple:
    """A prior's flat atoms ``(K, S**k, S)`` (a float64 array of its own, ``atoms[m, r, c] = π_m(c | a)`` with
    ``r`` the base-``S`` numeral of the parent tuple ``a``) and its weights, checked (:func:`validated_weights`)
    and made read-only: ``(atoms, weights)``.

    A ValueError names the first bad entry (in tensor indices ``atoms[m][a_1, …, a_k, c]``) and its row
    (``a``, or ``π(· | a)`` with ``tensor_rows``) and the fix: not finite, negative, or a row not summing to
    one within :data:`ROW_SUM_TOL`.
    """
    S = atoms.shape[2]
    if not np.all(np.isfinite(atoms)):
        m = int(np.argwhere(~np.isfinite(atoms))[0, 0])
        raise ValueError(f"atoms[{m}] has non-finite entries: transition probabilities must be finite")
    if np.any(atoms < 0):
        m, r, c = (int(x) for x in np.argwhere(atoms < 0)[0])
        a = _row_digits(r, S, k)
        raise ValueError(
            f"atoms[{m}][{a}, {c}] = {atoms[m, r, c]:.3g} is negative (row {f'π(· | {a})' if tensor_rows else a} "
            f"of atoms[{m}] is not a distribution): transition probabilities must be >= 0"
        )
    rows = atoms.sum(axis=2)
    bad = np.abs(rows - 1.0) > ROW_SUM_TOL
    if np.any(bad):
        m, r = (int(x) for x in np.argwhere(bad)[0])
        a = _row_digits(r, S, k)
        raise ValueError(
            f"row {f'π(· | {a})' if tensor_rows else a} of atoms[{m}] sums to {float(rows[m, r])!r}, not 1 "
            f"(tolerance {ROW_SUM_TOL}): every row π(· | a) must be a probability distribution "
            "(divide rows by their sums)"
        )
    weights = validated_weights(weights, atoms.shape[0])
    atoms.setflags(write=False)
    weights.setflags(write=False)
    return atoms, weights


class FinitePrior:
    """A finite prior over ``S×S`` transition matrices.

    Parameters
    ----------
    atoms : array_like, shape (K, S, S) or (S, S)
        Row-stochastic matrices ``atoms[k, a, b] = π_k(b | a)``: finite,
        non-negative, every row summing to one within ``1e-12``.
    weights : array_like, shape (K,), optional
        Non-negative, summing to one within ``1e-12``. Default: uniform.

    Raises
    ------
    ValueError
        Naming the offending atom/row and the fix.
    """

    __slots__ = ("_atoms", "_weights", "_mu", "_symmetric", "_base")

    def __init__(self, atoms, weights=None):
        atoms = np.array(atoms, dtype=np.float64)
        if atoms.ndim == 2:
            atoms = atoms[None]
        if atoms.ndim != 3 or atoms.shape[1] != atoms.shape[2] or atoms.shape[0] < 1:
            raise ValueError(
                f"atoms must have shape (K, S, S) with K >= 1 (a stack of square transition matrices), "
                f"got shape {atoms.shape}"
            )
        K, S, _ = atoms.shape
        if S < 2:
            raise ValueError(f"the alphabet needs S >= 2 tokens, got S = {S}")
        self._atoms, self._weights = checked_atoms(atoms, weights)
        self._mu = None
        self._symmetric = None
        self._base = None

    @classmethod
    def relabeling_closure(cls, atoms, weights=None) -> "FinitePrior":
        """The closure of ``(atoms, weights)`` under all ``S!`` token relabelings, kept *implicit*.

        The prior is the one :func:`relabel_closure` would build (``K·S!``
        atoms, atom ``k``'s relabelings each with weight ``weights[k]/S!``,
        in the same order), but only the base draws are stored: quantities
        that are invariant under relabeling (the Stage-1 field, the idealized
        gradient, χ² information, the assumptions) use the base draws
        (:meth:`invariant_view`), and the full atom set is built on first use
        of :attr:`atoms` (the enumeration engine), or refused with a
        ``ValueError`` naming its size when it would exceed
        :data:`MAX_CLOSURE_ATOMS` (S = 10 has 3,628,800 relabelings).
        """
        base = cls(atoms, weights)
        prior = cls.__new__(cls)
        prior._atoms = None
        prior._weights = None
        prior._mu = None
        prior._symmetric = True
        prior._base = base
        return prior

    def _expand(self) -> None:
        if self._atoms is None:
            b = self._base
            atoms, weights = relabel_closure(b.atoms, b.weights)  # raises, naming the size, when too large
            atoms.setflags(write=False)
            weights.setflags(write=False)
            # The relabeled atoms' stationary distributions are the base ones relabeled (exactly
            # equivariant, and S!-fold cheaper than GTH on every relabeled atom).
            inv = _inverse_perms(b.S)
            mu = b.stationary[:, inv].reshape(-1, b.S)
            mu.setflags(write=False)
            self._atoms, self._weights, self._mu = atoms, weights, mu

    def expand(self):
        """``(atoms, weights)``: every atom, ``(K, S, S)`` and ``(K,)`` float64, read-only.

        For an implicit relabeling closure (:meth:`relabeling_closure`) this
        *builds* the ``K_base · S!`` relabeled atoms on the first call (S = 8,
        one base draw: 40,320 atoms) and keeps them; it raises ``ValueError``,
        naming the size, past :data:`MAX_CLOSURE_ATOMS`. For any other prior
        it returns the stored arrays. A quantity invariant under relabeling
        needs no expansion: use :meth:`invariant_view`.
        """
        if self._base is not None:
            self._expand()
        return self._atoms, self._weights

    # ------------------------------------------------------------ properties
    @property
    def atoms(self) -> np.ndarray:
        """Read-only ``(K, S, S)`` float64 transition matrices: ``expand()[0]`` (expands an implicit closure)."""
        return self.expand()[0]

    @property
    def weights(self) -> np.ndarray:
        """Read-only ``(K,)`` float64 prior weights (sum to one): ``expand()[1]`` (expands an implicit closure)."""
        return self.expand()[1]

    @property
    def K(self) -> int:
        """Number of atoms (``K_base · S!`` for an implicit relabeling closure, never materialized for this)."""
        if self._base is not None:
            return self._base.K * math.factorial(self._base.S)
        return int(self._atoms.shape[0])

    @property
    def S(self) -> int:
        """Alphabet size."""
        return self._base.S if self._base is not None else int(self._atoms.shape[1])

    @property
    def implicit_closure(self) -> bool:
        """True for a prior built by :meth:`relabeling_closure` (base draws + the closure flag)."""
        return self._base is not None

    @property
    def base(self) -> "FinitePrior":
        """The base draws of an implicit relabeling closure; the prior itself otherwise."""
        return self._base if self._base is not None else self

    def invariant_view(self):
        """``(atoms, weights, stationary)`` on which a relabeling-invariant quantity may be computed.

        The base draws for an implicit closure (``S!`` times fewer atoms; the
        same value up to rounding, because the quantity is invariant), the
        prior's own atoms otherwise.
        """
        b = self.base
        return b.atoms, b.weights, b.stationary

    @property
    def stationary(self) -> np.ndarray:
        """Read-only ``(K, S)`` stationary distributions (GTH), rows sum to one."""
        if self._base is not None:
            self._expand()  # sets the relabeled stationary distributions
        if self._mu is None:
            mu = stationary_distribution(self.atoms)
            mu.setflags(write=False)
            self._mu = mu
        return self._mu

    def mean(self) -> np.ndarray:
        """``E[π]`` under the prior, shape ``(S, S)``.

        For an implicit relabeling closure, ``d·I + (1-d)/(S-1)·(11ᵀ - I)`` with
        ``d = E_base[tr π]/S`` (the mean of a relabeling-closed prior).
        """
        if self._base is not None:
            S = self.S
            b = self._base
            d = float(b.weights @ np.trace(b.atoms, axis1=1, axis2=2)) / S
            return np.where(np.eye(S, dtype=bool), d, (1.0 - d) / (S - 1))
        return np.einsum("k,kab->ab", self._weights, self._atoms)

    # ----------------------------------------------------------- diagnostics
    def is_relabeling_closed(self, tol: float = 1e-10) -> bool:
        """Whether the weighted atom set is invariant under every relabeling.

        Identical atoms (within ``tol``, max-abs) are merged with their
        weights summed; the prior is closed when the transposition ``(0 1)``
        and the cycle ``(0 1 … S-1)`` (which generate every relabeling) map
        each merged atom onto a merged atom of the same weight
        (:func:`closed_under_relabeling`, ``O(K S²)``). The answer for the
        default ``tol`` is cached.

        This is a property of the distribution of ``π``. For reducible atoms
        the stationary distribution that the task uses for roots (GTH) need
        not be relabeling-equivariant; the exact engine's symmetry reduction
        checks that too (:func:`popgrad.symmetry_applies`).
        """
        if self._base is not None:  # closed by construction
            return True
        if tol == 1e-10 and self._symmetric is not None:
            return self._symmetric
        closed = closed_under_relabeling(self._atoms, self._weights, tol)
        if tol == 1e-10:
            self._symmetric = closed
        return closed

    def diagnostics(self) -> PriorDiagnostics:
        """Measure the paper's assumptions on this prior (DESIGN §6)."""
        S = self.S
        atoms, _, mu = self.invariant_view()  # γ, non-degeneracy: invariant under relabeling
        gamma = float(S * atoms.min())
        dev = atoms - mu[:, None, :]
        nondeg = float((dev**2).sum(axis=(1, 2)).min())
        mean_err = float(np.abs(self.mean() - 1.0 / S).max())
        return PriorDiagnostics(
            gamma=gamma,
            nondegeneracy=nondeg,
            nondegenerate=bool(nondeg >= gamma**2 / S),
            symmetric=self.is_relabeling_closed(),
            uniform_mean_error=mean_err,
            uniform_mean=bool(mean_err <= 1e-12),
        )

    def summary(self) -> str:
        closure = f" ({self._base.K} draws x {self.S}! relabelings, implicit)" if self._base is not None else ""
        return f"FinitePrior S={self.S} K={self.K} atoms{closure}\n  " + self.diagnostics().summary()

    def __repr__(self):
        return f"FinitePrior(S={self.S}, K={self.K})"

    def fingerprint_bytes(self) -> bytes:
        """Bytes that identify the prior exactly (for task fingerprints); never expands a closure."""
        if self._base is not None:
            return b"relabeling-closure:" + self._base.fingerprint_bytes()
        return np.ascontiguousarray(self._atoms).tobytes() + np.ascontiguousarray(self._weights).tobytes()


# ----------------------------------------------------------------- builders
def dirichlet_prior(
    S: int, alpha: float, n_atoms: int, seed: int, symmetrize: bool = True, uniform_mean: bool = False,
    floor: float = 0.0,
) -> FinitePrior:
    """A finite prior of row-wise Dirichlet(α) transition matrices.

    The defaults (``floor=0``, ``uniform_mean=False``) are the raw draws, as in the paper's
    experiments; they sit outside the main theorem's assumptions (Knowl 10.1 fails for a small
    ``alpha``, Knowl 10.3's uniform mean fails), so the checks that need them report
    ``"inconclusive"`` and say which. ``popgrad run`` uses ``floor=0.15, uniform_mean=True`` (its
    ``--floor`` and ``--uniform-mean``), a prior inside them; pass the same here to check the theorems.

    Parameters
    ----------
    S : int
        Alphabet size, ``>= 2``.
    alpha : float
        Dirichlet concentration ``> 0`` for every row (small α: sparse,
        nearly deterministic rows).
    n_atoms : int
        Number of independent draws, ``>= 1``.
    seed : int
        Seed of ``numpy.random.default_rng``: the same seed gives the same atoms.
    symmetrize : bool, default True
        Close the set under all ``S!`` relabelings (``n_atoms · S!`` atoms
        with equal weights), implicitly (:meth:`FinitePrior.relabeling_closure`):
        the ``S!`` relabelings are built only when the enumeration engine
        needs them, so S = 10 costs what its ``n_atoms`` draws cost.
    uniform_mean : bool, default False
        Reweight the draws so that ``E[π] = 11ᵀ/S`` exactly (paper
        Assumption 3; needs ``symmetrize=True``). A relabeling-closed prior has
        ``E[π] = d·I + (1-d)/(S-1)·(11ᵀ - I)`` with ``d`` the mean diagonal
        entry, so only ``d = 1/S``, i.e. ``Σ_k w_k tr(π_k) = 1``, is needed.
        The weights are the exponential tilt ``w_k ∝ exp(λ tr π_k)`` of the
        uniform weights, with ``λ`` found by bisection: the closest weights to
        uniform (in Kullback-Leibler divergence) that satisfy the constraint.
        Raises ``ValueError`` if every draw has ``tr π < 1`` (or every
        ``> 1``): draw more atoms or change the seed.
    floor : float in [0, 1), default 0
        Mix every draw with the uniform matrix, ``π = (1 - floor)·D + floor·11ᵀ/S``,
        before the tilt: then ``min π ≥ floor/S``, i.e. Knowl 10.1 holds with
        ``γ ≥ floor`` whatever ``alpha`` (DESIGN §15). The mixture keeps a
        uniform mean uniform and shrinks the non-degeneracy sum by ``(1 - floor)²``
        (Knowl 10.2 asks ``≥ γ²/S``: a floor above about ``1/(1 + √S)`` can break it).
    """
    S, alpha, n_atoms = dirichlet_arguments(S, alpha, n_atoms)
    floor = as_real(floor, "floor", minimum=0, hint=" (the weight of the uniform matrix in each draw)")
    if floor >= 1:
        raise ValueError(f"floor must be in [0, 1), got {floor}: floor = 1 makes every draw uniform "
                         "(no structure to learn)")
    rng = as_rng(seed, "seed")
    atoms = rng.dirichlet(np.full(S, alpha), size=(int(n_atoms), int(S)))
    # Renormalise to remove the last-ulp drift of the sampler.
    atoms = atoms / atoms.sum(axis=2, keepdims=True)
    if not np.all(np.isfinite(atoms)):
        raise ValueError(
            f"Dirichlet draws with alpha={alpha} underflowed to NaN; use a larger alpha"
        )
    if floor > 0:
        atoms = (1.0 - floor) * atoms + floor / S
        atoms = atoms / atoms.sum(axis=2, keepdims=True)
    if uniform_mean and not symmetrize:
        raise ValueError("uniform_mean=True needs symmetrize=True (only a relabeling-closed prior has a uniform mean)")
    draw_weights = _uniform_mean_tilt(atoms) if uniform_mean else None
    if symmetrize:
        return FinitePrior.relabeling_closure(atoms, draw_weights)
    return FinitePrior(atoms)


def dirichlet_arguments(S, alpha, n_atoms) -> tuple:
    """``(S, alpha, n_atoms)`` of a Dirichlet prior, checked: integers ``S >= 2``, ``n_atoms >= 1`` and a
    positive finite concentration ``alpha`` (shared by :func:`dirichlet_prior` and
    :func:`popgrad.dirichlet_tensor_prior`)."""
    S = as_int(S, "S", minimum=2)
    alpha = as_real(alpha, "alpha", minimum=0, strict=True, hint=" (the Dirichlet concentration)")
    return S, alpha, as_int(n_atoms, "n_atoms", minimum=1)


def _uniform_mean_tilt(atoms) -> np.ndarray:
    """Weights ``∝ exp(λ tr π_k)`` with ``Σ_k w_k tr π_k = 1`` (see :func:`dirichlet_prior`)."""
    tr = np.trace(atoms, axis1=1, axis2=2) - 1.0
    if np.all(np.abs(tr) <= 1e-15):
        return np.full(len(tr), 1.0 / len(tr))
    if tr.max() <= 0 or tr.min() >= 0:
        raise ValueError(
            f"cannot reweight {len(tr)} draws to a uniform mean: every draw has trace "
            f"{'<' if tr.max() <= 0 else '>'} 1; draw more atoms (n_atoms) or change the seed"
        )

    def weights(lam):
        z = lam * tr
        e = np.exp(z - z.max())
        return e / e.sum()

    lo, hi = -1.0, 1.0
    while weights(lo) @ tr > 0:
        lo *= 2
    while weights(hi) @ tr < 0:
        hi *= 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if weights(mid) @ tr > 0:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-15 * max(1.0, abs(mid)):
            break
    return weights(0.5 * (lo + hi))
