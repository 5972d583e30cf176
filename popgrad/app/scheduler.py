"""Connecting to a Dask scheduler for ``popgrad run --scheduler`` and ``popgrad sweep --scheduler``.

:func:`connect_scheduler` refuses, with one line and within seconds, an address that is not one
(:func:`check_scheduler_address`), a server that is not a Dask scheduler (its handshake is probed
first, :func:`probe_tcp`) and a scheduler without workers (after ``worker_timeout``).
"""
from __future__ import annotations

from .config import CLIError

__all__ = ["HANDSHAKE_TIMEOUT", "check_scheduler_address", "probe_tcp", "connect_scheduler"]


#: Protocols of ``--scheduler`` popgrad connects with (checked before anything is written; issue 32).
SUPPORTED_SCHEMES = ("tcp",)

#: Seconds a Dask scheduler has to send its handshake after the TCP connection is accepted (it sends it at once).
HANDSHAKE_TIMEOUT = 5.0


def check_scheduler_address(address) -> str:
    """A Dask scheduler address (``tcp://HOST:PORT`` or ``HOST:PORT``), or a one-line error (``tls://``, ``ucx://``
    and the other protocols of Dask are refused with the reason)."""
    if not isinstance(address, str) or not address.strip():
        raise CLIError(f"--scheduler {address!r} is empty: give an address such as tcp://127.0.0.1:8786")
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import backends

    address = address.strip()
    try:
        scheme, loc = parse_address(address, strict=False)
        if scheme not in backends:
            raise ValueError(f"unknown protocol {scheme!r} (known: {', '.join(sorted(backends))})")
        if scheme in ("tcp", "tls", "ws", "wss"):
            parse_host_port(loc)
    except (ValueError, TypeError) as exc:
        raise CLIError(f"--scheduler {address!r} is not a Dask scheduler address ({_first_line(exc)}): "
                       "use tcp://HOST:PORT, e.g. tcp://127.0.0.1:8786") from None
    if scheme not in SUPPORTED_SCHEMES:
        why = {"tls": "it needs certificates (a dask Security object), which popgrad does not take",
               "wss": "it needs certificates (a dask Security object), which popgrad does not take",
               "ucx": "it needs the UCX libraries (ucx-py) and their configuration",
               "inproc": "it only reaches a scheduler inside this same process"}.get(scheme, "popgrad does not use it")
        raise CLIError(f"--scheduler {address!r}: the {scheme}:// protocol is not supported ({why}): "
                       "start the scheduler on tcp:// and give tcp://HOST:PORT")
    return address


def _first_line(exc) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def probe_tcp(address: str, timeout: float) -> None:
    """Refuse, within ``timeout`` seconds, a TCP address where nothing listens or that is not a Dask scheduler.

    A Dask scheduler writes its handshake (an 8-byte little-endian length, then a small message) as
    soon as a connection is accepted; a server that stays silent or sends something else is not one.
    """
    import socket

    from distributed.comm.addressing import parse_address, parse_host_port

    scheme, loc = parse_address(address, strict=False)
    if scheme != "tcp":
        return
    host, port = parse_host_port(loc)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or _first_line(exc))
        raise CLIError(f"cannot connect to the Dask scheduler at {address}: {why}: start one "
                       "(dask scheduler) or check --scheduler") from None
    try:
        sock.settimeout(timeout)
        head = b""
        while len(head) < 8:
            chunk = sock.recv(8 - len(head))
            if not chunk:
                break
            head += chunk
    except OSError:  # a timeout (silent server) or a reset
        head = None
    finally:
        sock.close()
    if head is None or len(head) < 8:
        what = "did not answer" if head is None else "closed the connection"
        raise CLIError(f"{address} accepted a connection but {what} as a Dask scheduler does within "
                       f"{timeout:g} s: it is not a Dask scheduler (check the host and port; the default port is 8786)")
    if not 0 < int.from_bytes(head, "little") < 2**24:
        raise CLIError(f"{address} answered, but not with the Dask protocol ({head!r}): it is not a Dask scheduler "
                       "(check the host and port; the default port is 8786)")


def connect_scheduler(address: str, worker_timeout: float = 60.0, log=None):
    """A ``dask.distributed.Client`` of the scheduler at ``address`` with at least one worker, or a one-line
    :class:`CLIError` within about ``HANDSHAKE_TIMEOUT + worker_timeout`` seconds (no hang on a wrong
    address, a server that is not a scheduler, or a scheduler without workers). ``popgrad run`` and
    ``popgrad sweep`` both use it."""
    address = check_scheduler_address(address)
    probe_tcp(address, HANDSHAKE_TIMEOUT)
    from dask.distributed import Client  # imported only when asked for

    try:
        client = Client(address, timeout=f"{max(HANDSHAKE_TIMEOUT, 1.0)}s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise CLIError(f"cannot connect to the Dask scheduler at {address}: {_first_line(exc)}") from None
    try:
        if not client.scheduler_info().get("workers"):
            if log is not None:
                log(f"Dask scheduler {address} has no workers yet: waiting up to {worker_timeout:g} s for one")
            try:
                client.wait_for_workers(1, timeout=worker_timeout)
            except (TimeoutError, OSError):
                raise CLIError(f"the Dask scheduler at {address} has no workers after {worker_timeout:g} s: start "
                               f"one (NUMBA_NUM_THREADS=1 dask worker {address} --nthreads 1), raise "
                               "--worker-timeout, or drop --scheduler") from None
    except BaseException:
        client.close()
        raise
    return client
