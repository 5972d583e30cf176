"""``popgrad run --model catformer`` and the one run configuration (issues 19, 21)."""
import json

import numpy as np
import pytest

import popgrad as pg
from popgrad.app import cli
from popgrad.app.config import DEFAULTS, MULTI_PARENT_DEFAULTS, RunConfig, merge, resolve
from popgrad.app.kinds import KINDS, kind_of
from popgrad.checks.catformer import population_attention
from popgrad.train.config import resolve_auto

TINY = ["--model", "catformer", "--graph", "two-parent", "--S", "2", "--T", "6", "--heads", "2,1",
        "--optimizer", "adamw", "--lr", "1e-2", "--weight-decay", "1e-4", "--init-scale", "1e-4", "--init-seed", "3",
        "--steps", "6", "--record-every", "2", "--no-progress"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--model", "catformer", "--lr", "0"], "--lr: expected a finite number > 0"),
        (["--model", "catformer", "--steps", "0"], "--steps: expected an integer >= 1"),
        (["--model", "catformer", "--weight-decay", "-1"], "--weight-decay: expected a finite number >= 0"),
        (["--model", "catformer", "--init-scale", "nan"], "--init-scale: expected a finite number >= 0"),
        (["--model", "catformer", "--init-seed", "-1"], "--init-seed: expected an integer >= 0"),
        (["--model", "catformer", "--heads", "2,x"], "--heads '2,x': give the heads of each layer"),
        (["--model", "catformer", "--heads", "0,1"], "--heads '0,1'"),
        (["--model", "catformer", "--optimizer", "lion"], "--optimizer: invalid choice"),
        (["--model", "catformer", "--lr-schedule", "linear"], "--lr-schedule: invalid choice"),
        (["--model", "lstm"], "--model: invalid choice"),
        (["--model", "catformer", "--beta0", "1"], "--beta0 only applies to --model reduced"),
        (["--model", "catformer", "--schedule", "joint"], "--schedule only applies to --model reduced"),
        (["--lr", "1e-2"], "--lr only applies to --model catformer"),
        (["--model", "reduced", "--steps", "5"], "--steps only applies to --model catformer"),
        (["--model", "catformer", "--S", "4", "--T", "14"], "--model catformer needs the exact population"),
        (["--model", "catformer", "--graph", "ngram", "--n", "9", "--T", "6"], "--n 9 is out of range"),
    ],
)
def test_catformer_bad_values_one_line_exit_2(tmp_path, capsys, argv, needle):
    out = tmp_path / "never"
    assert cli.main(["run", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_tiny_catformer_run_writes_its_report_and_matches_the_python_api(tmp_path, capsys):
    out = tmp_path / "cat"
    assert cli.main(["run", *TINY, "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"report.json", "report.md", "trajectory.npz", "loss.png", "attention.png",
            "attention_to_parent.png"} <= names and "gradient_cosine.png" not in names
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["model"] == "catformer" and report["config"]["heads"] == "2,1"
    assert "beta0" not in report["config"] and "steps1" not in report["config"]
    assert [c["name"] for c in report["checks"]] == ["catformer_graph_recovery", "head_specialization",
                                                     "induction_head"]
    assert report["checks"][0]["status"] == "not_applicable"  # a k-parent task: head_specialization decides

    # The same run through the Python API: the CLI passed every setting through (bit-identical).
    task = pg.MultiParentTask(pg.two_parent(6), pg.dirichlet_tensor_prior(2, 2, 1.0, 16, seed=0, symmetrize="full"))
    model = pg.CatFormer(2, 6, heads=(2, 1))
    traj = pg.train_catformer(task, model, 6, optimizer="adamw", lr=1e-2, weight_decay=1e-4,
                              init=("normal", 1e-4, 3), record_every=2)
    saved = pg.CatFormerTrajectory.load(out / "trajectory.npz")
    np.testing.assert_array_equal(saved.loss, traj.loss)
    np.testing.assert_array_equal(saved.step, [0, 2, 4, 6])
    assert report["trajectory"]["final_loss"] == float(traj.loss[-1])

    # References at eps = 0 (the softmax readout), computed independently.
    assert report["references"]["eps"] == 0.0
    assert report["references"]["L_bayes"]["value"] == pytest.approx(pg.bayes_loss(task), rel=1e-12)
    eps = task.default_eps  # the count estimator smoothed to (f + eps) / (1 + S eps): a proper cross-entropy
    smoothed = pg.count_estimator_loss(task, eps=eps) + np.log1p(2 * eps)
    assert report["references"]["L_count"]["value"] == pytest.approx(smoothed, rel=1e-12)
    assert report["references"]["L_count"]["value"] > report["references"]["L_bayes"]["value"]
    section = report["catformer"]
    assert section["excess_over"]["bayes"] == pytest.approx(traj.loss[-1] - pg.bayes_loss(task), rel=1e-9)
    P = np.array(section["population_attention_layer1"])
    np.testing.assert_allclose(P, population_attention(task, model, traj.final), rtol=1e-12)
    np.testing.assert_allclose(P.sum(axis=2), 1.0, rtol=1e-12)


def test_catformer_resume_reproduces_the_report_and_refuses_other_settings(tmp_path, capsys):
    out = tmp_path / "cat"
    argv = ["run", *TINY, "--checkpoint-every", "2", "--out", str(out)]
    assert cli.main(argv) == 0
    whole = json.loads((out / "report.json").read_text())
    bad = ["run", *TINY, "--lr", "2e-2", "--checkpoint-every", "2", "--out", str(out), "--resume"]
    assert cli.main(bad) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different task or configuration" in err, err
    assert cli.main([*argv, "--resume"]) == 0
    again = json.loads((out / "report.json").read_text())
    assert again["trajectory"]["final_loss"] == whole["trajectory"]["final_loss"]


def test_resuming_another_models_checkpoint_names_the_kinds(tmp_path, capsys):
    # a reduced run resumed from a full-model checkpoint used to list each setting as '(absent)'
    out = tmp_path / "cat"
    assert cli.main(["run", *TINY, "--checkpoint-every", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["run", "--S", "2", "--T", "5", "--steps1", "3", "--steps2", "3", "--no-sweep", "--no-progress",
                     "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "written by a different kind of run" in err and "(absent)" not in err, err
    assert "heads" in err and "beta0" in err, err


def test_catformer_single_parent_reports_graph_recovery(tmp_path, capsys):
    out = tmp_path / "chain"
    argv = ["run", "--model", "catformer", "--graph", "chain", "--S", "2", "--T", "5", "--steps", "4",
            "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["head_specialization"]["status"] == "not_applicable"
    assert checks["catformer_graph_recovery"]["status"] in ("pass", "fail")
    assert report["config"]["record_every"] == 1  # max(1, steps // 128)
    assert report["config"]["optimizer"] == "sgd" and report["config"]["lr_schedule"] == "cosine"


def test_resolve_is_frozen_and_resolves_auto_once():
    rc = resolve({"S": 2, "T": 4, "graph": "-1,0,1,-1"})
    assert isinstance(rc, RunConfig) and rc.kind is KINDS["reduced-single"]
    assert rc["gradient"] == "exact" and rc["stage2"] == "exact" and rc["T"] == 4
    with pytest.raises(TypeError):
        rc.settings["S"] = 3
    assert rc.train.gradient == "exact" and isinstance(rc.train, pg.TrainConfig)
    big = resolve({"S": 3, "T": 40, "steps2": 0, "sweep": False})
    assert (big["gradient"], big["stage2"]) == resolve_auto("auto", "auto", False, 0) == ("field", "exact")
    assert resolve_auto("auto", "auto", False, 5) == ("field", "sampled")
    assert resolve_auto("auto", "auto", True, 5) == ("exact", "exact")
    assert kind_of(merge({"graph": "ngram"})) is KINDS["reduced-k-head"]
    assert kind_of(merge({"graph": "ngram", "model": "catformer"})) is KINDS["catformer"]
    assert "model" not in merge({"model": "reduced"})  # the reduced config keys are unchanged


def test_multi_head_defaults_agree_everywhere():
    import inspect

    sig = inspect.signature(pg.train_multi_head).parameters
    cfg = pg.MultiHeadTrainConfig()
    job = dict(DEFAULTS, **MULTI_PARENT_DEFAULTS)
    for key in ("beta0", "lr1", "steps1", "lr2", "steps2", "schedule"):
        assert sig[key].default == getattr(cfg, key) == job[key], key
    rc = resolve({"graph": "two-parent", "steps1": 3})
    assert rc.train == pg.MultiHeadTrainConfig(steps1=3, record_every=50, init_seed=0).validate()


def test_sweep_cells_of_the_full_model(tmp_path):
    """``popgrad sweep``'s spec expansion and cell runner (the Dask task, run here in-process)."""
    from popgrad.app.sweep import cached_row, expand, run_cell

    spec = {"fixed": {"model": "catformer", "graph": "chain", "S": 2, "T": 4, "steps": 3},
            "axes": {"optimizer": ["sgd", "adamw"]}}
    cells = expand(spec)
    assert [c["optimizer"] for _, c in cells] == ["sgd", "adamw"] and all("beta0" not in c for _, c in cells)
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 8, seed=0, symmetrize=True, floor=0.15, uniform_mean=True))
    for cid, cfg in cells:
        row = run_cell(cfg, str(tmp_path / cid))
        assert row["status"] == "ok", row["error"]
        assert row["optimizer"] == cfg["optimizer"] and row["beta0"] is None and "induction_head_value" in row
        traj = pg.train_catformer(task, pg.CatFormer(2, 4), 3, optimizer=cfg["optimizer"], record_every=1)
        assert row["final_loss"] == float(traj.loss[-1])
        assert cached_row(str(tmp_path / cid), cfg) is not None  # a rerun resumes the cell
    with pytest.raises(ValueError, match="--beta0 only applies to --model reduced"):
        expand({"fixed": {"model": "catformer", "beta0": 1.0}})
