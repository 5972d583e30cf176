"""Command-line interface.

``popgrad run`` -- the main job: build a task, run Algorithm 1 exactly, check
every theorem, write ``report.json``, ``report.md``, ``trajectory.npz`` and
figures into ``--out``. Settings come from built-in defaults, then
``--config FILE.toml``, then flags (flags win).

``popgrad summary`` -- print a task's graph, prior diagnostics and sizes.

User errors (bad graph string, S or T out of range, S**T over the limit,
negative alpha, unreadable config, ...) exit with status 2 and one line on
stderr, before anything is written.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from . import __version__
from .multirun import MULTI_PARENT_GRAPHS, build_multi_task, run_multi  # the k-head job (multi-parent graphs)

#: Built-in defaults of ``popgrad run`` (the induction-head task).
DEFAULTS = dict(
    graph="chain",
    S=3,
    T=10,
    alpha=1.0,
    atoms=8,
    seed=0,
    n=3,  # --graph ngram: the n of the n-gram (multi-parent graphs, issue 7)
    uniform_mean=False,
    beta0=1e-3,
    lr1=2.0,
    steps1=300,
    lr2=2.0,
    steps2=300,
    gradient="exact",
    schedule="two-stage",
    record_every=10,
    checkpoint_every=100,
    sweep=True,
    out="popgrad_out",
    max_sequences=2**25,
)
TASK_KEYS = ("graph", "S", "T", "alpha", "atoms", "seed")
MAX_S = 8
MAX_T = 4096


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


#: Defaults that replace :data:`DEFAULTS` for ``--graph ngram|two-parent`` unless given in the config
#: file or by a flag: k heads train jointly from a seeded start (see popgrad.multidynamics).
MULTI_PARENT_DEFAULTS = dict(S=2, T=12, atoms=16, beta0=2.0, lr1=2.0, steps1=3000, steps2=0, schedule="joint",
                             record_every=50, checkpoint_every=500)


# ------------------------------------------------------------------ config
def _types():
    return {
        "graph": str, "S": int, "T": int, "alpha": float, "atoms": int, "seed": int, "uniform_mean": bool, "beta0": float,
        "lr1": float, "steps1": int, "lr2": float, "steps2": int, "gradient": str, "schedule": str,
        "record_every": int, "checkpoint_every": int, "sweep": bool, "out": str, "max_sequences": int,
        "n": int,
    }


def load_config_file(path) -> dict:
    """Read a TOML config; keys are the flag names (``S``, ``lr1``, ...)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
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


# ------------------------------------------------------------------- build
def build_graph(spec: str, T: int, seed: int):
    from .graphs import CausalGraph, chain, icl_pairs, random_tree

    if spec == "chain":
        return chain(T)
    if spec == "icl":
        return icl_pairs(T)
    if spec == "random":
        return random_tree(T, seed=seed, root_prob=0.2)
    if "," in spec or spec.lstrip("-").isdigit():
        return CausalGraph.from_string(spec)
    raise CLIError(
        f"unknown --graph {spec!r}: use chain, icl, random, ngram (with --n), two-parent, "
        "or a parents string such as -1,0,0,1,-1"
    )


def graph_family(spec: str, seed: int):
    """``T -> graph`` for sweeps, or ``None`` for a fixed parents string."""
    if spec in ("chain", "icl", "random"):
        return lambda T: build_graph(spec, T, seed)
    return None


def build_task(cfg: dict):
    from .priors import dirichlet_prior
    from .task import Task

    if cfg["graph"] in MULTI_PARENT_GRAPHS:
        return build_multi_task(cfg)

    S, T = cfg["S"], cfg["T"]
    if not 2 <= S <= MAX_S:
        raise CLIError(f"--S {S} is out of range: use 2 <= S <= {MAX_S}")
    if cfg["graph"] in ("chain", "icl", "random") and not 2 <= T <= MAX_T:
        raise CLIError(f"--T {T} is out of range: use 2 <= T <= {MAX_T}")
    if not cfg["alpha"] > 0:
        raise CLIError(f"--alpha {cfg['alpha']} must be > 0 (Dirichlet concentration)")
    graph = build_graph(cfg["graph"], T, cfg["seed"])
    cfg["T"] = graph.T  # a parents string fixes T
    prior = dirichlet_prior(
        S, cfg["alpha"], cfg["atoms"], seed=cfg["seed"], symmetrize=True, uniform_mean=cfg["uniform_mean"]
    )
    return Task(graph, prior, max_sequences=cfg["max_sequences"])


# --------------------------------------------------------------------- run
def check_schedule(cfg: dict) -> None:
    if cfg["schedule"] not in ("two-stage", "joint"):
        raise CLIError(f"--schedule {cfg['schedule']!r}: use two-stage or joint")


def output_paths(cfg: dict, resume: bool):
    """``(out, checkpoint)`` paths, validated before anything is written."""
    out = cfg["out"]
    if os.path.exists(out) and not os.path.isdir(out):
        raise CLIError(f"--out {out} exists and is not a folder: choose another --out")
    ckpt = os.path.join(out, "checkpoint.npz")
    if resume and not os.path.exists(ckpt):
        raise CLIError(f"--resume: no checkpoint at {ckpt}; run once without --resume")
    return out, ckpt


def log_checks(results, out: str, log=print) -> None:
    """One line per check, then where the report is."""
    for c in results:
        if getattr(c, "applicable", True):
            log(f"  [{'PASS' if c.passed else 'FAIL'}] {c.name}: {c.value:.4g} {c.comparison} {c.threshold:.4g}")
        else:
            log(f"  [N/A ] {c.name}: {c.details['reason']}")
    log(f"report: {os.path.join(out, 'report.md')}")


def run(cfg: dict, resume: bool = False, progress: bool = True, log=print) -> dict:
    """The main job. Returns the report dictionary."""
    from . import checks as C
    from .dynamics import TrainConfig, train_two_stage
    from .plots import plot_attention, plot_attention_to_parent, plot_cosine, plot_loss
    from .report import build_report, write_report

    task = build_task(cfg)
    if cfg["graph"] in MULTI_PARENT_GRAPHS:  # k heads: popgrad.multirun
        return run_multi(cfg, task, resume=resume, progress=progress, log=log)
    if cfg["gradient"] not in ("exact", "idealized"):
        raise CLIError(f"--gradient {cfg['gradient']!r}: use exact or idealized")
    check_schedule(cfg)
    # Everything below needs the exact population (checks, Stage 2): guard first.
    task.check_size()
    train_kwargs = dict(
        beta0=cfg["beta0"], lr1=cfg["lr1"], steps1=cfg["steps1"], lr2=cfg["lr2"], steps2=cfg["steps2"],
        gradient=cfg["gradient"], schedule=cfg["schedule"], record_every=cfg["record_every"],
    )
    TrainConfig(**train_kwargs).validate()
    out, ckpt = output_paths(cfg, resume)

    log(task.summary())
    t0 = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    traj = train_two_stage(
        task, **train_kwargs, checkpoint_path=ckpt, checkpoint_every=cfg["checkpoint_every"],
        resume=resume, progress=progress,
    )
    t_train = time.perf_counter() - t0
    log(f"training: {traj.status} after step {int(traj.step[-1])} in {t_train:.1f} s {traj.message}".rstrip())

    refs = C.reference_losses(task)
    A1_hat = traj.A1[traj.stage1_end] if cfg["schedule"] == "two-stage" else traj.final_A1
    family = graph_family(cfg["graph"], cfg["seed"])
    T_sweep = list(range(max(4, (task.T + 1) // 2), task.T + 1)) if cfg["sweep"] and family else None
    results = [
        C.check_graph_recovery(task, A1_hat),
        C.check_gradient_alignment(task, traj, family, T_sweep),
        C.check_loss_convergence(task, traj.final_A1, traj.final_A2, cfg["beta0"], references=refs),
        C.check_ood(task, traj.final_A1, traj.final_A2),
        C.check_roots(task, A1_hat),
    ]
    extra = {"timing_seconds": {"training": t_train, "total": time.perf_counter() - t0}}
    if T_sweep:
        sweep = C.loss_sweep(family, task.prior, T_sweep, train_kwargs)
        extra["loss_sweep"] = {
            "T": sweep["T"], "t_eff": sweep["t_eff"], "excess_over_L_star_eps": sweep["excess"],
            "excess_over_bayes_eps": sweep["excess_bayes"], "fitted_exponent": sweep["fit"].exponent,
            "fitted_exponent_stderr": sweep["fit"].stderr,
        }
        extra["timing_seconds"]["total"] = time.perf_counter() - t0
    report = build_report(cfg, task, traj, results, refs, extra)

    traj.save(os.path.join(out, "trajectory.npz"))
    plot_attention(task.graph, A1_hat, os.path.join(out, "attention.png"))
    plot_loss(traj, refs, os.path.join(out, "loss.png"))
    plot_cosine(traj, os.path.join(out, "gradient_cosine.png"))
    plot_attention_to_parent(traj, task.graph, os.path.join(out, "attention_to_parent.png"))
    write_report(out, report)
    log_checks(results, out, log)
    return report


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
    r.add_argument("--gradient", choices=("exact", "idealized"), help="Stage-1 gradient (default exact)")
    r.add_argument("--schedule", choices=("two-stage", "joint"), help="Algorithm 1 or joint training")
    r.add_argument("--record-every", dest="record_every", type=int, help="record every N steps (default 10)")
    r.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, help="checkpoint every N steps (default 100)")
    r.add_argument("--sweep", dest="sweep", action="store_true", default=None, help="run the T sweeps (default)")
    r.add_argument("--no-sweep", dest="sweep", action="store_false", help="skip the T sweeps")
    r.add_argument("--out", help="output folder (default popgrad_out)")
    r.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.npz")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    s = sub.add_parser("summary", help="print the task's graph, prior diagnostics and sizes")
    _add_task_flags(s)
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
    try:
        cfg = resolve_config(args)
        if args.command == "summary":
            task = build_task(cfg)
            print(task.summary())
            total = sum(float(w.sum()) for _, w in task.enumerate())
            print(f"exact weight total: {total!r} (1 - total = {1 - total:.3e})")
        else:
            run(cfg, resume=args.resume, progress=not args.no_progress)
    except (ValueError, CLIError) as exc:
        print(f"popgrad: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("popgrad: interrupted (the last checkpoint is kept; continue with --resume)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
