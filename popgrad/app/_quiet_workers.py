"""A worker plugin for the sweep's own ``LocalCluster`` (:mod:`popgrad.app.sweep_cluster`): the workers drop
Dask's "Failed to communicate with scheduler during heartbeat" record.

Dask logs that record, with a traceback, when a worker's heartbeat is in flight while the scheduler closes
its connection. That happens at an orderly shutdown: ``Worker.heartbeat`` logs any ``OSError`` this way
(dask/distributed #7105, #9032). Our cluster's scheduler lives in the sweep's own process, so it goes away
only when the sweep closes it, and the record is noise on the command's stderr. A sweep into a closed pipe
printed it once in a full test run. Every other record is kept, and so is every record of a cluster given
with ``--scheduler``.
"""
from __future__ import annotations

import logging

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["QuietHeartbeatAtShutdown", "heartbeat_loss", "installed"]

#: The start of the record dropped (``distributed.worker.Worker.heartbeat``'s ``logger.exception``).
HEARTBEAT_LOSS = "Failed to communicate with scheduler during heartbeat"


def heartbeat_loss(record: logging.LogRecord) -> bool:
    """``logging`` filter: ``False`` (drop) for the heartbeat-loss record, ``True`` for every other."""
    return not str(record.msg).startswith(HEARTBEAT_LOSS)


class QuietHeartbeatAtShutdown(WorkerPlugin):
    """Adds :func:`heartbeat_loss` to the ``distributed.worker`` logger of every worker (once per process)."""

    name = "popgrad-quiet-heartbeat-at-shutdown"

    def setup(self, worker):
        log = logging.getLogger("distributed.worker")
        if heartbeat_loss not in log.filters:
            log.addFilter(heartbeat_loss)


def installed() -> bool:
    """Whether this process's ``distributed.worker`` logger drops the record (``client.run(installed)``)."""
    return heartbeat_loss in logging.getLogger("distributed.worker").filters
