"""Attention to the parent over many random graphs
===============================================

Attention to the parent per position over many random graphs (paper Figure 9 analogue).

For each of N random trees, run Stage 1 exactly and record
softmax(A1)[i, p(i)] for every non-root position i; plot the mean and the
spread per position. Theory: close to 1 everywhere, at least 1 - O(1/T).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure

from _common import ensure_out, finite_stats, parser, train_settings


def main():
    p = parser(__doc__, "examples_out/many_graphs", quick_help="4 graphs, half the steps (a smoke test)")
    p.add_argument("--graphs", type=int, default=12)
    p.add_argument("--T", type=int, default=9)
    args = p.parse_args()
    out = ensure_out(args.out)
    prior = pg.dirichlet_prior(3, 1.0, 8, seed=3, uniform_mean=True)
    T = args.T
    n_graphs = min(args.graphs, 4) if args.quick else args.graphs
    attn = np.full((n_graphs, T), np.nan)
    for n in range(n_graphs):
        graph = pg.random_tree(T, seed=100 + n, root_prob=0.15)
        traj = pg.train_two_stage(pg.Task(graph, prior), **dict(train_settings(args.quick), steps2=0))
        attn[n] = traj.attn_parent[traj.stage1_end]
    mean, _, lo, hi, count = finite_stats(attn, axis=0)
    pos = np.arange(T)
    ok = count > 0
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.errorbar(pos[ok], mean[ok], yerr=[mean[ok] - lo[ok], hi[ok] - mean[ok]], fmt="o", capsize=3)
    ax.axhline(1 - 1 / T, ls="--", color="k", lw=0.8, label="1 - 1/T")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position i")
    ax.set_ylabel("softmax(A1)[i, p(i)] (mean, min-max)")
    ax.legend()
    save_figure(fig, os.path.join(out, "attention_to_parent.png"))
    print("position  mean     min")
    for i in pos[ok]:
        print(f"{i:8d}  {mean[i]:.4f}  {lo[i]:.4f}")
    print(f"overall min attention to parent: {np.nanmin(attn):.4f} over {n_graphs} graphs")
    print("written:", ", ".join(sorted(os.listdir(out))))


if __name__ == "__main__":
    main()
