"""The task of a run, shared by every kind of run: its flags, defaults and how it is built.

* :data:`TASK_FLAGS`, :data:`RUN_FLAGS` -- the config keys every kind has (``popgrad summary`` has
  the task's), with :data:`TASK_DEFAULTS` and :data:`RUN_DEFAULTS`;
* :data:`MULTI_PARENT_GRAPHS`, :data:`MULTI_PARENT_TASK_DEFAULTS` -- ``--graph ngram|two-parent``;
* :func:`build_task`, :func:`build_graph`, :func:`graph_family`, :func:`parse_parents`,
  :func:`check_conflicts` -- one-line :class:`~popgrad.app.settings.CLIError` on bad input.
"""
from __future__ import annotations

import numpy as np

from .._validation import is_int
from ..task import (DEFAULT_MAX_SEQUENCES, CausalGraph, DirichletPrior, DirichletTensorPrior, MultiParentTask, Task,
                    chain, dirichlet_prior, dirichlet_tensor_prior, icl_pairs, ngram, official_random_tree,
                    random_tree, two_parent)
from ..task.priors import MAX_CLOSURE_ATOMS
from ..task.tensor_priors import closure_atoms
from .settings import CLIError, Flag

__all__ = ["TASK_FLAGS", "RUN_FLAGS", "TASK_DEFAULTS", "RUN_DEFAULTS", "MULTI_PARENT_GRAPHS",
           "MULTI_PARENT_TASK_DEFAULTS", "MAX_S", "MAX_T", "build_task", "build_graph", "graph_family",
           "parse_parents", "check_conflicts", "is_multi_parent", "SINGLE_PARENT_GRAPHS", "PRIORS", "ROOTS",
           "FINITE_PRIOR_KEYS"]

#: ``--graph`` families of single-parent graphs (``official-random``: ``popgrad.official_random_tree``).
SINGLE_PARENT_GRAPHS = ("chain", "icl", "random", "official-random")

#: ``--prior``: popgrad's finite prior (the default) or the official continuous Dirichlet prior.
PRIORS = ("finite", "continuous")

#: ``--roots`` of ``--prior continuous``: non-query roots from ``mu_pi`` (``InContextTree``) or uniform
#: (``InContextDAG``; the multi-parent prior's only choice).
ROOTS = ("stationary", "uniform")

#: Settings of the finite prior only (refused with ``--prior continuous`` when given).
FINITE_PRIOR_KEYS = ("atoms", "uniform_mean", "floor")

#: ``--graph`` values that build a multi-parent task.
MULTI_PARENT_GRAPHS = ("ngram", "two-parent")

#: How the finite prior of a multi-parent graph is closed (``dirichlet_tensor_prior``'s ``symmetrize``): its
#: inputs and outputs relabeled independently, ``(S!)²`` atoms per draw.
MULTI_PARENT_SYMMETRY = "full"

#: Largest alphabet and sequence length ``popgrad run`` builds.
MAX_S = 16
MAX_T = 4096

#: The task's settings (every kind of run; also ``popgrad summary``).
TASK_DEFAULTS = dict(graph="chain", S=3, T=10, alpha=1.0, atoms=8, seed=0, prior="finite", roots="stationary",
                     n=3,  # --graph ngram: the n of the n-gram (multi-parent graphs)
                     uniform_mean=True,  # Knowl 10.3 (E[pi] = 11^T/S)
                     floor=0.15,  # Knowl 10.1: min pi >= floor/S (gamma >= 0.15); non-degeneracy >= gamma^2/S
                     max_sequences=DEFAULT_MAX_SEQUENCES)

#: The run's settings (every kind of run).
RUN_DEFAULTS = dict(record_every=10, checkpoint_every=100, out="popgrad_out")

#: Task defaults that replace :data:`TASK_DEFAULTS` for ``--graph ngram|two-parent`` unless given (any model).
MULTI_PARENT_TASK_DEFAULTS = dict(S=2, T=12, atoms=16, floor=0.0)

TASK_FLAGS = (
    Flag("graph", "str", help="chain | icl | random | official-random | ngram | two-parent | a parents string such "
                              "as -1,0,0,1,-1 (default chain; official-random: each parent uniform over {none, 0, "
                              "..., i-1}, as single_parent.py)"),
    Flag("n", "int", 2, help="n of --graph ngram: n-1 parents per token (default 3)"),
    Flag("S", "int", 2, help=f"alphabet size (default {TASK_DEFAULTS['S']})"),
    Flag("T", "int", 2, help=f"sequence length incl. the query (default {TASK_DEFAULTS['T']})"),
    Flag("alpha", "real", 0, True, help="Dirichlet concentration of the prior (default 1.0)"),
    Flag("prior", "str", choices=PRIORS, help="finite: --atoms Dirichlet draws closed under relabeling (the "
                                             "default); continuous: the official prior, a fresh Dirichlet(--alpha) "
                                             "matrix per sequence"),
    Flag("roots", "str", choices=ROOTS, help="--prior continuous: non-query roots from the stationary distribution "
                                             "(default, InContextTree) or uniform (InContextDAG; multi-parent graphs: "
                                             "uniform only)"),
    Flag("atoms", "int", 1, help="Dirichlet draws before relabeling closure (default 8)"),
    Flag("seed", "int", 0, help="seed of the prior (and of --graph random) (default 0)"),
    Flag("uniform_mean", "bool", help="reweight the prior's draws so that E[pi] = 11^T/S (Knowl 10.3; the default)",
         help_off="keep the draws' equal weights (E[pi] not uniform: Knowl 10.3 fails)"),
    Flag("floor", "real", 0, help="mix each prior draw with the uniform matrix: pi = (1-floor) D + floor/S, so "
                                  "min pi >= floor/S (Knowl 10.1 with gamma >= floor; default "
                                  f"{TASK_DEFAULTS['floor']}, 0 for the raw Dirichlet draws)"),
    Flag("max_sequences", "int", 1, help="limit on S**T (default 2**25)"),
)

RUN_FLAGS = (
    Flag("record_every", "int", 1, help="record every N steps (default 10; --model catformer: steps // 128)"),
    Flag("checkpoint_every", "int", 0, help="checkpoint every N steps (default 100)"),
    Flag("out", "str", help="output folder (default popgrad_out)"),
)


def is_multi_parent(values) -> bool:
    """Whether the settings' ``graph`` builds a multi-parent task."""
    return values.get("graph", TASK_DEFAULTS["graph"]) in MULTI_PARENT_GRAPHS


def parse_parents(spec: str):
    """``--graph`` as a parents string, every error naming the flag and the entry at fault."""
    parts = [p.strip() for p in spec.split(",")]
    for i, part in enumerate(parts):
        if not part.lstrip("-").isdigit():
            raise CLIError(f"--graph {spec!r}: entry {i} = {part!r} is not an integer: give parents such as "
                           "-1,0,0,1,-1 (-1 for a root, else an earlier position)")
        v = int(part)
        if i == len(parts) - 1 and v != -1:
            raise CLIError(f"--graph {spec!r}: the last entry (the query) must be -1, got {v}")
        if not -1 <= v < i:
            where = "a root" if i == 0 else f"-1 for a root or a position in 0..{i - 1}"
            raise CLIError(f"--graph {spec!r}: entry {i} = {v} is not a valid parent: position {i} can only have "
                           f"{'-1 (' + where + ')' if i == 0 else where}")
    if not 2 <= len(parts) <= MAX_T:
        raise CLIError(f"--graph {spec!r} has {len(parts)} positions: use 2 <= T <= {MAX_T}")
    try:
        return CausalGraph.from_string(spec)
    except ValueError as exc:
        raise CLIError(f"--graph {spec!r}: {exc}") from None


def check_conflicts(cfg: dict, given: set) -> None:
    """Settings that contradict each other are an error, never silently ignored."""
    spec = cfg["graph"]
    if "T" in given and ("," in spec or spec.lstrip("-").isdigit()):
        T = parse_parents(spec).T  # the graph's own errors first
        if cfg["T"] != T:
            raise CLIError(f"--T {cfg['T']} conflicts with --graph {spec!r}, which has T = {T} positions: "
                           "drop --T (a parents string fixes T)")
    if "n" in given and spec != "ngram":
        raise CLIError(f"--n {cfg['n']} only applies to --graph ngram (got --graph {spec}): drop --n")
    prior = cfg.get("prior", "finite")
    if prior not in PRIORS:
        raise CLIError(f"--prior {prior!r}: use {' or '.join(PRIORS)}")
    roots = cfg.get("roots", "stationary")
    if roots not in ROOTS:
        raise CLIError(f"--roots {roots!r}: use {' or '.join(ROOTS)}")
    if prior == "continuous":
        finite_only = [k for k in FINITE_PRIOR_KEYS if k in given]
        if finite_only:
            flag = "--" + finite_only[0].replace("_", "-")
            raise CLIError(f"{flag} only applies to --prior finite (the continuous prior has no atoms, floor or "
                           f"reweighting): drop {flag}")
        if spec in MULTI_PARENT_GRAPHS and "roots" in given and roots != "uniform":
            raise CLIError(f"--roots {roots} is not available for --graph {spec}: the multi-parent continuous prior "
                           "(InContextDAG) draws roots uniformly: drop --roots")
    elif "roots" in given:
        raise CLIError("--roots only applies to --prior continuous (a finite prior's roots follow each atom's "
                       "stationary distribution): drop --roots or add --prior continuous")


def build_graph(spec: str, T: int, seed: int):
    """The single-parent graph of ``--graph``: a family at ``T`` or a parents string."""
    if spec == "chain":
        return chain(T)
    if spec == "icl":
        return icl_pairs(T)
    if spec == "random":
        return random_tree(T, seed=seed, root_prob=0.2)
    if spec == "official-random":
        return official_random_tree(T, seed=seed)
    if "," in spec or spec.lstrip("-").isdigit():
        return parse_parents(spec)
    raise CLIError(f"unknown --graph {spec!r}: use chain, icl, random, official-random, ngram (with --n), two-parent, "
                   "or a parents string such as -1,0,0,1,-1")


def graph_family(spec: str, seed: int):
    """``T -> graph`` for sweeps, or ``None`` for a fixed parents string."""
    if spec in SINGLE_PARENT_GRAPHS:
        return lambda T: build_graph(spec, T, seed)
    return None


def build_task(cfg) -> Task | MultiParentTask:
    """The task of merged settings: a :class:`popgrad.Task`, or a :class:`popgrad.MultiParentTask` for
    ``graph`` in :data:`MULTI_PARENT_GRAPHS`; ranges checked, one-line :class:`CLIError`."""
    S, T, spec = cfg["S"], cfg["T"], cfg["graph"]
    if not 2 <= S <= MAX_S:
        raise CLIError(f"--S {S} is out of range: use 2 <= S <= {MAX_S}")
    if (spec in SINGLE_PARENT_GRAPHS or spec in MULTI_PARENT_GRAPHS) and not 2 <= T <= MAX_T:
        raise CLIError(f"--T {T} is out of range: use 2 <= T <= {MAX_T}")
    if not cfg["alpha"] > 0:
        raise CLIError(f"--alpha {cfg['alpha']} must be > 0 (Dirichlet concentration)")
    continuous = cfg.get("prior", "finite") == "continuous"
    floor = 0.0 if continuous else cfg.get("floor", 0.0)
    if not 0 <= floor < 1:
        raise CLIError(f"--floor {floor} must be in [0, 1): the weight of the uniform matrix in each draw")
    if spec in MULTI_PARENT_GRAPHS and not continuous:
        # the k-parent closure (inputs and outputs relabeled independently) is built: refuse one too large first
        n_relabel = closure_atoms(S, 1, MULTI_PARENT_SYMMETRY)
        if cfg["atoms"] * n_relabel > MAX_CLOSURE_ATOMS:
            most = MAX_CLOSURE_ATOMS // n_relabel
            fix = f"use --atoms {most} or fewer, or --prior continuous" if most >= 1 else \
                "use a smaller --S, or --prior continuous"
            raise CLIError(f"--S {S} --atoms {cfg['atoms']}: the prior closed under all ({S}!)² relabelings of "
                           f"its inputs and outputs has {cfg['atoms'] * n_relabel:,} atoms "
                           f"(limit {MAX_CLOSURE_ATOMS:,}): {fix}")
    if spec in MULTI_PARENT_GRAPHS:
        if spec == "ngram":
            n = cfg.get("n", 3)
            if not is_int(n) or not 2 <= n <= T:
                raise CLIError(f"--n {n} is out of range for --graph ngram: use 2 <= n <= T = {T}")
            graph = ngram(T, n)
        else:
            graph = two_parent(T)
        if floor != 0:
            raise CLIError(f"--floor {floor} is not available for multi-parent graphs (their tensor prior "
                           "has no floor): drop --floor")
        if continuous:
            prior = DirichletTensorPrior(S, graph.k, cfg["alpha"])
        else:
            prior = dirichlet_tensor_prior(S, graph.k, cfg["alpha"], cfg["atoms"], seed=cfg["seed"],
                                           symmetrize=MULTI_PARENT_SYMMETRY)
        return MultiParentTask(graph, prior, max_sequences=cfg["max_sequences"])
    graph = build_graph(spec, T, cfg["seed"])
    if continuous and cfg.get("roots", "stationary") == "stationary":
        from ..task.dirichlet import stationary_alpha_problem

        problem = stationary_alpha_problem(S, cfg["alpha"])
        if problem is not None:  # the weights have no method there: refused before anything is built
            raise CLIError("--" + problem.replace("alpha = ", "alpha ", 1).replace("use alpha", "use --alpha")
                           + ", or --roots uniform (exact at every alpha)")
    if continuous:
        return Task(graph, DirichletPrior(S, cfg["alpha"], roots=cfg.get("roots", "stationary")),
                    max_sequences=cfg["max_sequences"])
    kw = dict(seed=cfg["seed"], symmetrize=True, floor=floor)
    try:
        prior = dirichlet_prior(S, cfg["alpha"], cfg["atoms"], uniform_mean=cfg["uniform_mean"], **kw)
    except ValueError as exc:
        if not (cfg["uniform_mean"] and "reweight" in str(exc)):
            raise
        # every draw's trace is on one side of 1: no tilt gives a uniform mean. Keep equal weights; the
        # report's hypotheses table shows Knowl 10.3 failing and says why (UNIFORM_MEAN_IMPOSSIBLE).
        prior = dirichlet_prior(S, cfg["alpha"], cfg["atoms"], uniform_mean=False, **kw)
    return Task(graph, prior, max_sequences=cfg["max_sequences"])


def too_large(task):
    """``(what the enumeration needs, how to make it smaller)`` for the one-line errors."""
    if task.n_sequences > task.max_sequences or isinstance(task, MultiParentTask) or task.prior.K is None:
        n = task.n_sequences
        count = f"{n:,}" if n < 10**15 else f"about 10^{task.T * np.log10(task.S):.0f}"
        return (f"S**T = {task.S}**{task.T} = {count} sequences (over --max-sequences {task.max_sequences:,})",
                "a smaller S or T, or a larger --max-sequences")
    return (f"all {task.prior.K:,} atoms of the prior ({task.prior.base.K} draws x {task.S}! relabelings)",
            "fewer --atoms or a smaller S")
