"""Small shared helpers of the example scripts (arguments, training, printing)."""
import argparse
import os

import popgrad as pg
from popgrad import checks
from popgrad.app.plots import plot_attention, plot_loss

#: Algorithm 1 settings shared by the examples (natural units, see popgrad.dynamics).
TRAIN = dict(beta0=1e-3, lr1=2.0, steps1=300, lr2=2.0, steps2=300)


def parser(description, out_default):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=out_default, help="folder for the figures")
    return p


def ensure_out(path):
    os.makedirs(path, exist_ok=True)
    return path


def print_checks(results):
    """One line per check with its status (and, when undecided, why)."""
    from popgrad.app.jobs import log_checks

    log_checks(results, "(not written)", log=lambda line: None if line.startswith("report:") else print(line))


def train_check_and_plot(task, out):
    """Run Algorithm 1 with :data:`TRAIN`, print the checks, save attention and loss figures."""
    print(task.summary())
    traj = pg.train_two_stage(task, **TRAIN)
    A1 = traj.A1[traj.stage1_end]
    refs = checks.reference_losses(task)
    print_checks([
        checks.check_graph_recovery(task, A1),
        checks.check_loss_convergence(task, traj.final_A1, traj.final_A2, TRAIN["beta0"], references=refs),
        checks.check_roots(task, A1),
    ])
    plot_attention(task.graph, A1, os.path.join(out, "attention.png"))
    plot_loss(traj, refs, os.path.join(out, "loss.png"))
    print(f"figures in {out}")
    return traj
