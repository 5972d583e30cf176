"""Benchmark of the exact population loss and gradient (not a test).

Times ``popgrad.exact_loss_and_grad`` after JIT warm-up on the default task
of the main job (chain graph, symmetrized Dirichlet(1) prior with 8 draws,
i.e. ``K = 8·S!`` atoms) and prints sequences per second next to, in the
same run:

* ``direct``: the fused per-sequence numba kernel (``O(T²)`` per sequence),
  the engine used when ``A2`` has a huge row range;
* ``blas``: weights by the numba chunk kernel plus the chunk products
  ``V Pᵀ``, ``Δᵀ V``, ``Δ P`` by NumPy/BLAS (the design alternative);
* ``numpy``: the plain-NumPy reference ``exact_loss_and_grad_numpy``.

Slow peers run on the first ``--subset`` sequences when the task is larger
and their time is extrapolated linearly (marked ``*``).

BLAS runs single-threaded (``OPENBLAS_NUM_THREADS=1`` unless set): on these
thin ``N×T`` by ``T×T`` products threaded BLAS was slower, and its spinning
threads, left over from a peer, slowed the next numba timing up to 3x on a
2-core machine.

Usage::

    python benchmarks/bench_exact.py [--repeats 7] [--subset 131072]
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads its BLAS
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

import popgrad as pg  # noqa: E402
from popgrad import _kernels, exact  # noqa: E402
from popgrad.model import first_layer_attention, softmax  # noqa: E402

CASES = [(3, 8), (3, 10), (3, 12), (2, 12), (2, 16), (2, 20)]


def make_task(S, T, seed=0):
    return pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 8, seed, symmetrize=True))


def make_params(task, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(task.T, task.T)), rng.normal(size=(task.S, task.S))


def median_time(fn, repeats, best=False):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return (statistics.median(times), min(times)) if best else statistics.median(times)


def blas_chunks(task, P, A2, eps, stop, chunk=2**16):
    """Design alternative: numba weights per chunk, BLAS for the three chunk products."""
    S, T = task.S, task.T
    parents, mu, atoms, prior_w = task.kernel_arrays()
    loss, G, dA2 = 0.0, np.zeros((T, T)), np.zeros(S * S)
    for start in range(0, stop, chunk):
        n = min(chunk, stop - start)
        seqs, w = np.empty((n, T), dtype=np.int64), np.empty((n, S))
        _kernels.chunk_weights(start, parents, mu, atoms, prior_w, seqs, w)
        q = seqs[:, -1]
        V = A2[q[:, None], seqs]
        a = softmax(V @ P.T, axis=1)
        f = np.stack([np.sum(a * (seqs == c), axis=1) for c in range(S)], axis=1)
        fe = f + eps
        loss -= float(np.sum(w * np.log(fe)))
        r = -w / fe
        delta = a * (np.take_along_axis(r, seqs, axis=1) - np.sum(f * r, axis=1)[:, None])
        G += delta.T @ V
        E = delta @ P
        dA2 += np.bincount((q[:, None] * S + seqs).ravel(), weights=E.ravel(), minlength=S * S)
    return loss, G, dA2


def bench_case(S, T, repeats, subset):
    task = make_task(S, T)
    A1, A2 = make_params(task)
    eps = task.default_eps
    n = task.n_sequences
    P = first_layer_attention(A1)

    pg.exact_loss_and_grad(task, A1, A2)  # JIT warm-up
    t_prefix, t_best = median_time(lambda: pg.exact_loss_and_grad(task, A1, A2), repeats, best=True)
    t_loss = median_time(lambda: pg.exact_loss(task, A1, A2), repeats)
    exact._exact(task, A1, A2, eps, True, "direct")
    t_direct = median_time(lambda: exact._exact(task, A1, A2, eps, True, "direct"), max(3, repeats // 2))

    m = min(n, subset)
    slow_repeats = 3 if m >= 2**15 else repeats
    blas_chunks(task, P, A2, eps, min(m, 2**16))  # warm-up
    t_blas = median_time(lambda: blas_chunks(task, P, A2, eps, m), slow_repeats) * n / m
    t_numpy = median_time(lambda: exact._numpy_sums(task, P, A2, eps, 0, m), slow_repeats) * n / m
    return dict(
        S=S, T=T, K=task.prior.K, n=n, t_prefix=t_prefix, t_best=t_best, t_loss=t_loss, t_direct=t_direct,
        t_blas=t_blas, t_numpy=t_numpy, extrapolated=m < n,
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="timed runs per case (median reported)")
    ap.add_argument("--subset", type=int, default=2**17, help="sequences for the slow peers on large tasks")
    args = ap.parse_args(argv)

    print(f"popgrad {pg.__version__} | numba {numba.__version__} | numpy {np.__version__} | "
          f"python {platform.python_version()}")
    print(f"cores: os.cpu_count()={os.cpu_count()}, numba threads={numba.get_num_threads()} "
          f"({numba.threading_layer() if _threading_layer_ready() else 'layer n/a'}), "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} | {_cpu_name()}")
    print("task: chain(T), dirichlet_prior(S, 1.0, 8, seed=0, symmetrize=True); random A1, A2; eps = T_eff**-0.5")
    print(f"median of {args.repeats} runs after JIT warm-up (best run next to it); "
          f"seq/s = S**T / median time of one exact loss-and-gradient\n")
    head = (f"{'S':>2} {'T':>3} {'K':>4} {'sequences':>11} | {'loss+grad ms':>12} {'best':>6} {'seq/s':>9} | "
            f"{'loss ms':>8} | {'direct seq/s':>12} | {'blas seq/s':>11} | {'numpy seq/s':>11} | {'vs numpy':>8}")
    print(head)
    print("-" * len(head))
    rows = []
    for S, T in CASES:
        r = bench_case(S, T, args.repeats, args.subset)
        rows.append(r)
        star = "*" if r["extrapolated"] else " "
        print(
            f"{S:>2} {T:>3} {r['K']:>4} {r['n']:>11,} | {r['t_prefix'] * 1e3:>12.1f} {r['t_best'] * 1e3:>6.1f} "
            f"{_rate(r['n'], r['t_prefix']):>9} | "
            f"{r['t_loss'] * 1e3:>8.1f} | {_rate(r['n'], r['t_direct']):>12} | "
            f"{_rate(r['n'], r['t_blas']) + star:>11} | {_rate(r['n'], r['t_numpy']) + star:>11} | "
            f"{r['t_numpy'] / r['t_prefix']:>7.0f}x"
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


def _threading_layer_ready():
    try:
        numba.threading_layer()
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    main()
