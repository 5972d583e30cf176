"""Compare two ``popgrad run`` output folders: report.json equal (timings, paths, versions aside) and
trajectory.npz bit-identical.

    python tests/app/compare_runs.py BEFORE_DIR AFTER_DIR [BEFORE_DIR2 AFTER_DIR2 ...]

Exit status 0 when every pair is equal; each difference is printed as one line. Used for the
refactor of issue 26 (the baselines of commit 2f61364 against the refactored code) and by
tests/app/test_kinds.py.
"""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

#: Report entries that differ between two runs of the same settings: wall-clock times (every key ending in
#: ``_seconds``, e.g. ``timing_seconds``, a check's ``sweep_seconds``), where the output went, the software
#: and machine.
IGNORED = {("versions",), ("config", "out")}


def _ignored(path) -> bool:
    return path in IGNORED or (bool(path) and str(path[-1]).endswith("_seconds"))


def _diff(a, b, path=()):
    if _ignored(path):
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if _ignored((*path, k)):
                continue
            if k not in a or k not in b:
                out.append(f"{'/'.join(map(str, (*path, k)))}: only in {'after' if k not in a else 'before'}")
            else:
                out += _diff(a[k], b[k], (*path, k))
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{'/'.join(map(str, path))}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, (*path, i))]
    same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return [] if same and type(a) is type(b) else [f"{'/'.join(map(str, path))}: {a!r} != {b!r}"]


def report_differences(before: dict, after: dict) -> list:
    """Every difference between two report dicts (exact equality; NaN equals NaN), ignoring :data:`IGNORED`."""
    return _diff(before, after)


def trajectory_differences(before_path, after_path) -> list:
    """Every array of two trajectory.npz files that is not bit-identical (same keys, dtypes, shapes, bytes)."""
    with np.load(before_path, allow_pickle=False) as a, np.load(after_path, allow_pickle=False) as b:
        out = [f"{k}: only in {'after' if k not in a.files else 'before'}" for k in sorted(set(a.files) ^ set(b.files))]
        for k in sorted(set(a.files) & set(b.files)):
            x, y = a[k], b[k]
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                out.append(f"{k}: not bit-identical ({x.dtype}{x.shape} vs {y.dtype}{y.shape})")
        return out


def compare_folders(before: str, after: str) -> list:
    """Differences between two output folders' report.json and trajectory.npz."""
    with open(os.path.join(before, "report.json")) as fa, open(os.path.join(after, "report.json")) as fb:
        diffs = ["report.json " + d for d in report_differences(json.load(fa), json.load(fb))]
    return diffs + ["trajectory.npz " + d for d in trajectory_differences(os.path.join(before, "trajectory.npz"),
                                                                        os.path.join(after, "trajectory.npz"))]


def main(argv) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    bad = 0
    for before, after in zip(argv[::2], argv[1::2]):
        diffs = compare_folders(before, after)
        print(f"{before} vs {after}: " + ("equal (report.json, timings/paths/versions aside; trajectory.npz "
                                          "bit-identical)" if not diffs else f"{len(diffs)} differences"))
        for d in diffs:
            print("  " + d)
        bad += bool(diffs)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
