"""Random causal trees
===================

Random causal trees, exactly (paper §3.1): one heatmap per tree.

Each tree is drawn by ``popgrad.random_tree``; Stage 1 should recover every
parent edge; the figure shows softmax(A1) beside the true adjacency.
"""
import os

import popgrad as pg
from popgrad import checks
from popgrad.app.plots import plot_attention

from _common import ensure_out, parser, print_checks, train_settings


def main():
    args = parser(__doc__, "examples_out/random_trees").parse_args()
    out = ensure_out(args.out)
    prior = pg.dirichlet_prior(3, 1.0, 8, seed=2, uniform_mean=True)
    for seed in range(3):
        graph = pg.random_tree(9, seed=seed, root_prob=0.15)
        task = pg.Task(graph, prior)
        print(graph.summary())
        traj = pg.train_two_stage(task, **dict(train_settings(args.quick), steps2=0))
        A1 = traj.A1[traj.stage1_end]
        print_checks([checks.check_graph_recovery(task, A1), checks.check_roots(task, A1)])
        plot_attention(graph, A1, os.path.join(out, f"tree_{seed}.png"), title=f"tree seed {seed}")
    print(f"figures in {out}")


if __name__ == "__main__":
    main()
