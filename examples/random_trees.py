"""Random causal trees
===================

Random causal trees, exactly (paper §3.1): one heatmap per tree.

Beyond the chain and the pairs, the paper's theory covers any causal forest: each position copies its parent
through the same random transition matrix π, or is a root (a fresh token). Each tree here is drawn by
``popgrad.random_tree``; Stage 1 of Algorithm 1 should recover every parent edge, and the roots' rows should
stay near uniform (Knowl 3.3). The figures show ``softmax(A1)`` beside the true adjacency.

Run it with ``python examples/random_trees.py --out examples_out/random_trees`` (seconds; ``--quick`` is
accepted and runs the same: Stage 1 alone is quick, and half the steps would stop short of recovery).
"""

# %%
# Where the figures go
# --------------------
# ``--out`` names the folder (``--quick``, which the gallery passes, changes nothing here). In a notebook
# the defaults apply.
import argparse
import os

import popgrad as pg
from popgrad import checks
from popgrad.app.plots import plot_attention

cli = argparse.ArgumentParser(description="Random causal trees, exactly: one heatmap per tree.")
cli.add_argument("--out", default="examples_out/random_trees", help="folder for the figures")
cli.add_argument("--quick", action="store_true", help="accepted, the same run (it takes seconds)")
args, _ = cli.parse_known_args()
os.makedirs(args.out, exist_ok=True)

# %%
# The prior
# ---------
# One prior for every tree: 8 Dirichlet(1) draws of a 3 × 3 transition matrix closed under the token
# relabelings, mixed with the uniform matrix (``floor=0.15``, γ ≥ 0.1) and tilted to a uniform mean: inside
# the assumptions of Knowl 10.
prior = pg.dirichlet_prior(3, 1.0, 8, seed=2, uniform_mean=True, floor=0.15)
print(prior.summary())

# %%
# Three trees, Stage 1 on each
# ----------------------------
# ``random_tree(9, seed, root_prob=0.15)``: each position after the first is a root with probability 0.15,
# else its parent is uniform among the earlier positions. Stage 1 only (300 steps, ``steps2=0``): the checks read
# ``softmax(A1)``. Graph recovery passes when every non-root row puts at least 1 − 1/T on its parent; the
# roots check measures how far the roots' rows drift from uniform, and says when T is too small for the
# asymptotic statement.
steps1 = 300
for seed in range(3):
    graph = pg.random_tree(9, seed=seed, root_prob=0.15)
    task = pg.Task(graph, prior)
    print(graph.summary())
    traj = pg.train_two_stage(task, beta0=1e-3, lr1=2.0, steps1=steps1, steps2=0)
    A1 = traj.A1[traj.stage1_end]
    for c in (checks.check_graph_recovery(task, A1), checks.check_roots(task, A1)):
        print(f"  {c.name}: {c.status} ({c.outcome if c.status in ('pass', 'fail') else c.reason})")
    plot_attention(graph, A1, os.path.join(args.out, f"tree_{seed}.png"), title=f"tree seed {seed}")
print("figures:", ", ".join(sorted(f for f in os.listdir(args.out) if f.endswith(".png"))))
