"""Cold and warm start of ``popgrad run`` (the ``make demo`` job), issue 13 family 11.

Runs the default job twice with a fresh, empty ``NUMBA_CACHE_DIR`` (cold: numba compiles and
caches the kernels), then once more with the same cache (warm). Prints wall times in seconds.
Usage: ``PYTHONPATH=. python benchmarks/cold_start.py [extra popgrad run flags]``.
"""
import os
import subprocess
import sys
import tempfile
import time


def timed(args, env):
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "popgrad.app.cli", "run", "--no-progress", *args], env=env,
                       capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode not in (0, 3):
        sys.exit(r.stderr)
    return dt, "compiling kernels" in r.stdout


def main():
    extra = sys.argv[1:]
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        args = ["--out", out, *extra]
        cold, said_cold = timed(args, env)
        warm, said_warm = timed(args, env)
    print(f"cold: {cold:.1f} s (message printed: {said_cold})")
    print(f"warm: {warm:.1f} s (message printed: {said_warm})")


if __name__ == "__main__":
    main()
