"""Full model: exact and sampled training, paired
==============================================

The pairing: the full model trained on exact and on sampled gradients, same start, same task.

Three parts (``--parts``), each writing a table to ``pairing_<part>.md``:

* ``batch``: one task (S, T = ``--T-batch``, graph ``random_tree(T, seed=0, root_prob=0.5)``, continuous
  Dirichlet(α) prior, stationary roots), SGD lr 1 constant from zero, ``--steps`` steps; the exact run
  and sampled runs at each batch size (``--batch-sizes``) and ``--seeds`` batch seeds. At every record
  the sampled run's *exact* population loss and positional attention to the parent are compared with
  the exact run's (both exact: T enumerates): RMS over seeds of the differences, at the end and the
  largest over records.
* ``T``: the Figure-9 metric (positional block's mean attention to the parent per graph, mean ± sd over
  ``--graphs`` graphs ``random_tree(T, seed=g, root_prob=0.5)``) against T, exact for ``--T-exact`` and
  sampled (batch ``--batch-size``) for ``--T-sampled``, same steps, same graphs family.
* ``linresp``: the linear-response prediction of the ``batch`` part's distances
  (:func:`popgrad.checks.linear_response.catformer_linear_response`): S, T = ``--T-linresp``, graph
  ``random_tree(T, seed=--graph-seed-linresp, root_prob=0.5)``, SGD lr 1 constant from zero,
  ``--steps-linresp`` steps; the exact Hessian and the exact soft-label gradient covariance on a grid of the
  exact run (0, 1, 2, 4, … and every eighth of the run), against ``--seeds-linresp`` sampled runs per batch
  size (``--batch-sizes-linresp``): ``E‖δ‖²``, the RMS loss gap and the RMS gap of the attention to the
  parent, measured (exact scores of the sampled parameters) and predicted.
* ``heads``: the two-parent graph (S = 2, T = ``--T-heads``, ``DirichletTensorPrior(2, 2, α)``), heads
  (2, 1), from ``1e-4·N(0,1)``: exact vs sampled, SGD (lr 1 cosine) and AdamW (lr 1e-2 cosine, wd 1e-4):
  the heads' difference ``‖Ã^(1)_0 − Ã^(1)_1‖_F`` and the soft/strict split of the positional block.

``--quick`` runs tiny sizes in seconds.
"""
import math
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure
from popgrad.checks import catformer as cc
from popgrad.checks.theorems import check_head_specialization

from _catformer import write
from _common import finite_stats, parser


def args_of():
    p = parser(__doc__, "examples_out/catformer_pairing", quick_help="tiny sizes (seconds)")
    p.add_argument("--parts", default="batch,linresp,T,heads")
    p.add_argument("--S", type=int, default=3)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--steps", type=int, default=1024)
    p.add_argument("--T-batch", type=int, default=7)
    p.add_argument("--batch-sizes", default="64,256,1024")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--T-exact", default="6,7,8,10")
    p.add_argument("--T-sampled", default="6,7,8,10,14,20")
    p.add_argument("--graphs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--T-heads", type=int, default=8)
    p.add_argument("--record-every", type=int, default=64)
    p.add_argument("--T-linresp", type=int, default=6)
    p.add_argument("--graph-seed-linresp", type=int, default=4)
    p.add_argument("--steps-linresp", type=int, default=1024)
    p.add_argument("--batch-sizes-linresp", default="16,64,256,1024")
    p.add_argument("--seeds-linresp", type=int, default=8)
    p.add_argument("--grid-linresp", type=int, default=0,
                   help="evaluate H and Σ every this many steps (besides 0, 1, 2, 4, …); 0: every eighth of the run")
    a = p.parse_args()
    if a.quick:
        a.steps, a.T_batch, a.batch_sizes, a.seeds, a.T_exact, a.T_sampled, a.graphs, a.T_heads = \
            16, 5, "16,64", 2, "5", "5,6", 2, 5
        a.batch_size, a.record_every = 64, 8
        a.T_linresp, a.steps_linresp, a.batch_sizes_linresp, a.seeds_linresp = 3, 8, "64,1024", 4
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    a.parts = a.parts.split(",")
    a.batch_sizes, a.T_exact, a.T_sampled = ints(a.batch_sizes), ints(a.T_exact), ints(a.T_sampled)
    a.batch_sizes_linresp = ints(a.batch_sizes_linresp)
    return a


def sgd_kw(a, **kw):
    return dict(optimizer="sgd", lr=1.0, lr_schedule="constant", init="zero", record_every=a.record_every, **kw)


def mean_pos_attn(task, model, params):
    nr = [i for i in task.graph.non_roots if i < task.T - 1]
    return float(np.mean(cc.attention_to_parent_per_position(task.graph, cc.positional_attention(model, params))[0][nr]))


def _figure(out, name, xs, ys, xlabel, ylabel, title, logx=False):
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for lab, (x, y) in zip(ys, zip(xs, ys.values())):
        ax.plot(x, y, "o-", label=lab)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, f"{out}/{name}")


def part_batch(a):
    T = a.T_batch
    task = pg.Task(pg.random_tree(T, seed=0, root_prob=0.5), pg.DirichletPrior(a.S, a.alpha))
    model = pg.CatFormer(a.S, T)
    ex = pg.train_catformer(task, model, a.steps, **sgd_kw(a))
    ex_attn = np.array([mean_pos_attn(task, model, ex.params(r)) for r in range(len(ex.step))])
    lines = [f"S = {a.S}, T = {T}, graph {task.graph.to_string()}, continuous Dirichlet({a.alpha:g}) prior, SGD lr 1 "
             f"constant from zero, {a.steps} steps; sampled runs vs the exact run from the same start; differences "
             f"of the exact population loss and of the positional block's mean attention to the parent, RMS over "
             f"{a.seeds} batch seeds (final / largest over records every {a.record_every}).", "",
             f"Exact run: final loss {ex.loss[-1]:.4f}, mean attention to parent {ex_attn[-1]:.3f}; Bayes "
             f"{pg.bayes_loss(task):.4f}.", "",
             "| batch | loss diff: final | max | attn diff: final | max | sampled final attn (mean over seeds) |",
             "|---|---|---|---|---|---|"]
    fin_loss, fin_attn = [], []
    for B in a.batch_sizes:
        dl, da, fin = [], [], []
        for s in range(a.seeds):
            tr = pg.train_catformer(task, model, a.steps, **sgd_kw(a, gradient="sampled", batch_size=B,
                                                                 sample_seed=s))
            L = np.array([pg.catformer_loss_and_grad(task, model, tr.params(r)).loss for r in range(len(tr.step))])
            at = np.array([mean_pos_attn(task, model, tr.params(r)) for r in range(len(tr.step))])
            dl.append(L - ex.loss)
            da.append(at - ex_attn)
            fin.append(at[-1])
        rl = np.sqrt(np.mean(np.square(dl), axis=0))
        ra = np.sqrt(np.mean(np.square(da), axis=0))
        lines.append(f"| {B} | {rl[-1]:.4f} | {rl.max():.4f} | {ra[-1]:.4f} | {ra.max():.4f} | {np.mean(fin):.3f} |")
        fin_loss.append(rl[-1])
        fin_attn.append(ra[-1])
    _figure(a.out, "pairing_batch.png", [a.batch_sizes] * 2, {"loss": fin_loss, "attention to parent": fin_attn},
            "batch size", "RMS distance to the exact run (final)", f"S = {a.S}, T = {T}, {a.steps} steps", logx=True)
    lines += ["", f"Reproduce: python examples/catformer_pairing.py --parts batch --S {a.S} --T-batch {T} --steps "
                  f"{a.steps} --batch-sizes {','.join(map(str, a.batch_sizes))} --seeds {a.seeds}"]
    return "\n".join(lines)


def linresp_grid(steps, every=0):
    """0, 1, 2, 4, … and every ``every`` steps (0: every eighth of the run): where the exact Hessian and noise
    covariance are evaluated."""
    pts = {0, steps} | {2**k for k in range(steps.bit_length()) if 2**k < steps}
    pts |= {steps * j // 8 for j in range(1, 8)} if every <= 0 else set(range(0, steps, every))
    return sorted(pts)


def part_linresp(a):
    from popgrad.checks.linear_response import attention_readout, catformer_linear_response
    from popgrad.engine.hvp import flatten_params

    T, steps, Bs = a.T_linresp, a.steps_linresp, a.batch_sizes_linresp
    task = pg.Task(pg.random_tree(T, seed=a.graph_seed_linresp, root_prob=0.5), pg.DirichletPrior(a.S, a.alpha))
    model = pg.CatFormer(a.S, T)
    t0 = time.perf_counter()
    kw = dict(optimizer="sgd", lr=1.0, lr_schedule="constant", init="zero", record_every=1)
    ex = pg.train_catformer(task, model, steps, **kw)
    grid = linresp_grid(steps, a.grid_linresp)
    pred = catformer_linear_response(task, model, [ex.params(t) for t in grid], 1.0, Bs, steps=grid, progress=True)
    t_pred = time.perf_counter() - t0
    theta_ex = np.stack([flatten_params(ex.params(t)) for t in grid])
    meas = {}
    for B in Bs:
        d2, dl, da = [], [], []
        for s in range(a.seeds_linresp):
            tr = pg.train_catformer(task, model, steps, **kw, gradient="sampled", batch_size=B, sample_seed=s)
            ps = [tr.params(t) for t in grid]
            d2.append([float(np.sum((flatten_params(p) - th) ** 2)) for p, th in zip(ps, theta_ex)])
            dl.append([pg.catformer_loss_and_grad(task, model, p).loss for p in ps])
            da.append([attention_readout(task, model, p)[0] for p in ps])
        meas[B] = (np.array(d2), np.array(dl) - pred.loss, np.array(da) - pred.attn)
        print(f"linresp: batch {B} done, {time.perf_counter() - t0:.0f} s", flush=True)
    show = [t for t in grid if t > 0 and (t & (t - 1) == 0 and t >= min(16, steps) or t == steps)]
    lines = [f"S = {a.S}, T = {T}, graph {task.graph.to_string()}, continuous Dirichlet({a.alpha:g}) prior, SGD lr 1 "
             f"constant from zero, {steps} steps, {a.seeds_linresp} batch seeds per batch size. Measured: the sampled "
             f"runs' parameters against the exact run's (E‖δ‖², mean over seeds ± SE), their exact population loss "
             f"and attention to the parent (positional block, mean over non-root positions) minus the exact run's "
             f"(RMS over seeds). Predicted: linear response around the exact run (tr C, sqrt((½tr(HC))² + ∇LᵀC∇L + "
             f"½tr((HC)²)), sqrt(∇aᵀC∇a)), exact Hessian and soft-label noise covariance at steps "
             f"{', '.join(map(str, grid))}, held constant in between.", "",
             "max |1 − ηλ(H)| at those steps (above 1: the linearised deviation grows there): "
             + ", ".join(f"{t}: {g:.3f}" for t, g in zip(grid, pred.growth)), "",
             f"Exact run: loss {pred.loss[0]:.4f} → {pred.loss[-1]:.4f} (Bayes {pg.bayes_loss(task):.4f}), attention "
             f"to parent {pred.attn[0]:.3f} → {pred.attn[-1]:.3f}.", "",
             "| batch | step | E‖δ‖² measured | predicted | ratio | RMS loss gap measured | predicted | "
             "RMS attn gap measured | predicted |", "|---|---|---|---|---|---|---|---|---|"]
    for bi, B in enumerate(Bs):
        d2, dl, da = meas[B]
        for t in show:
            r = grid.index(t)
            m2, se2 = d2[:, r].mean(), d2[:, r].std(ddof=1) / math.sqrt(len(d2)) if len(d2) > 1 else float("nan")
            lines.append(f"| {B} | {t} | {m2:.3g} ± {se2:.2g} | {pred.sq_dist[bi, r]:.3g} | "
                         f"{m2 / pred.sq_dist[bi, r]:.2f} | {np.sqrt(np.mean(dl[:, r] ** 2)):.2g} | "
                         f"{pred.loss_rms[bi, r]:.2g} | {np.sqrt(np.mean(da[:, r] ** 2)):.2g} | "
                         f"{pred.attn_sd[bi, r]:.2g} |")
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for bi, B in enumerate(Bs):
        line, = ax.plot(grid[1:], meas[B][0].mean(axis=0)[1:], "o", ms=3, label=f"B = {B} measured")
        ax.plot(grid[1:], pred.sq_dist[bi, 1:], "-", color=line.get_color(), label=f"B = {B} predicted")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("E‖θ_sampled − θ_exact‖²")
    ax.legend(fontsize=6, ncol=2)
    save_figure(fig, f"{a.out}/pairing_linresp.png")
    lines += ["", f"Prediction: {t_pred:.0f} s (exact run and {len(grid)} Hessians). Reproduce: python "
                  f"examples/catformer_pairing.py --parts linresp --S {a.S} --T-linresp {T} --graph-seed-linresp "
                  f"{a.graph_seed_linresp} --steps-linresp {steps} --batch-sizes-linresp "
                  f"{','.join(map(str, Bs))} --seeds-linresp {a.seeds_linresp}"
                  + (f" --grid-linresp {a.grid_linresp}" if a.grid_linresp > 0 else "")]
    return "\n".join(lines)


def part_T(a):
    lines = [f"Figure-9 metric (positional block, mean over non-root positions per graph; mean ± sd over {a.graphs} "
             f"graphs random_tree(T, seed=g, root_prob=0.5)), S = {a.S}, continuous Dirichlet({a.alpha:g}), SGD lr 1 "
             f"constant from zero, {a.steps} steps; sampled: batch {a.batch_size}.", "",
             "| T | gradient | attention to parent: mean ± sd | per graph | final loss − Bayes (exact; mean) | seconds |",
             "|---|---|---|---|---|---|"]
    curves = {"exact": ([], []), "sampled": ([], [])}
    for T in sorted(set(a.T_exact) | set(a.T_sampled)):
        for grad in ("exact", "sampled"):
            if T not in (a.T_exact if grad == "exact" else a.T_sampled):
                continue
            t0 = time.perf_counter()
            vals, gaps = [], []
            for g in range(a.graphs):
                task = pg.Task(pg.random_tree(T, seed=g, root_prob=0.5), pg.DirichletPrior(a.S, a.alpha))
                model = pg.CatFormer(a.S, T)
                kw = sgd_kw(a, gradient="sampled", batch_size=a.batch_size, sample_seed=g) if grad == "sampled" \
                    else sgd_kw(a)
                kw["record_every"] = a.steps
                tr = pg.train_catformer(task, model, a.steps, **kw)
                nr = [i for i in task.graph.non_roots if i < T - 1]
                vals.append(mean_pos_attn(task, model, tr.final) if nr else np.nan)
                print(f"T = {T}, {grad}, graph {g} ({task.graph.to_string()}): attention to parent {vals[-1]:.3f}, "
                      f"{time.perf_counter() - t0:.0f} s", flush=True)
                if task.n_sequences <= 3**10:
                    gaps.append(pg.catformer_loss_and_grad(task, model, tr.final).loss - pg.bayes_loss(task))
            m, sd = finite_stats(np.array(vals))[:2]
            gap = f"{np.mean(gaps):.4f}" if gaps else "n/a (T beyond enumeration)"
            lines.append(f"| {T} | {grad} | {float(m):.3f} ± {float(sd):.3f} | {', '.join(f'{v:.2f}' for v in vals)} | "
                         f"{gap} | {time.perf_counter() - t0:.0f} |")
            print(lines[-1], flush=True)
            curves[grad][0].append(T)
            curves[grad][1].append(float(m))
    keep = {k: v for k, v in curves.items() if v[0]}
    _figure(a.out, "pairing_T.png", [v[0] for v in keep.values()], {k: v[1] for k, v in keep.items()}, "T",
            "mean attention to parent (positional)", f"S = {a.S}, {a.graphs} graphs, {a.steps} steps")
    lines += ["", f"Reproduce: python examples/catformer_pairing.py --parts T --S {a.S} --steps {a.steps} --graphs "
                  f"{a.graphs} --T-exact {','.join(map(str, a.T_exact))} --T-sampled "
                  f"{','.join(map(str, a.T_sampled))} --batch-size {a.batch_size}"]
    return "\n".join(lines)


def part_heads(a):
    T = a.T_heads
    task = pg.MultiParentTask(pg.two_parent(T), pg.DirichletTensorPrior(2, 2, a.alpha))
    model = pg.CatFormer(2, T, heads=(2, 1))
    lines = [f"two-parent graph, S = 2, T = {T}, DirichletTensorPrior(2, 2, {a.alpha:g}), heads (2, 1), start "
             f"1e-4·N(0,1) seed 0, {a.steps} steps; sampled: batch {a.batch_size}, batch seed 0.", "",
             "| optimizer | gradient | heads' difference: start | end | M[h, slot] (positional, final) | strict split | "
             "soft split | final loss (exact) |", "|---|---|---|---|---|---|---|---|"]
    diffs = {}
    for opt, lr, wd in (("sgd", 1.0, 0.0), ("adamw", 1e-2, 1e-4)):
        for grad in ("exact", "sampled"):
            kw = dict(optimizer=opt, lr=lr, lr_schedule="cosine", weight_decay=wd, init=("normal", 1e-4, 0),
                      record_every=a.steps)
            if grad == "sampled":
                kw.update(gradient="sampled", batch_size=a.batch_size, sample_seed=0)
            tr = pg.train_catformer(task, model, a.steps, **kw)
            d = cc.heads_difference(np.stack(tr.A[0]))
            diffs[f"{opt}/{grad}"] = d
            P = cc.positional_attention(model, tr.final)
            M = cc.slot_attention(task.graph, P)
            strict = check_head_specialization(task, tr.final.A[0][:, 2:, 2:])
            loss = pg.catformer_loss_and_grad(task, model, tr.final).loss
            lines.append(f"| {opt} | {grad} | {d[0]:.2e} | {d[-1]:.3g} | {np.round(M, 2).tolist()} | "
                         f"{'yes' if strict.passed else 'no'} ({strict.value:.2f}) | "
                         f"{'yes' if cc.soft_split(M) else 'no'} | {loss:.4f} |")
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.bar(list(diffs), [v[-1] for v in diffs.values()])
    ax.set_yscale("log")
    ax.set_ylabel("heads' difference at the end")
    save_figure(fig, f"{a.out}/pairing_heads.png")
    lines += ["", f"Bayes loss {pg.bayes_loss(task):.4f}. Reproduce: python examples/catformer_pairing.py --parts heads "
                  f"--T-heads {T} --steps {a.steps} --batch-size {a.batch_size}"]
    return "\n".join(lines)


def main():
    a = args_of()
    from _common import ensure_out
    out = a.out = ensure_out(a.out)
    for part, fn in (("batch", part_batch), ("linresp", part_linresp), ("T", part_T), ("heads", part_heads)):
        if part in a.parts:
            write(out, f"pairing_{part}.md", fn(a))


if __name__ == "__main__":
    main()
