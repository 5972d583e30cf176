"""One exact enumeration split over Dask workers (issue 14): ``exact_loss_and_grad(..., client=client)``.

Every engine exposes its blocks through the block-runner interface of
:mod:`popgrad.engine.blocks`: ``blocks(...)`` decides the call and numbers its
blocks (a fixed set that depends on ``S``, ``T``, the mode and the
:class:`EngineOptions` only), ``run_blocks(task, job, lo, hi)`` writes the
slots of a range of them, ``finish_blocks(job, partials)`` adds all slots in
block order and applies the layer-1 softmax Jacobian. This module only splits
and ships ranges:

* **client side** (:func:`run_blocks`, called by :func:`popgrad.exact_loss_and_grad`
  with ``client=`` after the engine's ``blocks``): splits the block range into
  ``W`` contiguous chunks of about equal work (``engine.block_work``; ``W`` =
  the workers at call time, sorted by address; the split depends on the
  blocks' work and ``W`` only, never on timing), submits one task per chunk
  pinned to its worker (``workers=[addr]``, ``pure=False``), gathers the
  chunks' :class:`Partials` and concatenates them in block order. The caller
  then runs the engine's own ``finish_blocks`` on them, exactly as without a
  client. Every slot is bit for bit the single-process slot (same blocks, same
  kernels, same inputs), so the result is **bit-identical to the
  single-process result**, for any number of workers, and from run to run.
  (Slots, not per-chunk sums, travel back: at most ``max_blocks · (T² + S² +
  1)`` floats, 3.3 MB at T = 20, against seconds of enumeration.)
* **worker side** (:func:`_run_chunk`): a worker-local cache ``task.fingerprint
  → task`` (least recently used dropped first), then the engine's
  ``run_blocks`` for the chunk. The engines' own caches (the prefix plans and
  the leaf weights of each range, :mod:`popgrad.engine.single`) live in the
  worker process and are reused between calls. The task travels once per
  worker process: the client remembers which worker (by its scheduler id, new
  after a restart) has which fingerprint and sends only the fingerprint and the
  job (``P, A2, ε``, the decisions) afterwards; a worker that lost it (cache
  cleared, evicted, a task stolen by another worker) answers ``MISSING`` and
  the chunk is resubmitted with the task.

Every engine has a block runner (prefix, direct, k-head, the full model, the
gradient noise) and is treated alike: the runner's ``run_blocks`` function is
shipped by reference and returns a NamedTuple of slot arrays (block axis first;
a loss-only job's runner returns empty gradient slots, so nothing unneeded
travels). Dask is never imported here
(nor at ``import popgrad``): the client object is duck-typed.

Workers should run single-threaded numba (``NUMBA_NUM_THREADS=1``, one thread
per worker process, as ``popgrad sweep``'s ``LocalCluster``); with more
threads a worker runs its chunk on numba's pool (same bits).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .._validation import ArgumentTypeError
from . import single as _single
from .blocks import concat_partials

__all__ = ["run_blocks", "check_client", "chunk_bounds", "worker_stats", "clear_worker_caches",
           "prepare_worker", "worker_env", "MISSING"]

#: What a worker answers when it does not hold the task (the client then resends it).
MISSING = "popgrad-task-missing"


# ====================================================================== client side
def run_blocks(client, task, job, work, run):
    """All blocks of ``job`` over ``client``'s workers: the slots (the engine's partials) of blocks ``0 … n_blocks-1``.

    Parameters
    ----------
    client : dask.distributed.Client
    task : Task or MultiParentTask
        Validated; ``job`` was decided for it by its engine's ``blocks``.
    job : NamedTuple
        The engine's job (:class:`popgrad.engine.blocks.BlockJob`, the full model's or the noise engine's).
    work : int array, shape (n_blocks,)
        Relative cost of each block (the engine's ``block_work``): the chunks carry about equal work.
    run : callable
        The engine's ``run_blocks(task, job, lo, hi)`` returning a NamedTuple of per-block slot arrays
        (a module-level function: it is shipped to the workers by reference).

    Returns
    -------
    NamedTuple
        Of ``run``'s type, in block order, bit for bit ``run(task, job)`` (all ``len(work)`` blocks).
    """
    check_client(client)
    return _run(client, task, job, work, run)


def check_client(client) -> None:
    """TypeError unless ``client`` looks like a ``dask.distributed.Client`` (duck-typed: Dask is not imported)."""
    if not (hasattr(client, "submit") and hasattr(client, "gather") and hasattr(client, "scheduler_info")):
        raise ArgumentTypeError(f"client must be a dask.distributed.Client, got {type(client).__name__}")


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


#: Seconds to wait for a worker when the client has none (a restarting nanny's workers come back in seconds).
WORKER_WAIT = 10.0

#: Client side: worker id (unique per worker process) -> fingerprints sent to it.
_SENT: dict = {}
_SENT_LOCK = threading.Lock()


def _workers(client):
    """``[(address, worker id)]`` of the client's workers, sorted by address."""
    if getattr(client, "status", "running") in ("closed", "closing"):
        raise ValueError("client is closed: pass an open dask.distributed.Client (or client=None)")
    info = client.scheduler_info().get("workers")
    if not info:  # none now: a nanny may be restarting them; wait a bounded time before saying so
        try:
            client.wait_for_workers(1, timeout=WORKER_WAIT)
        except (TimeoutError, OSError):
            pass
        info = client.scheduler_info().get("workers")
    if not info:
        raise RuntimeError(f"the Dask client has no workers (waited {WORKER_WAIT:g} s): start some (e.g. `dask worker "
                           "ADDRESS --nthreads 1` with NUMBA_NUM_THREADS=1) or use client=None")
    return sorted((addr, w.get("id", addr)) for addr, w in info.items())


def _run(client, task, job, work, run):
    """Submit one task per chunk, resubmit with the task where it was missing; the partials in block order."""
    workers = _workers(client)
    chunks = chunk_bounds(work, len(workers))
    fp = task.fingerprint
    with _SENT_LOCK:
        has = [fp in _SENT.get(wid, ()) for _, wid in workers]
    futures = [client.submit(_run_chunk, fp, None if has[c] else task, run, job, lo, hi, workers=[workers[c][0]],
                             allow_other_workers=True, pure=False)
               for c, (lo, hi) in enumerate(chunks)]
    results = client.gather(futures)
    for c, r in enumerate(results):
        if isinstance(r, str) and r == MISSING:  # lost (restart, cache cleared) or run elsewhere: send the task
            lo, hi = chunks[c]
            r = client.submit(_run_chunk, fp, task, run, job, lo, hi, workers=[workers[c][0]],
                              allow_other_workers=True, pure=False).result()
            if isinstance(r, str):
                raise RuntimeError(f"worker {workers[c][0]} did not keep task {fp[:12]}")
            results[c] = r
    with _SENT_LOCK:
        for c in range(len(chunks)):
            _SENT.setdefault(workers[c][1], set()).add(fp)
    return concat_partials(results)


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
#: Worker side: ``fingerprint -> task``, least recently used first (the engines keep their own caches).
_W_TASKS: OrderedDict = OrderedDict()
_W_LOCK = threading.Lock()
_W_CACHE_SIZE = 16
_STATS = {"tasks_received": 0, "chunks": 0}


def _local_stats() -> dict:
    return dict(_STATS, tasks_held=len(_W_TASKS), **_single.cache_stats())


def _clear_local() -> None:
    with _W_LOCK:
        _W_TASKS.clear()
    _single.clear_plans()


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


def _run_chunk(fp, task, run, job, lo, hi):
    """Worker: ``run(task, job, lo, hi)`` (the slots of blocks ``lo … hi-1``), or :data:`MISSING`."""
    with _W_LOCK:
        held = _W_TASKS.get(fp)
        if held is not None:
            _W_TASKS.move_to_end(fp)
        elif task is not None:
            if task.fingerprint != fp:
                raise ValueError("the task's fingerprint does not match the one sent with it")
            _freeze(task)
            _lru_put(_W_TASKS, fp, task)
            _STATS["tasks_received"] += 1
            held = task
        _STATS["chunks"] += 1
    if held is None:
        return MISSING
    prepare_worker()
    return run(held, job, lo, hi)


#: The environment of a worker that :func:`worker_env` gives: one numba thread per worker process.
WORKER_ENV = {"NUMBA_NUM_THREADS": "1"}
_ENV_CHECKED = []


def worker_env() -> dict:
    """Environment variables for the worker processes of a cluster popgrad starts (``popgrad sweep``)."""
    return dict(WORKER_ENV)


def prepare_worker() -> int:
    """The one worker set-up of popgrad's Dask tasks (sweep cells and enumeration chunks); returns numba's
    thread count for this task.

    A worker process may import numba *before* its Nanny sets ``NUMBA_NUM_THREADS``
    (a spawned child re-imports the parent's main module, e.g. the ``popgrad`` command,
    which imports numba). numba then holds the default thread count while the
    environment says otherwise, and once its pool has launched, the next compilation
    raises "Cannot set NUMBA_NUM_THREADS to a different value once the threads have
    been launched". This reconciles the two once per process -- the environment is set
    to the count numba already holds, so no compilation can raise -- and, on every call
    (the setting is per thread), limits the calling thread to the requested number
    (``numba.set_num_threads``). Results never depend on it (DESIGN: thread-count
    independent kernels).
    """
    import os

    import numba

    have = numba.config.NUMBA_NUM_THREADS
    want = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    if not _ENV_CHECKED:
        if want and want != str(have):
            os.environ["NUMBA_NUM_THREADS"] = str(have)
        _ENV_CHECKED.append(want)
    want = _ENV_CHECKED[0]
    if want.isdigit() and int(want) >= 1:
        n = min(int(want), have)
        if numba.get_num_threads() != n:
            numba.set_num_threads(n)
    return numba.get_num_threads()
