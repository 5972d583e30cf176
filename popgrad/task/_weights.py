"""Numba kernels of the exact sequence weights (DESIGN §2) and the one sequence decoder.

Enumeration order (shared by every kernel of popgrad): sequence number ``m`` in
``0 .. S**T - 1`` is the base-``S`` numeral ``s_0 s_1 ... s_{T-1}`` with
position ``0`` the most significant digit, so position ``T-1`` varies fastest:
lexicographic order, ``itertools.product(range(S), repeat=T)``.
:func:`decode_sequence` is the one place that decodes it (NumPy code uses
:func:`popgrad.task.reference.decode_sequences`).

References: :func:`popgrad.task.reference.sequence_weights_numpy` (single-parent),
:func:`popgrad.task.reference.sequence_weights_multi_numpy` (k parents).
``cache=True`` everywhere, never ``fastmath``.
"""
from numba import njit, prange


# ===========================================================================
# Exact weights (DESIGN §2)
# ===========================================================================
@njit(cache=True)
def decode_sequence(index, S, T, out):
    """Write the tokens of sequence number ``index`` into ``out[:T]``."""
    for t in range(T - 1, -1, -1):
        out[t] = index % S
        index //= S


@njit(cache=True)
def atom_path_weight(k, s, parents, mu, atoms, prior_w):
    """``(prior_w[k] / S) ∏_{i<T-1} P_k(s_i | s_{p(i)})`` (roots from ``mu[k]``; the uniform query's ``1/S``
    first): the weight of the tokens before the target under atom ``k``, in the one multiplication order
    every single-parent kernel shares (their results agree to the bit)."""
    S = atoms.shape[1]
    T = s.shape[0]
    p = prior_w[k] / S
    for i in range(T - 1):
        par = parents[i]
        if par < 0:
            p *= mu[k, s[i]]
        else:
            p *= atoms[k, s[par], s[i]]
    return p


@njit(cache=True)
def sequence_weight_row(s, parents, mu, atoms, prior_w, out):
    """``out[c] = w(s, c)`` of DESIGN §2 for one sequence ``s``."""
    K, S, _ = atoms.shape
    T = s.shape[0]
    q = s[T - 1]
    for c in range(S):
        out[c] = 0.0
    for k in range(K):
        p = atom_path_weight(k, s, parents, mu, atoms, prior_w)
        if p != 0.0:
            for c in range(S):
                out[c] += p * atoms[k, q, c]


#: Bytes of transition matrices (and stationary rows) per block of atoms in the chunk kernels: a block stays in
#: a core's cache while every sequence of the chunk reads it (a closure of 40,320 atoms, 20 MB, read atom by atom
#: for each sequence in turn, made every read a cache miss: 36 s for S = 8, T = 4). Each row still sums its atoms
#: in increasing ``k`` from 0, so the bits are those of :func:`sequence_weight_row`.
ATOM_BLOCK_BYTES = 2**15


@njit(cache=True)
def atom_block(K, S):
    """Atoms per block: ``ATOM_BLOCK_BYTES / (8 S (S + 1))``, at least 1, at most ``K``."""
    return max(1, min(K, ATOM_BLOCK_BYTES // (8 * S * (S + 1))))


@njit(cache=True)
def add_atoms(s, parents, mu, atoms, prior_w, k0, k1, out):
    """``out[c] += Σ_{k0 ≤ k < k1} p_k(s) π_k(c | s_{T-1})`` in increasing ``k`` (:func:`sequence_weight_row`'s
    terms, in its order)."""
    S = atoms.shape[1]
    q = s[s.shape[0] - 1]
    for k in range(k0, k1):
        p = atom_path_weight(k, s, parents, mu, atoms, prior_w)
        if p != 0.0:
            for c in range(S):
                out[c] += p * atoms[k, q, c]


@njit(cache=True, parallel=True)
def chunk_weights(start, parents, mu, atoms, prior_w, seqs, w):
    """Fill ``seqs (n, T)`` and ``w (n, S)`` for sequences ``start .. start+n-1``.

    Blocks of atoms (:func:`atom_block`) in increasing order, each over every sequence, parallel over
    sequences; every output row is written by one thread and sums its atoms in increasing ``k``, so the
    result does not depend on the thread count or the block size (the bits of :func:`sequence_weight_row`).
    """
    n, T = seqs.shape
    K, S, _ = atoms.shape
    for m in prange(n):
        decode_sequence(start + m, S, T, seqs[m])
        for c in range(S):
            w[m, c] = 0.0
    B = atom_block(K, S)
    for k0 in range(0, K, B):
        k1 = min(K, k0 + B)
        for m in prange(n):
            add_atoms(seqs[m], parents, mu, atoms, prior_w, k0, k1, w[m])


@njit(cache=True, parallel=True)
def rows_weights(seqs, parents, mu, atoms, prior_w, w):
    """``w[m, c] = w(seqs[m], c)`` for given sequences (same arithmetic and atom blocks as :func:`chunk_weights`)."""
    n = seqs.shape[0]
    K, S, _ = atoms.shape
    for m in prange(n):
        for c in range(S):
            w[m, c] = 0.0
    B = atom_block(K, S)
    for k0 in range(0, K, B):
        k1 = min(K, k0 + B)
        for m in prange(n):
            add_atoms(seqs[m], parents, mu, atoms, prior_w, k0, k1, w[m])


@njit(cache=True)
def rows_weights_serial(seqs, parents, mu, atoms, prior_w, w):
    """:func:`rows_weights` on the calling thread."""
    n = seqs.shape[0]
    K, S, _ = atoms.shape
    for m in range(n):
        for c in range(S):
            w[m, c] = 0.0
    B = atom_block(K, S)
    for k0 in range(0, K, B):
        k1 = min(K, k0 + B)
        for m in range(n):
            add_atoms(seqs[m], parents, mu, atoms, prior_w, k0, k1, w[m])


# ===================================================================== weights
@njit(cache=True)
def target_row(s, tp, S):
    """The flat row ``Σ_h s[tp[h]] S^(k-1-h)`` of the target's parent tuple (the query's tuple ``tp``)."""
    rt = 0
    for h in range(tp.shape[0]):
        rt = rt * S + s[tp[h]]
    return rt


@njit(cache=True)
def atom_path_weight_multi(m, s, parents, atoms, pk0):
    """``pk0[m] ∏_{i non-root} P_m(s_i | s_{pa(i)})``: the k-parent analogue of :func:`atom_path_weight`, in the
    one multiplication order every k-parent kernel shares."""
    S = atoms.shape[2]
    T, k = parents.shape
    p = pk0[m]
    for i in range(T):
        if parents[i, 0] >= 0:
            row = 0
            for h in range(k):
                row = row * S + s[parents[i, h]]
            p *= atoms[m, row, s[i]]
    return p


@njit(cache=True)
def sequence_weight_row_multi(s, parents, tp, atoms, target_tab, pk0, out):
    """``out[c] = Σ_m p_m(s) · target_tab[m, r_tp(s), c]`` for one sequence ``s``.

    ``p_m(s) = pk0[m] · Π_{non-roots i} atoms[m, r_i(s), s_i]`` (positions in
    increasing order), ``r_i`` the flat row of ``i``'s parent tuple. With
    ``target_tab = atoms`` this is ``w(s, ·)``.
    """
    K = atoms.shape[0]
    C = target_tab.shape[2]
    rt = target_row(s, tp, atoms.shape[2])
    for c in range(C):
        out[c] = 0.0
    for m in range(K):
        p = atom_path_weight_multi(m, s, parents, atoms, pk0)
        if p != 0.0:
            for c in range(C):
                out[c] += p * target_tab[m, rt, c]


@njit(cache=True, parallel=True)
def chunk_weights_multi(start, parents, tp, atoms, target_tab, pk0, seqs, w):
    """Fill ``seqs (n, T)`` and ``w (n, C)`` for sequence numbers ``start … start+n-1``.

    Parallel over sequences; each row is written by one thread in a fixed
    order, so the result does not depend on the thread count.
    """
    n, T = seqs.shape
    S = atoms.shape[2]
    for m in prange(n):
        decode_sequence(start + m, S, T, seqs[m])
        sequence_weight_row_multi(seqs[m], parents, tp, atoms, target_tab, pk0, w[m])
