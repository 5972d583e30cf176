"""The reach of the full model's exact gradient (issue 29; not a test): the largest ``T`` per case whose one
exact gradient takes at most ``--budget`` CPU seconds (default 1 s) on one numba thread.

Cases: ``S = 2, 3, 4``; heads ``(1, 1)`` and ``(2, 1)``; *general* parameters (``model.init(0.1, 0)`` and
a random ``W`` of scale 0.1: the full trie engine) and *equivariant* parameters (the same, projected onto
the relabeling-equivariant subspace with ``Sym``: the orbit reduction of DESIGN §21, what a zero-start
trajectory runs). Task: ``pg.chain(T)`` with the relabeling-closed ``dirichlet_prior(S, 1.0, 8, seed=0,
symmetrize=True)`` (as benchmarks/bench_catformer.py). Times are process CPU time (one thread), the
median of ``--repeats`` calls after a warm-up; ``T`` grows from 3 until a call exceeds the budget.
``--specialize on`` (the default) times the walks compiled for each layout
(``EngineOptions.catformer_specialize``, the same bits; what a training run gets after its first 30 s) once
the general kernels take more than a tenth of the budget (below, every ``T`` would compile a layout of its
own for nothing); ``off`` the general kernels only.

Usage::

    NUMBA_NUM_THREADS=1 python benchmarks/bench_reach.py [--budget 1] [--repeats 3] [--S 2 3 4]
                                                         [--heads 1,1 2,1] [--specialize on|off] [--T-from 3]
"""
from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import popgrad as pg  # noqa: E402
from popgrad.engine import catformer_symmetry as Y  # noqa: E402


def make_case(S, T, heads, equivariant, seed=0):
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 8, seed, symmetrize=True), max_sequences=10**10)
    model = pg.CatFormer(S, T, heads=heads)
    p = model.init(0.1, seed)
    W = 0.1 * np.random.default_rng(seed).standard_normal(p.W.shape)
    params = pg.CatFormerParams(p.A, W)
    if equivariant:
        A, W = Y.symmetrize_params(model, p.A, W)
        params = pg.CatFormerParams(A, W)
    return task, model, params


def cpu_time(fn, repeats):
    cs = []
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        cs.append(time.process_time() - c0)
    return statistics.median(cs)


GENERAL = pg.EngineOptions(catformer_specialize="off")
SPECIALIZED = pg.EngineOptions(catformer_specialize="on")


def reach(S, heads, equivariant, budget, repeats, specialize=True, t_from=3, t_max=40):
    """``(T, seconds at T, seconds at T+1)``: the largest ``T`` within the budget."""
    best = (None, float("nan"))
    mode = "on" if equivariant else "off"
    opts = GENERAL
    for T in range(t_from, t_max + 1):
        task, model, params = make_case(S, T, heads, equivariant)

        def call():
            return pg.catformer_loss_and_grad(task, model, params, symmetry=mode, options=opts)

        call()  # warm-up (compiles once)
        sec = cpu_time(call, repeats)
        if specialize and opts is GENERAL and sec > budget / 10:
            opts = SPECIALIZED
            call()
            sec = cpu_time(call, repeats)
        if sec > budget:
            return best[0], best[1], sec
        best = (T, sec)
    return best[0], best[1], float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=1.0, help="CPU seconds per gradient (default 1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--S", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--heads", nargs="+", default=["1,1", "2,1"])
    ap.add_argument("--specialize", choices=("on", "off"), default="on",
                    help="time the walks compiled for each layout past a tenth of the budget (default on)")
    ap.add_argument("--T-from", type=int, default=3, help="first T tried (default 3)")
    args = ap.parse_args(argv)
    import numba

    print(f"# reach: largest T with one exact gradient <= {args.budget:g} s CPU, numba threads "
          f"{numba.get_num_threads()}, popgrad {pg.__version__}, specialized kernels {args.specialize}")
    print("| S | heads | parameters | largest T | its time | time at T+1 |")
    print("|---|---|---|---|---|---|")
    for S in args.S:
        for h in args.heads:
            heads = tuple(int(x) for x in h.split(","))
            for eq in (False, True):
                T, sec, nxt = reach(S, heads, eq, args.budget, args.repeats, args.specialize == "on", args.T_from)
                print(f"| {S} | {heads} | {'equivariant' if eq else 'general'} | {T} | {sec:.3f} s | {nxt:.3f} s |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
