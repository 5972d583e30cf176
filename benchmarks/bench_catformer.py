"""Benchmark of the disentangled transformer's exact loss and gradient (issue 20; not a test).

Times ``popgrad.catformer_loss_and_grad`` after JIT warm-up (median of
``--repeats`` runs) and, in the same run, a jitted JAX ``value_and_grad`` of
the same model (the official ``catformer.py`` forward, float64) over the same
enumeration: sequences and exact weights from popgrad, ``lax.scan`` over
chunks of ``--jax-chunk`` sequences, loss ``-Σ w log_softmax``. Both results
are compared (relative difference printed; the run stops above 1e-10).

Columns: sequences per second; flops per sequence (the kernel's loops, see
:func:`flops_per_sequence`) and achieved GFLOP/s against a float64 ``dgemm``
peak measured in the same run (one thread and all cores); the JAX time and
the speed-up. Times are given as wall and as process CPU time (all threads):
on a shared machine the CPU time is the comparable figure. Then the T sweep
(one numba thread): the largest ``T`` whose gradient takes at most
``--budget`` CPU seconds (10 s), at S = 2 and S = 3.

Tasks: ``pg.chain(T)`` with ``dirichlet_prior(S, 1.0, 8, seed=0)`` (closed
under the ``S!`` relabelings: 48 atoms at S = 3, 16 at S = 2); parameters
``model.init(0.1, 0)`` with a random ``W`` (scale 0.1).

Usage::

    python benchmarks/bench_catformer.py [--repeats 5] [--budget 10] [--no-jax] [--no-sweep] [--no-table]
                                         [--no-equivariant] [--specialize on|off|auto]

``--specialize`` (default ``on``) is ``EngineOptions.catformer_specialize``: the walks compiled for each
case's layout (:mod:`popgrad.engine._kernels.specialize`; what a training run gets after its first 30 s, the
same bits); ``off`` times the general kernels. A layout's first specialized call compiles (20–35 s per walk,
once per machine), outside the timings.

Then the same table for *equivariant* parameters (the draw above projected with ``Sym``): what a
zero-start trajectory runs, through the exact orbit reduction (DESIGN §21).
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as benchmarks/run.py: threaded BLAS hurts the numba timings
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numba  # noqa: E402
import numpy as np  # noqa: E402

import popgrad as pg  # noqa: E402
from popgrad.engine import catformer_symmetry as _sym  # noqa: E402

#: (S, T, heads) of the table; the first row is the issue's target.
CASES = [(3, 10, (1, 1)), (2, 12, (2, 1)), (3, 8, (1, 1)), (2, 16, (1, 1)), (3, 10, (2, 1)), (3, 8, (1, 1, 1))]
#: Counted flops of one ``exp`` / ``log`` (an fdlibm-style polynomial, as benchmarks/run.py counts ``log``).
TRANSCENDENTAL_FLOPS = 20


#: (S, T, heads) of the equivariant rows (parameters of a zero-start trajectory: the orbit reduction, DESIGN §21).
EQUIVARIANT_CASES = [(3, 10, (1, 1)), (3, 10, (2, 1)), (2, 16, (1, 1))]


def make_case(S, T, heads, seed=0, equivariant=False):
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 8, seed, symmetrize=True), max_sequences=10**9)
    model = pg.CatFormer(S, T, heads=heads)
    p = model.init(0.1, seed)
    W = 0.1 * np.random.default_rng(seed).standard_normal(p.W.shape)
    if equivariant:  # the same draw projected onto the relabeling-equivariant parameters
        from popgrad.engine.catformer_symmetry import symmetrize_params

        A, W = symmetrize_params(model, p.A, W)
        return task, model, pg.CatFormerParams(A, W)
    return task, model, pg.CatFormerParams(p.A, W)


def median_time(fn, repeats):
    return median_times(fn, repeats)[0]


def median_times(fn, repeats):
    """``(wall, cpu)`` medians of ``repeats`` calls; ``cpu`` is the process CPU time (all its threads).

    On a shared machine the wall time mostly measures the other processes; the CPU time is the work
    done (what a quiet machine would take on one core, summed over threads).
    """
    ts, cs = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        cs.append(time.process_time() - c0)
    return statistics.median(ts), statistics.median(cs)


def flops_per_sequence(model, K, want_grad=True):
    """Floating-point operations of the trie kernel per sequence (a multiply-add counts 2, exp/log 20).

    Counts the loops of :mod:`popgrad.engine._kernels.catformer` with every dense coordinate nonzero:
    per node at depth ``t`` (``S**(t+1)`` of them) the rows of layers ``1 … L-1`` and ``hw``; per leaf the
    last layer's row, the readout, the loss and, with the gradient, every backward loop; the per-atom
    weight products (``K`` per node, ``K·S`` per leaf).
    """
    S, T, dims = model.S, model.T, model.dims
    d0, L = dims[0], model.n_layers
    dl1 = dims[L - 1]
    ndl = dl1 - d0
    X = TRANSCENDENTAL_FLOPS

    def head_fwd(n, din, out):
        nd = din - d0
        f = din + 2 * nd * din + n * (1 + 2 * nd) + n * (X + 2)
        return f + (n * (2 + 2 * nd) if out else 0)

    def head_bwd(n, din, from_out):
        nd = din - d0
        f = 4 * n + n * (2 + 4 * nd) + 2 * din + 2 * nd * din + 2 * nd * din
        return f + (n * (1 + 4 * nd) if from_out else 0)

    inner = [(dims[l], l) for l in range(L - 1) for _ in range(model.heads[l])]
    m_last = model.heads[-1]
    total = 0.0
    for t in range(T):
        n = t + 1
        node = K + sum(head_fwd(n, din, True) for din, _ in inner) + m_last * S * (1 + 2 * ndl)
        if want_grad:
            node += sum(head_bwd(n, din, True) for din, _ in inner) + m_last * (2 * S + 4 * S * ndl)
        total += S ** (t + 1) * node
    leaf = 2 * K * S + m_last * head_fwd(T, dl1, False) + S * (1 + 2 * ndl) + 2 * m_last * T * S + S * (X + 4) + X
    if want_grad:
        leaf += S * (2 + 4 * ndl) + m_last * (4 * T * S + head_bwd(T, dl1, False))
    total += S**T * leaf
    return total / S**T


def measure_peak(n=2048, repeats=3):
    """Float64 ``dgemm`` GFLOP/s on all cores and on one (threadpoolctl when available)."""
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n)), rng.random((n, n))
    out = {}
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # the environment's BLAS threads only
        threadpool_limits = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for label, threads in (("all", cores), ("one", 1)):
        if threadpool_limits is None:
            a @ b
            t = min(median_time(lambda: a @ b, 1) for _ in range(repeats))
        else:
            with threadpool_limits(threads):
                a @ b
                t = min(median_time(lambda: a @ b, 1) for _ in range(repeats))
        out[label] = 2 * n**3 / t / 1e9
    return out


class JaxCatFormer:
    """Jitted JAX ``value_and_grad`` of the official CatFormer forward over popgrad's enumeration."""

    def __init__(self, task, model, chunk):
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        self.jax = jax
        S, T = task.S, task.T
        n = task.n_sequences
        chunk = min(chunk, n)
        n_chunks = -(-n // chunk)
        seqs = np.zeros((n_chunks * chunk, T), dtype=np.int32)
        w = np.zeros((n_chunks * chunk, S))
        pos = 0
        for s_c, w_c in task.enumerate(chunk_size=2**16):
            seqs[pos:pos + len(s_c)] = s_c
            w[pos:pos + len(s_c)] = w_c
            pos += len(s_c)
        self.seqs = jnp.asarray(seqs.reshape(n_chunks, chunk, T))
        self.w = jnp.asarray(w.reshape(n_chunks, chunk, S))
        tri = np.tril(np.ones((T, T), dtype=bool))
        eye = jnp.eye(T)

        def attn(x, A):
            z = jnp.einsum("nia,ab,njb->nij", x, A, x)
            return jax.nn.softmax(jnp.where(tri, z, -jnp.inf), axis=-1) @ x

        def chunk_loss(params, s, wc):
            A, W = params
            x = jnp.concatenate([jax.nn.one_hot(s, S, dtype=jnp.float64), jnp.broadcast_to(eye, s.shape + (T,))], -1)
            for Al in A:
                x = jnp.concatenate([x] + [attn(x, Al[k]) for k in range(Al.shape[0])], -1)
            return -jnp.sum(wc * jax.nn.log_softmax(x[:, -1, :] @ W, axis=-1))

        def total(params, seqs, w):
            def body(acc, xs):
                return acc + chunk_loss(params, xs[0], xs[1]), None

            return jax.lax.scan(body, jnp.zeros(()), (seqs, w))[0]

        self.fn = jax.jit(jax.value_and_grad(total))
        # XLA's own count of one chunk's value_and_grad (compiled, after its simplifications), per sequence
        pa = ([jnp.zeros(a.shape) for a in model.init(0.0, 0).A], jnp.zeros(model.shapes()[1]))
        cost = jax.jit(jax.value_and_grad(chunk_loss)).lower(pa, self.seqs[0], self.w[0]).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        self.flops = float(cost.get("flops", float("nan"))) / chunk
        self.transcendentals = float(cost.get("transcendentals", 0.0)) / chunk

    def __call__(self, params):
        jnp = self.jax.numpy
        out = self.fn(([jnp.asarray(a) for a in params.A], jnp.asarray(params.W)), self.seqs, self.w)
        self.jax.block_until_ready(out)
        loss, (dA, dW) = out
        return float(loss), [np.asarray(a) for a in dA], np.asarray(dW)


def rel_diff(r, loss, dA, dW):
    def rd(a, b):
        return float(np.max(np.abs(np.asarray(a) - b)) / max(np.max(np.abs(b)), 1e-300))

    return max([abs(loss - r.loss) / abs(r.loss), rd(dW, r.dW)] + [rd(a, b) for a, b in zip(dA, r.dA)])


#: The engine options of every timed call (``--specialize``).
OPTS = pg.EngineOptions(catformer_specialize="on")


def bench_table(repeats, use_jax, jax_chunk, peak, equivariant=False):
    rows = []
    for S, T, heads in (EQUIVARIANT_CASES if equivariant else CASES):
        task, model, params = make_case(S, T, heads, equivariant=equivariant)
        r = pg.catformer_loss_and_grad(task, model, params, options=OPTS)  # JIT warm-up
        pg.catformer_loss(task, model, params, options=OPTS)
        t, c = median_times(lambda: pg.catformer_loss_and_grad(task, model, params, options=OPTS), repeats)
        t_loss = median_time(lambda: pg.catformer_loss(task, model, params, options=OPTS), repeats)
        n = task.n_sequences
        fl = flops_per_sequence(model, task.prior.K)
        row = dict(S=S, T=T, heads=heads, dims=model.dims, n=n, t=t, t_loss=t_loss, seq_s=n / t, flops=fl,
                   gflops=fl * n / c / 1e9, cpu=c, t_jax=None, cpu_jax=None, diff=None)
        if use_jax:
            peer = JaxCatFormer(task, model, jax_chunk)
            out = peer(params)
            row["diff"] = rel_diff(r, *out)
            if row["diff"] > 1e-10:
                raise RuntimeError(f"JAX and popgrad disagree at S={S} T={T} heads={heads}: {row['diff']:.3g}")
            row["t_jax"], row["cpu_jax"] = median_times(lambda: peer(params), max(1, min(repeats, 3)))
            row["jax_flops"] = peer.flops + TRANSCENDENTAL_FLOPS * peer.transcendentals
            del peer
        rows.append(row)
        print(_row_text(row, peak), flush=True)
        if row.get("jax_flops"):
            # at equal flops per CPU second popgrad would be this many times faster than JAX: the speed-up
            # that fewer operations alone buy (the rest is each side's efficiency)
            seen = fl * (task.n_sequences if not equivariant else len(_sym.canonical_codes(S, T))) / n
            print(f"|   | flop ratio: XLA {row['jax_flops']:.4g} flops/seq (exp/log as {TRANSCENDENTAL_FLOPS}) vs "
                  f"popgrad {seen:.4g} per sequence-equivalent: {row['jax_flops'] / seen:.3g}×; achieved "
                  f"{row['cpu_jax'] / row['cpu']:.3g}× (CPU) |", flush=True)
    return rows


def sweep(S, budget, heads=(1, 1), T=4):
    """``[(T, seconds)]`` for T = 4, 5, … until a gradient takes more than ``budget`` CPU seconds (one thread)."""
    out = []
    while True:
        task, model, params = make_case(S, T, heads)
        pg.catformer_loss_and_grad(task, model, params, options=OPTS)
        wall, t = median_times(lambda: pg.catformer_loss_and_grad(task, model, params, options=OPTS),
                               1 if S**T > 10**5 else 3)
        out.append((T, t))
        print(f"  sweep S={S} T={T}: {t:.3g} CPU s, {wall:.3g} wall s ({S**T / t:.3g} seq per CPU s)", flush=True)
        # the next T costs about S·(d(T+1)/d(T))² times more: stop before a run far beyond the budget
        if t > budget or t * S * ((T + 1 + S) / (T + S)) ** 2 > 4 * budget:
            return out
        T += 1


def _row_text(row, peak):
    none = row["t_jax"] is None
    jax = "—" if none else f"{row['t_jax']:.3g} / {row['cpu_jax']:.3g}"
    sp = "—" if none else f"{row['t_jax'] / row['t']:.3g}× / {row['cpu_jax'] / row['cpu']:.3g}×"
    return (f"| {row['S']} | {row['T']} | {row['heads']} | {row['dims'][-1]} | {row['n']:,} | "
            f"{row['t'] * 1e3:.3g} / {row['cpu'] * 1e3:.3g} | {row['t_loss'] * 1e3:.3g} | "
            f"{row['n'] / row['cpu'] / 1e6:.3g}M | {row['flops']:.3g} | {row['gflops']:.3g} | "
            f"{100 * row['gflops'] / peak['one']:.2g}% | {jax} | {sp} | "
            f"{'—' if row['diff'] is None else format(row['diff'], '.1e')} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=float, default=10.0, help="seconds per gradient for the T sweep")
    ap.add_argument("--jax-chunk", type=int, default=2**13)
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-table", action="store_true")
    ap.add_argument("--no-equivariant", action="store_true", help="skip the equivariant (orbit-reduced) rows")
    ap.add_argument("--sweep-from", type=int, nargs=2, default=(4, 4), metavar=("T_S2", "T_S3"),
                    help="first T of the sweep at S=2 and S=3")
    ap.add_argument("--specialize", choices=("on", "off", "auto"), default="on",
                    help="EngineOptions.catformer_specialize of the timed calls (default on)")
    args = ap.parse_args(argv)
    global OPTS
    OPTS = pg.EngineOptions(catformer_specialize=args.specialize)
    use_jax = not args.no_jax
    if use_jax:
        try:
            import jax  # noqa: F401
        except ImportError:
            print("jax not installed: JAX column skipped", file=sys.stderr)
            use_jax = False
    peak = measure_peak()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d %H:%M')} · {cpu} · {os.cpu_count()} cores · numba {numba.__version__} "
          f"({numba.get_num_threads()} threads) · numpy {np.__version__} · python {platform.python_version()}"
          + (f" · jax {__import__('jax').__version__}" if use_jax else "")
          + f" · catformer_specialize={args.specialize}")
    print(f"Peak float64 dgemm: {peak['all']:.1f} GFLOP/s on all cores, {peak['one']:.1f} on one. "
          f"Median of {args.repeats} runs after warm-up.\n")
    print("| S | T | heads | d_L | sequences | grad ms (wall / CPU) | loss ms | seq per CPU s | flops/seq "
          "| GFLOP/s (CPU) | % 1-core peak | JAX grad s (wall / CPU) | vs JAX (wall / CPU) | rel. diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    if not args.no_table:
        bench_table(args.repeats, use_jax, args.jax_chunk, peak)
    if not args.no_equivariant:
        print("\nEquivariant parameters (a zero-start trajectory; the exact orbit reduction, DESIGN §21; "
              "JAX runs the whole enumeration; flops/GFLOP/s columns count the full enumeration):")
        bench_table(args.repeats, use_jax, args.jax_chunk, peak, equivariant=True)
    if not args.no_sweep:
        print(f"\nT sweep, heads (1, 1), one numba thread's CPU time: the largest T with a gradient in "
              f"≤ {args.budget:g} s")
        numba.set_num_threads(1)
        for S, T0 in zip((2, 3), args.sweep_from):
            res = sweep(S, args.budget, T=T0)
            ok = [T for T, t in res if t <= args.budget]
            print(f"S={S}: largest T = {max(ok) if ok else '—'} "
                  f"({', '.join(f'T={T}: {t:.3g} s' for T, t in res[-3:])})")


if __name__ == "__main__":
    main()
