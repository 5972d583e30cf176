r"""The exact floor of the ε-perturbed loss (DESIGN §15), for any task that enumerates.

The model is trained on ``L_ε(f) = -Σ_s Σ_c w(s,c) log(f_c(s) + ε)`` with
``f(s)`` in the simplex. No predictor of the sequence does better than the
per-sequence minimum::

    L_floor,ε = Σ_s min_{f ∈ Δ} -Σ_c w(s,c) log(f_c + ε).

Neither ``L*_ε`` (the oracle's ε-loss; negative when ``π + ε > 1``) nor
``L_Bayes,ε`` (the posterior predictive, optimal for ``ε = 0`` only) is a
lower bound of ``L_ε``; this is.

**Water-filling.** The problem is convex. With multiplier ``λ`` for ``Σ f = 1``
and ``ν_c ≥ 0`` for ``f_c ≥ 0``, the KKT conditions are
``w_c / (f_c + ε) = λ - ν_c``, ``ν_c f_c = 0``, so

    f_c = max(w_c/λ - ε, 0),        Σ_c f_c = 1.

Sort ``w`` decreasingly; if the top ``m`` are active,
``λ_m = (Σ_{c ≤ m} w_(c)) / (1 + m ε)``. The active set is the longest prefix
with ``w_(m) > ε λ_m`` (it is a prefix: ``w_(m+1) ≤ ε λ_m ⟺ w_(m+1) ≤ ε λ_{m+1}``),
and the row's floor is ``-Σ_{active} w_c log(w_c/λ) - Σ_{inactive} w_c log ε``
(terms with ``w_c = 0`` are 0). At ``ε = 0`` every ``w_c > 0`` is active and the
floor is the Bayes loss ``H(y | s)``.

The per-row floor is invariant under relabeling ``(s, c) → (σs, σc)``, so a
relabeling-closed prior sums one canonical sequence per orbit, times its size
(:func:`popgrad.engine.symmetry.weighted_sequences`).

* :func:`floor_loss` -- the public function (validates, then the numba kernel);
* :func:`floor_rows` -- per-row floors (numba), :func:`floor_rows_numpy` -- the NumPy reference
  (vectorized over all prefixes at once, a different computation);
* :func:`floor_predictor` -- the minimizing ``f`` per row (NumPy).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .._validation import as_eps
from ._args import check_task
from .symmetry import weighted_sequences

__all__ = ["floor_loss", "floor_rows", "floor_rows_numpy", "floor_predictor"]


@njit(cache=True)
def _floor_row(w, eps, order):
    S = w.shape[0]
    # insertion sort of the indices by decreasing w (S is small)
    for c in range(S):
        order[c] = c
    for a in range(1, S):
        k = order[a]
        b = a - 1
        while b >= 0 and w[order[b]] < w[k]:
            order[b + 1] = order[b]
            b -= 1
        order[b + 1] = k
    if w[order[0]] <= 0.0:
        return 0.0
    cum = 0.0
    lam = 0.0
    m = 0
    while m < S:
        cum += w[order[m]]
        lam = cum / (1.0 + (m + 1) * eps)
        m += 1
        if m == S or w[order[m]] <= eps * lam:
            break
    total = 0.0
    for r in range(S):
        wc = w[order[r]]
        if wc <= 0.0:
            continue
        if r < m:
            total -= wc * np.log(wc / lam)
        else:
            total -= wc * np.log(eps)
    return total


@njit(cache=True)
def _floor_rows_kernel(w, eps, out):
    order = np.empty(w.shape[1], dtype=np.int64)
    for i in range(w.shape[0]):
        out[i] = _floor_row(w[i], eps, order)


def floor_rows(w, eps: float) -> np.ndarray:
    """Per-row floors ``min_{f∈Δ} -Σ_c w[i,c] log(f_c + ε)`` (numba; module docstring).

    Parameters
    ----------
    w : array_like, shape (n, S)
        Non-negative weights (one row per sequence).
    eps : float
        ``ε >= 0``.

    Returns
    -------
    ndarray, shape (n,)
    """
    w = np.ascontiguousarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"w must have shape (n, S), got {w.shape}")
    out = np.empty(w.shape[0])
    _floor_rows_kernel(w, float(eps), out)
    return out


def _water_level(w, eps):
    """Rows sorted decreasing ``ws``, ``m = 1..S``, the active counts ``(n,)`` and levels ``λ (n, 1)``:
    every prefix's ``λ_m`` at once, the active count by counting."""
    n, S = w.shape
    ws = -np.sort(-w, axis=1)
    m = np.arange(1, S + 1)
    lam_all = np.cumsum(ws, axis=1) / (1.0 + m * eps)
    n_active = np.maximum(np.sum(ws > eps * lam_all, axis=1), 1)
    return ws, m, n_active, lam_all[np.arange(n), n_active - 1][:, None]


def floor_rows_numpy(w, eps: float) -> np.ndarray:
    """NumPy reference of :func:`floor_rows` (:func:`_water_level`, then the closed form)."""
    ws, m, n_active, lam = _water_level(np.asarray(w, dtype=np.float64), eps)
    active = m[None, :] <= n_active[:, None]
    pos = ws > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        log_f = np.where(active, np.log(np.where(pos, ws, 1.0) / np.where(lam > 0, lam, 1.0)),
                         np.log(eps) if eps > 0 else -np.inf)
    return -(ws * np.where(pos, log_f, 0.0)).sum(axis=1)


def floor_predictor(w, eps: float) -> np.ndarray:
    """The minimizing ``f`` of every row, ``f_c = max(w_c/λ - ε, 0)`` (rows with ``Σ w = 0``: uniform)."""
    w = np.asarray(w, dtype=np.float64)
    lam = _water_level(w, eps)[3]
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.maximum(w / np.where(lam > 0, lam, 1.0) - eps, 0.0)
    f[lam[:, 0] <= 0] = 1.0 / w.shape[1]
    return f


def floor_loss(task, eps=None, symmetry="auto") -> float:
    """The exact floor of the ε-perturbed loss, ``Σ_s min_{f∈Δ} -Σ_c w(s,c) log(f_c + ε)``.

    A lower bound of ``L_ε(θ)`` for every model (any ``A1``, ``A2``), attained by
    the per-sequence water-filling predictor (module docstring). Exact for the
    finite prior; enumerates ``S**T`` sequences (one per relabeling orbit when
    the prior is exactly relabeling-closed).

    Parameters
    ----------
    task : popgrad.Task or popgrad.MultiParentTask
    eps : float or None, default None
        The loss perturbation; ``None`` means ``task.default_eps`` (``T_eff**-0.5``).
    symmetry : {"auto", "off"}, default "auto"

    Returns
    -------
    float
        The floor: at most ``L_ε(A1, A2)`` for every ``A1``, ``A2``.

    Raises
    ------
    TaskTooLargeError
        If ``S**T`` exceeds ``task.max_sequences``.
    """
    return sum_over_sequences(task, eps, symmetry, _floor_chunk)


def _floor_chunk(w, mult, eps) -> float:
    rows = floor_rows(w, eps)
    return float(rows.sum() if mult is None else rows @ mult)


def sum_over_sequences(task, eps, symmetry, chunk_value) -> float:
    """``Σ chunk_value(w, mult, ε)`` over the chunks of :func:`popgrad.engine.symmetry.weighted_sequences`
    in their order (``mult``: orbit sizes, ``None`` without the orbit reduction), after checking the task,
    ``ε`` (``None``: ``task.default_eps``) and the enumeration size; the loop of the per-sequence baselines."""
    check_task(task)
    eps = as_eps(task, eps)
    task.check_size()
    total = 0.0
    for _, w, mult in weighted_sequences(task, symmetry):
        total += chunk_value(w, mult, eps)
    return total
