"""Full model: Figure 9 at the official size
=========================================

Figure 9 at the official size: S = 3, T = 20, 20 graphs, sampled SGD, attention to the parent per position.

The official ``many_graphs.ipynb``: 20 graphs of ``get_random_DAG(p=0.5)`` (each position 1..T-2 has a
parent with probability 1/2, uniform over the earlier positions: ``popgrad.random_tree(T, seed=g,
root_prob=0.5)``), the continuous Dirichlet(α = 0.1) prior with stationary roots (``InContextTree``), the
full model with heads (1, 1) from zero, ``optax.sgd(1.0)`` (constant lr; the notebook's ``wd = 2e-4`` is
defined but not used), 2^14 steps of fresh batches of 1024, and the metric
``softmax(MASK(Ã^(1)[S:, S:]))[i, p(i)]`` per position (the positional block; exact: a parameter),
mean over the non-root positions per graph, then mean ± sd over graphs: 0.84 ± 0.05.

Here: the same recipe with popgrad's sampled gradient (``train_catformer(..., gradient="sampled")``).
Each graph's run checkpoints (``--checkpoint-every``) and writes ``graphs/g<k>.json`` when it ends; the
table ``figure9_official_table.md`` is rewritten after every graph from every finished graph, so a
partial table is always on disk (it says how many graphs it holds). Rerunning the same command resumes:
finished graphs are read back, an unfinished one continues from its checkpoint (bit-identical).
``--first-graph``/``--graphs`` select graphs (two processes can share the 20). Beside the official
metric: the sampled population-average attention to the parent (with SE), the loss against the official
``bayes`` estimator and the task's Bayes loss on a held-out sample (with SE; sampled).

Full run (hours on 2 shared cores): ``python catformer_figure9_official.py``.
"""
import glob
import json
import os
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure
from popgrad.checks.catformer_sampled import sampled_readouts

from _catformer import official_or_finite_prior, write
from _common import finite_stats, parser

OFFICIAL = (0.84, 0.05)


def args_of():
    p = parser(__doc__, "examples_out/catformer_figure9_official", quick_help="T = 8, 2 graphs, 30 steps, batch 64")
    p.add_argument("--T", type=int, default=20)
    p.add_argument("--S", type=int, default=3)
    p.add_argument("--steps", type=int, default=2**14)
    p.add_argument("--graphs", type=int, default=20)
    p.add_argument("--first-graph", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--sample-seed", type=int, default=0)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--prior", choices=("continuous", "finite"), default="continuous")
    p.add_argument("--atoms", type=int, default=8, help="--prior finite: Dirichlet draws before the S! closure")
    p.add_argument("--eval-n", type=int, default=8192, help="held-out sequences for the sampled read-outs")
    p.add_argument("--no-bayes", action="store_true", help="skip the task's Bayes loss (slow for S >= 3)")
    p.add_argument("--checkpoint-every", type=int, default=512)
    p.add_argument("--table-only", action="store_true", help="write the table from the graphs finished so far")
    a = p.parse_args()
    if a.quick:
        a.T, a.steps, a.graphs, a.batch_size, a.eval_n, a.checkpoint_every = 8, 30, 2, 64, 256, 10
    return a


def run_graph(a, g, out):
    path = os.path.join(out, "graphs", f"g{g}.json")
    if os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    task = pg.Task(pg.random_tree(a.T, seed=g, root_prob=0.5), official_or_finite_prior(a, a.S))
    model = pg.CatFormer(a.S, a.T, heads=(1, 1))
    ckpt = os.path.join(out, "checkpoints", f"g{g}.npz")
    t0 = time.perf_counter()
    traj = pg.train_catformer(task, model, a.steps, gradient="sampled", batch_size=a.batch_size,
                              sample_seed=a.sample_seed + 1000 * g, optimizer="sgd", lr=1.0,
                              lr_schedule="constant", init="zero", record_every=max(1, a.steps // 16),
                              checkpoint_path=ckpt, checkpoint_every=a.checkpoint_every,
                              resume=os.path.exists(ckpt))
    ro = sampled_readouts(task, model, traj.final, n=a.eval_n, seed=10**6 + g, bayes=not a.no_bayes)
    L = ro["losses"]
    rec = {"graph": g, "parents": task.graph.to_string(), "status": traj.status, "steps": a.steps,
           "seconds": time.perf_counter() - t0,
           "positional_to_parent": ro["positional"]["to_parent"][0].tolist(),
           "population_to_parent": ro["population"]["to_parent"][0].tolist(),
           "population_to_parent_se": ro["population"]["to_parent_se"][0].tolist(),
           "loss_curve": [[int(s), float(l), float(e)] for s, l, e in zip(traj.step, traj.loss, traj.loss_se)],
           "losses": {k: {kk: v.get(kk) for kk in ("value", "se", "reason")} for k, v in L.items()},
           "induction_margin_over_max_abs": ro["induction"]["margin_over_max_abs"],
           "matching_minus_uniform": ro["induction"]["matching_minus_uniform"]["value"],
           "matching_minus_uniform_se": ro["induction"]["matching_minus_uniform"]["se"]}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(rec, fh)
    os.replace(tmp, path)
    return rec


def table(a, out):
    recs = []
    for p in sorted(glob.glob(os.path.join(out, "graphs", "g*.json"))):
        with open(p) as fh:
            recs.append(json.load(fh))
    recs.sort(key=lambda r: r["graph"])
    if not recs:
        return
    T = len(recs[0]["positional_to_parent"])
    pos = np.array([[np.nan if v is None else v for v in r["positional_to_parent"]] for r in recs], dtype=float)
    pop = np.array([[np.nan if v is None else v for v in r["population_to_parent"]] for r in recs], dtype=float)
    pos[:, T - 1] = pop[:, T - 1] = np.nan
    per_pos = finite_stats(pos, axis=1)[0]
    per_pop = finite_stats(pop, axis=1)[0]
    prior = (f"continuous Dirichlet({a.alpha:g}), stationary roots" if a.prior == "continuous"
             else f"finite: {a.atoms} Dirichlet({a.alpha:g}) draws closed under the {a.S}! relabelings")
    lines = [f"S = {a.S}, T = {T}, prior {prior}, heads (1, 1), zero start, SGD lr 1 constant, {a.steps} sampled "
             f"steps of batch {a.batch_size}, graphs random_tree(T, seed=g, root_prob=0.5). "
             f"**{len(recs)} graphs finished** ({', '.join(str(r['graph']) for r in recs)}; the full "
             f"experiment has 20).", "",
             "| position | positional block (official metric): mean | sd | population attention (sampled): mean | sd "
             "| graphs with a parent here |", "|---|---|---|---|---|---|"]
    mp, sp, _, _, cnt = finite_stats(pos, axis=0)
    mq, sq = finite_stats(pop, axis=0)[:2]
    for i in range(T):
        if cnt[i]:
            lines.append(f"| {i} | {mp[i]:.3f} | {sp[i]:.3f} | {mq[i]:.3f} | {sq[i]:.3f} | {int(cnt[i])} |")
    lines += ["", "| graph | parents | mean attn to parent (positional) | (population) | final loss ± SE | "
                  "− official bayes ± SE | − Bayes ± SE | induction margin / max abs(Ã2) | status |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r, a1, a2 in zip(recs, per_pos, per_pop):
        L = r["losses"]

        def pm(k):
            v = L[k]
            return "n/a" if v["value"] is None else f"{v['value']:+.4f} ± {v['se']:.4f}"
        lines.append(f"| {r['graph']} | {r['parents']} | {a1:.3f} | {a2:.3f} | {L['L_model']['value']:.4f} ± "
                     f"{L['L_model']['se']:.4f} | {pm('model_minus_official_bayes')} | {pm('model_minus_bayes')} | "
                     f"{r['induction_margin_over_max_abs']:+.3f} | {r['status']} |")
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for mean, sd, lab, c in ((mp, sp, "positional block (official metric)", "tab:blue"),
                             (mq, sq, "population attention (sampled)", "tab:green")):
        ok = np.isfinite(mean)
        ax.errorbar(np.arange(T)[ok], mean[ok], yerr=sd[ok], fmt="o-", capsize=3, color=c, label=lab)
    ax.axhline(OFFICIAL[0], color="tab:red", ls=":", label=f"official: {OFFICIAL[0]} ± {OFFICIAL[1]}")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position i")
    ax.set_ylabel("attention from i to p(i): mean ± sd over graphs")
    ax.set_title(f"S = {a.S}, T = {T}, {len(recs)} graphs, {a.steps} sampled steps", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(out, "attention_to_parent.png"))
    quick = " --quick" if a.quick else ""
    lines += ["", f"**Mean over graphs (per-graph mean over non-root positions): positional block "
                  f"{np.nanmean(per_pos):.3f} ± {np.nanstd(per_pos):.3f}** (sd over {len(recs)} graphs; the "
                  f"notebook's jnp.std over graphs), population attention {np.nanmean(per_pop):.3f} ± {np.nanstd(per_pop):.3f}; "
                  f"official (S = 3, T = 20, 2^14 steps, 20 graphs): {OFFICIAL[0]:.2f} ± {OFFICIAL[1]:.2f}.",
              f"Reproduce: python examples/catformer_figure9_official.py --T {a.T} --steps {a.steps} --graphs "
              f"{a.graphs} --batch-size {a.batch_size} --prior {a.prior} --alpha {a.alpha:g}{quick}"]
    write(out, "figure9_official_table.md", "\n".join(lines))


def main():
    a = args_of()
    out = a.out
    os.makedirs(os.path.join(out, "graphs"), exist_ok=True)
    os.makedirs(os.path.join(out, "checkpoints"), exist_ok=True)
    if a.table_only:
        table(a, out)
        return
    t0 = time.perf_counter()
    for g in range(a.first_graph, a.first_graph + a.graphs):
        r = run_graph(a, g, out)
        print(f"graph {g}: {r['parents']}, {r['status']}, {time.perf_counter() - t0:.0f} s", flush=True)
        table(a, out)


if __name__ == "__main__":
    main()
