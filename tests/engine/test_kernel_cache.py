"""The freshness of numba's on-disk cache across kernel modules (popgrad.engine._kernels.cache).

numba keys a cached kernel by its own file's source only: a kernel whose callee in another module changed
would keep its old machine code. ``refresh_stale_indexes`` (run by ``import popgrad``) removes the cached
indexes when the digest of all kernel modules changes.
"""
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import popgrad
from popgrad.engine._kernels import cache as C

ROOT = pathlib.Path(popgrad.__file__).resolve().parent


def test_kernel_modules_are_every_module_with_cached_kernels():
    found = set()
    for path in ROOT.rglob("*.py"):  # a decorator, the options of kernels compiled from a body, or twins()
        if re.search(r"(njit|dict)\((?:[^()]*,\s*)?cache=True|=\s*twins\(", path.read_text()):
            rel = path.relative_to(ROOT.parent).with_suffix("")
            found.add(".".join(rel.parts))
    assert found == set(C.KERNEL_MODULES)
    cached = {os.path.splitext(os.path.basename(p))[0].split(".")[0] for ps in C.cache_indexes().values() for p in ps}
    assert cached == {m.rsplit(".", 1)[1] for m in C.KERNEL_MODULES} - {"twins"}  # each holds cached dispatchers


def test_import_stamps_every_cache_folder_with_the_digest():
    digest = C.kernels_digest()
    folders = C.cache_indexes()
    assert folders  # the kernel modules' cached functions were found
    for folder in folders:
        if os.access(folder, os.W_OK):
            assert (pathlib.Path(folder) / C.STAMP).read_text().strip() == digest
    assert C.refresh_stale_indexes() == []  # fresh: nothing removed


_CALLEE = """
from numba import njit


@njit(cache=True)
def g(x):
    return x + {inc}
"""

_CALLER = """
from numba import njit

from .kb import g


@njit(cache=True)
def f(x):
    return 2 * g(x)
"""

_RUN = """
import sys
sys.path.insert(0, {root!r})
from popgrad.engine._kernels.cache import refresh_stale_indexes
if {refresh}:
    refresh_stale_indexes(("kpkg.ka", "kpkg.kb"))
from kpkg.ka import f
print(f(1))
"""


def _run(tmp_path, refresh):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}  # the in-tree __pycache__
    code = _RUN.format(root=str(tmp_path), refresh=refresh)
    out = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_a_changed_callee_in_another_module_is_compiled_afresh(tmp_path):
    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "ka.py").write_text(textwrap.dedent(_CALLER))
    (pkg / "kb.py").write_text(_CALLEE.format(inc=1))
    assert _run(tmp_path, True) == 4  # compiled and cached, folder stamped
    index = list((pkg / "__pycache__").glob("ka.f-*.nbi"))
    assert index and (pkg / "__pycache__" / C.STAMP).exists()
    assert _run(tmp_path, True) == 4  # unchanged: loaded from the cache, the index kept
    assert list((pkg / "__pycache__").glob("ka.f-*.nbi")) == index
    (pkg / "kb.py").write_text(_CALLEE.format(inc=2))  # the callee changes, the caller's file does not
    assert _run(tmp_path, True) == 6
