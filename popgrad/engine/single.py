"""The single-parent exact engines: prefix and direct kernels, plans, the weight cache.

Everything here is a finite sum over all ``S**T`` sequences with their exact
weights ``w(s, c)`` (DESIGN §2): no sampling. The population is exact *for
the task's finite prior*.

Loss and gradient (DESIGN §3–§4), with ``q = s_{T-1}``::

    P    = softmax_rows(MASK(A1)),  u_i = Σ_j P[i,j] A2[q, s_j],  a = softmax(u)
    f_c  = Σ_i a_i [s_i = c]
    L    = -Σ_s Σ_c w(s,c) log(f_c(s) + ε)                 ε = T_eff^(-1/2) by default
    r_c  = -w(s,c) / (f_c + ε),  r̄ = Σ_c f_c r_c,  δ_i = a_i (r_{s_i} - r̄)
    G[i,j]      = Σ_s δ_i A2[q, s_j]                       (j ≤ i; G = ∂L/∂P)
    dA2[q, b]   = Σ_s Σ_j [s_j = b] Σ_i δ_i P[i, j]
    dA1[i, :]   = P[i,:] ⊙ (G[i,:] - <P[i,:], G[i,:]>)      (softmax Jacobian, once, after the sum)

Terms with ``w(s, c) = 0`` contribute nothing (``0 · log 0 = 0``).

Engines
-------
``exact_loss_and_grad`` runs a numba kernel (:mod:`popgrad.engine._kernels.single`):

* ``"prefix"`` (default): enumerates the tree of prefixes depth first (the
  query, fastest in the enumeration order, innermost) and computes what
  depends on ``s_0 … s_d`` once per prefix: the per-atom weight products
  (``p_k ← p_k · π_k(s_d | s_{p(d)})``: *incremental weights*, one multiply
  per atom per prefix, never a product over the whole sequence), the
  layer-2 exponentials as running products of a precomputed table
  ``exp(P[i,j] (A2[q,b] - max_b A2[q,b]))`` (no ``exp`` in the loop), the
  softmax normaliser and the output numerators as running sums. The last
  ``h`` positions (``S**h ≥ 64`` leaf groups) and the query are processed
  per *batch node* in loops over the leaf groups that LLVM vectorizes
  (AVX-512 on the benchmark machine): the leaf weights are one small matrix
  product ``W = Σ_k p_k Q[k, g] π_k(c | q)`` per batch node, the
  exponentials of the batched rows one multiply by a per-call table, the
  logarithm a vectorizable fdlibm ``log`` (:func:`popgrad.engine._kernels.single.fast_log`,
  < 1 ulp). The backward pass is accumulated per subtree (``S²`` numbers
  per depth for the rows already fixed, per-group sums for the batched
  rows), so a sequence costs ``O(S + K)`` (``O(S)`` with cached weights)
  instead of ``O(T² + K·T)``. It needs the exponentials of the row ranges
  of ``A2`` far from underflow: used when
  ``max_q (max_b A2[q,b] - min_b A2[q,b]) ≤ A2_RANGE_LIMIT = 500``.
* ``"direct"``: one fused per-sequence loop with ``T``-vectors (``O(T²)`` per
  sequence, weights from :func:`popgrad.engine._kernels.single.sequence_weight_row`) and
  the per-sequence max shift of the softmax: safe for any finite ``A2``;
  used when the range exceeds 500 (e.g. the Knowl-8 construction at large
  ``β2``).

*Weight cache*: the leaf weights ``W`` of every batch node depend on the
task only, not on ``A1, A2``; the first call on a task computes and keeps
them (when they fit in ``EngineOptions.weight_cache_bytes`` = 64 MB, e.g. S=3, T=12: 14
MB, S=4, T=10: 34 MB; at most ``EngineOptions.weight_cache_total`` = 128 MB over all
tasks, least recently used dropped first), later calls read them. A
training loop calls the engine hundreds of times on the same task; the
cache changes no bit.

*Orbit reduction* (DESIGN §10, ``symmetry="auto"``): when the prior is
exactly closed under token relabeling (:func:`popgrad.engine.symmetry.symmetry_applies`; atoms bit
for bit, stationary distributions to 1e-12) and ``A2 ∈ span{I, 11ᵀ}``, the
loss and ``dA1`` are invariant and ``dA2`` is equivariant under relabeling
``σ`` of the tokens, because ``w(σs, σc) = w(s, c)`` and
``f_{σc}(σs) = f_c(s)``. Both engines then visit only the *canonical*
sequences (first occurrences in the order ``0, 1, 2, …``: one per orbit,
``Σ_{m≤S} Stirling2(T, m)`` of them, about ``S!`` fewer) with their weights
multiplied by the orbit size ``S!/(S-m)!`` (``m`` distinct tokens), and
``dA2`` is averaged over relabelings: its mean diagonal on the diagonal,
its mean off-diagonal elsewhere (the average of ``σ D σᵀ``). The result
equals the full enumeration up to rounding (tests: 1e-12) and ``dA2`` lies
*exactly* in the span, so a Stage-2 step keeps ``A2`` in it bit for bit and
the reduction stays on for the whole of Algorithm 1 (Stage 1 has
``A2 = β0·I``). An ``A2`` within ``SPAN_RTOL = 1e-15`` of the span is
projected onto it.

Why a fused kernel and not BLAS: the products are ``N×T`` by ``T×T`` with
``T ≤ 20``, too thin to amortise materialising ``Δ`` and ``V``; the fused
loop avoids that traffic and the prefix engine removes most of the
arithmetic. The measured figures are in ``benchmarks/README.md``.

Determinism: both kernels split the enumeration into a fixed set of blocks
(whole subtrees; canonical prefixes with the reduction) that depends on
``S``, ``T`` and the mode only; each block writes its own slot and the slots
are summed in block order. Results are bit-identical for any thread count
(``NUMBA_NUM_THREADS``) and between calls. Tasks below
``EngineOptions.parallel_min_sequences`` (visited sequences) run the same blocks on the
calling thread (waking the thread pool costs more than it saves there).
With the reduction, blocks differ in size: they run in an order that
balances numba's contiguous per-thread chunks (heaviest and lightest
alternate), which never changes a bit.
"""
from __future__ import annotations

import functools
import itertools
import math
import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from .._validation import warn_inf
from ._kernels import prefix as _kp
from ._kernels import ranges as _kr
from ._kernels import single as _k
from ._kernels.numeric import LANES
from . import table as _table
from .blocks import BlockJob, Partials
from .options import DEFAULT_OPTIONS, ENGINES
from .result import LossAndGrad
from .symmetry import SYMMETRY_MODES, canonical_count, canonical_sequences, orbit_sizes, symmetry_check

__all__ = ["loss_grad", "blocks", "block_work", "run_blocks", "finish_blocks", "decide", "direct_blocks",
           "rows_loss_and_grad", "rows_losses", "cache_stats", "clear_plans"]


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


_NO_CACHE = np.zeros((0, 0, 0))


#: Prefix plans, ``(task.fingerprint, sym, options.plan_key()) -> plan``, least recently used first.
#: A fingerprint identifies the task's graph and prior exactly, so equal tasks share a plan.
_PLANS = OrderedDict()
_PLAN_CACHE_SIZE = 16
_LOCK = threading.Lock()  # the plan and weight caches (threads of one process may share them)
_STATS = {"plan_builds": 0, "weight_builds": 0}
# C-level NamedTuple constructors (no Python frame: the training loop calls the engine thousands of times)
_new_job = functools.partial(tuple.__new__, BlockJob)
_new_partials = functools.partial(tuple.__new__, Partials)


def loss_grad(task, A1, A2, eps, want_grad, engine, symmetry, opts) -> LossAndGrad:
    """Run a numba engine on validated input: all blocks of :func:`blocks`, in this process.

    ``engine`` in {"auto", "prefix", "direct"}; ``symmetry`` in {"auto", "on", "off"}; ``opts`` an
    :class:`EngineOptions`.
    Kept lean: the training loop calls it thousands of times on small tasks.
    """
    job = blocks(task, A1, A2, eps, want_grad, engine, symmetry, opts)
    return finish_blocks(job, run_blocks(task, job))


# ------------------------------------------------------------ the block runner (engine/blocks.py)
def blocks(task, A1, A2, eps, want_grad, engine, symmetry, opts) -> BlockJob:
    """The call's decisions (:func:`decide`), on validated input."""
    task.check_size()
    if _table.use_table(task, per_atom=False):  # a continuous prior: the weight table (DESIGN §20)
        return _table_job(task, A1, A2, eps, want_grad, engine, symmetry, opts)
    sym, A2, P, engine = decide(task, A1, A2, symmetry, engine, opts)
    return _new_job((engine, sym, P, A2, float(eps), bool(want_grad), opts))


def _table_job(task, A1, A2, eps, want_grad, engine, symmetry, opts) -> BlockJob:
    """The table path's job: no orbit reduction, the direct engine's arithmetic on the table's rows."""
    if engine != "auto":
        raise ValueError(f"engine={engine!r} carries the prior's atoms, but {task.prior!r} has none: use "
                         "engine='auto' (the weight table)")
    if symmetry == "on":
        raise ValueError("symmetry='on': the weight-table path has no orbit reduction; use symmetry='auto' or 'off'")
    T = task.T
    P = np.empty((T, T))
    _k.attention(np.ascontiguousarray(A1, dtype=np.float64), P)
    A2 = np.ascontiguousarray(A2, dtype=np.float64)
    # the prefix engine reading its leaf weights from the table, when A2's range allows it; else the rows path
    kind = "table-prefix" if task.table_cached and _k.row_range(A2) <= opts.a2_range_limit else "table"
    return _new_job((kind, False, P, A2, float(eps), bool(want_grad), opts))


#: ``(task.fingerprint, options.plan_key()) -> (plan, Wc)``: the prefix plan of a continuous-prior task (built on
#: a one-atom stand-in with the same graph: structure only) and its leaf weights read from the weight table.
_TABLE_PLANS = OrderedDict()


def _table_prefix_plan(task, opts):
    """``(plan, Wc)`` of the table-fed prefix engine (DESIGN §20): ``Wc[p, q·S + c, g] = w(s, c)`` for the
    sequence with prefix ``p`` (positions ``0 … Lh-1``), leaf group ``g`` (positions ``Lh … T-2``) and query ``q``;
    the kernel runs with ``wmode = 2`` (cached weights), so the stand-in's atom products are never read."""
    key = (task.fingerprint, opts.plan_key())
    hit = _TABLE_PLANS.get(key)
    if hit is not None:
        return hit
    from ..task.priors import FinitePrior
    from ..task.tasks import Task

    S, T = task.S, task.T
    stand_in = Task(task.graph, FinitePrior(np.full((S, S), 1.0 / S)), max_sequences=task.max_sequences)
    plan = _build_prefix_plan(stand_in, False, opts)
    h = plan.dig.shape[0]
    Lh = T - 1 - h
    w = task.weight_table()
    Wc = np.zeros((S**Lh, S * S, plan.n_groups))
    Wc[:, :, :S**h] = w.reshape(S**Lh, S**h, S, S).transpose(0, 2, 3, 1).reshape(S**Lh, S * S, S**h)
    assert plan.n_batch == S**Lh
    with _LOCK:
        _TABLE_PLANS[key] = (plan, Wc)
        while len(_TABLE_PLANS) > 2:
            _TABLE_PLANS.popitem(last=False)
    return plan, Wc


def block_work(task, job) -> np.ndarray:
    """Relative cost of each block, ``(n_blocks,)`` int64: batch nodes (prefix engine) or 1 (direct, table)."""
    if job.engine == "table":
        return np.ones(_table.table_blocks(task, job.opts)[1], dtype=np.int64)
    if job.engine == "table-prefix":
        return _table_prefix_plan(task, job.opts)[0].work
    if job.engine == "prefix":
        return _prefix_plan(task, job.sym, job.opts).work
    return np.ones(direct_blocks(task.S, task.T, job.opts)[1], dtype=np.int64)


def run_blocks(task, job, lo=0, hi=None) -> Partials:
    """The per-block slots of blocks ``lo … hi-1`` of ``job`` (bit for bit those of a whole-range run).

    ``hi=None``: to the last block (``run_blocks(task, job)`` runs them all).

    The prefix engine keeps, per plan, the leaf weights of each range it ran (``(lo, hi) → W``, within
    the options' byte limits), so a training loop, or a worker that runs the same chunk every call,
    computes them once.
    """
    S, T = task.S, task.T
    opts = job.opts
    if job.engine in ("prefix", "table-prefix"):
        if job.engine == "prefix":
            plan, Wtab = _prefix_plan(task, job.sym, opts), None
        else:  # the weight table as the leaf-weight cache (DESIGN §20)
            plan, Wtab = _table_prefix_plan(task, opts)
        n_blocks = plan.prefixes.shape[0]
        hi = n_blocks if hi is None else hi
        n = hi - lo
        X = np.empty((T, S, S, T))
        Xg = np.empty((S, plan.dig.shape[0] + 1, plan.n_groups))
        _kp.exp_tables(job.P, job.A2, plan.dig, X, Xg)
        if lo == 0 and hi == n_blocks:
            prefixes, order, bstart, n_batch = plan.prefixes, plan.order, plan.bstart, plan.n_batch
        else:
            first = int(plan.bstart[lo])
            n_batch = (int(plan.bstart[hi]) if hi < n_blocks else plan.n_batch) - first
            prefixes = np.ascontiguousarray(plan.prefixes[lo:hi])
            bstart = np.ascontiguousarray(plan.bstart[lo:hi] - first)
            order = np.ascontiguousarray(plan.order[(plan.order >= lo) & (plan.order < hi)] - lo)  # balanced order
        loss_s, G_s, dA2_s = _slots(n, T, S)
        nbytes = n_batch * S * S * plan.n_groups * 8
        Wc = plan.wcache.get((lo, hi))  # atomic; filling and evicting take the lock
        if Wtab is not None:
            first = int(plan.bstart[lo]) if lo < n_blocks else 0
            Wc, wmode = Wtab[first:first + n_batch], 2
        elif Wc is not None:
            wmode = 2
        elif nbytes <= opts.weight_cache_bytes:
            with _LOCK:
                _make_room(opts, nbytes)
            Wc, wmode = np.empty((n_batch, S * S, plan.n_groups)), 1
        else:
            Wc, wmode = _NO_CACHE, 0
        kernel = _kp.loss_grad_prefix if plan.parallel and n > 1 else _kp.loss_grad_prefix_serial
        kernel(plan.parents, plan.fac, plan.pk0, plan.wtab, plan.Q, plan.ctx_pos, X, Xg, plan.mask, plan.dig,
               plan.ofac, job.P, job.A2, job.eps, prefixes, order, job.sym, Wc, bstart, wmode, job.want_grad,
               loss_s, G_s, dA2_s)
        if wmode == 1:
            with _LOCK:
                plan.wcache[(lo, hi)] = Wc
                _STATS["weight_builds"] += 1
    elif job.engine == "table":  # the weight table (DESIGN §20): the direct arithmetic on given rows
        block_size, n_blocks = _table.table_blocks(task, opts)
        hi = n_blocks if hi is None else hi
        seqs, w = _table.table_rows(task, lo * block_size, min(task.n_sequences, hi * block_size))
        loss_s, G_s, dA2_s = _slots(hi - lo, T, S)
        _k.loss_grad_rows(seqs, w, job.P, job.A2, job.eps, block_size, 1 if job.want_grad else 0,
                          loss_s, G_s, dA2_s)
    elif job.engine == "direct":
        parents, mu, atoms, prior_w = task.kernel_arrays()
        block_size, n_blocks = direct_blocks(S, T, opts)
        hi = n_blocks if hi is None else hi
        n = hi - lo
        loss_s, G_s, dA2_s = _slots(n, T, S)
        parallel = _parallel(n_blocks, S**T, opts) and n > 1
        kernel = _kr.loss_grad_direct_range if parallel else _kr.loss_grad_direct_range_serial
        kernel(lo, parents, mu, atoms, prior_w, job.P, job.A2, job.eps, block_size, job.sym, orbit_sizes(S),
               job.want_grad, loss_s, G_s, dA2_s)
    else:
        raise ValueError(f"engine must be 'prefix' or 'direct', got {job.engine!r}")
    return _new_partials((loss_s, G_s, dA2_s))


def finish_blocks(job, partials) -> LossAndGrad:
    """All blocks' :class:`Partials`, in block order: sum the slots in block order, apply the layer-1
    softmax Jacobian and, with the orbit reduction, symmetrize ``dA2`` (an infinite loss: a warning and
    NaN gradients)."""
    loss_s, G_s, dA2_s = partials
    P = job.P
    loss = float(_k.sum_slots(loss_s, G_s, dA2_s))  # in block order; totals land in slot 0
    if not job.want_grad:
        if math.isinf(loss):
            warn_inf("exact_loss")
        return LossAndGrad(loss, None, None)
    S = dA2_s.shape[1]
    T = P.shape[0]
    dA1 = np.empty((T, T))
    _k.finish_grad(G_s[0], P, dA1)
    if job.sym:
        dA2 = np.empty((S, S))
        _k.symmetrize_span(dA2_s[0], dA2)
    else:
        dA2 = dA2_s[0].copy()
    if math.isinf(loss):
        warn_inf("exact_loss_and_grad")
        dA1[:] = np.nan
        dA2[:] = np.nan
    return LossAndGrad(loss, dA1, dA2)


def cache_stats() -> dict:
    """Counters of this process's prefix caches: plans and leaf weights built and held, bytes held."""
    with _LOCK:
        held = [W for p in list(_PLANS.values()) for W in list(p.wcache.values())]
        return dict(_STATS, plans_held=len(_PLANS), weight_caches_held=len(held),
                    weight_bytes=int(sum(W.nbytes for W in held)))


def decide(task, A1, A2, symmetry, engine, opts):
    """``(sym, A2, P, engine)``: whether the orbit reduction applies (``A2`` projected onto the span
    then), the layer-1 attention, and the engine (``"auto"`` resolved). Shared with the distributed
    engine, which must take the same decisions to get the same bits."""
    if symmetry not in SYMMETRY_MODES:
        raise ValueError(f"symmetry must be one of {SYMMETRY_MODES}, got {symmetry!r}")
    T = task.T
    A2 = np.ascontiguousarray(A2, dtype=np.float64)
    sym = False
    if symmetry != "off":
        sym, A2s = symmetry_check(task, A2)
        if symmetry == "on" and not sym:
            raise ValueError(
                "symmetry='on' needs a prior closed under token relabeling (exactly) and A2 in "
                "span{I, 11^T} (equal diagonal entries, equal off-diagonal entries); use symmetry='auto'"
            )
        if sym:
            A2 = A2s
    P = np.empty((T, T))
    _k.attention(np.ascontiguousarray(A1, dtype=np.float64), P)
    if engine == "auto":
        engine = "prefix" if _k.row_range(A2) <= opts.a2_range_limit else "direct"
    if engine not in ("prefix", "direct"):
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    return bool(sym), A2, P, engine


def direct_blocks(S, T, opts):
    """``(block_size, n_blocks)`` of the direct engine (a function of ``S``, ``T`` and the options only)."""
    n_total = S**T
    block_size = max(opts.direct_block_sequences, -(-n_total // opts.max_blocks))
    return block_size, -(-n_total // block_size)


def _make_room(opts, nbytes):
    """Drop cached leaf weights, least recently used plan first, until ``nbytes`` more fit in the budget.

    Called with ``_LOCK`` held.
    """
    held = [(p, key) for p in list(_PLANS.values()) for key in list(p.wcache)]  # oldest plan first
    total = sum(p.wcache[key].nbytes for p, key in held)
    for p, key in held:
        if total + nbytes <= opts.weight_cache_total:
            break
        W = p.wcache.pop(key, None)
        total -= 0 if W is None else W.nbytes


def _parallel(n_blocks, n_sequences, opts) -> bool:
    """Use the thread pool only when there is enough work (the blocks, hence the bits, are the same)."""
    return n_blocks > 1 and n_sequences >= opts.parallel_min_sequences


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


def _slots(n_blocks, T, S):
    return np.zeros(n_blocks), np.zeros((n_blocks, T, T)), np.zeros((n_blocks, S, S))


def rows_loss_and_grad(seqs, w, A1, A2, eps, opts=DEFAULT_OPTIONS, want_dA1=True) -> LossAndGrad:
    """Loss and gradient summed over given sequences ``seqs (n, T)`` with weights ``w (n, S)`` (numba).

    ``want_dA1=False`` skips the ``O(T²)`` accumulation of ``∂L/∂P`` (Stage 2: ``A1`` frozen); ``dA1`` is
    then ``None``.
    """
    T, S = A1.shape[0], A2.shape[0]
    seqs = np.ascontiguousarray(seqs, dtype=np.int64)
    w = np.ascontiguousarray(w, dtype=np.float64)
    P = np.empty((T, T))
    _k.attention(np.ascontiguousarray(A1, dtype=np.float64), P)
    n = len(seqs)
    n_blocks = max(1, -(-n // opts.direct_block_sequences))
    loss_s, G_s, dA2_s = _slots(n_blocks, T, S)
    _k.loss_grad_rows(seqs, w, P, np.ascontiguousarray(A2, dtype=np.float64), float(eps),
                      opts.direct_block_sequences, 1 if want_dA1 else 2, loss_s, G_s, dA2_s)
    loss = float(_k.sum_slots(loss_s, G_s, dA2_s))
    dA1 = None
    if want_dA1:
        dA1 = np.empty((T, T))
        _k.finish_grad(G_s[0], P, dA1)
    return LossAndGrad(loss, dA1, dA2_s[0].copy())


def rows_losses(seqs, w, A1, A2, eps) -> np.ndarray:
    """The loss of each given sequence alone, ``(n,)`` (numba forward pass; same arithmetic as the sums)."""
    T = A1.shape[0]
    P = np.empty((T, T))
    _k.attention(np.ascontiguousarray(A1, dtype=np.float64), P)
    out = np.empty(len(seqs))
    _k.loss_rows_each(np.ascontiguousarray(seqs, dtype=np.int64), np.ascontiguousarray(w, dtype=np.float64), P,
                      np.ascontiguousarray(A2, dtype=np.float64), float(eps), out)
    return out


def clear_plans() -> None:
    """Forget every cached prefix plan and leaf-weight cache (the next call on a task rebuilds them)."""
    with _LOCK:
        _PLANS.clear()
        _TABLE_PLANS.clear()
