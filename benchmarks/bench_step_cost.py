"""The step-cost table of issue 28 (DESIGN §20): one training step for 48 atoms, 3000 atoms and the continuous prior.

    python benchmarks/bench_step_cost.py                          # this tree only
    python benchmarks/bench_step_cost.py --before /tmp/main-tree --out runs.jsonl  # before/after, interleaved
    python benchmarks/bench_step_cost.py --table runs.jsonl       # the table of the runs finished so far
    python benchmarks/bench_step_cost.py --interleaved            # the three priors' steps, interleaved

One step is one exact loss-and-gradient evaluation (what a training step costs; the optimizer update is
negligible beside it), full model (``CatFormer(3, 10)``, random tree T = 10, 59,049 sequences; at random
parameters and at zero, where the orbit reduction applies: per atom for the finite priors, on the table with
orbit-summed weights for the continuous one, whose "table build" then includes the orbit table) and reduced
model (S = 3, random tree T = 12, 531,441 sequences), for ``dirichlet_prior(3, 0.1, 8, 0)`` (48 atoms),
``dirichlet_prior(3, 0.1, 500, 0)`` (3000 atoms) and ``DirichletPrior(3, 0.1, roots="uniform")``
(continuous; the step does not depend on the roots, the table build does). Per case, each on a fresh task:
"per-atom" forces the per-atom path (finite priors only): a warm-up step, then the median of ``--repeats``
steps; "one-off gradient" times the first gradient of a fresh task (what a single call costs, whatever the
rule builds for it); "rule" is a training run: the table asked for up front (``prepare_table``; before it
existed, ``task.weight_table()``), timed as "table build", then a warm-up step and the median of ``--repeats``
steps on the path ``popgrad.engine.table.use_table`` picks. The full model runs its general kernels
(``--specialize off``, the default, as this table's history); ``--specialize on`` the walks compiled for its
layout (``EngineOptions.catformer_specialize``; a training run's after its first 30 s). CPU time of this process (``time.process_time``) and wall time; with
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
MODELS = (("full model", 10), ("full model, zero start", 10), ("reduced", 12))


def _prior(pg, name):
    if name == "48 atoms":
        return pg.dirichlet_prior(3, 0.1, 8, 0)
    if name == "3000 atoms":
        return pg.dirichlet_prior(3, 0.1, 500, 0)
    return pg.DirichletPrior(3, 0.1, roots="uniform")


def _row(kind, name, path, ts, build=(float("nan"),) * 2, oneoff=(float("nan"),) * 2):
    row = dict(model=kind, prior=name, path=path, step_cpu=float(np.median([t[0] for t in ts])),
               step_wall=float(np.median([t[1] for t in ts])), build_cpu=build[0], build_wall=build[1],
               oneoff_cpu=oneoff[0], oneoff_wall=oneoff[1])
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def _options(pg):
    """The full model's engine options: ``catformer_specialize`` from ``$POPGRAD_BENCH_SPECIALIZE`` (set by
    ``--specialize``; passed on to the ``--before`` processes), ``None`` for a tree without the option."""
    if "catformer_specialize" not in getattr(pg.EngineOptions, "__dataclass_fields__", {}):
        return None
    return pg.EngineOptions(catformer_specialize=os.environ.get("POPGRAD_BENCH_SPECIALIZE", "off"))


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
    zero = model.zeros()  # equivariant: the orbit reduction (DESIGN §21), on the table for the continuous prior
    opts = _options(pg)
    orbit = getattr(__import__("popgrad.engine.catformer_symmetry", fromlist=["x"]), "orbit_table", None)
    prepare = getattr(_table, "prepare_table", None)  # absent before issue 28's rule: the table was built on demand
    for kind, T in MODELS:
        for name in PRIORS:
            def make():
                task = pg.Task(pg.random_tree(T, 1, 0.5), _prior(pg, name))
                if kind.startswith("full model"):
                    p = zero if kind.endswith("zero start") else params
                    return task, lambda: catformer_loss_and_grad(task, model, p, options=opts)
                return task, lambda: pg.exact_loss_and_grad(task, A1[:T, :T], A2)

            if name != "continuous":  # the per-atom path, forced
                task, call = make()
                saved = _table.TABLE_MIN_ATOMS
                _table.TABLE_MIN_ATOMS = 10**12
                try:
                    call()  # warm-up: compiles, builds plans and caches
                    ts = [_timed(call) for _ in range(repeats)]
                finally:
                    _table.TABLE_MIN_ATOMS = saved
                rows.append(_row(kind, name, "per-atom", ts))
            pg.clear_caches()  # the engines' plans and leaf weights are per fingerprint: start cold
            task, call = make()  # a one-off gradient on a fresh task: whatever the rule builds for it
            oneoff = _timed(call)
            pg.clear_caches()
            task, call = make()  # a training run: the table asked for up front (prepare_table), then the steps
            build = _timed(lambda: (prepare(task) if prepare is not None else task.weight_table(),
                                    orbit is not None and kind.endswith("zero start") and task.continuous
                                    and orbit(task)))
            call()
            ts = [_timed(call) for _ in range(repeats)]
            rows.append(_row(kind, name, "rule", ts, build, oneoff))
    return rows


def interleaved(rounds=15):
    """The training step of the three priors in one process, calls interleaved (48, 3000, continuous, 48, …),
    each task's table prepared as a trainer does (the path the rule then picks): median and quartiles of the CPU
    time (load drifts hit the three alike)."""
    import popgrad as pg
    from popgrad.engine import table as _table
    from popgrad.engine.catformer import catformer_loss_and_grad

    rng = np.random.default_rng(0)
    A1, A2 = rng.normal(size=(12, 12)), rng.normal(size=(3, 3))
    model = pg.CatFormer(3, 10)
    params = model.init(0.5, 0)
    zero = model.zeros()  # equivariant: the orbit reduction (DESIGN §21), on the table for the continuous prior
    opts = _options(pg)
    print("| model | " + " | ".join(f"{n}: CPU ms (q25–q75)" for n in PRIORS) + " |")
    print("|---|" + "---|" * len(PRIORS))
    for kind, T in MODELS:
        calls = {}
        for name in PRIORS:
            task = pg.Task(pg.random_tree(T, 1, 0.5), _prior(pg, name))
            if hasattr(_table, "prepare_table"):
                _table.prepare_table(task)
            else:  # before issue 28's rule: a finite prior read the table from 64 atoms on, built on demand
                task.weight_table()
            p = zero if kind.endswith("zero start") else params
            calls[name] = ((lambda task=task, p=p: catformer_loss_and_grad(task, model, p, options=opts))
                           if kind.startswith("full model")
                           else (lambda task=task: pg.exact_loss_and_grad(task, A1[:T, :T], A2)))
            calls[name]()
        ts = {n: [] for n in calls}
        for _ in range(rounds if kind.startswith("full model") else 3 * rounds):
            for n, f in calls.items():
                ts[n].append(_timed(f)[0])
        print(f"| {kind} | " + " | ".join(f"{1e3 * np.median(v):.0f} ({1e3 * np.quantile(v, 0.25):.0f}–"
                                          f"{1e3 * np.quantile(v, 0.75):.0f})" for v in ts.values()) + " |", flush=True)


def _run_tree(root, repeats):
    env = dict(os.environ, PYTHONPATH=root, NUMBA_NUM_THREADS=os.environ.get("NUMBA_NUM_THREADS", "1"))
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--json", "--repeats", str(repeats)],
                         env=env, check=True, capture_output=True, text=True, cwd=root)
    return json.loads(out.stdout)


def _fmt(x):
    return "-" if x is None or not np.isfinite(x) else f"{1e3 * x:.0f}"


def table(results):
    """Markdown table: per case, the median over rounds of each version's CPU (wall) times."""
    versions = list(results)

    def med(v, key, field):
        rs = [r for rnd in results[v] for r in rnd if (r["model"], r["prior"], r["path"]) == key]
        return float(np.median([r[field] for r in rs])) if rs else float("nan")

    print("| model | prior | path | " + " | ".join(f"step, {v}: CPU ms (wall)" for v in versions)
          + " | " + " | ".join(f"one-off gradient, {v}: CPU ms" for v in versions)
          + " | " + " | ".join(f"table build, {v}: CPU ms" for v in versions) + " |")
    print("|---|---|---|" + "---|" * (3 * len(versions)))
    for key in [(r["model"], r["prior"], r["path"]) for r in results[versions[-1]][0]]:
        steps = [f"{_fmt(med(v, key, 'step_cpu'))} ({_fmt(med(v, key, 'step_wall'))})" for v in versions]
        once = [_fmt(med(v, key, "oneoff_cpu")) for v in versions]
        build = [_fmt(med(v, key, "build_cpu")) for v in versions]
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(steps + once + build) + " |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a checkout of the code before the change (e.g. a git worktree of main)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="measure the popgrad on sys.path, print JSON rows")
    ap.add_argument("--out", help="with --before: append every finished run to this JSON-lines file")
    ap.add_argument("--table", help="print the table of a JSON-lines file written by --out, and exit")
    ap.add_argument("--interleaved", action="store_true",
                    help="the three priors' training steps interleaved in one process (with --before: per tree, "
                         "the trees alternating)")
    ap.add_argument("--specialize", choices=("off", "on"), default="off",
                    help="the full model's walks compiled for its layout (default off: the general kernels)")
    a = ap.parse_args()
    os.environ["POPGRAD_BENCH_SPECIALIZE"] = a.specialize
    if a.interleaved:
        if a.before is None:
            interleaved()
        else:  # before, after, before, after: one process each
            for rnd in range(a.rounds):
                for v, root in (("before", os.path.abspath(a.before)), ("after", HERE)):
                    env = dict(os.environ, PYTHONPATH=root, NUMBA_NUM_THREADS=os.environ.get("NUMBA_NUM_THREADS", "1"))
                    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--interleaved"], env=env,
                                         check=True, capture_output=True, text=True, cwd=root).stdout
                    print(f"round {rnd + 1}, {v}:\n{out}", flush=True)
        sys.exit(0)
    if a.table:
        saved = {"before": [], "after": []}
        with open(a.table) as f:
            for line in f:
                r = json.loads(line)
                saved[r["version"]].append(r["rows"])
        table({v: rs for v, rs in saved.items() if rs})
        sys.exit(0)
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
            if a.out:  # every finished run, kept (a long comparison can be read before it ends: --table)
                with open(a.out, "a") as f:
                    f.write(json.dumps({"version": v, "round": rnd + 1, "rows": results[v][-1]}) + "\n")
    table(results)
