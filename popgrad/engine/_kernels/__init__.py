"""Numba kernels of the exact engine (numba only; the NumPy references live in :mod:`popgrad.engine.reference`).

* :mod:`.numeric` -- ``fast_log`` and the bit-pattern intrinsics;
* :mod:`.prefix` -- the prefix engine (the default single-parent engine);
* :mod:`.single` -- the direct engine, the rows kernels and the per-call helpers;
* :mod:`.multi` -- the k-head engine.
"""
