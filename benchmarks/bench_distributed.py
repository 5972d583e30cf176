"""One exact enumeration split over Dask workers (``exact_loss_and_grad(..., client=...)``): overhead and speedup.

Run: ``python benchmarks/bench_distributed.py [--T 16 18] [--repeat 3] [--workers 2]``.

* per-step overhead: a tiny task (S = 3, T = 8: one block, so one worker does
  the whole sum) through the client vs the same call in this process
  (medians over many calls, warm caches);
* speedup: S = 3, T = 16 and T = 18 (43M and 387M sequences), a chain with a
  4-atom Dirichlet prior and generic ``A1, A2`` (no orbit reduction), and the
  same with the relabeling-closed prior and ``A2 = β·I`` (orbit reduction on):
  this process with numba on every core vs a ``LocalCluster`` of ``--workers``
  single-threaded worker processes (``NUMBA_NUM_THREADS=1``). Best of
  ``--repeat`` warm calls; the first call (plans, worker caches) is reported
  apart. The results are checked bit for bit.

Imports stay inside functions: the workers are spawned processes that re-run
this file's top level, and must not import numba before their environment is set.
"""
import argparse
import time


def _best(fn, repeat):
    out, times = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def _median(fn, n):
    import numpy as np

    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _task(T, closed):
    import numpy as np

    import popgrad as pg

    base = pg.dirichlet_prior(3, 1.0, 4, seed=0)
    prior = pg.FinitePrior.relabeling_closure(base.atoms, base.weights) if closed else base
    task = pg.Task(pg.chain(T), prior, max_sequences=3**T)
    rng = np.random.default_rng(0)
    A1 = 0.3 * rng.normal(size=(T, T))
    A2 = 0.5 * np.eye(3) if closed else 0.5 * rng.normal(size=(3, 3))
    return task, A1, A2


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=[16, 18])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--calls", type=int, default=100, help="calls for the overhead medians")
    args = p.parse_args(argv)

    import numba
    import numpy as np
    from dask.distributed import Client, LocalCluster

    import popgrad as pg

    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                           env={"NUMBA_NUM_THREADS": "1"})
    client = Client(cluster)
    try:
        print(f"this process: {numba.get_num_threads()} numba threads; cluster: {args.workers} workers x 1 thread")
        # ---- per-step overhead
        task, A1, A2 = _task(8, closed=False)
        for _ in range(3):
            pg.exact_loss_and_grad(task, A1, A2)
            pg.exact_loss_and_grad(task, A1, A2, client=client)
        local = _median(lambda: pg.exact_loss_and_grad(task, A1, A2), args.calls)
        remote = _median(lambda: pg.exact_loss_and_grad(task, A1, A2, client=client), args.calls)
        loss_local = _median(lambda: pg.exact_loss(task, A1, A2), args.calls)
        loss_remote = _median(lambda: pg.exact_loss(task, A1, A2, client=client), args.calls)
        print("\nper-step overhead (S=3, T=8, 6561 sequences, one block; medians of "
              f"{args.calls} warm calls)")
        print(f"{'call':<22}{'this process':>14}{'client':>12}{'overhead':>12}")
        print(f"{'exact_loss_and_grad':<22}{local * 1e3:>11.2f} ms{remote * 1e3:>9.2f} ms"
              f"{(remote - local) * 1e3:>9.2f} ms")
        print(f"{'exact_loss':<22}{loss_local * 1e3:>11.2f} ms{loss_remote * 1e3:>9.2f} ms"
              f"{(loss_remote - loss_local) * 1e3:>9.2f} ms")

        # ---- speedup
        print(f"\nwall time per exact_loss_and_grad (best of {args.repeat} warm calls; first call in brackets)")
        print(f"{'task':<34}{'sequences':>12}{'this process':>18}{'2 workers' if args.workers == 2 else 'workers':>18}"
              f"{'speedup':>9}  same bits")
        for T in args.T:
            for closed in (False, True):
                task, A1, A2 = _task(T, closed)
                t0 = time.perf_counter()
                ref = pg.exact_loss_and_grad(task, A1, A2)
                first_local = time.perf_counter() - t0
                t_local, ref = _best(lambda: pg.exact_loss_and_grad(task, A1, A2), args.repeat)
                t0 = time.perf_counter()
                pg.exact_loss_and_grad(task, A1, A2, client=client)
                first_remote = time.perf_counter() - t0
                t_remote, r = _best(lambda: pg.exact_loss_and_grad(task, A1, A2, client=client), args.repeat)
                same = r.loss == ref.loss and np.array_equal(r.dA1, ref.dA1) and np.array_equal(r.dA2, ref.dA2)
                rel = max(abs(r.loss - ref.loss) / abs(ref.loss),
                          float(np.max(np.abs(r.dA1 - ref.dA1)) / np.max(np.abs(ref.dA1))),
                          float(np.max(np.abs(r.dA2 - ref.dA2)) / np.max(np.abs(ref.dA2))))
                name = f"chain S=3 T={T}" + (" (orbit reduction)" if closed else "")
                print(f"{name:<34}{3**T:>12,}{t_local:>8.2f} s ({first_local:>5.2f})"
                      f"{t_remote:>8.2f} s ({first_remote:>5.2f}){t_local / t_remote:>8.2f}x  "
                      f"{'yes' if same else f'no (rel {rel:.1e})'}")
    finally:
        client.close()
        cluster.close()


if __name__ == "__main__":
    main()
