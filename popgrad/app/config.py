"""The one validator of a run's settings: flags, ``--config FILE.toml`` and sweep specs.

* :data:`ARG_SPECS` -- every config key, with its kind and range;
* :func:`check_value` -- one value converted and range-checked (the strings of
  the command line and the typed values of TOML alike);
* :func:`load_toml` -- a TOML file read with one-line errors (unreadable, not
  TOML, not UTF-8);
* :func:`load_config_file` -- ``popgrad run --config`` (keys checked by
  :func:`check_value`);
* :func:`resolve` -- :data:`popgrad.app.jobs.DEFAULTS`, the k-head defaults for a
  multi-parent graph (keys not given), then the given values, then
  :func:`check_conflicts`: settings that contradict each other are refused,
  never silently resolved.

``popgrad run`` (:mod:`popgrad.app.cli`) and ``popgrad sweep``
(:mod:`popgrad.app.sweep`) both use this module; neither imports the other.
"""
from __future__ import annotations

import math

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from .._validation import ArgumentTypeError
from .jobs import DEFAULTS, MULTI_PARENT_DEFAULTS, MULTI_PARENT_GRAPHS, CLIError, CLITypeError, parse_parents

__all__ = ["ARG_SPECS", "check_value", "load_toml", "load_config_file", "resolve", "check_conflicts"]

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
}

#: Options of a command that are not config keys (never in a config file or a sweep spec).
OPTION_SPECS = {"workers": ("int", 1, False)}
_SPECS = {**ARG_SPECS, **OPTION_SPECS}


def _want(key) -> str:
    kind, minimum, strict = _SPECS[key]
    if kind == "int":
        return "an integer" + ("" if minimum is None else f" >= {minimum}")
    if kind == "real":
        return "a finite number" + ("" if minimum is None else f" {'>' if strict else '>='} {minimum:g}")
    return {"bool": "true or false", "str": "a string"}[kind]


def check_value(key, value):
    """``value`` converted and range-checked for config key ``key``.

    Accepts the strings of the command line and the typed values of a config
    file or sweep spec. Raises :class:`popgrad._validation.ArgumentTypeError`
    (a ``TypeError``, also a ``ValueError``) for a value of the wrong kind and
    ``ValueError`` for one out of range, both ``"expected ..., got ..."``.
    """
    kind, minimum, strict = _SPECS[key]
    text = f"expected {_want(key)}, got {value!r}"
    if kind in ("str", "bool"):
        if not isinstance(value, str if kind == "str" else bool):
            raise ArgumentTypeError(text)
        return value
    if isinstance(value, bool):
        raise ArgumentTypeError(text)
    if isinstance(value, str):
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
    return value


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


def resolve(values: dict, given=None) -> dict:
    """A full config: :data:`DEFAULTS`, the k-head defaults for a multi-parent graph (keys not in
    ``given``), then ``values``; then :func:`check_conflicts`. ``given`` defaults to ``values``' keys."""
    given = set(values) if given is None else set(given)
    cfg = dict(DEFAULTS)
    cfg.update(values)
    if cfg["graph"] in MULTI_PARENT_GRAPHS:  # k-head training defaults, unless given
        for key, value in MULTI_PARENT_DEFAULTS.items():
            if key not in given:
                cfg[key] = value
    check_conflicts(cfg, given)
    return cfg


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
