"""Atomic file output: every file popgrad writes appears whole or not at all.

* :func:`atomic_path` / :func:`atomic_write_text` / :func:`atomic_savez`: one
  file, written to a temporary sibling, ``fsync``-ed, then renamed into place
  (and the folder ``fsync``-ed), so a crash, a full disk or a signal leaves
  either the old file or the new one, never a part.
* :class:`OutputDir`: the one mechanism for an output folder (``--out``):
  :func:`check_output_dir` validates the path before anything is written;
  entering the context creates the folder and takes its lock
  (``.popgrad.lock`` holding the PID; a lock whose process is gone is stale
  and taken over); files are written into a staging folder inside it and
  moved into place together by :meth:`OutputDir.commit`, which first removes
  the outputs of an earlier, different run that this run does not produce.
  On an error nothing of the run is left behind except :meth:`OutputDir.keep`
  files (the checkpoint), which are written in place, atomically, so that an
  interrupted run can be resumed.

Input is bounded before it is read: :func:`read_input_file` opens without blocking, refuses a
device (``/dev/zero``), a socket or a folder and a file above its size cap, and reads a pipe (``--config
<(cat run.toml)``, a FIFO) within a bound on its size and time (:data:`MAX_PIPE_SECONDS`);
:func:`regular_file_problem` tells a reader that needs a seekable file (a checkpoint) what else it
got; :func:`memory_limit` is the memory a size guard may count on (physical memory, or the process's own
limit, ``ulimit -v``, when lower).
"""
from __future__ import annotations

import errno
import os
import platform
import secrets
import shutil
import tempfile
from contextlib import contextmanager

import numpy as np

from ._signals import add_emergency, deferred, on_emergency, remove_emergency

__all__ = ["InputFileError", "read_input_file", "MAX_INPUT_BYTES", "MAX_PIPE_SECONDS", "regular_file_problem", "memory_limit", "atomic_path", "atomic_write_text", "atomic_savez", "OutputDir", "OutputDirError", "check_output_dir",
           "FolderLock", "clear_stale"]


def _default_mode() -> int:
    """``0o666`` minus the process umask: what ``open()`` would give a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


#: Largest config file or sweep spec read (a spec of 10,000 cells is well below it).
MAX_INPUT_BYTES = 16 * 2**20


class InputFileError(ValueError):
    """An input file (``--config``, a sweep spec) that cannot be read; one line naming it and the fix."""


def _file_kind(mode) -> str:
    """What a non-regular file is, for the one-line errors."""
    import stat as _stat

    return ("a folder" if _stat.S_ISDIR(mode) else "a FIFO (named pipe)" if _stat.S_ISFIFO(mode)
            else "a device" if _stat.S_ISCHR(mode) or _stat.S_ISBLK(mode)
            else "a socket" if _stat.S_ISSOCK(mode) else "not a regular file")


def regular_file_problem(path) -> str | None:
    """``None`` when ``path`` is a regular file; else what it is (``"a FIFO (named pipe)"``, ``"a device"``, ...).

    Looked at without blocking (``O_NONBLOCK`` open, then ``fstat``; a FIFO with no writer does not wait),
    for the readers that need a regular, seekable file (an ``.npz`` archive: ``--resume``'s checkpoint).
    A missing or unreadable file is left to the reader's own error (``None``).
    """
    import stat as _stat

    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:
        return "a folder"
    except OSError:
        return None
    try:
        mode = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    return None if _stat.S_ISREG(mode) else _file_kind(mode)


#: Longest a pipe (``--config <(cat run.toml)``, a named FIFO) is waited for, in seconds, before its reading
#: is given up with one line: a writer that never writes (or never ends) cannot hang a command.
MAX_PIPE_SECONDS = 10.0


def read_input_file(path, what: str, limit: int = MAX_INPUT_BYTES, timeout: float | None = None) -> bytes:
    """The bytes of the small input file ``path`` (``what`` names it in errors), bounded in size and time.

    Opened without blocking (``O_NONBLOCK``: opening a FIFO with no writer does not wait). A regular file
    larger than ``limit`` bytes is refused from its size, unread; a pipe or FIFO (a process substitution
    ``<(cat run.toml)``, a named pipe) is read as it arrives, until its writer closes it, for at most
    ``timeout`` seconds (:data:`MAX_PIPE_SECONDS`) and ``limit`` bytes; a device (``/dev/zero``), a socket
    or a folder is refused. At most ``limit + 1`` bytes are ever read, so a file that grows meanwhile is
    refused too. Raises :class:`InputFileError` (a ``ValueError``).
    """
    import stat as _stat

    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if _stat.S_ISFIFO(st.st_mode):
            chunks, total = _read_pipe(fd, path, what, limit, MAX_PIPE_SECONDS if timeout is None else timeout)
        elif not _stat.S_ISREG(st.st_mode):
            raise InputFileError(f"{what} {path} is {_file_kind(st.st_mode)}, not a regular file: give the path "
                                 "of a TOML file (or a pipe: --config <(cat run.toml))")
        else:
            if st.st_size > limit:
                raise InputFileError(f"{what} {path} is {_size_text(st.st_size)}, above the {_size_text(limit)} a "
                                     f"{what} may have: give a TOML file of the settings (did you mean another file?)")
            if hasattr(os, "set_blocking"):
                os.set_blocking(fd, True)
            chunks, total = [], 0
            while total <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
    except OSError as exc:
        raise InputFileError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if total > limit:
        raise InputFileError(f"{what} {path} grew above the {_size_text(limit)} a {what} may have while it was read")
    return b"".join(chunks)


def _read_pipe(fd, path, what, limit, timeout):
    """``(chunks, total)`` of a non-blocking pipe until its writer closes it, within ``timeout`` seconds.

    A FIFO that no writer has opened yet reads as end-of-file at once, so an end with nothing read is
    waited on (polled) until data or the deadline: a process substitution's writer may start late.
    """
    import select
    import time

    deadline = time.monotonic() + timeout
    chunks, total = [], 0
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while total <= limit:
        left = deadline - time.monotonic()
        if left <= 0:
            got = f"after {_size_text(total)}" if total else "with nothing read"
            raise InputFileError(f"{what} {path} is a pipe that was not closed within {timeout:g} s ({got}): "
                                 "give a TOML file, or a pipe whose writer ends (--config <(cat run.toml))")
        if not poller.poll(max(1, int(min(left, 0.05) * 1000))):
            continue
        try:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        except BlockingIOError:
            continue
        if chunk:
            chunks.append(chunk)
            total += len(chunk)
        elif total:  # the writer closed it
            break
        else:  # no writer yet (or one that wrote nothing): wait for one within the deadline
            time.sleep(0.01)
    return chunks, total


def _size_text(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def memory_limit() -> int | None:
    """Bytes of memory this process may use: physical memory, or its address-space limit
    (``RLIMIT_AS``, ``ulimit -v``) or data limit (``RLIMIT_DATA``) when lower; ``None`` where unknown."""
    found = []
    try:
        found.append(int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES")))
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import resource

        for lim in (resource.RLIMIT_AS, getattr(resource, "RLIMIT_DATA", None)):
            if lim is None:
                continue
            soft = resource.getrlimit(lim)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                found.append(int(soft))
    except (ImportError, ValueError, OSError):
        pass
    return min(found) if found else None


def size_text(n) -> str:
    """Bytes as text (``"1.5 GiB"``); past ``2^70`` as a power of two. Python integers: any size."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 2**70 else f"2^{int(n).bit_length() - 1} bytes"
    return f"{n / 2**10:.1f} KiB"


def over_half_of_memory(need) -> int | None:
    """The memory this process may use (:func:`memory_limit`) when ``need`` bytes exceed half of it, else
    ``None`` (also where the limit is unknown): the one rule of the up-front size refusals."""
    limit = memory_limit()
    return limit if limit is not None and need > limit // 2 else None


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path``; on success ``os.replace`` it into place.

    On any exception the temporary file is removed and ``path`` is untouched. Its removal is armed from
    before the file exists to after the rename (the name is drawn first, then created exclusively): a signal
    between two bytecodes, or the watchdog ending a command stuck in C (a slow ``fsync`` on a busy disk),
    never leaves it behind.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    suffix = os.path.splitext(path)[1]
    mine = []  # the temporary file, once this call owns its name

    def remove():
        for name in mine:
            _unlink_quietly(name)

    with on_emergency(remove):
        try:
            _create_temporary(folder, suffix, mine)
            tmp = mine[0]
            yield tmp
            os.chmod(tmp, _default_mode())
            _fsync_file(tmp)
            os.replace(tmp, path)
            _fsync_dir(folder)
        finally:
            remove()


def _create_temporary(folder, suffix, mine) -> None:
    """Create ``folder/.tmp-<random><suffix>`` exclusively (mode 0600), its name put in ``mine`` first."""
    for _ in range(100):
        name = os.path.join(folder, f".tmp-{secrets.token_hex(8)}{suffix}")
        mine[:] = [name]  # armed before it exists: a signal after the creation still removes it
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return
        except FileExistsError:  # another file's name (2^-64): not ours to remove
            mine.clear()
    raise FileExistsError(errno.EEXIST, f"no free temporary name in {folder}")


def _unlink_quietly(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _fsync_file(path) -> None:
    """Flush ``path``'s data to the disk (so a rename never exposes an empty or partial file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder) -> None:
    """Flush a folder's entries (a rename) to the disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)


def atomic_savez(path, **arrays) -> None:
    """``np.savez`` to ``path`` atomically; SIGINT/SIGTERM wait for the archive to be complete (``deferred``: a
    signal's exception raised inside ``zipfile``'s writer left an open member, and closing the archive then
    raised a ValueError in its place)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh, deferred():
            np.savez(fh, **arrays)


# --------------------------------------------------------------- out folder
class OutputDirError(ValueError):
    """An output folder that cannot be used (named, with the way out); the CLI prints it as one line."""


LOCK_NAME = ".popgrad.lock"
STAGING_PREFIX = ".staging-"


def _describe(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    return exc.strerror or str(exc)


def check_output_dir(path, flag: str = "--out", names=(), folders=()) -> str:
    """Validate an output folder path *without writing anything*; returns it as a ``str``.

    Refuses an empty path, a path whose folder or any parent is a regular
    file, a dangling symbolic link, and a folder (or its first existing
    parent) that is not writable, and a folder standing where one of the
    files ``names`` goes or anything but a folder where one of ``folders`` goes (``touch out/cells``),
    each with an :class:`OutputDirError` naming ``flag``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise OutputDirError(f"{flag} must be a folder path, got {path!r}")
    path = os.fspath(path)
    if not path.strip():
        raise OutputDirError(f"{flag} is empty: give a folder path, e.g. {flag} popgrad_out")
    if os.path.islink(path) and not os.path.exists(path):
        raise OutputDirError(f"{flag} {path} is a dangling symbolic link (to {os.readlink(path)}): "
                             "remove it or choose another folder")
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise OutputDirError(f"{flag} {path} exists and is not a folder: choose another {flag}")
        probe = path
    else:
        probe = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(probe):
            if os.path.islink(probe):
                raise OutputDirError(f"{flag} {path}: {probe} is a dangling symbolic link: choose another {flag}")
            probe = os.path.dirname(probe)
        if not os.path.isdir(probe):
            raise OutputDirError(f"{flag} {path}: {probe} is a file, not a folder: choose another {flag}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputDirError(f"{flag} {path}: {probe} is not writable: choose another {flag}")
    _check_targets(path, names, flag)
    for name in folders:
        target = os.path.join(path, name)
        if os.path.lexists(target) and not os.path.isdir(target):
            raise OutputDirError(f"{flag} {path}: {target} is a file where popgrad keeps its {name}/ folder: "
                                 f"remove it or choose another {flag}")
    return path


def _check_targets(root, names, flag) -> None:
    for name in names:
        target = os.path.join(root, name)
        if os.path.isdir(target):
            raise OutputDirError(f"{flag} {root}: {target} is a folder where popgrad writes its {name}: "
                                 f"remove it or choose another {flag}")


def _process_start(pid: int):
    """The start time of process ``pid`` (clock ticks since boot, Linux ``/proc``), or ``None`` where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    except (OSError, IndexError, ValueError):
        return None


def _pid_alive(pid: int, start=None) -> bool:
    """Process ``pid`` exists (and, when ``start`` is known, is the one that started then: no PID reuse)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    except OSError:
        return False
    if _is_zombie(pid):  # ended (a killed worker not yet reaped by its parent): its lock is stale
        return False
    if start is not None:
        now = _process_start(pid)
        if now is not None and now != start:
            return False  # the PID now belongs to another process
    return True


def _is_zombie(pid: int) -> bool:
    """Whether ``pid`` has ended and waits to be reaped (state ``Z``/``X`` in Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return False


def _owner_tag() -> str:
    """``PID.START`` of this process: what a lock or a staging folder records of its owner."""
    start = _process_start(os.getpid())
    return f"{os.getpid()}" if start is None else f"{os.getpid()}.{start}"


def _parse_owner(tag: str):
    pid, _, start = tag.partition(".")
    try:
        return int(pid), (int(start) if start else None)
    except ValueError:
        return 0, None


class FolderLock:
    """An exclusive lock on a folder (``.popgrad.lock``), shared by ``popgrad run`` and ``popgrad sweep``.

    The lock file holds ``PID START HOST``; a lock is stale (and taken over) when its
    process is gone or its PID now belongs to another process (``START`` differs). A lock
    of another host is never taken over (the folder is on a shared file system).
    """

    def __init__(self, folder, flag: str = "--out"):
        self.folder = os.fspath(folder)
        self.flag = flag
        self.path = os.path.join(self.folder, LOCK_NAME)
        self.locked = False

    def acquire(self) -> None:
        host = platform.node()
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                holder = _read_lock(self.path)
                if holder is not None:
                    pid, start, where = holder
                    mine = pid == os.getpid() and where == host
                    if not mine and (where != host or _pid_alive(pid, start)):
                        at = "" if where == host else f" on {where}"
                        raise OutputDirError(
                            f"{self.flag} {self.folder} is in use by another popgrad run (PID {pid}{at}, lock "
                            f"{self.path}): wait for it to finish or choose another {self.flag}") from None
                try:  # stale: its process is gone
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                continue
            self._emergency = add_emergency(lambda: _unlink_quietly(self.path))
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                start = _process_start(os.getpid())
                fh.write(f"{os.getpid()} {'-' if start is None else start} {host}\n")
            self.locked = True
            return
        raise OutputDirError(f"{self.flag} {self.folder}: cannot take the lock {self.path}: try again")

    def release(self) -> None:
        if self.locked:
            self.locked = False
            try:
                os.unlink(self.path)
            except OSError:
                pass
        remove_emergency(getattr(self, "_emergency", None))

    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False


def _read_lock(path):
    """``(pid, start, host)`` of a lock file; ``None`` for an unreadable or empty one (stale)."""
    try:
        with open(path, encoding="utf-8") as fh:
            parts = fh.read().split()
    except (OSError, ValueError):
        return None
    try:
        pid = int(parts[0])
    except (IndexError, ValueError):
        return None
    start = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    host = parts[2] if len(parts) > 2 else platform.node()
    return pid, start, host


def clear_stale(folder, locked: bool = False) -> None:
    """Remove what killed runs left in ``folder``: staging folders of dead processes, temporary files of
    interrupted atomic writes, and a lock whose process is gone.

    ``locked``: the caller holds the folder's lock (nothing else writes there). Otherwise nothing is
    touched while a live process (or one on another host) holds the lock.
    """
    lock = os.path.join(folder, LOCK_NAME)
    stale_lock = False
    if not locked and os.path.lexists(lock):
        holder = _read_lock(lock)
        if holder is not None and (holder[2] != platform.node() or _pid_alive(holder[0], holder[1])):
            return
        stale_lock = True
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        full = os.path.join(folder, name)
        if name.startswith(STAGING_PREFIX):
            pid, start = _parse_owner(name[len(STAGING_PREFIX):].split("-", 1)[0])
            if not _pid_alive(pid, start):
                shutil.rmtree(full, ignore_errors=True)
        elif name.startswith(".tmp-") and os.path.isfile(full):
            try:
                os.unlink(full)
            except OSError:
                pass
    if stale_lock:
        try:
            os.unlink(lock)
        except OSError:
            pass


class OutputDir:
    """An output folder written as a whole (see the module doc).

    ``outputs`` names every file a run of this kind may produce; those not
    produced by this run are removed at :meth:`commit` (stale outputs of an
    earlier, different run). Use::

        with OutputDir(path, outputs=(...), flag="--out") as od:
            write(od.path("report.json"))     # staged
            ckpt = od.keep("checkpoint.npz")  # in place (atomic writes), survives an interrupt
            od.commit()

    Leaving the context without :meth:`commit` (an error, an interrupt)
    removes the staging folder, and the folder itself when this run created
    it and it is empty; the lock is released in every case.
    """

    def __init__(self, path, outputs=(), flag: str = "--out"):
        self.flag = flag
        self.root = check_output_dir(path, flag, outputs)
        self.outputs = tuple(outputs)
        self.staging = None
        self.created = False
        self._lock = FolderLock(self.root, flag)
        self._staged = set()

    # -- context
    def __enter__(self) -> "OutputDir":
        try:
            if not os.path.isdir(self.root):
                os.makedirs(self.root)
                self.created = True
            # the watchdog's cleanup (popgrad._signals), run after the lock's (newest first): rmdir works then
            self._emergency = add_emergency(self._remove_staging)
            self._lock.acquire()
            clear_stale(self.root, locked=True)  # what runs that were killed left behind
            self.staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{_owner_tag()}-", dir=self.root)
        except OSError as exc:
            self._cleanup()
            raise OutputDirError(f"{self.flag} {self.root}: cannot create the output folder: {_describe(exc)}") from None
        except BaseException:  # the folder is another run's (OutputDirError), an interrupt
            remove_emergency(getattr(self, "_emergency", None))
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        self._cleanup()
        return False

    def _cleanup(self) -> None:
        # Signals would leave a half-removed staging folder: hold SIGINT/SIGTERM meanwhile.
        with deferred():
            remove_emergency(getattr(self, "_emergency", None))
            if self.staging is not None:
                shutil.rmtree(self.staging, ignore_errors=True)
                self.staging = None
            self._lock.release()
            if self.created:
                try:
                    os.rmdir(self.root)  # only when empty
                except OSError:
                    pass

    def _remove_staging(self) -> None:
        """The watchdog's cleanup (another thread, the main one stuck in C code): the staging folder, and
        the folder itself when this run created it and it is empty. The lock has its own."""
        staging = self.staging
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if self.created:
            try:
                os.rmdir(self.root)
            except OSError:
                pass

    # -- files
    def path(self, name: str) -> str:
        """Where to write output ``name``: inside the staging folder until :meth:`commit`."""
        self._staged.add(name)
        return os.path.join(self.staging, name)

    def keep(self, name: str) -> str:
        """A file written in place (atomically, by its writer) that survives an interrupt: the checkpoint."""
        return os.path.join(self.root, name)

    def commit(self) -> None:
        """Remove stale outputs, then move every staged file into place (each rename is atomic)."""
        produced = set(os.listdir(self.staging))
        missing = self._staged - produced
        if missing:
            raise OutputDirError(f"{self.flag} {self.root}: {', '.join(sorted(missing))} were not written")
        _check_targets(self.root, sorted(produced), self.flag)
        with deferred():
            for name in self.outputs:
                target = os.path.join(self.root, name)
                if name not in produced and os.path.lexists(target) and not os.path.isdir(target):
                    os.unlink(target)
            for name in sorted(produced):
                os.replace(os.path.join(self.staging, name), os.path.join(self.root, name))
            _fsync_dir(self.root)
