"""Full model: how two heads break their symmetry
==============================================

How two heads break their symmetry on the two-parent graph, measured on exact trajectories.

With exact gradients a run is a deterministic function of its start, so
the heads' split can be followed from the 1e-4 start upward. Three arms on
the same task (two-parent graph ``p(i) = ((i-1)//2, i-1)``, S = 2, Dirichlet(α)
tensors, α = 0.1 as in the official run by default, 16 draws closed under
parent and token relabelings):

* ``full/adamw``: the full model, heads (2, 1), the official recipe
  (AdamW lr 1e-2, wd 1e-4, cosine; ``Ã ~ scale·N(0,1)``, ``W = 0``);
* ``full/sgd``: the same model and start, SGD lr 1 with cosine decay
  (separates the optimizer from the architecture);
* ``reduced/gd``: the reduced k-head model (``popgrad.train_multi_head``, joint
  gradient descent, ``A1^h ~ scale·N(0,1)``, ``A2 = 2·I``).

Per run: whether the heads split the two parents one-to-one at the end
(*strict*: :func:`popgrad.checks.check_head_specialization` on the
population-average attention, every row's argmax on its head's slot;
*soft*: each head's mean attention on slot σ's parents, ``M[h, σ]``, has its
row maxima on distinct slots), the step from which the soft split holds to
the end, the loss there and at the start and end, and the heads'
difference ``‖Ã^(1)_0 − Ã^(1)_1‖_F`` (reduced: ``‖A1^0 − A1^1‖_F``) along
the trajectory.

Writes ``symmetry_table.md`` and ``heads_difference.png``.
"""
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure
from popgrad.checks import catformer as cc
from popgrad.model.multihead import head_attention

from _catformer import two_parent_task, write
from _symmetry_study import (ARMS, basin_main, curvature_main, long_main, plateau_main, stability_main,
                             study_main, sweep_main)
from _common import ensure_out, parser


def split_step(steps, splits):
    """First recorded step from which ``splits`` is True through the end (None if not split at the end)."""
    splits = list(splits)
    if not splits or not splits[-1]:
        return None
    r = len(splits) - 1
    while r > 0 and splits[r - 1]:
        r -= 1
    return int(steps[r])


def first_steps(task, scale, seed, steps=(2, 5, 10, 20)):
    """The first updates from the ``scale·N(0,1)`` start with each optimizer: how the heads' difference grows.

    ``W = 0`` at the start, so step 0 moves only ``W`` (every ``Ã`` gradient is zero); from step 1 on the
    layer-1 gradients are nonzero. Returns ``(diff0, {optimizer: [diff at each of steps]}, opposite)``:
    the heads' difference at the start, along the first updates (AdamW 1e-2 and SGD 1, constant lr), and
    the fraction of layer-1 coordinates where the two heads' gradients at step 1 have opposite signs.
    """
    model = pg.CatFormer(task.S, task.T, heads=(2, 1))
    out, opposite = {}, float("nan")
    for name, lr in (("adamw", 1e-2), ("sgd", 1.0)):
        traj = pg.train_catformer(task, model, max(steps), optimizer=name, lr=lr, lr_schedule="constant",
                                  weight_decay=1e-4 if name == "adamw" else 0.0, init=("normal", scale, seed),
                                  record_every=1)
        d = cc.heads_difference(traj.A[0])
        out[name] = [float(d[t]) for t in steps]
        if name == "adamw":
            g = pg.catformer_loss_and_grad(task, model, traj.params(1)).dA[0]
            opposite = float(np.mean(np.sign(g[0]) * np.sign(g[1]) < 0))
            d0 = float(d[0])
    return d0, out, opposite


def run_full(task, optimizer, lr, wd, scale, seed, steps):
    model = pg.CatFormer(task.S, task.T, heads=(2, 1))
    traj = pg.train_catformer(task, model, steps, optimizer=optimizer, lr=lr, lr_schedule="cosine",
                              weight_decay=wd, init=("normal", scale, seed), record_every=max(1, steps // 64))
    soft = [cc.soft_split(cc.slot_attention(task.graph, cc.population_attention(task, model, traj.params(r))))
            for r in range(len(traj.step))]
    strict = cc.check_catformer_head_specialization(task, model, traj.final)
    M = cc.slot_attention(task.graph, cc.population_attention(task, model, traj.final))
    return traj.step, traj.loss, cc.heads_difference(traj.A[0]), soft, strict.status, M, traj.status


def run_reduced(task, scale, seed, steps):
    traj = pg.train_multi_head(task, beta0=2.0, lr1=2.0, steps1=steps, steps2=0, schedule="joint",
                               init_seed=seed, init_scale=scale, record_every=max(1, steps // 64))
    soft = [cc.soft_split(cc.slot_attention(task.graph, head_attention(a))) for a in traj.A1]
    strict = pg.checks.check_head_specialization(task, traj.A1[-1])
    M = cc.slot_attention(task.graph, head_attention(traj.A1[-1]))
    diff = np.sqrt(np.sum((traj.A1[:, 0] - traj.A1[:, 1]) ** 2, axis=(1, 2)))
    return traj.step, traj.loss, diff, soft, strict.status, M, traj.status


def main():
    p = parser(__doc__, "examples_out/catformer_symmetry", quick_help="T = 6, 100 steps, 2 seeds (smoke test)")
    p.add_argument("--T", type=int, default=8)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--prior", choices=("continuous", "finite"), default="continuous",
                   help="continuous: the official DirichletTensorPrior (default); finite: 16 tensors closed under "
                        "relabeling")
    p.add_argument("--steps", type=int, default=4096)
    p.add_argument("--seeds", type=int, default=8, help="seeds of the 1e-4 start (full/adamw)")
    p.add_argument("--scales", default="1e-2,1", help="further init scales (--scale-seeds seeds each)")
    p.add_argument("--scale-seeds", type=int, default=2)
    p.add_argument("--stability", action="store_true",
                   help="the exact stability study from the symmetric start (stability_table.md)")
    p.add_argument("--plateaus", action="store_true", help="GD plateaus and escape vs lr (plateau_table.md)")
    p.add_argument("--curvature", action="store_true",
                   help="curvature of the parent-split direction at GD's end (curvature_table.md)")
    p.add_argument("--basin", action="store_true",
                   help="GD from the symmetric end point plus t units of the parent-split direction (basin_table.md)")
    p.add_argument("--offsets", default="0,2", help="t values for --basin")
    p.add_argument("--sweep", action="store_true", help="S x T sweep: GD/AdamW, spectrum at GD's end (sweep_table.md)")
    p.add_argument("--study", action="store_true",
                   help="the official-task study: GD, AdamW, SGD and AdamW on sampled batches from the symmetric "
                        "start, spectra, linearisation, read-outs (study_table.md)")
    p.add_argument("--long", action="store_true",
                   help="plain GD (constant lr) for --stab-steps steps from the symmetric start (long_table.md)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"arms of --study, from {', '.join(ARMS)}")
    p.add_argument("--lin-steps", type=int, default=128, help="--study: steps the linearisation is carried")
    p.add_argument("--batch-size", type=int, default=1024, help="--study: sequences per sampled batch")
    p.add_argument("--sizes", default="2x6,2x8", help="SxT list for --stability / --plateaus")
    p.add_argument("--optimizers", default="gd,adamw")
    p.add_argument("--stab-steps", type=int, default=1024)
    p.add_argument("--epsilon", type=float, default=1e-8, help="antisymmetric perturbation of the symmetric start")
    p.add_argument("--lrs", default="0.5,1,2", help="learning rates for --plateaus")
    args = p.parse_args()
    out = ensure_out(args.out)
    if args.stability or args.plateaus or args.sweep or args.curvature or args.basin or args.study or args.long:
        if args.quick:
            args.sizes, args.stab_steps, args.lin_steps, args.batch_size = "2x4", 16, 8, 64
        if args.stability:
            stability_main(args, out)
        if args.plateaus:
            plateau_main(args, out)
        if args.sweep:
            sweep_main(args, out)
        if args.curvature:
            curvature_main(args, out)
        if args.basin:
            basin_main(args, out)
        if args.study:
            study_main(args, out)
        if args.long:
            long_main(args, out)
        return
    S = 2
    if args.quick:
        T, steps, seeds, scales, scale_seeds = 6, 100, 2, [1e-1], 1
    else:
        T, steps, seeds, scales, scale_seeds = args.T, args.steps, args.seeds, \
            [float(s) for s in args.scales.split(",") if s], args.scale_seeds
    alpha = 1.0 if args.quick else args.alpha
    task = two_parent_task(S, T, alpha=alpha, prior=args.prior)
    bayes, lstar = pg.bayes_loss(task), pg.optimal_loss(task)
    plan = [("full/adamw", 1e-4, s) for s in range(seeds)]
    plan += [("full/adamw", sc, s) for sc in scales for s in range(scale_seeds)]
    plan += [("full/sgd", 1e-4, s) for s in range(scale_seeds)]
    plan += [("reduced/gd", sc, s) for sc in [1e-4] + scales for s in range(scale_seeds)]
    runs = []
    t0 = time.perf_counter()
    for arm, scale, seed in plan:
        if arm == "full/adamw":
            res = run_full(task, "adamw", 1e-2, 1e-4, scale, seed, steps)
        elif arm == "full/sgd":
            res = run_full(task, "sgd", 1.0, 0.0, scale, seed, steps)
        else:
            res = run_reduced(task, scale, seed, steps)
        runs.append((arm, scale, seed, *res))
        st, loss, diff, soft, strict, M, status = res
        print(f"{arm:10s} scale {scale:g} seed {seed}: strict {strict}, soft {soft[-1]}, split step "
              f"{split_step(st, soft)}, loss {loss[-1]:.4f}, diff {diff[0]:.2e} -> {diff[-1]:.2e} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    n = len(runs[0][3])
    q = [0, n // 16, n // 4, n - 1]
    lines = [f"two-parent graph, S = {S}, T = {T}, alpha = {alpha:g}, {steps} steps (cosine), Bayes loss {bayes:.4f}, "
             f"L* {lstar:.4f}; the reduced arm's losses are its own ε-loss (linear readout), not comparable.",
             f"Records every {max(1, steps // 64)} steps; M[h, σ] = head h's mean attention on slot σ's parents "
             "(slot 0: (i-1)//2, slot 1: i-1; population average for the full model).", "",
             "| arm | init scale | seed | strict split (head_specialization status) | soft split | split step | loss at step 0 | loss at split "
             "| final loss | M (final) | heads' difference at steps " + ", ".join(str(int(runs[0][3][i])) for i in q)
             + " | status |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, scale, seed, st, loss, diff, soft, strict, M, status in runs:
        ss = split_step(st, soft)
        at = float(loss[list(st).index(ss)]) if ss is not None else float("nan")
        lines.append(f"| {arm} | {scale:g} | {seed} | {strict} | {'yes' if soft[-1] else 'no'} | "
                     f"{ss if ss is not None else '-'} | {loss[0]:.4f} | {at:.4f} | {loss[-1]:.4f} | "
                     f"{np.array2string(M, precision=2, separator=',').replace(chr(10), '')} | "
                     + ", ".join(f"{diff[i]:.3g}" for i in q) + f" | {status} |")
    lines += ["", "| arm | init scale | runs | strict split (passes) | soft split |", "|---|---|---|---|---|"]
    for arm in ("full/adamw", "full/sgd", "reduced/gd"):
        for scale in sorted({r[1] for r in runs if r[0] == arm}):
            sel = [r for r in runs if r[0] == arm and r[1] == scale]
            lines.append(f"| {arm} | {scale:g} | {len(sel)} | {sum(r[7] == 'pass' for r in sel)}/{len(sel)} | "
                         f"{sum(bool(r[6][-1]) for r in sel)}/{len(sel)} |")
    lines += ["", "The first updates from the start (seed 0, constant lr; W = 0 so step 0 moves only W): the heads' "
                  "difference at steps 0 / 2, 5, 10, 20, and the fraction of layer-1 coordinates whose two head "
                  "gradients at step 1 have opposite signs:", ""]
    for scale in [1e-4] + scales:
        d0, d1, opp = first_steps(task, scale, 0)
        lines.append(f"- scale {scale:g}: {d0:.3g} / AdamW " + ", ".join(f"{v:.3g}" for v in d1["adamw"])
                     + " / SGD " + ", ".join(f"{v:.3g}" for v in d1["sgd"]) + f"; opposite-sign fraction {opp:.2f}")
    lines += ["", f"Reproduce: python examples/catformer_symmetry.py --T {T} --alpha {alpha:g} --prior {args.prior} --steps {steps} "
                  f"--seeds {seeds} "
                  f"--scales {','.join(f'{s:g}' for s in scales)} --scale-seeds {scale_seeds}",
              f"{len(runs)} runs in {time.perf_counter() - t0:.0f} s."]
    write(out, "symmetry_table.md", "\n".join(lines))
    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"full/adamw": "tab:blue", "full/sgd": "tab:orange", "reduced/gd": "tab:green"}
    seen = set()
    for arm, scale, seed, st, loss, diff, *_ in runs:
        ax.plot(np.maximum(st, 1), np.maximum(diff, 1e-300), color=colors[arm], alpha=0.6, lw=1,
                label=arm if arm not in seen else None)
        seen.add(arm)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("step (step 0 drawn at 1)")
    ax.set_ylabel("heads' difference ||A_0 - A_1||_F")
    ax.set_title(f"two-parent, S = {S}, T = {T}: exact trajectories from scale·N(0, 1) starts", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, f"{out}/heads_difference.png")


if __name__ == "__main__":
    main()
