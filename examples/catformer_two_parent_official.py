"""Full model: Figures 5 / 7 at the official size
==============================================

Figures 5 / 7 at the official size: S = 5, T = 32, the two-parent graph, heads (2, 1), sampled AdamW.

The official ``multi_parent.ipynb``: parents ``[(i-1)//2, i-1]`` (``popgrad.two_parent(T)``), the
continuous prior of ``InContextDAG`` (each of the S^2 rows of the transition tensor Dirichlet(α = 0.1),
roots uniform: ``popgrad.DirichletTensorPrior(S, 2, α)``), every ``Ã`` from ``1e-4·N(0, 1)``, ``W = 0``,
``optax.adamw(cosine_decay_schedule(1e-2, 2^16), weight_decay=1e-4)``, 2^16 steps of fresh batches of
1024. Figure 7 shows each layer-1 head's positional block ``softmax(MASK(Ã^(1)_h[S:, S:]))`` attending to
one of the two parents.

Here: the same with popgrad's sampled gradient, for ``--seeds`` starts (seed k: ``init_seed = k``,
``sample_seed = k``). Each run checkpoints and resumes; ``--table-only`` writes
``two_parent_official_table.md`` from the runs as far as they got. Per run: the step reached, the loss and
the official ``bayes`` (edges only; under uniform roots it is the exact posterior predictive, so it is the
Bayes loss) on a held-out sample with SE, ``M[h, σ]`` = head h's mean positional attention on slot σ's
parent (exact: a parameter; slot 0 = (i-1)//2, slot 1 = i-1), the strict split (every row's argmax on its
head's slot under one head→slot assignment and every such attention's lift over uniform ≥ 0.5,
``popgrad.checks.check_head_specialization`` on the positional logits; the table gives the fraction of
(head, row) pairs that agree, the smallest lift and the pairs that do not) and the soft split (the heads'
preferred slots differ).

Full run: ``python catformer_two_parent_official.py --seeds 2``.
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure
from popgrad.checks import catformer as cc
from popgrad.checks.catformer_sampled import sampled_loss_estimates
from popgrad.checks.theorems import check_head_specialization

from _catformer import write
from _common import parser
from _official import fmt_est, read_checkpoint, train_or_resume


def args_of():
    p = parser(__doc__, "examples_out/catformer_two_parent_official", quick_help="S = 2, T = 6, 20 steps, batch 32")
    p.add_argument("--S", type=int, default=5)
    p.add_argument("--T", type=int, default=32)
    p.add_argument("--steps", type=int, default=2**16)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--init-scale", type=float, default=1e-4)
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    p.add_argument("--eval-n", type=int, default=8192)
    p.add_argument("--checkpoint-every", type=int, default=256)
    p.add_argument("--table-only", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.S, a.T, a.steps, a.batch_size, a.eval_n, a.checkpoint_every = 2, 6, 20, 32, 256, 8
    return a


def setup(a):
    task = pg.MultiParentTask(pg.two_parent(a.T), pg.DirichletTensorPrior(a.S, 2, a.alpha))
    return task, pg.CatFormer(a.S, a.T, heads=(2, 1))


def ckpt_of(a, seed):
    return os.path.join(a.out, f"seed{seed}_{a.optimizer}.ckpt.npz")


def split_readout(task, model, params):
    """``M (2, 2)`` on the positional block, strict split fraction and verdict, soft split."""
    S = model.S
    P = cc.positional_attention(model, params)
    M = cc.slot_attention(task.graph, P)
    strict = check_head_specialization(task, params.A[0][:, S:, S:])
    return M, strict, cc.soft_split(M)


def _disagreeing(strict) -> str:
    """The (head, row) pairs whose argmax is not the head's slot, when a few."""
    pairs = strict.details.get("disagreeing_head_row_pairs", [])
    return "; off: " + ", ".join(f"h{h} row {i}" for h, i in pairs) if 0 < len(pairs) <= 4 else ""


def table(a):
    task, model = setup(a)
    lines = [f"two-parent graph, S = {a.S}, T = {a.T}, DirichletTensorPrior(S, 2, {a.alpha:g}) (roots uniform), heads "
             f"(2, 1), Ã ~ {a.init_scale:g}·N(0,1), W = 0, {a.optimizer} lr {a.lr:g} cosine over {a.steps} steps, wd "
             f"{a.weight_decay:g}, sampled batches of {a.batch_size}; losses on {a.eval_n} held-out sequences "
             "(sampled, ± SE).", "",
             "| seed | step reached | loss ± SE | official bayes (= Bayes) ± SE | loss − bayes ± SE | M[h, slot] "
             "(positional, exact) | strict split (rows agreeing; min lift) | soft split |", "|---|---|---|---|---|---|---|---|"]
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        got = read_checkpoint(model, ckpt_of(a, seed))
        if got is None:
            lines.append(f"| {seed} | not started | | | | | | |")
            continue
        t, params, rec, _ = got
        L = sampled_loss_estimates(task, model, params, task.sample(a.eval_n, 4242), bayes=False)
        M, strict, soft = split_readout(task, model, params)
        P = cc.positional_attention(model, params)
        fig, axs = plt.subplots(1, P.shape[0], figsize=(3.2 * P.shape[0], 3.2))
        for h in range(P.shape[0]):
            axs[h].imshow(P[h], vmin=0, vmax=1)
            axs[h].set_title(f"head {h}: softmax(MASK(Ã1[S:, S:]))", fontsize=8)
        fig.suptitle(f"seed {seed}, step {t} of {a.steps}", fontsize=9)
        save_figure(fig, os.path.join(a.out, f"seed{seed}_{a.optimizer}_positional.png"))
        lines.append(f"| {seed} | {t} of {a.steps} | {fmt_est(L['L_model'])} | {fmt_est(L['L_official_bayes'])} | "
                     f"{fmt_est(L['model_minus_official_bayes'], True)} | {np.round(M, 2).tolist()} | "
                     f"{'yes' if strict.passed else 'no'} ({strict.details['agreement_fraction']:.2f}; "
                     f"{strict.value:+.2f}{_disagreeing(strict)}) | {'yes' if soft else 'no'} |")
    quick = " --quick" if a.quick else ""
    lines += ["", f"Reproduce (resumes; --table-only for the runs so far): python "
                  f"examples/catformer_two_parent_official.py --S {a.S} --T {a.T} --steps {a.steps} --seeds {a.seeds} "
                  f"--first-seed {a.first_seed} --optimizer {a.optimizer}{quick}"]
    write(a.out, f"two_parent_official_{a.optimizer}_table.md", "\n".join(lines))


def main():
    a = args_of()
    os.makedirs(a.out, exist_ok=True)
    if not a.table_only:
        task, model = setup(a)
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            traj = train_or_resume(task, model, a.steps, ckpt_of(a, seed), a.checkpoint_every, gradient="sampled",
                                   batch_size=a.batch_size, sample_seed=seed, optimizer=a.optimizer, lr=a.lr,
                                   lr_schedule="cosine", weight_decay=a.weight_decay,
                                   init=("normal", a.init_scale, seed), record_every=max(1, a.steps // 128))
            print(f"seed {seed}: {traj.status} at step {traj.step[-1]}", flush=True)
            table(a)
    table(a)


if __name__ == "__main__":
    main()
