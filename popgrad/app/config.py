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

#: Options of a command that are not config keys (never in a config file or a sweep spec).
OPTION_FLAGS = (Flag("workers", "int", 1),)
OPTION_SPECS = {f.key: f.spec for f in OPTION_FLAGS}


def _flag(key) -> Flag:
    for f in flags() + OPTION_FLAGS:
        if f.key == key:
            return f
    raise KeyError(key)


def check_value(key, value):
    """``value`` converted and range-checked for config key ``key`` (:meth:`popgrad.app.settings.Flag.check`).

    Accepts the strings of the command line and the typed values of a config file or sweep spec.
    Raises :class:`popgrad._validation.ArgumentTypeError` (a ``TypeError``, also a ``ValueError``) for a
    value of the wrong kind and ``ValueError`` for one out of range, both ``"expected ..., got ..."``.
    """
    return _flag(key).check(value)


def checked(key, value, where: str):
    """:func:`check_value` with the error as one :class:`CLIError` line ``"{where}: {key}: expected ..."``."""
    try:
        return check_value(key, value)
    except TypeError as exc:
        raise CLITypeError(f"{where}: {key}: {exc}") from None
    except ValueError as exc:
        raise CLIError(f"{where}: {key}: {exc}") from None


def load_toml(path, what: str) -> dict:
    """A TOML file as a dict; every problem one :class:`CLIError` line naming ``what`` and ``path``."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise CLIError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
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
        out[key] = checked(key, value, f"config file {path}")
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
