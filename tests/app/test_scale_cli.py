"""popgrad run beyond enumeration: field Stage 1, sampled Stage 2, every sampled number labelled."""
import json

from popgrad.app import cli


def test_run_at_paper_scale_labels_exact_and_sampled(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["run", "--S", "10", "--T", "20", "--alpha", "0.1", "--graph", "random", "--steps1", "60",
            "--steps2", "10", "--samples", "4000", "--no-sweep", "--no-progress", "--out", str(out)]
    assert cli.main(argv) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["gradient"] == "field" and rep["config"]["stage2"] == "sampled"
    assert rep["trajectory"]["final_loss_kind"] == "sampled" and rep["trajectory"]["stage2_samples"] == 4000
    assert rep["trajectory"]["final_loss_se"] > 0
    kinds = {c["name"]: c["kind"] for c in rep["checks"]}
    assert kinds["loss_convergence"] == "sampled" and kinds["ood_generalization"] == "sampled"
    assert kinds["graph_recovery"] == "exact"
    refs = rep["references"]
    assert refs["L_star"]["kind"] == "exact"
    assert refs["L_count"]["kind"] == "sampled" and refs["L_count"]["n"] == 4000 and refs["L_count"]["se"] > 0
    md = (out / "report.md").read_text()
    assert "± " in md and "| sampled |" in md
    assert (out / "loss.png").exists()


def test_forced_exact_stage2_on_a_large_task_is_one_line(tmp_path, capsys):
    out = tmp_path / "o"
    code = cli.main(["run", "--S", "10", "--T", "20", "--stage2", "exact", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "S**T = 10**20" in err[0] and "--stage2 sampled" in err[0]
    assert not out.exists()


def test_exact_gradient_on_a_large_task_is_one_line(tmp_path, capsys):
    code = cli.main(["run", "--S", "3", "--T", "40", "--gradient", "exact", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--gradient field" in err[0]
