"""Finite priors over transition tensors (DESIGN §9).

A transition tensor holds ``π(c | a_1, ..., a_k)``. popgrad stores a finite
prior's atoms **flat**, shape ``(K, S**k, S)``::

    atoms[m, r, c] = π_m(c | a_1, ..., a_k),   r = a_1 S^{k-1} + a_2 S^{k-2} + ... + a_k

(the base-``S`` numeral of the parent tuple, first parent most significant,
i.e. ``numpy.ravel_multi_index`` of the tensor form). The tensor form
``(K,) + (S,)*k + (S,)`` is accepted on input and returned by
:attr:`TensorPrior.tensors`. Every row ``atoms[m, r, :]`` is a probability
distribution. :func:`dirichlet_tensor_prior` draws every row from
Dirichlet(α) with a fixed seed; ``symmetrize=True`` closes the atom set under
all ``S!`` relabelings ``π^σ(σc | σa_1 .. σa_k) = π(c | a_1 .. a_k)``.
"""
from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

from .._validation import as_int, as_rng
from .priors import FinitePrior, checked_atoms, dirichlet_arguments
from .relabeling import MAX_CLOSURE_ATOMS, closed_under_relabeling

__all__ = ["TensorPrior", "TensorPriorDiagnostics", "closure_atoms", "dirichlet_tensor_prior", "relabel_tensor"]


# =================================================================== priors
def relabel_tensor(pi, perm) -> np.ndarray:
    """Relabel tokens of a transition tensor: ``out[σa_1, ..., σa_k, σc] = pi[a_1, ..., a_k, c]``.

    Parameters
    ----------
    pi : array_like, shape (S,)*k + (S,) or (S**k, S) (flat)
    perm : array_like of int, shape (S,)
        ``σ`` as ``perm[a] = σ(a)``.

    Returns
    -------
    ndarray of the same shape as ``pi``. For ``k = 1`` this is
    :func:`popgrad.relabel`.
    """
    pi = np.asarray(pi, dtype=np.float64)
    perm = np.asarray(perm)
    S = perm.shape[0]
    ten = pi.reshape((S,) * (_log_int(pi.shape[0], S) + 1)) if pi.ndim == 2 else pi
    out = np.empty_like(ten)
    out[np.ix_(*([perm] * ten.ndim))] = ten
    return out.reshape(pi.shape)


class TensorPriorDiagnostics(NamedTuple):
    """What can be measured of a transition-tensor prior (the k-parent analogue of "Knowl 10").

    Attributes
    ----------
    gamma : float
        ``S · min π`` over atoms, parent tuples and tokens.
    symmetric : bool or None
        Whether the weighted atom set is closed under all relabelings
        (``None`` when ``S > 6``: not checked).
    uniform_mean_error : float
        ``max |E[π] - 1/S|``.
    uniform_mean : bool
        ``uniform_mean_error ≤ 1e-12``.
    """

    gamma: float
    symmetric: object
    uniform_mean_error: float
    uniform_mean: bool

    def summary(self) -> str:
        sym = "not checked (S > 6)" if self.symmetric is None else str(self.symmetric)
        return (
            f"gamma={self.gamma:.4g} (min pi = gamma/S), relabeling-symmetric={sym}, "
            f"uniform mean={self.uniform_mean} (max |E[pi]-1/S| = {self.uniform_mean_error:.3g})"
        )


class TensorPrior:
    """A finite prior over ``k``-parent transition tensors ``π(c | a_1, ..., a_k)``.

    Parameters
    ----------
    atoms : array_like
        Flat ``(K, S**k, S)``, tensor ``(K,) + (S,)*k + (S,)``, or a single
        atom ``(S**k, S)`` / ``(S,)*(k+1)``. ``atoms[m, r, c] = π_m(c | a)``
        with ``r`` the base-``S`` numeral of ``a = (a_1, ..., a_k)``.
        Finite, non-negative, every row summing to one within ``1e-12``.
    weights : array_like, shape (K,), optional
        Non-negative, summing to one. Default uniform.
    k : int, optional
        Parents per tuple; inferred when omitted: a 2-D array is one flat
        atom, a 3-D array a stack of flat atoms (so ``(S, S, S)`` means ``S``
        single-parent atoms: pass ``k=2`` for one two-parent tensor), and
        ``d ≥ 4`` dimensions a stack of tensors with ``k = d - 2``.

    Raises
    ------
    ValueError
        Naming the offending atom/row and the fix.
    """

    __slots__ = ("_atoms", "_weights", "_k", "_symmetric")

    def __init__(self, atoms, weights=None, k=None):
        try:
            a = np.array(atoms, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("atoms must be a real array of transition tensors") from None
        a = _flat_atoms(a, k)
        K, R, S = a.shape
        kk = _log_int(R, S)
        self._atoms, self._weights = checked_atoms(a, weights, kk, tensor_rows=True)
        self._k = kk
        self._symmetric = None

    @classmethod
    def from_finite(cls, prior: FinitePrior) -> "TensorPrior":
        """The ``k = 1`` tensor prior with the atoms and weights of a :class:`FinitePrior`."""
        return cls(prior.atoms, prior.weights, k=1)

    # ---------------------------------------------------------- properties
    @property
    def atoms(self) -> np.ndarray:
        """Read-only flat atoms ``(K, S**k, S)``."""
        return self._atoms

    @property
    def tensors(self) -> np.ndarray:
        """The atoms in tensor form ``(K,) + (S,)*k + (S,)`` (a read-only view)."""
        return self._atoms.reshape((self.K,) + (self.S,) * (self.k + 1))

    @property
    def weights(self) -> np.ndarray:
        """Read-only ``(K,)`` prior weights."""
        return self._weights

    @property
    def K(self) -> int:
        """Number of atoms."""
        return int(self._atoms.shape[0])

    @property
    def S(self) -> int:
        """Alphabet size."""
        return int(self._atoms.shape[2])

    @property
    def k(self) -> int:
        """Parents per tuple."""
        return self._k

    def mean(self) -> np.ndarray:
        """``E[π]``, flat shape ``(S**k, S)``."""
        return np.einsum("m,mrc->rc", self._weights, self._atoms)

    # --------------------------------------------------------- diagnostics
    def is_relabeling_closed(self, tol: float = 1e-10):
        """Whether the weighted atom set is invariant under every relabeling (``None`` for ``S > 6``)."""
        if self.S > 6:
            return None
        if self._symmetric is None:
            self._symmetric = closed_under_relabeling(self.tensors, self._weights, tol)
        return self._symmetric

    def diagnostics(self) -> TensorPriorDiagnostics:
        """``γ``, relabeling symmetry and uniform mean of this prior."""
        S = self.S
        err = float(np.abs(self.mean() - 1.0 / S).max())
        return TensorPriorDiagnostics(
            gamma=float(S * self._atoms.min()),
            symmetric=self.is_relabeling_closed(),
            uniform_mean_error=err,
            uniform_mean=bool(err <= 1e-12),
        )

    def summary(self) -> str:
        return f"TensorPrior S={self.S} k={self.k} K={self.K} atoms\n  " + self.diagnostics().summary()

    def __repr__(self):
        return f"TensorPrior(S={self.S}, k={self.k}, K={self.K})"

    def fingerprint_bytes(self) -> bytes:
        """Bytes that identify the prior exactly (for task fingerprints)."""
        return np.ascontiguousarray(self._atoms).tobytes() + np.ascontiguousarray(self._weights).tobytes()


def _log_int(R, S) -> int:
    k, p = 0, 1
    while p < R:
        p *= S
        k += 1
    if p != R or k < 1:
        raise ValueError(f"flat atoms need S**k rows (k >= 1 parent-tuple rows for S = {S} tokens), got {R} rows")
    return k


def _flat_atoms(a, k):
    """Bring atoms to the flat ``(K, S**k, S)`` form (see :class:`TensorPrior`).

    Without ``k``: 2-D is one flat atom, 3-D a stack of flat atoms (so
    ``(S, S, S)`` is ``S`` single-parent atoms: pass ``k=2`` for one
    two-parent tensor), ``d ≥ 4`` dimensions a stack of tensors with
    ``k = d - 2``.
    """
    if a.ndim < 2:
        raise ValueError(f"atoms must have shape (K, S**k, S) or (K,)+(S,)*(k+1), got shape {a.shape}")
    S = a.shape[-1]
    if S < 2:
        raise ValueError(f"the alphabet needs S >= 2 tokens, got S = {S}")
    if k is not None:
        k = as_int(k, "k", minimum=1)
        if a.shape == (S**k, S) or a.shape == (S,) * (k + 1):
            return a.reshape(1, S**k, S)
        if a.shape[1:] == (S**k, S) or a.shape[1:] == (S,) * (k + 1):
            return a.reshape(a.shape[0], S**k, S)
        raise ValueError(
            f"atoms of shape {a.shape} do not hold k = {k} parent transition tensors over S = {S} tokens: "
            f"expected (K, {S**k}, {S}) or (K,)+({S},)*{k + 1}"
        )
    if a.ndim == 2:
        _log_int(a.shape[0], S)
        return a[None]
    if a.ndim == 3:
        _log_int(a.shape[1], S)
        return a
    if any(d != S for d in a.shape[1:]):
        raise ValueError(f"tensor atoms must have shape (K,)+(S,)*(k+1) with S = {S}, got shape {a.shape}")
    return a.reshape(a.shape[0], -1, S)


def closure_atoms(S: int, n_atoms: int, symmetrize) -> int:
    """Atoms of :func:`dirichlet_tensor_prior`'s closure: ``n_atoms`` times ``S!`` (``True``, ``"relabel"``),
    ``S!²`` (``"full"``: inputs and outputs relabeled independently) or 1 (``False``)."""
    if symmetrize is False:
        return n_atoms
    n_perm = math.factorial(S)
    return n_atoms * n_perm * (n_perm if symmetrize == "full" else 1)


def dirichlet_tensor_prior(S: int, k: int, alpha: float, n_atoms: int, seed, symmetrize=True) -> TensorPrior:
    """A finite prior of ``k``-parent transition tensors with Dirichlet(α) rows.

    Every row ``π(· | a_1..a_k)`` of every atom is an independent
    Dirichlet(α) draw from ``numpy.random.default_rng(seed)`` (rows in the
    flat order of :class:`TensorPrior`). For ``k = 1`` the draws equal
    :func:`popgrad.dirichlet_prior`'s.

    ``symmetrize`` closes the finite set under symmetries of the i.i.d.
    Dirichlet prior it stands for (equally weighted atoms):

    * ``True`` / ``"relabel"``: all ``S!`` relabelings
      ``π^σ(σc | σa_1..σa_k) = π(c | a_1..a_k)`` (``n_atoms · S!`` atoms):
      exact permutation symmetry, but ``E[π]`` is uniform only up to the
      sampling error of ``n_atoms`` draws (``E[π(c | a)]`` still depends on
      which of ``c, a_1, …, a_k`` coincide);
    * ``"full"``: independent relabelings of the parent tokens and of the
      predicted token, ``π'(τc | σa_1..σa_k) = π(c | a_1..a_k)``
      (``n_atoms · S!²`` atoms): contains the relabelings and makes
      ``E[π] = 11ᵀ/S`` exact (the symmetric Dirichlet prior is invariant
      under both), so finite-sample "copy the token" biases of the prior
      disappear;
    * ``False``: the raw draws.

    Parameters
    ----------
    S : int
        Alphabet size ``≥ 2``.
    k : int
        Parents per tuple ``≥ 1``.
    alpha : float
        Dirichlet concentration ``> 0``.
    n_atoms : int
        Draws ``≥ 1``.
    seed : int
    symmetrize : bool, default True
    """
    S, alpha, n_atoms = dirichlet_arguments(S, alpha, n_atoms)
    k = as_int(k, "k", minimum=1)
    rng = as_rng(seed, "seed")
    atoms = rng.dirichlet(np.full(S, alpha), size=(n_atoms, S**k))
    atoms = atoms / atoms.sum(axis=2, keepdims=True)
    if not np.all(np.isfinite(atoms)):
        raise ValueError(f"Dirichlet draws with alpha={alpha} underflowed to NaN; use a larger alpha")
    if symmetrize is False:
        return TensorPrior(atoms, k=k)
    if symmetrize not in (True, "relabel", "full"):
        raise ValueError(f"symmetrize must be True, False, 'relabel' or 'full', got {symmetrize!r}")
    perms = list(itertools.permutations(range(S)))
    outs = perms if symmetrize == "full" else [None]
    n_out = closure_atoms(S, n_atoms, symmetrize)
    if n_out > MAX_CLOSURE_ATOMS:
        raise ValueError(
            f"closing {n_atoms} atoms under {symmetrize!r} symmetry would create {n_out} atoms "
            f"(limit {MAX_CLOSURE_ATOMS}): use symmetrize=False, fewer atoms, or a smaller S"
        )
    out = np.empty((n_out, S**k, S))
    j = 0
    for m in range(n_atoms):
        for tau in outs:
            base = atoms[m] if tau is None else atoms[m][:, np.argsort(tau)]  # base[:, τc] = atoms[m][:, c]
            for perm in perms:
                out[j] = relabel_tensor(base, perm)
                j += 1
    return TensorPrior(out, np.full(n_out, 1.0 / n_out), k=k)
