"""Numba kernels of the exact engine (numba only; the NumPy references live in :mod:`popgrad.engine.reference`).

* :mod:`.numeric` -- ``fast_log`` and the bit-pattern intrinsics;
* :mod:`.single` -- the single-parent engines (prefix, direct, rows);
* :mod:`.multi` -- the k-head engine.
"""
