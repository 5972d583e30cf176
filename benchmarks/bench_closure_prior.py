"""A closure-heavy finite prior end to end: time and peak memory (``python benchmarks/bench_closure_prior.py``).

S = 8, T = 4, one base draw: 4,096 sequences and 8! = 40,320 relabelled atoms. Prints, each in its own
process (so each peak RSS is its own): the weight table's build (``task.weight_table()``: the atom-blocked
weight kernels), the OOD check's in-distribution quantile over the 165 million (atom, sequence) pairs
(``popgrad.checks.ood.in_distribution_quantile``, streamed over chunks of atoms), and the whole command
``popgrad run --S 8 --T 4 --atoms 1 --steps1 3 --steps2 3 --no-sweep``. CPU seconds are the figures to
compare on a loaded machine (wall time follows the load).
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

PIECES = {
    "weight table": """
import popgrad as pg
task = pg.Task(pg.chain(4), pg.dirichlet_prior(S=8, alpha=1.0, n_atoms=1, seed=0, floor=0.15))
task.kernel_arrays(); import time; t = time.process_time(); task.weight_table(); print(time.process_time() - t)
""",
    "OOD in-distribution quantile": """
import numpy as np, popgrad as pg
from popgrad.checks.ood import in_distribution_quantile
task = pg.Task(pg.chain(4), pg.dirichlet_prior(S=8, alpha=1.0, n_atoms=1, seed=0, floor=0.15))
task.kernel_arrays(); import time; t = time.process_time()
in_distribution_quantile(task, np.zeros((4, 4)), np.eye(8), 0.99); print(time.process_time() - t)
""",
}


_TAIL = "\nimport resource as _r, sys as _s; print('RSS', _r.getrusage(_r.RUSAGE_SELF).ru_maxrss, file=_s.stderr)"


def _child(code) -> tuple:
    """``(wall s, cpu s, peak RSS MiB, stdout)`` of ``code`` in its own process (its own ``ru_maxrss``)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code + _TAIL], capture_output=True, text=True,
                         env={**os.environ, "NUMBA_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"failed: {out.stderr.strip().splitlines()[-1:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rss = [int(line.split()[1]) for line in out.stderr.splitlines() if line.startswith("RSS ")][-1]
    return wall, cpu, rss / 1024, out.stdout.strip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-run", action="store_true", help="skip the whole popgrad run (the pieces only)")
    a = p.parse_args(argv)
    for name, code in PIECES.items():
        wall, cpu, rss, out = _child(code)
        print(f"{name:30s} {float(out.splitlines()[-1]):8.2f} s CPU in the call; process peak RSS {rss:8.0f} MiB")
    if not a.no_run:
        with tempfile.TemporaryDirectory() as tmp:
            argv = ["run", "--S", "8", "--T", "4", "--atoms", "1", "--steps1", "3", "--steps2", "3", "--no-sweep",
                    "--no-progress", "--out", os.path.join(tmp, "out")]
            wall, cpu, rss, _ = _child(f"from popgrad.app import cli\nassert cli.main({argv!r}) == 0")
        print(f"{'popgrad run (whole command)':30s} {wall:8.1f} s wall, {cpu:8.1f} s CPU; peak RSS {rss:8.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
