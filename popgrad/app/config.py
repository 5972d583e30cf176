"""The one run configuration of ``popgrad run``, ``popgrad sweep`` and :func:`popgrad.app.jobs.run`.

This module owns every setting of a run:

* :data:`DEFAULTS` (the reduced model, single-parent), :data:`MULTI_PARENT_DEFAULTS`
  (the reduced k-head model; its training values are :class:`popgrad.MultiHeadTrainConfig`'s, one
  value each) and :data:`CATFORMER_DEFAULTS` (``--model catformer``);
* :data:`ARG_SPECS` -- every config key, with its kind and range, and :func:`check_value`, the one
  converter and range check (the strings of the command line and the typed values of TOML alike);
* :func:`load_toml`, :func:`load_config_file` -- ``--config FILE.toml`` with one-line errors;
* :func:`merge` -- the defaults of the run's kind, then the given values; settings that
  contradict each other (or belong to another model) are refused, never silently resolved;
* :func:`resolve` -- :func:`merge`, then :func:`settle`: the frozen :class:`RunConfig` with the
  task built, ``T`` fixed, every ``"auto"`` resolved (one rule,
  :func:`popgrad.train.config.resolve_auto`) and the trainer's config object validated once.

``popgrad run`` (:mod:`popgrad.app.cli`) and ``popgrad sweep`` (:mod:`popgrad.app.sweep`) both use
this module; neither imports the other. What differs between the kinds of run is in
:mod:`popgrad.app.kinds` (one record per kind).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from .._validation import ArgumentTypeError
from ..task import DEFAULT_MAX_SEQUENCES, CausalGraph
from ..train.config import MultiHeadTrainConfig, TrainConfig

__all__ = ["DEFAULTS", "MULTI_PARENT_DEFAULTS", "CATFORMER_DEFAULTS", "MULTI_PARENT_GRAPHS", "MODELS", "ARG_SPECS",
           "CLIError", "CLITypeError", "RunConfig", "check_value", "load_toml", "load_config_file", "merge",
           "resolve", "settle", "check_conflicts"]


class CLIError(ValueError):
    """A user error (a ``ValueError``): printed as one line by the CLI, exit status 2."""


class CLITypeError(CLIError, TypeError):
    """A user error of the wrong type (a ``TypeError``, also a :class:`CLIError`)."""


#: ``--graph`` values that build a multi-parent task.
MULTI_PARENT_GRAPHS = ("ngram", "two-parent")

#: ``--model`` values: the reduced two-layer model of the paper (Algorithm 1, or k heads) and the
#: full disentangled transformer (:class:`popgrad.CatFormer`, trained jointly).
MODELS = ("reduced", "catformer")

#: Largest alphabet and sequence length ``popgrad run`` builds.
MAX_S = 16
MAX_T = 4096

_TRAIN = TrainConfig()
_MULTI = MultiHeadTrainConfig()

#: Built-in defaults of ``popgrad run`` (the reduced model on the induction-head task); the training
#: values are :class:`popgrad.TrainConfig`'s.
DEFAULTS = dict(
    graph="chain", S=3, T=10, alpha=1.0, atoms=8, seed=0,
    n=3,  # --graph ngram: the n of the n-gram (multi-parent graphs)
    uniform_mean=True,  # Knowl 10.3 (E[pi] = 11^T/S)
    floor=0.15,  # Knowl 10.1: min pi >= floor/S (gamma >= 0.15); non-degeneracy 0.017 >= gamma^2/S
    beta0=_TRAIN.beta0, lr1=_TRAIN.lr1, steps1=_TRAIN.steps1, lr2=_TRAIN.lr2, steps2=_TRAIN.steps2,
    gradient="auto", stage2="auto", samples=_TRAIN.samples, sample_seed=_TRAIN.sample_seed,
    schedule=_TRAIN.schedule, record_every=_TRAIN.record_every, checkpoint_every=100, sweep=True,
    out="popgrad_out", max_sequences=DEFAULT_MAX_SEQUENCES,
)

#: Task defaults that replace :data:`DEFAULTS` for ``--graph ngram|two-parent`` unless given (any model).
MULTI_PARENT_TASK_DEFAULTS = dict(S=2, T=12, atoms=16, floor=0.0)

#: Defaults that replace :data:`DEFAULTS` for the reduced model on ``--graph ngram|two-parent`` unless
#: given in the config file or by a flag: k heads train jointly from a seeded start (the training values
#: are :class:`popgrad.MultiHeadTrainConfig`'s, as in :func:`popgrad.train_multi_head`).
MULTI_PARENT_DEFAULTS = dict(
    MULTI_PARENT_TASK_DEFAULTS, beta0=_MULTI.beta0, lr1=_MULTI.lr1, steps1=_MULTI.steps1, lr2=_MULTI.lr2,
    steps2=_MULTI.steps2, schedule=_MULTI.schedule, record_every=50, checkpoint_every=500,
)

#: Keys of the task (every model) and of the run (every model).
TASK_KEYS = ("graph", "S", "T", "alpha", "atoms", "seed", "n", "uniform_mean", "floor", "max_sequences")
RUN_KEYS = ("record_every", "checkpoint_every", "out")

#: Defaults of ``--model catformer`` (the official single-parent recipe: SGD, lr 1, cosine decay, zero
#: start); ``record_every`` not given is ``max(1, steps // 128)`` (the official ``n_save = 128``).
CATFORMER_DEFAULTS = dict(model="catformer", heads="1,1", optimizer="sgd", lr=1.0, lr_schedule="cosine",
                          weight_decay=0.0, init_scale=0.0, init_seed=0, steps=300)

#: Keys only the reduced model has.
REDUCED_KEYS = tuple(k for k in DEFAULTS if k not in TASK_KEYS + RUN_KEYS)


#: key -> (kind, minimum, strict). ``kind`` is "int", "real", "bool" or "str"; a real is checked
#: ``> minimum`` when strict, else ``>= minimum``.
ARG_SPECS = {
    "graph": ("str", None, False), "S": ("int", 2, False), "T": ("int", 2, False), "alpha": ("real", 0, True),
    "atoms": ("int", 1, False), "seed": ("int", 0, False), "uniform_mean": ("bool", None, False),
    "floor": ("real", 0, False),
    "beta0": ("real", 0, True), "lr1": ("real", 0, False), "steps1": ("int", 0, False), "lr2": ("real", 0, False),
    "steps2": ("int", 0, False), "gradient": ("str", None, False), "schedule": ("str", None, False),
    "record_every": ("int", 1, False), "checkpoint_every": ("int", 0, False), "sweep": ("bool", None, False),
    "out": ("str", None, False), "max_sequences": ("int", 1, False), "n": ("int", 2, False),
    "stage2": ("str", None, False), "samples": ("int", 0, False), "sample_seed": ("int", 0, False),
    "model": ("str", None, False), "heads": ("str", None, False), "optimizer": ("str", None, False),
    "lr": ("real", 0, True), "lr_schedule": ("str", None, False), "weight_decay": ("real", 0, False),
    "init_scale": ("real", 0, False), "init_seed": ("int", 0, False), "steps": ("int", 1, False),
}

#: Largest integer each key takes (issue 32: counts are refused before anything is sized by them);
#: any other integer key at most :data:`MAX_INT` (an int64).
MAX_INT = 2**63 - 1
MAX_STEPS = 10**9
MAX_ATOMS = 100_000
ARG_MAXIMA = {"steps1": MAX_STEPS, "steps2": MAX_STEPS, "steps": MAX_STEPS, "record_every": MAX_STEPS,
              "checkpoint_every": MAX_STEPS, "atoms": MAX_ATOMS, "n": 64}
#: Largest value of a real key (``init_scale``: logits of ``scale·N(0,1)`` beyond it saturate every softmax,
#: and at 1e308 the start itself overflows).
REAL_MAXIMA = {"init_scale": 1e3}
#: Why a key has its maximum (appended to the refusal).
_MAX_WHY = {"atoms": "the prior's draws are held in memory and every step sums over them: use fewer --atoms",
            "init_scale": "attention logits of init_scale*N(0,1) saturate every softmax; the official two-parent "
                          "start is 1e-4"}

#: Options of a command that are not config keys (never in a config file or a sweep spec).
OPTION_SPECS = {"workers": ("int", 1, False)}
_SPECS = {**ARG_SPECS, **OPTION_SPECS}


def _want(key) -> str:
    kind, minimum, strict = _SPECS[key]
    if kind == "int":
        top = ARG_MAXIMA.get(key)
        return "an integer" + ("" if minimum is None else f" >= {minimum}") + ("" if top is None else f" and <= {top:,}")
    if kind == "real":
        top = REAL_MAXIMA.get(key)
        return ("a finite number" + ("" if minimum is None else f" {'>' if strict else '>='} {minimum:g}")
                + ("" if top is None else f" and <= {top:g}"))
    return {"bool": "true or false", "str": "a string"}[kind]


def _canonical_heads(value, text):
    """``heads`` in one spelling: ``"1, 1"``, ``"01,1"`` and TOML ``[1, 1]`` are all ``"1,1"`` (one sweep cell)."""
    if isinstance(value, (list, tuple)):
        parts = list(value)
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
            raise ArgumentTypeError(text)
    elif isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isdigit() and len(p) <= 64 for p in parts):
            return value  # not a list of head counts: refused by --heads' own parser, with its message
        parts = [int(p) for p in parts]
    else:
        raise ArgumentTypeError(text)
    if not parts or any(p < 1 for p in parts):
        if isinstance(value, str):
            return value  # refused by --heads' own parser (popgrad.app.kinds.parse_heads)
        raise ValueError(text)
    return ",".join(str(p) for p in parts)


#: Keys whose value has one canonical spelling (so equal settings are equal cells and equal configs).
_CANONICAL = {"heads": (_canonical_heads, "head counts per layer, each >= 1, e.g. 2,1 (or [2, 1] in TOML)")}
#: Integer keys where some values inside the range mean nothing: key -> (refused values, what to say).
_REFUSED = {"samples": ({1}, "0 (chosen from a pilot sample) or >= 2 (a standard error needs two draws)")}


def check_value(key, value, typed: bool = False):
    """``value`` converted and range-checked for config key ``key``.

    Accepts the strings of the command line and, with ``typed`` (a config file or sweep spec), the
    typed values of TOML: there a number or a bool written as a string (``lr = "0.1"``) is refused
    like any other wrong type. Raises :class:`popgrad._validation.ArgumentTypeError`
    (a ``TypeError``, also a ``ValueError``) for a value of the wrong kind and
    ``ValueError`` for one out of range, both ``"expected ..., got ..."``.
    """
    kind, minimum, strict = _SPECS[key]
    if key in _CANONICAL:
        fn, what = _CANONICAL[key]
        return fn(value, f"expected {what}, got {_shown(value)}")
    text = f"expected {_want(key)}, got {_shown(value)}"
    if typed and kind != "str" and isinstance(value, str):
        raise ArgumentTypeError(f"{text} (a string: write the value without quotes)")
    if kind in ("str", "bool"):
        if not isinstance(value, str if kind == "str" else bool):
            raise ArgumentTypeError(text)
        return value
    if isinstance(value, bool):
        raise ArgumentTypeError(text)
    if isinstance(value, str):
        if len(value) > 64:  # no number popgrad takes is this long; never parse 4300-digit strings
            raise (ValueError if value.strip().lstrip("+-").isdigit() else ArgumentTypeError)(text)
        try:
            value = int(value.strip()) if kind == "int" else float(value.strip())
        except ValueError:
            raise ArgumentTypeError(text) from None
    if kind == "int" and not isinstance(value, int):
        raise ArgumentTypeError(text)
    if kind == "real":
        if not isinstance(value, (int, float)):
            raise ArgumentTypeError(text)
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(text)
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ValueError(text)
    if (kind == "int" and value > ARG_MAXIMA.get(key, MAX_INT)) or (kind == "real" and value > REAL_MAXIMA.get(key, math.inf)):
        why = _MAX_WHY.get(key)
        raise ValueError(f"expected {_want(key)}, got {_shown(value)}" + (f" ({why})" if why else ""))
    if key in _REFUSED and value in _REFUSED[key][0]:
        raise ValueError(f"expected {_REFUSED[key][1]}, got {_shown(value)}")
    return value


def _shown(value) -> str:
    """``repr(value)``, shortened when long (a 5,000-digit integer is named by its size)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def checked(key, value, where: str, typed: bool = False):
    """:func:`check_value` with the error as one :class:`CLIError` line ``"{where}: {key}: expected ..."``."""
    try:
        return check_value(key, value, typed)
    except TypeError as exc:
        raise CLITypeError(f"{where}: {key}: {exc}") from None
    except ValueError as exc:
        raise CLIError(f"{where}: {key}: {exc}") from None


def load_toml(path, what: str) -> dict:
    """A TOML file as a dict; every problem one :class:`CLIError` line naming ``what`` and ``path``."""
    from .._io import read_input_file  # sized before it is read: no FIFO, /dev/zero or huge file

    try:
        raw = read_input_file(path, what)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or raw[:3] == b"\xef\xbb\xbf":
        enc = "UTF-8 with a byte-order mark" if raw[:3] == b"\xef\xbb\xbf" else "UTF-16"
        raise CLIError(f"{what} {path} is {enc} text: save it as UTF-8 (without a byte-order mark)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CLIError(f"{what} {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8 TOML") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CLIError(f"{what} {path} is not valid TOML: {' '.join(str(exc).split())}") from None


def load_config_file(path) -> dict:
    """Read a ``--config`` TOML file; keys are the flag names (``S``, ``lr1``, ...), each value checked."""
    data = load_toml(path, "config file")
    out = {}
    for key, value in data.items():
        if key not in ARG_SPECS:
            raise CLIError(f"config file {path}: unknown key {key!r} (known: {', '.join(sorted(ARG_SPECS))})")
        out[key] = checked(key, value, f"config file {path}", typed=True)
    return out


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def merge(values: Mapping, given=None) -> dict:
    """The full settings of a run as a dict: the defaults of its kind, then ``values``; conflicts refused.

    ``--model reduced`` (the default; ``model`` is then not a key of the result, as before the
    full model existed): :data:`DEFAULTS`, and for a multi-parent graph
    :data:`MULTI_PARENT_DEFAULTS` for the keys not in ``given``. ``--model catformer``: the task and
    run keys of :data:`DEFAULTS` (the multi-parent task defaults for a multi-parent graph) and
    :data:`CATFORMER_DEFAULTS`. ``given`` (default: ``values``' keys) are the keys set by the user.
    """
    given = set(values) if given is None else set(given)
    model = values.get("model", "reduced")
    if model not in MODELS:
        raise CLIError(f"--model {model!r}: use {' or '.join(MODELS)}")
    multi = values.get("graph", DEFAULTS["graph"]) in MULTI_PARENT_GRAPHS
    if model == "reduced":
        other = [k for k in CATFORMER_DEFAULTS if k in given and k != "model"]
        if other:
            raise CLIError(f"{_flag(other[0])} only applies to --model catformer: drop it, or add --model catformer")
        cfg = dict(DEFAULTS)
        defaults = MULTI_PARENT_DEFAULTS
    else:
        other = [k for k in REDUCED_KEYS if k in given]
        if other:
            raise CLIError(f"{_flag(other[0])} only applies to --model reduced (the full model trains with "
                           "--optimizer, --lr, --lr-schedule, --weight-decay, --init-scale, --init-seed, --steps): "
                           "drop it")
        cfg = {k: DEFAULTS[k] for k in TASK_KEYS + RUN_KEYS if k != "record_every"}
        cfg.update(CATFORMER_DEFAULTS)
        defaults = MULTI_PARENT_TASK_DEFAULTS
    cfg.update({k: v for k, v in values.items() if not (k == "model" and model == "reduced")})
    if multi:
        cfg.update({k: v for k, v in defaults.items() if k not in given})
    check_conflicts(cfg, given)
    return cfg


@dataclass(frozen=True, eq=False)
class RunConfig(Mapping):
    """A run's settings, resolved and frozen: a read-only mapping of the config keys, and what they build.

    ``cfg["S"]``, ``cfg.get("gradient")``, ``dict(cfg)`` read the settings (``T`` fixed by the graph,
    every ``"auto"`` resolved); they are what ``report.json`` records under ``config``.

    Attributes
    ----------
    settings : Mapping
        The settings (read-only).
    kind : popgrad.app.kinds.Kind
        The record of this kind of run (trainer, checks, figures).
    task : Task or MultiParentTask
    train : TrainConfig, MultiHeadTrainConfig or CatFormerSettings
        The trainer's config object (validated).
    """

    settings: Mapping
    kind: object
    task: object
    train: object

    def __getitem__(self, key):
        return self.settings[key]

    def __iter__(self):
        return iter(self.settings)

    def __len__(self):
        return len(self.settings)


def settle(cfg: Mapping) -> RunConfig:
    """The :class:`RunConfig` of merged settings (:func:`merge`'s result, or a full dict such as
    ``dict(DEFAULTS, S=2)``): the kind looked up once, its task built, its trainer's config resolved and
    validated; every problem one :class:`CLIError` line."""
    if isinstance(cfg, RunConfig):
        return cfg
    from .kinds import kind_of  # the kind table builds on this module

    kind = kind_of(cfg)
    values = dict(cfg)
    task = kind.build_task(values)
    values["T"] = task.T  # a parents string fixes T
    updates, train = kind.settle(values, task)
    values.update(updates)
    return RunConfig(MappingProxyType(values), kind, task, train)


def resolve(values: Mapping, given=None) -> RunConfig:
    """:func:`merge`, then :func:`settle`: the frozen configuration of a run."""
    return settle(merge(values, given))


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
    if "init_seed" in given and cfg.get("model") == "catformer" and not cfg.get("init_scale"):
        raise CLIError(f"--init-seed {cfg['init_seed']} has no effect at --init-scale 0 (the zero start draws "
                       "nothing; as a sweep axis it would only repeat cells): give --init-scale > 0 "
                       "(e.g. 1e-4, the official two-parent start) or drop --init-seed")
    if cfg.get("stage2") == "exact":  # issue 32: a sample setting of an exact Stage 2 would be ignored
        for key in ("samples", "sample_seed"):
            if key in given and cfg.get(key):
                raise CLIError(f"{_flag(key)} {cfg[key]} conflicts with --stage2 exact, which draws no sample: "
                               f"drop {_flag(key)}, or use --stage2 sampled")
