"""The run figures say what they show and hide nothing (issue 32 family 8): matplotlib objects, not pixels."""
import os

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import popgrad.app.plots as plots
from popgrad.app import cli
from popgrad.app.config import resolve

CAT = ["--model", "catformer", "--graph", "two-parent", "--S", "2", "--T", "6", "--heads", "2,1",
       "--optimizer", "adamw", "--lr", "1e-2", "--init-scale", "1e-4", "--init-seed", "3",
       "--steps", "6", "--record-every", "2"]
REDUCED = ["--S", "2", "--T", "4", "--steps1", "3", "--steps2", "2", "--record-every", "1", "--no-sweep"]


@pytest.fixture
def figures(monkeypatch):
    """Run figures by file name, kept open instead of saved."""
    drawn = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi=120: drawn.__setitem__(os.path.basename(path), fig))
    return drawn


def _run(tmp_path, argv):
    assert cli.main(["run", *argv, "--out", str(tmp_path / "run"), "--no-progress"]) == 0


def _legends_outside_the_bars(fig):
    FigureCanvasAgg(fig).draw()
    bar_axes = [ax for ax in fig.axes if ax.patches]
    assert bar_axes
    for ax in bar_axes:
        legend = ax.get_legend()
        assert legend is not None
        box, frame = legend.get_window_extent(), ax.get_window_extent()
        assert box.x0 >= frame.x1, "the legend must sit beside the axes, not over the bars"
    return bar_axes


def test_full_model_figures_name_the_step_and_the_parent(tmp_path, figures):
    _run(tmp_path, CAT)
    last_step = 6
    attn = figures["attention.png"]
    heads = [ax.get_title() for ax in attn.axes if ax.get_title().startswith("head ")]
    assert heads and all(f"at step {last_step}" in t for t in heads), heads

    bars = _legends_outside_the_bars(figures["attention_to_parent.png"])
    graph = resolve({"model": "catformer", "graph": "two-parent", "S": 2, "T": 6}).task.graph
    parents = np.asarray(graph.parents)
    for ax in bars:
        assert "max over parents" in ax.get_ylabel()
        named = {int(round(t.xy[0] - 0.2)): int(t.get_text().removeprefix("p=")) for t in ax.texts}
        assert sorted(named) == sorted(int(i) for i in graph.non_roots)
        assert all(p in parents[i] for i, p in named.items()), named
        assert ax.get_ylim()[1] > 1.05  # room for the names above bars at 1
    assert "attended most at step 6" in bars[-1].get_xlabel()


def test_reduced_figures_name_the_step(tmp_path, figures):
    _run(tmp_path, REDUCED)
    stage1_end = 3
    title = figures["attention.png"].axes[0].get_title().replace("\n", " ")
    assert f"at step {stage1_end}, after Stage 1" in title, title
    (ax,) = _legends_outside_the_bars(figures["attention_to_parent.png"])
    assert ax.get_ylabel() == "softmax(A1)[i, p(i)]"


def test_k_head_figures_name_the_step(tmp_path, figures):
    _run(tmp_path, ["--graph", "two-parent", "--T", "5", "--S", "2", "--atoms", "1", "--schedule", "two-stage",
                    "--steps1", "3", "--steps2", "2", "--record-every", "1"])
    heads = [ax.get_title() for ax in figures["attention.png"].axes if ax.get_title().startswith("head ")]
    assert len(heads) == 2 and all(t.endswith("at step 3") for t in heads), heads
    _legends_outside_the_bars(figures["attention_to_parent.png"])
