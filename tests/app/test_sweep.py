"""``popgrad sweep``: spec validation, results table, resume, failing cells, a worker killed mid-sweep, exit codes."""
import functools
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

import popgrad
from popgrad.app import cli, jobs
from popgrad.app.jobs import CLIError

SPEC8_TOML = """\
[fixed]
S = 2
steps1 = 30
steps2 = 30
[axes]
graph = ["chain", "icl"]
T = [6, 8]
seed = [0, 1]
"""
# four tiny cells (S=2, T=4, a few steps, no T sweep)
SMALL = {"fixed": {"S": 2, "T": 4, "atoms": 2, "steps1": 5, "steps2": 5, "sweep": False},
         "axes": {"graph": ["chain", "icl"], "seed": [0, 1]}}


def _tmp_files(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.startswith(".tmp")]


def _quiet(*_):
    pass


# ------------------------------------------------------------ spec (no cluster)
def test_expand_order_ids_and_resolution():
    from popgrad.app.sweep import cell_id, expand

    spec = {"fixed": {"S": 2, "steps1": 30, "steps2": 30},
            "axes": {"graph": ["chain", "icl"], "T": [6, 8], "seed": [0, 1]},
            "cells": [{"graph": "-1,0,1,-1", "S": 3, "alpha": 2}]}
    cells = expand(spec)
    assert len(cells) == 9
    assert [(c["graph"], c["T"], c["seed"]) for _, c in cells[:8]] == [
        (g, T, s) for g in ("chain", "icl") for T in (6, 8) for s in (0, 1)]
    cid, last = cells[8]
    assert last["S"] == 3 and last["T"] == 4 and last["alpha"] == 2.0 and last["steps1"] == 30  # override, T from graph
    assert len({c for c, _ in cells}) == 9 and all(c == cell_id(cfg) and len(c) == 12 for c, cfg in cells)
    assert all("out" not in cfg for _, cfg in cells)
    assert expand(spec)[3][0] == cells[3][0]  # stable
    assert len(expand({"fixed": {"S": 2, "T": 4}})) == 1  # no axes, no cells: the fixed cell
    multi = expand({"fixed": {"graph": "ngram"}})[0][1]
    assert multi["schedule"] == "joint" and multi["steps2"] == 0  # k-head defaults as in popgrad run


def test_toml_spec_loads(tmp_path):
    from popgrad.app.sweep import expand, load_spec

    p = tmp_path / "s.toml"
    p.write_text(SPEC8_TOML + '[[cells]]\ngraph = "random"\nT = 5\n')
    assert len(expand(load_spec(p))) == 9


BAD_SPECS = [
    ({"fixed": {"Q": 1}}, "unknown key 'Q'"),
    ({"axes": {"T": [4, "x"]}}, "[axes]: T: expected an integer >= 2, got 'x'"),
    ({"fixed": {"alpha": "big"}}, "alpha: expected a finite number > 0, got 'big'"),
    ({"fixed": {"sweep": 1}}, "sweep: expected true or false, got 1"),
    ({"axes": {"seed": []}}, "seed is empty"),
    ({"axes": {"seed": 3}}, "seed must be a list"),
    ({"fixed": {"T": 4}, "axes": {"T": [4, 5]}}, "both in [fixed] and in [axes]"),
    ({"fixed": {"out": "x"}}, "'out' is not allowed in a sweep"),
    ({"axes": {"resume": [True]}}, "'resume' is not allowed in a sweep"),
    ({"S": 2}, "unknown section 'S' (put it under [fixed] or [axes])"),
    ({"fixed": {"S": 2}, "axes": {"T": [4, 5000]}}, "sweep cell 1 (T=5000): --T 5000 is out of range"),
    ({"fixed": {"S": 17}}, "--S 17 is out of range"),
    ({"fixed": {"S": 3, "T": 30, "gradient": "exact"}}, "S**T"),
    ({"axes": {"graph": ["chain", "tree"]}}, "unknown --graph 'tree'"),
    ({"axes": {"lr1": [1.0, -2.0]}}, "lr1: expected a finite number >= 0"),
    ({"fixed": {"graph": "ngram", "gradient": "idealized"}}, "not available for multi-parent"),
    ({"axes": {"T": [4, 4]}}, "lists 4 twice"),
    ({"axes": {"alpha": [1, 1.0]}}, "lists 1.0 twice"),
    ({"fixed": {"S": 2, "T": 4}, "axes": {"seed": [0]}, "cells": [{"seed": 0}]}, "resolve to the same config"),
    ({"axes": {"graph": ["-1,0,-1", "-1,0,1,-1"], "T": [5, 6]}}, "--T 5 conflicts with --graph '-1,0,-1'"),
    ({"fixed": {"graph": "-1,0,1,-1"}, "axes": {"T": [50]}}, "--T 50 conflicts with --graph '-1,0,1,-1', which has T = 4"),
    ({"cells": {"S": 2}}, "array of tables"),
]


@pytest.mark.parametrize("spec, needle", BAD_SPECS)
def test_bad_spec_one_line_error(spec, needle):
    from popgrad.app.sweep import expand

    with pytest.raises(CLIError) as info:
        expand(spec)
    assert needle in str(info.value) and "\n" not in str(info.value)


def _toml(spec: dict) -> str:
    lines = []
    for section in ("fixed", "axes"):
        if section in spec:
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in spec[section].items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("spec, needle", [BAD_SPECS[i] for i in (0, 4, 6, 7, 10)])
def test_cli_bad_spec_exit_2_nothing_written(tmp_path, capsys, spec, needle):
    p = tmp_path / "bad.toml"
    p.write_text(_toml(spec))
    out = tmp_path / "never"
    assert cli.main(["sweep", str(p), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_cli_bad_toml_and_out_is_a_file(tmp_path, capsys):
    p = tmp_path / "x.toml"
    p.write_text("[axes\n")
    assert cli.main(["sweep", str(p), "--out", str(tmp_path / "o")]) == 2
    assert "not valid TOML" in capsys.readouterr().err
    p.write_text(_toml(SMALL))
    f = tmp_path / "afile"
    f.write_text("")
    assert cli.main(["sweep", str(p), "--out", str(f)]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert cli.main(["sweep", str(p), "--out", str(tmp_path / "o"), "--workers", "0"]) == 2
    assert "--workers: expected an integer >= 1, got '0'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_import_is_dask_free_and_sweep_is_callable():
    code = ("import sys, popgrad; assert 'dask' not in sys.modules and 'pandas' not in sys.modules; "
            "assert callable(popgrad.sweep); import popgrad.app.sweep as m; assert callable(popgrad.sweep); "
            "assert m.load_spec and popgrad.sweep is not m")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------- on a cluster
def test_sweep_8_cells_results_and_resume(client, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC8_TOML)
    out = tmp_path / "out"
    df = popgrad.sweep(str(spec), client=client, out=str(out), log=_quiet)
    assert len(df) == 8 and list(df["cell"]) == list(range(8))
    assert (df["status"] == "ok").all() and not df["resumed"].any()
    assert list(zip(df["graph"], df["T"], df["seed"])) == [
        (g, T, s) for g in ("chain", "icl") for T in (6, 8) for s in (0, 1)]
    assert (df["S"] == 2).all() and (df["steps1"] == 30).all()
    for key in jobs.DEFAULTS:
        if key != "out":
            assert key in df.columns
    for name in ("graph_recovery", "gradient_alignment", "loss_convergence", "ood_generalization", "roots_uniform"):
        assert {f"{name}_value", f"{name}_passed", f"{name}_applicable"} <= set(df.columns)
    assert {"L_star", "L_bayes", "final_loss", "time_training_s", "time_cell_s", "version_popgrad",
            "version_numpy", "all_passed", "error"} <= set(df.columns)
    assert (df["version_popgrad"] == popgrad.__version__).all()
    csv = pd.read_csv(out / "results.csv")
    assert list(csv["cell_id"]) == list(df["cell_id"]) and list(csv.columns) == list(df.columns)
    for cid in df["cell_id"]:
        names = os.listdir(out / "cells" / cid)
        assert "report.json" in names and not [n for n in names if n.endswith(".png")]
    assert not _tmp_files(out)
    mtimes = {cid: os.stat(out / "cells" / cid / "report.json").st_mtime_ns for cid in df["cell_id"]}

    # rerun: nothing runs again
    again = popgrad.sweep(str(spec), client=client, out=str(out), log=_quiet)
    assert again["resumed"].all() and list(again["cell_id"]) == list(df["cell_id"])
    pd.testing.assert_series_equal(again["final_loss"], df["final_loss"])
    assert mtimes == {cid: os.stat(out / "cells" / cid / "report.json").st_mtime_ns for cid in df["cell_id"]}

    # a missing and a truncated report.json: exactly those two cells run again
    gone, broken = df["cell_id"][1], df["cell_id"][6]
    os.unlink(out / "cells" / gone / "report.json")
    text = (out / "cells" / broken / "report.json").read_text()
    (out / "cells" / broken / "report.json").write_text(text[: len(text) // 2])
    third = popgrad.sweep(str(spec), client=client, out=str(out), log=_quiet)
    assert set(third.loc[~third["resumed"], "cell_id"]) == {gone, broken}
    assert (third["status"] == "ok").all() and len(third) == 8
    pd.testing.assert_series_equal(third["final_loss"], df["final_loss"])  # deterministic cells
    assert len(pd.read_csv(out / "results.csv")) == 8


def test_failing_cell_recorded_and_cli_exit_1(client, tmp_path, capsys):
    from popgrad.app.sweep import expand

    spec = tmp_path / "small.toml"
    spec.write_text(_toml(SMALL))
    out = tmp_path / "out"
    bad_id = expand(SMALL)[2][0]
    (out / "cells").mkdir(parents=True)
    (out / "cells" / bad_id).write_text("in the way")  # the cell's output folder is a file: run() refuses
    argv = ["sweep", str(spec), "--out", str(out), "--scheduler", client.scheduler.address, "--no-progress"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "1 of 4 cells failed" in err and err.count("\n") == 1
    df = pd.read_csv(out / "results.csv", keep_default_na=False)
    assert list(df["status"]) == ["ok", "ok", "failed", "ok"]
    assert "is not a folder" in df["error"][2] and "\n" not in df["error"][2]
    assert df["version_popgrad"][2] == popgrad.__version__
    os.unlink(out / "cells" / bad_id)  # fixed: the rerun runs only that cell, exit 0
    assert cli.main(argv) == 0
    df = pd.read_csv(out / "results.csv")
    assert (df["status"] == "ok").all() and list(df["resumed"]) == [True, True, False, True]


def _crash_once(cfg, cell_dir, figures, marker, victim):
    """A cell function whose worker process dies mid-cell (after training) the first time it runs ``victim``."""
    from popgrad.app.sweep import run_cell

    def log(msg):
        if str(msg).startswith("training:") and os.path.basename(cell_dir) == victim:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.close(fd)
            os._exit(1)

    return run_cell(cfg, cell_dir, figures, log=log)


def test_worker_killed_mid_sweep(tmp_path):
    import cloudpickle
    from dask.distributed import Client, LocalCluster

    from popgrad.app.sweep import expand

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import the tests
    marker = str(tmp_path / "crashed")
    victim = expand(SMALL)[1][0]
    out = tmp_path / "out"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      env={"NUMBA_NUM_THREADS": "1"}) as cluster, Client(cluster) as c:
        pids = set(c.run(os.getpid).values())
        df = popgrad.sweep(SMALL, client=c, out=str(out), log=_quiet,
                           cell_fn=functools.partial(_crash_once, marker=marker, victim=victim))
        assert os.path.exists(marker)  # a worker process did die
        assert set(c.run(os.getpid).values()) != pids or len(c.scheduler_info()["workers"]) < 2
    assert (df["status"] == "ok").all() and len(df) == 4
    csv = pd.read_csv(out / "results.csv")
    assert sorted(csv["cell_id"]) == sorted(cid for cid, _ in expand(SMALL)) and csv["cell_id"].is_unique
    assert (csv["status"] == "ok").all()
    assert not _tmp_files(out)
    json.loads((out / "cells" / victim / "report.json").read_text())


def test_local_cluster_default(tmp_path, capsys):
    spec = {"fixed": {"S": 2, "T": 4, "atoms": 2, "steps1": 3, "steps2": 3, "sweep": False}}
    df = popgrad.sweep(spec, out=str(tmp_path / "o"), workers=1, figures=True, progress=True)
    assert list(df["status"]) == ["ok"]
    captured = capsys.readouterr()
    assert "1/1" in captured.err  # the progress bar over cells
    printed = captured.out
    assert "dashboard" in printed and "1 cells, 0 already done" in printed
    assert (tmp_path / "o" / "cells" / df["cell_id"][0] / "loss.png").is_file()


def test_example_spec_is_valid():
    from popgrad.app.sweep import expand, load_spec

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "sweep_many_graphs.toml")
    cells = expand(load_spec(path))
    assert len(cells) == 29 and not any(cfg["sweep"] for _, cfg in cells)
    assert {cfg["graph"] for _, cfg in cells} == {"random", "chain"} and all(cfg["S"] == 3 for _, cfg in cells)
