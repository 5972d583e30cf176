"""Standard transformer: Figure 8 at the official size
===================================================

Figure 8 of the paper (the official ``tf_with_mlp.ipynb``): a standard transformer -- trained token and
position embeddings, per layer attention ``A`` (zero at start), value ``V``, the official two-layer MLP and
a residual stream, softmax readout of the last position (``popgrad.Transformer``) -- trained on the chain
still learns the causal graph in its first layer.

The notebook's recipe: S = 10, T = 20, the chain, α = 0.1, the official continuous prior (stationary root,
uniform query, soft label ``π(· | query)``), heads (1, 1), the official initialisation (here drawn with
popgrad's generator), AdamW (optax defaults) with ``cosine_decay_schedule(0.01, 2^12)``, weight decay
2e-4, fresh batches of 1024 for 2^12 steps, loss ``mean −Σ_c y_c log f_c``.

Here, two parts (``--parts``):

* ``official``: that recipe with popgrad's sampled gradient (``popgrad.train_model(gradient="sampled")``);
  the test loss of every recorded step on ``--eval-n`` held-out sequences (the notebook: 2^16, every 32
  steps), against the reference lines on the same sequences: the official ``bayes`` line (in-context counts
  plus α, normalised, edges only: ``popgrad.official_bayes_predict``; and as the notebook's
  ``InContextTree.bayes`` computes it, root quirk included), and the edges-only count estimator
  (``popgrad.count_estimator_predict``, Knowl 8: counts without α). The layer-1 attention averaged over
  held-out sequences beside the graph (the notebook's figure), and the attention lift to the parent.
* ``small``: the same recipe exactly at an enumerable size (``--small-S 3 --small-T 8``): the exact
  population gradient (the generic exact engine) and its sampled twin (same recipe, batches of 1024),
  both scored by the exact population loss, against the exact ``popgrad.official_bayes_loss`` and
  ``popgrad.count_estimator_loss``; the exact population attention and its lift.

Results: ``figure8_<part>.json``, ``figure8_<part>.md`` (tables) and ``figure8_*.png`` in ``--out``. Runs
checkpoint every ``--checkpoint-every`` steps and resume bit-identically when the command is run again;
``--table-only`` writes the results from the checkpoints as far as they got. ``--quick``: tiny sizes, seconds.

    python examples/transformer_figure8.py                 # both parts (the official part: an hour or so)
    python examples/transformer_figure8.py --parts small
    python examples/transformer_figure8.py --quick
"""
import json
import math
import os
import time
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import popgrad as pg
from popgrad._io import atomic_write_text
from popgrad.app.plots import save_figure
from popgrad.checks.model_checks import model_population_attention
from popgrad.checks.results import attention_lift
from popgrad.engine.baselines import count_estimator_predict, official_bayes_predict

from _common import parser

PARTS = ("official", "small")


def args_of():
    p = parser(__doc__, "examples_out/transformer_figure8", quick_help="tiny sizes and 40 steps: seconds")
    p.add_argument("--S", type=int, default=10)
    p.add_argument("--T", type=int, default=20)
    p.add_argument("--small-S", type=int, default=3)
    p.add_argument("--small-T", type=int, default=8)
    p.add_argument("--steps", type=int, default=2**12)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=2e-4)
    p.add_argument("--init-seed", type=int, default=0)
    p.add_argument("--sample-seed", type=int, default=0)
    p.add_argument("--eval-n", type=int, default=2**14)
    p.add_argument("--eval-seed", type=int, default=777)
    p.add_argument("--record-every", type=int, default=32)
    p.add_argument("--checkpoint-every", type=int, default=256)
    p.add_argument("--parts", default="official,small")
    p.add_argument("--table-only", action="store_true",
                   help="write the results from the checkpoints as far as they got (no training)")
    a = p.parse_args()
    a.parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    bad = [x for x in a.parts if x not in PARTS]
    if bad or not a.parts:
        p.error(f"--parts {','.join(bad) or a.parts!r}: use official and/or small")
    if a.quick:
        a.S, a.T, a.small_S, a.small_T, a.steps, a.batch_size = 3, 6, 2, 5, 40, 64
        a.eval_n, a.record_every, a.checkpoint_every = 512, 8, 16
    return a


def recipe(a, **kw):
    """The notebook's training settings (``train_model`` keywords)."""
    return dict(optimizer="adamw", lr=a.lr, lr_schedule="cosine", weight_decay=a.weight_decay,
                init_scale=1.0, init_seed=a.init_seed, eps=0.0, record_every=a.record_every, **kw)


class Partial:
    """A run read back from its checkpoint (``--table-only``): the records so far and the current parameters."""

    def __init__(self, ckpt, names, steps):
        with np.load(ckpt, allow_pickle=False) as z:
            meta = json.loads(str(z["meta_json"]))
            self.step = np.array(z["rec_step"])
            self.loss = np.array(z["rec_loss"])
            self.loss_se = np.array(z["rec_loss_se"])
            self._rec = {k: np.array(z[f"rec_p_{k}"]) for k in names}
            self.final = {k: np.array(z[k]) for k in names}
        t = int(meta["t"])
        self.status = meta["status"] if meta.get("done") else f"running: step {t} of {steps}"
        if self.step[-1] != t:  # the current parameters, unrecorded: a last record without a loss
            self.step = np.append(self.step, t)
            self.loss = np.append(self.loss, np.nan)
            self.loss_se = np.append(self.loss_se, np.nan)
            self._rec = {k: np.concatenate([v, self.final[k][None]]) for k, v in self._rec.items()}

    def params_at(self, r):
        return {k: v[r].copy() for k, v in self._rec.items()}


def train(task, model, a, ckpt, **kw):
    if a.table_only:
        if not os.path.exists(ckpt):
            raise SystemExit(f"--table-only: {ckpt} does not exist: run without --table-only first")
        return Partial(ckpt, list(model.param_shapes()), a.steps)
    os.makedirs(os.path.dirname(ckpt), exist_ok=True)
    t0 = time.perf_counter()
    traj = pg.train_model(task, model, a.steps, checkpoint_path=ckpt, checkpoint_every=a.checkpoint_every,
                          resume=os.path.exists(ckpt), **recipe(a, **kw))
    print(f"  {os.path.basename(ckpt)}: {traj.status} at step {int(traj.step[-1])} "
          f"({time.perf_counter() - t0:.0f} s this call)", flush=True)
    return traj


def xent(y, f):
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(y > 0, y * np.log(np.where(y > 0, f, 1.0)), 0.0), axis=1)


def est(x):
    x = np.asarray(x, dtype=np.float64)
    return {"value": float(np.mean(x)), "se": float(np.std(x, ddof=1) / math.sqrt(x.size))}


def parent_lift(graph, P):
    """Mean over non-root positions ``i < T-1`` of the attention to the parent and of its lift from uniform."""
    T = P.shape[-1]
    par = np.asarray(graph.parents)
    rows = [i for i in range(T - 1) if par[i] >= 0]
    a = np.array([P[i, par[i]] for i in rows])
    u = np.array([1.0 / (i + 1) for i in rows])
    lift = attention_lift(a, u)
    return {"to_parent_mean": float(a.mean()), "lift_mean": float(lift.mean()), "lift_min": float(lift.min()),
            "argmax_is_parent": bool(all(int(np.argmax(P[i, :i + 1])) == par[i] for i in rows))}


def adjacency(graph, T):
    A = np.zeros((T, T))
    par = np.asarray(graph.parents)
    A[np.flatnonzero(par >= 0), par[par >= 0]] = 1
    return A


def attention_figure(graph, P, title, path):
    """The notebook's figure: the causal graph beside the layer-1 attention pattern."""
    T = P.shape[-1]
    fig, axs = plt.subplots(1, 2, figsize=(9, 4))
    axs[0].imshow(adjacency(graph, T))
    axs[0].set_title("causal graph")
    im = axs[1].imshow(P)
    axs[1].set_title("layer 1 attention pattern")
    for ax in axs:
        ax.axis("off")
    fig.colorbar(im, ax=axs[1], fraction=0.046, pad=0.04)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


# ------------------------------------------------------------------ official size, sampled
def official(a, out):
    S, T = a.S, a.T
    print(f"official size: S = {S}, T = {T}, chain, continuous Dirichlet({a.alpha:g}), batch {a.batch_size}, "
          f"{a.steps} steps", flush=True)
    task = pg.Task(pg.chain(T), pg.DirichletPrior(S, a.alpha))
    model = pg.Transformer(S, T, heads=(1, 1))
    traj = train(task, model, a, os.path.join(out, "ckpt", "official.ckpt.npz"), gradient="sampled",
                 batch_size=a.batch_size, sample_seed=a.sample_seed)
    held = task.sample(a.eval_n, a.eval_seed)
    seqs, y = held.seqs, held.targets
    test = [est(xent(y, model.predict(traj.params_at(r), seqs))) for r in range(len(traj.step))]
    f_final = model.predict(traj.final, seqs)
    eps = float(task.default_eps)
    refs = {
        "official_bayes": est(xent(y, official_bayes_predict(task.graph, seqs, S, a.alpha))),
        "official_bayes_as_notebook": est(xent(y, official_bayes_predict(task.graph, seqs, S, a.alpha,
                                                                         root_quirk=True))),
    }
    fc = count_estimator_predict(task.graph, seqs, S)
    lc = xent(y, fc)
    refs["count_estimator"] = est(lc) if np.all(np.isfinite(lc)) else {
        "value": None, "se": None, "infinite_rows": int(np.sum(~np.isfinite(lc))),
        "reason": "the estimator gives probability 0 to a token with positive target mass (eps = 0)"}
    refs["count_estimator_eps"] = {**est(xent(y, fc + eps)), "eps": eps}
    model_eps = {**est(xent(y, f_final + eps)), "eps": eps}
    P = model.layer1_attention(traj.final, seqs[:4096])[:, 0].mean(axis=0)
    P0 = model.layer1_attention(traj.params_at(0), seqs[:4096])[:, 0].mean(axis=0)
    res = {"S": S, "T": T, "alpha": a.alpha, "steps": a.steps, "step_reached": int(traj.step[-1]),
           "status": traj.status, "batch_size": a.batch_size, "eval_n": a.eval_n, "eval_seed": a.eval_seed,
           "record_step": [int(s) for s in traj.step], "batch_loss": [float(x) for x in traj.loss],
           "batch_loss_se": [float(x) for x in traj.loss_se], "test_loss": test, "final_test_loss": test[-1],
           "final_test_loss_eps": model_eps, "references": refs,
           "final_minus_official_bayes": est(xent(y, f_final) - xent(y, official_bayes_predict(
               task.graph, seqs, S, a.alpha))),
           "attention": {"final": parent_lift(task.graph, P), "start": parent_lift(task.graph, P0),
                         "matrix": np.round(P, 4).tolist(), "n_sequences": int(min(4096, a.eval_n))}}
    fig, ax = plt.subplots(figsize=(6, 4))
    st = np.asarray(traj.step)
    ax.plot(st, traj.loss, lw=0.8, alpha=0.6, label="train (batch) loss")
    ax.errorbar(st, [t["value"] for t in test], yerr=[t["se"] for t in test], fmt=".-", ms=3, lw=1,
                label=f"test loss ({a.eval_n} held-out)")
    ax.axhline(refs["official_bayes"]["value"], c="k", ls="--", lw=0.9, label="edges-only estimator with α")
    ax.axhline(refs["official_bayes_as_notebook"]["value"], c="gray", ls=":", lw=0.9,
               label="official bayes line (InContextTree.bayes)")
    if refs["count_estimator"]["value"] is not None:
        ax.axhline(refs["count_estimator"]["value"], c="tab:red", ls="-.", lw=0.9, label="count estimator")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"Transformer, chain, S = {S}, T = {T}, AdamW, batch {a.batch_size} (sampled)", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(out, "figure8_official_loss.png"))
    attention_figure(task.graph, P, f"S = {S}, T = {T}, step {int(traj.step[-1])}: layer-1 attention averaged "
                                    f"over {res['attention']['n_sequences']} held-out sequences",
                     os.path.join(out, "figure8_official_attention.png"))
    print(f"  test loss {test[-1]['value']:.4f} ± {test[-1]['se']:.4f}; edges-only estimator with α "
          f"{refs['official_bayes']['value']:.4f}; lift to parent {res['attention']['final']['lift_mean']:.3f}",
          flush=True)
    return res


# ------------------------------------------------------------------ enumerable size, exact and sampled
def small(a, out):
    S, T = a.small_S, a.small_T
    print(f"enumerable size: S = {S}, T = {T} ({S ** T} sequences), exact gradient and its sampled twin",
          flush=True)
    task = pg.Task(pg.chain(T), pg.DirichletPrior(S, a.alpha))
    model = pg.Transformer(S, T, heads=(1, 1))
    ex = train(task, model, a, os.path.join(out, "ckpt", "small_exact.ckpt.npz"), gradient="exact")
    sa = train(task, model, a, os.path.join(out, "ckpt", "small_sampled.ckpt.npz"), gradient="sampled",
               batch_size=a.batch_size, sample_seed=a.sample_seed)
    exact_of = lambda p: float(pg.loss_and_grad(task, model, p, eps=0.0).loss)  # noqa: E731
    sampled_exact = [exact_of(sa.params_at(r)) for r in range(len(sa.step))]
    eps = float(task.default_eps)
    refs = {"official_bayes": float(pg.official_bayes_loss(task)), "bayes": float(pg.bayes_loss(task)),
            "count_estimator_eps": {"value": float(pg.count_estimator_loss(task, eps=eps)), "eps": eps}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ce0 = float(pg.count_estimator_loss(task, eps=0.0))
    refs["count_estimator"] = ce0 if math.isfinite(ce0) else None
    if refs["count_estimator"] is None:
        refs["count_estimator_reason"] = "inf at eps = 0: the estimator gives probability 0 to a possible token"
    P = {k: model_population_attention(task, model, t.final)[0] for k, t in (("exact", ex), ("sampled", sa))}
    res = {"S": S, "T": T, "alpha": a.alpha, "steps": a.steps, "batch_size": a.batch_size,
           "exact": {"record_step": [int(s) for s in ex.step], "loss": [float(x) for x in ex.loss],
                     "final_loss": exact_of(ex.final), "status": ex.status,
                     "final_loss_eps": float(pg.loss_and_grad(task, model, ex.final, eps=eps).loss),
                     "attention": {**parent_lift(task.graph, P["exact"]), "matrix": np.round(P["exact"], 4).tolist()}},
           "sampled": {"record_step": [int(s) for s in sa.step], "batch_loss": [float(x) for x in sa.loss],
                       "exact_loss": sampled_exact, "final_exact_loss": sampled_exact[-1], "status": sa.status,
                       "attention": {**parent_lift(task.graph, P["sampled"]),
                                     "matrix": np.round(P["sampled"], 4).tolist()}},
           "start_loss": float(ex.loss[0]), "references": refs, "eps_for_eps_losses": eps}
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ex.step, ex.loss, ".-", ms=3, label="exact gradient: population loss")
    ax.plot(sa.step, sampled_exact, ".-", ms=3, label=f"sampled twin (batch {a.batch_size}): population loss")
    ax.plot(sa.step, sa.loss, lw=0.6, alpha=0.5, label="sampled twin: batch loss")
    ax.axhline(refs["official_bayes"], c="k", ls="--", lw=0.9, label="edges-only estimator with α (exact)")
    ax.axhline(refs["bayes"], c="gray", ls=":", lw=0.9, label="Bayes loss of the task (exact)")
    if refs["count_estimator"] is not None:
        ax.axhline(refs["count_estimator"], c="tab:red", ls="-.", lw=0.9, label="count estimator (exact)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"Transformer, chain, S = {S}, T = {T}: the notebook's recipe, exact and sampled", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(out, "figure8_small_loss.png"))
    attention_figure(task.graph, P["exact"], f"S = {S}, T = {T}, exact gradient, step {a.steps}: exact population "
                                             f"layer-1 attention", os.path.join(out, "figure8_small_attention.png"))
    print(f"  exact: final loss {res['exact']['final_loss']:.5f}, sampled twin {sampled_exact[-1]:.5f}, edges-only estimator with α "
          f"{refs['official_bayes']:.5f}; lift exact {res['exact']['attention']['lift_mean']:.3f}, sampled "
          f"{res['sampled']['attention']['lift_mean']:.3f}", flush=True)
    return res


def _pm(d):
    return "n/a" if d is None or d.get("value") is None else f"{d['value']:.4f} ± {d['se']:.4f}"


def table_md(part, r) -> str:
    """The part's results as a Markdown table (``figure8_<part>.md``, included by the docs)."""
    if part == "official":
        refs, att = r["references"], r["attention"]
        ce = refs["count_estimator"]
        ce_text = _pm(ce) if ce.get("value") is not None else f"infinite ({ce.get('infinite_rows')} rows: {ce['reason']})"
        status = r["status"] if r["status"].startswith("running") else f"{r['status']} (step {r['step_reached']})"
        lines = [f"S = {r['S']}, T = {r['T']}, chain, continuous Dirichlet({r['alpha']:g}), batch {r['batch_size']}, "
                 f"{status}; losses on {r['eval_n']:,} held-out "
                 "sequences (sampled, ± SE).", "",
                 "| quantity | value |", "|---|---|",
                 f"| test loss at the start (step 0) | {_pm(r['test_loss'][0])} |",
                 f"| test loss at step {r['step_reached']} | {_pm(r['final_test_loss'])} |",
                 f"| edges-only estimator with α (counts + α, roots left out: `official_bayes_loss`) | {_pm(refs['official_bayes'])} |",
                 f"| official `bayes` line (`InContextTree.bayes`, as the notebook computes it) | {_pm(refs['official_bayes_as_notebook'])} |",
                 f"| test loss − edges-only estimator with α (paired) | {_pm(r['final_minus_official_bayes'])} |",
                 f"| count estimator (edges only, no α), ε = 0 | {ce_text} |",
                 f"| count estimator, ε = {refs['count_estimator_eps']['eps']:.4f} | {_pm(refs['count_estimator_eps'])} |",
                 f"| model, same ε | {_pm(r['final_test_loss_eps'])} |",
                 f"| layer-1 attention to the parent, mean over positions (start → end) | "
                 f"{att['start']['to_parent_mean']:.3f} → {att['final']['to_parent_mean']:.3f} |",
                 f"| attention lift to the parent, mean (min) over positions (start → end) | "
                 f"{att['start']['lift_mean']:.3f} → {att['final']['lift_mean']:.3f} ({att['final']['lift_min']:.3f}) |",
                 f"| every row's argmax is the parent | {att['final']['argmax_is_parent']} |"]
    else:
        refs, ex, sa = r["references"], r["exact"], r["sampled"]
        ce = refs["count_estimator"]
        lines = [f"S = {r['S']}, T = {r['T']} ({r['S'] ** r['T']:,} sequences), chain, continuous Dirichlet({r['alpha']:g}) "
                 f"(exact weights of popgrad's stand-in, see below), the same recipe; exact population losses.", "",
                 "| quantity | exact gradient | sampled twin (batch " + str(r["batch_size"]) + ") |", "|---|---|---|",
                 f"| status | {ex['status']} | {sa['status']} |",
                 f"| population loss at the start | {r['start_loss']:.5f} | {sa['exact_loss'][0]:.5f} |",
                 f"| population loss at the end | {ex['final_loss']:.5f} | {sa['final_exact_loss']:.5f} |",
                 f"| edges-only estimator with α (exact) | {refs['official_bayes']:.5f} | |",
                 f"| Bayes loss of the task (exact; stationary root: below the edges-only estimator) | {refs['bayes']:.5f} | |",
                 f"| count estimator (exact), ε = 0 | {'inf' if ce is None else f'{ce:.5f}'} | |",
                 f"| count estimator (exact), ε = {refs['count_estimator_eps']['eps']:.4f} | "
                 f"{refs['count_estimator_eps']['value']:.5f} | |",
                 f"| model at that ε (exact gradient's end) | {ex['final_loss_eps']:.5f} | |",
                 f"| attention to the parent, mean over positions | {ex['attention']['to_parent_mean']:.3f} | "
                 f"{sa['attention']['to_parent_mean']:.3f} |",
                 f"| attention lift to the parent, mean (min) | {ex['attention']['lift_mean']:.3f} "
                 f"({ex['attention']['lift_min']:.3f}) | {sa['attention']['lift_mean']:.3f} "
                 f"({sa['attention']['lift_min']:.3f}) |",
                 f"| every row's argmax is the parent | {ex['attention']['argmax_is_parent']} | "
                 f"{sa['attention']['argmax_is_parent']} |"]
    return "\n".join(lines) + "\n"


def main():
    a = args_of()
    os.makedirs(a.out, exist_ok=True)
    for part in a.parts:
        res = official(a, a.out) if part == "official" else small(a, a.out)
        res["recipe"] = {**recipe(a), "steps": a.steps, "quick": bool(a.quick), "popgrad": pg.__version__}
        path = os.path.join(a.out, f"figure8_{part}.json")
        atomic_write_text(path, json.dumps(res, indent=1) + "\n")
        atomic_write_text(os.path.join(a.out, f"figure8_{part}.md"), table_md(part, res))
        print(f"results in {path}")


if __name__ == "__main__":
    main()
