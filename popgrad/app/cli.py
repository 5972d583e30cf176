"""Command-line interface: parsing only; the jobs are in :mod:`popgrad.app.jobs`.

``popgrad run`` -- the main job: build a task, run Algorithm 1 exactly (or train
the full transformer, ``--model catformer``), check every theorem, write
``report.json``, ``report.md``, ``trajectory.npz`` and figures into ``--out``.
Settings come from built-in defaults, then ``--config FILE.toml``, then flags
(flags win): :func:`popgrad.app.config.resolve`.

``popgrad summary`` -- print a task's graph, prior diagnostics and sizes.

``popgrad sweep CONFIG.toml --out DIR`` -- the main job on every cell of a
grid, in Dask tasks (:mod:`popgrad.app.sweep`).

Exit status (README "Promises"): 0 done; 2 a user error (bad flag, graph
string, out of range, S**T over the limit, unreadable config, unusable
``--out``, damaged checkpoint, ``--out`` in use), one line on stderr, before
anything is written; 3 training diverged (the report is written, with the
status); 130 interrupted (SIGINT), 143 terminated (SIGTERM): the last
checkpoint is kept when one was written, nothing partial otherwise.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys

from .. import __version__
from .._signals import (Terminated, cli_session, final_line, ignore_late_signals, is_cli_process, say,
                        set_interrupt_line, sigint_seen, signal_seen)
from .config import ARG_SPECS, check_value, load_config_file, merge, resolve
from .jobs import EXIT_DIVERGED, run
from .kinds import KINDS, flags, model_flag
from .tasks import RUN_FLAGS, TASK_FLAGS, build_task


# ------------------------------------------------------------------ config
def resolve_config(args, settle: bool = True):
    """Defaults, then ``--config FILE.toml``, then flags (flags win): :func:`popgrad.app.config.resolve`
    (the frozen :class:`~popgrad.app.config.RunConfig`), or the merged dict (``settle=False``)."""
    values = load_config_file(args.config) if args.config is not None else {}
    flags = {k: getattr(args, k) for k in ARG_SPECS if getattr(args, k, None) is not None}
    given = set(values) | set(flags)
    values.update(flags)
    return resolve(values, given) if settle else merge(values, given)


# ------------------------------------------------------------------ parser
def _arg(key):
    """An argparse ``type=`` for ``key`` built on :func:`popgrad.app.config.check_value`."""
    def convert(text):
        try:
            return check_value(key, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = key
    return convert


def _add_flag(p, f) -> None:
    """One :class:`popgrad.app.settings.Flag` as an argparse option (``bool``: ``--KEY`` and ``--no-KEY``)."""
    if f.kind == "bool":
        p.add_argument(f.flag, dest=f.key, action="store_true", default=None, help=f.help)
        p.add_argument("--no-" + f.flag[2:], dest=f.key, action="store_false", help=f.help_off)
    elif f.choices is not None:
        p.add_argument(f.flag, dest=f.key, choices=f.choices, help=f.help)
    else:
        p.add_argument(f.flag, dest=f.key, type=_arg(f.key), help=f.help)


def _add_task_flags(p):
    p.add_argument("--config", metavar="FILE.toml", help="settings file; flags override it")
    for f in TASK_FLAGS:
        _add_flag(p, f)


def _add_scheduler_flags(p, help_text):
    p.add_argument("--scheduler", metavar="ADDRESS", help=help_text)
    p.add_argument("--worker-timeout", dest="worker_timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="with --scheduler: how long to wait for a first worker before giving up (default 60)")


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``popgrad run: --S: expected an integer >= 2, got 'abc'``."""

    def error(self, message):
        message = message.replace("argument ", "", 1) if message.startswith("argument ") else message
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="popgrad", description="Exact population gradients for causal-structure learning.")
    p.add_argument("--version", action="version", version=f"popgrad {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run Algorithm 1 exactly (or --model catformer), check the theorems, "
                                       "write a report")
    _add_task_flags(r)
    seen = {f.key for f in TASK_FLAGS}
    _add_flag(r, model_flag())
    merged = {f.key: f for f in flags()}  # a key two kinds share offers both kinds' choices (--gradient)
    for kind in KINDS.values():  # each kind's flags, once, under its name (popgrad.app.kinds)
        own = [f for f in kind.flags if f.key not in seen and f.cli]
        if own:
            group = r.add_argument_group(f"--model {kind.model} ({kind.name})")
            for f in own:
                _add_flag(group, merged[f.key])
                seen.add(f.key)
    group = r.add_argument_group("the run")
    for f in RUN_FLAGS:
        _add_flag(group, f)
    r.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.npz")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_scheduler_flags(r, "Dask scheduler, e.g. tcp://host:8786: split each exact enumeration of the training "
                            "over its workers (same results)")
    s = sub.add_parser("summary", help="print the task's graph, prior diagnostics and sizes")
    _add_task_flags(s)
    w = sub.add_parser("sweep", help="run the main job on every cell of a grid (Dask); one row per cell in "
                                     "OUT/results.csv (popgrad/app/sweep.py)")
    w.add_argument("spec", metavar="CONFIG.toml", help="[fixed] values, [axes] lists, optional [[cells]]")
    w.add_argument("--out", required=True, metavar="DIR", help="output folder (rerun to resume)")
    _add_scheduler_flags(w, "existing Dask scheduler, e.g. tcp://host:8786 (default: a LocalCluster on this machine)")
    w.add_argument("--workers", type=_arg("workers"), help="LocalCluster worker processes (default: os.cpu_count(), "
                                                         "at most the cells to run)")
    w.add_argument("--figures", action="store_true", help="also write each cell's PNG figures")
    w.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _join_graph_value(argv):
    """Let ``--graph -1,0,1,-1`` through argparse (a value that starts with '-')."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--graph" and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"--graph={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv=None) -> int:
    """The ``popgrad`` command; returns its exit status (README "Promises").

    Every command runs inside :func:`popgrad._signals.cli_session` (SIGTERM -> 143, Ctrl-C -> 130,
    one line each); ``sweep`` reports its own interrupts (finished cells are kept).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(_join_graph_value(argv))
    except SystemExit as exc:  # a one-line usage error (2), or --help/--version (0): main returns the status
        return exc.code if isinstance(exc.code, int) else 2
    with cli_session():
        try:
            code = _command(args)
            if is_cli_process():
                ignore_late_signals()  # before the session restores the import-time handlers: no window
        except (KeyboardInterrupt, Terminated) as exc:  # a signal that came between the two lines above
            if is_cli_process():
                ignore_late_signals()
            final_line(f"popgrad: {'terminated' if isinstance(exc, Terminated) else 'interrupted'}")
            code = 143 if isinstance(exc, Terminated) else 130
    if code in (130, 143) and is_cli_process():
        # Interrupted: every ``finally`` has run and the one line is printed. End here with the
        # status decided above: the interpreter's own exit path re-raises a SIGINT it has seen
        # (exit status -2 instead of 130), which is not what the promises say.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if is_cli_process():
        # Done: the interpreter's finalization resets Python's handlers to the default, where a late SIGTERM
        # would kill the finished command with -15 and nothing said. Ignored (a process-wide disposition, which
        # finalization leaves alone; blocking covered this thread only, and numba's or the I/O threads could
        # take a process-directed signal), it is discarded: the status says what happened.
        ignore_late_signals()
    return code


def _command(args) -> int:
    if hasattr(args, "worker_timeout"):  # issue 32: never ignored silently
        if args.worker_timeout is not None and not args.scheduler:
            print("popgrad: error: --worker-timeout only applies with --scheduler (how long to wait for its first "
                  "worker): drop it, or add --scheduler ADDRESS", file=sys.stderr)
            return 2
        if args.worker_timeout is None:
            args.worker_timeout = 60.0
    if args.command == "sweep":
        from .sweep import main_sweep  # imports Dask: only for this command

        return main_sweep(args)
    out = None
    try:
        cfg = resolve_config(args, settle=args.command != "summary")
        out = cfg.get("out")
        if args.command == "run":
            set_interrupt_line(lambda sig: _interrupt_line(sig, out, True))
        if args.command == "summary":
            task = build_task(cfg)
            say(task.summary())
            total, what = _weight_total(task)
            say(f"exact weight total: {total!r} ({what}; sequences are not enumerated)")
        else:
            report = run(cfg, resume=args.resume, progress=not args.no_progress, log=say,
                         scheduler=getattr(args, "scheduler", None), worker_timeout=args.worker_timeout)
            if sigint_seen():  # a Ctrl-C that C code swallowed (it cleared the KeyboardInterrupt): still honoured
                final_line("popgrad: interrupted (the run had already finished; the report is written)")
                return 130
            if report["trajectory"]["status"] != "completed":
                print(f"popgrad: training diverged ({report['trajectory']['message']}); the report is written",
                      file=sys.stderr)
                return EXIT_DIVERGED
    except ValueError as exc:  # CLIError and OutputDirError are ValueErrors
        if signal_seen() is not None:  # raised while a signal's exception unwound (a zip file closed mid-write)
            return _signalled(signal_seen(), out, args.command == "run")
        print(f"popgrad: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a folder that vanished, ...
        if signal_seen() is not None:
            return _signalled(signal_seen(), out, args.command == "run")
        where = f" {exc.filename}" if exc.filename else ""
        print(f"popgrad: error: cannot write{where}: {exc.strerror or exc}; nothing partial was left", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as exc:
        return _signalled(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT, out,
                          args.command == "run")
    except Exception:
        if signal_seen() is not None:  # a signal that C code (an import, numba's compiler) turned into another error
            return _signalled(signal_seen(), out, args.command == "run")
        raise
    return 0


def _signalled(sig, out, run: bool) -> int:
    """The command's one line for signal ``sig`` and its exit status (143 for SIGTERM, 130 for SIGINT)."""
    final_line(_interrupt_line(sig, out, run))
    return 143 if sig == signal.SIGTERM else 130


def _interrupt_line(sig, out, run: bool) -> str:
    """The one line of an interrupted command: what it was, and for ``run`` what was kept."""
    what = "terminated" if sig == signal.SIGTERM else "interrupted"
    if not run:
        return f"popgrad: {what}"
    ckpt = os.path.join(out, "checkpoint.npz") if out else None
    kept = (f"the last checkpoint {ckpt} is kept; continue with --resume" if ckpt and os.path.exists(ckpt)
            else "no checkpoint was written yet")
    return f"popgrad: {what} ({kept})"


def _one_line(exc) -> str:
    return " ".join(str(exc).split())


def _weight_total(task) -> tuple:
    """``(total, what it is)``: the total weight of the task's sequences without enumerating them."""
    if task.continuous:  # a density: no atoms to add up (the weight table is built by the engines)
        return 1.0, "a continuous prior: a probability density"
    base = getattr(task.prior, "base", task.prior)
    return float(sum(base.weights)), "the prior's weights"


if __name__ == "__main__":
    sys.exit(main())
