"""A sampled full-model step: popgrad against a jitted ``jax.grad`` on the same batch (issue 30 item 6).

One batch of ``--batch`` sequences with soft labels from the official task (S = 10, T = 20, continuous
Dirichlet(0.1) prior, stationary roots, chain graph), the CatFormer with heads ``--heads`` (default both
(1, 1) and (2, 1)) at a non-trivial point (every ``Ã`` ``0.3·N(0,1)``, ``W`` ``0.3·N(0,1)``). The JAX side is
an independent CatFormer written here from the paper's definition (the official ``catformer.py`` computes the
same function: one-hot tokens and positions, per layer ``softmax(MASK(h Ã hᵀ)) h`` concatenated to ``h``,
readout ``softmax(h_{T-1} W)``), loss ``mean_m −Σ_c y_mc log f_c``, ``jax.jit(jax.value_and_grad)`` in float64,
as ``single_parent.py``'s ``step_fn``.

Timed, interleaved (one round = each contender once, ``--reps`` rounds after a warm-up; medians, wall clock
and CPU time of the process -- all threads -- side by side):

* ``before``: the trie rows kernel (``catformer_rows_loss_and_grad``: sort, trie walk) and the NumPy GTH
  of the sampler (``_gth_batch_numpy``) -- popgrad at main 7cb802a;
* ``after``: the dense batch kernel the trainer uses (``train.catformer.batch_loss_and_grad``) and the numba
  GTH (the same sample, bit for bit);
* ``jax``: the jitted gradient on the same batch (JIT compile excluded). ``--jax-threads 1`` sets
  ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` before JAX starts
  (popgrad runs on one numba thread when ``NUMBA_NUM_THREADS=1``); the default leaves XLA its threads.

A *step* is drawing the batch (``task.sample``) plus the gradient; the ratios are ``jax gradient / popgrad``
for the gradient alone and for the whole step. Both gradients are compared (max relative difference).

    python benchmarks/bench_sampled_vs_jax.py                    # S = 10, T = 20, batch 1024, both head layouts
    python benchmarks/bench_sampled_vs_jax.py --jax-threads 1    # XLA on one thread
"""
import argparse
import os
import sys
import time

import numpy as np


def jax_catformer_grad(S, T):
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    def forward(A, W, seqs):
        h = jnp.concatenate([jax.nn.one_hot(seqs, S, dtype=jnp.float64),
                             jnp.broadcast_to(jnp.eye(T), (seqs.shape[0], T, T))], axis=-1)
        mask = jnp.tril(jnp.ones((T, T), dtype=bool))
        for Al in A:
            outs = []
            for k in range(Al.shape[0]):
                z = jnp.einsum("nia,ab,njb->nij", h, Al[k], h)
                P = jax.nn.softmax(jnp.where(mask, z, -jnp.inf), axis=-1)
                outs.append(P @ h)
            h = jnp.concatenate([h] + outs, axis=-1)
        return jax.nn.log_softmax(h[:, -1, :] @ W, axis=-1)

    def loss(A, W, seqs, y):
        return -jnp.mean(jnp.sum(y * forward(A, W, seqs), axis=-1))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--S", type=int, default=10)
    p.add_argument("--T", type=int, default=20)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--heads", default="1,1;2,1", help="head layouts, ';'-separated (default '1,1;2,1')")
    p.add_argument("--jax-threads", choices=("default", "1"), default="default")
    a = p.parse_args()
    if a.jax_threads == "1":  # before JAX is imported
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()
    import jax

    import popgrad as pg
    from popgrad.engine.catformer import catformer_rows_loss_and_grad
    from popgrad.task import dirichlet as _dirichlet
    from popgrad.train.catformer import batch_loss_and_grad

    S, T, n = a.S, a.T, a.batch
    task = pg.Task(pg.chain(T), pg.DirichletPrior(S, 0.1))
    gth_new = _dirichlet._gth_batch

    def sample(old, seed):
        _dirichlet._gth_batch = _dirichlet._gth_batch_numpy if old else gth_new
        try:
            return task.sample(n, np.random.SeedSequence([0, seed]))
        finally:
            _dirichlet._gth_batch = gth_new

    b_old, b_new = sample(True, 1), sample(False, 1)
    same_sample = bool(np.array_equal(b_old.seqs, b_new.seqs) and np.array_equal(b_old.targets, b_new.targets))
    seqs, y = b_new.seqs, b_new.targets
    print(f"S = {S}, T = {T}, batch {n}, float64, continuous Dirichlet(0.1) prior, chain; NUMBA_NUM_THREADS="
          f"{os.environ.get('NUMBA_NUM_THREADS', 'default')}, XLA threads: "
          f"{'1 (XLA_FLAGS)' if a.jax_threads == '1' else 'unrestricted'}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; medians of {a.reps} interleaved rounds")
    print(f"sampler: the numba GTH gives the NumPy GTH's sample bit for bit: {same_sample}")
    for spec in a.heads.split(";"):
        heads = tuple(int(x) for x in spec.split(","))
        model = pg.CatFormer(S, T, heads=heads)
        rng = np.random.default_rng(0)
        base = model.init(0.3, 1)
        params = pg.CatFormerParams(base.A, 0.3 * rng.normal(size=base.W.shape))

        def before():
            return catformer_rows_loss_and_grad(seqs, y / n, model, params, 0.0)

        def after():
            return batch_loss_and_grad(model, params, seqs, y, 0.0)

        g = jax_catformer_grad(S, T)
        A_j = [jax.numpy.asarray(x) for x in params.A]
        W_j = jax.numpy.asarray(params.W)

        def theirs():
            out = g(A_j, W_j, seqs, y)
            jax.block_until_ready(out)
            return out

        (Lj, (dAj, dWj)), t_compile, _ = timed(theirs)
        r_old, r_new = before(), after()
        rel = max(float(np.max(np.abs(np.asarray(x) - z)) / max(np.max(np.abs(z)), 1e-300))
                  for x, z in zip([*dAj, dWj], [*r_new[1], r_new[2]]))
        rel_old = max(float(np.max(np.abs(x - z)) / max(np.max(np.abs(z)), 1e-300))
                      for x, z in zip([*r_old.dA, r_old.dW], [*r_new[1], r_new[2]]))
        names = ("sample before", "grad before", "sample after", "grad after", "jax grad")
        fns = (lambda: sample(True, 2), before, lambda: sample(False, 2), after, theirs)
        wall = {k: [] for k in names}
        cpu = {k: [] for k in names}
        for _ in range(a.reps):
            for k, f in zip(names, fns):
                _, w_, c_ = timed(f)
                wall[k].append(w_)
                cpu[k].append(c_)
        med = {k: (float(np.median(wall[k])), float(np.median(cpu[k]))) for k in names}
        print(f"\nheads {heads}: loss popgrad {r_new[0]:.15f}, jax {float(Lj):.15f}; gradient vs jax: max relative "
              f"difference {rel:.2e}; before vs after {rel_old:.2e}; JAX compile {t_compile:.1f} s")
        print(f"  {'':15s} {'wall ms':>9s} {'cpu ms':>9s}")
        for k in names:
            print(f"  {k:15s} {med[k][0] * 1e3:9.1f} {med[k][1] * 1e3:9.1f}")
        for label, i in (("wall", 0), ("cpu", 1)):
            j = med["jax grad"][i]
            gb, ga = med["grad before"][i], med["grad after"][i]
            sb, sa = med["sample before"][i], med["sample after"][i]
            print(f"  jax / popgrad ({label}): gradient {j / gb:5.2f}x before, {j / ga:5.2f}x after; "
                  f"step (sample + gradient) {j / (sb + gb):5.2f}x before, {j / (sa + ga):5.2f}x after")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
