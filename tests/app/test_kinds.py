"""One kind of run, one module (issue 26): the registry, a toy kind registered from here and run through
``popgrad run``, flags built from specs, the app passing settings to the trainers unchanged."""
import json
import os

import numpy as np
import pytest

import popgrad as pg
from popgrad.app import cli
from popgrad.app.config import ARG_SPECS, DEFAULTS, RunConfig, merge, resolve
from popgrad.app.kinds import KINDS, Kind, KindBase, common_defaults, kind_of, register
from popgrad.app.settings import Flag
from popgrad.checks import CheckResult

from .compare_runs import compare_folders, report_differences, trajectory_differences


# ------------------------------------------------------------------ a toy kind of run: this is all it takes
class Toy(KindBase):
    name, model, summary = "toy", "toy", "a toy: Stage 1 only, for a few steps"
    flags = (Flag("toy_steps", "int", 1, default=3, help="toy: Stage-1 steps (default 3)"),)
    defaults = dict(common_defaults(), model="toy")
    check_names = ("toy_loss_decreased",)

    def settle(self, values, task):
        return {}, pg.TrainConfig(steps1=values["toy_steps"], steps2=0, record_every=1).validate()

    def train(self, rc, **run):
        return pg.train_two_stage(rc.task, config=rc.train, **run)

    def checks(self, rc, traj, refs, objective=None):
        drop = float(traj.loss[0] - traj.loss[-1])
        return [CheckResult("toy_loss_decreased", drop, 0.0, drop > 0, ">", "the loss decreases", {"drop": drop})], {}

    def plots(self, out, rc, traj, refs, context=""):
        from popgrad.app.plots import plot_loss
        plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)


@pytest.fixture
def toy():
    kind = register(Toy())
    try:
        yield kind
    finally:
        KINDS.pop("toy")


def test_a_toy_kind_registered_from_a_test_runs_through_popgrad_run(toy, tmp_path, capsys):
    out = tmp_path / "toy"
    code = cli.main(["run", "--model", "toy", "--toy-steps", "2", "--S", "2", "--T", "4", "--out", str(out),
                     "--no-progress"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["model"] == "toy" and report["config"]["toy_steps"] == 2
    assert [c["name"] for c in report["checks"]] == ["toy_loss_decreased"]
    assert report["trajectory"]["last_step"] == 2
    assert (out / "loss.png").exists() and (out / "report.html").exists()
    assert "--toy-steps" in _help(capsys) and "toy: a toy" in _help(capsys)
    # its flag is a config key too (config files, sweeps) and is refused for another model
    assert ARG_SPECS["toy_steps"] == ("int", 1, False) and merge({"model": "toy"})["toy_steps"] == 3
    with pytest.raises(ValueError, match="--toy-steps only applies to --model toy"):
        merge({"toy_steps": 2})
    assert cli.main(["run", "--model", "toy", "--toy-steps", "0", "--out", str(out)]) == 2
    assert "--toy-steps: expected an integer >= 1" in capsys.readouterr().err


def _help(capsys):
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["run", "--help"])
    return capsys.readouterr().out


def test_every_kind_implements_the_protocol_and_the_registry_decides_once():
    assert list(KINDS) == ["reduced-single", "reduced-k-head", "catformer", "transformer"]
    for kind in KINDS.values():
        assert isinstance(kind, Kind)
        assert set(kind.check_names) and kind.defaults["out"] == "popgrad_out"
    assert kind_of({}) is KINDS["reduced-single"]
    assert kind_of({"graph": "two-parent"}) is KINDS["reduced-k-head"]
    assert kind_of({"model": "catformer", "graph": "ngram"}) is KINDS["catformer"]
    assert kind_of({"model": "transformer"}) is KINDS["transformer"]
    with pytest.raises(ValueError, match="--model 'x': use reduced or catformer or transformer"):
        kind_of({"model": "x"})
    with pytest.raises(TypeError, match="register: kind must implement"):
        register(object())


def test_register_refuses_a_flag_that_contradicts_another_kinds():
    class Bad(Toy):
        name = "bad"
        flags = (Flag("lr", "int", 0),)  # catformer's --lr is a real > 0

    with pytest.raises(ValueError, match="redefines flag --lr"):
        register(Bad())
    assert "bad" not in KINDS


def test_a_flag_is_one_spec_line():
    flag = Flag("x_rate", "real", 0, True, help="x")
    assert flag.flag == "--x-rate" and flag.check("0.5") == 0.5
    with pytest.raises(ValueError, match="expected a finite number > 0, got '0'"):
        flag.check("0")
    with pytest.raises(TypeError):
        flag.check(True)
    with pytest.raises(ValueError, match="kind must be one of"):
        Flag("y", "float")
    with pytest.raises(ValueError, match="expected an integer >= 1, got 0"):
        Flag("z", "int", 1, default=0)


def test_run_config_is_typed_and_frozen():
    rc = resolve({"S": 2, "T": 4, "steps1": 2, "steps2": 1, "sweep": False})
    assert isinstance(rc, RunConfig) and isinstance(rc.train, pg.TrainConfig) and isinstance(rc.task, pg.Task)
    assert rc.kind is KINDS["reduced-single"] and dict(rc)["S"] == 2
    with pytest.raises(TypeError):
        rc.settings["S"] = 3
    hints = RunConfig.__annotations__
    assert all("object" not in str(v) for v in hints.values()), hints


# ------------------------------------------------- behaviour unchanged: the app hands the trainers the settings
def _run(tmp_path, name, argv):
    out = tmp_path / name
    assert cli.main(["run", *argv, "--out", str(out), "--no-progress"]) == 0
    return out


def test_the_app_trains_exactly_what_the_trainer_gives_and_reruns_are_identical(tmp_path):
    """Trajectories through ``popgrad run`` are bit-identical to the trainers called directly with the
    documented settings, and two runs' folders compare equal (tests/app/compare_runs.py)."""
    argv = ["--S", "2", "--T", "4", "--steps1", "3", "--steps2", "2", "--record-every", "1", "--no-sweep"]
    a, b = _run(tmp_path, "a", argv), _run(tmp_path, "b", argv)
    assert compare_folders(str(a), str(b)) == []
    rc = resolve({"S": 2, "T": 4})
    cfg = pg.TrainConfig(beta0=DEFAULTS["beta0"], lr1=DEFAULTS["lr1"], steps1=3, lr2=DEFAULTS["lr2"], steps2=2,
                         record_every=1)
    direct = pg.train_two_stage(rc.task, config=cfg)
    direct.save(str(tmp_path / "direct.npz"))
    assert trajectory_differences(str(tmp_path / "direct.npz"), str(a / "trajectory.npz")) == []

    cat = ["--model", "catformer", "--S", "2", "--T", "4", "--optimizer", "adamw", "--lr", "0.01",
           "--weight-decay", "0.01", "--init-scale", "0.1", "--steps", "3"]
    c = _run(tmp_path, "c", cat)
    task = resolve({"model": "catformer", "S": 2, "T": 4}).task
    traj = pg.train_catformer(task, pg.CatFormer(2, 4, heads=(1, 1)), 3, optimizer="adamw", lr=0.01,
                              weight_decay=0.01, init=("normal", 0.1, 0), record_every=1)
    traj.save(str(tmp_path / "cat.npz"))
    assert trajectory_differences(str(tmp_path / "cat.npz"), str(c / "trajectory.npz")) == []


def test_the_comparison_sees_a_difference(tmp_path):
    before = {"config": {"S": 2, "out": "a"}, "versions": {"numpy": "1"}, "timing_seconds": {"total": 1.0},
              "x": [1.0, float("nan")], "checks": [{"details": {"sweep_seconds": [0.1]}}]}
    after = {"config": {"S": 2, "out": "b"}, "versions": {"numpy": "2"}, "timing_seconds": {"total": 2.0},
             "x": [1.0, float("nan")], "checks": [{"details": {"sweep_seconds": [0.2]}}]}
    assert report_differences(before, after) == []
    assert report_differences(before, dict(after, x=[1.0 + 1e-16 * 2, float("nan")])) == ["x/0: 1.0 != 1.0000000000000002"]
    assert report_differences(before, dict(after, y=1)) == ["y: only in after"]
    np.savez(tmp_path / "a.npz", loss=np.array([1.0, 2.0]))
    np.savez(tmp_path / "b.npz", loss=np.array([1.0, np.nextafter(2.0, 3.0)]))
    assert trajectory_differences(tmp_path / "a.npz", tmp_path / "a.npz") == []
    assert trajectory_differences(tmp_path / "a.npz", tmp_path / "b.npz") == ["loss: not bit-identical (float64(2,) "
                                                                              "vs float64(2,))"]
