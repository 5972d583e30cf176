"""Wall times of the Stage-1 field (DESIGN §12), counts method, after JIT warm-up.

Run: ``PYTHONPATH=. python benchmarks/bench_field.py [--quick]``.

Priors are 8 base Dirichlet(α=0.1) draws (``dirichlet_prior(S, 0.1, 8,
seed=0, symmetrize=False)``): a relabeling-closed prior has the field of its
base draws, so this is also the cost for the closure of those draws.
Targets (2 cores): S=10,T=20 chain ≤ 0.1 s; S=10,T=100 chain ≤ 3 s;
S=2,T=1000 chain ≤ 30 s; S=3,T=200 random tree ≤ 30 s.
"""
import argparse
import time

import numpy as np

import popgrad as pg
from popgrad.engine.field import stage1_field
from popgrad import exact_loss_and_grad
from popgrad.task.priors import dirichlet_prior


def _time(fn, repeat=1):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the two largest cases")
    args = ap.parse_args()

    # JIT warm-up (compiles or loads the cache of every kernel)
    for g in (pg.chain(5), pg.random_tree(5, seed=0, root_prob=0.3)):
        t = pg.Task(g, dirichlet_prior(2, 1.0, 1, seed=0, symmetrize=False))
        stage1_field(t, method="counts")
        stage1_field(t, method="enumerate")

    cases = [
        ("chain", 10, 20, 0.1),
        ("chain", 10, 100, 3.0),
        ("chain", 2, 1000, 30.0),
        ("random_tree", 3, 200, 30.0),
        ("random_tree", 10, 20, None),
        ("icl_pairs", 3, 200, None),
    ]
    if args.quick:
        cases = [c for c in cases if c[2] < 200]
    print(f"{'graph':<12} {'S':>3} {'T':>5} {'K':>3} {'counts [s]':>11} {'target [s]':>10}")
    for kind, S, T, target in cases:
        g = {"chain": lambda: pg.chain(T), "random_tree": lambda: pg.random_tree(T, seed=0),
             "icl_pairs": lambda: pg.icl_pairs(T)}[kind]()
        task = pg.Task(g, dirichlet_prior(S, 0.1, 8, seed=0, symmetrize=False))
        t, _ = _time(lambda: stage1_field(task, method="counts"), repeat=3 if T <= 100 else 1)
        tgt = f"{target:.1f}" if target else "-"
        print(f"{kind:<12} {S:>3} {T:>5} {8:>3} {t:>11.4f} {tgt:>10}")

    print()
    print("counts vs enumeration vs one exact_loss_and_grad call (same task)")
    print(f"{'graph':<12} {'S':>3} {'T':>3} {'counts [s]':>11} {'enumerate [s]':>14} {'exact grad [s]':>15} "
          f"{'enum/counts':>12} {'grad/counts':>12}")
    for kind, S, T in [("chain", 3, 12), ("random_tree", 3, 12), ("chain", 2, 20)]:
        g = pg.chain(T) if kind == "chain" else pg.random_tree(T, seed=0)
        task = pg.Task(g, dirichlet_prior(S, 0.1, 8, seed=0, symmetrize=False))
        tc, Mc = _time(lambda: stage1_field(task, method="counts"), repeat=3)
        te, Me = _time(lambda: stage1_field(task, method="enumerate"), repeat=2)
        A1 = np.zeros((T, T))
        A2 = 1e-7 * np.eye(S)
        exact_loss_and_grad(task, A1, A2)  # warm the weight cache
        tg, _ = _time(lambda: exact_loss_and_grad(task, A1, A2), repeat=2)
        print(f"{kind:<12} {S:>3} {T:>3} {tc:>11.4f} {te:>14.4f} {tg:>15.4f} {te / tc:>12.1f} {tg / tc:>12.1f}"
              f"   (max |counts-enum|/max|M| = {np.abs(Mc.M - Me.M).max() / np.abs(Me.M).max():.1e})")


if __name__ == "__main__":
    main()
