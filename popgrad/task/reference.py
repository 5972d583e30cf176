"""NumPy references of the exact sequence weights (DESIGN §2, §9) and the NumPy sequence decoder.

The numba kernels of :mod:`popgrad.task._weights` compute the same numbers chunk by chunk; these are
the slow, readable forms they are tested against, and the decoder the table path and the noise engine
use. Sequence ``m`` is the base-``S`` numeral ``s_0 … s_{T-1}`` (position 0 most significant).
"""
from __future__ import annotations

import numpy as np

__all__ = ["decode_sequences", "sequence_weights_numpy", "parent_rows", "sequence_weights_multi_numpy"]


def decode_sequences(start: int, stop: int, S: int, T: int) -> np.ndarray:
    """Sequences number ``start .. stop-1`` of the enumeration order, shape ``(stop-start, T)``, int64.

    The NumPy form of the one decoder (:func:`popgrad.task._weights.decode_sequence`):
    sequence ``m`` is the base-``S`` numeral ``s_0 … s_{T-1}``, position 0 most significant.
    """
    powers = S ** np.arange(T - 1, -1, -1, dtype=np.int64)
    return (np.arange(start, stop, dtype=np.int64)[:, None] // powers) % S


def sequence_weights_numpy(seqs, parents, mu, atoms, prior_w) -> np.ndarray:
    """NumPy reference for the exact weights ``w(s, c)`` of given sequences.

    Parameters
    ----------
    seqs : int array (n, T)
    parents : int array (T,)
    mu : float64 (K, S)
    atoms : float64 (K, S, S)
    prior_w : float64 (K,)

    Returns
    -------
    w : float64 (n, S)
    """
    seqs = np.asarray(seqs)
    K, S, _ = atoms.shape
    n, T = seqs.shape
    p = np.tile((prior_w / S)[:, None], (1, n))  # (K, n)
    for i in range(T - 1):
        par = parents[i]
        if par < 0:
            p = p * mu[:, seqs[:, i]]
        else:
            p = p * atoms[:, seqs[:, par], seqs[:, i]]
    return np.einsum("kn,knc->nc", p, atoms[:, seqs[:, T - 1], :])


# ===================================================== k-parent task (DESIGN §9)
def parent_rows(seqs, parent_positions, S) -> np.ndarray:
    """Flat row index ``r = Σ_h s[p_h] S^{k-1-h}`` of given parent positions, shape ``(n,)``."""
    powers = S ** np.arange(len(parent_positions) - 1, -1, -1, dtype=np.int64)
    return np.asarray(seqs)[:, np.asarray(parent_positions)] @ powers


def sequence_weights_multi_numpy(seqs, parents, target_parents, atoms, prior_w) -> np.ndarray:
    """NumPy reference for ``w(s, c)`` of the multi-parent process (DESIGN §9), float64 ``(n, S)``::

        w(s, c) = Σ_m prior_w[m] · S^{-|R|} · Π_{non-roots i} atoms[m, r_i(s), s_i] · atoms[m, r_tp(s), c]

    with ``r_i(s)`` the flat row of position ``i``'s parent tokens (:func:`parent_rows`) and ``|R|`` the
    number of roots (they are uniform). ``seqs`` (n, T) ints; ``parents`` (T, k) and ``target_parents``
    (k,) as :class:`popgrad.MultiParentGraph` holds them; ``atoms`` (K, S**k, S); ``prior_w`` (K,).
    """
    seqs = np.asarray(seqs)
    K, _, S = atoms.shape
    n, T = seqs.shape
    n_roots = int(np.sum(parents[:, 0] < 0))
    p = np.tile((prior_w * float(S) ** -n_roots)[:, None], (1, n))  # (K, n)
    for i in range(T):
        if parents[i, 0] >= 0:
            p = p * atoms[:, parent_rows(seqs, parents[i], S), seqs[:, i]]
    rt = parent_rows(seqs, target_parents, S)
    return np.einsum("kn,knc->nc", p, atoms[:, rt, :])
