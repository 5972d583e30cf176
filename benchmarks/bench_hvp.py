"""Exact Hessian-vector products (engine.hvp, DESIGN §22): seconds per product against one exact gradient.

The product is one complex-step gradient in vectorised NumPy; the gradient is the numba trie engine.
Prints the figures; no timing assertions. Run: ``PYTHONPATH=. NUMBA_NUM_THREADS=1 python benchmarks/bench_hvp.py``.
"""
import time

import numpy as np

import popgrad as pg


def best_of(fn, n=3):
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main():
    print("| S | T | heads | parameters | exact gradient (numba) s | HVP (complex step, NumPy) s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for S, T in [(2, 6), (2, 8), (2, 10), (3, 6), (3, 7)]:
        task = pg.MultiParentTask(pg.two_parent(T), pg.dirichlet_tensor_prior(S, 2, 0.1, 16, seed=0,
                                                                              symmetrize="full"))
        model = pg.CatFormer(S, T, heads=(2, 1))
        p, v = model.init(0.1, 0), model.init(1.0, 1)
        pg.catformer_loss_and_grad(task, model, p)
        g = best_of(lambda: pg.catformer_loss_and_grad(task, model, p))
        h = best_of(lambda: pg.catformer_hvp(task, model, p, v))
        n = sum(a.size for a in p.A) + p.W.size
        print(f"| {S} | {T} | (2, 1) | {n} | {g:.4f} | {h:.4f} | {h / g:.0f} |", flush=True)


if __name__ == "__main__":
    main()
