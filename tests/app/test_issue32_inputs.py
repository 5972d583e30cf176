"""Issue 32, families 2-7: inputs sized before they are read, the full model's sizes, what the API
refuses, messages that name the right model, sweeps of the full model, leftovers. Each test drives the
shared mechanism (``popgrad._io.read_input_file``, ``check_value``, ``CatFormer``'s size guard, the
validators of ``popgrad._validation``) through the real command or API, in-process. "Refused before
anything" is asserted by what did not happen (nothing read, no run started), not by a clock.
"""
from __future__ import annotations

import json
import os
import socket
import tracemalloc

import numpy as np
import pytest

import popgrad as pg
from popgrad import _io
from popgrad._validation import count_text
from popgrad.app import cli, config, sweep as sweepmod
from popgrad.app.config import check_value
from popgrad.task.priors import dirichlet_prior, relabel

FAST = ["--S", "2", "--T", "4", "--steps1", "5", "--steps2", "5", "--no-sweep", "--no-progress"]


def _main(*argv):
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:  # argparse
        rc = exc.code
    return rc


class _OsWithoutRead:
    """``os`` as :mod:`popgrad._io` sees it, except that reading a byte fails the test: an input refused from
    its ``stat`` (its size or kind) is refused unread."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def read(fd, n):
        raise AssertionError(f"{n} bytes were read from an input that its size or kind refuses")


@pytest.fixture
def nothing_runs(monkeypatch):
    """A run refused up front never starts: :func:`popgrad.app.cli.run` (training, outputs) fails the test."""
    def run(*a, **k):
        raise AssertionError("the run started: the input was not refused before anything")

    monkeypatch.setattr(cli, "run", run)


def _refused(capsys, rc, needle=None, code=2):
    err = capsys.readouterr().err.strip()
    assert rc == code, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    if needle is not None:
        assert needle in err, err
    return err


# ---------------------------------------------------------------- 2. sized before read
@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "spec.fifo"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("what", ["dev-zero", "folder", "huge"])  # a FIFO is read, bounded: test_input_reader.py
@pytest.mark.parametrize("command", ["sweep", "config"])
def test_unbounded_inputs_refused_at_once(tmp_path, capsys, monkeypatch, fifo, what, command):
    path = {"fifo": fifo, "dev-zero": "/dev/zero", "folder": str(tmp_path)}.get(what)
    if what == "huge":  # a sparse file above the cap: refused from its size, never read
        path = str(tmp_path / "huge.toml")
        with open(path, "wb") as fh:
            fh.truncate(_io.MAX_INPUT_BYTES + 1)
    args = (["sweep", path, "--out", str(tmp_path / "o")] if command == "sweep"
            else ["run", "--config", path, *FAST, "--out", str(tmp_path / "o")])
    monkeypatch.setattr(_io, "os", _OsWithoutRead())
    rc = _main(*args)
    err = _refused(capsys, rc)
    assert path in err and ("not a regular file" in err or "above the" in err), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag, value, needle", [
    ("--atoms", "1000000000", "<= 100,000"),
    ("--atoms", "10000000", "<= 100,000"),
    ("--steps1", "1" + "0" * 23, "<= 1,000,000,000"),
    ("--steps2", "9" * 5000, "expected an integer"),  # beyond Python's 4300-digit limit: no ValueError leak
    ("--seed", "1" * 30, "expected an integer"),
    ("--samples", "1", ">= 2"),
])
def test_huge_counts_refused_before_anything(tmp_path, capsys, nothing_runs, flag, value, needle):
    rc = _main("run", *FAST, flag, value, "--out", str(tmp_path / "o"))
    err = _refused(capsys, rc, needle)
    assert len(err) < 400, err  # a 5,000-digit value is not echoed
    assert not (tmp_path / "o").exists()


def test_memory_guard_honours_the_process_limit(monkeypatch, tmp_path, capsys):
    import resource

    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit",
                        lambda lim: (2**30, resource.RLIM_INFINITY) if lim == resource.RLIMIT_AS else real(lim))
    assert _io.memory_limit() == 2**30
    rc = _main("run", *FAST, "--stage2", "sampled", "--samples", "200000000", "--out", str(tmp_path / "o"))
    _refused(capsys, rc, "1.0 GiB this process may use")


@pytest.mark.parametrize("prior", [[], ["--prior", "continuous"]])
def test_sampled_catformer_batch_is_refused_past_memory(monkeypatch, tmp_path, capsys, nothing_runs, prior):
    # a batch that cannot fit used to be a MemoryError traceback from the first draw
    import resource

    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit",
                        lambda lim: (2**30, resource.RLIM_INFINITY) if lim == resource.RLIMIT_AS else real(lim))
    args = ["run", "--model", "catformer", "--gradient", "sampled", "--S", "2", "--T", "6", "--steps", "2",
            *prior, "--no-progress", "--out", str(tmp_path / "o")]
    rc = _main(*args, "--batch-size", "10000000000")
    err = _refused(capsys, rc, "1.0 GiB this process may use")
    assert "--batch-size 10,000,000,000 needs about" in err
    assert not (tmp_path / "o").exists()
    most = int(err.split("use --batch-size ")[1].split(" ")[0].replace(",", ""))
    from popgrad.app.kinds.catformer import batch_bytes_per_sequence
    from popgrad.app.jobs import DEFAULTS, build_task

    task = build_task(dict(DEFAULTS, S=2, T=6, prior="continuous" if prior else "finite"))
    assert most * batch_bytes_per_sequence(task) <= 2**29 < (most + 1) * batch_bytes_per_sequence(task)
    rc = _main(*args, "--batch-size", str(most + 1))
    _refused(capsys, rc, f"use --batch-size {most:,} or fewer")


def test_summary_of_an_astronomical_task(capsys):
    rc = _main("summary", "--S", "16", "--T", "4096")
    assert rc == 0, capsys.readouterr().err
    assert "S**T=about 10^4932" in capsys.readouterr().out
    assert count_text(59049) == "59,049" and count_text(10**5000).startswith("about 10^5000")


# ---------------------------------------------------------------- 3. the full model's sizes
@pytest.mark.parametrize("kw", [dict(S=2, T=5, heads=(10**6, 1)), dict(S=2, T=10**9),
                                dict(S=3, T=10, heads=(50, 50, 50)), dict(S=3, T=10, heads=(10**20, 1))])
def test_catformer_too_large_is_refused_with_its_size(kw):
    # refused from the parameter count, before any array: an allocation of that size would be a MemoryError
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"parameters .*this process may use: use fewer heads"):
            pg.CatFormer(**kw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak


def test_catformer_cli_sizes_are_one_line(tmp_path, capsys):
    rc = _main("run", "--model", "catformer", "--heads", "50,50,50", "--no-progress", "--out", str(tmp_path / "o"))
    _refused(capsys, rc, "parameters")
    rc = _main("run", "--model", "catformer", "--heads", "99999999999999999999,1", "--no-progress",
                  "--out", str(tmp_path / "o"))
    _refused(capsys, rc, "about 10^42 parameters")
    rc = _main("run", "--model", "catformer", "--init-scale", "1e308", "--no-progress", "--out", str(tmp_path / "o"))
    _refused(capsys, rc, "--init-scale")
    assert not (tmp_path / "o").exists()  # no checkpoint left behind


def test_catformer_init_that_overflows_is_refused():
    with pytest.raises(ValueError, match="overflows"):
        pg.CatFormer(2, 3).init(1e308, 0)
    with pytest.raises(ValueError, match="seed"):
        pg.CatFormer(2, 3).init(0.1, -1)


# ---------------------------------------------------------------- 4. the API refuses
def test_relabel_needs_a_permutation():
    pi = np.array([[0.9, 0.1], [0.2, 0.8]])
    with pytest.raises(ValueError, match="permutation"):
        relabel(pi, [0, 0])
    with pytest.raises(ValueError, match="permutation"):
        relabel(pi, [0, 1, 2])
    with pytest.raises(TypeError, match="perm"):
        relabel(pi, ["a", "b"])
    assert np.array_equal(relabel(pi, [1, 0]), pi[::-1, ::-1])


@pytest.fixture(scope="module")
def task():
    return pg.Task(pg.chain(4), dirichlet_prior(2, 1.0, 2, seed=0, symmetrize=False))


def test_strings_are_type_errors(task):
    from popgrad.engine.field import stage1_field
    from popgrad.engine.noise import gradient_noise
    from popgrad.theory.information import idealized_grad_A1

    A1, A2 = np.zeros((4, 4)), 0.1 * np.eye(2)
    for call in (lambda: pg.exact_loss(task, A1, A2, eps="0.1"), lambda: stage1_field(task, eps="0.1"),
                 lambda: stage1_field(task, per_atom="False"), lambda: gradient_noise(task, A1, A2, eps="0.1"),
                 lambda: idealized_grad_A1(task, A1, beta0="1")):
        with pytest.raises(TypeError):
            call()
    model = pg.CatFormer(2, 4)
    with pytest.raises(TypeError, match="eps"):
        pg.catformer_loss_and_grad(task, model, model.zeros(), eps="0.1")


@pytest.mark.parametrize("beta0", [0, -1.0, 0.0])
def test_beta0_must_be_positive(task, beta0):
    from popgrad.theory.information import idealized_grad_A1

    with pytest.raises(ValueError, match="beta0"):
        idealized_grad_A1(task, np.zeros((4, 4)), beta0)


@pytest.mark.parametrize("call", [lambda: dirichlet_prior(2, 1.0, 2, seed=-1), lambda: pg.random_tree(5, seed=-3)],
                         ids=["dirichlet_prior", "random_tree"])
def test_negative_seeds_are_named(call):
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got -\d"):
        call()


# ---------------------------------------------------------------- 5. messages of the right model
def test_full_model_size_refusal_names_its_own_ways_out(tmp_path, capsys):
    rc = _main("run", "--model", "catformer", "--S", "3", "--T", "17", "--no-progress", "--out", str(tmp_path / "o"))
    err = _refused(capsys, rc, "--model catformer needs the exact population")
    # the full model's own ways out: --max-sequences or a smaller task, or its sampled gradient (issue 30);
    # never the reduced model's field or sampled Stage 2
    assert "--max-sequences" in err and "Task(" not in err and "field" not in err and "--stage2" not in err, err
    assert "--gradient sampled" in err, err


# ---------------------------------------------------------------- 6. sweeps of the full model
def test_heads_have_one_spelling():
    assert check_value("heads", "1, 1") == check_value("heads", "01,1") == check_value("heads", [1, 1], True) == "1,1"
    with pytest.raises(ValueError):
        check_value("heads", [0, 1], True)
    with pytest.raises(TypeError):
        check_value("heads", [1.5, 1], True)


def test_toml_numbers_as_strings_are_refused_like_flags_accept_them():
    assert check_value("lr", "0.1") == 0.1  # a flag's text
    with pytest.raises(TypeError, match="without quotes"):
        check_value("lr", "0.1", typed=True)  # a TOML string


def test_spec_spellings_of_one_heads_value_are_one_cell():
    with pytest.raises(config.CLIError, match="twice"):
        sweepmod.expand({"fixed": {"model": "catformer", "S": 2, "T": 4}, "axes": {"heads": ["1,1", "1, 1", "01,1"]}})
    cells = sweepmod.expand({"fixed": {"model": "catformer", "S": 2, "T": 4, "steps": 2},
                             "axes": {"heads": [[2, 1], "1,1"]}})
    assert [c["heads"] for _, c in cells] == ["2,1", "1,1"]


def test_init_seed_axis_at_zero_scale_is_refused():
    spec = {"fixed": {"model": "catformer", "S": 2, "T": 4, "steps": 2}, "axes": {"init_seed": [0, 1]}}
    with pytest.raises(config.CLIError, match="no effect at --init-scale 0"):
        sweepmod.expand(spec)
    spec["fixed"]["init_scale"] = 1e-4
    assert len(sweepmod.expand(spec)) == 2


def test_reduced_rows_of_a_mixed_spec_name_their_model():
    cells = sweepmod.expand({"fixed": {"S": 2, "T": 4, "steps1": 2, "steps2": 2, "sweep": False}})
    assert sweepmod.summary_row(cells[0][1], None, error="x")["model"] == "reduced"


# ---------------------------------------------------------------- 7. leftovers
@pytest.mark.parametrize("address", ["tls://127.0.0.1:8786", "ucx://127.0.0.1:8786"])
@pytest.mark.parametrize("command", ["run", "sweep"])
def test_other_protocols_are_one_line(tmp_path, capsys, address, command):
    spec = tmp_path / "s.toml"
    spec.write_text("[fixed]\nS = 2\nT = 4\n")
    args = ["sweep", str(spec)] if command == "sweep" else ["run", *FAST]
    rc = _main(*args, "--scheduler", address, "--out", str(tmp_path / "o"))
    _refused(capsys, rc, "protocol is not supported")
    assert not (tmp_path / "o").exists()


def test_refused_scheduler_writes_nothing(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text("[fixed]\nS = 2\nT = 4\n")
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = _main("sweep", str(spec), "--out", str(tmp_path / "o"), "--scheduler", f"tcp://127.0.0.1:{port}")
    _refused(capsys, rc, "cannot connect")
    assert not (tmp_path / "o" / "results.csv").exists()


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_worker_timeout_needs_a_scheduler(tmp_path, capsys, command):
    spec = tmp_path / "s.toml"
    spec.write_text("[fixed]\nS = 2\nT = 4\n")
    args = ["sweep", str(spec)] if command == "sweep" else ["run", *FAST]
    rc = _main(*args, "--worker-timeout", "5", "--out", str(tmp_path / "o"))
    _refused(capsys, rc, "--worker-timeout only applies with --scheduler")


def test_a_file_named_cells_is_refused_before_the_cluster(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "s.toml"
    spec.write_text("[fixed]\nS = 2\nT = 4\n")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "cells").touch()
    monkeypatch.setattr(sweepmod, "_start_client", lambda *a, **k: pytest.fail("the cluster started"))
    rc = _main("sweep", str(spec), "--out", str(tmp_path / "o"))
    _refused(capsys, rc, "cells")


def test_exact_stage2_refuses_a_sample_size(tmp_path, capsys):
    rc = _main("run", *FAST, "--stage2", "exact", "--samples", "100", "--out", str(tmp_path / "o"))
    _refused(capsys, rc, "conflicts with --stage2 exact")
    with pytest.raises(config.CLIError, match=">= 2"):
        sweepmod.expand({"fixed": {"S": 2, "T": 4, "stage2": "sampled", "samples": 1}})


def test_resumed_rows_keep_time_and_host(tmp_path):
    cfg = sweepmod.expand({"fixed": {"S": 2, "T": 4, "atoms": 2, "steps1": 3, "steps2": 3, "sweep": False}})[0][1]
    cell = str(tmp_path / "cell")
    first = sweepmod.run_cell(cfg, cell)
    assert first["status"] == "ok", first["error"]
    again = sweepmod.cached_row(cell, cfg)
    assert again["host"] == first["host"] and again["time_cell_s"] == pytest.approx(first["time_cell_s"])
    assert json.loads((tmp_path / "cell" / sweepmod.CELL_FACTS).read_text())["host"] == first["host"]
