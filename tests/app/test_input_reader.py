"""The shared input reader (``popgrad._io.read_input_file``, ``popgrad.app.config.load_toml``) on hostile
shapes: nesting that a recursive parser cannot take, pipes that must be read (a process substitution)
within a bound on time and size, and a checkpoint that is a FIFO. Every case ends in seconds with one line.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from popgrad import _io
from popgrad.app import cli, config

FAST = ["--S", "2", "--T", "4", "--steps1", "3", "--steps2", "3", "--no-sweep", "--no-progress"]
DEEP = 100_000


def _main(*argv):
    t0 = time.perf_counter()
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    return rc, time.perf_counter() - t0


def _one_line(capsys, rc, *needles):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err[:2000]
    for needle in needles:
        assert needle in err, err
    return err


NESTED = {
    "array": "a = " + "[" * DEEP + "]" * DEEP + "\n",
    "inline-table": "a = " + "{b = " * DEEP + "1" + "}" * DEEP + "\n",
    "dotted-key": "a" + ".a" * DEEP + " = 1\n",
    "header": "[" + ".".join(["a"] * DEEP) + "]\n",
}


@pytest.mark.parametrize("shape", sorted(NESTED))
@pytest.mark.parametrize("command", ["config", "sweep"])
def test_deep_nesting_is_one_line(tmp_path, capsys, shape, command):
    path = tmp_path / "deep.toml"
    body = NESTED[shape]
    path.write_text(("[fixed]\nS = 2\n" if command == "sweep" and shape != "header" else "") + body)
    args = (["sweep", str(path), "--out", str(tmp_path / "o")] if command == "sweep"
            else ["run", "--config", str(path), *FAST, "--out", str(tmp_path / "o")])
    rc, seconds = _main(*args)
    _one_line(capsys, rc, str(path), "levels deep")
    assert seconds < 120, seconds  # a hang guard, not a speed target: the scan takes milliseconds
    assert not (tmp_path / "o").exists()


def test_nesting_scan_ignores_strings_comments_and_values():
    text = ('# [[[[[[ a.b.c.d\nS = 2\nname = "[[[[{{{{a.b.c"\nlr = 1.5\nx = [1.5, 2.5, [3.5]]\n'
            "[[cells]]\nT = 7\ny = { a.b = 1, c = [1, 2] }\nz = '''\n[[[[[[\n'''\n")
    assert config.toml_depth(text, 32) == 3
    assert config.toml_depth("a" + ".a" * 40 + " = 1", 32) > 32
    assert config.toml_depth("x = " + "[" * 33 + "]" * 33, 32) > 32


def test_a_spec_of_ordinary_depth_still_reads(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text("[fixed]\nS = 2\n[axes]\nT = [4, 5]\n[[cells]]\ngraph = \"chain\"\nT = 6\n")
    assert config.load_toml(str(path), "sweep spec") == {"fixed": {"S": 2}, "axes": {"T": [4, 5]},
                                                          "cells": [{"graph": "chain", "T": 6}]}


def _bash(script, cwd, timeout=120):
    """``script`` under bash (process substitution needs it), the popgrad of this interpreter."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), NUMBA_NUM_THREADS="1")
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def test_process_substitution_config_is_read(tmp_path):
    """``--config <(cat run.toml)``: a pipe, read to its end (it was refused as a FIFO)."""
    (tmp_path / "run.toml").write_text("S = 2\nT = 4\nsteps1 = 3\nsteps2 = 3\n")
    py = sys.executable
    code = ("import sys; from popgrad.app.config import load_config_file; "
            "print(sorted(load_config_file(sys.argv[1]).items()))")
    res = _bash(f'"{py}" -c "{code}" <(cat run.toml)', tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[('S', 2), ('T', 4), ('steps1', 3), ('steps2', 3)]", res.stdout


def test_pipe_read_as_it_arrives(tmp_path):
    """A named FIFO whose writer writes late and in pieces is read whole."""
    fifo = tmp_path / "run.fifo"
    os.mkfifo(fifo)

    def write():
        time.sleep(0.3)
        with open(fifo, "w") as fh:
            fh.write("S = 2\n")
            fh.flush()
            time.sleep(0.2)
            fh.write("T = 4\n")

    th = threading.Thread(target=write)
    th.start()
    try:
        assert _io.read_input_file(str(fifo), "config file", timeout=20) == b"S = 2\nT = 4\n"
    finally:
        th.join()


def test_pipe_without_writer_or_end_is_bounded_in_time(tmp_path):
    fifo = tmp_path / "run.fifo"
    os.mkfifo(fifo)
    t0 = time.perf_counter()
    with pytest.raises(_io.InputFileError, match="not closed within 0.5 s"):
        _io.read_input_file(str(fifo), "config file", timeout=0.5)
    assert time.perf_counter() - t0 < 60  # a hang guard


def test_endless_pipe_is_bounded_in_size(tmp_path):
    res = _bash(f'"{sys.executable}" -c "import sys; from popgrad import _io; '
                f'_io.read_input_file(sys.argv[1], \'config file\', limit=4096)" <(yes "S = 2")', tmp_path)
    assert res.returncode == 1 and "grew above the 4.0 KiB a config file may have" in res.stderr, res.stderr


def test_a_device_is_still_refused(tmp_path):
    with pytest.raises(_io.InputFileError, match="is a device, not a regular file"):
        _io.read_input_file("/dev/zero", "config file")


def test_resume_from_a_fifo_checkpoint_is_one_line(tmp_path, capsys):
    out = tmp_path / "o"
    rc, _ = _main("run", *FAST, "--out", str(out))
    assert rc in (0, 1)
    capsys.readouterr()
    ckpt = out / "checkpoint.npz"
    if ckpt.exists():
        ckpt.unlink()
    os.mkfifo(ckpt)
    rc, seconds = _main("run", *FAST, "--out", str(out), "--resume")
    _one_line(capsys, rc, "checkpoint", "FIFO", "not a regular file")
    assert seconds < 120, seconds  # a hang guard (it hung until killed): the refusal takes about a second
