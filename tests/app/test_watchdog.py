"""The command's watchdog (``popgrad._signals.watchdog``): the two-second promise when the main thread is stuck in C.

Python runs a signal handler only between bytecodes, so a long C call delays it: on a fresh machine
numba's LLVM compiles a kernel of the full model in calls of up to 4 s (CI saw SIGINT and SIGTERM
answered 2.3 s and 3.2 s late). Here a GIL-releasing C call that ignores signals
(``hashlib.pbkdf2_hmac``, about ten seconds) stands in for it, deterministically: the watchdog must end
the command about :data:`WATCHDOG_UNHANDLED` s after the signal, with the registered cleanups (a temporary
file, the staging folder, the folder lock, the folder this run created), the command's one line and
143 / 130; after a handler has acted but the main thread is stuck again, at :data:`WATCHDOG_HARD` s;
and it never cuts a :func:`deferred` block short.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from popgrad._signals import WATCHDOG_HARD, WATCHDOG_UNHANDLED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LATENCY = 2.0  # the README's promise

#: About ten seconds of C (OpenSSL) with the GIL released and no check for signals.
STUCK = 'hashlib.pbkdf2_hmac("sha256", b"k", b"s", int(10 * per_second))'

PRELUDE = """
import hashlib, os, sys, time
from popgrad import _signals
from popgrad._io import OutputDir, atomic_path
out = sys.argv[1]
t0 = time.perf_counter()
hashlib.pbkdf2_hmac("sha256", b"k", b"s", 200_000)
per_second = 200_000 / (time.perf_counter() - t0)  # pbkdf2 iterations per second on this machine, now
"""


def _start(body, out):
    code = PRELUDE + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", code, str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    line = p.stdout.readline()  # "ready": the process is inside the block under test
    assert line.strip() == b"ready", (line, p.stderr.read() if p.poll() is not None else b"")
    return p


def _signal_and_wait(p, sig, after=0.2):
    time.sleep(after)
    t0 = time.monotonic()
    p.send_signal(sig)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the command outlived the signal by 30 s")
    return p.returncode, time.monotonic() - t0, p.stderr.read().decode()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_long_c_call_ends_the_command_with_its_cleanups(tmp_path, sig):
    out = tmp_path / "run"
    p = _start(f"""
        with _signals.cli_session(), _signals.watchdog():
            _signals.set_interrupt_line(lambda sig: "popgrad: stopped by the watchdog (" + str(int(sig)) + ")")
            with OutputDir(out, outputs=("report.json",)) as od:
                with atomic_path(od.keep("checkpoint.npz")) as tmp:
                    open(tmp, "w").write("partial")
                    open(od.path("report.json"), "w").write("staged")
                    print("ready", flush=True)
                    {STUCK}
        print("not reached", flush=True)
    """, out)
    rc, latency, err = _signal_and_wait(p, sig)
    assert rc == (143 if sig == signal.SIGTERM else 130), err
    assert err.splitlines() == [f"popgrad: stopped by the watchdog ({int(sig)})"], err
    assert WATCHDOG_UNHANDLED - 0.05 < latency < LATENCY, latency
    assert not out.exists(), sorted(os.listdir(out))  # tmp file, staging folder, lock and the folder itself


def test_the_watchdog_keeps_what_an_earlier_run_left(tmp_path):
    """An existing folder with a checkpoint: only this run's files go (the folder and checkpoint stay)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoint.npz").write_text("kept")
    p = _start(f"""
        with _signals.cli_session(), _signals.watchdog():
            with OutputDir(out, outputs=("report.json",)) as od:
                with atomic_path(od.keep("checkpoint.npz")) as tmp:
                    print("ready", flush=True)
                    {STUCK}
    """, out)
    rc, latency, err = _signal_and_wait(p, signal.SIGTERM)
    assert rc == 143 and err.splitlines() == ["popgrad: terminated"], (rc, err)
    assert latency < LATENCY
    assert sorted(os.listdir(out)) == ["checkpoint.npz"] and (out / "checkpoint.npz").read_text() == "kept"


def test_a_handler_that_acted_but_a_main_thread_stuck_again(tmp_path):
    """The handler ran (Terminated), then a ``finally`` entered a long C call: the watchdog's hard deadline."""
    p = _start(f"""
        with _signals.cli_session(), _signals.watchdog():
            try:
                print("ready", flush=True)
                time.sleep(60)
            finally:
                {STUCK}
    """, tmp_path)
    rc, latency, err = _signal_and_wait(p, signal.SIGTERM)
    assert rc == 143 and err.splitlines() == ["popgrad: terminated"], (rc, err)
    assert WATCHDOG_HARD - 0.05 < latency < LATENCY, latency


BLOCKS = {
    # short C calls: the block's handler runs (the signal is held), the block's end sends it again
    "short calls": """t0 = time.monotonic()
                    while time.monotonic() - t0 < 1.5:
                        hashlib.pbkdf2_hmac("sha256", b"k", b"s", 20_000)""",
    # one C call longer than WATCHDOG_UNHANDLED (calibrated before "ready"): the watchdog waits on the block's lock
    "one long call": 'hashlib.pbkdf2_hmac("sha256", b"k", b"s", n_long)',
}


@pytest.mark.parametrize("block", list(BLOCKS))
def test_a_deferred_block_is_never_cut_short(tmp_path, block):
    """A rename block (``deferred``) busy in C for about 1.5 s: the command ends after it, never inside."""
    marker = tmp_path / "block-done"
    p = _start(f"""
        n_long = int(1.5 * per_second)  # about 1.5 s of one C call
        with _signals.cli_session(), _signals.watchdog():
            try:
                with _signals.deferred():
                    print("ready", flush=True)
                    {BLOCKS[block]}
                    open(os.path.join(out, "block-done"), "w").write(repr(time.monotonic()))
                time.sleep(60)
            except _signals.Terminated:  # the signal held by the block, sent again at its end (as the CLI does)
                _signals.final_line("popgrad: terminated")
                os._exit(143)
    """, tmp_path)
    rc, latency, err = _signal_and_wait(p, signal.SIGTERM, after=0.1)
    ended = time.monotonic()
    assert rc == 143 and err.splitlines() == ["popgrad: terminated"], (rc, err)
    block_end = float(marker.read_text())  # the block ran to its end (one clock: CLOCK_MONOTONIC)
    assert block_end < ended
    assert ended - block_end < LATENCY, (ended - block_end, latency)


def test_a_decided_status_is_left_alone(tmp_path):
    """After the command's last line (``final_line``) the watchdog does not act: the status is decided."""
    p = _start("""
        with _signals.cli_session(), _signals.watchdog():
            _signals.final_line("popgrad: done")
            print("ready", flush=True)
            hashlib.pbkdf2_hmac("sha256", b"k", b"s", int(4 * per_second))
        os._exit(0)
    """, tmp_path)
    rc, latency, err = _signal_and_wait(p, signal.SIGTERM)
    # the watchdog stays out; the Python handler then acts once the C call returns (Terminated, a traceback
    # in this bare script): what matters here is that no second line came from the watchdog
    assert "popgrad: done" in err.splitlines()[0], err
    assert "popgrad: terminated" not in err, err
    assert latency > WATCHDOG_HARD, latency


def test_the_library_starts_no_watchdog():
    """Importing popgrad in a user's process installs nothing: no wake-up pipe, no watchdog thread."""
    code = ("import signal, threading, popgrad; from popgrad import _signals\n"
            "with _signals.cli_session():\n"
            "    assert signal.set_wakeup_fd(-1) == -1\n"
            "    assert not [t for t in threading.enumerate() if t.name == 'popgrad-watchdog']\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=120)


def test_a_sigterm_that_c_code_turned_into_another_error_is_reported_as_terminated(tmp_path, monkeypatch, capsys):
    """numba's compiler, interrupted by ``Terminated``, can raise its own error on the way out ("no compiled
    object yet"): the command still says "terminated" and exits 143 (it printed a traceback and exited 1)."""
    from popgrad import _signals
    from popgrad.app import cli

    def interrupted_compile(*args, **kwargs):
        _signals._STATE["sigterm"] = True  # what the SIGTERM handler notes before raising Terminated
        raise RuntimeError("no compiled object yet for <Library '_node_forward'>")

    monkeypatch.setattr(cli, "run", interrupted_compile)
    monkeypatch.setitem(_signals._STATE, "sigterm", False)
    monkeypatch.setitem(_signals._STATE, "decided", False)
    code = cli.main(["run", "--S", "2", "--T", "4", "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 143
    assert err.splitlines() == ["popgrad: terminated (no checkpoint was written yet)"], err


def test_a_forked_child_does_not_feed_the_parents_watchdog(tmp_path):
    """A child forked while the watchdog runs forgets the wake-up pipe: a SIGTERM the child receives (a
    worker stopped by its nanny) never makes the parent's watchdog end the parent."""
    p = _start("""
        import signal
        with _signals.cli_session(), _signals.watchdog():
            pid = os.fork()
            if pid == 0:
                signal.signal(signal.SIGTERM, lambda s, f: None)  # a Python handler: the C handler runs
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
                os._exit(0)
            os.waitpid(pid, 0)
            print("ready", flush=True)
            time.sleep(2 * _signals.WATCHDOG_HARD)
            print("parent alive", flush=True)
    """, tmp_path)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and out.decode().strip() == "parent alive", (p.returncode, out, err)


def test_the_watchdog_during_a_slow_fsync_removes_the_temporary_file(tmp_path):
    """CI once found ``.tmp-….npz`` beside ``checkpoint.npz`` after SIGTERM (143, no traceback): the signal came
    while ``atomic_path`` flushed the finished file (``fsync`` on a busy disk, a C call) after its emergency
    cleanup had been removed, and the watchdog ended the command. The cleanup now stays armed to the rename."""
    out = tmp_path / "run"
    out.mkdir()
    p = _start(f"""
        import popgrad._io as _io
        def slow_fsync(path):
            print("ready", flush=True)
            {STUCK}
        _io._fsync_file = slow_fsync
        with _signals.cli_session(), _signals.watchdog():
            with atomic_path(os.path.join(out, "checkpoint.npz")) as tmp:
                open(tmp, "w").write("complete")
        print("not reached", flush=True)
    """, out)
    rc, latency, err = _signal_and_wait(p, signal.SIGTERM)
    assert rc == 143, err
    assert latency < LATENCY, latency
    assert os.listdir(out) == [], os.listdir(out)


def test_a_signal_right_after_the_temporary_file_is_created_removes_it(tmp_path):
    """The name is armed for removal before the file exists: SIGTERM delivered as the creation returns (here
    raised from a patched ``os.close``, the first bytecode after it) leaves nothing behind."""
    out = tmp_path / "run"
    out.mkdir()
    p = _start("""
        import signal
        import popgrad._io as _io
        real_close = os.close
        class Os:
            def __getattr__(self, name):
                return getattr(os, name)
            @staticmethod
            def close(fd):
                real_close(fd)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
        with _signals.cli_session(), _signals.watchdog():
            print("ready", flush=True)
            _io.os = Os()
            try:
                with atomic_path(os.path.join(out, "checkpoint.npz")) as tmp:
                    open(tmp, "w").write("complete")
            except _signals.Terminated:
                sys.exit(143)  # what the command's main does
        print("not reached", flush=True)
    """, out)
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the command outlived the signal by 30 s")
    assert p.returncode == 143, p.stderr.read().decode()
    assert os.listdir(out) == [], os.listdir(out)
