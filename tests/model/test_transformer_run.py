"""``popgrad run --model transformer``: the kind of run of popgrad.Transformer (defaults: the notebook's recipe)."""
import json

import numpy as np
import pytest

import popgrad as pg
from popgrad.app import cli
from popgrad.app.kinds import KINDS

TINY = ["--model", "transformer", "--S", "2", "--T", "4", "--steps", "20", "--record-every", "5", "--no-progress"]


def test_the_kind_is_registered_with_the_notebooks_recipe():
    kind = KINDS["transformer"]
    d = kind.defaults
    assert (d["optimizer"], d["lr"], d["lr_schedule"], d["weight_decay"], d["steps"]) == ("adamw", 0.01, "cosine",
                                                                                          2e-4, 4096)
    assert (d["graph"], d["prior"], d["alpha"], d["heads"], d["init_scale"]) == ("chain", "continuous", 0.1, "1,1",
                                                                                 1.0)


def test_tiny_run_writes_its_report_and_equals_train_model(tmp_path):
    out = tmp_path / "tf"
    assert cli.main(["run", *TINY, "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"report.json", "report.md", "trajectory.npz", "loss.png", "attention.png"} <= names
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["model"] == "transformer"
    assert [c["name"] for c in report["checks"]] == ["model_graph_recovery"]
    # the same run through the Python API, bit for bit
    task = pg.Task(pg.chain(4), pg.DirichletPrior(2, 0.1))
    model = pg.Transformer(2, 4)
    traj = pg.train_model(task, model, 20, optimizer="adamw", lr=0.01, lr_schedule="cosine", weight_decay=2e-4,
                          eps=0.0, record_every=5, init_scale=1.0, init_seed=0)
    with np.load(out / "trajectory.npz") as z:
        np.testing.assert_array_equal(z["loss"], traj.loss)
        np.testing.assert_array_equal(z["step"], [0, 5, 10, 15, 20])
        for k, v in traj.final.items():
            np.testing.assert_array_equal(z[f"final_{k}"], v)
    assert report["trajectory"]["final_loss"] == float(traj.loss[-1])
    assert report["references"]["L_official_bayes"]["value"] == pytest.approx(pg.official_bayes_loss(task), rel=1e-12)
    # both official reference lines, each named for what it is (report.json, report.md)
    line = pg.official_bayes_loss(task, root_quirk=True)
    assert report["references"]["L_official_bayes_line"]["value"] == pytest.approx(line, rel=1e-12)
    assert report["transformer"]["official_bayes_line"]["value"] == pytest.approx(line, rel=1e-12)
    md = (out / "report.md").read_text()
    assert "edges-only count estimator" in md and "the official bayes line (roots counted)" in md
    sec = report["transformer"]
    P = np.array(sec["population_attention_layer1"])
    np.testing.assert_allclose(P.sum(axis=2), 1.0, rtol=1e-12)
    assert "## The standard transformer" in (out / "report.md").read_text()


def test_sampled_run_at_a_size_past_enumeration(tmp_path):
    out = tmp_path / "tfs"
    argv = ["--model", "transformer", "--S", "4", "--T", "14", "--gradient", "sampled", "--batch-size", "16",
            "--steps", "3", "--record-every", "1", "--no-progress", "--out", str(out)]
    assert cli.main(["run", *argv]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["checks"][0]["status"] == "not_applicable"
    assert report["references"]["L_official_bayes_sampled"]["kind"] == "sampled"
    refs = report["references"]
    assert refs["L_official_bayes_line_sampled"]["kind"] == "sampled"
    assert refs["model_minus_official_bayes_line_sampled"]["value"] == pytest.approx(
        refs["L_model_heldout_sampled"]["value"] - refs["L_official_bayes_line_sampled"]["value"], abs=1e-12)
    assert report["transformer"]["attention_kind"].startswith("sampled")


def test_resume_reproduces_the_run_and_refuses_other_settings(tmp_path, capsys):
    out = tmp_path / "tf"
    argv = ["run", *TINY, "--checkpoint-every", "5", "--out", str(out)]
    assert cli.main(argv) == 0
    whole = json.loads((out / "report.json").read_text())
    assert cli.main(["run", *TINY, "--lr", "0.02", "--checkpoint-every", "5", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert cli.main([*argv, "--resume"]) == 0
    assert json.loads((out / "report.json").read_text())["trajectory"]["final_loss"] == \
        whole["trajectory"]["final_loss"]


@pytest.mark.parametrize("argv, needle", [
    (["--heads", "2,1"], "heads[0] = 2: the official Transformer runs one head per layer"),
    (["--heads", "x"], "--heads 'x': give the heads of each layer"),
    (["--S", "4", "--T", "14"], "--model transformer needs the exact population"),
    (["--lr", "0"], "--lr: expected a finite number > 0"),
    (["--gradient", "field"], "--gradient"),
    (["--batch-size", "5"], "--batch-size only applies to --gradient sampled"),  # was silently ignored
    (["--sample-seed", "5"], "--sample-seed only applies to --gradient sampled"),
])
def test_bad_values_one_line_exit_2(tmp_path, capsys, argv, needle):
    out = tmp_path / "never"
    assert cli.main(["run", "--model", "transformer", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
