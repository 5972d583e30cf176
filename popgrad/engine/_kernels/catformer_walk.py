"""The two walks of the disentangled-transformer engine (DESIGN §18, §21): the enumeration trie and explicit rows.

The workspace, the parameter and gradient vectors and the per-row pieces (:func:`_node_forward`,
:func:`_node_backward`) are those of :mod:`popgrad.engine._kernels.catformer`; both walks run the leaves of
one parent together (:func:`popgrad.engine._kernels.catformer_leaves._leaf_group`: their rows ``T-1``, then
the last layer's row ``T-1``, the readout and the loss of all of them, the dense passes over ``Ã`` and
``dÃ`` shared by up to three leaves).

The trie (:func:`run_blocks`): block ``b`` fixes positions ``0 … D-1`` to the base-``S`` digits of
``b``; below them a depth-first odometer. Entering node ``(t, s_t)``
multiplies the per-atom weight products ``pk[t] = pk[t-1] · ftab[:, row_t, s_t]``
(a subtree whose products are all zero contributes nothing and is skipped) and
computes row ``t`` of layers ``1 … L-1`` and ``hw[t]``; at a node of depth ``T-2`` its leaves' weights
(:func:`_leaf_table`) and the leaf group. ``canon`` restricts the walk to the canonical sequences (the orbit
reduction, DESIGN §21). Reverse mode over the same tree: adjoints ``G[j]`` (of ``H[j]``) and ``Ghw[j]`` of the
rows ``j`` on the current path accumulate over the subtree; a node
back-propagates its own row once, after all its children
(:func:`_node_backward`), into the parameters and the rows above it. A
block ends with the backward pass of its fixed rows ``D-1 … 0``, so each
block's slot is its exact partial gradient.

The explicit rows (:func:`run_rows`: a sample, a weight table): sorted rows walked as the paths of the same
trie, consecutive rows with one parent (the same first ``T-1`` tokens) as one leaf group.

``cache=True``, no ``fastmath``; :func:`run_blocks` / :func:`run_rows` (parallel) and
:func:`run_blocks_serial` / :func:`run_rows_serial` (one body each, :func:`popgrad.engine._kernels.twins.twins`)
run the same blocks into one slot each.
"""
import numpy as np
from numba import njit, prange

from .catformer import U, _node_backward, _node_backward_inline, _node_forward, _node_forward_inline
from .catformer_leaves import _leaf_group, group_size
from .twins import twins


@njit(cache=True, error_model="numpy", inline="always")
def _enter_weights(t, s, S, npar, par, roff, ff, K, pf):
    """``pk[t+1, k] = pk[t, k] · ftab[k, row_t(s), s_t]``; return whether any product is positive.

    ``ff`` is the factor table ``ftab[row, token, k]`` with the atoms last (contiguous products), flat;
    ``pf`` the products ``pk (T + 1, K)``, flat (no views in the walk: each costs reference counts).
    """
    r = 0  # the parents' flat row: Σ_h s[par_h] S^{n-1-h}
    for h in range(npar[t]):
        r = r * S + s[par[t, h]]
    fo = (U(roff[t] + r) * U(S) + U(s[t])) * K
    src = U(t) * K
    dst = src + K
    alive = False
    for k in range(K):
        v = pf[src + k] * ff[fo + k]
        pf[dst + k] = v
        if v != 0.0:
            alive = True
    return alive


@njit(cache=True, error_model="numpy", inline="always")
def _leaf_table(s, S, T, npar, par, roff, ff, K, pf, tnpar, tpar, troff, tt, Wl, coef):
    """``Wl[q, c] = w(s_0 … s_{T-2} q, c)`` for every last token ``q`` (once per parent of leaves).

    ``Wl[q, c] = Σ_k pk[T-1, k] ftab[k, row_{T-1}, q] ttab[k, r_tp(q), c]`` with the tables atoms-last
    (``ff``, ``tt``, flat, as the products ``pf``); the sum over atoms in four interleaved partial sums.
    """
    t = T - 1
    r = 0
    for h in range(npar[t]):
        r = r * S + s[par[t, h]]
    row = U(roff[t] + r)
    nS = U(Wl.shape[1])
    Su = U(S)
    src = U(t) * K
    for q_ in range(S):
        q = U(q_)
        rt = 0
        for h in range(tnpar):
            tok = q_ if tpar[h] == t else s[tpar[h]]
            rt = rt * S + tok
        fo = (row * Su + q) * K
        for k in range(K):
            coef[k] = pf[src + k] * ff[fo + k]
        rr = U(troff + rt)
        for c in range(nS):
            to = (rr * nS + c) * K
            a0 = 0.0
            a1 = 0.0
            a2 = 0.0
            a3 = 0.0
            k = U(0)
            while k + U(3) < K:
                a0 += coef[k] * tt[to + k]
                a1 += coef[k + U(1)] * tt[to + k + U(1)]
                a2 += coef[k + U(2)] * tt[to + k + U(2)]
                a3 += coef[k + U(3)] * tt[to + k + U(3)]
                k += U(4)
            while k < K:
                a0 += coef[k] * tt[to + k]
                k += U(1)
            Wl[q, c] = (a0 + a1) + (a2 + a3)


@njit(cache=True, error_model="numpy")
def _orbit_weights(M, S, orbit, Wl):
    """``Wl[q] *= orbit[m]``, ``m = max(M, q) + 1`` the distinct tokens of the canonical leaf ``… q`` whose
    prefix has maximum ``M`` (the leaves ``q ≤ M + 1``)."""
    for q in range(min(S, M + 2)):
        f = orbit[max(M, q) + 1]
        for c in range(S):
            Wl[q, c] *= f


@njit(cache=True, error_model="numpy")
def _block(b, n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT, eps, softmax_readout,
           want_grad, canon, orbit, gr):
    """Block ``b``: every sequence whose first ``n_fixed`` tokens are the base-``S`` digits of ``b``; its loss.

    Adds the block's gradient into ``gr = [dA (flat, the layout of Af) | dW (flat)]``. One float workspace
    ``F`` holds the rows ``H``, their transpose ``Ht``, the adjoints ``G``, the attention rows ``Pr``, the
    query vectors ``U``, ``hw`` and its adjoint and the leaf scratch (:class:`Layout`): the helpers take
    a handful of arrays and index them flat (no views in the loops: every view or array argument costs
    an atomic reference-count update). The walk visits the nodes of depth ``< T-1``; the leaves of a
    node of depth ``T-2`` run together (:func:`_leaf_group`, workspace ``Q``).

    ``canon``: the orbit reduction (DESIGN §21) -- only the canonical sequences (first occurrences in the
    order ``0, 1, …``: token ``s_t ≤ max(s_0 … s_{t-1}) + 1``, a sub-trie), each leaf's weights times its
    orbit size ``orbit[m]`` (``m`` distinct tokens); a block whose fixed tokens are not canonical is empty.
    """
    T, S, dw = np.int64(z.T), np.int64(z.S), np.int64(z.dw)  # signed: the walk's few accesses
    K = pk0.shape[0]
    Ku = U(K)
    ff = ftabT.reshape(-1)  # flat once per block: the walk creates no views
    tt = ttabT.reshape(-1)
    oH = 0
    F = np.zeros(np.int64(z.size))
    Q = np.zeros(group_size(S, T, dw, np.int64(z.n_heads), np.int64(z.d_max), np.int64(z.n_slots)))
    qs = np.zeros(S, dtype=np.int64)
    s = np.zeros(T, dtype=np.int64)
    pk = np.zeros((T + 1) * K)  # pk[t, k] at t·K + k
    Wl = np.zeros((S, S))
    coef = np.zeros(K)
    for k in range(K):
        pk[k] = pk0[k]
    rem = b
    for t in range(n_fixed - 1, -1, -1):
        s[t] = rem % S
        rem //= S
    mx = np.full(T + 1, -1, dtype=np.int64)  # mx[t] = max(s_0 … s_{t-1}) (-1 for t = 0)
    for t in range(n_fixed):
        if canon and s[t] > mx[t] + 1:
            return 0.0
        mx[t + 1] = max(mx[t], s[t])
    for t in range(T):  # x̃_t: the position one-hot is fixed; the token one-hot moves with the walk
        F[oH + t * dw + S + t] = 1.0
    n_inner_fixed = min(n_fixed, T - 1)  # fixed nodes above the leaves
    for t in range(n_inner_fixed):
        F[oH + t * dw + s[t]] = 1.0
        if not _enter_weights(t, s, S, npar, par, roff, ff, Ku, pk):
            return 0.0
        _node_forward(t, z, s, hinfo, prm, F)
    loss = 0.0
    if n_fixed >= T - 1:  # the block is (part of) one parent's leaves
        _leaf_table(s, S, T, npar, par, roff, ff, Ku, pk, tnpar, tpar, troff, tt, Wl, coef)
        if canon:
            _orbit_weights(mx[T - 1], S, orbit, Wl)
        q_lo, q_hi = (s[T - 1], s[T - 1] + 1) if n_fixed == T else (0, min(S, mx[T - 1] + 2) if canon else S)
        loss = _leaf_group(q_lo, q_hi, z, s, hinfo, prm, F, gr, Wl, Q, qs, eps, softmax_readout, want_grad)
    else:
        t = n_fixed
        s[t] = 0
        while True:
            F[oH + t * dw + s[t]] = 1.0
            mx[t + 1] = max(mx[t], s[t])
            if _enter_weights(t, s, S, npar, par, roff, ff, Ku, pk):
                _node_forward_inline(t, z, s, hinfo, prm, F)
                if t < T - 2:
                    t += 1
                    s[t] = 0
                    continue
                # a parent of leaves: its leaves together, then its own row (after all its children)
                _leaf_table(s, S, T, npar, par, roff, ff, Ku, pk, tnpar, tpar, troff, tt, Wl, coef)
                q_hi = S
                if canon:
                    _orbit_weights(mx[T - 1], S, orbit, Wl)
                    q_hi = min(S, mx[T - 1] + 2)
                loss += _leaf_group(0, q_hi, z, s, hinfo, prm, F, gr, Wl, Q, qs, eps, softmax_readout, want_grad)
                if want_grad:
                    _node_backward_inline(t, z, s, hinfo, prm, F, gr)
            # next node: the next sibling, or up (a parent is back-propagated after its last child)
            done = False
            while True:
                F[oH + t * dw + s[t]] = 0.0
                s[t] += 1
                if s[t] < (min(S, mx[t] + 2) if canon else S):
                    break
                s[t] = 0
                t -= 1
                if t < n_fixed:
                    done = True
                    break
                if want_grad:
                    _node_backward(t, z, s, hinfo, prm, F, gr)
            if done:
                break
    if want_grad:
        for t in range(n_inner_fixed - 1, -1, -1):
            _node_backward(t, z, s, hinfo, prm, F, gr)
    return loss


def _run_blocks_body(lo, ids, n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff, ttabT, eps,
                     softmax_readout, want_grad, canon, orbit, loss_out, gr_out):
    """Blocks ``ids[lo] … ids[lo + len(loss_out) - 1]`` into slots ``0 …`` (``loss_out[b]``, ``gr_out[b] = [dA | dW]``;
    ``ids`` every block in order, or the canonical ones only)."""
    for b in prange(loss_out.shape[0]):
        loss_out[b] = _block(ids[lo + b], n_fixed, z, hinfo, prm, npar, par, roff, ftabT, pk0, tnpar, tpar, troff,
                             ttabT, eps, softmax_readout, want_grad, canon, orbit, gr_out[b])


run_blocks, run_blocks_serial = twins(_run_blocks_body)


# ====================================================================== explicit rows (sampled, weight tables)
@njit(cache=True, error_model="numpy")
def _rows_block(lo, hi, seqs, w, z, hinfo, prm, eps, softmax_readout, want_grad, gr):
    """Rows ``lo … hi-1`` of ``seqs`` with weights ``w``: their loss; adds their gradient into ``gr``.

    The rows are walked as the paths of a trie: a row that shares its first ``p`` tokens with the
    previous one reuses that row's forward rows ``0 … p-1`` (rows ``≥ p`` of the previous path are
    back-propagated first, a node always after all its children), so sorted rows cost what the
    trie of their prefixes costs. Consecutive rows with one parent (the first ``T-1`` tokens) are one
    leaf group (:func:`_leaf_group`, their weights by last token); a row whose last token the pending group
    already holds (a repeated row) starts a new group on the same path, so every row is its own leaf, as in
    the NumPy reference. A row whose weights are all zero contributes nothing and is skipped.
    """
    T, S, dw = np.int64(z.T), np.int64(z.S), np.int64(z.dw)  # signed: the walk's few accesses
    F = np.zeros(np.int64(z.size))
    Q = np.zeros(group_size(S, T, dw, np.int64(z.n_heads), np.int64(z.d_max), np.int64(z.n_slots)))
    qs = np.zeros(S, dtype=np.int64)
    Wl = np.zeros((S, S))
    s = np.zeros(T, dtype=np.int64)
    for t in range(T):  # x̃_t: the position one-hot is fixed
        F[t * dw + S + t] = 1.0
    loss = 0.0
    depth = 0  # positions 0 … depth-1 of s hold a path whose rows are computed (and not yet back-propagated)
    pending = False  # Wl holds the weights of leaves of the current path (depth T-1) not yet run
    for r in range(lo, hi):
        alive = False
        for c in range(S):
            if w[r, c] != 0.0:
                alive = True
        if not alive:
            continue
        p = 0
        while p < depth and seqs[r, p] == s[p]:
            p += 1
        q = seqs[r, T - 1]
        taken = False  # the pending group already holds a leaf ending in q (a repeated row)
        for c in range(S):
            if Wl[q, c] != 0.0:
                taken = True
        if pending and (p < T - 1 or taken):  # a new parent, or a repeated row: run the pending leaves
            loss += _leaf_group(0, S, z, s, hinfo, prm, F, gr, Wl, Q, qs, eps, softmax_readout, want_grad)
            for a in range(S):
                for c in range(S):
                    Wl[a, c] = 0.0
            pending = False
        if p < T - 1 or depth < T - 1:  # move the path to this row's parent
            for t in range(depth - 1, p - 1, -1):  # leave the previous path down to the shared prefix
                if want_grad:
                    _node_backward(t, z, s, hinfo, prm, F, gr)
                F[t * dw + s[t]] = 0.0
            for t in range(p, T - 1):
                s[t] = seqs[r, t]
                F[t * dw + s[t]] = 1.0
                _node_forward(t, z, s, hinfo, prm, F)
            depth = T - 1
        for c in range(S):
            Wl[q, c] = w[r, c]
        pending = True
    if pending:
        loss += _leaf_group(0, S, z, s, hinfo, prm, F, gr, Wl, Q, qs, eps, softmax_readout, want_grad)
    if want_grad:
        for t in range(depth - 1, -1, -1):
            _node_backward(t, z, s, hinfo, prm, F, gr)
    return loss


def _run_rows_body(seqs, w, rows_per_block, z, hinfo, prm, eps, softmax_readout, want_grad, loss_out, gr_out):
    """Block ``b`` = rows ``b·rows_per_block …`` into slot ``b`` (``loss_out[b]``, ``gr_out[b] = [dA | dW]``)."""
    n = seqs.shape[0]
    for b in prange(loss_out.shape[0]):
        lo = b * rows_per_block
        hi = min(n, lo + rows_per_block)
        loss_out[b] = _rows_block(lo, hi, seqs, w, z, hinfo, prm, eps, softmax_readout, want_grad, gr_out[b])


run_rows, run_rows_serial = twins(_run_rows_body)
