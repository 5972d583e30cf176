"""Out-of-distribution generalization
==================================

Out-of-distribution generalization, exactly (paper "Knowl 4").

Train on the chain task, then take a transition matrix π̃ outside the prior's
support (min π̃ ≥ γ/S) and compute the exact distribution over sequences of
``sup_c |f(s)_c - π̃(c | s_{T-1})|``, against the same for in-distribution π.
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad import checks
from popgrad.app.plots import save_figure

from _common import ensure_out, parser, print_checks, train_settings


def main():
    args = parser(__doc__, "examples_out/ood").parse_args()
    out = ensure_out(args.out)
    task = pg.Task(pg.chain(10), pg.dirichlet_prior(3, 1.0, 8, seed=0))
    traj = pg.train_two_stage(task, **train_settings(args.quick))
    A1, A2 = traj.final_A1, traj.final_A2
    pi_ood = checks.ood_transition(task.S, gamma=0.3)
    res = checks.check_ood(task, A1, A2, pi_ood=pi_ood)
    print_checks([res])
    d = res.details
    print(f"OOD:  mean {d['ood_mean']:.4f}  0.99-quantile {d['ood_quantile']:.4f} (construction "
          f"{d['ood_quantile_construction']:.4f}, context-free {d['ood_quantile_context_free']:.4f})")
    print(f"in-d: mean {d['in_distribution_mean']:.4f}  0.99-quantile {d['in_distribution_quantile']:.4f}")
    e_o, p_o = checks.sup_error_distribution(task, A1, A2, pi_ood[None], np.ones(1))
    e_i, p_i = checks.sup_error_distribution(task, A1, A2, task.prior.atoms, task.prior.weights)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    bins = np.linspace(0, 1, 41)
    ax.hist(e_i, bins=bins, weights=p_i, alpha=0.6, label="in-distribution π")
    ax.hist(e_o, bins=bins, weights=p_o, alpha=0.6, label="out-of-distribution π̃")
    ax.set_xlabel("sup_c |f(s)_c - π(c | s_{T-1})|  (query s_{T-1}, 0-based positions)")
    ax.set_ylabel("exact probability")
    ax.legend()
    save_figure(fig, os.path.join(out, "ood_errors.png"))
    print(f"figure in {out}")


if __name__ == "__main__":
    main()
