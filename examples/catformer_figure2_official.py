"""Full model: Figure 2 at the official size
=========================================

Figure 2 at the official size: S = 10, T = 20, chain / icl / the official random graph, sampled SGD.

The official ``single_parent.py``: the continuous Dirichlet(α = 0.1) prior with stationary roots
(``InContextTree``), heads (1, 1) from zero, SGD lr 1 with ``optax.cosine_decay_schedule(1, 2^17)``, no
weight decay, fresh batches of 1024 for 2^17 steps; graphs ``chain``, ``icl`` and ``random``, the graphs of
``popgrad.official_dags("figure2")`` (``random`` is the one ``RNG(seed=0)`` draws,
``-1,-1,1,-1,-1,4,-1,5,3,4,8,6,1,3,5,-1,6,1,3``). The official run plots the test loss on 2^16 held-out
sequences against its ``bayes`` line (``InContextTree.bayes`` as written: in-context counts plus α, where
``seq[dag]`` with ``dag[i] = -1`` reads position T-2, so a root counts as a child of position T-2 whenever that
token equals the query) and the learned ``Ã^(1)``, ``Ã^(2)``, ``W`` (Figure 6).

Here: the same with popgrad's sampled gradient. Each graph's run checkpoints every ``--checkpoint-every``
steps and resumes from it (bit-identically) when the command is run again, so the schedule runs across
sessions; the checkpoints are small enough to commit (the parameters are recorded every ``--record-every``
steps, default 2^17 / 16: the official run logs its test loss 128 times). ``--table-only`` writes
``figure2_official_table.md`` and ``summary.json`` from the runs as far as they got (the step reached is in
both). Read-outs at the step reached, on ``--eval-n`` held-out sequences (default 2^16, the official test set's
size; sampled, ± SE): the model's loss, both reference lines and the differences on the same draws -- the
edges-only count estimator (counts of the context's edges only) and the official ``bayes`` line above; the
positional block's attention to the parent (exact, a parameter); the sampled population attention; the
layer-2 induction margin (exact). Figures ``<graph>_loss.png`` (recorded batch losses ± SE against both lines),
``<graph>_blocks.png`` (Figure 6's panels) and ``<graph>_positional.png``.

Full run (days on 2 shared cores; resumable): ``python catformer_figure2_official.py --out
docs/results/figure2_official``; one graph: ``--graphs chain``.
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure
from popgrad.checks.catformer_sampled import sampled_readouts

from _catformer import official_or_finite_prior, write
from _common import parser
from _official import fmt_est, plot_learned_blocks, read_checkpoint, reference_lines, train_or_resume, write_json

NAMES = ("chain", "icl", "random")


def args_of():
    p = parser(__doc__, "examples_out/catformer_figure2_official", quick_help="S = 3, T = 6, 20 steps, batch 32")
    p.add_argument("--S", type=int, default=10)
    p.add_argument("--T", type=int, default=20)
    p.add_argument("--steps", type=int, default=2**17)
    p.add_argument("--graphs", default="chain,icl,random")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--sample-seed", type=int, default=0)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--prior", choices=("continuous", "finite"), default="continuous")
    p.add_argument("--atoms", type=int, default=8)
    p.add_argument("--eval-n", type=int, default=2**16)
    p.add_argument("--bayes", action="store_true", help="also the task's Bayes loss (slow at S = 10)")
    p.add_argument("--checkpoint-every", type=int, default=1024)
    p.add_argument("--record-every", type=int, default=None, help="default steps // 16 (small checkpoints)")
    p.add_argument("--table-only", action="store_true", help="write the table from the runs as far as they got")
    a = p.parse_args()
    if a.quick:
        a.S, a.T, a.steps, a.batch_size, a.eval_n, a.checkpoint_every = 3, 6, 20, 32, 256, 8
    if a.record_every is None:
        a.record_every = max(1, a.steps // 16)
    a.graphs = [g.strip() for g in a.graphs.split(",")]
    bad = [g for g in a.graphs if g not in NAMES]
    if bad:
        p.error(f"--graphs {','.join(bad)}: use chain, icl, random")
    if a.T > 20:
        p.error(f"--T {a.T}: the official graphs have T = 20; use --T <= 20 (each graph cut to its first T - 1 "
                f"positions plus the query)")
    return a


def graph_of(a, name):
    par = pg.official_dags("figure2")[NAMES.index(name)].parents
    return pg.CausalGraph(list(par[: a.T - 1]) + [-1])


def setup(a, name):
    task = pg.Task(graph_of(a, name), official_or_finite_prior(a, a.S))
    return task, pg.CatFormer(a.S, a.T, heads=(1, 1))


def train_kw(a):
    return dict(gradient="sampled", batch_size=a.batch_size, sample_seed=a.sample_seed, optimizer="sgd", lr=1.0,
                lr_schedule="cosine", init="zero", record_every=a.record_every)


def readout(a, name, out):
    """The summary record of one graph's run at the step it reached (``None``: not started)."""
    task, model = setup(a, name)
    got = read_checkpoint(model, os.path.join(out, f"{name}.ckpt.npz"))
    if got is None:
        return None
    t, params, rec, _ = got
    ro = sampled_readouts(task, model, params, n=min(a.eval_n, 8192), seed=777, bayes=a.bayes)
    refs = reference_lines(task, model, params, n=a.eval_n, seed=778, alpha=a.alpha)
    edges = [i for i in task.graph.non_roots if i < a.T - 1]
    pos = np.asarray(ro["positional"]["to_parent"][0], dtype=float)
    pop = np.asarray(ro["population"]["to_parent"][0], dtype=float)
    r = {"graph": name, "parents": task.graph.to_string(), "steps": a.steps, "steps_completed": int(t),
         "test_loss": refs["L_model"], "count_estimator_edges_only": refs["L_count_edges"],
         "official_bayes": refs["L_official_bayes"], "loss_minus_count_estimator": refs["model_minus_count_edges"],
         "loss_minus_official_bayes": refs["model_minus_official_bayes"],
         "official_bayes_minus_count_estimator": refs["official_bayes_minus_count_edges"], "eval_n": a.eval_n,
         "positional_attention_to_parent": float(np.mean(pos[edges])),
         "positional_attention_to_parent_per_position": {int(i): float(pos[i]) for i in edges},
         "population_attention_to_parent": float(np.mean(pop[edges])),
         "induction_margin_over_max_abs": float(ro["induction"]["margin_over_max_abs"]),
         "norms": {"A1": float(np.linalg.norm(params.A[0])), "A2": float(np.linalg.norm(params.A[1])),
                   "W": float(np.linalg.norm(params.W))},
         "recorded": {"step": rec["step"].tolist(), "batch_loss": rec["loss"].tolist(),
                      "batch_loss_se": rec["loss_se"].tolist()}}
    figures(a, name, task, params, rec, r, t, out)
    return r


def figures(a, name, task, params, rec, r, t, out):
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.errorbar(rec["step"], rec["loss"], yerr=rec["loss_se"], fmt=".-", ms=3, label="batch loss ± SE (sampled)")
    ax.axhline(r["official_bayes"]["value"], ls="--", color="k", lw=0.8,
               label="official bayes line (roots read as children of T-2)")
    ax.axhline(r["count_estimator_edges_only"]["value"], ls=":", color="tab:red", lw=0.9,
               label="count estimator, edges only")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{name}, S = {a.S}, T = {a.T}, step {t} of {a.steps}", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(out, f"{name}_loss.png"))
    plot_learned_blocks(params, a.S, a.T, os.path.join(out, f"{name}_blocks.png"),
                        title=f"{name}: Ã1, Ã2, Wᵀ at step {t} of {a.steps} (S = {a.S}, T = {a.T})")
    fig, axs = plt.subplots(1, 2, figsize=(6.4, 3.2))
    axs[0].imshow(task.graph.adjacency(), cmap="Blues")
    axs[0].set_title("graph")
    S, T = a.S, a.T
    A1 = params.A[0][0][S:, S:]
    z = np.where(np.tri(T, dtype=bool), A1, -np.inf)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    axs[1].imshow(z / z.sum(axis=1, keepdims=True), vmin=0, vmax=1)
    axs[1].set_title("softmax(MASK(Ã1[S:, S:]))")
    save_figure(fig, os.path.join(out, f"{name}_positional.png"))


def table(a, out):
    recs = [(n, readout(a, n, out)) for n in a.graphs]
    write_json(os.path.join(out, "summary.json"), [r for _, r in recs if r is not None])
    lines = [f"S = {a.S}, T = {a.T}, prior {'continuous' if a.prior == 'continuous' else 'finite'} "
             f"Dirichlet({a.alpha:g}), heads (1, 1), zero start, SGD lr 1 cosine over {a.steps} steps, sampled "
             f"batches of {a.batch_size}; read-outs on {a.eval_n} held-out sequences (sampled, ± SE) at the step "
             f"reached.", "",
             "| graph | step reached | test loss ± SE | count estimator (edges only) ± SE | official bayes line ± SE "
             "| loss − count estimator | loss − official bayes | attn to parent: positional (exact) | population "
             "(sampled) | induction margin / max abs(Ã2) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in recs:
        if r is None:
            lines.append(f"| {name} | not started | | | | | | | | |")
            continue
        lines.append(f"| {name} | {r['steps_completed']} of {a.steps} | {fmt_est(r['test_loss'])} | "
                     f"{fmt_est(r['count_estimator_edges_only'])} | {fmt_est(r['official_bayes'])} | "
                     f"{fmt_est(r['loss_minus_count_estimator'], True)} | "
                     f"{fmt_est(r['loss_minus_official_bayes'], True)} | {r['positional_attention_to_parent']:.3f} | "
                     f"{r['population_attention_to_parent']:.3f} | {r['induction_margin_over_max_abs']:+.3f} |")
    quick = " --quick" if a.quick else ""
    lines += ["", f"Reproduce (resumes; --table-only for a table of the runs so far): python "
                  f"examples/catformer_figure2_official.py --out {out} --S {a.S} --T {a.T} --steps {a.steps} "
                  f"--graphs {','.join(a.graphs)} --batch-size {a.batch_size} --prior {a.prior} "
                  f"--record-every {a.record_every}{quick}"]
    write(out, "figure2_official_table.md", "\n".join(lines))


def main():
    a = args_of()
    os.makedirs(a.out, exist_ok=True)
    if not a.table_only:
        for name in a.graphs:
            task, model = setup(a, name)
            traj = train_or_resume(task, model, a.steps, os.path.join(a.out, f"{name}.ckpt.npz"),
                                   a.checkpoint_every, **train_kw(a))
            print(f"{name}: {traj.status} at step {traj.step[-1]}", flush=True)
    table(a, a.out)


if __name__ == "__main__":
    main()
