"""What the kinds of run share: :class:`KindBase` (the optional parts of :class:`popgrad.app.kinds.Kind`
with their usual behaviour) and small helpers."""
from __future__ import annotations

from collections.abc import Mapping

from ..._io import over_half_of_memory, size_text
from ...train.loop import load_checkpoint
from ..settings import CLIError, Flag
from ..tasks import RUN_DEFAULTS, TASK_DEFAULTS, build_task

__all__ = ["KindBase", "validated", "common_defaults", "refuse_past_memory", "refuse_batch_flags_unless_sampled"]


def common_defaults(record_every: bool = True) -> dict:
    """The task's and the run's defaults (every kind has them), optionally without ``record_every``."""
    out = dict(TASK_DEFAULTS)
    out.update({k: v for k, v in RUN_DEFAULTS.items() if record_every or k != "record_every"})
    return out


def refuse_past_memory(flag: str, n: int, per: int, what: str, formula: str, tail: str, least: int = 1) -> None:
    """Refuse ``flag n`` whose ``n x per`` bytes exceed half of the memory this process may use
    (:func:`popgrad._io.over_half_of_memory`), in one line naming the largest ``n`` that fits."""
    memory = over_half_of_memory(n * per)
    if memory is not None:
        raise CLIError(f"{flag} {n:,} needs about {size_text(n * per)} {what} ({formula}), more than half of the "
                       f"{size_text(memory)} this process may use: use {flag} {max(least, memory // 2 // per):,} or "
                       f"fewer{tail}")


def validated(cls, **kw):
    """``cls(**kw).validate()``, a ``ValueError`` turned into one :class:`CLIError` line."""
    try:
        return cls(**kw).validate()
    except ValueError as exc:
        raise CLIError(str(exc)) from None


class KindBase:
    """The parts of a kind of run that most kinds share; a kind overrides what differs.

    A subclass sets ``name``, ``model``, ``flags``, ``defaults``, ``check_names`` and implements
    ``settle``, ``train``, ``checks`` and ``plots``; see :class:`popgrad.app.kinds.Kind`.
    """

    name: str = ""
    model: str = ""
    summary: str = ""
    flags: tuple[Flag, ...] = ()
    defaults: Mapping = {}
    check_names: tuple[str, ...] = ()
    figures: tuple[str, ...] = ("loss.png",)

    def selects(self, values: Mapping) -> bool:
        """Whether this kind runs ``values`` (among the kinds of its ``--model``)."""
        return True

    def graph_defaults(self, values: Mapping) -> Mapping:
        """Defaults that replace :attr:`defaults` for the keys the user did not give (e.g. a multi-parent graph)."""
        return {}

    def build_task(self, values: Mapping):
        return build_task(values)

    def check_conflicts(self, values: Mapping, given: set) -> None:
        """One-line :class:`CLIError` for settings of this kind that contradict each other; none by default."""

    def references(self, rc, trajectory, sampled: bool = True):
        """``(reference entries, Stage-2 objective or None)``; none by default."""
        return {}, None

    def notes(self, rc) -> list:
        """Console lines before training."""
        return []

    def check_resume(self, path, rc) -> None:
        """Refuse a damaged or foreign checkpoint before anything is written."""
        load_checkpoint(path, rc.task, rc.train)

    def markdown(self, report: Mapping) -> list:
        """This kind's section of ``report.md`` (lines), after the verdicts."""
        return []

    def __repr__(self):
        return f"<kind of run {self.name!r} (--model {self.model})>"


def refuse_batch_flags_unless_sampled(values: Mapping, given: set) -> None:
    """``--batch-size`` / ``--sample-seed`` given without ``--gradient sampled``: a one-line :class:`CLIError`
    (they would be ignored; the kinds with a sampled gradient call this from ``check_conflicts``)."""
    if values.get("gradient", "exact") == "sampled":
        return
    for key in ("batch_size", "sample_seed"):
        if key in given:
            flag = "--" + key.replace("_", "-")
            raise CLIError(f"{flag} only applies to --gradient sampled (got --gradient {values.get('gradient')}): "
                           f"drop {flag} or add --gradient sampled")
