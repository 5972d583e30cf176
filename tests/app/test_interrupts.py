"""Issue 32, family 1: an interrupt is never lost or late, in every phase of a run or a sweep.

Each test starts the real ``popgrad`` command in its own session (as a terminal would), waits for
the line that opens a phase, sends SIGINT to the whole process group (a terminal's Ctrl-C, which
also reaches any Dask worker) or SIGTERM to the command (``kill PID``) at a random time inside
that phase, and checks the promise: exit 130 / 143 within :data:`LATENCY` seconds, exactly one
line on stderr and no traceback, no staging folder, temporary file or lock left, and no process
of the group left behind. The phases: the Stage-1 field kernel, the full model's training
kernel, the start of the Dask cluster and the submission of a sweep's cells.

A few signals per phase in the default profile (derandomized times); twenty per phase under
``POPGRAD_HYPOTHESIS_PROFILE=thorough`` (random times). Every wait is bounded.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.profiles import active_profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The promise: the command is gone this many seconds after the signal.
LATENCY = 2.0
#: Signals per phase: one SIGINT and one SIGTERM by default, twenty in all under the thorough profile.
REPEATS = 10 if active_profile() == "thorough" else 1
#: Bound on waiting for a phase to begin (first-run compilation included) and for the group to empty.
PHASE_TIMEOUT = 300.0
GROUP_TIMEOUT = 20.0


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("NUMBA_NUM_THREADS", "1")
    return env


def _default_sigint():
    """In the child: SIGINT as at a terminal, even when the tests run in the background (where it is ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Command:
    """The ``popgrad`` command in its own session, its stdout lines time-stamped as they come."""

    def __init__(self, args, cwd):
        self.p = subprocess.Popen([sys.executable, "-m", "popgrad.app.cli", *args], env=_env(), cwd=cwd,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                  preexec_fn=_default_sigint)
        self.lines = []
        self.err = b""
        self._out = threading.Thread(target=self._read_out, daemon=True)
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._out.start()
        self._err.start()

    def _read_out(self):
        for raw in self.p.stdout:
            self.lines.append((time.monotonic(), raw.decode(errors="replace")))

    def _read_err(self):
        self.err = self.p.stderr.read()

    def wait_line(self, prefix, timeout=PHASE_TIMEOUT) -> bool:
        """Wait until a stdout line starts with ``prefix``; False if the command ended first."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(line.startswith(prefix) for _, line in self.lines):
                return True
            if self.p.poll() is not None:
                return False
            time.sleep(0.01)
        self.kill()
        pytest.fail(f"no line {prefix!r} within {timeout:g} s; stdout so far: {self.lines[-5:]}")

    def wait_guard(self, timeout=PHASE_TIMEOUT) -> None:
        """Wait until the command catches SIGTERM (/proc): popgrad's first line ran (its import guard).
        Before it, the interpreter itself is starting (``site``), where no Python code of popgrad can act."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.p.poll() is None:
            try:
                with open(f"/proc/{self.p.pid}/status") as fh:
                    caught = int(next(ln for ln in fh if ln.startswith("SigCgt:")).split()[1], 16)
            except (OSError, StopIteration, ValueError):
                caught = 0
            if caught & (1 << (signal.SIGTERM - 1)):
                return
            time.sleep(0.002)

    def signal_and_wait(self, sig):
        """Send ``sig`` (SIGINT to the process group, SIGTERM to the command); ``(rc, seconds to exit, stderr)``."""
        t0 = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(self.p.pid, sig)
        else:
            self.p.send_signal(sig)
        rc = None
        while rc is None and time.monotonic() - t0 < 60:
            rc = self.p.poll()
            time.sleep(0.005)
        latency = time.monotonic() - t0
        if rc is None:
            self.kill()
            pytest.fail(f"still running 60 s after {signal.Signals(sig).name}")
        self._err.join(10)
        return rc, latency, self.err.decode(errors="replace")

    def group_empties(self) -> bool:
        """Whether every process of the command's group (its Dask workers) ends within GROUP_TIMEOUT."""
        end = time.monotonic() + GROUP_TIMEOUT
        while time.monotonic() < end:
            try:
                os.killpg(self.p.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.05)
        return False

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _leftovers(root):
    return [os.path.join(d, n) for d, ds, fs in os.walk(root) for n in ds + fs
            if n.startswith((".staging-", ".popgrad.lock", ".tmp"))]


#: Python's own message for a signal during its start-up (``site`` importing the venv's ``.pth`` files),
#: before any popgrad code runs: nothing popgrad can handle (see the report of issue 32).
INTERPRETER_START = "init_import_site"


def _check(cmd, sig, out, allowed_files=None, skip_if_done=True):
    rc, latency, err = cmd.signal_and_wait(sig)
    if rc == 0 and skip_if_done:
        pytest.skip("the command finished before the signal")
    if INTERPRETER_START in err:
        pytest.skip("the signal came while the interpreter itself started, before popgrad's first line")
    want = 130 if sig == signal.SIGINT else 143
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == want, (rc, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert ("interrupted" if sig == signal.SIGINT else "terminated") in lines[0], err
    assert latency < LATENCY, f"exit {latency:.2f} s after {signal.Signals(sig).name} (promise: {LATENCY} s)"
    assert cmd.group_empties(), "processes of the command's group (Dask workers) outlived it"
    assert not _leftovers(out), _leftovers(out)
    if allowed_files is not None and os.path.isdir(out):
        assert set(os.listdir(out)) <= set(allowed_files), os.listdir(out)


def _times(phase, n, low, high):
    """``n`` delays in ``[low, high)``: fixed per phase by default, random under the thorough profile."""
    rng = random.Random() if active_profile() == "thorough" else random.Random(f"issue32-{phase}")
    return [rng.uniform(low, high) for _ in range(n)]


SIGNALS = [signal.SIGINT, signal.SIGTERM]


def _cases(phase, low, high):
    delays = _times(phase, 2 * REPEATS, low, high)
    return [pytest.param(SIGNALS[i % 2], d, id=f"{SIGNALS[i % 2].name}-{d:.2f}s") for i, d in enumerate(delays)]


# ----------------------------------------------------------- the Stage-1 field kernel
@pytest.mark.parametrize("sig, delay", _cases("field", 0.1, 1.5))
def test_interrupt_in_the_field_kernel(tmp_path, sig, delay):
    """``--T 1024 --gradient field``: the field (and its timing estimate at T = 256, 512) takes a minute of
    numba code; the kernels return to Python every quarter second, so the signal acts at once."""
    out = tmp_path / "o"
    cmd = Command(["run", "--S", "2", "--T", "1024", "--gradient", "field", "--no-sweep", "--no-progress",
                   "--out", str(out)], ROOT)
    if not cmd.wait_line("Task "):
        pytest.fail(f"the run ended before its summary: {cmd.err!r}")
    time.sleep(delay)
    _check(cmd, sig, out, allowed_files={"checkpoint.npz"})


# ------------------------------------------------------ the full model's training kernel
@pytest.mark.parametrize("sig, delay", _cases("catformer", 0.1, 2.0))
def test_interrupt_in_the_full_model_kernel(tmp_path, sig, delay):
    out = tmp_path / "o"
    cmd = Command(["run", "--model", "catformer", "--S", "3", "--T", "10", "--steps", "1000000", "--no-progress",
                   "--out", str(out)], ROOT)
    if not cmd.wait_line("Task "):
        pytest.fail(f"the run ended before its summary: {cmd.err!r}")
    time.sleep(delay)
    _check(cmd, sig, out, allowed_files={"checkpoint.npz"})


# ------------------------------------------------------------------ a sweep's phases
def _spec(tmp_path, n_cells):
    spec = tmp_path / "spec.toml"
    spec.write_text("[fixed]\nS = 2\nT = 4\natoms = 2\nsteps1 = 100000\nsteps2 = 5\nsweep = false\n"
                    f"[axes]\nseed = {list(range(n_cells))}\n")
    return str(spec)


@pytest.mark.parametrize("sig, delay", _cases("dask-start", 0.0, 2.0))
def test_interrupt_while_dask_starts(tmp_path, sig, delay):
    out = tmp_path / "o"
    cmd = Command(["sweep", _spec(tmp_path, 2), "--out", str(out), "--no-progress", "--workers", "2"], ROOT)
    if not cmd.wait_line("sweep: 2 cells"):
        pytest.fail(f"the sweep ended before its first line: {cmd.err!r}")
    time.sleep(delay)
    _check(cmd, sig, out)


#: A sweep whose LocalCluster is interrupted while a worker process is still reading its start-up data: the
#: fake cluster starts one as multiprocessing's spawn does (``spawn_main`` on a pipe it is never sent anything
#: on) and then the SIGTERM arrives (``Terminated``), before any cluster object exists.
MID_START = r"""
import os, subprocess, sys
import dask.distributed
from popgrad._signals import Terminated
from popgrad.app import cli

class Cluster:
    def __init__(self, *args, **kwargs):
        r, self.w = os.pipe()
        subprocess.Popen([sys.executable, "-c", f"from multiprocessing.spawn import spawn_main; "
                          f"spawn_main(pipe_handle={r})", "--multiprocessing-fork"], pass_fds=(r,))
        os.close(r)
        raise Terminated()

dask.distributed.LocalCluster = Cluster
sys.exit(cli.main(sys.argv[1:]))
"""


def test_terminated_while_workers_spawn_leaves_one_line(tmp_path):
    """The interrupt of a cluster start kills the worker processes it spawned: an orphan still waiting for its
    start-up data read end-of-file when the command exited and printed an ``EOFError`` traceback on the
    command's stderr (seen once in eight loaded runs of ``test_interrupt_while_dask_starts``)."""
    script = tmp_path / "mid_start.py"
    script.write_text(MID_START)
    out = tmp_path / "o"
    r = subprocess.run([sys.executable, str(script), "sweep", _spec(tmp_path, 2), "--out", str(out), "--no-progress",
                        "--workers", "2"], env=_env(), cwd=ROOT, capture_output=True, timeout=PHASE_TIMEOUT)
    err = r.stderr.decode(errors="replace")  # read to its end: every writer, the spawned child too, has closed it
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert r.returncode == 143, (r.returncode, err)
    assert lines == ["popgrad: terminated (finished cells are kept; rerun the same command to resume)"], err


@pytest.mark.parametrize("sig, delay", _cases("submission", 0.0, 0.3))
def test_interrupt_while_cells_are_submitted(tmp_path, sig, delay):
    out = tmp_path / "o"
    cmd = Command(["sweep", _spec(tmp_path, 800), "--out", str(out), "--no-progress", "--workers", "1"], ROOT)
    if not cmd.wait_line("Dask scheduler:"):
        pytest.fail(f"the sweep ended before its cluster started: {cmd.err!r}")
    time.sleep(delay)
    _check(cmd, sig, out)


# ------------------------------------------------- any time of a run (imports, set-up, training, report)
@pytest.fixture(scope="module")
def compiled_run(tmp_path_factory):
    """The default run once to its end first: every kernel it uses compiled and cached. A signal during
    numba's first compilation of a kernel is outside these tests (a SIGTERM there was seen to end the
    process with -15 and nothing said, on a fresh clone: an open finding of issue 32)."""
    out = tmp_path_factory.mktemp("warm") / "o"
    subprocess.run([sys.executable, "-m", "popgrad.app.cli", "run", "--no-sweep", "--no-progress", "--out", str(out)],
                   env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=PHASE_TIMEOUT)


@pytest.mark.parametrize("sig, delay", _cases("run", 0.0, 6.0))
def test_interrupt_at_any_time_of_a_run(tmp_path, sig, delay, compiled_run):
    """From popgrad's first line on: SIGTERM while the command still imports is 143 and one line too
    (before, the default action killed it: exit -15, nothing said)."""
    out = tmp_path / "o"
    cmd = Command(["run", "--no-sweep", "--no-progress", "--out", str(out)], ROOT)
    if os.path.isdir("/proc/self"):
        cmd.wait_guard()
    time.sleep(delay)
    _check(cmd, sig, out, allowed_files={"checkpoint.npz"})


def _children(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdline = fh.read().decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                kids.append((int(entry), cmdline))
    return kids


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_the_command_s_dask_workers_ignore_sigint(tmp_path):
    """The workers ignore SIGINT from their first import of popgrad on (and start with it blocked:
    :func:`test_children_spawned_in_the_shield_start_with_sigint_blocked`)."""
    cmd = Command(["sweep", _spec(tmp_path, 2), "--out", str(tmp_path / "o"), "--no-progress", "--workers", "2"], ROOT)
    try:
        if not cmd.wait_line("Dask scheduler:"):
            pytest.fail(f"the sweep ended before its cluster started: {cmd.err!r}")
        workers = [pid for pid, line in _children(cmd.p.pid) if "--multiprocessing-fork" in line]
        assert workers, _children(cmd.p.pid)
        for pid in workers:
            with open(f"/proc/{pid}/status") as fh:
                ignored = int(next(ln for ln in fh if ln.startswith("SigIgn:")).split()[1], 16)
            assert ignored & (1 << (signal.SIGINT - 1)), f"worker {pid} does not ignore SIGINT"
    finally:
        cmd.kill()


SHIELD_SCRIPT = """
import multiprocessing, os, sys
from popgrad._signals import shield_children


def report(path):
    with open("/proc/self/status") as fh:
        line = next(ln for ln in fh if ln.startswith("SigBlk:"))
    with open(path, "w") as fh:
        fh.write(line.split()[1])


if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    with shield_children():
        p = ctx.Process(target=report, args=(sys.argv[1],))
        p.start()
    p.join()
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_children_spawned_in_the_shield_start_with_sigint_blocked(tmp_path):
    """The cause of the worker tracebacks (a Ctrl-C while a worker imported, the sweep test that failed once
    in a run): the first spawned child of a process starts multiprocessing's resource tracker, whose
    ``ensure_running`` unblocks SIGINT in the calling thread after its own spawn, which lifted the shield;
    in a fresh interpreter (no tracker yet) a child spawned inside the shield starts with SIGINT blocked."""
    script = tmp_path / "shield.py"
    script.write_text(SHIELD_SCRIPT)
    out = tmp_path / "sigblk"
    subprocess.run([sys.executable, str(script), str(out)], env=_env(), cwd=ROOT, check=True, timeout=PHASE_TIMEOUT)
    assert int(out.read_text(), 16) & (1 << (signal.SIGINT - 1)), f"SigBlk {out.read_text()}: SIGINT not blocked"


FIELD_SCRIPT = """
import sys, popgrad as pg
from popgrad.task.priors import dirichlet_prior
task = pg.Task(pg.chain(2048), dirichlet_prior(2, 0.1, 1, seed=0, symmetrize=False))
warm = pg.Task(pg.chain(400), task.prior)
# Every kernel the T = 2048 call uses compiled and loaded first: both twins (at T = 400 the work is
# below the parallel threshold, at T = 2048 above it). A signal that lands while numba compiles is
# swallowed by numba's ctypes callback in a script without popgrad's handlers; that is not this test.
pg.stage1_field(warm)
pg.stage1_field(warm, options=pg.EngineOptions(field_parallel_min_work=0))
print("field", flush=True)
try:
    pg.stage1_field(task)
except KeyboardInterrupt:
    print("interrupted", flush=True)  # when the interrupt reached Python (not the interpreter's exit)
else:
    print("done", flush=True)
"""


@pytest.mark.parametrize("delay", _times("api-field", 2 * REPEATS, 2.0, 6.0))
def test_python_api_field_is_interruptible(delay):
    """The same kernels in a library user's script (no popgrad handler): KeyboardInterrupt within LATENCY s.
    Before issue 32 one call of the pair kernel at T = 2048 held the interpreter for about 40 s."""
    p = subprocess.Popen([sys.executable, "-c", FIELD_SCRIPT], env=_env(), cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_default_sigint)
    try:
        line = p.stdout.readline()
        assert line.strip() == b"field", (line, p.stderr.read() if p.poll() is not None else b"")
        time.sleep(delay)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        reply = [None]
        reader = threading.Thread(target=lambda: reply.__setitem__(0, p.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        latency = time.monotonic() - t0
    finally:
        # Popen.send_signal polls first: a script that had already finished is reaped there and its
        # process group is gone (ProcessLookupError here, the cause of a once-in-a-run CI failure).
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(30)
    if reply[0] == b"done\n":
        pytest.skip("the field finished before the signal")
    assert reply[0] == b"interrupted\n", (reply[0], p.stderr.read())
    assert latency < LATENCY, f"KeyboardInterrupt {latency:.2f} s after SIGINT"


UNRAISABLE_SCRIPT = """
import signal, sys, time
import popgrad._signals as S
signal.signal(signal.SIGINT, S._on_sigint)
signal.signal(signal.SIGTERM, lambda s, f: (_ for _ in ()).throw(S.Terminated()))
sys.unraisablehook = S._unraisable

class Dies:
    def __del__(self):
        raise {exc}  # what a signal handler raises inside a finalizer: Python can only report it

t0 = time.monotonic()
try:
    Dies()  # collected at once: the exception goes to sys.unraisablehook
    while time.monotonic() - t0 < 5:
        sum(range(1000))
    print("lost", flush=True)
except (KeyboardInterrupt, S.Terminated) as exc:
    print(type(exc).__name__, f"{{time.monotonic() - t0:.3f}}", flush=True)
"""


@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "S.Terminated()"])
def test_an_interrupt_swallowed_as_unraisable_is_raised_again(exc):
    """The cause of the lost Ctrl-C during cell submission: a KeyboardInterrupt raised in a finalizer
    reaches ``sys.unraisablehook``; re-sending the signal from inside the hook raised it there again
    (and it was swallowed again). Now it is re-sent from a helper thread once the hook has returned."""
    r = subprocess.run([sys.executable, "-c", UNRAISABLE_SCRIPT.format(exc=exc)], env=_env(), cwd=ROOT,
                       capture_output=True, timeout=60)
    words = r.stdout.decode().split()
    assert words and words[0] == exc.split(".")[-1].rstrip("()"), (r.stdout, r.stderr)
    assert float(words[1]) < LATENCY
    assert b"Exception ignored" not in r.stderr, r.stderr


HALF_BUILT_SCRIPT = """
import sys
import popgrad._signals as S
sys.unraisablehook = S._unraisable

class HalfBuilt:  # as llvmlite's ObjectRef when a signal cut its constructor short: __del__ fails at exit
    def __del__(self):
        self._as_parameter_

x = HalfBuilt()
if {interrupted}:
    S._STATE["sigint"] = True
    S.final_line("popgrad: interrupted (no checkpoint was written yet)")
del x
"""


@pytest.mark.parametrize("interrupted", [True, False])
def test_after_an_interrupts_last_line_a_failing_finalizer_is_silent(interrupted):
    """The cause of a cold-cache failure of ``test_sigint_early_is_one_line``: a Ctrl-C during numba's compile
    left an llvmlite object half built, and its ``__del__`` printed "Exception ignored ... AttributeError"
    after the command's one line. After that line such reports are dropped; before it (no signal) they stay."""
    r = subprocess.run([sys.executable, "-c", HALF_BUILT_SCRIPT.format(interrupted=interrupted)], env=_env(),
                       cwd=ROOT, capture_output=True, timeout=60)
    err = r.stderr.decode()
    if interrupted:
        assert err.strip().splitlines() == ["popgrad: interrupted (no checkpoint was written yet)"], err
    else:
        assert "Exception ignored" in err and "AttributeError" in err, err
