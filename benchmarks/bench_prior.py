"""Step cost of the weight table (DESIGN §20) and the official ``bayes`` root quirk, measured.

    python benchmarks/bench_prior.py            # both parts (a few minutes on one core)
    python benchmarks/bench_prior.py --steps    # the step-cost table only
    python benchmarks/bench_prior.py --quirk    # the InContextTree.bayes quirk only

Step cost: ``benchmarks/bench_step_cost.py`` (one training step and the one-off table build, full model
S = 3, T = 10 and reduced S = 3, T = 12, for 48 atoms, 3000 atoms and the continuous prior, CPU time;
``--steps`` here runs it on this tree, ``bench_step_cost.py --before TREE`` interleaves before and after).

Quirk: the official ``InContextTree.bayes`` counts every root as a child of position T-2 when that token
equals the query (``seq[dag]`` with -1). Cross entropy of the soft label against the estimator with and
without the quirk, on sampled sequences of the official process (DirichletPrior(S, 0.1), stationary roots),
S = 3 and 10, T = 20, the chain and official random graphs; mean and standard error of the paired difference.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import popgrad as pg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def steps(repeats=3):
    """The step-cost table of this tree (``benchmarks/bench_step_cost.py``; ``--before`` there for before/after)."""
    import bench_step_cost

    rows = bench_step_cost.measure(repeats)
    bench_step_cost.table({"this tree": [rows]})
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
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    both = not (a.steps or a.quirk)
    if a.quirk or both:
        quirk()
    if a.steps or both:
        steps(a.repeats)
