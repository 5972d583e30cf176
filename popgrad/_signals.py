"""Signals, Ctrl-C and closed pipes of the ``popgrad`` command: the one place that handles them.

The library installs nothing: importing :mod:`popgrad` in a script, a
notebook or a Dask worker leaves every signal handler and ``sys.excepthook``
as it was. What this module offers:

* :func:`install_import_guard` -- called first by ``popgrad/__init__.py``; it
  acts only when this process *is* the ``popgrad`` command (``popgrad ...``
  or ``python -m popgrad.app.cli``), never in a library user's process nor in
  a child process of the command (multiprocessing / Dask workers inherit the
  command's ``sys.argv`` but are not the command). Then a Ctrl-C while the
  command is still importing prints one line and exits 130 (also when C code
  turned the ``KeyboardInterrupt`` into another error: the command's SIGINT
  handler notes that the signal came, :func:`sigint_seen`; one raised where
  Python cannot propagate it, e.g. in an import-lock callback, is sent again
  instead of printing "Exception ignored").
* :func:`cli_session` -- the command's ``main`` (``run``, ``summary`` and
  ``sweep`` alike) runs inside it: SIGTERM becomes :class:`Terminated`
  (raised in the main thread, so ``finally`` blocks remove temporary files
  and release locks), SIGINT stays ``KeyboardInterrupt``, and the import guard
  steps aside (``main`` reports interrupts itself, with what was kept).
* :func:`deferred` -- delay SIGINT / SIGTERM while a block runs (the renames of
  :class:`popgrad._io.OutputDir`); installs handlers only for the block.
* :func:`shield_children` -- start child processes (a Dask ``LocalCluster``'s
  workers) with SIGINT blocked, and :data:`CHILD_FLAG` in the command's
  environment: its multiprocessing children ignore SIGINT from their first
  import of popgrad on. A Ctrl-C at the terminal, sent to the whole process
  group, reaches only the command, which then ends its workers.
* :func:`watchdog` -- the command's promise (gone within two seconds of SIGINT or SIGTERM) when the
  main thread cannot act: Python runs a signal handler between bytecodes only, and a long C call
  (numba's LLVM compiling a kernel on a fresh machine takes up to 4 s per call) delays it. The C-level
  handler writes the signal to a wake-up pipe; a helper thread reading it ends the command itself
  (:data:`WATCHDOG_UNHANDLED` s after a signal no handler has acted on, :data:`WATCHDOG_HARD` s after
  any) with the cleanups registered by :func:`on_emergency` (the staging folder, the folder lock, a
  temporary file, the sweep's workers), the command's one line (:func:`set_interrupt_line`) and 130/143.
  It waits for a :func:`deferred` block (a rename) to end and never acts once the status is decided
  (:func:`final_line`, :func:`ignore_late_signals`).
* :func:`say` -- ``print`` that survives a closed pipe (``popgrad ... | head -1``).
"""
from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

__all__ = ["Terminated", "install_import_guard", "is_cli_process", "cli_session", "deferred", "shield_children",
           "say", "sigint_seen", "signal_seen", "ignore_late_signals", "watchdog", "on_emergency", "set_interrupt_line",
           "final_line"]

_CLI_MODULES = ("popgrad.app.cli", "popgrad")
_STATE = {"guard": False, "session": False, "sigint": False, "sigterm": False, "resend": False}


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that ``finally`` blocks (temporary files, locks) run."""


def is_cli_process() -> bool:
    """True when this process is the ``popgrad`` command itself (not a library user, not a child process)."""
    orig = list(getattr(sys, "orig_argv", None) or sys.argv)
    if any("multiprocessing" in a for a in orig):  # a spawned / forkserver child: it inherits sys.argv only
        return False
    if sys.argv and os.path.basename(sys.argv[0]) == "popgrad":
        return True
    return any(a == "-m" and i + 1 < len(orig) and orig[i + 1] in _CLI_MODULES for i, a in enumerate(orig))


def _on_sigint(signum, frame):
    """The command's SIGINT handler: ``KeyboardInterrupt``, as Python's own, and a note that it came.

    C code may turn the ``KeyboardInterrupt`` into another error (an import interrupted
    inside ``PyCapsule_Import`` becomes an ``ImportError``); the note lets the command
    still report the interrupt (one line, 130) instead of that error's traceback.
    """
    _STATE["sigint"] = True
    _acted()
    raise KeyboardInterrupt


#: Seconds after which a ``KeyboardInterrupt`` swallowed as "unraisable" is raised again in the main thread.
RESEND_DELAY = 0.05


def _resend(sig) -> None:
    """``sig`` (SIGINT or SIGTERM) to the main thread, from a helper thread once the unraisable hook has returned.

    Sending it from inside the hook (``os.kill``) runs the handler *in the hook*, where the new
    ``KeyboardInterrupt`` is swallowed again: the interrupt was lost (issue 32). The helper thread
    waits until the hook is done; ``pthread_kill`` targets the main thread, so a blocking call
    there (a lock, a ``select``) is interrupted too.
    """
    def later():
        time.sleep(RESEND_DELAY)
        try:
            signal.pthread_kill(threading.main_thread().ident, sig)
        except (OSError, ValueError, AttributeError):
            try:
                os.kill(os.getpid(), sig)
            except OSError:
                pass
        finally:
            _STATE["resend"] = False

    if _STATE.get("resend"):  # one re-send is already on its way
        return
    _STATE["resend"] = True
    threading.Thread(target=later, name="popgrad-resend-sigint", daemon=True).start()


def _unraisable(unraisable, _previous=sys.unraisablehook):
    """A ``KeyboardInterrupt`` raised where Python cannot propagate it (a weakref callback of the import
    system, a ``__del__``): no "Exception ignored" traceback; the signal is sent again once this hook
    has returned (:func:`_resend`); SIGTERM's :class:`Terminated` likewise, so the interrupt reaches the command's own code."""
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, (KeyboardInterrupt, Terminated)):
        _resend(signal.SIGINT if issubclass(unraisable.exc_type, KeyboardInterrupt) else signal.SIGTERM)
        return
    if _STATE.get("decided") and signal_seen() is not None:
        # after an interrupt's last line: a half-built object's ``__del__`` at exit (llvmlite's ``ObjectRef``,
        # its constructor cut off by the signal mid-compile) is not the user's news; the promise is one line
        return
    _previous(unraisable)


def sigint_seen() -> bool:
    """True once the command has received SIGINT (whatever exception it became)."""
    return _STATE["sigint"]


def signal_seen():
    """``signal.SIGINT`` or ``signal.SIGTERM`` once the command has received one (SIGINT first: a terminal's
    Ctrl-C), whatever exception it became (C code, numba's compiler among it, may turn either into
    another error); ``None`` before."""
    if _STATE["sigint"]:
        return signal.SIGINT
    return signal.SIGTERM if _STATE.get("sigterm") else None


def _import_hook(exc_type, exc, tb, _previous=sys.excepthook):
    terminated = issubclass(exc_type, Terminated) or _STATE.get("sigterm", False)
    interrupted = issubclass(exc_type, KeyboardInterrupt) or _STATE["sigint"]
    if (interrupted or terminated) and _STATE["guard"] and not _STATE["session"]:
        what, code = ("terminated", 143) if terminated and not issubclass(exc_type, KeyboardInterrupt) \
            else ("interrupted", 130)
        sys.stderr.write(f"popgrad: {what} (nothing was written)\n")
        sys.stderr.flush()
        os._exit(code)
    _previous(exc_type, exc, tb)


def _on_sigterm_importing(signum, frame):
    """SIGTERM while the command still imports: :class:`Terminated` (one line and 143 from
    :func:`_import_hook`), not the default kill (exit -15 with nothing said)."""
    _STATE["sigterm"] = True
    raise Terminated()


#: Set in the environment of the ``popgrad`` command for its session: a multiprocessing child (a Dask
#: worker of its LocalCluster) that sees it ignores SIGINT from its first import of popgrad on.
CHILD_FLAG = "POPGRAD_COMMAND_CHILD"


def _is_multiprocessing_child() -> bool:
    return any("multiprocessing" in a for a in (getattr(sys, "orig_argv", None) or sys.argv))


def _ignore_sigint_in_child() -> None:
    """A worker process of the command ignores SIGINT: a terminal's Ctrl-C reaches the whole process
    group, and the command closes its workers itself (no worker tracebacks, no half-written cells).

    The workers start with SIGINT blocked (:func:`shield_children`); this runs when the worker imports
    popgrad, which it does first (a spawned child re-imports the command's main module): ``SIG_IGN``
    discards a Ctrl-C that came while it started (pending, blocked) and any later one, and keeps asyncio
    from installing its own SIGINT handler in the worker's event loop.
    """
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    except (ValueError, OSError):  # not the main thread
        pass


def install_import_guard() -> None:
    """In the ``popgrad`` command only (:func:`is_cli_process`): a Ctrl-C during its imports is one line, 130.

    In a multiprocessing child of the command (its Dask workers; :data:`CHILD_FLAG`): SIGINT ignored."""
    if os.environ.get(CHILD_FLAG) == "1" and _is_multiprocessing_child():
        _ignore_sigint_in_child()
        return
    if not _STATE["guard"] and is_cli_process() and sys.excepthook is sys.__excepthook__:
        sys.excepthook = _import_hook
        _STATE["guard"] = True
        try:
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when SIGINT is ignored
                signal.signal(signal.SIGINT, _on_sigint)
                if sys.unraisablehook is sys.__unraisablehook__:
                    sys.unraisablehook = _unraisable
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # not when SIGTERM is ignored or handled
                signal.signal(signal.SIGTERM, _on_sigterm_importing)
                if sys.unraisablehook is sys.__unraisablehook__:
                    sys.unraisablehook = _unraisable
        except (ValueError, OSError):  # not the main thread
            pass


def _raise_terminated(signum, frame):
    _STATE["sigterm"] = True
    _acted()
    raise Terminated()


def ignore_late_signals() -> None:
    """The command has finished (or decided its status): SIGINT and SIGTERM are ignored from here to the exit.

    ``SIG_IGN`` is a process-wide disposition, so no thread (numba's, an I/O thread) can take a late signal
    with the default action, and the interpreter's finalization leaves it in place (it resets only Python
    handlers); :func:`cli_session` then keeps it. Main thread only (elsewhere a no-op).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):
            pass
    _STATE["finished"] = True


# ------------------------------------------------------------------------------------------ the watchdog
#: Seconds the main thread has to act on SIGINT/SIGTERM (run its Python handler) before the watchdog ends
#: the command itself; and seconds after which it does so even when a handler has acted. Both well inside
#: the two seconds the README promises.
WATCHDOG_UNHANDLED = 1.0
WATCHDOG_HARD = 1.6

#: Held by the main thread in a :func:`deferred` block and while it prints its last line, and by the
#: watchdog from its decision to the process's end: the two never both end the command.
_EXIT = threading.RLock()
_CLEANUPS: dict = {}
_KEYS = itertools.count()
_EVENTS = {"acted": threading.Event()}
_LINE = {"fn": None}


def _acted() -> None:
    """A Python handler of the command ran: the main thread is acting on the signal."""
    _EVENTS["acted"].set()


@contextmanager
def on_emergency(fn):
    """Run ``fn()`` if the watchdog ends the command while the block runs (it is removed afterwards).

    ``fn`` is called from the watchdog's thread while the main thread is stuck in C code: it must be
    quick, idempotent and safe against that (remove a file or folder, kill processes)."""
    key = add_emergency(fn)
    try:
        yield
    finally:
        remove_emergency(key)


def add_emergency(fn) -> int:
    """:func:`on_emergency` for a lifetime that is not a block: returns the key :func:`remove_emergency` takes."""
    key = next(_KEYS)
    _CLEANUPS[key] = fn
    return key


def remove_emergency(key) -> None:
    _CLEANUPS.pop(key, None)


def set_interrupt_line(fn) -> None:
    """``fn(sig) -> str``: the one line the watchdog prints when it ends the command (``None``: the default)."""
    _LINE["fn"] = fn


def final_line(text: str) -> None:
    """Print the command's last line on stderr and mark its status decided: the watchdog stays out."""
    with _EXIT:
        _STATE["decided"] = True
        print(text, file=sys.stderr)
        sys.stderr.flush()


def _emergency(sig) -> None:
    with _EXIT:  # a deferred block (a rename) ends first
        if _STATE.get("finished") or _STATE.get("decided"):
            return
        _STATE["decided"] = True
        for key in sorted(_CLEANUPS, reverse=True):  # the newest first
            try:
                _CLEANUPS.get(key, lambda: None)()
            except BaseException:  # noqa: BLE001 - best effort: the process ends now
                pass
        line = None
        if _LINE["fn"] is not None:
            try:
                line = _LINE["fn"](sig)
            except BaseException:  # noqa: BLE001
                line = None
        if not line:
            line = f"popgrad: {'terminated' if sig == signal.SIGTERM else 'interrupted'}"
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001
            pass
        os.write(2, (line + "\n").encode())
        os._exit(143 if sig == signal.SIGTERM else 130)


def _settled(seconds) -> bool:
    """Wait up to ``seconds``; True as soon as the command's status is decided."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if _STATE.get("finished") or _STATE.get("decided"):
            return True
        time.sleep(0.01)
    return bool(_STATE.get("finished") or _STATE.get("decided"))


def _watch(rfd) -> None:
    while True:
        try:
            data = os.read(rfd, 512)
        except OSError:
            return
        if not data:  # the write end is closed: the session is over
            return
        sigs = [b for b in data if b in (signal.SIGINT, signal.SIGTERM)]
        if not sigs or _STATE.get("finished") or _STATE.get("decided"):
            continue
        sig = sigs[0]
        t0 = time.monotonic()
        if not _EVENTS["acted"].wait(WATCHDOG_UNHANDLED):  # the main thread is stuck in C code
            if not (_STATE.get("finished") or _STATE.get("decided")):
                _emergency(sig)
            continue
        if not _settled(WATCHDOG_HARD - (time.monotonic() - t0)):
            _emergency(sig)


_PIPE = {"fds": None}


def _forget_pipe_in_child() -> None:
    """In a forked child: no wake-up pipe (the parent's watchdog must not read the child's signals)."""
    fds = _PIPE["fds"]
    if fds is None:
        return
    _PIPE["fds"] = None
    try:
        current = signal.set_wakeup_fd(-1)
        if current not in fds:  # someone else's: put it back
            signal.set_wakeup_fd(current)
    except (ValueError, OSError):
        pass
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


@contextmanager
def watchdog():
    """The command's watchdog for the block (main thread only, POSIX; elsewhere a no-op). See the module doc."""
    if (threading.current_thread() is not threading.main_thread() or os.name != "posix"
            or not hasattr(os, "register_at_fork")):
        yield
        return
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    try:
        old = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(rfd)
        os.close(wfd)
        yield
        return
    if not _STATE.get("at_fork"):
        # a forked child (multiprocessing's fork) would write its own signals into our pipe: it forgets it
        os.register_at_fork(after_in_child=_forget_pipe_in_child)
        _STATE["at_fork"] = True
    _PIPE["fds"] = (rfd, wfd)
    _EVENTS["acted"].clear()
    thread = threading.Thread(target=_watch, args=(rfd,), name="popgrad-watchdog", daemon=True)
    thread.start()
    try:
        yield
    finally:
        try:
            signal.set_wakeup_fd(old)
        except (ValueError, OSError):
            pass
        _PIPE["fds"] = None
        os.close(wfd)  # the thread reads end-of-file and stops


#: The warning filter the command's children inherit (:func:`cli_session`).
_TRACKER_FILTER = "ignore:resource_tracker:UserWarning"


@contextmanager
def cli_session():
    """The command's signal handling for the duration of ``main`` (see the module doc)."""
    old = None
    if threading.current_thread() is threading.main_thread():
        try:
            old = signal.signal(signal.SIGTERM, _raise_terminated)
        except (ValueError, OSError):
            old = None
    hook = sys.unraisablehook
    if old is not None and hook is sys.__unraisablehook__:
        sys.unraisablehook = _unraisable  # a Terminated raised in a __del__ is sent again, not lost
    flag = os.environ.get(CHILD_FLAG)
    os.environ[CHILD_FLAG] = "1"  # the command's worker processes ignore a terminal's Ctrl-C
    # multiprocessing's resource tracker (a child started with this environment) warns about the
    # semaphores of workers killed on an interrupt: not the command's one line, and nothing leaks
    warn = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [warn, _TRACKER_FILTER]))
    _STATE["session"] = True
    guard = watchdog() if is_cli_process() else contextmanager(lambda: (yield))()
    try:
        with guard:
            yield
    finally:
        if flag is None:
            os.environ.pop(CHILD_FLAG, None)
        else:
            os.environ[CHILD_FLAG] = flag
        if warn is None:
            os.environ.pop("PYTHONWARNINGS", None)
        else:
            os.environ["PYTHONWARNINGS"] = warn
        if old is not None:
            if not _STATE.get("finished"):  # a finished command keeps ignoring (ignore_late_signals)
                signal.signal(signal.SIGTERM, old)
            sys.unraisablehook = hook


@contextmanager
def deferred():
    """Delay SIGINT/SIGTERM until the block is done (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    old = {}

    def hold(s, f):
        pending.append(s)
        _acted()

    try:
        with _EXIT:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    old[sig] = signal.signal(sig, hold)
                except (ValueError, OSError):
                    pass
            try:
                yield
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)
    finally:
        for sig in pending:  # outside the lock: the watchdog may act meanwhile
            os.kill(os.getpid(), sig)


@contextmanager
def shield_children():
    """Processes and threads started inside the block have SIGINT blocked (POSIX; elsewhere a no-op).

    The signal mask is inherited by threads created here (a Dask event loop) and by the
    processes they spawn (its workers), so a terminal Ctrl-C is seen by this process only.
    A SIGINT that arrives meanwhile is delivered here when the block ends.

    multiprocessing's resource tracker is started first, outside the block: the first spawned child of a
    process starts it, and its ``ensure_running`` blocks SIGINT and SIGTERM around that spawn and then
    *unblocks* them in the calling thread (CPython's ``resource_tracker.py``), which would lift this block
    in the Dask thread that goes on to spawn the workers: they started with SIGINT deliverable and printed a
    ``KeyboardInterrupt`` traceback when a Ctrl-C came while they imported.
    """
    block = getattr(signal, "pthread_sigmask", None)
    if block is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    except Exception:  # no tracker on this platform or it cannot start: Dask's own start will say so
        pass
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def say(text="") -> None:
    """``print`` that survives a closed pipe (``popgrad run | head -1``): the run goes on, output is dropped."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
