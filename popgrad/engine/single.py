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
import math
from collections import OrderedDict

import numpy as np

from .._validation import warn_inf
from ._kernels import prefix as _kp
from ._kernels import ranges as _kr
from ._kernels import single as _k
from . import table as _table
from .blocks import BlockJob, Partials
from .options import DEFAULT_OPTIONS, ENGINES
from .result import LossAndGrad
from .symmetry import SYMMETRY_MODES, orbit_sizes, symmetry_check
from .prefix_plan import (_LOCK, _PLANS, _STATS, _build_prefix_plan, _orbit_factor_table,  # noqa: F401
                          _parallel, _prefix_plan)

__all__ = ["loss_grad", "blocks", "block_work", "run_blocks", "finish_blocks", "decide", "direct_blocks",
           "rows_loss_and_grad", "rows_losses", "cache_stats", "clear_plans"]


_NO_CACHE = np.zeros((0, 0, 0))


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
    if engine == "prefix" and not sym and _table.use_table(task, per_atom=True):
        # many atoms: the prefix engine still carries K products per prefix node; the table-fed plan carries
        # none (the orbit reduction, when it applies, is cheaper still and keeps the per-atom path)
        engine = "table-prefix"
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
    if not job.want_grad:  # a loss-only job's gradient slots are unused: keep them from travelling
        G_s, dA2_s = np.zeros((len(loss_s), 1, 1)), np.zeros((len(loss_s), 1, 1))
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
