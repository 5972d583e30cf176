"""Shared pieces of the official-size examples (``catformer_*_official.py``): resumable sampled runs whose
partial state is readable at any time (``--table-only``)."""
import json
import os

import numpy as np

import popgrad as pg


def train_or_resume(task, model, steps, ckpt, checkpoint_every, **kw):
    """``train_catformer`` with a checkpoint; resumes (bit-identically) when ``ckpt`` exists."""
    os.makedirs(os.path.dirname(ckpt) or ".", exist_ok=True)
    return pg.train_catformer(task, model, steps, checkpoint_path=ckpt, checkpoint_every=checkpoint_every,
                              resume=os.path.exists(ckpt), **kw)


def read_checkpoint(model, ckpt):
    """``(t, params at step t, records dict)`` of a run's checkpoint (a run still going, or stopped), or ``None``."""
    if not os.path.exists(ckpt):
        return None
    with np.load(ckpt, allow_pickle=False) as z:
        meta = json.loads(str(z["meta_json"]))
        L = model.n_layers
        params = pg.CatFormerParams([np.array(z[f"A_{i + 1}"]) for i in range(L)], np.array(z["W"]))
        rec = {k[4:]: np.array(z[k]) for k in z.files if k.startswith("rec_")}
    return int(meta["t"]), params, rec, meta


def fmt_est(d, signed=False):
    if d.get("value") is None:
        return "n/a"
    return f"{d['value']:{'+' if signed else ''}.4f} ± {d['se']:.4f}"


def _est(x):
    x = np.asarray(x, dtype=np.float64)
    return {"value": float(x.mean()), "se": float(x.std(ddof=1) / np.sqrt(x.size))}


def model_predictions(model, params, seqs, chunk=2048):
    """The model's predictions ``(n, S)`` in chunks (the forward pass keeps every row of every layer)."""
    from popgrad.model.catformer import catformer_forward

    return np.concatenate([catformer_forward(model, params, seqs[i:i + chunk])[0]
                           for i in range(0, seqs.shape[0], chunk)])


def reference_lines(task, model, params, n=8192, seed=777, alpha=None):
    """The model's loss and both reference lines on one held-out sample (``task.sample(n, seed)``), ± SE.

    * ``L_count_edges``: the edges-only count estimator (in-context counts of the edges whose parent token is
      the query's, plus ``α``): ``official_bayes_predict(..., root_quirk=False)``;
    * ``L_official_bayes``: the official code's own ``bayes`` line, ``InContextTree.bayes`` as written
      (``seq[dag]`` with ``dag[i] = -1`` reads position T-2, so a root counts whenever ``s_{T-2}`` equals the
      query): ``official_bayes_predict(..., root_quirk=True)``; what the official Figure 2 draws;
    * the differences model − line on the same draws (common random numbers).
    """
    alpha = task.prior.alpha if alpha is None else alpha
    smp = task.sample(n, seed)
    y = smp.targets

    def xent(f):
        with np.errstate(divide="ignore", invalid="ignore"):
            return -np.sum(np.where(y > 0, y * np.log(f), 0.0), axis=1)

    lm = xent(model_predictions(model, params, smp.seqs))
    le = xent(pg.official_bayes_predict(task.graph, smp.seqs, task.S, alpha))
    lq = xent(pg.official_bayes_predict(task.graph, smp.seqs, task.S, alpha, root_quirk=True))
    return {"n": int(n), "seed": int(seed), "L_model": _est(lm), "L_count_edges": _est(le),
            "L_official_bayes": _est(lq), "model_minus_count_edges": _est(lm - le),
            "model_minus_official_bayes": _est(lm - lq), "official_bayes_minus_count_edges": _est(lq - le)}


def write_json(path, obj):
    """Write ``obj`` as JSON atomically (``popgrad._io.atomic_write_text``)."""
    from popgrad._io import atomic_write_text

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=1) + "\n")


# ---- the official Figure 6 panels (the layout of the official plots.py's plot_A1, plot_A2, plot_W) ----------

def _limits(M, lower=15, upper=100):
    """The official panels' colour range: the ``lower``-th to ``upper``-th percentile of the matrix."""
    return dict(vmin=float(np.percentile(M, lower)), vmax=float(np.percentile(M, upper)), aspect="equal")


def _block_grid(fig, spec, M, S, T, kw, top=True, left=True):
    """``M`` (S+T square) as its four token/position blocks in ``spec``."""
    inner = spec.subgridspec(2, 2, wspace=0.05, hspace=0.05, width_ratios=[S, T], height_ratios=[S, T])
    cuts = [slice(0, S), slice(S, S + T)]
    for k in range(2):
        for l in range(2):
            ax = fig.add_subplot(inner[k, l])
            ax.imshow(M[cuts[k], cuts[l]], **kw)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_frame_on(False)
            ax.xaxis.set_label_position("top")
            if top and k == 0:
                ax.set_xlabel("token" if l == 0 else "position", fontsize=9)
            if left and l == 0:
                ax.set_ylabel("token" if k == 0 else "position", fontsize=9)


def plot_learned_blocks(params, S, T, path, title="", lower=15, upper=100):
    """Figure 6's three panels of a heads-(1, 1) model: ``Ã^(1)`` as its token/position blocks; ``Ã^(2)`` as
    2 × 2 blocks (input X̃, attn(X̃; Ã^(1))) of those; ``Wᵀ`` split by what each column reads (X̃,
    attn(X̃; Ã^(1)), and the two halves of attn(h^(1); Ã^(2))). Colour range per matrix: its 15th to 100th
    percentile, as ``single_parent.py`` draws them."""
    import matplotlib.pyplot as plt
    from popgrad.app.plots import save_figure

    d = S + T
    A1, A2, W = params.A[0][0], params.A[1][0], params.W.T
    fig = plt.figure(figsize=(15, 5.2))
    outer = fig.add_gridspec(1, 3, width_ratios=[1, 1.15, 1.6], wspace=0.25)
    _block_grid(fig, outer[0], A1, S, T, _limits(A1, lower, upper))
    fig.text(0.20, 0.93, r"$\tilde A^{(1)}$", ha="center", fontsize=12)
    kw = _limits(A2, lower, upper)
    g2 = outer[1].subgridspec(2, 2, wspace=0.08, hspace=0.08)
    for i in range(2):
        for j in range(2):
            _block_grid(fig, g2[i, j], A2[i * d:(i + 1) * d, j * d:(j + 1) * d], S, T, kw, top=i == 0, left=j == 0)
    fig.text(0.47, 0.93, r"$\tilde A^{(2)}$: rows and columns [X̃ | attn(X̃; Ã1)]", ha="center", fontsize=11)
    kw = _limits(W, lower, upper)
    gw = outer[2].subgridspec(1, 4, wspace=0.08)
    names = ("X̃", "attn(X̃; Ã1)", "attn(h1; Ã2) [X̃]", "attn(h1; Ã2) [attn]")
    for c in range(4):
        ax = fig.add_subplot(gw[0, c])
        ax.imshow(W[:, c * d:(c + 1) * d], **kw)
        ax.axvline(S - 0.5, color="w", lw=0.8)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(names[c], fontsize=8)
        if c == 0:
            ax.set_ylabel("output token", fontsize=9)
    fig.text(0.78, 0.93, r"$W^\top$ (token | position columns of each block)", ha="center", fontsize=11)
    if title:
        fig.suptitle(title, fontsize=10, y=0.02)
    save_figure(fig, path)
