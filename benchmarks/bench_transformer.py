"""popgrad.Transformer against the official JAX code of ``tf_with_mlp.ipynb`` (two ratios, measured in one run).

1. **A sampled training step at the official size** (``--S 10 --T 20 --batch 1024``): popgrad's step is
   ``task.sample`` (the official task: chain, continuous Dirichlet(α = 0.1) prior, stationary root, uniform
   query, soft label ``π(· | query)``) + ``Transformer.loss_and_grad_rows`` (float64) + the AdamW update
   (``popgrad.train.optim.adamw``, optax semantics). The official step is the notebook's ``step_fn`` verbatim
   (``jit`` of ``value_and_grad(loss_fn)`` + ``optax.adamw(cosine_decay_schedule(0.01, 2^12),
   weight_decay=2e-4)``) on the official ``Transformer`` class, plus its sampler: the notebook draws
   ``epoch_len · batch = 2^20`` sequences per ``sample_fn`` call (``vmap(problem.sample)``, jitted); its
   per-step share is measured at an epoch of ``--sample-epoch`` sequences (default 2^14; the cost is linear in
   the count) and scaled to one batch. JAX runs in float64 (``--jax-dtype float64``, like for like) or in
   float32 (``--jax-dtype float32``: the notebook's own dtype, JAX's default).
2. **The generic exact engine at S = 3, T = 10** (``--exact-S``, ``--exact-T``): ``popgrad.loss_and_grad(task,
   Transformer, params)`` on the chain with a finite prior (every sequence weighted exactly) against
   ``jax.jit(jax.value_and_grad)`` of the official ``Transformer`` on the same enumeration and weights
   (the weights computed once, outside the timing). Skipped with a note while ``popgrad.loss_and_grad``
   does not exist.

The official source is read from ``tests/model/test_transformer_official.py`` (stored there as data). Timings are
medians of ``--reps`` interleaved rounds after a warm-up (JIT compile excluded), wall clock and process CPU
time; one BLAS thread for NumPy (``--blas-threads``; OpenBLAS threads spinning on a loaded 2-core machine made
NumPy 30x slower), XLA with its default threads unless ``--jax-threads 1``. Prints ``jax / popgrad`` ratios
(above 1: popgrad is faster) and the largest relative difference of the two gradients.

    python benchmarks/bench_transformer.py
    python benchmarks/bench_transformer.py --jax-dtype float32 --jax-threads 1
"""
import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def official_modules():
    spec = importlib.util.spec_from_file_location("_tf_official_data",
                                                  ROOT / "tests" / "model" / "test_transformer_official.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def rounds(fns, reps):
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            _, w_, c_ = timed(f)
            wall[k].append(w_)
            cpu[k].append(c_)
    return {k: (float(np.median(wall[k])), float(np.median(cpu[k]))) for k in fns}


def show(med, pairs):
    print(f"  {'':28s} {'wall ms':>9s} {'cpu ms':>9s}")
    for k, (w_, c_) in med.items():
        print(f"  {k:28s} {w_ * 1e3:9.2f} {c_ * 1e3:9.2f}")
    for label, num, den in pairs:
        print(f"  {label}: wall {sum(med[k][0] for k in num) / sum(med[k][0] for k in den):5.2f}x, "
              f"cpu {sum(med[k][1] for k in num) / sum(med[k][1] for k in den):5.2f}x")


def rel_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(a[k]) - b[k])) / max(np.max(np.abs(b[k])), 1e-300)) for k in b)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--S", type=int, default=10)
    p.add_argument("--T", type=int, default=20)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--sample-epoch", type=int, default=2**14)
    p.add_argument("--exact-S", type=int, default=3)
    p.add_argument("--exact-T", type=int, default=10)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--jax-dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--jax-threads", choices=("default", "1"), default="default")
    p.add_argument("--blas-threads", type=int, default=1)
    p.add_argument("--skip-exact", action="store_true")
    a = p.parse_args()
    if a.jax_threads == "1":  # before JAX is imported
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from blas_threads import set_blas_threads

    set_blas_threads(a.blas_threads)
    data = official_modules()
    cf, problems = data.load_official()
    import jax
    import jax.numpy as jnp
    import optax
    from jax import jit, vmap
    from jax import random as jr

    jax.config.update("jax_enable_x64", a.jax_dtype == "float64")
    import popgrad as pg
    from popgrad.train import optim

    S, T, n = a.S, a.T, a.batch
    print(f"popgrad.Transformer vs the official tf_with_mlp.ipynb code; JAX {jax.__version__} in {a.jax_dtype}, "
          f"XLA threads {'1' if a.jax_threads == '1' else 'default'}, NumPy float64 with {a.blas_threads} BLAS "
          f"thread(s); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; medians of {a.reps} interleaved rounds")

    # ------------------------------------------------------------------ 1. sampled step, official size
    model = pg.Transformer(S, T, heads=(1, 1))
    task = pg.Task(pg.chain(T), pg.DirichletPrior(S, 0.1))
    rng = np.random.default_rng(0)
    params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in model.init(1.0, 0).items()}
    opt = optim.adamw(optim.cosine_decay_schedule(0.01, 2**12), weight_decay=2e-4)
    state = {"p": params, "s": opt.init(params), "t": 0}

    def ours_sample():
        state["t"] += 1
        return task.sample(n, np.random.SeedSequence([0, state["t"]]))

    batch = ours_sample()

    def ours_grad():
        return model.loss_and_grad_rows(state["p"], batch.seqs, batch.targets / n, 0.0)

    def ours_step():
        b = ours_sample()
        _, g = model.loss_and_grad_rows(state["p"], b.seqs, b.targets / n, 0.0)
        upd, state["s"] = opt.update(g, state["s"], state["p"])
        state["p"] = optim.apply_updates(state["p"], upd)

    dag = jnp.arange(T - 1) - 1
    problem = problems.InContextTree(vocab_size=S, dag=dag, alpha=0.1)

    def criterion(f, y):
        _criterion = lambda f, y: -jnp.log(f) @ y
        for _ in range(y.ndim - 1):
            _criterion = vmap(_criterion)
        return _criterion(f, y).mean()

    criterion = jit(criterion)

    @jit
    def loss_fn(model, batch):
        x, y = batch
        return criterion(model(x), y)

    sched = optax.cosine_decay_schedule(0.01, 2**12)
    jopt = optax.adamw(sched, weight_decay=2e-4)

    @jit
    def step_fn(model, batch, opt_state):
        loss, g = jax.value_and_grad(loss_fn)(model, batch)
        updates, opt_state = jopt.update(g, opt_state, model)
        model = optax.apply_updates(model, updates)
        return model, opt_state, loss

    epoch = a.sample_epoch
    sample_fn = jit(lambda k: vmap(problem.sample)(jr.split(k, epoch)))
    jmodel = data.to_official(cf, model, params)
    jstate = {"m": jmodel, "s": jopt.init(jmodel), "k": jr.PRNGKey(1)}
    jbatch = (jnp.asarray(batch.seqs), jnp.asarray(batch.targets))

    def theirs_sample_epoch():
        jstate["k"], sub = jr.split(jstate["k"])
        out = sample_fn(sub)
        jax.block_until_ready(out)
        return out

    def theirs_step():
        m, s, loss = step_fn(jstate["m"], jbatch, jstate["s"])
        jax.block_until_ready(loss)
        jstate["m"], jstate["s"] = m, s

    grad_j = jit(jax.value_and_grad(loss_fn))
    (Lj, gj), _, _ = timed(lambda: jax.block_until_ready(grad_j(jmodel, jbatch)))
    L, g = ours_grad()
    print(f"\n1. sampled step, S = {S}, T = {T}, batch {n}: loss popgrad {L:.12f}, jax {float(Lj):.12f}; gradient "
          f"max relative difference {rel_diff(data.from_official(model, gj), g):.1e} (JAX in {a.jax_dtype})")
    for f in (theirs_sample_epoch, theirs_step, ours_step):  # warm-up (JIT compile)
        f()
    med = rounds({"popgrad sample (batch)": ours_sample, "popgrad gradient": ours_grad,
                  "popgrad step (sample+grad+adamw)": ours_step,
                  f"jax sample ({epoch} seqs)": theirs_sample_epoch, "jax step_fn (grad+adamw)": theirs_step},
                 a.reps)
    share = n / epoch
    med["jax sample, per batch"] = tuple(share * x for x in med[f"jax sample ({epoch} seqs)"])
    show(med, [("jax / popgrad, gradient step alone (step_fn vs grad+adamw)",
                ["jax step_fn (grad+adamw)"], ["popgrad step (sample+grad+adamw)"]),
               ("jax / popgrad, whole step (sampler included)",
                ["jax step_fn (grad+adamw)", "jax sample, per batch"], ["popgrad step (sample+grad+adamw)"])])
    sys.stdout.flush()

    # ------------------------------------------------------------------ 2. generic exact engine
    if a.skip_exact:
        return
    print(f"\n2. exact loss and gradient, S = {a.exact_S}, T = {a.exact_T}, chain, finite prior:")
    if not hasattr(pg, "loss_and_grad"):
        print("  popgrad.loss_and_grad does not exist in this tree: skipped")
        return
    Se, Te = a.exact_S, a.exact_T
    m2 = pg.Transformer(Se, Te)
    task2 = pg.Task(pg.chain(Te), pg.dirichlet_prior(Se, 0.1, 4, seed=0))
    p2 = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in m2.init(1.0, 1).items()}
    eps = 0.0
    res = pg.loss_and_grad(task2, m2, p2, eps=eps)
    seqs, w = exact_rows(task2)
    jseqs, jw = jnp.asarray(seqs), jnp.asarray(w)

    def jloss(off):
        return -jnp.sum(jw * jnp.log(off(jseqs) + eps))

    gexact = jit(jax.value_and_grad(jloss))
    j2 = data.to_official(cf, m2, p2)
    (Lx, gx), _, _ = timed(lambda: jax.block_until_ready(gexact(j2)))
    print(f"  {len(seqs)} sequences; loss popgrad {float(res.loss):.12f}, jax {float(Lx):.12f}; gradient max "
          f"relative difference {rel_diff(data.from_official(m2, gx), dict(res.grads)):.1e}")
    med = rounds({"popgrad.loss_and_grad": lambda: pg.loss_and_grad(task2, m2, p2, eps=eps),
                  "jax value_and_grad (jit)": lambda: jax.block_until_ready(gexact(j2))}, a.reps)
    show(med, [("jax / popgrad", ["jax value_and_grad (jit)"], ["popgrad.loss_and_grad"])])


def exact_rows(task):
    """Every sequence with its exact weights times targets (the rows the generic engine sums), as arrays."""
    from popgrad.engine.generic import exact_rows as rows

    return rows(task, 0, task.n_sequences)


if __name__ == "__main__":
    main()
