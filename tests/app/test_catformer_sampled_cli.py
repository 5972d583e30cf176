"""``popgrad run --model catformer --gradient sampled``, ``--prior``, ``--roots``, ``--graph official-random``
(issues 28 and 30): one-line errors, the sampled report, and the task the flags build."""
import json

import numpy as np
import pytest

import popgrad as pg
from popgrad.app import cli
from popgrad.app.config import resolve
from popgrad.train.catformer import CatFormerTrajectory

SAMPLED = ["--model", "catformer", "--gradient", "sampled", "--batch-size", "16", "--sample-seed", "3",
           "--S", "2", "--T", "5", "--steps", "4", "--record-every", "2", "--prior", "continuous", "--alpha", "0.5",
           "--no-progress"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--model", "catformer", "--gradient", "noisy"], "--gradient: invalid choice"),
        (["--model", "catformer", "--gradient", "sampled", "--batch-size", "0"], "--batch-size: expected an integer >= 1"),
        (["--model", "catformer", "--gradient", "sampled", "--batch-size", "x"], "--batch-size: expected an integer"),
        (["--model", "catformer", "--gradient", "sampled", "--sample-seed", "-1"],
         "--sample-seed: expected an integer >= 0"),
        (["--model", "catformer", "--batch-size", "64"], "--batch-size only applies to --gradient sampled"),
        (["--model", "catformer", "--sample-seed", "2"], "--sample-seed only applies to --gradient sampled"),
        (["--model", "catformer", "--gradient", "field"], "--gradient 'field': use exact, sampled"),
        (["--model", "reduced", "--gradient", "sampled"], "--gradient 'sampled'"),
        (["--model", "reduced", "--batch-size", "4"], "--batch-size only applies to --model catformer"),
        (["--prior", "dirichlet"], "--prior: invalid choice"),
        (["--roots", "uniform"], "--roots only applies to --prior continuous"),
        (["--prior", "continuous", "--atoms", "4"], "--atoms only applies to --prior finite"),
        (["--prior", "continuous", "--floor", "0.1"], "--floor only applies to --prior finite"),
        (["--model", "catformer", "--graph", "two-parent", "--prior", "continuous", "--roots", "stationary"],
         "--roots stationary is not available for --graph two-parent"),
        (["--graph", "official-randm"], "unknown --graph 'official-randm'"),
    ],
)
def test_bad_values_one_line_exit_2(tmp_path, capsys, argv, needle):
    out = tmp_path / "never"
    assert cli.main(["run", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_flags_build_the_official_task():
    rc = resolve({"graph": "official-random", "T": 9, "seed": 4, "prior": "continuous", "roots": "uniform",
                  "alpha": 0.1, "S": 3})
    assert rc.task.graph.to_string() == pg.official_random_tree(9, seed=4).to_string()
    assert isinstance(rc.task.prior, pg.DirichletPrior) and rc.task.prior.roots == "uniform"
    assert rc.task.prior.alpha == 0.1
    rc = resolve({"graph": "two-parent", "T": 6, "prior": "continuous", "alpha": 0.2, "model": "catformer",
                  "heads": "2,1"})
    assert isinstance(rc.task.prior, pg.DirichletTensorPrior)
    assert not resolve({"S": 2, "T": 5}).task.continuous  # the finite prior stays the default
    rc = resolve({"model": "catformer", "gradient": "sampled", "S": 10, "T": 20, "prior": "continuous",
                  "batch_size": 8})
    assert (rc.train.gradient, rc.train.batch_size, rc.train.sample_seed) == ("sampled", 8, 0)  # no size limit
    rc = resolve({"model": "catformer", "S": 2, "T": 5})
    assert (rc.train.gradient, rc.train.batch_size, rc.train.sample_seed) == ("exact", None, None)


def test_sampled_run_report_is_labelled_sampled_and_matches_the_python_api(tmp_path, capsys):
    out = tmp_path / "s"
    assert cli.main(["run", *SAMPLED, "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    refs = report["references"]
    for key in ("L_model_heldout_sampled", "L_official_bayes_sampled", "L_bayes_sampled",
                "model_minus_official_bayes_sampled", "L_official_bayes_line_sampled",
                "model_minus_official_bayes_line_sampled"):
        assert refs[key]["kind"] == "sampled" and refs[key]["se"] > 0 and refs[key]["n"] == 8192
    # the official line is InContextTree.bayes as written (roots counted) on the same held-out sample
    from popgrad.app.kinds.catformer import READOUT_SAMPLES, READOUT_SEED

    smp = pg.Task(pg.chain(5), pg.DirichletPrior(2, 0.5)).sample(READOUT_SAMPLES, READOUT_SEED)
    f = pg.official_bayes_predict(pg.chain(5), smp.seqs, 2, 0.5, root_quirk=True)
    line = -np.sum(np.where(smp.targets > 0, smp.targets * np.log(f), 0.0), axis=1).mean()
    assert refs["L_official_bayes_line_sampled"]["value"] == pytest.approx(line, rel=1e-12)
    assert "minus the official bayes line (roots counted)" in (out / "report.md").read_text()
    cat = report["catformer"]
    assert cat["gradient"] == "sampled" and len(cat["attention_to_parent_per_position_se"][0]) == 5
    assert {c["name"]: c["kind"] for c in report["checks"]}["catformer_graph_recovery"] == "sampled"
    assert report["trajectory"]["final_loss_kind"] == "sampled" and report["trajectory"]["final_loss_n"] == 16
    md = (out / "report.md").read_text()
    assert "sampled read-outs" in md and "positional block (exact)" in md and "(n = 16)" in md
    # the same run through the Python API: bit-identical trajectory
    task = pg.Task(pg.chain(5), pg.DirichletPrior(2, 0.5))
    traj = pg.train_catformer(task, pg.CatFormer(2, 5), 4, gradient="sampled", batch_size=16, sample_seed=3,
                              record_every=2)
    saved = CatFormerTrajectory.load(out / "trajectory.npz")
    np.testing.assert_array_equal(saved.final.W, traj.final.W)
    np.testing.assert_array_equal(saved.loss, traj.loss)
    np.testing.assert_array_equal(saved.loss_se, traj.loss_se)


def test_sweep_accepts_the_sampled_catformer_keys(tmp_path):
    spec = tmp_path / "sweep.toml"
    spec.write_text('[fixed]\nmodel = "catformer"\ngradient = "sampled"\nS = 2\nT = 4\nsteps = 2\nprior = '
                    '"continuous"\nbatch_size = 8\n[axes]\nsample_seed = [0, 1]\n')
    assert cli.main(["sweep", str(spec), "--out", str(tmp_path / "w"), "--workers", "1", "--no-progress"]) == 0
