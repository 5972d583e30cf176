"""The tables of docs/gradient_alignment.md "Where the hypotheses hold" (issue 17), recomputed.

1. Roots: the in-context roots' first-order drive relative to non-roots, ICL with S = 2:
   median over in-context roots of ``(i+1)·‖J(P_i) S M_i‖`` at ``A1 = 0`` over the same median
   over non-root context rows, for three priors and T = 10 … 320.
2. Rate: local exponent of the alignment distance ``‖J(S·M - g)‖ / ‖J g‖`` (chain, S = 2) over
   T_eff 300–1000 and 1000–2000, for four priors.

    PYTHONPATH=. NUMBA_NUM_THREADS=1 python benchmarks/verdict_tables.py [--roots] [--rate] [--top 2000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import popgrad as pg
from popgrad.checks import alignment_rate_sweep, fit_power_law, root_drive_ratio


def priors():
    pair = pg.FinitePrior(np.array([[[.8, .2], [.2, .8]], [[.2, .8], [.8, .2]]]))
    return {
        "uniform-mean pair [[.8,.2],[.2,.8]] + swap": pair,
        "dirichlet_prior(2, 1.0, 8, seed=0, uniform_mean=True)": pg.dirichlet_prior(2, 1.0, 8, seed=0,
                                                                                   uniform_mean=True),
        "dirichlet_prior(2, 1.0, 8, seed=0) (old default)": pg.dirichlet_prior(2, 1.0, 8, seed=0),
        "sticky closure of [[.8,.2],[.3,.7]]": pg.FinitePrior.relabeling_closure(np.array([[.8, .2], [.3, .7]])),
    }


def roots_table(Ts=(10, 20, 40, 80, 160, 320)):
    ps = priors()
    print("| prior | γ | uniform-mean error | " + " | ".join(f"T = {T}" for T in Ts) + " |")
    print("|---|---|---|" + "---|" * len(Ts))
    for name in (list(ps)[0], list(ps)[1], list(ps)[3]):
        prior = ps[name]
        dg = prior.diagnostics()
        r = [root_drive_ratio(pg.Task(pg.icl_pairs(T), prior)) for T in Ts]
        print(f"| {name} | {dg.gamma:.3g} | {dg.uniform_mean_error:.3g} | " + " | ".join(f"{x:.3g}" for x in r) + " |",
              flush=True)


def rate_table(top=2000):
    Ts = [100, 200, 300, 500, 700, 1000, 1400, 2000]
    Ts = [T for T in Ts if T <= top]
    print("| prior | γ | uniform-mean error | T_eff 100–1000 | 300–1000 | 1000–2000 | distances |")
    print("|---|---|---|---|---|---|---|")
    for name, prior in priors().items():
        t0 = time.perf_counter()
        sw = alignment_rate_sweep(pg.chain, prior, Ts)
        te, d = np.asarray(sw["t_eff"]), np.asarray(sw["distance"])

        def b(lo, hi):
            k = (te >= lo) & (te <= hi)
            return fit_power_law(te[k], d[k]).exponent if k.sum() >= 2 else float("nan")

        dg = prior.diagnostics()
        print(f"| {name} | {dg.gamma:.3g} | {dg.uniform_mean_error:.3g} | {b(100, 1000):.3f} | {b(300, 1000):.3f} "
              f"| {b(1000, 2000):.3f} | " + ", ".join(f"{x:.4g}" for x in d) + f" | ({time.perf_counter() - t0:.0f} s)",
              flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--roots", action="store_true")
    ap.add_argument("--rate", action="store_true")
    ap.add_argument("--top", type=int, default=2000)
    a = ap.parse_args()
    if a.roots or not a.rate:
        roots_table()
    if a.rate or not a.roots:
        rate_table(a.top)
