"""Shared pieces of the full-model examples (catformer_*.py): tasks, per-record diagnostics, phases, figures."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad.app.plots import save_figure
from popgrad.checks import catformer as cc

from _common import ensure_out, parser

#: Figure 2's graphs; ``random`` is the official ``single_parent.py`` generator (each parent uniform over
#: {none, 0, ..., i-1}).
GRAPHS = {"chain": pg.chain, "icl": pg.icl_pairs, "random": lambda T: pg.official_random_tree(T, seed=0)}

#: ``--prior`` of the full-model examples: the official continuous prior (default) or popgrad's finite one.
PRIORS = ("continuous", "finite")


def catformer_args(doc, out, T, steps, quick_help, counts=None, alpha=0.1, table_only=False):
    """The full-model examples' command line: ``--out``, ``--quick`` (:func:`_common.parser`), ``--T``,
    ``--steps``, one integer option per ``counts`` entry (name -> default), ``--alpha``, ``--prior``
    (``continuous``: the official prior, the default; ``finite``: ``--atoms`` draws closed under relabeling),
    and ``--table-only`` when ``table_only``; returns ``(args, output folder)``."""
    p = parser(doc, out, quick_help=quick_help)
    p.add_argument("--T", type=int, default=T)
    p.add_argument("--steps", type=int, default=steps)
    for name, default in (counts or {}).items():
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--alpha", type=float, default=alpha)
    p.add_argument("--prior", choices=PRIORS, default="continuous",
                   help="continuous: the official Dirichlet(alpha) prior (default); finite: --atoms draws closed "
                        "under relabeling")
    p.add_argument("--atoms", type=int, default=None, help="--prior finite: Dirichlet draws before the closure")
    if table_only:
        p.add_argument("--table-only", action="store_true", help="write the table from the graphs finished so far")
    args = p.parse_args()
    return args, ensure_out(args.out)


def single_parent_task(graph, S, T, alpha=1.0, atoms=8, seed=0, prior="continuous"):
    """``prior="continuous"``: the official ``DirichletPrior(S, alpha)`` (stationary roots); ``"finite"``:
    ``atoms`` Dirichlet(alpha) draws closed under the S! relabelings."""
    g = GRAPHS[graph](T) if isinstance(graph, str) else graph
    if prior == "continuous":
        return pg.Task(g, pg.DirichletPrior(S, alpha))
    return pg.Task(g, pg.dirichlet_prior(S, alpha, atoms or 8, seed=seed))


def prior_text(prior, alpha, atoms=None, S=3, k=1):
    """The prior in words for the tables."""
    if prior == "continuous":
        return (f"continuous Dirichlet({alpha:g}) prior (official; stationary roots)" if k == 1 else
                f"continuous DirichletTensorPrior(S, {k}, {alpha:g}) (official; uniform roots)")
    return f"finite prior: {atoms} Dirichlet({alpha:g}) draws closed under relabeling"


def official_or_finite_prior(args, S):
    """``--prior continuous`` (the official task: ``DirichletPrior(S, alpha)``, stationary roots) or ``--prior
    finite`` (``args.atoms`` Dirichlet(alpha) draws closed under the S! relabelings)."""
    if args.prior == "continuous":
        return pg.DirichletPrior(S, args.alpha)
    return pg.dirichlet_prior(S, args.alpha, args.atoms or 8, seed=0)


def two_parent_task(S, T, alpha=1.0, atoms=16, seed=0, prior="continuous"):
    """``prior="continuous"``: the official ``DirichletTensorPrior(S, 2, alpha)`` (roots uniform, as
    ``InContextDAG``); ``"finite"``: the CLI's ``atoms`` Dirichlet(alpha) tensors closed under parent and
    token relabelings."""
    if prior == "continuous":
        return pg.MultiParentTask(pg.two_parent(T), pg.DirichletTensorPrior(S, 2, alpha))
    return pg.MultiParentTask(pg.two_parent(T), pg.dirichlet_tensor_prior(S, 2, alpha, atoms or 16, seed=seed,
                                                                         symmetrize="full"))


def record_diagnostics(task, traj):
    """Per record: mean attention to parent (population, head 0) and the induction lift of layer 2 (the value of
    :func:`popgrad.checks.catformer.check_induction_head`: 0 at uniform attention, 1 at the construction)."""
    model = traj.model
    nr = [int(i) for i in task.graph.non_roots if i < task.T - 1]
    attn, attn_pos, margin = [], [], []
    for r in range(len(traj.step)):
        p = traj.params(r)
        P = cc.population_attention(task, model, p)
        ap = cc.attention_to_parent_per_position(task.graph, P)[0]
        attn.append(float(np.mean(ap[nr])))
        pos = cc.attention_to_parent_per_position(task.graph, cc.positional_attention(model, p))[0]
        attn_pos.append(float(np.mean(pos[nr])))
        margin.append(float(cc.check_induction_head(task, model, p).value))
    return np.array(attn), np.array(attn_pos), np.array(margin)


def half_step(steps, values):
    """The first recorded step at which ``values`` has made half of its total change (``None`` if it did not move)."""
    v = np.asarray(values, dtype=float)
    total = v[-1] - v[0]
    if not np.isfinite(total) or abs(total) < 1e-12:
        return None
    frac = (v - v[0]) / total
    return int(steps[int(np.flatnonzero(frac >= 0.5)[0])])


def loss_drop_peaks(steps, loss, k=3):
    """Steps (interval midpoints) where the loss falls fastest per step: local maxima of ``-ΔL/Δt``, largest first."""
    steps = np.asarray(steps, dtype=float)
    rate = -np.diff(loss) / np.diff(steps)
    mids = 0.5 * (steps[1:] + steps[:-1])
    n = len(rate)
    peaks = [i for i in range(n) if (i == 0 or rate[i] >= rate[i - 1]) and (i == n - 1 or rate[i] > rate[i + 1])]
    peaks.sort(key=lambda i: -rate[i])
    return [(int(mids[i]), float(rate[i])) for i in peaks[:k]]


def plot_population_attention(task, model, params, path, title):
    """Each layer-1 head's exact population-average attention beside the true adjacency (Figures 2 and 7)."""
    P = cc.population_attention(task, model, params)
    T = task.T
    adj = np.zeros((T, T))
    par = np.asarray(task.graph.parents)
    for i in range(T):
        for p in np.atleast_1d(par[i]):
            if p >= 0:
                adj[i, p] = 1.0
    m = P.shape[0]
    fig, axs = plt.subplots(1, m + 1, figsize=(3.2 * (m + 1), 3.2))
    axs[0].imshow(adj, cmap="Blues", vmin=0, vmax=1)
    axs[0].set_title("true graph")
    for h in range(m):
        axs[h + 1].imshow(P[h], cmap="viridis", vmin=0, vmax=1)
        axs[h + 1].set_title(f"head {h}: E_s[attention]")
    for ax in axs:
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


def plot_loss_curve(traj, refs, path, title):
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(traj.step, traj.loss, label="full model (exact population loss)")
    for name, (value, style) in refs.items():
        ax.axhline(value, ls=style, color="k", lw=0.8, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def write(out, name, text):
    with open(os.path.join(out, name), "w") as fh:
        fh.write(text + "\n")
    print(text)
