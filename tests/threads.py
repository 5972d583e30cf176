"""One helper for the tests that a result does not depend on the thread count."""
from __future__ import annotations

import os
import subprocess
import sys


def stdout_per_thread_count(code: str, counts=("1", "2"), timeout: float = 600) -> list:
    """Run ``python -c code`` once per ``NUMBA_NUM_THREADS`` in ``counts``; the stdout of each run."""
    outs = []
    for n in counts:
        env = {**os.environ, "NUMBA_NUM_THREADS": n}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    return outs
