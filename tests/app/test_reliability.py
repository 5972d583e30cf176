"""Issue 13: the CLI's promises, driven as a hostile user would (each test bounded in time)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from popgrad.app.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = ["--S", "2", "--T", "4", "--steps1", "20", "--steps2", "10", "--no-sweep", "--no-progress"]


def _cli(tmp_path, *args, out="out", fast=FAST):
    try:
        return main(["run", *fast, "--out", str(tmp_path / out), *args])
    except SystemExit as exc:  # argparse errors
        return exc.code


def _one_line_error(capsys, code, rc):
    err = capsys.readouterr().err.strip()
    assert rc == code, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ------------------------------------------------------------ 1. divergence
def test_divergence_sustained_excess_loss_is_reported(tmp_path, capsys):
    rc = main(["run", "--lr2", "1e8", "--no-sweep", "--no-progress", "--steps1", "100", "--steps2", "150",
               "--out", str(tmp_path / "o")])
    assert rc == 3
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["trajectory"]["status"] == "diverged"
    assert (tmp_path / "o" / "trajectory.npz").exists()


def test_divergence_overflow_is_not_blamed_on_the_user(tmp_path, capsys):
    import popgrad

    task = popgrad.Task(popgrad.chain(4), popgrad.dirichlet_prior(2, 1.0, 2, seed=0, symmetrize=True))
    traj = popgrad.train_two_stage(task, steps1=5, steps2=5, lr2=1e308)
    assert traj.status == "diverged" and "overflow" in traj.message and len(traj.step) > 0
    rc = _cli(tmp_path, "--lr2", "1e308")
    assert rc == 3
    assert "diverged" in capsys.readouterr().err


# ----------------------------------------------------------------- 2. hangs
@pytest.mark.parametrize("args", [["summary", "--S", "7", "--T", "3"], ["summary", "--graph", "ngram", "--S", "4", "--T", "4"],
                                  ["summary", "--max-sequences", "100000000000"]])
def test_summary_never_enumerates(args, capsys, monkeypatch):
    import popgrad.task.tasks as tasks

    def enumerated(*a, **k):
        raise AssertionError("summary enumerated the sequences")

    for cls in vars(tasks).values():
        if isinstance(cls, type):
            for name in ("enumerate", "all_sequences", "kernel_arrays", "_fill_chunk"):
                if name in vars(cls):
                    monkeypatch.setattr(cls, name, enumerated)
    assert main(args) == 0
    assert "sequences are not enumerated" in capsys.readouterr().out


def test_large_closure_refused_up_front(tmp_path, capsys):
    # the closure stays implicit (a run at S = 8 uses the field and a sampled Stage 2); an exact run needs
    # every one of its 8 x 8! atoms and is refused up front with the size and the way out
    rc = main(["run", "--S", "8", "--T", "6", "--gradient", "exact", "--out", str(tmp_path / "o")])
    err = _one_line_error(capsys, 2, rc)
    assert "--atoms" in err and not (tmp_path / "o").exists()


def test_multi_parent_closure_refused_up_front_with_its_real_size(tmp_path, capsys):
    # a multi-parent prior is closed under (S!)² relabelings (inputs and outputs independently): the
    # official two-parent size S = 5 with the default 16 draws is 230,400 atoms, refused before anything
    # is built, with the CLI's ways out (the check used to count S! and let the library's error through)
    rc = main(["run", "--graph", "two-parent", "--S", "5", "--T", "6", "--out", str(tmp_path / "o")])
    err = _one_line_error(capsys, 2, rc)
    assert "230,400 atoms" in err and "--atoms 13 or fewer" in err and "--prior continuous" in err, err
    assert "symmetrize" not in err and not (tmp_path / "o").exists()


def test_closure_atoms_counts_the_closure():
    from popgrad.task.tensor_priors import closure_atoms, dirichlet_tensor_prior

    for S, k, n, sym in ((2, 2, 3, "full"), (3, 1, 2, "full"), (3, 2, 2, True), (3, 2, 2, "relabel"), (2, 2, 5, False)):
        assert closure_atoms(S, n, sym) == dirichlet_tensor_prior(S, k, 1.0, n, seed=0, symmetrize=sym).K


def test_s8_one_atom_sums_one_sequence_per_orbit():
    """One base draw at S = 8 is 8! = 40,320 atoms: the exact gradient sums one sequence per relabeling orbit
    (15 at T = 4, the set partitions of 4 positions), not the 8^4 = 4,096 sequences, so its work is bounded by
    its operation count, not by a clock."""
    import popgrad
    from popgrad.app.jobs import DEFAULTS, build_task
    from popgrad.engine import prefix_plan
    from popgrad.engine.symmetry import canonical_count

    task = build_task(dict(DEFAULTS, S=8, T=4, atoms=1))
    assert task.prior.implicit_closure and task.prior.K == 40320
    out = popgrad.exact_loss_and_grad(task, np.zeros((4, 4)), 1e-3 * np.eye(8))
    assert np.isfinite(out.loss) and np.isfinite(out.dA1).all() and np.isfinite(out.dA2).all()
    keys = [key for key in prefix_plan._PLANS if key[0] == task.fingerprint]  # (fingerprint, symmetric, options)
    assert keys and all(key[1] for key in keys)
    assert canonical_count(8, 4) == 15 and {prefix_plan._PLANS[key].sequences for key in keys} == {15}



# --------------------------------------------------------- 3. output folder
def test_out_problems_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    (tmp_path / "withdir" / "report.json").mkdir(parents=True)
    for out, what in (("", "empty"), (str(tmp_path / "file" / "sub"), "not a folder"),
                      (str(tmp_path / "dangling"), "dangling"), (str(tmp_path / "withdir"), "report.json")):
        rc = main(["run", *FAST, "--out", out])
        err = _one_line_error(capsys, 2, rc)
        assert what in err, err
    assert sorted(os.listdir(tmp_path / "withdir")) == ["report.json"]


def test_full_disk_leaves_nothing_partial(tmp_path, capsys, monkeypatch):
    import errno

    import popgrad.app.report as report_mod

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", "report.json")

    monkeypatch.setattr(report_mod, "atomic_write_text", full)
    rc = _cli(tmp_path)
    err = _one_line_error(capsys, 2, rc)
    assert "No space left" in err
    left = sorted(os.listdir(tmp_path / "out"))
    assert left == ["checkpoint.npz"], left  # the checkpoint stays for --resume; no partial outputs, no lock


# ---------------------------------------------------- 4. damaged checkpoints
def _damage(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "not-npz":
        path.write_text("hello")
    elif how == "npy":
        np.save(str(path) + ".npy", np.zeros(3))
        os.replace(str(path) + ".npy", path)
    else:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(str(arrays["meta_json"]))
        if how == "step":
            meta["t"] = 10**6
        elif how == "step-small":
            meta["t"] = 3
        elif how == "meta-type":
            meta["t"] = "ten"
        elif how == "no-key":
            del meta["status"]
        elif how == "object":
            arrays["A1"] = np.array([None], dtype=object)
        elif how == "shape":
            arrays["A2"] = np.zeros((5, 5))
        arrays["meta_json"] = np.array(json.dumps(meta))
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)


@pytest.mark.parametrize("how", ["truncated", "empty", "not-npz", "npy", "step", "step-small", "meta-type", "no-key",
                                 "object", "shape"])
def test_damaged_checkpoint(tmp_path, capsys, how):
    assert _cli(tmp_path) == 0
    _damage(tmp_path / "out" / "checkpoint.npz", how)
    capsys.readouterr()
    rc = _cli(tmp_path, "--resume")
    err = _one_line_error(capsys, 2, rc)
    assert "is damaged or not a popgrad checkpoint" in err and "run without --resume" in err, err


# ------------------------------------------------------------- 5. locking
def test_locked_folder_is_refused_and_stale_lock_taken(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (out / ".popgrad.lock").write_text(f"{sleeper.pid}\n")
        err = _one_line_error(capsys, 2, _cli(tmp_path))
        assert "in use by another popgrad run" in err and str(sleeper.pid) in err
    finally:
        sleeper.kill()
        sleeper.wait()
    assert _cli(tmp_path) == 0  # the lock's process is gone: stale, taken over
    assert not (out / ".popgrad.lock").exists()


def test_stale_outputs_of_a_different_run_are_cleared(tmp_path, capsys):
    assert _cli(tmp_path) == 0
    assert (tmp_path / "out" / "gradient_cosine.png").exists()
    rc = main(["run", "--graph", "two-parent", "--S", "2", "--T", "4", "--steps1", "5", "--atoms", "1",
               "--no-progress", "--out", str(tmp_path / "out")])
    assert rc == 0
    files = set(os.listdir(tmp_path / "out"))
    assert "gradient_cosine.png" not in files and "report.json" in files
    assert not any(f.startswith(".") for f in files)


# --------------------------------------------------- 6. interrupts and pipes
def _default_sigint():
    """In the child: SIGINT as at a terminal, even when the tests run in the background (where it is ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(args, **kw):
    return subprocess.Popen([sys.executable, "-m", "popgrad.app.cli", *args], env=_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint, **kw)


def _wait_for_popgrad(p, timeout=60.0):
    """Until the command catches SIGTERM (/proc): popgrad's import guard, its first line, has run."""
    end = time.monotonic() + timeout
    while os.path.isdir("/proc/self") and time.monotonic() < end and p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as fh:
                caught = int(next(ln for ln in fh if ln.startswith("SigCgt:")).split()[1], 16)
        except (OSError, StopIteration, ValueError):
            caught = 0
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.002)


@pytest.mark.parametrize("delay", [0.0, 0.3, 1.5])
def test_sigint_early_is_one_line(tmp_path, delay):
    p = _spawn(["run", "--no-sweep", "--no-progress", "--out", str(tmp_path / "o")])
    _wait_for_popgrad(p)  # a signal while the interpreter itself starts (`site`) comes before any popgrad code
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    text = err.decode()
    if p.returncode == 0:
        pytest.skip("the run finished before the signal")
    if "init_import_site" in text:  # Python's fatal error for a signal while `site` runs: before popgrad's code
        pytest.skip("the signal came while the interpreter itself started (a loaded machine)")
    assert p.returncode == 130 and "Traceback" not in text, text
    assert len(text.strip().splitlines()) == 1
    if "is kept" in text:
        assert (tmp_path / "o" / "checkpoint.npz").exists()


def test_sigterm_leaves_no_temporary_files(tmp_path):
    p = _spawn(["run", "--no-sweep", "--no-progress", "--checkpoint-every", "1", "--steps1", "3000",
                "--out", str(tmp_path / "o")])
    deadline = time.time() + 50
    while not (tmp_path / "o" / "checkpoint.npz").exists() and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err.decode()
    files = os.listdir(tmp_path / "o")
    assert files == ["checkpoint.npz"], files
    assert "Traceback" not in err.decode()


def test_broken_pipe_keeps_the_report(tmp_path):
    cmd = (f"{sys.executable} -m popgrad.app.cli run {' '.join(FAST)} --out {tmp_path / 'o'} | head -1")
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], env=_env(), cwd=ROOT, capture_output=True, timeout=60)
    assert b"BrokenPipe" not in r.stderr and b"Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "o" / "report.json").exists()


# ---------------------------------------------------- 7. before anything is written
@pytest.mark.parametrize("args", [["--checkpoint-every", "-1"], ["--alpha", "0.03", "--floor", "0", "--gradient", "idealized"],
                                  ["--alpha", "-1"], ["--lr1", "nan"], ["--resume"]])
def test_late_checks_write_nothing(tmp_path, capsys, args):
    rc = _cli(tmp_path, *args)
    _one_line_error(capsys, 2, rc)
    assert not (tmp_path / "out").exists()


def test_exact_run_with_reducible_draws_does_not_blame_idealized(tmp_path, capsys):
    assert _cli(tmp_path, "--alpha", "0.03", "--floor", "0") == 0  # raw draws: reducible
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    align = [c for c in report["checks"] if c["name"] == "gradient_alignment"][0] if isinstance(report["checks"], list) \
        else report["checks"]["gradient_alignment"]
    assert align.get("applicable") is False or align.get("passed") is None


# ----------------------------------------------------------- 8. messages
@pytest.mark.parametrize("args,needle", [
    (["--S", "abc"], "--S: expected an integer >= 2, got 'abc'"),
    (["--seed", "-1"], "--seed: expected an integer >= 0"),
    (["--graph", "-2,0,-1"], "--graph '-2,0,-1': entry 0"),
    (["--graph", "-1,99999999999999999999,-1"], "entry 1"),
    (["--graph", "-1,0,1"], "the query"),
])
def test_messages_name_the_flag(tmp_path, capsys, args, needle):
    rc = _cli(tmp_path, *args, fast=["--no-sweep"])
    err = _one_line_error(capsys, 2, rc)
    assert needle in err and not (tmp_path / "out").exists(), err


def test_undecodable_config_is_named(tmp_path, capsys):
    cfg = tmp_path / "bad.toml"
    cfg.write_bytes(b"S = 3\n\xff\xfe = 1\n")
    err = _one_line_error(capsys, 2, _cli(tmp_path, "--config", str(cfg)))
    assert str(cfg) in err


def test_config_values_use_the_same_validator(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text("seed = -1\n")
    err = _one_line_error(capsys, 2, _cli(tmp_path, "--config", str(cfg)))
    assert "seed" in err and ">= 0" in err


# ----------------------------------------------------------- 9. degenerate
def test_all_roots_checks_are_not_applicable(tmp_path, capsys):
    rc = main(["run", "--graph=-1,-1,-1,-1", "--S", "2", "--steps1", "5", "--steps2", "5", "--no-progress",
               "--out", str(tmp_path / "o")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "[N/A ] graph_recovery" in out and "[N/A ] gradient_alignment" in out
    assert "nan" not in out.lower().split("report:")[0].split("training:")[1]


def test_conflicting_T_is_an_error(tmp_path, capsys):
    err = _one_line_error(capsys, 2, main(["run", "--graph=-1,0,-1", "--T", "50", "--out", str(tmp_path / "o")]))
    assert "--T 50 conflicts" in err


SAVEZ_SCRIPT = """
import os, signal, sys
import numpy as np
import popgrad._io as io
from popgrad._signals import Terminated

def terminate(s, f):
    raise Terminated()

signal.signal(signal.SIGTERM, terminate)
import zipfile
real = zipfile._ZipWriteFile.close

def close_signalled(self):  # the signal lands as np.savez closes a member: the archive still has it open
    os.kill(os.getpid(), signal.SIGTERM)
    return real(self)

zipfile._ZipWriteFile.close = close_signalled
path = os.path.join(sys.argv[1], "checkpoint.npz")
try:
    io.atomic_savez(path, a=np.arange(10**6, dtype=float))
except Terminated:
    print("terminated", sorted(os.listdir(sys.argv[1])), flush=True)
"""


def test_a_signal_during_a_checkpoint_write_waits_for_the_archive(tmp_path):
    """A clean-clone CI run's failure (test_sigterm_leaves_no_temporary_files): SIGTERM landed inside ``np.savez``'s zip writer; closing the archive
    with a member still open raised ``ValueError`` in the signal's place (exit 2, "Can't close the ZIP file").
    Now the write finishes first (``deferred``), then the signal's own exception is raised."""
    r = subprocess.run([sys.executable, "-c", SAVEZ_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split(None, 1)[0] == "terminated", (r.stdout, r.stderr)
    assert "Exception ignored" not in r.stderr and "ZIP" not in r.stderr
    # the archive was complete when the signal acted: nothing partial is left (renamed whole, or removed)
    left = os.listdir(tmp_path)
    assert all(name == "checkpoint.npz" for name in left), left
    if left:
        assert np.load(tmp_path / "checkpoint.npz")["a"].shape == (10**6,)


def test_an_error_raised_while_a_signal_unwinds_is_reported_as_the_signal(tmp_path, capsys, monkeypatch):
    """Whatever error a signal's exception turns into on its way out (a ValueError from a library's cleanup),
    the command reports the signal: its one line and 143, not "error" and 2."""
    import popgrad._signals as S
    import popgrad.app.cli as cli

    def broken_run(*a, **k):
        S._STATE["sigterm"] = True  # what the SIGTERM handler records before raising Terminated
        raise ValueError("Can't close the ZIP file while there is an open writing handle on it.")

    monkeypatch.setattr(cli, "run", broken_run)
    monkeypatch.setitem(S._STATE, "sigterm", False)
    code = main(["run", "--no-sweep", "--no-progress", "--steps1", "3", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 143, err
    assert err.strip().splitlines() == [err.strip().splitlines()[-1]] and "terminated" in err and "ZIP" not in err
