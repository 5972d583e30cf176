"""Command-line interface: parsing only; the jobs are in :mod:`popgrad.app.jobs`.

``popgrad run`` -- the main job: build a task, run Algorithm 1 exactly, check
every theorem, write ``report.json``, ``report.md``, ``trajectory.npz`` and
figures into ``--out``. Settings come from built-in defaults, then
``--config FILE.toml``, then flags (flags win).

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
import math
import os
import signal
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from .. import __version__
from ..train.config import GRADIENTS, SCHEDULES, STAGE2_METHODS
from .jobs import (
    DEFAULTS,
    EXIT_DIVERGED,
    MULTI_PARENT_DEFAULTS,
    MULTI_PARENT_GRAPHS,
    CLIError,
    build_task,
    parse_parents,
    run,
)


# ------------------------------------------------------------------ config
def _types():
    """Python type of every config key (derived from :data:`ARG_SPECS`)."""
    return {k: {"int": int, "real": float, "bool": bool, "str": str}[v[0]] for k, v in ARG_SPECS.items()}


#: The one argument validator of the command line and of config files: key -> (kind, minimum, strict).
#: ``kind`` is "int", "real", "bool" or "str"; the range check of a real is ``> minimum`` when strict.
ARG_SPECS = {
    "graph": ("str", None, False), "S": ("int", 2, False), "T": ("int", 2, False), "alpha": ("real", 0, True),
    "atoms": ("int", 1, False), "seed": ("int", 0, False), "uniform_mean": ("bool", None, False),
    "floor": ("real", 0, False),
    "beta0": ("real", 0, True), "lr1": ("real", 0, False), "steps1": ("int", 0, False), "lr2": ("real", 0, False),
    "steps2": ("int", 0, False), "gradient": ("str", None, False), "schedule": ("str", None, False),
    "record_every": ("int", 1, False), "checkpoint_every": ("int", 0, False), "sweep": ("bool", None, False),
    "out": ("str", None, False), "max_sequences": ("int", 1, False), "n": ("int", 2, False),
    "stage2": ("str", None, False), "samples": ("int", 0, False), "sample_seed": ("int", 0, False),
}


def _want(key) -> str:
    kind, minimum, strict = ARG_SPECS[key]
    if kind == "int":
        return "an integer" + ("" if minimum is None else f" >= {minimum}")
    if kind == "real":
        return "a finite number" + ("" if minimum is None else f" {'>' if strict else '>='} {minimum:g}")
    return {"bool": "true or false", "str": "a string"}[kind]


def check_value(key, value):
    """``value`` converted and range-checked for ``key``; ``ValueError("expected ..., got ...")`` otherwise.

    Accepts the strings of the command line and the typed values of a config file.
    """
    kind, minimum, strict = ARG_SPECS[key]
    bad = ValueError(f"expected {_want(key)}, got {value!r}")
    if kind == "str":
        if not isinstance(value, str):
            raise bad
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if isinstance(value, bool):
        raise bad
    if kind == "int":
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise bad from None
        if not isinstance(value, int):
            raise bad
    else:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise bad from None
        if not isinstance(value, (int, float)):
            raise bad
        value = float(value)
        if not math.isfinite(value):
            raise bad
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise bad
    return value


def _arg(key):
    """An argparse ``type=`` for ``key`` built on :func:`check_value`."""
    def convert(text):
        try:
            return check_value(key, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = ARG_SPECS[key][0]
    return convert


def load_config_file(path) -> dict:
    """Read a TOML config; keys are the flag names (``S``, ``lr1``, ...)."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise CLIError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CLIError(f"config file {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise CLIError(f"config file {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8 TOML") from None
    out = {}
    for key, value in data.items():
        if key not in ARG_SPECS:
            raise CLIError(f"config file {path}: unknown key {key!r} (known: {', '.join(sorted(ARG_SPECS))})")
        try:
            out[key] = check_value(key, value)
        except ValueError as exc:
            raise CLIError(f"config file {path}: {key}: {exc}") from None
    return out


def resolve_config(args) -> dict:
    cfg = dict(DEFAULTS)
    from_file = load_config_file(args.config) if args.config is not None else {}
    cfg.update(from_file)
    for key in DEFAULTS:
        v = getattr(args, key, None)
        if v is not None:
            cfg[key] = v
    if cfg["graph"] in MULTI_PARENT_GRAPHS:  # k-head training defaults, unless set in the file or by a flag
        for key, value in MULTI_PARENT_DEFAULTS.items():
            if key not in from_file and getattr(args, key, None) is None:
                cfg[key] = value
    check_conflicts(cfg, given=set(from_file) | {k for k in DEFAULTS if getattr(args, k, None) is not None})
    return cfg


def check_conflicts(cfg: dict, given: set) -> None:
    """Flags that contradict each other are an error, never silently ignored."""
    spec = cfg["graph"]
    if "T" in given and ("," in spec or spec.lstrip("-").isdigit()):
        T = parse_parents(spec).T  # the graph's own errors first
        if cfg["T"] != T:
            raise CLIError(f"--T {cfg['T']} conflicts with --graph {spec!r}, which has T = {T} positions: "
                           "drop --T (a parents string fixes T)")
    if "n" in given and spec != "ngram":
        raise CLIError(f"--n {cfg['n']} only applies to --graph ngram (got --graph {spec}): drop --n")


# ------------------------------------------------------------------ parser
def _add_task_flags(p):
    p.add_argument("--config", metavar="FILE.toml", help="settings file; flags override it")
    p.add_argument("--graph", help="chain | icl | random | ngram | two-parent | a parents string such as "
                                   "-1,0,0,1,-1 (default chain)")
    p.add_argument("--n", type=_arg("n"), help="n of --graph ngram: n-1 parents per token (default 3)")
    p.add_argument("--S", type=_arg("S"), help=f"alphabet size (default {DEFAULTS['S']})")
    p.add_argument("--T", type=_arg("T"), help=f"sequence length incl. the query (default {DEFAULTS['T']})")
    p.add_argument("--alpha", type=_arg("alpha"), help="Dirichlet concentration of the prior (default 1.0)")
    p.add_argument("--atoms", type=_arg("atoms"), help="Dirichlet draws before relabeling closure (default 8)")
    p.add_argument("--seed", type=_arg("seed"), help="seed of the prior (and of --graph random) (default 0)")
    p.add_argument("--uniform-mean", dest="uniform_mean", action="store_true", default=None,
                   help="reweight the prior's draws so that E[pi] = 11^T/S (Knowl 10.3; the default)")
    p.add_argument("--no-uniform-mean", dest="uniform_mean", action="store_false",
                   help="keep the draws' equal weights (E[pi] not uniform: Knowl 10.3 fails)")
    p.add_argument("--floor", type=_arg("floor"), help="mix each prior draw with the uniform matrix: "
                   "pi = (1-floor) D + floor/S, so min pi >= floor/S (Knowl 10.1 with gamma >= floor; default "
                   f"{DEFAULTS['floor']}, 0 for the raw Dirichlet draws)")
    p.add_argument("--max-sequences", dest="max_sequences", type=_arg("max_sequences"), help="limit on S**T (default 2**25)")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``popgrad run: --S: expected an integer >= 2, got 'abc'``."""

    def error(self, message):
        message = message.replace("argument ", "", 1) if message.startswith("argument ") else message
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="popgrad", description="Exact population gradients for causal-structure learning.")
    p.add_argument("--version", action="version", version=f"popgrad {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run Algorithm 1 exactly, check the theorems, write a report")
    _add_task_flags(r)
    r.add_argument("--beta0", type=_arg("beta0"), help="A2(0) = beta0 * I (default 1e-3)")
    r.add_argument("--lr1", type=_arg("lr1"), help="Stage-1 rate, natural units: eta1 = lr1*S*T/beta0 (default 2)")
    r.add_argument("--steps1", type=_arg("steps1"), help="Stage-1 steps tau1 (default 300)")
    r.add_argument("--lr2", type=_arg("lr2"), help="Stage-2 rate, natural units: eta2 = lr2*S (default 2)")
    r.add_argument("--steps2", type=_arg("steps2"), help="Stage-2 steps tau2 (default 300)")
    r.add_argument("--gradient", choices=("auto",) + GRADIENTS,
                   help="Stage-1 gradient: exact (enumeration), field (the exact first-order field, any T) or "
                        "idealized (Knowl 3); default auto: exact when S**T <= --max-sequences, else field")
    r.add_argument("--schedule", choices=SCHEDULES, help="Algorithm 1 or joint training")
    r.add_argument("--stage2", choices=("auto",) + STAGE2_METHODS,
                   help="Stage 2 on the exact population, or sampled (sample-average approximation on a fixed "
                        "sample; every number it gives is labelled sampled, with its standard error); default auto: "
                        "exact when S**T <= --max-sequences")
    r.add_argument("--samples", type=_arg("samples"), help="sample size of a sampled Stage 2 (default 0: chosen "
                                                           "from a pilot sample so that the loss's standard error "
                                                           "is <= 1e-3)")
    r.add_argument("--sample-seed", dest="sample_seed", type=_arg("sample_seed"),
                   help="seed of the Stage-2 sample (default 0)")
    r.add_argument("--record-every", dest="record_every", type=_arg("record_every"),
                   help="record every N steps (default 10)")
    r.add_argument("--checkpoint-every", dest="checkpoint_every", type=_arg("checkpoint_every"),
                   help="checkpoint every N steps (default 100)")
    r.add_argument("--sweep", dest="sweep", action="store_true", default=None, help="run the T sweeps (default)")
    r.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the T sweeps")
    r.add_argument("--out", help="output folder (default popgrad_out)")
    r.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.npz")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler, e.g. tcp://host:8786: split each exact "
                   "enumeration of the training over its workers (same results)")
    s = sub.add_parser("summary", help="print the task's graph, prior diagnostics and sizes")
    _add_task_flags(s)
    w = sub.add_parser("sweep", help="run the main job on every cell of a grid (Dask); one row per cell in "
                                     "OUT/results.csv (popgrad/app/sweep.py)")
    w.add_argument("spec", metavar="CONFIG.toml", help="[fixed] values, [axes] lists, optional [[cells]]")
    w.add_argument("--out", required=True, metavar="DIR", help="output folder (rerun to resume)")
    w.add_argument("--scheduler", metavar="ADDRESS", help="existing Dask scheduler, e.g. tcp://host:8786 "
                                                        "(default: a LocalCluster on this machine)")
    w.add_argument("--workers", type=int, help="LocalCluster worker processes (default os.cpu_count())")
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
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = _parser().parse_args(_join_graph_value(argv))
    except SystemExit as exc:  # a one-line usage error (2), or --help/--version (0): main returns the status
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "sweep":
        from .sweep import main_sweep  # imports Dask: only for this command

        return main_sweep(args)
    out = None
    restore = _install_terminate_handler()
    try:
        cfg = resolve_config(args)
        out = cfg.get("out")
        if args.command == "summary":
            task = build_task(cfg)
            _say(task.summary())
            _say(f"exact weight total: {_weight_total(task)!r} (the prior's weights; sequences are not enumerated)")
        else:
            report = run(cfg, resume=args.resume, progress=not args.no_progress, log=_say,
                         scheduler=getattr(args, "scheduler", None))
            if report["trajectory"]["status"] != "completed":
                print(f"popgrad: training diverged ({report['trajectory']['message']}); the report is written",
                      file=sys.stderr)
                return EXIT_DIVERGED
    except (ValueError, CLIError) as exc:
        print(f"popgrad: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a folder that vanished, ...
        where = f" {exc.filename}" if exc.filename else ""
        print(f"popgrad: error: cannot write{where}: {exc.strerror or exc}; nothing partial was left", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Terminated) as exc:
        ckpt = os.path.join(out, "checkpoint.npz") if out and args.command == "run" else None
        kept = (f"the last checkpoint {ckpt} is kept; continue with --resume" if ckpt and os.path.exists(ckpt)
                else "no checkpoint was written yet")
        what = "terminated" if isinstance(exc, _Terminated) else "interrupted"
        print(f"popgrad: {what} ({kept})", file=sys.stderr)
        return 143 if isinstance(exc, _Terminated) else 130
    finally:
        restore()
    return 0


def _one_line(exc) -> str:
    return " ".join(str(exc).split())


def _weight_total(task) -> float:
    """Total weight of the task's sequences without enumerating them: the prior's weights sum."""
    prior = task.prior
    base = getattr(prior, "base", prior)
    return float(sum(base.weights)) if hasattr(base, "weights") else 1.0


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that ``finally`` blocks (temporary files, locks) run."""


def _install_terminate_handler():
    """Turn SIGTERM into :class:`_Terminated`; returns the function restoring the old handler."""
    try:
        old = signal.signal(signal.SIGTERM, _raise_terminated)
    except (ValueError, OSError):  # not the main thread
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, old)


def _raise_terminated(signum, frame):
    raise _Terminated()


def _say(text="") -> None:
    """``print`` that survives a closed pipe (``popgrad run | head -1``): the run goes on, output is dropped."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    sys.exit(main())
