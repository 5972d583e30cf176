"""popgrad's numba on-disk cache: whether it holds the kernels, and its freshness across modules.

numba keys a cached kernel by the hash of *its own* source file only. A kernel that calls or inlines a
kernel of another module (the walks over the per-row pieces, ``checks`` over ``numeric``) keeps its cached
machine code when only that other module changes: an editable install that pulls a change of
``catformer.py`` alone would run the walk of ``catformer_walk.py`` with the old rows, silently.
:func:`refresh_stale_indexes` closes that hole: it hashes every kernel module together and, when the
digest differs from the one stamped beside a cache folder, removes that folder's popgrad cache indexes
(numba then compiles afresh and rewrites them) and stamps the new digest. ``import popgrad`` runs it (about
1 ms). Not covered: a process started before the change that compiles a kernel after it caches the old code
under the new stamp; a developer who edits kernels while such a process runs clears ``__pycache__``.
"""
from __future__ import annotations

import glob
import hashlib
import importlib
import os
import secrets

_KERNELS = os.path.dirname(os.path.abspath(__file__))

#: Every module that holds ``cache=True`` kernels (a test keeps this list equal to the package's files).
KERNEL_MODULES = (
    "popgrad.checks._kernels",
    "popgrad.engine._kernels.catformer",
    "popgrad.engine._kernels.catformer_hvp",
    "popgrad.engine._kernels.catformer_leaves",
    "popgrad.engine._kernels.catformer_rows",
    "popgrad.engine._kernels.catformer_walk",
    "popgrad.engine._kernels.field",
    "popgrad.engine._kernels.multi",
    "popgrad.engine._kernels.noise",
    "popgrad.engine._kernels.numeric",
    "popgrad.engine._kernels.prefix",
    "popgrad.engine._kernels.ranges",
    "popgrad.engine._kernels.reduced_hvp",
    "popgrad.engine._kernels.single",
    "popgrad.engine._kernels.table",
    "popgrad.engine._kernels.twins",
    "popgrad.engine.floor",
    "popgrad.task._dirichlet_kernels",
    "popgrad.task._weights",
)

#: The stamp's file name in each cache folder.
STAMP = "popgrad-kernels.sha256"


def kernels_cached() -> bool:
    """True when at least one compiled popgrad kernel (``*.nbi`` index) is in numba's cache folder.

    Cheap (one ``glob``): looks in ``NUMBA_CACHE_DIR`` when set, else in the kernels' ``__pycache__``.
    """
    root = os.environ.get("NUMBA_CACHE_DIR")
    if root:
        return bool(glob.glob(os.path.join(root, "**", "single*.nbi"), recursive=True))
    return bool(glob.glob(os.path.join(_KERNELS, "__pycache__", "single*.nbi")))


def kernels_digest(modules=KERNEL_MODULES) -> str:
    """SHA-256 over the kernel modules' names and sources (hex)."""
    h = hashlib.sha256()
    for name in modules:
        with open(importlib.import_module(name).__file__, "rb") as fh:
            data = fh.read()
        h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def cache_indexes(modules=KERNEL_MODULES) -> dict:
    """``{cache folder: [index paths]}`` of every cached kernel of ``modules`` (where numba keeps it)."""
    from numba.core.caching import FunctionCache
    from numba.core.registry import CPUDispatcher

    out: dict = {}
    for name in modules:
        for obj in vars(importlib.import_module(name)).values():
            cache = getattr(obj, "_cache", None) if isinstance(obj, CPUDispatcher) else None
            if isinstance(cache, FunctionCache):
                out.setdefault(cache._cache_path, []).append(cache._cache_file._index_path)
    return out


def refresh_stale_indexes(modules=KERNEL_MODULES) -> list:
    """Remove the cache indexes of ``modules`` in every cache folder whose stamp is not the modules' digest.

    Returns the folders refreshed. Best effort: a folder that cannot be written is left as it is (numba
    itself then caches elsewhere or not at all). Two processes refreshing at once both remove and both
    stamp the same digest; a kernel cached in between is only compiled once more.
    """
    digest = kernels_digest(modules)
    done = []
    for folder, indexes in sorted(cache_indexes(modules).items()):
        stamp = os.path.join(folder, STAMP)
        try:
            with open(stamp) as fh:
                if fh.read().strip() == digest:
                    continue
        except OSError:
            pass
        try:
            if not os.path.isdir(folder):  # nothing cached there yet, so nothing stale: stamp it for later
                os.makedirs(folder, exist_ok=True)
            elif not os.access(folder, os.W_OK):
                continue
            for path in indexes:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
            tmp = os.path.join(folder, f".{STAMP}.{secrets.token_hex(8)}")
            with open(tmp, "w") as fh:
                fh.write(digest + "\n")
            os.replace(tmp, stamp)
        except OSError:
            continue
        done.append(folder)
    return done
