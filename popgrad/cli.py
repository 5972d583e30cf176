"""Command-line interface: ``popgrad summary`` (the default task's summary)."""
from __future__ import annotations

import argparse
import sys

from . import __version__
from .graphs import CausalGraph, chain, icl_pairs, random_tree
from .priors import dirichlet_prior
from .task import Task

DEFAULTS = dict(graph="chain", S=3, T=10, alpha=1.0, atoms=8, seed=0)


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


def build_graph(spec: str, T: int, seed: int) -> CausalGraph:
    if spec == "chain":
        return chain(T)
    if spec == "icl":
        return icl_pairs(T)
    if spec == "random":
        return random_tree(T, seed=seed, root_prob=0.2)
    if "," in spec:
        return CausalGraph.from_string(spec)
    raise ValueError(
        f"unknown --graph {spec!r}: use chain, icl, random, or a parents string such as -1,0,0,1,-1"
    )


def build_task(cfg: dict) -> Task:
    graph = build_graph(cfg["graph"], cfg["T"], cfg["seed"])
    prior = dirichlet_prior(cfg["S"], cfg["alpha"], cfg["atoms"], seed=cfg["seed"], symmetrize=True)
    return Task(graph, prior)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="popgrad", description=__doc__)
    p.add_argument("--version", action="version", version=f"popgrad {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summary", help="print the task's graph, prior diagnostics and sizes")
    s.add_argument("--graph", default=DEFAULTS["graph"])
    s.add_argument("--S", type=int, default=DEFAULTS["S"])
    s.add_argument("--T", type=int, default=DEFAULTS["T"])
    s.add_argument("--alpha", type=float, default=DEFAULTS["alpha"])
    s.add_argument("--atoms", type=int, default=DEFAULTS["atoms"])
    s.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = {k: getattr(args, k) for k in DEFAULTS}
        task = build_task(cfg)
        print(task.summary())
        total = sum(float(w.sum()) for _, w in task.enumerate())
        print(f"exact weight total: {total!r} (1 - total = {1 - total:.3e})")
    except (ValueError, CLIError) as exc:
        print(f"popgrad: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
