"""popgrad benchmark: exact population loss + gradient against its peers, in one run.

``python benchmarks/run.py`` (or ``make bench``) prints five tables and
writes them, with every raw number, to ``benchmarks/results/latest.json``
and ``latest.md`` (atomic writes). ``benchmarks/README.md`` explains how to
read them. The default run takes a few minutes; ``--quick`` a few tens of
seconds (fewer cases and repeats).

1. **Throughput** of ``exact_loss_and_grad`` for S=2 (T=12,16,20), S=3
   (T=8,10,12,13), S=4 (T=8,10) on the main job's task (chain graph,
   symmetrized Dirichlet(1) prior, 8 draws, ``K = 8·S!`` atoms): without
   the orbit reduction (``symmetry="off"``, random ``A1``, ``A2``) and with it
   (``A2 ∈ span{I, 11ᵀ}``), as sequences per second and sequence-
   equivalents ``S**T / time``; peers on the same task and parameters: the
   NumPy reference and a jitted JAX ``value_and_grad`` (skipped with a
   message when JAX is absent; its result is checked against popgrad's to
   1e-10). Median of ``--repeats`` runs after warm-up (JIT compile and, for
   popgrad, the first call that fills the leaf-weight cache: later calls
   of a training loop reuse it, as JAX reuses its precomputed weight
   arrays). Slow peers on large tasks are timed on the first ``--subset``
   sequences and extrapolated (marked ``*``).
2. **Engines**: popgrad's prefix engine (fused, vectorized leaves), the
   fused per-sequence kernel (``direct``), and BLAS per chunk (numba weights,
   then ``V Pᵀ``, ``Δᵀ V``, ``Δ P`` by NumPy/BLAS).
3. **Exact vs sampled**: relative error of a Monte-Carlo gradient
   (``popgrad.sampled_loss_and_grad``: ``task.sample(n, seed)``, soft
   labels) at ``n = 2^10 … 2^20`` against the exact gradient, and the time
   of each (sampling + gradient) next to the time of the exact one.
4. **JIT**: first-call times in fresh processes with an empty numba cache
   (temporary ``NUMBA_CACHE_DIR``) and with the cache it left.
5. **Roofline**: floating-point operations per sequence of the prefix
   engine (counted from its loops, :func:`flops_per_sequence`), achieved
   GFLOP/s, and the fraction of the peak measured in the same run with a
   threaded float64 ``dgemm``.

Every timing except the peak runs with one BLAS thread (see
``blas_threads.py``); numba uses all cores (``NUMBA_NUM_THREADS``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import numba
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import blas_threads  # noqa: E402

import popgrad as pg  # noqa: E402
from popgrad import _io  # noqa: E402
from popgrad.engine import reference, single, symmetry  # noqa: E402
from popgrad.engine.options import DEFAULT_OPTIONS, EngineOptions  # noqa: E402
from popgrad.model.reduced import first_layer_attention, softmax  # noqa: E402
from popgrad.task import _weights  # noqa: E402

CASES = [(2, 12), (2, 16), (2, 20), (3, 8), (3, 10), (3, 12), (3, 13), (4, 8), (4, 10)]
QUICK_CASES = [(2, 16), (3, 10), (3, 12), (4, 10)]
#: JAX chunk (sequences per ``lax.scan`` step): the fastest of 2^12 … 2^20 on the 2-core benchmark machine.
JAX_CHUNK = 2**14
#: Skip the JAX peer when its arrays would exceed this many bytes.
JAX_MAX_BYTES = 2**30
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# ---------------------------------------------------------------- helpers
def make_task(S, T, seed=0):
    return pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 8, seed, symmetrize=True))


def make_params(task, seed=0):
    rng = np.random.default_rng(seed)
    A1 = rng.normal(size=(task.T, task.T))
    A2 = rng.normal(size=(task.S, task.S))
    A2_span = 0.8 * np.eye(task.S) - 0.1  # in span{I, 11ᵀ}: the reduction applies
    return A1, A2, A2_span


def timed(fn, repeats):
    """``(median, min)`` wall time of ``repeats`` calls."""
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def rate(x):
    if x is None or not math.isfinite(x):
        return "—"
    for unit, s in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= s:
            return f"{x / s:.3g}{unit}"
    return f"{x:.3g}"


def ms(t):
    return "—" if t is None else (f"{t * 1e3:.3g}" if t < 10 else f"{t * 1e3:.0f}")


def ratio(a, b):
    return "—" if a is None or b is None else f"{a / b:.3g}×"


def rel_diff(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# ---------------------------------------------------------------- environment
def environment():
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        cpu = ""
    try:
        layer = numba.threading_layer()
    except ValueError:
        layer = "not initialized"
    versions = {"python": platform.python_version(), "numpy": np.__version__, "numba": numba.__version__,
                "popgrad": pg.__version__}
    for mod in ("llvmlite", "scipy", "jax", "jaxlib"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    return {
        "cpu": cpu or platform.processor() or platform.machine(),
        "os_cpu_count": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numba_threads": numba.get_num_threads(),
        "numba_threading_layer": layer,
        "blas_threads_default": blas_threads.get_blas_threads(),
        "versions": versions,
        "platform": platform.platform(),
    }


def measure_peak(n=3072, repeats=3):
    """Float64 ``dgemm`` GFLOP/s with threaded BLAS (all cores) and with one thread."""
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n)), rng.random((n, n))
    out = {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for label, threads in (("all_cores", cores), ("one_core", 1)):
        with blas_threads.blas_threads(threads):
            a @ b
            t = min(timed(lambda: a @ b, repeats))
        out[label] = 2 * n**3 / t / 1e9
    out["n"] = n
    return out


# ---------------------------------------------------------------- JAX peer
def jax_available():
    try:
        import jax  # noqa: F401

        return True
    except ImportError:
        return False


class JaxPeer:
    """A straightforward jitted JAX version of the same loss, ``jax.value_and_grad`` over ``(A1, A2)``.

    Sequences and weights are enumerated once by popgrad and stored as device
    arrays (chunks of :data:`JAX_CHUNK`, the last padded with zero weights);
    the loss is a ``lax.scan`` over chunks of the same model in float64.
    """

    def __init__(self, task, chunk=JAX_CHUNK):
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        self.jax, self.jnp = jax, jnp
        S, T = task.S, task.T
        n = task.n_sequences
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

        def chunk_loss(A1, A2, s, wc, eps):
            P = jax.nn.softmax(jnp.where(tri, A1, -jnp.inf), axis=1)
            V = A2[s[:, -1:], s]  # V[n, j] = A2[q_n, s_{n,j}]
            a = jax.nn.softmax(V @ P.T, axis=1)
            f = jnp.einsum("nt,ntc->nc", a, jax.nn.one_hot(s, S, dtype=a.dtype))
            return -jnp.sum(jnp.where(wc > 0, wc * jnp.log(f + eps), 0.0))

        def total(A1, A2, seqs, w, eps):
            def body(acc, xs):
                return acc + chunk_loss(A1, A2, xs[0], xs[1], eps), None

            return jax.lax.scan(body, jnp.zeros(()), (seqs, w))[0]

        self.fn = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))

    def __call__(self, A1, A2, eps):
        out = self.fn(A1, A2, self.seqs, self.w, eps)
        self.jax.block_until_ready(out)
        loss, (dA1, dA2) = out
        return float(loss), np.tril(np.asarray(dA1)), np.asarray(dA2)


# ---------------------------------------------------------------- BLAS engine (design alternative)
def blas_chunks(task, P, A2, eps, stop, chunk=2**16):
    """Numba weights per chunk, then the chunk products by NumPy/BLAS (one BLAS thread)."""
    S, T = task.S, task.T
    parents, mu, atoms, prior_w = task.kernel_arrays()
    loss, G, dA2 = 0.0, np.zeros((T, T)), np.zeros(S * S)
    for start in range(0, stop, chunk):
        n = min(chunk, stop - start)
        seqs, w = np.empty((n, T), dtype=np.int64), np.empty((n, S))
        _weights.chunk_weights(start, parents, mu, atoms, prior_w, seqs, w)
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


# ---------------------------------------------------------------- roofline
LOG_FLOPS = 36  # floating-point operations of one fast_log (fdlibm, both final forms evaluated)


def flops_per_sequence(task, sym=False, cached_weights=True):
    """Floating-point operations per visited sequence of one prefix-engine call, counted from its loops.

    Per batch node (``NG`` padded leaf groups, ``h1 = h+1`` batched rows,
    ``S`` queries, ``S`` tokens), per query ``q``:

    * forward: ``E`` (``h1·NG`` mul), ``Z`` (``h1·NG`` add), ``1/Z`` (``NG``),
      ``F`` (``2·h·S·NG`` from the digit mask, ``NG`` for the query), ``f``
      and ``f+ε`` (``2·S·NG``); per leaf ``(c, g)``: ``fast_log`` (36),
      ``lacc -= w·log`` (2), ``r = -w/x`` (1), ``r̄ += f·r`` (2);
    * backward: ``B = (r - r̄)/Z`` (``2·S·NG``) and its sums (``S·NG``),
      ``δ = E·B[s]`` (``h1·NG``), ``Dacc += δ`` and its sums (``2·h1·NG``);

    plus the leaf weights when not cached (``2·K·S²·NG``, ``+S²·NG`` with
    the reduction), the prefix state at depth ``Lh-1`` (``K + S·(T-Lh+1) + S``)
    and its closure (``S·(3 + 2·(T-Lh) + S)``), both times ``S/(S-1)`` for
    the levels above. Divided by the ``S**(h+1)`` sequences of a full batch
    node. Integer and load/store operations are not counted.
    """
    plan = single._prefix_plan(task, sym, DEFAULT_OPTIONS)
    S, T, K = task.S, task.T, task.prior.K
    h = plan.dig.shape[0]
    h1, NG = h + 1, plan.n_groups
    Lh = T - 1 - h
    per_q = (h1 * NG + h1 * NG + NG + 2 * h * S * NG + NG + 2 * S * NG + S * NG * (LOG_FLOPS + 2 + 1 + 2)
             + 2 * S * NG + S * NG + h1 * NG + 2 * h1 * NG)
    batch = S * per_q
    if not cached_weights:
        batch += 2 * K * S * S * NG + (S * S * NG if sym else 0)
    upper = S / (S - 1)
    batch += upper * (K + S * (T - Lh + 1) + S + S * (3 + 2 * (T - Lh) + S))
    return batch / S ** (h + 1)


# ---------------------------------------------------------------- sections
def bench_throughput(cases, repeats, subset, use_jax, log):
    rows = []
    for S, T in cases:
        task = make_task(S, T)
        A1, A2, A2s = make_params(task)
        eps = task.default_eps
        n = task.n_sequences
        row = {"S": S, "T": T, "K": task.prior.K, "sequences": n, "canonical": symmetry.canonical_count(S, T)}
        # popgrad, full enumeration
        f_full = lambda: pg.exact_loss_and_grad(task, A1, A2, symmetry="off")  # noqa: E731
        ref = f_full()
        f_full()  # second warm-up: the first call fills the weight cache
        row["t_full"], row["t_full_best"] = timed(f_full, repeats)
        row["t_loss_only"] = timed(lambda: pg.exact_loss(task, A1, A2, symmetry="off"), repeats)[0]
        no_cache = EngineOptions(weight_cache_bytes=0)
        f_nocache = lambda: pg.exact_loss_and_grad(task, A1, A2, symmetry="off", options=no_cache)  # noqa: E731
        f_nocache()
        row["t_full_nocache"] = timed(f_nocache, max(3, repeats // 2))[0]
        # popgrad, orbit reduction
        assert symmetry.symmetry_applies(task, A2s)
        f_sym = lambda: pg.exact_loss_and_grad(task, A1, A2s)  # noqa: E731
        red = f_sym()
        f_sym()
        row["t_sym"], row["t_sym_best"] = timed(f_sym, repeats)
        full_s = pg.exact_loss_and_grad(task, A1, A2s, symmetry="off")
        row["sym_vs_full_rel_diff"] = max(rel_diff(red.loss, full_s.loss), rel_diff(red.dA1, full_s.dA1),
                                          rel_diff(red.dA2, full_s.dA2))
        # NumPy reference (subset + extrapolation on large tasks)
        P = first_layer_attention(A1)
        m = min(n, subset)
        reference._numpy_sums(task, P, A2, eps, 0, min(m, 2**12))
        reps = 3 if m >= 2**15 else repeats
        row["t_numpy"] = timed(lambda: reference._numpy_sums(task, P, A2, eps, 0, m), reps)[0] * n / m
        row["numpy_extrapolated"] = m < n
        if m == n:
            lnp, Gnp, dA2np = reference._numpy_sums(task, P, A2, eps, 0, n)
            row["numpy_rel_diff"] = max(rel_diff(lnp, ref.loss), rel_diff(dA2np, ref.dA2))
        row["t_jax"] = row["jax_rel_diff"] = row["t_jax_compile"] = None
        rows.append(row)
        log(f"  S={S} T={T}: full {ms(row['t_full'])} ms, sym {ms(row['t_sym'])} ms, numpy {ms(row['t_numpy'])} ms")
    if use_jax:
        # In a separate process: XLA's thread pool keeps spinning after a call and would slow
        # the numba timings that follow (measured: the next parallel call 2-20x slower).
        cmd = [sys.executable, os.path.abspath(__file__), "--jax-worker", "--repeats", str(max(3, repeats // 2)),
               "--cases", *[f"{r['S']},{r['T']}" for r in rows]]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"JAX worker failed:\n{proc.stderr}")
        for row, jr in zip(rows, json.loads(proc.stdout.strip().splitlines()[-1])):
            row.update(jr)
            log(f"  S={row['S']} T={row['T']}: jax {ms(row['t_jax'])} ms {row.get('jax_note', '')}".rstrip())
    else:
        for row in rows:
            row["jax_note"] = "JAX not installed"
    return rows


def jax_worker(cases, repeats):
    """Time the JAX peer on each case (run in its own process by :func:`bench_throughput`); JSON to stdout."""
    out = []
    for S, T in cases:
        task = make_task(S, T)
        A1, A2, _ = make_params(task)
        eps = task.default_eps
        n = task.n_sequences
        row = {"t_jax": None, "jax_rel_diff": None, "t_jax_compile": None}
        nbytes = -(-n // JAX_CHUNK) * JAX_CHUNK * (4 * T + 8 * S)
        if nbytes > JAX_MAX_BYTES:
            row["jax_note"] = f"JAX skipped: {nbytes / 2**20:.0f} MB of arrays > {JAX_MAX_BYTES / 2**20:.0f} MB"
        else:
            ref = pg.exact_loss_and_grad(task, A1, A2, symmetry="off")
            peer = JaxPeer(task)
            t0 = time.perf_counter()
            lj, d1j, d2j = peer(A1, A2, eps)
            row["t_jax_compile"] = time.perf_counter() - t0
            row["jax_rel_diff"] = max(rel_diff(lj, ref.loss), rel_diff(d1j, ref.dA1), rel_diff(d2j, ref.dA2))
            if row["jax_rel_diff"] > 1e-10:
                raise RuntimeError(f"JAX and popgrad disagree at S={S} T={T}: {row['jax_rel_diff']:.3g}")
            row["t_jax"] = timed(lambda: peer(A1, A2, eps), repeats)[0]
            del peer
        out.append(row)
    print(json.dumps(out))


def bench_engines(cases, repeats, subset, log):
    rows = []
    for S, T in cases:
        task = make_task(S, T)
        A1, A2, _ = make_params(task)
        eps = task.default_eps
        n = task.n_sequences
        P = first_layer_attention(A1)
        row = {"S": S, "T": T, "sequences": n}
        pg.exact_loss_and_grad(task, A1, A2, eps, symmetry="off", engine="prefix")
        row["prefix"] = timed(lambda: pg.exact_loss_and_grad(task, A1, A2, eps, symmetry="off", engine="prefix"), repeats)[0]
        pg.exact_loss_and_grad(task, A1, A2, eps, symmetry="off", engine="direct")
        row["direct"] = timed(lambda: pg.exact_loss_and_grad(task, A1, A2, eps, symmetry="off", engine="direct"),
                              max(3, repeats // 2))[0]
        m = min(n, subset)
        blas_chunks(task, P, A2, eps, min(m, 2**12))
        row["blas"] = timed(lambda: blas_chunks(task, P, A2, eps, m), 3)[0] * n / m
        row["numpy"] = timed(lambda: reference._numpy_sums(task, P, A2, eps, 0, m), 3)[0] * n / m
        row["extrapolated"] = m < n
        rows.append(row)
        log(f"  S={S} T={T}: prefix {ms(row['prefix'])} ms, direct {ms(row['direct'])} ms, blas {ms(row['blas'])} ms")
    return rows


def bench_sampled(S, T, sizes, seeds, log):
    task = make_task(S, T)
    A1, A2, _ = make_params(task, seed=1)
    ex = pg.exact_loss_and_grad(task, A1, A2, symmetry="off")
    t_exact = timed(lambda: pg.exact_loss_and_grad(task, A1, A2, symmetry="off"), 5)[0]
    gnorm = math.sqrt(float(np.sum(ex.dA1**2) + np.sum(ex.dA2**2)))
    pg.sampled_loss_and_grad(task, A1, A2, 256, 0)  # JIT warm-up
    rows = []
    for n in sizes:
        errs, lerrs, times, t_sample, t_grad = [], [], [], [], []
        for seed in range(seeds):
            t0 = time.perf_counter()
            smp = task.sample(n, 1000 + seed)  # what sampled_loss_and_grad does, timed in two parts
            t1 = time.perf_counter()
            est = single.rows_loss_and_grad(smp.seqs, smp.targets / n, A1, A2, task.default_eps)
            t2 = time.perf_counter()
            times.append(t2 - t0)
            t_sample.append(t1 - t0)
            t_grad.append(t2 - t1)
            errs.append(math.sqrt(float(np.sum((est.dA1 - ex.dA1) ** 2) + np.sum((est.dA2 - ex.dA2) ** 2))) / gnorm)
            lerrs.append(abs(est.loss - ex.loss) / abs(ex.loss))
        rows.append({"n": n, "grad_rel_error": statistics.median(errs), "loss_rel_error": statistics.median(lerrs),
                     "time": statistics.median(times), "time_sampling": statistics.median(t_sample),
                     "time_gradient": statistics.median(t_grad)})
    # error ≈ c / sqrt(n): the batch size for a 1% gradient error
    c = statistics.median(r["grad_rel_error"] * math.sqrt(r["n"]) for r in rows)
    n_1pct = (c / 0.01) ** 2
    t_per_seq = statistics.median(r["time"] / r["n"] for r in rows if r["n"] >= 2**16)
    log(f"  exact {ms(t_exact)} ms; sampled error at 2^10: {rows[0]['grad_rel_error']:.3g}")
    return {"S": S, "T": T, "K": task.prior.K, "sequences": task.n_sequences, "t_exact": t_exact, "seeds": seeds,
            "rows": rows, "n_for_1pct_error": n_1pct, "t_for_1pct_error": n_1pct * t_per_seq}


JIT_SCRIPT = textwrap.dedent(
    """
    import json, time
    t0 = time.perf_counter()
    import numpy as np, popgrad as pg
    t1 = time.perf_counter()
    task = pg.Task(pg.chain(10), pg.dirichlet_prior(3, 1.0, 8, 0, symmetrize=True))
    rng = np.random.default_rng(0)
    A1 = rng.normal(size=(10, 10))
    out = {"import": t1 - t0}
    for name, A2, kw in (("sym", 0.5 * np.eye(3), {}), ("full", rng.normal(size=(3, 3)), {"symmetry": "off"}),
                         ("direct", 600.0 * rng.normal(size=(3, 3)), {})):
        t = time.perf_counter()
        pg.exact_loss_and_grad(task, A1, A2, **kw)
        out[name] = time.perf_counter() - t
    out["total"] = time.perf_counter() - t0
    print(json.dumps(out))
    """
)


def bench_jit(log):
    with tempfile.TemporaryDirectory(prefix="popgrad-numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        runs = {}
        for label in ("cold", "warm"):
            proc = subprocess.run([sys.executable, "-c", JIT_SCRIPT], capture_output=True, text=True, env=env,
                                  timeout=1200)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr)
            runs[label] = json.loads(proc.stdout.strip().splitlines()[-1])
            log(f"  {label}: first calls {runs[label]['sym'] + runs[label]['full'] + runs[label]['direct']:.2f} s")
    return runs


# ---------------------------------------------------------------- report
def markdown(res):
    env, peak = res["environment"], res["peak"]
    v = env["versions"]
    out = [
        "# popgrad benchmark results",
        "",
        f"{res['date']} · {env['cpu']} · {env['os_cpu_count']} cores (affinity {env['affinity_cores']}) · "
        f"numba {v['numba']} ({env['numba_threads']} threads, {env['numba_threading_layer']}) · "
        f"numpy {v['numpy']} · llvmlite {v['llvmlite']} · jax {v['jax'] or 'absent'} · python {v['python']}",
        f"Peak float64 dgemm (n={peak['n']}): {peak['all_cores']:.1f} GFLOP/s on all cores, "
        f"{peak['one_core']:.1f} on one. Timings: median of {res['repeats']} runs after warm-up, one BLAS thread.",
        "",
        "## 1. Exact loss + gradient: throughput and peers",
        "",
        "Task: chain graph, symmetrized Dirichlet(1) prior with 8 draws (K = 8·S! atoms), ε = T_eff^-1/2. "
        "*full*: every sequence (`symmetry=\"off\"`, random A1, A2); *sym*: orbit reduction "
        "(A2 = 0.8·I - 0.1·11ᵀ), one canonical sequence per orbit. seq-eq/s = S**T / time. "
        "Ratios are popgrad full (and sym) speed over the peer's.",
        "",
        "| S | T | K | S**T | canonical | full ms | full seq/s | sym ms | sym seq-eq/s | NumPy seq/s | "
        "JAX ms | JAX seq/s | full/JAX | sym/JAX | full/NumPy | JAX diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["throughput"]:
        n = r["sequences"]
        star = "*" if r["numpy_extrapolated"] else ""
        jax_rate = n / r["t_jax"] if r["t_jax"] else None
        jdiff = "—" if r["jax_rel_diff"] is None else f"{r['jax_rel_diff']:.1e}"
        out.append(
            f"| {r['S']} | {r['T']} | {r['K']} | {n:,} | {r['canonical']:,} | {ms(r['t_full'])} | {rate(n / r['t_full'])} | "
            f"{ms(r['t_sym'])} | {rate(n / r['t_sym'])} | {rate(n / r['t_numpy'])}{star} | {ms(r['t_jax'])} | "
            f"{rate(jax_rate)} | {ratio(r['t_jax'], r['t_full'])} | {ratio(r['t_jax'], r['t_sym'])} | "
            f"{ratio(r['t_numpy'], r['t_full'])} | {jdiff} |"
        )
    notes = [r.get("jax_note") for r in res["throughput"] if r.get("jax_note")]
    out += ["", "\\* timed on the first sequences and extrapolated linearly. JAX diff: largest relative "
            "difference of loss, dA1, dA2 to popgrad (must be ≤ 1e-10; the JAX peer runs in its own process "
            "after the popgrad and NumPy timings, so that XLA's spinning thread pool cannot slow them). "
            + ("; ".join(sorted(set(notes))) if notes else ""), ""]
    out += ["Without the leaf-weight cache (first call of a task, or tasks whose weights exceed "
            f"{DEFAULT_OPTIONS.weight_cache_bytes / 2**20:.0f} MB), full: "
            + ", ".join(f"S={r['S']} T={r['T']} {ms(r['t_full_nocache'])} ms" for r in res["throughput"]) + ".", ""]
    out += ["## 2. Engines (full enumeration)", "",
            "| S | T | prefix (kept) seq/s | direct seq/s | BLAS per chunk seq/s | NumPy seq/s | prefix/direct | prefix/BLAS |",
            "|---|---|---|---|---|---|---|---|"]
    for r in res["engines"]:
        n, star = r["sequences"], "*" if r["extrapolated"] else ""
        out.append(f"| {r['S']} | {r['T']} | {rate(n / r['prefix'])} | {rate(n / r['direct'])} | "
                   f"{rate(n / r['blas'])}{star} | {rate(n / r['numpy'])}{star} | {ratio(r['direct'], r['prefix'])} | "
                   f"{ratio(r['blas'], r['prefix'])} |")
    s = res["sampled"]
    out += ["", f"## 3. Exact vs sampled gradient (S={s['S']}, T={s['T']}, K={s['K']}, "
            f"{s['sequences']:,} sequences; median of {s['seeds']} seeds)", "",
            f"Exact loss + gradient: {ms(s['t_exact'])} ms, error 0 (up to rounding). A 1% gradient error needs "
            f"n ≈ {s['n_for_1pct_error']:.2g} samples (≈ {s['t_for_1pct_error']:.2g} s per estimate).", "",
            "| n | gradient rel. error | loss rel. error | time ms (sampling + gradient) | time / exact |",
            "|---|---|---|---|---|"]
    for r in s["rows"]:
        out.append(f"| 2^{int(round(math.log2(r['n'])))} | {r['grad_rel_error']:.3g} | {r['loss_rel_error']:.2g} | "
                   f"{ms(r['time'])} ({ms(r['time_sampling'])} + {ms(r['time_gradient'])}) | "
                   f"{r['time'] / s['t_exact']:.2g} |")
    j = res["jit"]
    out += ["", "## 4. JIT compile (fresh process, S=3 T=10; first call of each engine)", "",
            "| numba cache | import popgrad s | prefix, reduced s | prefix, full s | direct s |", "|---|---|---|---|---|"]
    for label in ("cold", "warm"):
        r = j[label]
        out.append(f"| {label} | {r['import']:.2f} | {r['sym']:.2f} | {r['full']:.2f} | {r['direct']:.2f} |")
    out += ["", "## 5. Roofline (prefix engine, cached weights)", "",
            "| S | T | flops / sequence | full GFLOP/s | % of peak | sym: flops / visited seq | sym GFLOP/s | % of peak |",
            "|---|---|---|---|---|---|---|---|"]
    for r in res["roofline"]:
        out.append(f"| {r['S']} | {r['T']} | {r['flops_full']:.0f} | {r['gflops_full']:.1f} | "
                   f"{100 * r['frac_full']:.1f} | {r['flops_sym']:.0f} | {r['gflops_sym']:.1f} | {100 * r['frac_sym']:.1f} |")
    out += ["", "Peak: threaded dgemm above. The engine is bound by the leaf loop (one log and two divisions per "
            "(sequence, token)) and by its small, L1-resident passes, not by memory.", ""]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases, repeats and sample sizes")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per measurement (median reported)")
    ap.add_argument("--subset", type=int, default=2**16, help="sequences for the slow peers on large tasks")
    ap.add_argument("--cases", nargs="*", metavar="S,T", help="throughput cases (default: the issue's list)")
    ap.add_argument("--engines", nargs="*", metavar="S,T", default=None,
                    help="cases of the engine comparison (default 3,10 3,12)")
    ap.add_argument("--no-jax", action="store_true", help="skip the JAX peer")
    ap.add_argument("--no-jit", action="store_true", help="skip the cold/warm compile measurement")
    ap.add_argument("--out", default=RESULTS, help="folder for latest.json and latest.md")
    ap.add_argument("--jax-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.jax_worker:
        blas_threads.set_blas_threads(1)
        return jax_worker([tuple(map(int, c.split(","))) for c in args.cases], args.repeats or 3)
    repeats = args.repeats or (3 if args.quick else 7)
    cases = QUICK_CASES if args.quick else CASES
    if args.cases:
        cases = [tuple(map(int, c.split(","))) for c in args.cases]
    engine_cases = [tuple(map(int, c.split(","))) for c in args.engines] if args.engines else [(3, 10), (3, 12)]
    big = [c for c in cases if c[0] ** c[1] > pg.DEFAULT_MAX_SEQUENCES]
    for S, T in big:
        print(f"skipping S={S} T={T}: S**T = {S**T:,} exceeds the enumeration limit {pg.DEFAULT_MAX_SEQUENCES:,}")
    cases = [c for c in cases if c not in big]
    use_jax = not args.no_jax and jax_available()
    if not args.no_jax and not use_jax:
        print("JAX is not installed: skipping the JAX peer (pip install 'popgrad[bench]' or 'jax[cpu]')")
    log = print
    t_start = time.perf_counter()
    res = {"date": time.strftime("%Y-%m-%d %H:%M"), "repeats": repeats, "environment": environment()}
    print("peak (dgemm)…")
    res["peak"] = measure_peak()
    blas_threads.set_blas_threads(1)
    time.sleep(1.0)  # let the BLAS threads of the peak measurement go idle
    print("throughput…")
    res["throughput"] = bench_throughput(cases, repeats, args.subset, use_jax, log)
    print("engines…")
    res["engines"] = bench_engines(engine_cases, repeats, args.subset, log)
    print("exact vs sampled…")
    sizes = [2**k for k in (range(10, 21, 2) if args.quick else range(10, 21))]
    res["sampled"] = bench_sampled(3, 10, sizes, 3 if args.quick else 5, log)
    print("JIT…")
    res["jit"] = {"cold": {"import": float("nan"), "sym": float("nan"), "full": float("nan"), "direct": float("nan")},
                  "warm": {"import": float("nan"), "sym": float("nan"), "full": float("nan"), "direct": float("nan")}}
    if not args.no_jit:
        res["jit"] = bench_jit(log)
    res["roofline"] = []
    for r in res["throughput"]:
        task = make_task(r["S"], r["T"])
        f_full, f_sym = flops_per_sequence(task, sym=False), flops_per_sequence(task, sym=True)
        g_full = f_full * r["sequences"] / r["t_full"] / 1e9
        g_sym = f_sym * r["canonical"] / r["t_sym"] / 1e9
        res["roofline"].append({"S": r["S"], "T": r["T"], "flops_full": f_full, "gflops_full": g_full,
                                "frac_full": g_full / res["peak"]["all_cores"], "flops_sym": f_sym,
                                "gflops_sym": g_sym, "frac_sym": g_sym / res["peak"]["all_cores"]})
    res["environment"]["numba_threading_layer"] = environment()["numba_threading_layer"]  # known once a kernel ran
    res["seconds"] = time.perf_counter() - t_start
    md = markdown(res)
    print()
    print(md)
    os.makedirs(args.out, exist_ok=True)
    _io.atomic_write_text(os.path.join(args.out, "latest.json"), json.dumps(res, indent=2, default=float) + "\n")
    _io.atomic_write_text(os.path.join(args.out, "latest.md"), md + "\n")
    print(f"\nwrote {os.path.join(args.out, 'latest.md')} and latest.json ({res['seconds']:.0f} s)")
    return res


if __name__ == "__main__":
    main()
