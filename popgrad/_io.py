"""Atomic file output: every file popgrad writes appears whole or not at all."""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager

import numpy as np

__all__ = ["atomic_path", "atomic_write_text", "atomic_savez"]


def _default_mode() -> int:
    """``0o666`` minus the process umask: what ``open()`` would give a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside ``path``; on success ``os.replace`` it into place.

    On any exception the temporary file is removed and ``path`` is untouched.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)


def atomic_savez(path, **arrays) -> None:
    """``np.savez`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
