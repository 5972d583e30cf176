"""Command-line interface: parsing only; the jobs are in :mod:`popgrad.app.jobs`.

``popgrad run`` -- the main job: build a task, run Algorithm 1 exactly, check
every theorem, write ``report.json``, ``report.md``, ``trajectory.npz`` and
figures into ``--out``. Settings come from built-in defaults, then
``--config FILE.toml``, then flags (flags win).

``popgrad summary`` -- print a task's graph, prior diagnostics and sizes.

``popgrad sweep CONFIG.toml --out DIR`` -- the main job on every cell of a
grid, in Dask tasks (:mod:`popgrad.app.sweep`).

User errors (bad graph string, S or T out of range, S**T over the limit,
negative alpha, unreadable config, ...) exit with status 2 and one line on
stderr, before anything is written.
"""
from __future__ import annotations

import argparse
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from .. import __version__
from ..train.algorithm1 import GRADIENTS, SCHEDULES, STAGE2_METHODS
from .jobs import DEFAULTS, MULTI_PARENT_DEFAULTS, MULTI_PARENT_GRAPHS, CLIError, build_task, run


# ------------------------------------------------------------------ config
def _types():
    return {
        "graph": str, "S": int, "T": int, "alpha": float, "atoms": int, "seed": int, "uniform_mean": bool, "beta0": float,
        "lr1": float, "steps1": int, "lr2": float, "steps2": int, "gradient": str, "schedule": str,
        "record_every": int, "checkpoint_every": int, "sweep": bool, "out": str, "max_sequences": int,
        "n": int, "stage2": str, "samples": int, "sample_seed": int,
    }


def load_config_file(path) -> dict:
    """Read a TOML config; keys are the flag names (``S``, ``lr1``, ...)."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise CLIError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CLIError(f"config file {path} is not valid TOML: {exc}") from None
    types = _types()
    out = {}
    for key, value in data.items():
        if key not in types:
            raise CLIError(f"config file {path}: unknown key {key!r} (known: {', '.join(sorted(types))})")
        want = types[key]
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise CLIError(f"config file {path}: {key} must be {want.__name__}, got {value!r}")
        out[key] = value
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
    return cfg


# ------------------------------------------------------------------ parser
def _add_task_flags(p):
    p.add_argument("--config", metavar="FILE.toml", help="settings file; flags override it")
    p.add_argument("--graph", help="chain | icl | random | ngram | two-parent | a parents string such as "
                                   "-1,0,0,1,-1 (default chain)")
    p.add_argument("--n", type=int, help="n of --graph ngram: n-1 parents per token (default 3)")
    p.add_argument("--S", type=int, help=f"alphabet size (default {DEFAULTS['S']})")
    p.add_argument("--T", type=int, help=f"sequence length incl. the query (default {DEFAULTS['T']})")
    p.add_argument("--alpha", type=float, help="Dirichlet concentration of the prior (default 1.0)")
    p.add_argument("--atoms", type=int, help="Dirichlet draws before relabeling closure (default 8)")
    p.add_argument("--seed", type=int, help="seed of the prior (and of --graph random) (default 0)")
    p.add_argument("--uniform-mean", dest="uniform_mean", action="store_true", default=None,
                   help="reweight the prior's draws so that E[pi] = 11^T/S (paper Assumption 3)")
    p.add_argument("--max-sequences", dest="max_sequences", type=int, help="limit on S**T (default 2**25)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="popgrad", description="Exact population gradients for causal-structure learning.")
    p.add_argument("--version", action="version", version=f"popgrad {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run Algorithm 1 exactly, check the theorems, write a report")
    _add_task_flags(r)
    r.add_argument("--beta0", type=float, help="A2(0) = beta0 * I (default 1e-3)")
    r.add_argument("--lr1", type=float, help="Stage-1 rate, natural units: eta1 = lr1*S*T/beta0 (default 2)")
    r.add_argument("--steps1", type=int, help="Stage-1 steps tau1 (default 300)")
    r.add_argument("--lr2", type=float, help="Stage-2 rate, natural units: eta2 = lr2*S (default 2)")
    r.add_argument("--steps2", type=int, help="Stage-2 steps tau2 (default 300)")
    r.add_argument("--gradient", choices=("auto",) + GRADIENTS,
                   help="Stage-1 gradient: exact (enumeration), field (the exact first-order field, any T) or "
                        "idealized (Knowl 3); default auto: exact when S**T <= --max-sequences, else field")
    r.add_argument("--schedule", choices=SCHEDULES, help="Algorithm 1 or joint training")
    r.add_argument("--stage2", choices=("auto",) + STAGE2_METHODS,
                   help="Stage 2 on the exact population, or sampled (sample-average approximation on a fixed "
                        "sample; every number it gives is labelled sampled, with its standard error); default auto: "
                        "exact when S**T <= --max-sequences")
    r.add_argument("--samples", type=int, help="sample size of a sampled Stage 2 (default 0: chosen from a pilot "
                                               "sample so that the loss's standard error is <= 1e-3)")
    r.add_argument("--sample-seed", dest="sample_seed", type=int, help="seed of the Stage-2 sample (default 0)")
    r.add_argument("--record-every", dest="record_every", type=int, help="record every N steps (default 10)")
    r.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, help="checkpoint every N steps (default 100)")
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
    args = _parser().parse_args(_join_graph_value(argv))
    if args.command == "sweep":
        from .sweep import main_sweep  # imports Dask: only for this command

        return main_sweep(args)
    try:
        cfg = resolve_config(args)
        if args.command == "summary":
            task = build_task(cfg)
            print(task.summary())
            total = sum(float(w.sum()) for _, w in task.enumerate())
            print(f"exact weight total: {total!r} (1 - total = {1 - total:.3e})")
        else:
            run(cfg, resume=args.resume, progress=not args.no_progress, scheduler=getattr(args, "scheduler", None))
    except (ValueError, CLIError) as exc:
        print(f"popgrad: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("popgrad: interrupted (the last checkpoint is kept; continue with --resume)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
