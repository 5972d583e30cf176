"""Null models through ``popgrad run`` (issue 27): no check in a report passes a model that learned nothing.

Tiny runs (S = 2, a few steps). The checks that read no trained model (the Stage-1 gradient's alignment, the
field's DPI) are listed in MODEL_FREE; every other check of a report must not pass.
"""
import json

import pytest

from popgrad.app import cli

MODEL_FREE = {"gradient_alignment", "field_dpi"}
COMMON = ["--S", "2", "--record-every", "10", "--no-progress"]
NS = "--no-sweep"


def run(tmp_path, capsys, *args, name="r"):
    out = tmp_path / name
    assert cli.main(["run", *COMMON, *args, "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    return report, {c["name"]: c for c in report["checks"]}, (out / "report.md").read_text(), capsys.readouterr().out


def _model_checks(checks):
    return {n: c for n, c in checks.items() if n not in MODEL_FREE}


@pytest.mark.parametrize("args", [
    [NS, "--T", "8", "--steps1", "3", "--steps2", "3", "--lr1", "0.01", "--lr2", "0.01"],  # a few steps, reduced
    [NS, "--graph", "-1,0,1,-1,3,4,5,-1", "--steps1", "1", "--steps2", "1", "--lr1", "1e-9", "--lr2", "1e-9"],  # untrained
    [NS, "--graph", "two-parent", "--T", "6", "--steps1", "3", "--steps2", "3", "--lr1", "0.01", "--lr2", "0.01"],
    ["--model", "catformer", "--T", "5", "--steps", "10"],  # 10 steps of the full model
    ["--model", "catformer", "--T", "5", "--steps", "1", "--lr", "1e-12"],  # untrained full model
    ["--model", "catformer", "--T", "5", "--steps", "1", "--lr", "1e-12", "--init-scale", "1"],  # random
], ids=["reduced-few", "reduced-untrained-roots", "k-head-few", "catformer-10", "catformer-zero", "catformer-random"])
def test_no_check_of_a_report_passes_a_null_model(tmp_path, capsys, args):
    report, checks, md, console = run(tmp_path, capsys, *args)
    for name, c in _model_checks(checks).items():
        assert c["status"] != "pass", (name, c["value"], c["details"].get("rule"))
        assert f"[PASS] {name}" not in console
    assert report["all_passed"] is not True or any(c["status"] == "pass" for c in checks.values())


def test_a_trained_reduced_model_passes_through_the_cli(tmp_path, capsys):
    report, checks, md, console = run(tmp_path, capsys, NS, "--T", "12")
    assert checks["graph_recovery"]["status"] == "pass"
    assert checks["loss_convergence"]["status"] == "pass"
    assert "[PASS] loss_convergence" in console
    assert "Rules applied:" in md and "- loss_convergence: passes when" in md


def test_nothing_decided_is_all_passed_null(tmp_path, capsys):
    report, checks, md, console = run(tmp_path, capsys, NS, "--graph", "-1,-1,-1", "--steps1", "1", "--steps2", "1")
    assert all(c["status"] in ("not_applicable", "inconclusive") for c in checks.values())
    assert report["all_passed"] is None
    assert "all_passed: null" in md
