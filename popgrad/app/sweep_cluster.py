"""The Dask cluster of a sweep (:mod:`popgrad.app.sweep`): ``--workers``, our own ``LocalCluster`` and what
an interrupt does to it.

Without ``--scheduler`` or ``client=``, a ``LocalCluster(n_workers=N, threads_per_worker=1,
processes=True)`` is started with ``NUMBA_NUM_THREADS=1`` in the workers' environment and SIGINT
blocked in them (:func:`popgrad._signals.shield_children`: a terminal Ctrl-C reaches the command,
which closes them). After an interrupt its worker processes are killed at once
(:func:`_stop_workers_now`) and Dask gets :data:`CLOSE_TIMEOUT_INTERRUPTED` seconds to close the
client and cluster (:func:`_close`), so that the command exits within 2 s. Its workers drop Dask's
heartbeat-loss record of an orderly shutdown (:mod:`popgrad.app._quiet_workers`).
"""
from __future__ import annotations

import logging
import os
import signal
import warnings

from .._signals import Terminated, shield_children
from .config import CLIError, CLITypeError
from .scheduler import connect_scheduler

__all__ = ["check_workers", "MAX_WORKERS_PER_CORE", "CLOSE_TIMEOUT_INTERRUPTED"]

#: ``--workers`` at most this many times the machine's cores (beyond it, processes only compete for them).
MAX_WORKERS_PER_CORE = 4


def check_workers(workers, n_cells: int | None = None):
    """``--workers``: ``None`` (the cores) or an integer in ``1 .. MAX_WORKERS_PER_CORE x cores``."""
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise CLITypeError(f"--workers {workers!r}: use an integer >= 1")
    if workers < 1:
        raise CLIError(f"--workers {workers}: use an integer >= 1")
    cores = os.cpu_count() or 1
    if workers > MAX_WORKERS_PER_CORE * cores:
        raise CLIError(f"--workers {workers} is far above the {cores} cores of this machine (limit "
                       f"{MAX_WORKERS_PER_CORE * cores} = {MAX_WORKERS_PER_CORE} x cores; every worker is a process "
                       f"with its own memory): use --workers {cores}, or --scheduler for a larger cluster")
    return workers


def _start_client(scheduler, workers, n_cells, worker_timeout, log):
    if scheduler:
        return connect_scheduler(scheduler, worker_timeout, log), None
    from dask.distributed import Client, LocalCluster

    from ..engine.distributed import worker_env

    n = max(1, min(workers or os.cpu_count() or 1, n_cells))
    cluster = None
    before = _spawned_children()
    try:
        with shield_children(), warnings.catch_warnings():  # a terminal Ctrl-C reaches this process only
            # Dask's warnings of an orderly shutdown (cancelled cells, a busy worker killed) are not the user's
            # news, nor is a dashboard on another port than 8787 (the log line gives its address)
            warnings.filterwarnings("ignore", message=r"Port \d+ is already in use")
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, env=worker_env(),
                                   silence_logs=logging.ERROR)
        client = Client(cluster)
        from ._quiet_workers import QuietHeartbeatAtShutdown

        client.register_plugin(QuietHeartbeatAtShutdown())  # our own workers' shutdown noise (its docstring)
        return client, cluster
    except BaseException as exc:  # a Ctrl-C held back while the cluster started is delivered here
        if cluster is not None:
            if isinstance(exc, (KeyboardInterrupt, Terminated)):
                _stop_workers_now(cluster)
                _close(cluster, timeout=CLOSE_TIMEOUT_INTERRUPTED)
            else:
                cluster.close()
        if isinstance(exc, (KeyboardInterrupt, Terminated)):
            _kill_new_children(before)
        raise


def _spawned_children() -> dict:
    """``{pid: process}`` of this process's children started by multiprocessing's ``spawn`` (Dask's worker
    processes; their command line runs ``spawn_main``), at any depth; ``{}`` where psutil cannot tell."""
    try:
        import psutil

        kids = psutil.Process().children(recursive=True)
    except Exception:  # psutil is a Dask dependency; without it (or without /proc) nothing is known
        return {}
    out = {}
    for kid in kids:
        try:
            if any("spawn_main" in part for part in kid.cmdline()):
                out[kid.pid] = kid
        except Exception:  # gone meanwhile, or not ours to read
            pass
    return out


def _kill_new_children(before: dict) -> None:
    """SIGKILL the worker processes the cluster start spawned (children not in ``before``), after an interrupt
    that came while ``LocalCluster`` started them: the cluster object does not exist yet to stop them, and a
    child still reading its start-up data from the command, which now exits, would print an ``EOFError``
    traceback on the command's stderr."""
    for pid, kid in _spawned_children().items():
        if pid in before:
            continue
        try:
            kid.send_signal(signal.SIGKILL)
        except Exception:  # already gone
            pass


#: Seconds Dask gets to close our client and cluster after an interrupt (the promise is an exit within 2 s).
CLOSE_TIMEOUT_INTERRUPTED = 0.5


def _close(obj, timeout=None) -> None:
    """``obj.close()``; with a ``timeout`` (after an interrupt) bounded and quiet."""
    if timeout is None:
        obj.close()
        return
    try:
        obj.close(timeout=timeout)
    except Exception:  # a TimeoutError of the bounded close: the process ends right after
        pass


def _stop_workers_now(cluster) -> None:
    """End the worker processes of our own ``LocalCluster`` at once (SIGKILL), so that an interrupt acts
    within a second instead of waiting for Dask's orderly close of busy workers; what their cells
    left (staging folders, locks) is removed by :func:`popgrad._io.clear_stale` afterwards."""
    if cluster is None:
        return
    try:
        from distributed.core import Status

        closing = Status.closing
    except ImportError:  # pragma: no cover - Dask is a dependency of the sweep
        closing = None
    for nanny in list(getattr(cluster, "workers", {}).values()):
        try:
            if closing is not None:
                nanny.status = closing  # the Nanny must not start a new worker when this one dies
            pid = nanny.pid
        except Exception:
            pid = None
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:  # already gone
                pass


def _dashboard(client) -> str:
    try:
        if "dashboard" not in client.scheduler_info().get("services", {}):
            return "not running (pip install bokeh for the Dask dashboard)"
        return client.dashboard_link
    except Exception:  # informational only
        return "unknown"


def _check_client(client) -> None:
    if not (hasattr(client, "submit") and hasattr(client, "scheduler_info")):
        raise CLITypeError(f"client must be a dask.distributed.Client, got {type(client).__name__}")
    if getattr(client, "status", "running") in ("closed", "closing"):
        raise CLIError("client is closed: pass an open dask.distributed.Client, or client=None for a LocalCluster")
