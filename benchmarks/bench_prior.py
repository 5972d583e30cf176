"""Step cost of the weight table (DESIGN §20) and the official ``bayes`` root quirk, measured.

    python benchmarks/bench_prior.py            # both parts (a few minutes on one core)
    python benchmarks/bench_prior.py --steps    # the step-cost table only
    python benchmarks/bench_prior.py --quirk    # the InContextTree.bayes quirk only

Step cost: one exact loss-and-gradient evaluation (median of ``--repeats`` after a warm-up call that
also builds the table), full model (CatFormer, S = 3, T = 10) and reduced model (S = 3, T = 12), for a
finite prior of 48 atoms (8 draws x 3!), of 3000 atoms (500 draws x 3!) and the continuous prior.
"before" is the per-atom path (what every call paid before the table), "after" the path the one rule
picks (popgrad.engine.table.use_table); the continuous prior has no per-atom path. The one-off table
build is timed separately. Timings depend on the machine: they are printed, never asserted.

Quirk: the official ``InContextTree.bayes`` counts every root as a child of position T-2 when that token
equals the query (``seq[dag]`` with -1). Cross entropy of the soft label against the estimator with and
without the quirk, on sampled sequences of the official process (DirichletPrior(S, 0.1), stationary roots),
S = 3 and 10, T = 20, the chain and official random graphs; mean and standard error of the paired difference.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import popgrad as pg
from popgrad.engine import table as _table
from popgrad.engine.catformer import catformer_loss_and_grad


def _median_time(f, repeats):
    f()  # warm-up: compiles, builds plans and the table
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def steps(repeats=5):
    rows = []
    priors = [("48 atoms", pg.dirichlet_prior(3, 0.1, 8, 0)), ("3000 atoms", pg.dirichlet_prior(3, 0.1, 500, 0)),
              ("continuous", pg.DirichletPrior(3, 0.1, roots="uniform"))]
    rng = np.random.default_rng(0)
    model = pg.CatFormer(3, 10)
    params = model.init(0.5, 0)
    A1, A2 = rng.normal(size=(12, 12)), rng.normal(size=(3, 3))
    for name, prior in priors:
        for kind, T in (("full model", 10), ("reduced", 12)):
            task = pg.Task(pg.random_tree(T, 1, 0.5), prior)
            if kind == "full model":
                def call():
                    return catformer_loss_and_grad(task, model, params)
            else:
                def call():
                    return pg.exact_loss_and_grad(task, A1[:T, :T], A2)
            t0 = time.perf_counter()
            if task.continuous or kind == "full model":
                task.weight_table()
            build = time.perf_counter() - t0
            after = _median_time(call, repeats)
            before = None
            if not task.continuous:
                saved = _table.TABLE_MIN_ATOMS
                _table.TABLE_MIN_ATOMS = 10**12
                try:
                    before = _median_time(call, repeats)
                finally:
                    _table.TABLE_MIN_ATOMS = saved
            rows.append((kind, name, before, after, build))
            print(f"{kind:10s} {name:11s} before {'-' if before is None else f'{1e3 * before:9.2f} ms'}  "
                  f"after {1e3 * after:9.2f} ms  (table build {build:.2f} s)", flush=True)
    return rows


def quirk(n=20_000, graphs=4, seed=0):
    out = []
    for S in (3, 10):
        prior = pg.DirichletPrior(S, 0.1)
        cases = [("chain", pg.chain(20))] + [(f"official-random {g}", pg.official_random_tree(20, g))
                                             for g in range(graphs)]
        for name, graph in cases:
            task = pg.Task(graph, prior)
            smp = task.sample(n, seed)
            y = smp.targets
            ce = {}
            for q in (False, True):
                f = pg.official_bayes_predict(graph, smp.seqs, S, 0.1, root_quirk=q)
                ce[q] = -np.sum(np.where(y > 0, y * np.log(f), 0.0), axis=1)
            d = ce[True] - ce[False]
            roots = int(np.sum(graph.parents[:-1] < 0))
            row = (S, name, roots, ce[False].mean(), ce[False].std(ddof=1) / np.sqrt(n), d.mean(),
                   d.std(ddof=1) / np.sqrt(n))
            out.append(row)
            print(f"S={S:2d} {name:18s} roots={roots:2d}  official bayes (edges) {row[3]:.4f} ± {row[4]:.4f}  "
                  f"quirk - edges {row[5]:+.4f} ± {row[6]:.4f}", flush=True)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--quirk", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    both = not (a.steps or a.quirk)
    if a.quirk or both:
        quirk()
    if a.steps or both:
        steps(a.repeats)
