"""Figures of a run (matplotlib, every file written atomically).

Figures are :class:`matplotlib.figure.Figure` objects rendered straight to
their files: importing this module neither imports ``matplotlib.pyplot`` nor
switches the backend (a notebook's backend is left alone). Every figure takes
``context`` (e.g. ``"S = 3, T = 10, graph chain, α = 1"``, from
:func:`run_context`) for its title; positions are integers on every axis.


* :func:`plot_attention` -- ``softmax(A1)`` after Stage 1 beside the true
  adjacency (the paper's Figure 2);
* :func:`plot_loss` -- exact loss against the step, with ``L*``, the Bayes
  loss and the count-estimator loss as horizontal lines;
* :func:`plot_cosine` -- cosine between exact and idealized Stage-1 gradients;
* :func:`plot_attention_to_parent` -- attention on the parent per position;
* :func:`plot_head_attention` -- k-head first layer: each head's
  ``softmax(A1^h)`` beside the adjacency of each parent slot (multi-parent tasks);
* :func:`plot_head_attention_to_parent` -- per head, attention on its slot's parent;
* :func:`plot_population_attention` -- the full model: each head's exact population-average
  layer-1 attention beside the true graph (Figures 2 / 7 style);
* :func:`plot_parent_attention_per_position` -- the full model: attention to the parent per
  position and head, at the start and at the end.
"""
from __future__ import annotations

import os
import sys
import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .._io import atomic_path
from ..model.multihead import head_attention
from ..model.reduced import first_layer_attention

__all__ = ["plot_attention", "plot_loss", "plot_cosine", "plot_attention_to_parent", "save_figure",
           "plot_head_attention", "plot_head_attention_to_parent", "run_context", "new_figure",
           "plot_population_attention", "plot_parent_attention_per_position"]

#: Label of every attention colorbar.
ATTENTION_LABEL = "attention weight softmax(A1)[i, j]"


def new_figure(nrows: int = 1, ncols: int = 1, figsize=(6.5, 4), **kw):
    """``(fig, axes)``: a :class:`matplotlib.figure.Figure` (no pyplot, no backend) and its subplots."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def run_context(cfg: dict, task=None) -> str:
    """The title line of a run's figures: ``S``, ``T``, the graph and ``α`` (and ``T_eff``)."""
    T = task.T if task is not None else cfg.get("T")
    text = f"S = {cfg['S']}, T = {T}, graph {cfg['graph']}, α = {cfg['alpha']:g}"
    t_eff = getattr(task, "t_eff", None)
    if t_eff is not None and T is not None and abs(float(t_eff) - float(T)) > 1e-9:
        text += f", T_eff = {float(t_eff):.4g}"
    return text


def _integer_axis(axis) -> None:
    axis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig, path, dpi: int = 120) -> None:
    """Save ``fig`` to ``path`` atomically (a pyplot figure is closed afterwards)."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=os.path.splitext(path)[1][1:] or "png")
    finally:
        if "matplotlib.pyplot" in sys.modules:  # only when the caller's figure came from pyplot
            sys.modules["matplotlib.pyplot"].close(fig)


def _attention_grid(fig, axes, rows, path, context: str, shrink: float, label: str = ATTENTION_LABEL) -> None:
    """Heatmaps on ``[0, 1]``: ``rows[r][c] = (M, title)`` into ``axes[r][c]`` (``axes`` one row or a grid),
    one colour bar for all, ``context`` as the figure title; saved to ``path``."""
    im = None
    for ax_row, panels in zip(np.atleast_2d(axes), rows):
        for ax, (M, name) in zip(ax_row, panels):
            im = ax.imshow(M, vmin=0, vmax=1, cmap="viridis")
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("key position j")
            ax.set_ylabel("query position i")
            _integer_axis(ax.xaxis)
            _integer_axis(ax.yaxis)
    fig.colorbar(im, ax=axes, shrink=shrink, label=label)
    if context:
        fig.suptitle(context, fontsize=10)
    save_figure(fig, path)


def plot_attention(graph, A1, path, title: str = "first layer after Stage 1", context: str = "") -> None:
    """Heatmap of ``softmax(MASK(A1))`` beside the true adjacency."""
    P = first_layer_attention(A1)
    adj = graph.adjacency()
    fig, axes = new_figure(1, 2, figsize=(9, 4.6))
    panels = [(P, textwrap.fill(f"softmax(A1) {title}", 44)), (adj, textwrap.fill("true adjacency (row = child)", 44))]
    _attention_grid(fig, axes, [panels], path, context, shrink=0.8)


def plot_loss(trajectory, references: dict, path, context: str = "") -> None:
    """Exact (perturbed) loss vs step with the same-``ε`` reference lines.

    ``references`` is :func:`popgrad.checks.reference_losses`; the lines are
    the exact floor (``L_floor_eps``, the lower bound, solid), the oracle
    (``L_star_eps``, ``L*_ε``), the Bayes predictive (``L_bayes_eps``,
    ``L_Bayes,ε``) and the count estimator (``L_count``), all under the loss the
    model is trained on; ``L*_ε`` and ``L_Bayes,ε`` are not bounds of it. The
    official experiments' two lines (``ε = 0``): the edges-only count estimator
    (``L_count_edges``) and the official ``bayes`` line (``L_official_bayes_line``).
    """
    fig, ax = new_figure(figsize=(6.5, 4))
    ok = np.isfinite(trajectory.loss)
    sampled = ok & np.isfinite(getattr(trajectory, "loss_se", np.full(len(ok), np.nan)))
    exact = ok & ~sampled
    if exact.any():
        ax.plot(trajectory.step[exact], trajectory.loss[exact], color="k", lw=1.5, label="exact loss L(θ)")
    if sampled.any():
        n = getattr(trajectory, "stage2_samples", 0) or getattr(trajectory.config, "batch_size", None) or 0
        ax.errorbar(trajectory.step[sampled], trajectory.loss[sampled], yerr=trajectory.loss_se[sampled],
                    color="tab:red", lw=1.2, capsize=2, label=f"sampled loss ± 1 SE (n = {n:,})")
    eps = references.get("eps")
    tag = f" (same ε = {eps:.3g})" if eps is not None else ""
    styles = {"L_floor_eps": (f"L_floor,ε: exact floor, lower bound{tag}", "tab:gray"),
              "L_star_eps": (f"L*_ε: oracle knowing π, not a bound{tag}", "tab:green"),
              "L_bayes_eps": (f"L_Bayes,ε: Bayes predictive, not a bound{tag}", "tab:blue"),
              "L_count": (f"count estimator{tag}", "tab:orange"),
              "L_count_edges": ("edges-only count estimator", "tab:brown"),
              "L_official_bayes_line": ("official bayes line (roots counted)", "tab:purple")}
    for key, (label, color) in styles.items():
        v = references.get(key)
        value = v.get("value") if isinstance(v, dict) else v
        if value is None:
            continue
        kind = v.get("kind", "exact") if isinstance(v, dict) else "exact"
        se = f" ± {v['se']:.1g}" if kind == "sampled" and v.get("se") is not None else ""
        if isinstance(v, dict) and "smoothing" in v:  # the full model's count estimator: (f + ε)/(1 + Sε)
            label = label.replace(tag, "") + f" (smoothed, ε = {v['smoothing']:.3g})"
        floor = key == "L_floor_eps"  # wide and on top, so that a reference equal to it does not hide it
        ax.axhline(value, ls="-" if floor else "--", lw=3.0 if floor else 1.2, alpha=0.5 if floor else 1.0,
                   zorder=3 if floor else 2, color=color, label=f"{label} = {value:.4f}{se} ({kind})")
    s1 = getattr(trajectory.config, "steps1", 0)
    if getattr(trajectory.config, "schedule", "") == "two-stage" and 0 < s1 < trajectory.step[-1]:
        ax.axvline(s1, color="grey", lw=0.8, ls=":", label="end of Stage 1")
    ax.set_xlabel("step")
    _integer_axis(ax.xaxis)
    ax.set_ylabel("population loss (cross-entropy, ε = 0)" if eps == 0 else
                  "population loss (perturbed, ε inside the log)" if eps is None else
                  f"population loss (perturbed, ε = {eps:.3g} inside the log)")
    if getattr(trajectory, "status", "completed") == "diverged" and ok.any():
        last = int(trajectory.step[ok][-1])
        top = float(np.max(trajectory.loss[ok]))
        ax.axvline(last, color="tab:red", lw=1.0, ls="-.",
                   label=f"diverged (last finite loss: step {last}; largest loss {top:.3g})")
        vals = trajectory.loss[ok]
        refs = [r.get("value") if isinstance(r, dict) else r for k, r in references.items() if k != "eps"]
        low = min([float(vals.min())] + [float(r) for r in refs if isinstance(r, (int, float)) and np.isfinite(r)])
        if low > 0 and vals.max() / low > 1e3:  # a blow-up to 1e294 on a linear axis shows nothing else
            with np.errstate(over="ignore"):  # matplotlib's autoscale margin near 1e300
                ax.set_yscale("log")
                ax.set_ylim(low / 1.25, min(float(vals.max()) * 1.25, 1e100))  # above: off the axis (see label)
    notes = []
    if ok.any() and trajectory.step[ok][0] > trajectory.step[0]:
        notes.append(f"no loss before step {int(trajectory.step[ok][0])}: Stage 1 used the "
                     f"{_gradient_name(trajectory)}, which does not evaluate the loss")
    if sampled.any():
        if getattr(trajectory, "stage2_samples", 0):
            notes.append("Stage 2 on a fixed sample: losses after Stage 1 are sampled estimates")
        else:
            notes.append("sampled training: each loss is its step's batch estimate ± 1 SE")
    title = "\n".join(([context] if context else []) + notes)
    if title:
        ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)  # beside: no line hidden
    save_figure(fig, path)


def _gradient_name(trajectory) -> str:
    """What the Stage-1 gradient of ``trajectory`` was: exact, the first-order field, or idealized."""
    method = getattr(trajectory.config, "gradient", "exact")
    return {"field": "first-order field ∇A1 L (exact to first order in β0)",
            "idealized": "idealized gradient (Knowl 3)"}.get(method, "exact ∇A1 L")


def plot_cosine(trajectory, path, context: str = "") -> None:
    """Cosine between the Stage-1 gradient used (exact, or the first-order field) and the idealized one."""
    fig, ax = new_figure(figsize=(6.5, 3.6))
    ok = np.isfinite(trajectory.cosine)
    if ok.any():
        ax.plot(trajectory.step[ok], trajectory.cosine[ok], marker=".", color="tab:purple")
    else:
        ax.text(0.5, 0.5, "no exact gradient available", ha="center", transform=ax.transAxes)
    ax.set_ylim(min(0.0, np.nanmin(trajectory.cosine) if ok.any() else 0.0), 1.02)
    ax.set_xlabel("Stage-1 step")
    _integer_axis(ax.xaxis)
    used = "field" if getattr(trajectory.config, "gradient", "exact") == "field" else "exact ∇A1 L"
    ax.set_ylabel(f"cos({used}, idealized g)")
    ax.set_title(((context + "\n") if context else "") + f"Stage-1 gradient: {_gradient_name(trajectory)}",
                 fontsize=8)
    save_figure(fig, path)


def plot_attention_to_parent(trajectory, graph, path, context: str = "") -> None:
    """Attention on the parent per non-root position, at init and after Stage 1."""
    fig, ax = new_figure(figsize=(6.5, 3.6))
    nr = graph.non_roots
    end = trajectory.stage1_end
    ax.bar(nr - 0.2, trajectory.attn_parent[0, nr], width=0.4, label="step 0", color="lightgrey")
    ax.bar(nr + 0.2, trajectory.attn_parent[end, nr], width=0.4, label=f"step {trajectory.step[end]}")
    ax.axhline(1 - 1 / graph.T, ls="--", color="k", lw=0.8, label="1 - 1/T")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("position i (non-roots)")
    _integer_axis(ax.xaxis)
    ax.set_ylabel("softmax(A1)[i, p(i)]")
    if context:
        ax.set_title(context, fontsize=9)
    _legend_beside(ax)
    save_figure(fig, path)


def _legend_beside(ax) -> None:
    """The legend to the right of the axes, outside them: it covers no bar and no line."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def plot_head_attention(graph, A1, path, title: str = "after training", context: str = "") -> None:
    """k-head first layer: row ``h`` shows ``softmax(MASK(A1^h))`` beside the adjacency of parent slot ``h``.

    ``graph`` is a :class:`popgrad.MultiParentGraph`; ``A1`` has shape
    ``(k, T, T)``. The slot adjacency's last row marks the target's parent
    (:meth:`popgrad.MultiParentGraph.adjacency`).
    """
    P = head_attention(A1)
    k = P.shape[0]
    fig, axes = new_figure(k, 2, figsize=(9, 4.4 * k), squeeze=False)
    rows = [((P[h], f"head {h}: softmax(A1^{h}) {title}"),
             (graph.adjacency(h), f"parent slot {h} (row T-1: target's parent)")) for h in range(k)]
    _attention_grid(fig, axes, rows, path, context, shrink=0.6)


def plot_head_attention_to_parent(trajectory, graph, path, context: str = "") -> None:
    """Per head ``h``: attention on slot ``h``'s parent per row, at the first and the last record."""
    k = graph.k
    fig, axes = new_figure(k, 1, figsize=(6.5, 2.8 * k), squeeze=False)
    for h in range(k):
        ax = axes[h, 0]
        rows = np.flatnonzero(graph.slot_parents(h) >= 0)
        _parent_bars(ax, rows, trajectory.attn_parent[0, h, rows], trajectory.attn_parent[-1, h, rows],
                     trajectory.step[-1], graph.T, f"head {h}: P[i, p(i)_{h}]")
    axes[-1, 0].set_xlabel("position i (rows with parents; T-1: the target's parent)")
    if context:
        axes[0, 0].set_title(context, fontsize=9)
    save_figure(fig, path)


def _true_graph(graph):
    """``[(adjacency, name)]``: the adjacency of a single-parent graph, or one per parent slot."""
    if getattr(graph, "k", 1) > 1:
        return [(graph.adjacency(h), f"parent slot {h} (row T-1: target's parent)") for h in range(graph.k)]
    return [(graph.adjacency(), "true adjacency (row = child)")]


def plot_population_attention(graph, P, path, context: str = "", step: int | None = None) -> None:
    """Full model: row ``h`` shows head ``h``'s population-average layer-1 attention ``P[h]`` (shape
    ``(m, T, T)``, :func:`popgrad.checks.catformer.population_attention`) beside the true graph;
    ``step`` (the training step of ``P``) goes into each head's title."""
    P = np.asarray(P)
    m = P.shape[0]
    truth = _true_graph(graph)
    at = f" at step {int(step)}" if step is not None else ""
    fig, axes = new_figure(m, 1 + len(truth), figsize=(4.5 * (1 + len(truth)), 4.2 * m), squeeze=False)
    rows = [[(P[h], f"head {h}: population-average attention{at}")] + truth for h in range(m)]
    _attention_grid(fig, axes, rows, path, context, shrink=0.6,
                    label="attention weight E_s[softmax(x Ã1 xᵀ)][i, j]")


def plot_parent_attention_per_position(graph, first, last, last_step: int, path, context: str = "",
                                       parents=None) -> None:
    """Full model: ``P̄[h, i, p(i)]`` per non-root position ``i`` and head ``h`` (``first``, ``last``:
    shape ``(m, T)``), at step 0 and at ``last_step``.

    For a k-parent graph the bars are the largest attention on any one parent of ``i``
    (:func:`popgrad.checks.catformer.attention_to_parent_per_position`); ``parents`` (shape
    ``(m, T)``, integer positions) names the parent that receives it at ``last_step``, written
    above each last bar.
    """
    first, last = np.asarray(first), np.asarray(last)
    m = first.shape[0]
    nr = np.asarray(graph.non_roots)
    multi = getattr(graph, "k", 1) > 1
    fig, axes = new_figure(m, 1, figsize=(6.5, 2.8 * m), squeeze=False)
    for h in range(m):
        ax = axes[h, 0]
        label = f"head {h}: max over parents\nP̄[i, p_j(i)]" if multi else f"head {h}: P̄[i, p(i)]"
        _parent_bars(ax, nr, first[h, nr], last[h, nr], last_step, graph.T, label)
        if multi and parents is not None:
            ax.set_ylim(0, 1.15)  # room for the names above the bars
            for i in nr:
                ax.annotate(f"p={int(np.asarray(parents)[h, i])}", (i + 0.2, min(float(last[h, i]), 1.0)),
                            xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=6)
    axes[-1, 0].set_xlabel("position i (non-roots)" + (
        f"; p=j above a bar: the parent j of i attended most at step {int(last_step)}"
        if multi and parents is not None else ""))
    if context:
        axes[0, 0].set_title(context, fontsize=9)
    save_figure(fig, path)


def _parent_bars(ax, rows, first, last, last_step, T: int, ylabel: str) -> None:
    """Bars of the attention to the parent at ``rows``: step 0 beside ``last_step``, and the ``1 - 1/T`` line."""
    ax.bar(rows - 0.2, first, width=0.4, label="step 0", color="lightgrey")
    ax.bar(rows + 0.2, last, width=0.4, label=f"step {last_step}")
    ax.axhline(1 - 1 / T, ls="--", color="k", lw=0.8, label="1 - 1/T")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(ylabel)
    _integer_axis(ax.xaxis)
    _legend_beside(ax)
