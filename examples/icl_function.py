"""In-context function learning
============================

In-context function learning, exactly: pairs (x, y = f(x)) in context (paper §2.3).

The graph is 0 → 1, 2 → 3, ...: each odd position is the image of the even position before it under a
random map drawn from the prior (a transition matrix π: y ~ π(· | x)), and the query asks for π(· | x) of
its own x. Stage 1 of Algorithm 1 should learn exactly these pair edges, Stage 2 the induction head that
reads the answer off the pairs whose x matches. popgrad runs it on the exact population loss.

Run it with ``python examples/icl_function.py --out examples_out/icl_function`` (``--quick``: half the
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

cli = argparse.ArgumentParser(description="In-context function learning, exactly: pairs (x, f(x)) in context.")
cli.add_argument("--out", default="examples_out/icl_function", help="folder for the figures")
cli.add_argument("--quick", action="store_true", help="half the steps (a smoke test)")
args, _ = cli.parse_known_args()
os.makedirs(args.out, exist_ok=True)

# %%
# The task
# --------
# ``pg.icl_pairs(11)``: five (x, y) pairs and the query at position 10 (a root: its x is drawn afresh). The
# prior: 8 Dirichlet(1) draws of a 3 × 3 map, closed under the 3! token relabelings, mixed with the uniform
# matrix (``floor=0.15``: every transition has probability ≥ γ/S with γ ≥ 0.1) and tilted to a uniform mean
# (``uniform_mean=True``), the assumptions (Knowl 10.1, 10.3) under which the theorem (Knowl 1) holds.
task = pg.Task(pg.icl_pairs(11), pg.dirichlet_prior(3, 1.0, 8, seed=1, uniform_mean=True, floor=0.15))
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
# ``softmax(A1)[i, p(i)] ≥ 1 − 1/T`` in every non-root row (p(i) = i − 1 on the odd rows); loss convergence (Knowl 1.2) compares the trained model's
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
# ``softmax(A1)`` after Stage 1 beside the true adjacency (the pair edges), and the exact loss
# against the step with the reference losses (the Bayes loss, the count estimator's, ``L*``).
plot_attention(task.graph, A1, os.path.join(args.out, "attention.png"))
plot_loss(traj, refs, os.path.join(args.out, "loss.png"))
print("figures:", ", ".join(sorted(f for f in os.listdir(args.out) if f.endswith(".png"))))
