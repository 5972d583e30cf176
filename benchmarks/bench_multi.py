"""Benchmark of the exact k-head loss and gradient (not a test).

Times ``popgrad.exact_loss_and_grad`` after JIT warm-up (median of
``--repeats`` runs, best run beside it) and prints sequences per second next
to, in the same run:

* ``loss``: the forward pass only (``popgrad.exact_loss``);
* ``numpy``: the plain-NumPy reference ``exact_loss_and_grad_multi_numpy``
  (timed on the first ``--subset`` sequences of large tasks and extrapolated
  linearly, marked ``*``);
* ``1-head``: for ``k = 1`` rows (a single-parent chain as a multi-parent
  graph), the single-parent engine ``popgrad.exact_loss_and_grad`` on the
  same task (a doubly-stochastic prior, so both tasks have the same weights).

Tasks: the paper's two-parent graph and n-grams, prior
``dirichlet_tensor_prior(S, k, 1.0, 8, seed=0)`` (relabeling closure,
``K = 8·S!`` atoms), random ``A1``, ``A2``, ``ε = T_eff^{-1/2}``.

Usage::

    python benchmarks/bench_multi.py [--repeats 5] [--subset 32768]
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as benchmarks/run.py: threaded BLAS hurts the numba timings
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

import popgrad as pg  # noqa: E402
from popgrad.engine import reference  # noqa: E402
from popgrad.model.multihead import head_attention  # noqa: E402

#: (label, S, T, graph builder)
CASES = [
    ("two-parent", 3, 8, lambda T: pg.two_parent(T)),
    ("two-parent", 3, 10, lambda T: pg.two_parent(T)),
    ("two-parent", 3, 12, lambda T: pg.two_parent(T)),
    ("3-gram", 2, 12, lambda T: pg.ngram(T, 3)),
    ("3-gram", 2, 16, lambda T: pg.ngram(T, 3)),
    ("4-gram", 2, 16, lambda T: pg.ngram(T, 4)),
    ("chain k=1", 3, 10, None),
    ("chain k=1", 3, 12, None),
]


def median_time(fn, repeats, best=False):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return (statistics.median(times), min(times)) if best else statistics.median(times)


def doubly_stochastic_prior(S, n_atoms, seed=0):
    rng = np.random.default_rng(seed)
    perms = [np.eye(S)[list(p)] for p in itertools.permutations(range(S))]
    atoms = np.array([np.tensordot(rng.dirichlet(np.ones(len(perms))), perms, axes=1) for _ in range(n_atoms)])
    return pg.relabel_closure(atoms / atoms.sum(axis=2, keepdims=True))


def bench_case(label, S, T, build, repeats, subset):
    single = None
    if build is None:  # k = 1: the single-parent chain, same weights in both engines
        atoms, weights = doubly_stochastic_prior(S, 8)
        prior = pg.FinitePrior(atoms, weights)
        single = pg.Task(pg.chain(T), prior)
        task = pg.MultiParentTask(pg.MultiParentGraph.from_single(pg.chain(T)), pg.TensorPrior.from_finite(prior))
    else:
        graph = build(T)
        task = pg.MultiParentTask(graph, pg.dirichlet_tensor_prior(S, graph.k, 1.0, 8, seed=0))
    k, n = task.k, task.n_sequences
    rng = np.random.default_rng(0)
    A1, A2 = rng.normal(size=(k, T, T)), rng.normal(size=(k, S, S))
    eps = task.default_eps

    pg.exact_loss_and_grad(task, A1, A2)  # JIT warm-up
    pg.exact_loss(task, A1, A2)
    t_grad, t_best = median_time(lambda: pg.exact_loss_and_grad(task, A1, A2), repeats, best=True)
    t_loss = median_time(lambda: pg.exact_loss(task, A1, A2), repeats)
    m = min(n, subset)
    P = head_attention(A1)
    reference._multi_sums(task, P, A2, eps, 0, min(m, 1024), pg.DEFAULT_OPTIONS.numpy_chunk)  # warm-up
    t_numpy = median_time(lambda: reference._multi_sums(task, P, A2, eps, 0, m, pg.DEFAULT_OPTIONS.numpy_chunk), 3 if m >= 2**14 else repeats) * n / m
    t_single = float("nan")
    if single is not None:
        pg.exact_loss_and_grad(single, A1[0], A2[0])
        t_single = median_time(lambda: pg.exact_loss_and_grad(single, A1[0], A2[0]), repeats)
    return dict(label=label, S=S, T=T, k=k, K=task.prior.K, n=n, t_grad=t_grad, t_best=t_best, t_loss=t_loss,
                t_numpy=t_numpy, t_single=t_single, extrapolated=m < n)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per case (median reported)")
    ap.add_argument("--subset", type=int, default=2**15, help="sequences for the NumPy reference on large tasks")
    args = ap.parse_args(argv)
    print(f"popgrad {pg.__version__} | numba {numba.__version__} | numpy {np.__version__} | "
          f"python {platform.python_version()}")
    print(f"cores: os.cpu_count()={os.cpu_count()}, numba threads={numba.get_num_threads()} | {_cpu_name()}")
    print("prior: dirichlet_tensor_prior(S, k, 1.0, 8, seed=0) (K = 8*S! atoms); k=1 rows: doubly-stochastic "
          "relabeling-closed prior (K = 8*S!) on chain(T)")
    print(f"median of {args.repeats} runs after JIT warm-up (best run beside it); "
          "seq/s = S**T / median time of one exact loss-and-gradient\n")
    head = (f"{'graph':>10} {'S':>2} {'T':>3} {'k':>2} {'K':>4} {'sequences':>10} | {'loss+grad ms':>12} {'best':>7} "
            f"{'seq/s':>8} | {'loss ms':>8} | {'numpy seq/s':>11} | {'vs numpy':>8} | {'1-head engine ms':>16}")
    print(head)
    print("-" * len(head))
    rows = []
    for label, S, T, build in CASES:
        r = bench_case(label, S, T, build, args.repeats, args.subset)
        rows.append(r)
        star = "*" if r["extrapolated"] else " "
        single = f"{r['t_single'] * 1e3:>16.1f}" if np.isfinite(r["t_single"]) else f"{'':>16}"
        print(
            f"{label:>10} {S:>2} {T:>3} {r['k']:>2} {r['K']:>4} {r['n']:>10,} | {r['t_grad'] * 1e3:>12.1f} "
            f"{r['t_best'] * 1e3:>7.1f} {_rate(r['n'], r['t_grad']):>8} | {r['t_loss'] * 1e3:>8.1f} | "
            f"{_rate(r['n'], r['t_numpy']) + star:>11} | {r['t_numpy'] / r['t_grad']:>7.0f}x | {single}"
        )
    if any(r["extrapolated"] for r in rows):
        print(f"\n* timed on the first {args.subset:,} sequences and extrapolated linearly to S**T")
    return rows


def _rate(n, t):
    v = n / t
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.0f}k"


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
