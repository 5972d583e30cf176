"""Parallel and serial kernels compiled from one body, and the one rule that picks between them.

numba's on-disk cache keys a function by its module and qualified name (and its
signature), not by the ``parallel`` option: two dispatchers of the same Python
function with and without ``parallel=True`` would overwrite each other's cache
entries. :func:`twins` therefore compiles ``body`` as is with ``parallel=True``
and a *copy* of it, renamed ``<name>_serial``, without; ``prange`` in the serial
copy is a plain ``range``. Both run the same blocks into the same slots, so they
give the same bits (the slots are added in block order by the caller).

:func:`use_parallel` is the one rule every engine applies: the thread pool is
worth waking only with more than one block, at least
``EngineOptions.parallel_min_sequences`` sequences of work and more than one
numba thread.
"""
from __future__ import annotations

import types

import numba
from numba import njit

__all__ = ["twins", "use_parallel"]


def twins(body, **flags):
    """``(parallel, serial)`` dispatchers of ``body`` (``cache=True``, ``error_model="numpy"`` and ``flags``).

    The serial one is compiled from a copy of ``body`` named ``body.__name__ + "_serial"`` (its own cache
    entry); both keep ``body``'s docstring.
    """
    opts = dict(cache=True, error_model="numpy")
    opts.update(flags)
    name = body.__name__.lstrip("_").removesuffix("_body") if body.__name__.endswith("_body") else body.__name__
    par = types.FunctionType(body.__code__.replace(co_name=name), body.__globals__, name, body.__defaults__,
                             body.__closure__)
    ser = types.FunctionType(body.__code__.replace(co_name=name + "_serial"), body.__globals__, name + "_serial",
                             body.__defaults__, body.__closure__)
    for f, n in ((par, name), (ser, name + "_serial")):
        f.__qualname__ = n
        f.__module__ = body.__module__
        f.__doc__ = body.__doc__
    return njit(parallel=True, **opts)(par), njit(**opts)(ser)


def use_parallel(n_blocks, n_sequences, opts) -> bool:
    """The parallel twin runs when there is more than one block, at least ``opts.parallel_min_sequences``
    sequences of work and more than one numba thread; else the serial twin (same blocks, same bits)."""
    return bool(n_blocks > 1 and n_sequences >= opts.parallel_min_sequences and numba.get_num_threads() > 1)
