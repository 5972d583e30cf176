"""One exact enumeration split over Dask workers (issue 14): ``exact_loss_and_grad(..., client=client)``.

The engines (:mod:`popgrad.engine.single`, :mod:`popgrad.engine.multi`) split
the ``S**T`` sequences into a fixed set of blocks that depends on ``S``,
``T``, the mode and the :class:`EngineOptions` only; each block writes its own
slot and the slots are added in block order (:func:`sum_slots`). This module
runs those very blocks on the workers of a ``dask.distributed.Client``:

* **client side** (:func:`loss_grad`, called by :func:`popgrad.exact_loss_and_grad`
  with ``client=``): validates and decides exactly as the single-process path
  (orbit reduction, engine, ``P = softmax_rows(MASK(A1))``, the projected ``A2``),
  splits the block range into ``W`` contiguous chunks of about equal work
  (``W`` = the workers at call time, sorted by address; the split depends on
  the plan's block sizes and ``W`` only, never on timing), submits one task per
  chunk pinned to its worker (``workers=[addr]``, ``pure=False``), gathers the
  chunks' per-block slots, concatenates them in block order and adds them with
  the same :func:`sum_slots`, then applies the layer-1 softmax Jacobian (and,
  with the orbit reduction, the ``dA2`` symmetrization) exactly like
  :func:`popgrad.engine.single.loss_grad`. Every slot is bit for bit the
  single-process slot (same blocks, same kernels, same inputs), so the result
  is **bit-identical to the single-process result**, for any number of workers,
  and from run to run. (Slots, not per-chunk sums, travel back: at most
  ``max_blocks · (T² + S² + 1)`` floats, 3.3 MB at T = 20, against seconds of
  enumeration.)
* **worker side** (:func:`_run_chunk`): a worker-local cache
  ``task.fingerprint → task``, the prefix plans ``(fingerprint, sym, options) →
  plan`` and the chunk's leaf weights ``(…, lo, hi) → W`` (the weight cache of
  :mod:`popgrad.engine.single`, for the chunk's batch nodes only; same byte
  limits), kept between calls, least recently used dropped first. The task
  travels once per worker process: the client remembers which worker (by its
  scheduler id, new after a restart) has which fingerprint and sends only
  the fingerprint and ``P, A2, ε`` afterwards; a worker that lost it (cache
  cleared, evicted, a task stolen by another worker) answers ``MISSING`` and
  the chunk is resubmitted with the task.

Engines: the prefix engine (slices of the plan's ``prefixes``), the direct
engine and the k-head engine (block ranges,
:mod:`popgrad.engine._kernels.ranges`). Dask is never imported here (nor at
``import popgrad``): the client object is duck-typed.

Workers should run single-threaded numba (``NUMBA_NUM_THREADS=1``, one thread
per worker process, as ``popgrad sweep``'s ``LocalCluster``); with more
threads a worker runs its chunk on numba's pool (same bits).
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from .._validation import ArgumentTypeError, warn_inf
from ..model.multihead import head_attention
from ..task.tasks import MultiParentTask
from . import multi as _multi
from . import single as _single
from ._kernels import ranges as _kr
from ._kernels import prefix as _kp
from ._kernels import single as _k
from .result import LossAndGrad, finish
from .symmetry import orbit_sizes

__all__ = ["loss_grad", "chunk_bounds", "worker_stats", "clear_worker_caches", "MISSING"]

#: What a worker answers when it does not hold the task (the client then resends it).
MISSING = "popgrad-task-missing"


class _Job(NamedTuple):
    """What a worker needs besides the task: the engine, its decisions and the call's parameters."""

    kind: str  # "prefix" | "direct" | "multi"
    sym: bool
    P: np.ndarray  # (T, T) or (k, T, T)
    A2: np.ndarray  # (S, S) (projected onto the span with the reduction) or (k, S, S)
    eps: float
    want_grad: bool
    opts: object  # EngineOptions


# ====================================================================== client side
def loss_grad(task, A1, A2, eps, want_grad, engine, symmetry, opts, client) -> LossAndGrad:
    """:func:`popgrad.engine.single.loss_grad` / :func:`popgrad.engine.multi.loss_grad` over ``client``'s workers.

    Validated input (see :func:`popgrad.exact_loss_and_grad`); bit-identical to the single-process result.
    """
    if not (hasattr(client, "submit") and hasattr(client, "gather") and hasattr(client, "scheduler_info")):
        raise ArgumentTypeError(f"client must be a dask.distributed.Client, got {type(client).__name__}")
    task.check_size()
    if isinstance(task, MultiParentTask):
        job, work = _multi_job(task, A1, A2, eps, want_grad, opts)
    else:
        job, work = _single_job(task, A1, A2, eps, want_grad, engine, symmetry, opts)
    loss_s, G_s, dA2_s = _run(client, task, job, work)
    if job.kind == "multi":
        loss = float(_k.sum_slots(loss_s, G_s, dA2_s))  # in block order, as single-process; totals in slot 0
        if not want_grad:
            if math.isinf(loss):
                warn_inf("exact_loss_multi")
            return LossAndGrad(loss, None, None)
        return finish(loss, G_s[0], dA2_s[0], job.P, "exact_loss_and_grad")
    return _single.finish_slots(loss_s, G_s, dA2_s, job.P, job.sym, want_grad)


def _single_job(task, A1, A2, eps, want_grad, engine, symmetry, opts):
    """The decisions of :func:`popgrad.engine.single.loss_grad` (same order, same arrays), and the blocks' work."""
    sym, A2, P, engine = _single.decide(task, A1, A2, symmetry, engine, opts)
    if engine == "prefix":
        plan = _single._prefix_plan(task, sym, opts)  # the client's copy: block count and sizes only
        work = np.diff(np.append(plan.bstart, plan.n_batch))  # batch nodes per block
    else:
        n_blocks = _single.direct_blocks(task.S, task.T, opts)[1]
        work = np.ones(n_blocks, dtype=np.int64)
    return _Job(engine, bool(sym), P, A2, float(eps), bool(want_grad), opts), work


def _multi_job(task, A1, A2, eps, want_grad, opts):
    P = np.ascontiguousarray(head_attention(A1))
    A2 = np.ascontiguousarray(A2, dtype=np.float64)
    n_blocks = task.S ** _multi._n_fixed(task.S, task.T, opts)
    return _Job("multi", False, P, A2, float(eps), bool(want_grad), opts), np.ones(n_blocks, dtype=np.int64)


def chunk_bounds(work, n_workers) -> list:
    """Contiguous chunks ``[(lo, hi), …]`` of the blocks, of about equal total ``work``; empty chunks dropped.

    Chunk ``c`` ends at the block boundary nearest to ``(c+1)/n_workers`` of the
    total work (integer arithmetic): a function of ``work`` and ``n_workers`` only.
    """
    work = np.asarray(work, dtype=np.int64)
    n = len(work)
    cum = np.concatenate([[0], np.cumsum(work)]) * int(n_workers)
    total = int(work.sum())
    bounds = [0]
    for c in range(1, int(n_workers)):
        target = c * total
        b = int(np.searchsorted(cum, target, side="left"))  # first boundary at or past the target
        if 0 < b <= n and target - cum[b - 1] <= cum[b] - target:  # the nearer of the two boundaries
            b -= 1
        bounds.append(min(max(b, bounds[-1]), n))
    bounds.append(n)
    return [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


#: Client side: worker id (unique per worker process) -> fingerprints sent to it.
_SENT: dict = {}
_SENT_LOCK = threading.Lock()


def _workers(client):
    """``[(address, worker id)]`` of the client's workers, sorted by address."""
    info = client.scheduler_info()["workers"]
    if not info:
        raise RuntimeError("the Dask client has no workers: start some (e.g. `dask worker ADDRESS --nthreads 1` "
                           "with NUMBA_NUM_THREADS=1) or use client=None")
    return sorted((addr, w.get("id", addr)) for addr, w in info.items())


def _run(client, task, job, work):
    """Submit one task per chunk, resubmit with the task where it was missing; the slots in block order."""
    workers = _workers(client)
    chunks = chunk_bounds(work, len(workers))
    fp = task.fingerprint
    with _SENT_LOCK:
        has = [fp in _SENT.get(wid, ()) for _, wid in workers]
    futures = [client.submit(_run_chunk, fp, None if has[c] else task, job, lo, hi, workers=[workers[c][0]],
                             allow_other_workers=True, pure=False)
               for c, (lo, hi) in enumerate(chunks)]
    results = client.gather(futures)
    for c, r in enumerate(results):
        if isinstance(r, str) and r == MISSING:  # lost (restart, cache cleared) or run elsewhere: send the task
            lo, hi = chunks[c]
            r = client.submit(_run_chunk, fp, task, job, lo, hi, workers=[workers[c][0]], allow_other_workers=True,
                              pure=False).result()
            if isinstance(r, str):
                raise RuntimeError(f"worker {workers[c][0]} did not keep task {fp[:12]}")
            results[c] = r
    with _SENT_LOCK:
        for c in range(len(chunks)):
            _SENT.setdefault(workers[c][1], set()).add(fp)
    loss_s = np.concatenate([r[0] for r in results])
    G_s = np.concatenate([r[1] for r in results])
    dA2_s = np.concatenate([r[2] for r in results])
    return loss_s, G_s, dA2_s


def worker_stats(client) -> dict:
    """``{worker address: counters}`` of the worker-side caches (tasks received, plans and weights built, chunks)."""
    return client.run(_local_stats)


def clear_worker_caches(client=None) -> None:
    """Forget the worker-side tasks, plans and weights: on every worker of ``client``, or in this process.

    Never changes a result: the next call resends the task and rebuilds what it needs.
    """
    if client is None:
        _clear_local()
        return
    client.run(_clear_local)


# ====================================================================== worker side
#: Worker side: ``fingerprint -> task``, ``(fingerprint, sym, plan_key) -> plan``,
#: ``(fingerprint, sym, plan_key, lo, hi) -> leaf weights``; least recently used first.
_W_TASKS: OrderedDict = OrderedDict()
_W_PLANS: OrderedDict = OrderedDict()
_W_WEIGHTS: OrderedDict = OrderedDict()
_W_LOCK = threading.Lock()
_W_CACHE_SIZE = 16
_STATS = {"tasks_received": 0, "plan_builds": 0, "weight_builds": 0, "chunks": 0}


def _local_stats() -> dict:
    return dict(_STATS, tasks_held=len(_W_TASKS), plans_held=len(_W_PLANS), weight_caches_held=len(_W_WEIGHTS),
                weight_bytes=int(sum(w.nbytes for w in _W_WEIGHTS.values())))


def _clear_local() -> None:
    with _W_LOCK:
        _W_TASKS.clear()
        _W_PLANS.clear()
        _W_WEIGHTS.clear()


def _lru_get(cache, key):
    value = cache.get(key)
    if value is not None:
        cache.move_to_end(key)
    return value


def _lru_put(cache, key, value, size=_W_CACHE_SIZE):
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)


def _freeze(obj, depth=0) -> None:
    """Make the arrays of an unpickled task read-only again, as the originals (graphs and priors are immutable)."""
    if depth > 3:
        return
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            v = getattr(obj, name, None)
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
            elif v is not None and hasattr(type(v), "__slots__") and type(v).__module__.startswith("popgrad."):
                _freeze(v, depth + 1)


def _run_chunk(fp, task, job, lo, hi):
    """Worker: the slots ``(loss (n,), G (n, …), dA2 (n, …))`` of blocks ``lo … hi-1``, or :data:`MISSING`."""
    with _W_LOCK:
        held = _lru_get(_W_TASKS, fp)
        if held is None and task is not None:
            if task.fingerprint != fp:
                raise ValueError("the task's fingerprint does not match the one sent with it")
            _freeze(task)
            _lru_put(_W_TASKS, fp, task)
            _STATS["tasks_received"] += 1
            held = task
        _STATS["chunks"] += 1
    if held is None:
        return MISSING
    task = held
    _threads()
    if job.kind == "prefix":
        return _prefix_chunk(fp, task, job, lo, hi)
    if job.kind == "direct":
        return _direct_chunk(task, job, lo, hi)
    if job.kind == "multi":
        return _multi_chunk(task, job, lo, hi)
    if job.kind == "catformer":  # the disentangled transformer's blocks (popgrad.engine.catformer)
        from .catformer import run_chunk as _catformer_chunk

        return _catformer_chunk(task, job, lo, hi)
    raise ValueError(f"unknown engine {job.kind!r}")


_ENV_CHECKED = []


def _threads() -> int:
    """numba's thread count on this worker, after reconciling ``NUMBA_NUM_THREADS`` (once per process).

    A worker process that imported numba before its Nanny set ``NUMBA_NUM_THREADS``
    (spawned children re-import the parent's main script, e.g. ``popgrad`` itself)
    has a thread pool of the default size while the environment says otherwise,
    and numba's next compilation would raise ("Cannot set NUMBA_NUM_THREADS to a
    different value once the threads have been launched"). Make the environment
    agree with the pool, and use the requested number of threads from it.
    """
    import os

    import numba

    if not _ENV_CHECKED:
        want = os.environ.get("NUMBA_NUM_THREADS")
        have = numba.config.NUMBA_NUM_THREADS
        if want is not None and want.strip().isdigit() and int(want) != have:
            os.environ["NUMBA_NUM_THREADS"] = str(have)
            numba.set_num_threads(max(1, min(int(want), have)))
        _ENV_CHECKED.append(True)
    return numba.get_num_threads()


def _prefix_chunk(fp, task, job, lo, hi):
    opts, sym = job.opts, job.sym
    S, T = task.S, task.T
    pkey = (fp, sym, opts.plan_key())
    with _W_LOCK:
        plan = _lru_get(_W_PLANS, pkey)
    if plan is None:
        plan = _single._build_prefix_plan(task, sym, opts)
        with _W_LOCK:
            _lru_put(_W_PLANS, pkey, plan)
            _STATS["plan_builds"] += 1
    n_blocks = plan.prefixes.shape[0]
    first = int(plan.bstart[lo])
    n_batch = (int(plan.bstart[hi]) if hi < n_blocks else plan.n_batch) - first
    prefixes = np.ascontiguousarray(plan.prefixes[lo:hi])
    bstart = np.ascontiguousarray(plan.bstart[lo:hi] - first)
    sel = plan.order[(plan.order >= lo) & (plan.order < hi)]  # the plan's balanced order, restricted
    order = np.ascontiguousarray(sel - lo)
    X = np.empty((T, S, S, T))
    Xg = np.empty((S, plan.dig.shape[0] + 1, plan.n_groups))
    _kp.exp_tables(job.P, job.A2, plan.dig, X, Xg)
    loss_s = np.zeros(hi - lo)
    G_s, dA2_s = (np.zeros((hi - lo, T, T)), np.zeros((hi - lo, S, S))) if job.want_grad else \
        (np.zeros((hi - lo, 1, 1)), np.zeros((hi - lo, 1, 1)))
    G_k, dA2_k = (G_s, dA2_s) if job.want_grad else (np.zeros((hi - lo, T, T)), np.zeros((hi - lo, S, S)))
    wkey = pkey + (lo, hi)
    nbytes = n_batch * S * S * plan.n_groups * 8
    with _W_LOCK:
        Wc = _lru_get(_W_WEIGHTS, wkey)
    if Wc is not None:
        wmode = 2
    elif nbytes <= opts.weight_cache_bytes:
        Wc, wmode = np.empty((n_batch, S * S, plan.n_groups)), 1
    else:
        Wc, wmode = _single._NO_CACHE, 0
    parallel = plan.parallel and hi - lo > 1 and _threads() > 1
    kernel = _kp.loss_grad_prefix if parallel else _kp.loss_grad_prefix_serial
    kernel(plan.parents, plan.fac, plan.pk0, plan.wtab, plan.Q, plan.ctx_pos, X, Xg, plan.mask, plan.dig,
           plan.ofac, job.P, job.A2, job.eps, prefixes, order, sym, Wc, bstart, wmode, job.want_grad,
           loss_s, G_k, dA2_k)
    if wmode == 1:
        with _W_LOCK:
            _make_room(opts, nbytes)
            _lru_put(_W_WEIGHTS, wkey, Wc, size=10**9)
            _STATS["weight_builds"] += 1
    return loss_s, G_s, dA2_s


def _make_room(opts, nbytes) -> None:
    """Drop the least recently used chunk weights until ``nbytes`` more fit in ``opts.weight_cache_total``."""
    total = sum(w.nbytes for w in _W_WEIGHTS.values())
    while _W_WEIGHTS and total + nbytes > opts.weight_cache_total:
        total -= _W_WEIGHTS.popitem(last=False)[1].nbytes


def _direct_chunk(task, job, lo, hi):
    opts = job.opts
    S, T = task.S, task.T
    parents, mu, atoms, prior_w = task.kernel_arrays()
    block_size, n_blocks = _single.direct_blocks(S, T, opts)
    loss_s, G_s, dA2_s = _single._slots(hi - lo, T, S)
    parallel = _single._parallel(n_blocks, S**T, opts) and hi - lo > 1 and _threads() > 1
    kernel = _kr.loss_grad_direct_range if parallel else _kr.loss_grad_direct_range_serial
    kernel(lo, parents, mu, atoms, prior_w, job.P, job.A2, job.eps, block_size, job.sym, orbit_sizes(S),
           job.want_grad, loss_s, G_s, dA2_s)
    if not job.want_grad:
        return loss_s, np.zeros((hi - lo, 1, 1)), np.zeros((hi - lo, 1, 1))
    return loss_s, G_s, dA2_s


def _multi_chunk(task, job, lo, hi):
    opts = job.opts
    S, T, k = task.S, task.T, task.k
    parents, tp, atoms, pk0 = task.kernel_arrays()
    D = _multi._n_fixed(S, T, opts)
    n = hi - lo
    loss_s = np.zeros(n)
    G_s = np.zeros((n, k, T, T) if job.want_grad else (n, k, 1, 1))
    dA2_s = np.zeros((n, k, S, S) if job.want_grad else (n, k, 1, 1))
    parallel = S**D > 1 and task.n_sequences >= opts.parallel_min_sequences and n > 1 and _threads() > 1
    kernel = _kr.loss_grad_multi_range if parallel else _kr.loss_grad_multi_range_serial
    kernel(lo, parents, tp, atoms, pk0, job.P, job.A2, job.eps, D, job.want_grad, loss_s, G_s, dA2_s)
    return loss_s, G_s, dA2_s
