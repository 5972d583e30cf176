"""Induction head
==============

Induction head, exactly: a Markov chain in context (paper §2.3; the full model's version is Figure 2).

Positions 0..T-2 form one Markov chain whose transition matrix π is drawn from a prior; the query T-1 asks
for π(· | s_{T-1}), which only the context can tell. The paper's two-stage gradient descent (Algorithm 1) on
the reduced two-layer model should first make every position attend to its predecessor (the previous-token
head, Stage 1) and then grow the second layer along the identity (the induction head, Stage 2). popgrad runs
it on the exact population loss: every one of the S^T sequences with its exact probability.

Run it with ``python examples/induction_head.py --out examples_out/induction_head`` (``--quick``: half the
steps).
"""

# %%
# Where the figures go
# --------------------
# ``--out`` names the folder, ``--quick`` halves the steps (the gallery runs it that way). In a notebook the
# defaults apply (``parse_known_args`` ignores the kernel's own arguments).
import argparse
import os

import popgrad as pg
from popgrad import checks
from popgrad.app.plots import plot_attention, plot_loss

cli = argparse.ArgumentParser(description="Induction head, exactly: a Markov chain in context.")
cli.add_argument("--out", default="examples_out/induction_head", help="folder for the figures")
cli.add_argument("--quick", action="store_true", help="half the steps (a smoke test)")
args, _ = cli.parse_known_args()
os.makedirs(args.out, exist_ok=True)

# %%
# The task
# --------
# The chain graph on T = 10 positions (the last one is the query) and a finite prior: 8 Dirichlet(1) draws of
# a 3 × 3 transition matrix, closed under the 3! relabelings of the tokens. ``floor=0.15`` mixes each draw
# with the uniform matrix so that every transition has probability at least γ/S with γ ≥ 0.1, and
# ``uniform_mean=True`` tilts the weights so that the prior's mean is the uniform matrix: the two
# assumptions on the prior (Knowl 10.1 and 10.3) that the convergence theorem (Knowl 1) needs.
# ``task.summary()`` measures them.
task = pg.Task(pg.chain(10), pg.dirichlet_prior(3, 1.0, 8, seed=0, uniform_mean=True, floor=0.15))
print(task.summary())

# %%
# Algorithm 1
# -----------
# Stage 1 trains the first layer ``A1`` from zero with the second layer frozen at ``beta0 · I``; Stage 2
# trains ``A2``. Step sizes are in the natural units of ``popgrad.train_two_stage`` (DESIGN §3).
steps = 150 if args.quick else 300
traj = pg.train_two_stage(task, beta0=1e-3, lr1=2.0, steps1=steps, lr2=2.0, steps2=steps)
A1 = traj.A1[traj.stage1_end]  # the first layer when Stage 1 ends
print(f"{traj.status}: {len(traj.loss)} recorded steps, final exact loss {traj.loss[-1]:.4f}")

# %%
# The verdicts
# ------------
# Each check returns a number, its threshold and a status: ``pass`` / ``fail`` inside the theorem's
# hypotheses, ``inconclusive`` (with the reason) outside them. Graph recovery (Knowl 1.1) asks for
# ``softmax(A1)[i, i-1] ≥ 1 − 1/T`` in every row; loss convergence (Knowl 1.2) compares the trained model's
# loss with the in-context count estimator's.
refs = checks.reference_losses(task)
results = [checks.check_graph_recovery(task, A1),
           checks.check_loss_convergence(task, traj.final_A1, traj.final_A2, 1e-3, references=refs),
           checks.check_roots(task, A1)]
for c in results:
    print(f"{c.name}: {c.status} ({c.outcome if c.status in ('pass', 'fail') else c.reason})")

# %%
# The figures
# -----------
# ``softmax(A1)`` after Stage 1 beside the true adjacency (the previous-token head), and the exact loss
# against the step with the reference losses (the Bayes loss, the count estimator's, ``L*``).
plot_attention(task.graph, A1, os.path.join(args.out, "attention.png"))
plot_loss(traj, refs, os.path.join(args.out, "loss.png"))
print("figures:", ", ".join(sorted(f for f in os.listdir(args.out) if f.endswith(".png"))))
