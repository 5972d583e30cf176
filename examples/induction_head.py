"""Induction head, exactly: a Markov chain in context (paper §2.3, Figure 2).

Positions 0..T-2 form one Markov chain; the query T-1 asks for π(· | s_{T-1}).
Stage 1 should make every position attend to its predecessor (the previous-
token head), Stage 2 grows A2 along the identity (the induction head).
"""
import os

import popgrad as pg
from popgrad import checks
from popgrad.plots import plot_attention, plot_loss

from _common import ensure_out, parser, print_checks


def main():
    args = parser(__doc__, "examples_out/induction_head").parse_args()
    out = ensure_out(args.out)
    task = pg.Task(pg.chain(10), pg.dirichlet_prior(3, 1.0, 8, seed=0))
    print(task.summary())
    traj = pg.train_two_stage(task, beta0=1e-3, lr1=2.0, steps1=300, lr2=2.0, steps2=300)
    A1 = traj.A1[traj.stage1_end]
    refs = checks.reference_losses(task)
    results = [
        checks.check_graph_recovery(task, A1),
        checks.check_loss_convergence(task, traj.final_A1, traj.final_A2, 1e-3, references=refs),
        checks.check_roots(task, A1),
    ]
    print_checks(results)
    plot_attention(task.graph, A1, os.path.join(out, "attention.png"))
    plot_loss(traj, refs, os.path.join(out, "loss.png"))
    print(f"figures in {out}")


if __name__ == "__main__":
    main()
