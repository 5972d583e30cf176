"""Verdicts through ``popgrad run`` (issue 17): statuses in report.json, report.md, the console and results.csv."""
import json

import pytest

from popgrad.app import cli
from popgrad.app.sweep import summary_row

BASE = ["--S", "2", "--T", "6", "--steps1", "100", "--steps2", "100", "--record-every", "50", "--no-progress"]


def run(tmp_path, capsys, *args, name="r"):
    out = tmp_path / name
    assert cli.main(["run", *BASE, *args, "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    return report, {c["name"]: c for c in report["checks"]}, (out / "report.md").read_text(), capsys.readouterr().out


def test_default_prior_inside_the_hypotheses(tmp_path, capsys):
    report, checks, md, console = run(tmp_path, capsys, "--no-sweep")
    assert report["task"]["hypotheses_all_met"] is True
    assert report["config"]["uniform_mean"] is True and report["config"]["floor"] == 0.15
    assert "— all met" in md and "| uniform_mean | permutation symmetry and uniform mean (Knowl 10.3) |" in md
    assert checks["graph_recovery"]["status"] == "pass"
    assert checks["roots_uniform"]["status"] == "not_applicable"  # a chain
    assert "[N/A ] roots_uniform" in console
    # no sweep: one T cannot show Knowl 3's rate
    assert checks["gradient_alignment"]["status"] == "inconclusive" and "no T sweep" in checks["gradient_alignment"][
        "reason"]
    assert "[INCONCLUSIVE] gradient_alignment" in console
    for c in checks.values():
        assert c["status"] in ("pass", "fail", "inconclusive", "not_applicable")
        assert (c["passed"] is None) == (c["status"] not in ("pass", "fail"))
    decided = [c["passed"] for c in checks.values() if c["status"] in ("pass", "fail")]
    assert report["all_passed"] == all(decided)
    assert sum(report["status_counts"].values()) == len(checks)
    assert "L_floor,ε: the exact floor" in md and "L*_ε: the oracle's ε-loss (not a bound" in md
    refs = report["references"]
    assert refs["L_floor_eps"]["value"] <= refs["L_bayes_eps"]["value"]
    row = summary_row(report["config"], report)
    assert row["roots_uniform_status"] == "not_applicable" and row["graph_recovery_status"] == "pass"
    assert row["gradient_alignment_reason"].startswith("no T sweep")


def test_outside_the_hypotheses_is_inconclusive(tmp_path, capsys):
    report, checks, md, console = run(tmp_path, capsys, "--graph", "icl", "--no-uniform-mean", "--floor", "0",
                                      "--no-sweep")
    assert report["task"]["hypotheses_all_met"] is False
    assert "**NO**" in md and "NOT all met" in md
    for name in ("roots_uniform", "loss_convergence", "ood_generalization", "graph_recovery"):
        c = checks[name]
        assert c["status"] == "inconclusive", name
        # the value stands -- except OOD's when its references do not separate (then it has no value, and says so)
        assert c["passed"] is None and (c["value"] is not None or "no better than the context-free" in c["reason"])
    assert "uniform mean fails (error" in checks["roots_uniform"]["reason"]
    assert "Knowl 3.3 assumes" in checks["roots_uniform"]["reason"]
    assert "gamma fails (measured" in checks["graph_recovery"]["reason"]
    assert "[INCONCLUSIVE] roots_uniform" in console


def test_roots_pass_on_icl_with_the_sweep(tmp_path, capsys):
    report, checks, md, console = run(tmp_path, capsys, "--graph", "icl", "--sweep")
    roots = checks["roots_uniform"]
    assert roots["status"] == "pass" and roots["threshold"] == 0.0 and roots["value"] < 0
    sweep = roots["details"]["sweep"]
    assert sweep["T"] == [10, 20, 40, 80] and sweep["root_drive_ratio"][-1] < sweep["root_drive_ratio"][0]
    ood = checks["ood_generalization"]
    assert ood["threshold"] in (0.5, 0.0) and len(ood["details"]["sweep_T"]) >= 2  # OOD_FRACTION, or 0 (no separation)


def test_fail_is_a_fail(tmp_path, capsys):
    # no Stage 1 (steps1 0): A1 stays 0, no parent is found; Stage 2 runs long enough to converge
    report, checks, md, console = run(tmp_path, capsys, "--steps1", "0", "--steps2", "600", "--no-sweep")
    gr = checks["graph_recovery"]  # A1 = 0: row i puts 1/(i+1) on its parent; the smallest is row T-2 = 4
    assert gr["status"] == "fail" and gr["value"] == pytest.approx(1 / 5, rel=1e-12) and gr["threshold"] == 1 - 1 / 6
    lc = checks["loss_convergence"]
    assert lc["status"] == "fail" and lc["value"] > 0
    assert lc["details"]["stage2_convergence"]["remaining_decrease"] < 1e-3 * lc["value"]
    assert report["all_passed"] is False and "[FAIL] graph_recovery" in console


def test_stage2_not_converged_is_inconclusive(tmp_path, capsys):
    # Stage 1 done, Stage 2 not run (A2 = beta0 I): worse than the count estimator, with most of Stage 2's
    # decrease still ahead (the exact 1-D optimum at the same A1 says how much): not a verdict on the theorem
    report, checks, md, console = run(tmp_path, capsys, "--steps2", "0", "--no-sweep")
    lc = checks["loss_convergence"]
    assert lc["status"] == "inconclusive" and lc["reason"].startswith("Stage 2 not converged"), lc
    assert lc["value"] > 0 and report["stage2_optimum"]["kind"] == "exact"
    conv = lc["details"]["stage2_convergence"]
    assert conv["remaining_decrease"] > 0.01 * lc["value"] and "1-D optimum alpha*" in lc["reason"]


def test_all_roots_nothing_to_test(tmp_path, capsys):
    out = tmp_path / "roots"
    assert cli.main(["run", "--graph", "-1,-1,-1,-1,-1", "--S", "2", "--steps1", "5", "--steps2", "5",
                     "--no-progress", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        "graph_recovery": "not_applicable", "gradient_alignment": "not_applicable", "field_dpi": "not_applicable",
        "loss_convergence": "not_applicable", "ood_generalization": "not_applicable",
        "roots_uniform": "not_applicable"}
    assert all(c["reason"] for c in report["checks"])


@pytest.mark.parametrize("args, match", [(["--floor", "1.5"], "--floor 1.5 must be in [0, 1)"),
                                         (["--floor", "-0.1"], "--floor"),
                                         (["--graph", "ngram", "--floor", "0.1"], "not available for multi-parent")])
def test_floor_errors(tmp_path, capsys, args, match):
    assert cli.main(["run", *args, "--no-progress", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_uniform_mean_impossible_is_said(tmp_path, capsys):
    report, checks, md, console = run(tmp_path, capsys, "--atoms", "2", "--no-sweep")
    assert report["task"]["hypotheses"]["uniform_mean"]["met"] is False
    assert "no reweighting gives E[pi] = 11^T/S" in md and "note: uniform_mean = true" in console
