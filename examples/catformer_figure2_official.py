"""Full model: Figure 2 at the official size
=========================================

Figure 2 at the official size: S = 10, T = 20, chain / icl / official random graph, sampled SGD.

The official ``single_parent.py``: the continuous Dirichlet(α = 0.1) prior with stationary roots
(``InContextTree``), heads (1, 1) from zero, SGD lr 1 with ``optax.cosine_decay_schedule(1, 2^17)``, no
weight decay, fresh batches of 1024 for 2^17 steps; graphs ``chain``, ``icl`` and ``random``
(``popgrad.official_random_tree(T, seed)``: each parent uniform over {none, 0, …, i-1}). The official run
plots the test loss against its ``bayes`` line (the count estimator: counts plus α, normalised; edges
only) and the learned ``Ã^(1)``, ``Ã^(2)``, ``W``.

Here: the same with popgrad's sampled gradient. Each graph's run checkpoints every ``--checkpoint-every``
steps and resumes from it (bit-identically) when the command is run again; ``--table-only`` writes
``figure2_official_table.md`` from the runs as far as they got (the step reached is in the table), so the
full schedule runs across sessions. Read-outs (``popgrad.checks.catformer_sampled``): loss, the official
``bayes`` loss and their difference on a held-out sample with SE; the positional block's attention to
the parent (exact); the sampled population attention (SE); the layer-2 induction margin (exact).
Figures ``<graph>_loss.png`` (recorded batch losses ± SE against the official ``bayes``) and
``<graph>_positional.png``.

Full run (days on 2 shared cores): ``python catformer_figure2_official.py``; one graph:
``--graphs chain``.
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
from _official import fmt_est, read_checkpoint, train_or_resume

GRAPHS = {"chain": pg.chain, "icl": pg.icl_pairs, "random": lambda T: pg.official_random_tree(T, seed=0)}


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
    p.add_argument("--eval-n", type=int, default=8192)
    p.add_argument("--bayes", action="store_true", help="also the task's Bayes loss (slow at S = 10)")
    p.add_argument("--checkpoint-every", type=int, default=1024)
    p.add_argument("--table-only", action="store_true", help="write the table from the runs as far as they got")
    a = p.parse_args()
    if a.quick:
        a.S, a.T, a.steps, a.batch_size, a.eval_n, a.checkpoint_every = 3, 6, 20, 32, 256, 8
    a.graphs = [g.strip() for g in a.graphs.split(",")]
    bad = [g for g in a.graphs if g not in GRAPHS]
    if bad:
        p.error(f"--graphs {','.join(bad)}: use chain, icl, random")
    return a


def setup(a, name):
    task = pg.Task(GRAPHS[name](a.T), official_or_finite_prior(a, a.S))
    return task, pg.CatFormer(a.S, a.T, heads=(1, 1))


def train_kw(a):
    return dict(gradient="sampled", batch_size=a.batch_size, sample_seed=a.sample_seed, optimizer="sgd", lr=1.0,
                lr_schedule="cosine", init="zero", record_every=max(1, a.steps // 128))


def table(a, out):
    lines = [f"S = {a.S}, T = {a.T}, prior {'continuous' if a.prior == 'continuous' else 'finite'} "
             f"Dirichlet({a.alpha:g}), heads (1, 1), zero start, SGD lr 1 cosine over {a.steps} steps, sampled "
             f"batches of {a.batch_size}; read-outs on {a.eval_n} held-out sequences (sampled, ± SE) at the step "
             f"reached.", "",
             "| graph | step reached | loss ± SE | official bayes ± SE | loss − official bayes ± SE | Bayes (task) | "
             "mean attn to parent: positional (exact) | population (sampled) | induction margin / max abs(Ã2) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in a.graphs:
        task, model = setup(a, name)
        got = read_checkpoint(model, os.path.join(out, f"{name}.ckpt.npz"))
        if got is None:
            lines.append(f"| {name} | not started | | | | | | | |")
            continue
        t, params, rec, _ = got
        ro = sampled_readouts(task, model, params, n=a.eval_n, seed=777, bayes=a.bayes)
        L = ro["losses"]
        nr = [i for i in task.graph.non_roots if i < a.T - 1]
        pos = float(np.mean(ro["positional"]["to_parent"][0][nr]))
        pop = float(np.mean(ro["population"]["to_parent"][0][nr]))
        lines.append(f"| {name} | {t} of {a.steps} | {fmt_est(L['L_model'])} | {fmt_est(L['L_official_bayes'])} | "
                     f"{fmt_est(L['model_minus_official_bayes'], True)} | {fmt_est(L['L_bayes'])} | {pos:.3f} | "
                     f"{pop:.3f} | {ro['induction']['margin_over_max_abs']:+.3f} |")
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.errorbar(rec["step"], rec["loss"], yerr=rec["loss_se"], fmt=".-", ms=3, label="batch loss ± SE (sampled)")
        ax.axhline(L["L_official_bayes"]["value"], ls="--", color="k", lw=0.8, label="official bayes (sampled)")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(f"{name}, S = {a.S}, T = {a.T}, step {t} of {a.steps}", fontsize=9)
        ax.legend(fontsize=7)
        save_figure(fig, os.path.join(out, f"{name}_loss.png"))
        fig, axs = plt.subplots(1, 2, figsize=(6.4, 3.2))
        adj = np.zeros((a.T, a.T))
        par = np.asarray(task.graph.parents)
        adj[np.flatnonzero(par >= 0), par[par >= 0]] = 1
        axs[0].imshow(adj, cmap="Blues")
        axs[0].set_title("graph")
        axs[1].imshow(ro["positional"]["matrix"][0], vmin=0, vmax=1)
        axs[1].set_title("softmax(MASK(Ã1[S:, S:]))")
        save_figure(fig, os.path.join(out, f"{name}_positional.png"))
    quick = " --quick" if a.quick else ""
    lines += ["", f"Reproduce (resumes; --table-only for a table of the runs so far): python "
                  f"examples/catformer_figure2_official.py --S {a.S} --T {a.T} --steps {a.steps} --graphs "
                  f"{','.join(a.graphs)} --batch-size {a.batch_size} --prior {a.prior}{quick}"]
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
