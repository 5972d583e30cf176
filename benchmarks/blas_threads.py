"""Set the thread count of the OpenBLAS that NumPy loaded, at run time (what threadpoolctl does).

The benchmark needs both settings in one run: the machine's peak is measured
with a threaded ``dgemm``, while every other timing runs with one BLAS
thread (OpenBLAS threads left spinning after a threaded call slowed the next
numba parallel call up to 3x on a 2-core machine). ``OPENBLAS_NUM_THREADS``
only works before NumPy is imported, hence this ctypes shim. Uses
``threadpoolctl`` when it is installed; otherwise looks the OpenBLAS library
up in ``/proc/self/maps`` (Linux) and calls its ``*_set_num_threads*``
symbol (plain OpenBLAS, or ``scipy_openblas`` with its ``64_`` suffix).
Without either, :func:`set_blas_threads` returns ``None`` and does nothing.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager

import numpy as np

_NAMES = [
    ("openblas_set_num_threads", "openblas_get_num_threads"),
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
]
_lib = None


def _openblas():
    global _lib
    if _lib is not None:
        return _lib or None
    _lib = False
    np.dot(np.ones((2, 2)), np.ones((2, 2)))  # make sure the BLAS is loaded
    try:
        with open("/proc/self/maps") as fh:
            paths = sorted({line.split()[-1] for line in fh if "openblas" in line.lower() and "/" in line})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _NAMES:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                _lib = (getattr(lib, set_name), getattr(lib, get_name))
                return _lib
    return None


def get_blas_threads():
    """Current OpenBLAS thread count, or ``None`` if unknown."""
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            if info.get("user_api") == "blas":
                return int(info["num_threads"])
    except ImportError:
        pass
    lib = _openblas()
    return int(lib[1]()) if lib else None


def set_blas_threads(n):
    """Set the OpenBLAS thread count; returns the previous count (``None`` if it cannot be set)."""
    try:
        from threadpoolctl import threadpool_limits

        before = get_blas_threads()
        threadpool_limits(limits=int(n), user_api="blas")
        return before
    except ImportError:
        pass
    lib = _openblas()
    if not lib:
        return None
    before = int(lib[1]())
    lib[0](int(n))
    return before


@contextmanager
def blas_threads(n):
    """Context manager: OpenBLAS uses ``n`` threads inside, the previous count after."""
    before = set_blas_threads(n)
    try:
        yield before
    finally:
        if before is not None:
            set_blas_threads(before)
