"""Exact Hessian-vector products (DESIGN §22): the tangent kernel against one exact gradient and JAX ``jvp(grad)``.

One run, one process; per size (two-parent graph, the symmetrised tensor Dirichlet(0.1) prior with 16 atoms,
CatFormer heads (2, 1), point ``init(0.1, 0)``, direction ``init(1.0, 1)``), best of ``--reps``:

* ``gradient``: ``catformer_loss_and_grad`` (the numba trie engine);
* ``HVP tangent``: ``catformer_hvp`` (the default: the forward-over-reverse numba kernel over every sequence;
  the enumeration's rows are filled once and cached, as in a Lanczos run);
* ``HVP complex step``: ``catformer_hvp(method="complex_step")``, the NumPy reference (the product before
  the kernel; ``--no-complex`` skips it);
* ``JAX``: ``jax.jit(jax.jvp(jax.grad(loss)))`` of an independent CatFormer written here (the paper's
  definition, as ``bench_sampled_vs_jax.py``) on the same enumeration and weights, float64, JIT compile
  excluded, and JAX's own gradient; only where ``S**T <= --jax-max`` (memory: one dense batch).

Times are the process's CPU time (best of ``--reps``), the wall clock beside the spectrum.

Ratios: HVP / gradient (popgrad's), and JAX HVP / popgrad's tangent HVP. The products are compared (max
relative difference, tangent against the complex step and against JAX). ``--spectrum`` also times a
6-eigenvalue head-antisymmetric spectrum (``hessian_spectrum(k=3, which="both")``) at the last size.

Run: ``PYTHONPATH=. NUMBA_NUM_THREADS=1 XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1" python benchmarks/bench_hvp.py [--sizes 2x10,3x7,2x14,2x16] [--spectrum]``.
No timing assertions.
"""
import argparse
import time

import numpy as np


def best_of(fn, n=3):
    """Best of ``n`` by the process's CPU time (all its threads): on a loaded machine the wall clock mostly
    measures the other processes; with one numba thread and XLA on one thread it is each side's compute."""
    best, out = float("inf"), None
    for _ in range(n):
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best, out


def jax_hvp(model, seqs, w):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    S, T = model.S, model.T
    x0 = np.zeros((len(seqs), T, S + T))
    x0[np.arange(len(seqs))[:, None], np.arange(T), seqs] = 1.0
    x0[:, np.arange(T), S + np.arange(T)] = 1.0
    x0, wj = jnp.asarray(x0), jnp.asarray(w)
    mask = jnp.tril(jnp.ones((T, T), dtype=bool))

    def loss(A, W):
        h = x0
        for Al in A:
            outs = []
            for k in range(Al.shape[0]):
                z = jnp.einsum("nia,ab,njb->nij", h, Al[k], h)
                P = jax.nn.softmax(jnp.where(mask, z, -jnp.inf), axis=-1)
                outs.append(P @ h)
            h = jnp.concatenate([h] + outs, axis=-1)
        return -jnp.sum(wj * jax.nn.log_softmax(h[:, -1, :] @ W, axis=-1))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    hvp = jax.jit(lambda A, W, VA, VW: jax.jvp(lambda a, b: jax.grad(loss, argnums=(0, 1))(a, b), (A, W),
                                                (VA, VW))[1])
    return grad, hvp


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2x10,3x7,2x14,2x16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--jax-max", type=int, default=2**14)
    ap.add_argument("--no-complex", action="store_true")
    ap.add_argument("--complex-max", type=int, default=2**16)
    ap.add_argument("--spectrum", action="store_true")
    a = ap.parse_args()
    import popgrad as pg
    from popgrad.engine.hvp import flatten_params

    print("| S | T | parameters | gradient ms | HVP tangent ms | HVP / gradient | HVP complex step ms | complex / "
          "tangent | JAX gradient ms | JAX HVP ms | JAX HVP / tangent HVP | max rel. diff (complex, JAX) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    last = None
    for size in a.sizes.split(","):
        S, T = (int(x) for x in size.split("x"))
        task = pg.MultiParentTask(pg.two_parent(T), pg.dirichlet_tensor_prior(S, 2, 0.1, 16, seed=0,
                                                                              symmetrize="full"))
        model = pg.CatFormer(S, T, heads=(2, 1))
        p, v = model.init(0.1, 0), model.init(1.0, 1)
        pg.catformer_loss_and_grad(task, model, p)
        pg.catformer_hvp(task, model, p, v)
        g, _ = best_of(lambda: pg.catformer_loss_and_grad(task, model, p), a.reps)
        h, hv = best_of(lambda: pg.catformer_hvp(task, model, p, v), a.reps)
        hv = flatten_params(hv)
        n = hv.size
        cs_txt, cs_ratio, d_cs = "—", "—", "—"
        if not a.no_complex and task.n_sequences <= a.complex_max:
            c, hc = best_of(lambda: pg.catformer_hvp(task, model, p, v, method="complex_step"),
                            1 if task.n_sequences > 2**12 else a.reps)
            cs_txt, cs_ratio, d_cs = f"{c * 1e3:.1f}", f"{c / h:.1f}", f"{rel(hv, flatten_params(hc)):.1e}"
        jg_txt, jh_txt, j_ratio, d_j = "—", "—", "—", "—"
        if task.n_sequences <= a.jax_max:
            import jax

            seqs, w = next(task.enumerate(chunk_size=task.n_sequences))
            jgrad, jhvp = jax_hvp(model, seqs, w)
            A, W = [np.asarray(x) for x in p.A], np.asarray(p.W)
            VA, VW = [np.asarray(x) for x in v.A], np.asarray(v.W)
            jgrad(A, W)[1].block_until_ready()
            jhvp(A, W, VA, VW)[1].block_until_ready()
            jg, _ = best_of(lambda: jgrad(A, W)[1].block_until_ready(), a.reps)
            jh, out = best_of(lambda: jax.block_until_ready(jhvp(A, W, VA, VW)), a.reps)
            jflat = flatten_params(pg.CatFormerParams([np.asarray(x) for x in out[0]], np.asarray(out[1])))
            jg_txt, jh_txt, j_ratio, d_j = f"{jg * 1e3:.1f}", f"{jh * 1e3:.1f}", f"{jh / h:.1f}", f"{rel(hv, jflat):.1e}"
        print(f"| {S} | {T} | {n} | {g * 1e3:.1f} | {h * 1e3:.1f} | {h / g:.1f} | {cs_txt} | {cs_ratio} | {jg_txt} | "
              f"{jh_txt} | {j_ratio} | {d_cs}, {d_j} |", flush=True)
        last = (task, model, p)
    if a.spectrum and last is not None:
        task, model, p = last
        t, c = time.perf_counter(), time.process_time()
        sp = pg.hessian_spectrum(task, model, p, k=3, which="both", subspace="head_antisymmetric")
        dt, dc = time.perf_counter() - t, time.process_time() - c
        print(f"\nhead-antisymmetric spectrum, 6 eigenvalues, S = {model.S}, T = {model.T}: {dc:.1f} s CPU "
              f"({dt:.1f} s wall), "
              f"{sp.n_products} products ({dc / sp.n_products * 1e3:.0f} ms CPU each), dim {sp.dim}, "
              f"values {np.array2string(sp.values, precision=4)}", flush=True)


if __name__ == "__main__":
    main()
