"""The step-cost table of issue 28 (DESIGN §20): one training step for 48 atoms, 3000 atoms and the continuous prior.

    python benchmarks/bench_step_cost.py                          # this tree only
    python benchmarks/bench_step_cost.py --before /tmp/main-tree  # before/after, interleaved (B, A, B, A)

One step is one exact loss-and-gradient evaluation (what a training step costs; the optimizer update is
negligible beside it), full model (``CatFormer(3, 10)``, random tree T = 10, 59,049 sequences) and reduced
model (S = 3, random tree T = 12, 531,441 sequences), for ``dirichlet_prior(3, 0.1, 8, 0)`` (48 atoms),
``dirichlet_prior(3, 0.1, 500, 0)`` (3000 atoms) and ``DirichletPrior(3, 0.1, roots="uniform")``
(continuous; the step does not depend on the roots, the table build does). Each case runs in a fresh task:
the one-off table build is timed first (``task.weight_table()``), then a warm-up step, then the median of
``--repeats`` steps. "rule" is the path ``popgrad.engine.table.use_table`` picks; "per-atom" forces the
per-atom path (finite priors only). CPU time of this process (``time.process_time``) and wall time; with
``--before`` every round runs the before tree, then this tree, in separate processes, and the table shows
the median over rounds. Timings depend on the machine and its load: printed, never asserted.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRIORS = ("48 atoms", "3000 atoms", "continuous")
MODELS = (("full model", 10), ("reduced", 12))


def _prior(pg, name):
    if name == "48 atoms":
        return pg.dirichlet_prior(3, 0.1, 8, 0)
    if name == "3000 atoms":
        return pg.dirichlet_prior(3, 0.1, 500, 0)
    return pg.DirichletPrior(3, 0.1, roots="uniform")


def _timed(f):
    c, t = time.process_time(), time.perf_counter()
    f()
    return time.process_time() - c, time.perf_counter() - t


def measure(repeats=3):
    """Rows ``{model, prior, path, step_cpu, step_wall, build_cpu, build_wall}`` of the popgrad on ``sys.path``."""
    import popgrad as pg
    from popgrad.engine import table as _table
    from popgrad.engine.catformer import catformer_loss_and_grad

    rows = []
    rng = np.random.default_rng(0)
    A1, A2 = rng.normal(size=(12, 12)), rng.normal(size=(3, 3))
    model = pg.CatFormer(3, 10)
    params = model.init(0.5, 0)
    for kind, T in MODELS:
        for name in PRIORS:
            for path in ("rule", "per-atom"):
                if path == "per-atom" and name == "continuous":
                    continue
                task = pg.Task(pg.random_tree(T, 1, 0.5), _prior(pg, name))
                if kind == "full model":
                    def call():
                        return catformer_loss_and_grad(task, model, params)
                else:
                    def call():
                        return pg.exact_loss_and_grad(task, A1[:T, :T], A2)
                saved = _table.TABLE_MIN_ATOMS
                if path == "per-atom":
                    _table.TABLE_MIN_ATOMS = 10**12
                try:
                    build = _timed(task.weight_table) if path == "rule" else (float("nan"), float("nan"))
                    call()  # warm-up: compiles, builds plans and caches
                    ts = [_timed(call) for _ in range(repeats)]
                finally:
                    _table.TABLE_MIN_ATOMS = saved
                rows.append(dict(model=kind, prior=name, path=path, step_cpu=float(np.median([t[0] for t in ts])),
                                 step_wall=float(np.median([t[1] for t in ts])), build_cpu=build[0],
                                 build_wall=build[1]))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _run_tree(root, repeats):
    env = dict(os.environ, PYTHONPATH=root, NUMBA_NUM_THREADS=os.environ.get("NUMBA_NUM_THREADS", "1"))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--json", "--repeats", str(repeats)],
                         env=env, check=True, capture_output=True, text=True, cwd=root)
    return json.loads(out.stdout)


def _fmt(x):
    return "-" if x is None or not np.isfinite(x) else f"{1e3 * x:8.0f}"


def table(results):
    """Markdown table: per case, the median over rounds of each version's CPU (and wall) step time."""
    versions = list(results)
    print("| model | prior | path | " + " | ".join(f"{v} CPU ms (wall)" for v in versions)
          + " | table build CPU s (" + versions[-1] + ") |")
    print("|---|---|---|" + "---|" * len(versions) + "---|")
    keys = [(r["model"], r["prior"], r["path"]) for r in results[versions[-1]][0]]
    for key in keys:
        cells = []
        for v in versions:
            rs = [r for rnd in results[v] for r in rnd if (r["model"], r["prior"], r["path"]) == key]
            if not rs:
                cells.append("-")
                continue
            cells.append(f"{_fmt(np.median([r['step_cpu'] for r in rs]))} ({_fmt(np.median([r['step_wall'] for r in rs]))})")
        rs = [r for rnd in results[versions[-1]] for r in rnd if (r["model"], r["prior"], r["path"]) == key]
        b = np.median([r["build_cpu"] for r in rs])
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells)
              + f" | {'-' if not np.isfinite(b) else f'{b:.2f}'} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a checkout of the code before the change (e.g. a git worktree of main)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="measure the popgrad on sys.path, print JSON rows")
    a = ap.parse_args()
    if a.json:
        print(json.dumps(measure(a.repeats)))
        sys.exit(0)
    if a.before is None:
        table({"this tree": [measure(a.repeats)]})
        sys.exit(0)
    results = {"before": [], "after": []}
    for rnd in range(a.rounds):
        for v, root in (("before", os.path.abspath(a.before)), ("after", HERE)):
            print(f"round {rnd + 1}: {v} ({root})", file=sys.stderr, flush=True)
            results[v].append(_run_tree(root, a.repeats))
    table(results)
