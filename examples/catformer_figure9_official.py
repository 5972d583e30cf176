"""Full model: Figure 9 at the official size
=========================================

Figure 9 at the official size: S = 3, T = 20, 20 graphs, sampled SGD, attention to the parent per position.

The official ``many_graphs.ipynb``: its own 20 graphs (``popgrad.official_dags("figure9")``: the
notebook's ``RNG(0)`` draws of ``get_random_DAG(p=0.5)``, in order; each position 1..T-2 has a parent with
probability 1/2, uniform over the earlier positions), the continuous Dirichlet(α = 0.1) prior with stationary
roots (``InContextTree``), the full model with heads (1, 1) from zero, ``optax.sgd(1.0)`` (constant lr; the
notebook's ``wd = 2e-4`` is defined but not used), 2^14 steps of fresh batches of 1024, and the metric
``softmax(MASK(Ã^(1)[S:, S:]))[i, p(i)]`` per position (the positional block; exact: a parameter), mean over
the graph's edges, then mean ± sd over graphs: 0.837 ± 0.054 (the notebook prints every graph's value, so
each graph is compared with its own official value).

Here: the same recipe with popgrad's sampled gradient (``train_catformer(..., gradient="sampled")``; the
batches are popgrad's draws, not JAX's, so a graph's run is a different draw of the same process). Each
graph's run checkpoints (``--checkpoint-every``) and writes ``graphs/g<k>.json`` when it ends; after every
graph ``summary.json`` (records ``index, graph, positional_block, official, steps``) and the table
``figure9_official_table.md`` are rewritten from every finished graph, so a partial result is always on disk
(it says how many graphs it holds). Rerunning the same command resumes: finished graphs are read back, an
unfinished one continues from its checkpoint (bit-identical). ``--first-graph``/``--graphs`` select graphs.
Beside the official metric: the sampled population-average attention to the parent (with SE); the loss against
both reference lines, the edges-only count estimator and the official ``bayes`` line (``InContextTree.bayes``
as written: a root counts as a child of position T-2), and the task's Bayes loss, on a held-out sample (SE).
``--graph-set numpy`` trains on ``popgrad.random_tree(T, seed=g, root_prob=0.5)`` instead (the same law,
other draws). ``--quick`` cuts each official graph to its first T - 1 positions plus the query.

Full run (hours on 2 shared cores; resumable): ``python catformer_figure9_official.py --out
docs/results/figure9_official``.
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
from popgrad._io import atomic_savez
from popgrad.app.plots import save_figure
from popgrad.checks.catformer_sampled import sampled_readouts
from popgrad.task.official import figure9_notebook_values

from _catformer import official_or_finite_prior, write
from _common import finite_stats, parser
from _official import reference_lines, write_json

NOTEBOOK = figure9_notebook_values()
OFFICIAL = (float(np.mean([r["official"] for r in NOTEBOOK])), float(np.std([r["official"] for r in NOTEBOOK])))


def args_of():
    p = parser(__doc__, "examples_out/catformer_figure9_official", quick_help="T = 8, 2 graphs, 30 steps, batch 64")
    p.add_argument("--T", type=int, default=20)
    p.add_argument("--S", type=int, default=3)
    p.add_argument("--steps", type=int, default=2**14)
    p.add_argument("--graphs", type=int, default=20)
    p.add_argument("--first-graph", type=int, default=0)
    p.add_argument("--graph-set", choices=("official", "numpy"), default="official",
                   help="official: the notebook's 20 graphs (popgrad.official_dags); numpy: random_tree(T, seed=g)")
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
    if a.graph_set == "official":
        if a.T > 20:
            p.error(f"--T {a.T}: the official graphs have T = 20; use --T <= 20 (shorter: each graph cut to its "
                    f"first T - 1 positions) or --graph-set numpy")
        if not 0 <= a.first_graph or a.first_graph + a.graphs > 20:
            p.error(f"--first-graph {a.first_graph} --graphs {a.graphs}: the notebook has graphs 0..19")
    return a


def graph_of(a, g):
    if a.graph_set == "numpy":
        return pg.random_tree(a.T, seed=g, root_prob=0.5)
    par = pg.official_dags("figure9")[g].parents
    return pg.CausalGraph(list(par[: a.T - 1]) + [-1])


def run_graph(a, g, out):
    path = os.path.join(out, "graphs", f"g{g}.json")
    if os.path.exists(path):
        with open(path) as fh:
            return json.load(fh)
    task = pg.Task(graph_of(a, g), official_or_finite_prior(a, a.S))
    model = pg.CatFormer(a.S, a.T, heads=(1, 1))
    ckpt = os.path.join(out, "checkpoints", f"g{g}.npz")
    t0 = time.perf_counter()
    traj = pg.train_catformer(task, model, a.steps, gradient="sampled", batch_size=a.batch_size,
                              sample_seed=a.sample_seed + 1000 * g, optimizer="sgd", lr=1.0,
                              lr_schedule="constant", init="zero", record_every=max(1, a.steps // 16),
                              checkpoint_path=ckpt, checkpoint_every=a.checkpoint_every,
                              resume=os.path.exists(ckpt))
    ro = sampled_readouts(task, model, traj.final, n=a.eval_n, seed=10**6 + g, bayes=not a.no_bayes)
    refs = reference_lines(task, model, traj.final, n=a.eval_n, seed=10**6 + g, alpha=a.alpha)
    L = ro["losses"]
    pos = np.asarray(ro["positional"]["to_parent"][0], dtype=float)
    edges = [i for i in task.graph.non_roots if i < a.T - 1]
    rec = {"graph": g, "graph_set": a.graph_set, "parents": task.graph.to_string(), "status": traj.status,
           "steps": int(traj.step[-1]), "seconds": time.perf_counter() - t0,
           "positional_block": float(np.mean(pos[edges])) if edges else None,
           "positional_to_parent": ro["positional"]["to_parent"][0].tolist(),
           "population_to_parent": ro["population"]["to_parent"][0].tolist(),
           "population_to_parent_se": ro["population"]["to_parent_se"][0].tolist(),
           "loss_curve": [[int(s), float(l), float(e)] for s, l, e in zip(traj.step, traj.loss, traj.loss_se)],
           "losses": {k: {kk: v.get(kk) for kk in ("value", "se", "reason")} for k, v in L.items()},
           "reference_lines": refs,
           "induction_margin_over_max_abs": ro["induction"]["margin_over_max_abs"],
           "matching_minus_uniform": ro["induction"]["matching_minus_uniform"]["value"],
           "matching_minus_uniform_se": ro["induction"]["matching_minus_uniform"]["se"]}
    write_json(path, rec)
    return rec


def _official_value(a, r):
    """The notebook's value for this graph (``1 - mean delta``), when the run is on that graph at its size."""
    if r.get("graph_set", "numpy") != "official" or a.T != 20:
        return None
    return NOTEBOOK[r["graph"]]["official"]


def summary(a, recs, out):
    """``summary.json``: one record per finished graph, in the notebook's order."""
    write_json(os.path.join(out, "summary.json"),
               [{"index": r["graph"], "graph": r["parents"], "positional_block": r["positional_block"],
                 "official": _official_value(a, r), "steps": r["steps"]} for r in recs])


def compact(out, g):
    """A finished graph keeps its final parameters (``graphs/g<k>_params.npz``, a few KB) instead of its
    checkpoint (every recorded parameter: hundreds of KB), so the committed results stay small."""
    ckpt = os.path.join(out, "checkpoints", f"g{g}.npz")
    keep = os.path.join(out, "graphs", f"g{g}_params.npz")
    if os.path.exists(ckpt):
        with np.load(ckpt, allow_pickle=False) as z:
            arrays = {k: np.array(z[k]) for k in z.files if k.startswith("A_") or k == "W"}
        atomic_savez(keep, **arrays)
        os.remove(ckpt)


def table(a, out):
    recs = []
    for p in sorted(glob.glob(os.path.join(out, "graphs", "g*.json"))):
        with open(p) as fh:
            recs.append(json.load(fh))
        compact(out, recs[-1]["graph"])
    recs.sort(key=lambda r: r["graph"])
    if not recs:
        return
    summary(a, recs, out)
    T = len(recs[0]["positional_to_parent"])
    pos = np.array([[np.nan if v is None else v for v in r["positional_to_parent"]] for r in recs], dtype=float)
    pop = np.array([[np.nan if v is None else v for v in r["population_to_parent"]] for r in recs], dtype=float)
    pos[:, T - 1] = pop[:, T - 1] = np.nan
    per_pos = finite_stats(pos, axis=1)[0]
    per_pop = finite_stats(pop, axis=1)[0]
    offv = np.array([np.nan if _official_value(a, r) is None else _official_value(a, r) for r in recs])
    prior = (f"continuous Dirichlet({a.alpha:g}), stationary roots" if a.prior == "continuous"
             else f"finite: {a.atoms} Dirichlet({a.alpha:g}) draws closed under the {a.S}! relabelings")
    gset = ("the notebook's graphs (popgrad.official_dags('figure9'))" if a.graph_set == "official"
            else "random_tree(T, seed=g, root_prob=0.5)")
    lines = [f"S = {a.S}, T = {T}, prior {prior}, heads (1, 1), zero start, SGD lr 1 constant, {a.steps} sampled "
             f"steps of batch {a.batch_size}, graphs: {gset}. **{len(recs)} of 20 graphs finished** "
             f"({', '.join(str(r['graph']) for r in recs)}).", "",
             "| graph | parents | edges | positional block (popgrad) | official (notebook) | popgrad − official | "
             "population attention (sampled) | loss ± SE | − count estimator (edges only) ± SE | − official "
             "bayes ± SE | − Bayes ± SE | status |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def pm(v):
        return "n/a" if v is None or v.get("value") is None else f"{v['value']:+.4f} ± {v['se']:.4f}"
    for r, a1, a2, o in zip(recs, per_pos, per_pop, offv):
        L, R = r["losses"], r.get("reference_lines", {})
        ne = sum(1 for v in r["positional_to_parent"][: T - 1] if v is not None and np.isfinite(v))
        lines.append(f"| {r['graph']} | {r['parents']} | {ne} | {a1:.3f} | "
                     f"{'n/a' if np.isnan(o) else f'{o:.3f}'} | {'n/a' if np.isnan(o) else f'{a1 - o:+.3f}'} | "
                     f"{a2:.3f} | {L['L_model']['value']:.4f} ± {L['L_model']['se']:.4f} | "
                     f"{pm(R.get('model_minus_count_edges', L.get('model_minus_official_bayes')))} | "
                     f"{pm(R.get('model_minus_official_bayes'))} | {pm(L['model_minus_bayes'])} | {r['status']} |")
    mp, sp, _, _, cnt = finite_stats(pos, axis=0)
    mq, sq = finite_stats(pop, axis=0)[:2]
    lines += ["", "| position | positional block: mean | sd | population attention (sampled): mean | sd | graphs "
                  "with a parent here |", "|---|---|---|---|---|---|"]
    for i in range(T):
        if cnt[i]:
            lines.append(f"| {i} | {mp[i]:.3f} | {sp[i]:.3f} | {mq[i]:.3f} | {sq[i]:.3f} | {int(cnt[i])} |")
    fig, axs = plt.subplots(1, 2, figsize=(11, 3.8))
    ax = axs[0]
    for mean, sd, lab, c in ((mp, sp, "positional block (the notebook's metric)", "tab:blue"),
                             (mq, sq, "population attention (sampled)", "tab:green")):
        ok = np.isfinite(mean)
        ax.errorbar(np.arange(T)[ok], mean[ok], yerr=sd[ok], fmt="o-", capsize=3, color=c, label=lab)
    if a.graph_set == "official" and a.T == 20:  # the notebook's own curve over the same graphs: 1 - mean delta
        dl = np.array([[np.nan] + NOTEBOOK[r["graph"]]["deltas"] + [np.nan] for r in recs])
        par = np.array([[int(v) for v in r["parents"].split(",")] for r in recs])
        dl[par < 0] = np.nan
        nm, ns = finite_stats(1.0 - dl, axis=0)[:2]
        ok = np.isfinite(nm)
        ax.errorbar(np.arange(T)[ok] + 0.15, nm[ok], yerr=ns[ok], fmt="x--", capsize=3, color="tab:red",
                    label="the notebook, same graphs")
    ax.axhline(OFFICIAL[0], color="tab:red", ls=":", label=f"official mean over graphs: {OFFICIAL[0]:.3f}")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position i")
    ax.set_ylabel("attention from i to p(i): mean ± sd over graphs")
    ax.set_title(f"S = {a.S}, T = {T}, {len(recs)} graphs, {a.steps} sampled steps", fontsize=9)
    ax.legend(fontsize=7)
    ax = axs[1]
    idx = np.array([r["graph"] for r in recs])
    ax.plot(idx, per_pos, "o", color="tab:blue", label="popgrad (positional block)")
    if np.isfinite(offv).any():
        ax.plot(idx, offv, "x", color="tab:red", ms=8, label="official notebook")
    ax.set_xticks(range(20))
    ax.set_ylim(0.5, 1.0)
    ax.set_xlabel("graph (the notebook's order)")
    ax.set_ylabel("mean attention to the parent over the graph's edges")
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(out, "attention_to_parent.png"))
    quick = " --quick" if a.quick else ""
    d = per_pos - offv
    lines += ["", f"**Mean over graphs (per graph: mean over its edges): popgrad {np.nanmean(per_pos):.3f} ± "
                  f"{np.nanstd(per_pos):.3f}** (sd over {len(recs)} graphs, the notebook's jnp.std); population "
                  f"attention {np.nanmean(per_pop):.3f} ± {np.nanstd(per_pop):.3f}; the notebook over the same "
                  f"graphs: " + (f"{np.nanmean(offv):.3f} ± {np.nanstd(offv):.3f}" if np.isfinite(offv).any()
                                 else "n/a") + f" (over its 20: {OFFICIAL[0]:.3f} ± {OFFICIAL[1]:.3f})."]
    if np.isfinite(d).any():
        lines.append(f"popgrad − official per graph: mean {np.nanmean(d):+.3f}, sd {np.nanstd(d):.3f}, range "
                     f"{np.nanmin(d):+.3f} … {np.nanmax(d):+.3f} over {int(np.isfinite(d).sum())} graphs.")
    lines.append(f"Reproduce (resumes): python examples/catformer_figure9_official.py --out {out} --T {a.T} "
                 f"--steps {a.steps} --graphs {a.graphs} --first-graph {a.first_graph} --graph-set {a.graph_set} "
                 f"--batch-size {a.batch_size} --prior {a.prior} --alpha {a.alpha:g}{quick}")
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
