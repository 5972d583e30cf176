"""Figures of a run (matplotlib, Agg backend, every file written atomically).

* :func:`plot_attention` -- ``softmax(A1)`` after Stage 1 beside the true
  adjacency (the paper's Figure 2);
* :func:`plot_loss` -- exact loss against the step, with ``L*``, the Bayes
  loss and the count-estimator loss as horizontal lines;
* :func:`plot_cosine` -- cosine between exact and idealized Stage-1 gradients;
* :func:`plot_attention_to_parent` -- attention on the parent per position;
* :func:`plot_head_attention` -- k-head first layer: each head's
  ``softmax(A1^h)`` beside the adjacency of each parent slot (multi-parent tasks);
* :func:`plot_head_attention_to_parent` -- per head, attention on its slot's parent.
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .._io import atomic_path  # noqa: E402
from ..model.multihead import head_attention  # noqa: E402
from ..model.reduced import first_layer_attention  # noqa: E402

__all__ = ["plot_attention", "plot_loss", "plot_cosine", "plot_attention_to_parent", "save_figure",
           "plot_head_attention", "plot_head_attention_to_parent"]


def save_figure(fig, path, dpi: int = 120) -> None:
    """Save ``fig`` to ``path`` atomically and close it."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=os.path.splitext(path)[1][1:] or "png")
    finally:
        plt.close(fig)


def plot_attention(graph, A1, path, title: str = "first layer after Stage 1") -> None:
    """Heatmap of ``softmax(MASK(A1))`` beside the true adjacency."""
    P = first_layer_attention(A1)
    adj = graph.adjacency()
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
    for ax, M, name in ((axes[0], P, f"softmax(A1): {title}"), (axes[1], adj, "true adjacency (row = child)")):
        im = ax.imshow(M, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("key position j")
        ax.set_ylabel("query position i")
    fig.colorbar(im, ax=axes, shrink=0.8)
    save_figure(fig, path)


def plot_loss(trajectory, references: dict, path) -> None:
    """Exact (perturbed) loss vs step with the same-``ε`` reference lines.

    ``references`` is :func:`popgrad.checks.reference_losses`; the lines are
    the exact floor (``L_floor_eps``, the lower bound, solid), the oracle
    (``L_star_eps``, ``L*_ε``), the Bayes predictive (``L_bayes_eps``,
    ``L_Bayes,ε``) and the count estimator (``L_count``), all under the loss the
    model is trained on; ``L*_ε`` and ``L_Bayes,ε`` are not bounds of it.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ok = np.isfinite(trajectory.loss)
    sampled = ok & np.isfinite(trajectory.loss_se)
    exact = ok & ~sampled
    if exact.any():
        ax.plot(trajectory.step[exact], trajectory.loss[exact], color="k", lw=1.5, label="exact loss L(θ)")
    if sampled.any():
        n = getattr(trajectory, "stage2_samples", 0)
        ax.errorbar(trajectory.step[sampled], trajectory.loss[sampled], yerr=2 * trajectory.loss_se[sampled],
                    color="tab:red", lw=1.2, capsize=2, label=f"sampled loss ± 2 SE (n = {n:,})")
    eps = references.get("eps")
    tag = f" (same ε = {eps:.3g})" if eps is not None else ""
    styles = {"L_floor_eps": (f"L_floor,ε: exact floor, lower bound{tag}", "tab:gray"),
              "L_star_eps": (f"L*_ε: oracle knowing π, not a bound{tag}", "tab:green"),
              "L_bayes_eps": (f"L_Bayes,ε: Bayes predictive, not a bound{tag}", "tab:blue"),
              "L_count": (f"count estimator{tag}", "tab:orange")}
    for key, (label, color) in styles.items():
        v = references.get(key)
        value = v.get("value") if isinstance(v, dict) else v
        if value is None:
            continue
        kind = v.get("kind", "exact") if isinstance(v, dict) else "exact"
        se = f" ± {v['se']:.1g}" if kind == "sampled" and v.get("se") is not None else ""
        ax.axhline(value, ls="-" if key == "L_floor_eps" else "--", lw=1.0 if key == "L_floor_eps" else 1.2,
                   color=color, label=f"{label} = {value:.4f}{se} ({kind})")
    s1 = trajectory.config.steps1
    if trajectory.config.schedule == "two-stage" and 0 < s1 < trajectory.step[-1]:
        ax.axvline(s1, color="grey", lw=0.8, ls=":", label="end of Stage 1")
    ax.set_xlabel("step")
    ax.set_ylabel("population loss (perturbed, ε inside the log)")
    if sampled.any():
        ax.set_title("Stage 2 on a fixed sample: losses after Stage 1 are sampled estimates", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_cosine(trajectory, path) -> None:
    """Cosine between exact and idealized Stage-1 gradients over Stage 1."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ok = np.isfinite(trajectory.cosine)
    if ok.any():
        ax.plot(trajectory.step[ok], trajectory.cosine[ok], marker=".", color="tab:purple")
    else:
        ax.text(0.5, 0.5, "no exact gradient available", ha="center", transform=ax.transAxes)
    ax.set_ylim(min(0.0, np.nanmin(trajectory.cosine) if ok.any() else 0.0), 1.02)
    ax.set_xlabel("Stage-1 step")
    ax.set_ylabel("cos(exact ∇A1 L, idealized)")
    save_figure(fig, path)


def plot_attention_to_parent(trajectory, graph, path) -> None:
    """Attention on the parent per non-root position, at init and after Stage 1."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    nr = graph.non_roots
    end = trajectory.stage1_end
    ax.bar(nr - 0.2, trajectory.attn_parent[0, nr], width=0.4, label="step 0", color="lightgrey")
    ax.bar(nr + 0.2, trajectory.attn_parent[end, nr], width=0.4, label=f"step {trajectory.step[end]}")
    ax.axhline(1 - 1 / graph.T, ls="--", color="k", lw=0.8, label="1 - 1/T")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position i (non-roots)")
    ax.set_ylabel("softmax(A1)[i, p(i)]")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_head_attention(graph, A1, path, title: str = "after training") -> None:
    """k-head first layer: row ``h`` shows ``softmax(MASK(A1^h))`` beside the adjacency of parent slot ``h``.

    ``graph`` is a :class:`popgrad.MultiParentGraph`; ``A1`` has shape
    ``(k, T, T)``. The slot adjacency's last row marks the target's parent
    (:meth:`popgrad.MultiParentGraph.adjacency`).
    """
    P = head_attention(A1)
    k = P.shape[0]
    fig, axes = plt.subplots(k, 2, figsize=(9, 4.2 * k), squeeze=False)
    for h in range(k):
        panels = ((P[h], f"head {h}: softmax(A1^{h}) {title}"),
                  (graph.adjacency(h), f"parent slot {h} (row T-1: target's parent)"))
        for ax, (M, name) in zip(axes[h], panels):
            im = ax.imshow(M, vmin=0, vmax=1, cmap="viridis")
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("key position j")
            ax.set_ylabel("query position i")
    fig.colorbar(im, ax=axes, shrink=0.6)
    save_figure(fig, path)


def plot_head_attention_to_parent(trajectory, graph, path) -> None:
    """Per head ``h``: attention on slot ``h``'s parent per row, at the first and the last record."""
    k = graph.k
    fig, axes = plt.subplots(k, 1, figsize=(6.5, 2.8 * k), squeeze=False)
    for h in range(k):
        ax = axes[h, 0]
        rows = np.flatnonzero(graph.slot_parents(h) >= 0)
        ax.bar(rows - 0.2, trajectory.attn_parent[0, h, rows], width=0.4, label="step 0", color="lightgrey")
        ax.bar(rows + 0.2, trajectory.attn_parent[-1, h, rows], width=0.4, label=f"step {trajectory.step[-1]}")
        ax.axhline(1 - 1 / graph.T, ls="--", color="k", lw=0.8, label="1 - 1/T")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(f"head {h}: P[i, p(i)_{h}]")
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("position i (rows with parents; T-1: the target's parent)")
    save_figure(fig, path)
