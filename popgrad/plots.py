"""Figures of a run (matplotlib, Agg backend, every file written atomically).

* :func:`plot_attention` -- ``softmax(A1)`` after Stage 1 beside the true
  adjacency (the paper's Figure 2);
* :func:`plot_loss` -- exact loss against the step, with ``L*``, the Bayes
  loss and the count-estimator loss as horizontal lines;
* :func:`plot_cosine` -- cosine between exact and idealized Stage-1 gradients;
* :func:`plot_attention_to_parent` -- attention on the parent per position.
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ._io import atomic_path  # noqa: E402
from .model import first_layer_attention  # noqa: E402

__all__ = ["plot_attention", "plot_loss", "plot_cosine", "plot_attention_to_parent", "save_figure"]


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
    the oracle (``L_star_eps``), the Bayes predictive (``L_bayes_eps``) and the
    count estimator (``L_count``), all under the loss the model is trained on.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ok = np.isfinite(trajectory.loss)
    ax.plot(trajectory.step[ok], trajectory.loss[ok], color="k", lw=1.5, label="exact loss L(θ)")
    eps = references.get("eps")
    tag = f" (same ε = {eps:.3g})" if eps is not None else ""
    styles = {"L_star_eps": (f"oracle knowing π{tag}", "tab:green"),
              "L_bayes_eps": (f"Bayes predictive{tag}", "tab:blue"),
              "L_count": (f"count estimator{tag}", "tab:orange")}
    for key, (label, color) in styles.items():
        if key in references and references[key] is not None:
            ax.axhline(references[key], ls="--", color=color, label=f"{label} = {references[key]:.4f}")
    s1 = trajectory.config.steps1
    if trajectory.config.schedule == "two-stage" and 0 < s1 < trajectory.step[-1]:
        ax.axvline(s1, color="grey", lw=0.8, ls=":", label="end of Stage 1")
    ax.set_xlabel("step")
    ax.set_ylabel("population loss (perturbed, ε inside the log)")
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
