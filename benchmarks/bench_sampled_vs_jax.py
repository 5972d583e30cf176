"""A sampled full-model gradient step: popgrad's row kernel against a jitted ``jax.grad`` (issue 30 item 6).

One batch of ``--batch`` sequences with soft labels from the official task (S = 10, T = 20, continuous
Dirichlet(0.1) prior, chain graph), the CatFormer with heads (1, 1) at a non-trivial point (every ``Ã``
``0.3·N(0,1)``, ``W`` ``0.3·N(0,1)``). The JAX side is an independent CatFormer written here from the
paper's definition (the official ``catformer.py`` computes the same function: one-hot tokens and
positions, per layer ``softmax(MASK(h Ã hᵀ)) h`` concatenated to ``h``, readout ``softmax(h_{T-1} W)``),
loss ``mean_m −Σ_c y_mc log f_c``, ``jax.jit(jax.value_and_grad)`` in float64, as ``single_parent.py``'s
``step_fn``. Both gradients are compared (max relative difference) and timed on the same batch: the
median of ``--reps`` calls after a warm-up (JIT compile excluded). Prints the figures; one run.

    python benchmarks/bench_sampled_vs_jax.py            # S = 10, T = 20, batch 1024
"""
import argparse
import os
import time

import numpy as np

import popgrad as pg
from popgrad.train.catformer import batch_loss_and_grad


def jax_catformer_grad(S, T, heads):
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


def median_time(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--S", type=int, default=10)
    p.add_argument("--T", type=int, default=20)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    S, T = a.S, a.T
    task = pg.Task(pg.chain(T), pg.DirichletPrior(S, 0.1))
    model = pg.CatFormer(S, T, heads=(1, 1))
    rng = np.random.default_rng(0)
    base = model.init(0.3, 1)
    params = pg.CatFormerParams(base.A, 0.3 * rng.normal(size=base.W.shape))
    batch = task.sample(a.batch, 7)
    seqs, y = batch.seqs, batch.targets

    ours = lambda: batch_loss_and_grad(model, params, seqs, y, 0.0)  # noqa: E731
    L0, dA0, dW0, _ = ours()
    t_ours = median_time(ours, a.reps)
    t_sample = median_time(lambda: task.sample(a.batch, 8), a.reps)

    import jax

    g = jax_catformer_grad(S, T, model.heads)
    A_j = [jax.numpy.asarray(x) for x in params.A]
    W_j = jax.numpy.asarray(params.W)
    t0 = time.perf_counter()
    (Lj, (dAj, dWj)) = g(A_j, W_j, seqs, y)
    jax.block_until_ready(dWj)
    t_compile = time.perf_counter() - t0

    def theirs():
        out = g(A_j, W_j, seqs, y)
        jax.block_until_ready(out)
    t_jax = median_time(theirs, a.reps)
    rel = max(float(np.max(np.abs(np.asarray(x) - y_)) / max(np.max(np.abs(y_)), 1e-300))
              for x, y_ in zip([*dAj, dWj], [*dA0, dW0]))
    print(f"S = {S}, T = {T}, heads (1, 1), batch {a.batch}, float64, threads: NUMBA_NUM_THREADS="
          f"{os.environ.get('NUMBA_NUM_THREADS', 'default')}, load {os.getloadavg()[0]:.1f}")
    print(f"loss: popgrad {L0:.15f}, jax {float(Lj):.15f}; gradients: max relative difference {rel:.2e}")
    print(f"popgrad gradient (row kernel): {t_ours * 1e3:.1f} ms (median of {a.reps}); sampling the batch "
          f"{t_sample * 1e3:.1f} ms")
    print(f"jax.jit(jax.value_and_grad): {t_jax * 1e3:.1f} ms (median of {a.reps}; compile {t_compile:.1f} s)")
    print(f"ratio jax / popgrad (gradient): {t_jax / t_ours:.2f}x; with popgrad's sampling: "
          f"{t_jax / (t_ours + t_sample):.2f}x")


if __name__ == "__main__":
    main()
