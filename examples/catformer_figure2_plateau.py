"""Full model: what is Figure 2's chain plateau?
=============================================

Figure 2's chain run (``catformer_figure2_official.py``: S = 10, T = 20, the official continuous
Dirichlet(0.1) prior, heads (1, 1) from zero, SGD lr 1 cosine over 2^17 steps, batches of 1024) leaves ln 10
within 5000 steps and ends 0.033 nats above the official ``bayes`` line with 0.74 of its positional attention
on the parent, while the icl graph's run reaches 0.99. This script starts from that run's committed final
parameters (``docs/results/figure2_official/chain.ckpt.npz``) and measures, on one held-out sample (common
random numbers: every loss difference is paired, ± its SE):

1. **the sharpening ray**: the positional block of ``Ã^(1)`` scaled by ``c`` (the softmax's temperature),
   everything else kept: is the run's point a minimum along it, and how steep is the loss there;
2. **a parent pointer added**: ``β`` added to the positional entry ``(i, p(i))`` of every row, the rest kept
   (the layer-1 part of Knowl 8's construction on top of what was learned);
3. **the run continued** for ``--steps`` more steps from its final parameters with fresh batches of 1024:
   SGD at constant lr 1 (the recipe's peak) and Adam at constant lr 1e-3 and 1e-2 (a preconditioned step):
   can a step of either kind leave the point, and how far;
4. **the sharpened point continued**: the same from the end point with its positional block scaled by 3
   (0.997 of the attention on the parent): does training from a sharp layer 1 find a lower loss, or return;
5. **the recipe exactly at a size that enumerates** (``--small-S 3 --small-T 8``, uniform roots so that the
   weights are exact): the exact loss against the Bayes loss and the edges-only estimator, the exact
   loss along the sharpening ray of part 1, and the run continued exactly with Adam (lr 1e-2, constant).

Reading: a loss that falls along (1) or (2) and under (3) says the point is not the architecture's floor
at this size but a region the recipe's SGD does not leave; a loss that rises along every probe and does not
move under (3) says it is a minimum of the sampled objective, and (4) says whether a sharper layer 1 leads
anywhere lower.

Results: ``plateau.json``, ``plateau.md`` and ``plateau.png`` in ``--out``. The committed result (``--steps 4096``,
about 10 minutes of CPU) is ``docs/results/figure2_plateau/``, read on the full model's training page. Below, the
gallery runs the ``--quick`` smoke version (S = 3, T = 6 after 8 sampled steps, then S = 2, T = 5 exactly): it
shows that the script runs; its numbers are not the result.
"""
import os
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure

from _common import parser
from _official import _est as est, model_predictions, read_checkpoint, write_json

try:
    HERE = os.path.dirname(os.path.abspath(__file__))
except NameError:  # sphinx-gallery runs the script's blocks without __file__, in the examples folder
    HERE = os.getcwd()
CKPT = os.path.join(HERE, "..", "docs", "results", "figure2_official", "chain.ckpt.npz")


def args_of():
    p = parser(__doc__, "examples_out/catformer_figure2_plateau", quick_help="S = 3, T = 6 from zero, 8 steps")
    p.add_argument("--steps", type=int, default=2048, help="steps of each continued run")
    p.add_argument("--eval-n", type=int, default=2**15)
    p.add_argument("--checkpoint", default=CKPT)
    p.add_argument("--small-S", type=int, default=3)
    p.add_argument("--small-T", type=int, default=8)
    p.add_argument("--small-steps", type=int, default=2**13)
    a = p.parse_args()
    if a.quick:
        a.steps, a.eval_n, a.small_S, a.small_T, a.small_steps = 8, 512, 2, 5, 16
    return a


def losses(task, model, params, smp):
    """Per-row cross entropies of ``params`` on the held-out sample."""
    f = model_predictions(model, params, smp.seqs)
    y = smp.targets
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(y > 0, y * np.log(f), 0.0), axis=1)


def with_positional(params, S, fn):
    A1 = params.A[0].copy()
    A1[:, S:, S:] = fn(A1[:, S:, S:])
    return pg.CatFormerParams([A1] + [a.copy() for a in params.A[1:]], params.W.copy())


def attention_to_parent(params, task, S):
    T = task.T
    z = np.where(np.tri(T, dtype=bool), params.A[0][0, S:, S:], -np.inf)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    P = z / z.sum(axis=1, keepdims=True)
    edges = [i for i in task.graph.non_roots if i < T - 1]
    return float(np.mean([P[i, task.graph.parents[i]] for i in edges]))


def main():
    a = args_of()
    os.makedirs(a.out, exist_ok=True)
    if a.quick:
        S, T = 3, 6
        par = pg.official_dags("figure2")[0].parents
        task = pg.Task(pg.CausalGraph(list(par[: T - 1]) + [-1]), pg.DirichletPrior(S, 0.1))
        model = pg.CatFormer(S, T, heads=(1, 1))
        params = pg.train_catformer(task, model, 8, gradient="sampled", batch_size=64, optimizer="sgd",
                                    lr=1.0, init="zero").final
        t0_step = 8
    else:
        S, T = 10, 20
        par = pg.official_dags("figure2")[0].parents
        task = pg.Task(pg.CausalGraph(list(par[: T - 1]) + [-1]), pg.DirichletPrior(S, 0.1))
        model = pg.CatFormer(S, T, heads=(1, 1))
        t0_step, params, _, _ = read_checkpoint(model, a.checkpoint)
    smp = task.sample(a.eval_n, 778)
    base = losses(task, model, params, smp)
    out = {"graph": task.graph.to_string(), "S": S, "T": T, "from_step": int(t0_step), "eval_n": a.eval_n,
           "loss": est(base), "attention_to_parent": attention_to_parent(params, task, S)}

    ray = []
    for c in (0.5, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0, 3.0):
        p = with_positional(params, S, lambda B, c=c: c * B)
        lc = losses(task, model, p, smp)
        ray.append({"c": c, "loss": est(lc), "minus_start": est(lc - base),
                    "attention_to_parent": attention_to_parent(p, task, S)})
    out["sharpening_ray"] = ray

    pointer = []
    idx = [(S + i, S + task.graph.parents[i]) for i in task.graph.non_roots if i < T - 1]
    for beta in (0.5, 1.0, 2.0, 4.0, 8.0):
        def add(B, beta=beta):
            B = B.copy()
            for r, k in idx:
                B[:, r - S, k - S] += beta
            return B
        p = with_positional(params, S, add)
        lp = losses(task, model, p, smp)
        pointer.append({"beta": beta, "loss": est(lp), "minus_start": est(lp - base),
                        "attention_to_parent": attention_to_parent(p, task, S)})
    out["parent_pointer"] = pointer

    runs = []
    sharp = with_positional(params, S, lambda B: 3.0 * B)
    for start, name, kw in (("end", "sgd_lr1_constant", dict(optimizer="sgd", lr=1.0)),
                            ("end", "adam_lr1e-3_constant", dict(optimizer="adam", lr=1e-3)),
                            ("end", "adam_lr1e-2_constant", dict(optimizer="adam", lr=1e-2)),
                            ("sharpened c = 3", "sgd_lr1_constant", dict(optimizer="sgd", lr=1.0)),
                            ("sharpened c = 3", "adam_lr1e-3_constant", dict(optimizer="adam", lr=1e-3))):
        t0 = time.process_time()
        init = params if start == "end" else sharp
        traj = pg.train_catformer(task, model, a.steps, init=init, gradient="sampled", batch_size=1024,
                                  sample_seed=4242, lr_schedule="constant", record_every=max(1, a.steps // 8),
                                  **kw)
        lr_ = losses(task, model, traj.final, smp)
        runs.append({"run": name, "from": start, "steps": a.steps, "loss": est(lr_), "minus_start": est(lr_ - base),
                     "attention_to_parent": attention_to_parent(traj.final, task, S),
                     "recorded_batch_loss": [float(x) for x in traj.loss], "recorded_step": [int(s) for s in traj.step],
                     "cpu_seconds": time.process_time() - t0})
    out["continued"] = runs
    out["exact_small"] = exact_small(a)
    write_json(os.path.join(a.out, "plateau.json"), out)

    def f(d, signed=False):
        return f"{d['value']:{'+' if signed else ''}.4f} ± {d['se']:.4f}"

    lines = [f"Start: step {t0_step} of the chain run, held-out loss {f(out['loss'])} nats "
             f"({a.eval_n} sequences), positional attention to the parent {out['attention_to_parent']:.3f}.", "",
             "| probe | setting | loss (nats) | minus the start (paired) | attention to parent |", "|---|---|---|---|---|"]
    for r in ray:
        lines.append(f"| sharpening ray | c = {r['c']} | {f(r['loss'])} | {f(r['minus_start'], True)} | "
                     f"{r['attention_to_parent']:.3f} |")
    for r in pointer:
        lines.append(f"| parent pointer | β = {r['beta']} | {f(r['loss'])} | {f(r['minus_start'], True)} | "
                     f"{r['attention_to_parent']:.3f} |")
    for r in runs:
        lines.append(f"| continued {r['steps']} steps from the {r['from']} | {r['run']} | {f(r['loss'])} | {f(r['minus_start'], True)} | "
                     f"{r['attention_to_parent']:.3f} |")
    e = out["exact_small"]
    lines += ["", f"Exact, S = {e['S']}, T = {e['T']} (chain, {e['prior']}), the recipe for {e['steps']} steps: "
              f"loss {e['loss']:.4f} nats, Bayes {e['bayes']:.4f}, edges-only count estimator "
              f"{e['count_estimator_edges_only']:.4f}, attention to the parent {e['attention_to_parent']:.3f}; "
              "the exact loss along the sharpening ray minus the end point: "
              + ", ".join(f"c = {r['c']}: {r['loss'] - e['loss']:+.4f} (attention {r['attention_to_parent']:.3f})"
                          for r in e["sharpening_ray"]) + "; continued exactly with Adam at constant lr 1e-2 for "
              f"{e['continued_adam_lr1e-2']['steps']} steps: loss {e['continued_adam_lr1e-2']['loss']:.4f}, attention "
              f"to the parent {e['continued_adam_lr1e-2']['attention_to_parent']:.3f}."]
    from popgrad._io import atomic_write_text

    atomic_write_text(os.path.join(a.out, "plateau.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    figure(out, os.path.join(a.out, "plateau.png"))
    print(f"written: {os.path.join(a.out, 'plateau.md')}")


def exact_small(a):
    """Part 5: the recipe (SGD lr 1 cosine, zero start, heads (1, 1)) on the chain at ``--small-S``,
    ``--small-T`` with the exact population gradient, uniform roots (exact weights), then the sharpening ray
    on the exact loss: the same question with no sampling noise anywhere."""
    S, T = a.small_S, a.small_T
    par = pg.official_dags("figure2")[0].parents
    task = pg.Task(pg.CausalGraph(list(par[: T - 1]) + [-1]), pg.DirichletPrior(S, 0.1, roots="uniform"))
    model = pg.CatFormer(S, T, heads=(1, 1))
    t0 = time.process_time()
    traj = pg.train_catformer(task, model, a.small_steps, gradient="exact", optimizer="sgd", lr=1.0,
                              lr_schedule="cosine", init="zero", record_every=max(1, a.small_steps // 16))
    params = traj.final
    base = pg.catformer_loss(task, model, params)
    ray = [{"c": c, "loss": pg.catformer_loss(task, model, with_positional(params, S, lambda B, c=c: c * B)),
            "attention_to_parent": attention_to_parent(with_positional(params, S, lambda B, c=c: c * B), task, S)}
           for c in (0.5, 0.9, 1.1, 1.5, 2.0, 3.0)]
    cont = pg.train_catformer(task, model, a.small_steps, gradient="exact", optimizer="adam", lr=1e-2,
                              lr_schedule="constant", init=params, record_every=max(1, a.small_steps // 16))
    return {"S": S, "T": T, "prior": "DirichletPrior(S, 0.1, roots='uniform')", "steps": a.small_steps,
            "continued_adam_lr1e-2": {"steps": a.small_steps, "loss": float(cont.loss[-1]),
                                      "attention_to_parent": attention_to_parent(cont.final, task, S)},
            "loss": float(base), "bayes": float(pg.bayes_loss(task)),
            "count_estimator_edges_only": float(pg.official_bayes_loss(task)),
            "attention_to_parent": attention_to_parent(params, task, S), "sharpening_ray": ray,
            "recorded_step": [int(x) for x in traj.step], "recorded_loss": [float(x) for x in traj.loss],
            "cpu_seconds": time.process_time() - t0}


def figure(out, path):
    fig, axs = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, key, x, label in ((axs[0], "sharpening_ray", "c", "scale c of the positional block of Ã1"),
                              (axs[1], "parent_pointer", "beta", "β added on every row's parent entry")):
        rows = out[key]
        xs = [1.0 if x == "c" else 0.0] + [r[x] for r in rows]
        ys = [0.0] + [r["minus_start"]["value"] for r in rows]
        es = [0.0] + [r["minus_start"]["se"] for r in rows]
        order = np.argsort(xs)
        ax.errorbar(np.array(xs)[order], np.array(ys)[order], yerr=2 * np.array(es)[order], marker="o")
        ax.axhline(0.0, color="gray", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("held-out loss − start (nats, ± 2 SE)")
    for r in out["continued"]:
        axs[2].plot(np.array(r["recorded_step"]), r["recorded_batch_loss"], marker=".",
                    label=f"{r['run']} from the {r['from']}")
    axs[2].axhline(out["loss"]["value"], color="gray", lw=0.8, label="start (held-out)")
    axs[2].set_xlabel("steps after the start")
    axs[2].set_ylabel("batch loss (nats)")
    axs[2].legend(fontsize=7)
    fig.suptitle(f"Figure 2's chain, from step {out['from_step']}: probes of the end point", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


if __name__ == "__main__":
    main()
