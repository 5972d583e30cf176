"""Full model: Figure 9, exactly
=============================

Figure 9 of the paper, exactly: attention to the parent per position over 20 random graphs, full model.

The official ``many_graphs.ipynb`` trains the disentangled transformer
(heads (1, 1), zero start) with ``optax.sgd(1.0)`` (constant lr, no decay) on
sampled batches, S = 3, T = 20, on 20 random graphs (each position has a
parent with probability 1/2, uniform over the earlier positions), and
reports the attention the first layer's positional block puts on each
position's parent, ``softmax(MASK(Ã^(1)[S:, S:]))[i, p(i)]``: mean 0.84 ±
0.05 over graphs.

Here the same model and optimizer run on the exact population gradient at
S = 3 and a T that enumerates (default 7), 20 graphs
``popgrad.random_tree(T, seed=g, root_prob=0.5)``, prior: the official continuous
Dirichlet(α) prior with stationary roots (``--prior finite``: 8 draws closed under the 3!
relabelings), α = 0.1 as in the official run (--alpha). The official size (T = 20, sampled):
``catformer_figure9_official.py``.
Two exact readings per position: the official metric's matrix, and the exact population-average attention
``E_s[softmax(x̃ Ã^(1) x̃ᵀ)][i, p(i)]`` (which also counts the token blocks).

Writes ``attention_to_parent.png`` and ``figure9_table.md``. Each graph's result is kept in
``graphs/g<k>.json`` (with its recipe): ``--first-graph``/``--graphs`` select graphs, so two processes
can share the 20 (same ``--out``), a rerun reuses the finished graphs of the same recipe, and
``--table-only`` writes the table and figure from every finished graph.
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
from popgrad.checks import catformer as cc

from _catformer import catformer_args, official_or_finite_prior, prior_text, write
from _common import finite_stats

OFFICIAL = (0.84, 0.05)  # mean ± sd over 20 graphs, official sampled training (S = 3, T = 20, 2^14 steps)


def _record_path(out, g):
    return os.path.join(out, "graphs", f"g{g}.json")


def run_graph(args, S, T, steps, prior, g, out):
    """One graph's exact run and read-outs; the record (``graphs/g<k>.json``, written atomically) is reused
    only by a run of the same recipe."""
    recipe = {"S": S, "T": T, "steps": steps, "alpha": args.alpha, "prior": args.prior, "atoms": args.atoms}
    path = _record_path(out, g)
    if os.path.exists(path):
        with open(path) as fh:
            rec = json.load(fh)
        if rec.get("recipe") == recipe:
            return rec
    t0 = time.perf_counter()
    task = pg.Task(pg.random_tree(T, seed=g, root_prob=0.5), prior)
    model = pg.CatFormer(S, T, heads=(1, 1))
    traj = pg.train_catformer(task, model, steps, optimizer="sgd", lr=1.0, lr_schedule="constant",
                              init="zero", record_every=steps)
    pos = cc.attention_to_parent_per_position(task.graph, cc.positional_attention(model, traj.final))[0]
    pop = cc.attention_to_parent_per_position(task.graph, cc.population_attention(task, model, traj.final))[0]
    rec = {"graph": g, "recipe": recipe, "parents": task.graph.to_string(), "status": traj.status,
           "positional_to_parent": [None if not np.isfinite(v) else float(v) for v in pos],
           "population_to_parent": [None if not np.isfinite(v) else float(v) for v in pop],
           "loss": float(traj.loss[-1]), "bayes": float(pg.bayes_loss(task)),
           "seconds": time.perf_counter() - t0}
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(rec, fh)
    os.replace(tmp, path)
    return rec


def table(args, S, T, steps, out):
    """The table and figure from every finished graph of this recipe in ``out`` (any process's)."""
    recs = []
    for p in sorted(glob.glob(os.path.join(out, "graphs", "g*.json"))):
        with open(p) as fh:
            r = json.load(fh)
        if r.get("recipe") == {"S": S, "T": T, "steps": steps, "alpha": args.alpha, "prior": args.prior,
                               "atoms": args.atoms}:
            recs.append(r)
    recs.sort(key=lambda r: r["graph"])
    if not recs:
        return
    n_graphs = len(recs)
    pos_attn = np.array([[np.nan if v is None else v for v in r["positional_to_parent"]] for r in recs], dtype=float)
    pop_attn = np.array([[np.nan if v is None else v for v in r["population_to_parent"]] for r in recs], dtype=float)
    pos_attn[:, T - 1] = pop_attn[:, T - 1] = np.nan  # the query is a root
    losses = [(r["loss"], r["bayes"], r["status"]) for r in recs]
    seconds = sum(r["seconds"] for r in recs)
    per_graph_pos = finite_stats(pos_attn, axis=1)[0]  # NaN for a graph without parents, without a warning
    per_graph_pop = finite_stats(pop_attn, axis=1)[0]
    pos = np.arange(T)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for arr, lab, c in ((pos_attn, "positional block (official metric), exact", "tab:blue"),
                        (pop_attn, "population-average attention, exact", "tab:green")):
        mean, sd = finite_stats(arr, axis=0)[:2]  # position 0 is a root in every graph
        ok = np.isfinite(mean)
        ax.errorbar(pos[ok], mean[ok], yerr=sd[ok], fmt="o-", capsize=3, color=c, label=lab)
    ax.axhline(OFFICIAL[0], color="tab:red", ls=":", label=f"official sampled (S=3, T=20): {OFFICIAL[0]}")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position i")
    ax.set_ylabel("attention from i to p(i): mean ± sd over graphs")
    ax.set_title(f"full model, S = {S}, T = {T}, {n_graphs} random graphs, SGD lr 1 constant, {steps} exact steps",
                 fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, f"{out}/attention_to_parent.png")
    which = ", ".join(str(r["graph"]) for r in recs)
    lines = [f"S = {S}, T = {T}, heads (1, 1), zero start, SGD lr 1 (constant), {steps} exact steps, "
             f"{n_graphs} graphs random_tree(T, seed=g, root_prob=0.5) (g = {which}), "
             f"{prior_text(args.prior, args.alpha, args.atoms or 8)}.", "",
             "| position | positional block: mean | sd | population attention: mean | sd | graphs with a parent here |",
             "|---|---|---|---|---|---|"]
    for i in pos:
        col = pos_attn[:, i]
        if np.isfinite(col).any():
            lines.append(f"| {i} | {np.nanmean(col):.3f} | {np.nanstd(col):.3f} | {np.nanmean(pop_attn[:, i]):.3f} | "
                         f"{np.nanstd(pop_attn[:, i]):.3f} | {int(np.isfinite(col).sum())} |")
    gap = np.mean([l - b for l, b, _ in losses])
    lines += ["", "| graph | parents | positional block | population attention | final loss − Bayes | status |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['graph']} | {r['parents']} | {a1:.3f} | {a2:.3f} | {r['loss'] - r['bayes']:+.4f} | {r['status']} |"
              for r, a1, a2 in zip(recs, per_graph_pos, per_graph_pop)]
    lines += ["", f"Mean over graphs (per-graph mean over non-root positions): positional block "
                  f"{np.nanmean(per_graph_pos):.3f} ± {np.nanstd(per_graph_pos):.3f}, population attention "
                  f"{np.nanmean(per_graph_pop):.3f} ± {np.nanstd(per_graph_pop):.3f} (sd over graphs), exact; "
                  f"official sampled (S = 3, T = 20, 2^14 steps): {OFFICIAL[0]:.2f} ± {OFFICIAL[1]:.2f}.",
              f"Mean final loss - Bayes over graphs: {gap:.4f}; statuses: "
              f"{sorted({s for _, _, s in losses})}. {n_graphs} graphs in {seconds:.0f} s of run time.",
              f"Reproduce: python examples/catformer_figure9.py --T {T} --steps {steps} --graphs {n_graphs} "
              f"--alpha {args.alpha:g} --prior {args.prior}"]
    write(out, "figure9_table.md", "\n".join(lines))


def main():
    args, out = catformer_args(__doc__, "examples_out/catformer_figure9", 7, 1000,
                               "T = 6, 3 graphs, 40 steps (smoke test)", {"graphs": 20, "first-graph": 0},
                               table_only=True)
    S = 3
    T, steps, n_graphs = (6, 40, 3) if args.quick else (args.T, args.steps, args.graphs)
    first = 0 if args.quick else args.first_graph
    prior = official_or_finite_prior(args, S)
    os.makedirs(os.path.join(out, "graphs"), exist_ok=True)
    t0 = time.perf_counter()
    if not args.table_only:
        for g in range(first, first + n_graphs):
            r = run_graph(args, S, T, steps, prior, g, out)
            print(f"graph {g}: parents {r['parents']}, loss {r['loss']:.4f} (Bayes {r['bayes']:.4f}), "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    table(args, S, T, steps, out)


if __name__ == "__main__":
    main()
