"""Whether numba's on-disk cache already holds popgrad's kernels (so a run knows it will compile)."""
from __future__ import annotations

import glob
import os

_KERNELS = os.path.dirname(os.path.abspath(__file__))


def kernels_cached() -> bool:
    """True when at least one compiled popgrad kernel (``*.nbi`` index) is in numba's cache folder.

    Cheap (one ``glob``): looks in ``NUMBA_CACHE_DIR`` when set, else in the kernels' ``__pycache__``.
    """
    root = os.environ.get("NUMBA_CACHE_DIR")
    if root:
        return bool(glob.glob(os.path.join(root, "**", "single*.nbi"), recursive=True))
    return bool(glob.glob(os.path.join(_KERNELS, "__pycache__", "single*.nbi")))
