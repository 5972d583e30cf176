"""The vocabulary every kind of run shares: user errors, flag specs and the frozen run configuration.

The bottom of :mod:`popgrad.app` (it imports nothing else of it):

* :class:`CLIError`, :class:`CLITypeError` -- a user error, printed as one line (exit status 2);
* :class:`Flag` -- one config key: its kind and range (:meth:`Flag.check`, the one converter of the
  command line's strings and of the typed values of a TOML file), its ``--help`` text and choices.
  The command line's flags and ``--help``, the config-file keys and the sweep keys are all built
  from the :class:`Flag` s of :mod:`popgrad.app.tasks` (task and run) and of each kind of run
  (:mod:`popgrad.app.kinds`): adding a flag to a kind is one ``Flag(...)`` line in its module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .._validation import ArgumentTypeError

__all__ = ["CLIError", "CLITypeError", "Flag", "flag_name"]


class CLIError(ValueError):
    """A user error (a ``ValueError``): printed as one line by the CLI, exit status 2."""


class CLITypeError(CLIError, TypeError):
    """A user error of the wrong type (a ``TypeError``, also a :class:`CLIError`)."""


def flag_name(key: str) -> str:
    """The command-line flag of config key ``key``: ``lr_schedule`` -> ``--lr-schedule``."""
    return "--" + key.replace("_", "-")


_KINDS = ("int", "real", "bool", "str")


@dataclass(frozen=True)
class Flag:
    """One config key of ``popgrad run``: a flag, a config-file key and a sweep key.

    Parameters
    ----------
    key : str
        The config key (``lr_schedule``); the flag is ``--lr-schedule``.
    kind : {"int", "real", "bool", "str"}
    minimum : int or float, optional
        Smallest value (``int``, ``real``); a real is checked ``> minimum`` when ``strict``.
    strict : bool
    help : str
        The ``--help`` text. For a ``bool`` it describes ``--KEY``; ``help_off`` describes ``--no-KEY``.
    choices : tuple of str, optional
        The values argparse offers (``str``); the kind's ``settle`` still checks them (config files).
    help_off : str, optional
        ``bool`` only: the help of ``--no-KEY``.
    cli : bool
        ``False``: a config key without a flag of its own.
    default : int, float, bool or str, optional
        The value when not given, for a kind's flag whose key is not in the kind's ``defaults``
        (so that a new flag is one line); ``None``: the kind's ``defaults`` hold it.
    """

    key: str
    kind: str
    minimum: float | None = None
    strict: bool = False
    help: str = ""
    choices: tuple | None = None
    help_off: str = ""
    cli: bool = True
    default: int | float | bool | str | None = None

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"Flag {self.key!r}: kind must be one of {', '.join(_KINDS)}, got {self.kind!r}")
        if self.default is not None:
            self.check(self.default)  # a default out of its own range is a bug of the kind's module

    @property
    def flag(self) -> str:
        return flag_name(self.key)

    def want(self) -> str:
        """What a value must be, as the errors say it: ``an integer >= 2``."""
        if self.kind == "int":
            return "an integer" + ("" if self.minimum is None else f" >= {self.minimum}")
        if self.kind == "real":
            return "a finite number" + ("" if self.minimum is None else
                                        f" {'>' if self.strict else '>='} {self.minimum:g}")
        return {"bool": "true or false", "str": "a string"}[self.kind]

    def check(self, value):
        """``value`` converted and range-checked.

        Accepts the strings of the command line and the typed values of a config file or sweep
        spec. Raises :class:`popgrad._validation.ArgumentTypeError` (a ``TypeError``, also a
        ``ValueError``) for a value of the wrong kind and ``ValueError`` for one out of range, both
        ``"expected ..., got ..."``.
        """
        kind, minimum, strict = self.kind, self.minimum, self.strict
        text = f"expected {self.want()}, got {value!r}"
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

    @property
    def spec(self) -> tuple:
        """``(kind, minimum, strict)`` (the entries of :data:`popgrad.app.config.ARG_SPECS`)."""
        return (self.kind, self.minimum, self.strict)
