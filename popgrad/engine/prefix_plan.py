"""The prefix engine's plan (DESIGN §13): everything it needs that depends on the task, the symmetry mode and
the options only, never on ``A1, A2``, built once and kept in a small least-recently-used cache.

A plan fixes the blocks (``n_fixed`` leading tokens per block, canonical prefixes with the orbit reduction,
ordered by their work), the batch of leaf groups (``h`` trailing context positions handled as one vector of
``NG`` lanes), the factor tables of the atom products, and the leaf-weight cache. :mod:`popgrad.engine.single`
runs it; the cache and its lock live here so that both modules share them.
"""
from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from ._kernels.numeric import LANES
from ._kernels.twins import use_parallel
from .symmetry import canonical_count, canonical_sequences, orbit_sizes

class _Plan(NamedTuple):
    """Everything the prefix engine needs that depends on the task (and mode) only, not on ``A1, A2``."""

    parents: np.ndarray
    fac: np.ndarray
    pk0: np.ndarray
    wtab: np.ndarray
    Q: np.ndarray
    ctx_pos: np.ndarray
    mask: np.ndarray
    dig: np.ndarray
    ofac: np.ndarray
    prefixes: np.ndarray
    order: np.ndarray
    n_groups: int  # NG: S**h padded to a multiple of LANES
    sequences: int  # sequences the engine visits (canonical ones with symmetry)
    parallel: bool
    bstart: np.ndarray  # first batch node of each block in the weight cache
    wcache: dict  # (lo, hi) -> the (batch nodes of blocks lo..hi-1, S*S, NG) leaf weights, filled on first use
    n_batch: int
    work: np.ndarray  # batch nodes per block (the blocks' relative cost)



#: Prefix plans, ``(task.fingerprint, sym, options.plan_key()) -> plan``, least recently used first.
#: A fingerprint identifies the task's graph and prior exactly, so equal tasks share a plan.
_PLANS = OrderedDict()
_PLAN_CACHE_SIZE = 16
_LOCK = threading.Lock()  # the plan and weight caches (threads of one process may share them)
_STATS = {"plan_builds": 0, "weight_builds": 0}


def _parallel(n_blocks, n_sequences, opts) -> bool:
    """Use the thread pool only when there is enough work (the blocks, hence the bits, are the same)."""
    return use_parallel(n_blocks, n_sequences, opts)


# ------------------------------------------------------------ prefix engine plan
def _prefix_plan(task, sym, opts) -> _Plan:
    key = (task.fingerprint, bool(sym), opts.plan_key())
    plan = _PLANS.get(key)  # a hit takes no lock (the training loop's path): get and move_to_end are atomic
    if plan is not None:
        try:
            _PLANS.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile: the plan is still valid
            pass
        return plan
    plan = _build_prefix_plan(task, sym, opts)
    with _LOCK:
        _PLANS[key] = plan
        _STATS["plan_builds"] += 1
        while len(_PLANS) > _PLAN_CACHE_SIZE:
            _PLANS.popitem(last=False)
    return plan


def _build_prefix_plan(task, sym, opts) -> _Plan:
    S, T = task.S, task.T
    L = T - 1
    parents, mu, atoms, prior_w = task.kernel_arrays()
    K = atoms.shape[0]
    n_fixed = _prefix_n_fixed(S, T, opts)
    h, ctx_pos = _prefix_batch_plan(parents, S, T, n_fixed, K, opts)
    Lh = L - h
    D = n_fixed
    if sym:
        sequences = canonical_count(S, T)
        if sequences >= opts.parallel_min_sequences:  # blocks for the threads; a serial run wants few blocks
            while D < Lh and canonical_count(S, D) < opts.sym_min_blocks:
                D += 1
        prefixes = canonical_sequences(S, D)
    else:
        prefixes = np.array(list(itertools.product(range(S), repeat=D)), dtype=np.int64).reshape(S**D, D)
        sequences = S**T
    n_blocks = prefixes.shape[0]
    order = _balanced_order(prefixes, S, T) if sym else np.arange(n_blocks, dtype=np.int64)
    if sym:
        per_block = [_completions(S, Lh - D, int(p.max()) + 1 if D else 0) for p in prefixes]
    else:
        per_block = [S ** (Lh - D)] * n_blocks
    bstart = np.concatenate([[0], np.cumsum(per_block)[:-1]]).astype(np.int64)
    fac = np.empty((L, S, S, K))
    for d in range(L):
        fac[d] = mu.T[None, :, :] if parents[d] < 0 else atoms.transpose(1, 2, 0)
    n_valid = S**h
    NG = -(-n_valid // LANES) * LANES
    Qv = _batch_factor_table(parents, mu, atoms, Lh, h, ctx_pos)
    Q = np.zeros(Qv.shape[:2] + (NG,))
    Q[:, :, :n_valid] = Qv
    dig_v = ((np.arange(n_valid)[None, :] // S ** np.arange(h - 1, -1, -1)[:, None]) % S).astype(np.int64)
    dig = np.zeros((h, NG), dtype=np.int64)
    dig[:, :n_valid] = dig_v
    mask = np.zeros((h, S, NG))
    for t in range(h):
        mask[t, dig_v[t], np.arange(n_valid)] = 1.0
    ofac = _orbit_factor_table(S, dig_v, NG) if sym else np.ones((1, 1, 1))
    return _Plan(
        parents=parents, fac=fac, pk0=prior_w / S, wtab=np.ascontiguousarray(atoms.reshape(K, S * S)), Q=Q,
        ctx_pos=ctx_pos, mask=mask, dig=dig, ofac=ofac, prefixes=np.ascontiguousarray(prefixes),
        order=order, n_groups=NG, sequences=sequences, parallel=_parallel(n_blocks, sequences, opts),
        bstart=bstart, wcache={}, n_batch=int(sum(per_block)), work=np.asarray(per_block, dtype=np.int64),
    )


def _orbit_factor_table(S, dig, NG) -> np.ndarray:
    """``ofac[m, q, g]``: orbit size of prefix (``m`` distinct tokens, canonical) + group ``g`` + query ``q``, or 0.

    The whole sequence is canonical when each token of ``g`` then ``q`` is
    either already used or the next new one; its orbit size is ``S!/(S-m')!``.
    """
    h, n_valid = dig.shape
    orbit = orbit_sizes(S)
    ofac = np.zeros((S + 1, S, NG))
    for m in range(S + 1):
        for g in range(n_valid):
            cnt, ok = m, True
            for t in range(h):
                b = int(dig[t, g])
                if b > cnt:
                    ok = False
                    break
                cnt += b == cnt
            if not ok:
                continue
            for q in range(S):
                if q <= cnt:
                    ofac[m, q, g] = orbit[cnt + (q == cnt)] if cnt + (q == cnt) <= S else 0.0
    return ofac


def _balanced_order(prefixes, S, T) -> np.ndarray:
    """A block order whose contiguous runs carry similar work (numba splits ``prange`` into contiguous chunks).

    Work of a canonical prefix = its number of canonical completions (it
    depends on its distinct-token count); blocks sorted by work are dealt
    heaviest, lightest, second heaviest, second lightest, …
    """
    n, D = prefixes.shape
    m = (prefixes.max(axis=1) + 1) if D else np.zeros(n, dtype=np.int64)
    work = np.array([_completions(S, T - D, int(mi)) for mi in m], dtype=float)
    idx = np.argsort(-work, kind="stable")
    out = np.empty(n, dtype=np.int64)
    lo, hi = 0, n - 1
    for p in range(n):
        if p % 2 == 0:
            out[p] = idx[lo]
            lo += 1
        else:
            out[p] = idx[hi]
            hi -= 1
    return out


def _completions(S, n, m) -> int:
    """Canonical continuations of length ``n`` of a canonical prefix with ``m`` distinct tokens."""
    row = {m: 1}
    for _ in range(n):
        new = {}
        for used, c in row.items():
            new[used] = new.get(used, 0) + c * used
            if used < S:
                new[used + 1] = new.get(used + 1, 0) + c
        row = new
    return sum(row.values())


def _prefix_n_fixed(S, T, opts) -> int:
    """Leading positions fixed per block.

    Blocks are whole subtrees of ``≥ opts.prefix_block_sequences`` sequences, and
    there are at most ``opts.max_blocks`` of them. Depends on ``S``, ``T`` and the options only.
    """
    L = T - 1
    inner = 0  # free non-query positions per block; a block holds S**(inner + 1) sequences
    while inner < L and (S ** (inner + 1) < opts.prefix_block_sequences or S ** (L - inner) > opts.max_blocks):
        inner += 1
    return L - inner


def _prefix_batch_plan(parents, S, T, n_fixed, K, opts):
    """Batched trailing positions ``h`` and the prefix positions ``ctx_pos`` they depend on.

    Aims at ``S**h ≥ opts.prefix_batch_groups`` leaf groups per batch, within the
    block's free positions and with the factor table ``Q`` at most
    ``opts.prefix_table_max`` entries.
    """
    L = T - 1
    h = 0
    while h < L - n_fixed and S**h < opts.prefix_batch_groups:
        h += 1
    while True:
        Lh = L - h
        ctx_pos = np.array(sorted({int(p) for p in parents[Lh:L] if 0 <= p < Lh}), dtype=np.int64)
        if h == 0 or S ** (len(ctx_pos) + h) * K <= opts.prefix_table_max:
            return h, ctx_pos
        h -= 1


def _batch_factor_table(parents, mu, atoms, Lh, h, ctx_pos):
    """``Q[ctx, k, g] = Π_{t<h} fac[Lh+t, a_t, g_t, k]`` (see :func:`popgrad.engine._kernels.prefix.loss_grad_prefix`)."""
    K, S, _ = atoms.shape
    n_groups, n_ctx = S**h, S ** len(ctx_pos)
    g_dig = (np.arange(n_groups)[:, None] // S ** np.arange(h - 1, -1, -1)) % S  # (G, h)
    c_dig = (np.arange(n_ctx)[:, None] // S ** np.arange(len(ctx_pos) - 1, -1, -1)) % S  # (C, n_ctx)
    where = {int(p): m for m, p in enumerate(ctx_pos)}
    Q = np.ones((n_ctx, n_groups, K))
    for t in range(h):
        pos = Lh + t
        par = int(parents[pos])
        b = g_dig[:, t]
        if par < 0:
            Q *= mu[:, b].T[None, :, :]
        elif par >= Lh:
            Q *= atoms[:, g_dig[:, par - Lh], b].T[None, :, :]
        else:
            a = c_dig[:, where[par]]
            Q *= atoms[:, a[:, None], b[None, :]].transpose(1, 2, 0)
    return np.ascontiguousarray(Q.transpose(0, 2, 1))
