"""In-context function learning, exactly: pairs (x, y = f(x)) in context (paper §2.3).

The graph is 0->1, 2->3, ...: each odd position copies the preceding even
position through π. Stage 1 should learn exactly these pair edges.
"""
import os

import popgrad as pg
from popgrad import checks
from popgrad.plots import plot_attention, plot_loss

from _common import ensure_out, parser, print_checks


def main():
    args = parser(__doc__, "examples_out/icl_function").parse_args()
    out = ensure_out(args.out)
    task = pg.Task(pg.icl_pairs(11), pg.dirichlet_prior(3, 1.0, 8, seed=1, uniform_mean=True))
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
