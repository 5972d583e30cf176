"""The one run configuration of ``popgrad run``, ``popgrad sweep`` and :func:`popgrad.app.jobs.run`.

Generic over the kinds of run (:mod:`popgrad.app.kinds`, one module each): this module knows none of them.

* :data:`ARG_SPECS` -- every config key (the task's and the run's, :mod:`popgrad.app.tasks`, and each
  registered kind's flags), with its kind and range, and :func:`check_value`, the one converter and
  range check (the strings of the command line and the typed values of TOML alike);
* :func:`load_toml`, :func:`load_config_file` -- ``--config FILE.toml`` with one-line errors;
* :func:`merge` -- the defaults of the run's kind, then the given values; settings that
  contradict each other (or belong to another kind of run) are refused, never silently resolved;
* :func:`resolve` -- :func:`merge`, then :func:`settle`: the frozen :class:`RunConfig` with the
  task built, ``T`` fixed, every ``"auto"`` resolved and the trainer's config object validated once.

:data:`DEFAULTS`, :data:`MULTI_PARENT_DEFAULTS` and :data:`CATFORMER_DEFAULTS` are the built-in kinds'
defaults (defined in their modules). ``popgrad run`` (:mod:`popgrad.app.cli`) and ``popgrad sweep``
(:mod:`popgrad.app.sweep`) both use this module; neither imports the other.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from .kinds import KINDS, RunConfig, flags, kind_of, models
from .kinds.catformer import CATFORMER_DEFAULTS
from .kinds.reduced_k_head import MULTI_PARENT_DEFAULTS
from .kinds.reduced_single import DEFAULTS
from .._validation import ArgumentTypeError
from .settings import CLIError, CLITypeError, Flag, flag_name
from .tasks import (MAX_S, MAX_T, MULTI_PARENT_GRAPHS, MULTI_PARENT_TASK_DEFAULTS, RUN_FLAGS, TASK_FLAGS,
                    check_conflicts, parse_parents)

__all__ = ["DEFAULTS", "MULTI_PARENT_DEFAULTS", "CATFORMER_DEFAULTS", "MULTI_PARENT_GRAPHS", "MODELS", "ARG_SPECS",
           "CLIError", "CLITypeError", "RunConfig", "check_value", "load_toml", "load_config_file", "merge",
           "resolve", "settle", "check_conflicts", "MAX_S", "MAX_T", "parse_parents",
           "MULTI_PARENT_TASK_DEFAULTS"]

#: Keys of the task (every kind) and of the run (every kind).
TASK_KEYS = tuple(f.key for f in TASK_FLAGS)
RUN_KEYS = tuple(f.key for f in RUN_FLAGS)


class _Registry(Mapping):
    """A read-only view computed from the registry of kinds on every access (a kind registered later counts)."""

    def __init__(self, build):
        self._build = build

    def __getitem__(self, key):
        return self._build()[key]

    def __iter__(self):
        return iter(self._build())

    def __len__(self):
        return len(self._build())

    def __repr__(self):
        return repr(self._build())


#: ``--model`` values of the registered kinds (the first is the default).
MODELS = _Registry(lambda: {m: m for m in models()})

#: key -> (kind, minimum, strict) of every config key. ``kind`` is "int", "real", "bool" or "str"; a real is
#: checked ``> minimum`` when strict, else ``>= minimum``. Built from the :class:`~popgrad.app.settings.Flag` s.
ARG_SPECS = _Registry(lambda: {f.key: f.spec for f in flags()})

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
OPTION_FLAGS = (Flag("workers", "int", 1),)
OPTION_SPECS = {f.key: f.spec for f in OPTION_FLAGS}


def _flag(key) -> Flag:
    for f in flags() + OPTION_FLAGS:
        if f.key == key:
            return f
    raise KeyError(key)


def _want(key) -> str:
    """What a value of ``key`` must be, as the errors say it, with its maximum (issue 32)."""
    flag = _flag(key)
    top = ARG_MAXIMA.get(key) if flag.kind == "int" else REAL_MAXIMA.get(key) if flag.kind == "real" else None
    if top is None:
        return flag.want()
    return flag.want() + (f" and <= {top:,}" if flag.kind == "int" else f" and <= {top:g}")


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
            return value  # refused by --heads' own parser
        raise ValueError(text)
    return ",".join(str(p) for p in parts)


#: Keys whose value has one canonical spelling (so equal settings are equal cells and equal configs).
_CANONICAL = {"heads": (_canonical_heads, "head counts per layer, each >= 1, e.g. 2,1 (or [2, 1] in TOML)")}
#: Integer keys where some values inside the range mean nothing: key -> (refused values, what to say).
_REFUSED = {"samples": ({1}, "0 (chosen from a pilot sample) or >= 2 (a standard error needs two draws)")}


def check_value(key, value, typed: bool = False):
    """``value`` converted and range-checked for config key ``key`` (:meth:`popgrad.app.settings.Flag.check`,
    then the maxima of issue 32).

    Accepts the strings of the command line and, with ``typed`` (a config file or sweep spec), the
    typed values of TOML: there a number or a bool written as a string (``lr = "0.1"``) is refused
    like any other wrong type. Raises :class:`popgrad._validation.ArgumentTypeError`
    (a ``TypeError``, also a ``ValueError``) for a value of the wrong kind and
    ``ValueError`` for one out of range, both ``"expected ..., got ..."``.
    """
    flag = _flag(key)
    if key in _CANONICAL:
        fn, what = _CANONICAL[key]
        return fn(value, f"expected {what}, got {_shown(value)}")
    text = f"expected {_want(key)}, got {_shown(value)}"
    if typed and flag.kind != "str" and isinstance(value, str):
        raise ArgumentTypeError(f"{text} (a string: write the value without quotes)")
    if flag.kind in ("int", "real") and isinstance(value, str) and len(value) > 64:
        # no number popgrad takes is this long; never parse 4300-digit strings
        raise (ValueError if value.strip().lstrip("+-").isdigit() else ArgumentTypeError)(text)
    try:
        value = flag.check(value)
    except ArgumentTypeError:
        raise ArgumentTypeError(text) from None
    except ValueError:
        raise ValueError(text) from None
    if flag.kind in ("int", "real"):
        top = ARG_MAXIMA.get(key, MAX_INT) if flag.kind == "int" else REAL_MAXIMA.get(key, math.inf)
        if value > top:
            why = _MAX_WHY.get(key)
            raise ValueError(text + (f" ({why})" if why else ""))
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
    depth = toml_depth(text, MAX_TOML_DEPTH)
    if depth > MAX_TOML_DEPTH:
        raise CLIError(f"{what} {path} nests arrays, tables or dotted keys more than {MAX_TOML_DEPTH} levels deep: a "
                       f"{what} holds flat settings (key = value, lists of values)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CLIError(f"{what} {path} is not valid TOML: {' '.join(str(exc).split())}") from None
    except RecursionError:  # a nesting the scan above missed: still one line
        raise CLIError(f"{what} {path} nests arrays or tables too deeply to read: a {what} holds flat "
                       f"settings (key = value, lists of values)") from None
    if _data_depth(data, MAX_TOML_DEPTH) > MAX_TOML_DEPTH:  # dotted keys (a.b.c = 1) nest without brackets
        raise CLIError(f"{what} {path} nests tables more than {MAX_TOML_DEPTH} levels deep (dotted keys): a "
                       f"{what} holds flat settings (key = value, lists of values)")
    return data


#: Deepest nesting of arrays and tables a config file or sweep spec may have (a sweep spec needs 3:
#: ``[[cells]]`` of tables of lists); the TOML parser recurses per level, so a deeper file is refused first.
MAX_TOML_DEPTH = 32

_TOML_TOKENS = None


def toml_depth(text: str, stop: int) -> int:
    """How deep TOML ``text`` nests: arrays, tables and the parts of a dotted key (``a.b.c = 1``: 3), outside
    strings and comments; stops past ``stop``.

    One regular-expression scan with a small state machine (no recursion, no parse): strings (basic,
    literal, multi-line) and comments are skipped; a bracket opens a level (a table header ``[[cells]]``
    counts 2); a dot counts only inside a key (at the start of a line, in a header, after ``{`` or an inline
    table's ``,``, before its ``=``), never in a value (``1.5``).
    """
    import re

    global _TOML_TOKENS
    if _TOML_TOKENS is None:
        _TOML_TOKENS = re.compile(r'"""(?:\\.|[^\\])*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:\\.|[^"\\\n])*"|'
                                  r"'[^'\n]*'|#[^\n]*|[\[\]{}=,.\n]")
    stack = []  # "h" a table header, "[" an array, "{" an inline table
    key, dots, deepest = True, 0, 0
    for m in _TOML_TOKENS.finditer(text):
        c = m.group()
        if c == "[" or c == "{":
            stack.append("h" if c == "[" and key and (not stack or stack[-1] == "h") else c)
            key = c == "{" or stack[-1] == "h"
            dots = 0
            deepest = max(deepest, len(stack))
        elif c == "]" or c == "}":
            if stack:
                stack.pop()
            key = False
        elif c == "=":
            key, dots = False, 0
        elif c == ",":
            if stack and stack[-1] == "{":
                key, dots = True, 0
        elif c == "\n":
            if not stack:
                key, dots = True, 0
        elif c == "." and key:
            dots += 1
            deepest = max(deepest, dots + 1 + len(stack))
        if deepest > stop:
            break
    return deepest


def _data_depth(data, stop: int) -> int:
    """The nesting depth of parsed TOML (dicts and lists), without recursion; stops past ``stop``."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > stop:
                break
            todo.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def load_config_file(path) -> dict:
    """Read a ``--config`` TOML file; keys are the flag names (``S``, ``lr1``, ...), each value checked."""
    data = load_toml(path, "config file")
    out = {}
    for key, value in data.items():
        if key not in ARG_SPECS:
            raise CLIError(f"config file {path}: unknown key {key!r} (known: {', '.join(sorted(ARG_SPECS))})")
        out[key] = checked(key, value, f"config file {path}", typed=True)
    return out


def merge(values: Mapping, given=None) -> dict:
    """The full settings of a run as a dict: the defaults of its kind, then ``values``; conflicts refused.

    The kind is :func:`popgrad.app.kinds.kind_of` ``values``; its ``defaults`` come first (the default
    model's record no ``model`` key; a flag's own ``default`` for a key not among them), then ``values``, then its ``graph_defaults`` for the keys not in
    ``given`` (default: ``values``' keys, the keys set by the user). A key of another kind of run is
    refused, naming the ``--model`` it belongs to.
    """
    given = set(values) if given is None else set(given)
    kind = kind_of(values)
    mine = set(kind.defaults) | {f.key for f in kind.flags} | set(TASK_KEYS) | set(RUN_KEYS) | {"model"}
    other = [k for k in values if k in given and k not in mine and k in ARG_SPECS]
    if other:
        raise CLIError(_foreign(other[0], kind, "model" in given))
    cfg = dict(kind.defaults)
    cfg.update({f.key: f.default for f in kind.flags if f.default is not None and f.key not in cfg})
    cfg.update({k: v for k, v in values.items() if k != "model" or "model" in kind.defaults})
    cfg.update({k: v for k, v in kind.graph_defaults(cfg).items() if k not in given})
    check_conflicts(cfg, given)
    kind.check_conflicts(cfg, given)
    return cfg


def _foreign(key: str, kind, model_given: bool) -> str:
    """The error for ``key``, a setting of another kind of run than ``kind``."""
    owners = list(dict.fromkeys(k.model for k in KINDS.values() if any(f.key == key for f in k.flags)))
    text = f"{flag_name(key)} only applies to --model {' or '.join(owners)}"
    if model_given or kind.model != models()[0]:
        own = ", ".join(f.flag for f in kind.flags)
        return text + (f" (--model {kind.model} trains with {own})" if own else "") + ": drop it"
    return text + f": drop it, or add --model {owners[0]}"


def settle(cfg: Mapping) -> RunConfig:
    """The :class:`RunConfig` of merged settings (:func:`merge`'s result, or a full dict such as
    ``dict(DEFAULTS, S=2)``): the kind looked up once, its task built, its trainer's config resolved and
    validated; every problem one :class:`CLIError` line."""
    if isinstance(cfg, RunConfig):
        return cfg
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
