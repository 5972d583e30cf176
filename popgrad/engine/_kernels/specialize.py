"""The full model's walks compiled for one layout, its sizes as constants (DESIGN §18, "specialized kernels").

The kernels of :mod:`.catformer`, :mod:`.catformer_leaves` and :mod:`.catformer_walk` read every size and
offset of the model from the :class:`~popgrad.engine._kernels.catformer.Layout` ``z`` and the head table
``hinfo`` they are given, at run time: their loops have lengths (``S``, ``T``, ``d_0``, ``d_in``) LLVM cannot
see. :func:`walk_module` writes the three modules' source once more, as one module in which ``z.<field>``
reads the module constant ``Z`` (the layout) and ``hinfo[g, k]`` the constant tuple ``HINFO``; numba
freezes module globals into the compiled code, so the loop lengths and offsets become constants
(unrolled ``S``-loops, fixed-length vector loops). The arithmetic is the same, operation for operation (no
``fastmath``, no reassociation), so the results are bit for bit those of the general kernels
(tests/engine/test_catformer_specialize.py); only the time changes (1.43–1.50× at ``S = 3``, ``T = 10``,
benchmarks/README.md).

The generated file lives in the kernel folder (:func:`kernel_dir`: ``$POPGRAD_KERNEL_DIR``, else
``$XDG_CACHE_HOME/popgrad/kernels`` or ``~/.cache/popgrad/kernels``), named by the layout and a hash of its
text. The text embeds the digest of every kernel module (:func:`popgrad.engine._kernels.cache.kernels_digest`),
so a changed kernel gives a new file and numba compiles it afresh (its on-disk cache sits next to the file,
or under ``NUMBA_CACHE_DIR``): never a stale specialization. Writing a layout's new version removes its
older ones (and their cache files in ``__pycache__``). A layout's first use compiles the walk it runs once per
machine (about 20–35 s each on the 2-core VM), inside that call; later processes load them from numba's cache.

:func:`decide` is the rule the engine applies (``EngineOptions.catformer_specialize``): ``"on"`` always,
``"off"`` never, ``"auto"`` once this process's calls on the layout have spent
``catformer_specialize_seconds`` (default 30) in the general walks (:func:`run` counts them), or when the
layout's module is already loaded: a compile then costs a run at most about as much again as it has spent,
and a one-off gradient never compiles.
"""
from __future__ import annotations

import glob
import hashlib
import importlib
import importlib.util
import os
import re
import secrets
import sys
import threading
import time
import warnings

import numpy as np

__all__ = ["MODES", "kernel_dir", "source", "walk_module", "walks", "run", "count", "decide", "loaded", "spent",
           "reset_counts"]

#: The values of ``EngineOptions.catformer_specialize``.
MODES = ("auto", "on", "off")

#: The modules whose source is specialized, in the order they are written out.
_SOURCES = ("catformer", "catformer_leaves", "catformer_walk")

_LOCK = threading.Lock()
_MODULES: dict = {}  # layout key -> loaded module
_SPENT: dict = {}  # layout key -> wall seconds in the general walks (run)
_WARNED = []


class KernelDirError(OSError):
    """The kernel folder cannot hold a generated module (the message names the folder and the fix)."""


def kernel_dir() -> str:
    """The folder of the generated modules, created if needed.

    ``$POPGRAD_KERNEL_DIR`` when set, else ``$XDG_CACHE_HOME/popgrad/kernels``, else
    ``~/.cache/popgrad/kernels``. Raises :class:`KernelDirError` when it cannot be created or written.
    """
    env = os.environ.get("POPGRAD_KERNEL_DIR")
    if env:
        path, origin = env, "POPGRAD_KERNEL_DIR"
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path, origin = os.path.join(base, "popgrad", "kernels"), "the default kernel folder"
    path = os.path.abspath(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise KernelDirError(f"{origin} {path!r} cannot be created ({exc.strerror or exc}); set POPGRAD_KERNEL_DIR "
                             "to a writable folder") from None
    if not os.access(path, os.W_OK):
        raise KernelDirError(f"{origin} {path!r} is not writable; set POPGRAD_KERNEL_DIR to a writable folder")
    return path


def _layout_key(sizes, hinfo) -> tuple:
    return tuple(int(v) for v in sizes) + tuple(int(v) for v in np.asarray(hinfo).ravel())


def _module_text(name) -> str:
    with open(importlib.import_module(f"{__package__}.{name}").__file__, encoding="utf-8") as fh:
        return fh.read()


def source(sizes, hinfo) -> str:
    """The generated module's text for a layout (``sizes`` a ``Layout``, ``hinfo`` the head table).

    The three kernel modules' source, with ``z.<field>`` → ``Z.<field>`` and ``hinfo[i, k]`` →
    ``HINFO[i][k]`` and their imports of each other dropped (one module), under a header that defines
    ``Z`` and ``HINFO``. Raises ``RuntimeError`` if a kernel reads the layout in a way the rewrite misses.
    """
    from .cache import kernels_digest
    from .catformer import Layout

    z = Layout(*sizes)
    rows = tuple(tuple(int(x) for x in r) for r in np.asarray(hinfo))
    fields = ", ".join(f"{k}=np.{type(v).__name__}({int(v)})" for k, v in z._asdict().items())
    parts = [f'"""popgrad: the full model\'s kernels for one layout, generated by '
             f'popgrad.engine._kernels.specialize (do not edit).\n\nS = {int(z.S)}, T = {int(z.T)}, heads table '
             f'{rows}; kernels digest {kernels_digest()}.\n"""\n',
             "import numpy as np\n",
             "from popgrad.engine._kernels.catformer import Layout as _Layout\n",
             f"Z = _Layout({fields})\n",
             f"HINFO = {rows!r}\n"]
    for name in _SOURCES:
        text = _module_text(name)
        text = re.sub(r"^from \.(catformer|catformer_leaves) import [^\n]*\n", "", text, flags=re.M)
        text = re.sub(r"^from \.(\w+) import", r"from popgrad.engine._kernels.\1 import", text, flags=re.M)
        text = re.sub(r"\bz\.", "Z.", text)
        text = re.sub(r"\bhinfo\[([^,\]\[]+), (\d)\]", r"HINFO[\1][\2]", text)
        code = re.sub(r'"""(?:.|\n)*?"""', "", text)
        left = re.findall(r"\bhinfo\[[^\]]*,|\bz\.\w|^from \.", code, flags=re.M)
        if left:
            raise RuntimeError(f"specialize: {name}.py reads the layout as {left[0]!r}, which the rewrite does not "
                               "cover; extend popgrad.engine._kernels.specialize.source")
        parts.append(f"\n# {'=' * 70} {name}.py\n" + text)
    return "".join(parts)


def _prune(folder, layout, keep):
    """Remove the other versions of one layout's module (older kernels) and their numba cache files."""
    for old in glob.glob(os.path.join(folder, f"{layout}_*.py")):
        stem = os.path.basename(old)[:-3]
        if stem == keep:
            continue
        for path in [old] + glob.glob(os.path.join(folder, "__pycache__", f"{stem}.*")):
            try:
                os.remove(path)
            except OSError:
                pass


def _load(key, sizes, hinfo):
    text = source(sizes, hinfo)
    folder = kernel_dir()
    layout = f"catformer_S{key[1]}_T{key[0]}_{hashlib.sha256(repr(key).encode()).hexdigest()[:8]}"
    stem = f"{layout}_{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    path = os.path.join(folder, stem + ".py")
    if not os.path.exists(path):
        tmp = os.path.join(folder, f".{stem}.{secrets.token_hex(6)}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
        _prune(folder, layout, stem)
    name = f"popgrad_catformer_spec_{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def walk_module(sizes, hinfo):
    """The walk module (``run_blocks``, ``run_rows`` and their ``_serial`` twins, the signatures of
    :mod:`popgrad.engine._kernels.catformer_walk`) specialized for this layout; loaded once per process."""
    key = _layout_key(sizes, hinfo)
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is None:
            mod = _MODULES[key] = _load(key, sizes, hinfo)
    return mod


def walks(job):
    """The walk module that runs a full-model job (:class:`popgrad.engine.catformer.CatFormerJob`): the one
    compiled for its layout when ``job.specialized`` (the same bits), else :mod:`.catformer_walk`.

    A Dask worker runs what its client decided; one whose kernel folder cannot be written runs the
    general walks instead (the same bits), with one warning per process.
    """
    from . import catformer_walk

    if job.specialized:
        try:
            return walk_module(job.sizes, job.hinfo)
        except KernelDirError as exc:
            _warn_general(exc)
    return catformer_walk


def _warn_general(exc) -> None:
    """Once per process: the general kernels run because the kernel folder cannot be used (``exc``)."""
    if not _WARNED:
        _WARNED.append(True)
        warnings.warn(f"the full model runs its general kernels: {exc}", RuntimeWarning, stacklevel=4)


def loaded(sizes, hinfo) -> bool:
    """Whether this layout's specialized module is loaded in this process."""
    return _layout_key(sizes, hinfo) in _MODULES


def run(job, name, parallel, *args):
    """Run walk ``name`` (``"run_blocks"`` or ``"run_rows"``; its ``_serial`` twin unless ``parallel``) of the
    module :func:`walks` picks for ``job``, on ``args``; the wall time of a general walk counts towards the
    layout's :func:`spent`, except that of a call that first compiled the walk (or loaded it from numba's
    cache): ``"auto"`` weighs the time the walks *run* against a specialization's compile, and the first
    call of a fresh install would otherwise count its own compile and specialize at once."""
    fn = getattr(walks(job), name if parallel else name + "_serial")
    if job.specialized:
        return fn(*args)
    compiled = _signatures(fn)
    t0 = time.perf_counter()
    out = fn(*args)
    if _signatures(fn) == compiled:  # a call that first compiled (or loaded) the walk does not count
        count(job, time.perf_counter() - t0)
    return out


def _signatures(fn) -> int:
    """How many signatures the numba dispatcher ``fn`` holds (compiled, or loaded from numba's cache)."""
    return len(getattr(fn, "signatures", ()))


def count(job, seconds) -> None:
    """Add ``seconds`` of general walks on ``job``'s layout to :func:`spent` (nothing for a specialized job).
    :func:`run` counts the walks of this process; the engine counts the wall time of a ``client=`` call
    here too, so that ``"auto"`` also switches a run whose walks all run on Dask workers."""
    if job.specialized:
        return
    key = _layout_key(job.sizes, job.hinfo)
    with _LOCK:
        _SPENT[key] = _SPENT.get(key, 0.0) + float(seconds)


def spent(sizes, hinfo) -> float:
    """Wall seconds this process has spent in the general walks on this layout, its own or waiting for Dask
    workers running them (since :func:`reset_counts`)."""
    return _SPENT.get(_layout_key(sizes, hinfo), 0.0)


def decide(sizes, hinfo, opts) -> bool:
    """Whether a call on this layout runs the specialized walks (``opts.catformer_specialize``).

    ``"on"``: yes (a :class:`KernelDirError` becomes a one-line ``ValueError``); ``"off"``: no; ``"auto"``: when
    the module is loaded already, or when :func:`spent` has reached ``opts.catformer_specialize_seconds``
    (no kernel folder: no, with one warning per process). The bits are the same either way.
    """
    mode = opts.catformer_specialize
    if mode == "off":
        return False
    key = _layout_key(sizes, hinfo)
    if mode == "on":
        try:
            kernel_dir()
        except KernelDirError as exc:
            raise ValueError(f"EngineOptions(catformer_specialize='on'): {exc}") from None
        return True
    with _LOCK:
        if key in _MODULES:
            return True
        if _SPENT.get(key, 0.0) < opts.catformer_specialize_seconds:
            return False
    try:
        kernel_dir()
    except KernelDirError as exc:
        _warn_general(exc)
        return False
    return True


def reset_counts() -> None:
    """Forget the time counted for ``"auto"`` (the loaded modules stay)."""
    with _LOCK:
        _SPENT.clear()
