"""The kinds of run of ``popgrad run``: the :class:`Kind` protocol, the registry, :class:`RunConfig`.

One module per kind of run, each holding its defaults, its flags (:class:`popgrad.app.settings.Flag`),
``settle`` (settings -> its trainer's validated, frozen config), its trainer call, references,
checks, figures and report section:

* :mod:`.reduced_single` -- the reduced model on a single-parent task (Algorithm 1);
* :mod:`.reduced_k_head` -- the reduced k-head model on a multi-parent task;
* :mod:`.catformer` -- the full disentangled transformer (``--model catformer``).

:func:`kind_of` is the one place that decides the kind (``--model``, then the first registered kind
of that model whose ``selects`` accepts the settings); :func:`popgrad.app.jobs.run` looks it up once
(through :func:`popgrad.app.config.settle`) and never branches on it again. The command line's
flags and ``--help``, the config-file keys (:data:`popgrad.app.config.ARG_SPECS`) and ``--model``'s
choices are read from the registry.

A new kind of run is one module (a :class:`Kind`; :class:`KindBase` supplies the usual
optional parts) and one line in :data:`KINDS` below (or :func:`register` from outside).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar, Union, runtime_checkable

from ...task import MultiParentTask, Task
from ..settings import CLIError, Flag
from ..tasks import RUN_FLAGS, TASK_FLAGS
from . import catformer, reduced_k_head, reduced_single, transformer
from ._common import KindBase, common_defaults, validated

__all__ = ["Kind", "KindBase", "RunConfig", "KINDS", "register", "kind_of", "models", "flags", "model_flag",
           "common_defaults", "validated"]

#: The trainer's config object of a run (each kind of run has its own class).
C = TypeVar("C")


@runtime_checkable
class Kind(Protocol):
    """What one kind of run is and does; every method that takes ``rc`` gets the run's :class:`RunConfig`.

    Attributes
    ----------
    name : str
        The registry key (``"reduced-single"``).
    model : str
        The ``--model`` value that selects it (several kinds may share one; ``selects`` decides).
    summary : str
        One line for ``--model``'s help (the first kind of each model).
    flags : tuple of Flag
        The config keys of this kind beyond the task's and the run's (:mod:`popgrad.app.tasks`).
    defaults : Mapping
        Every setting of this kind (task, run and its own keys); ``model`` among them except for the
        default model (the first registered), which ``report.json`` does not record.
    check_names : tuple of str
        The checks a diverged run reports as inconclusive.
    figures : tuple of str
        The files its ``plots`` may write (stale ones from an earlier run are removed).
    """

    name: str
    model: str
    summary: str
    flags: tuple
    defaults: Mapping
    check_names: tuple
    figures: tuple

    def selects(self, values: Mapping) -> bool:
        """Whether this kind runs ``values`` (among the kinds of its model)."""

    def graph_defaults(self, values: Mapping) -> Mapping:
        """Defaults replacing :attr:`defaults` for the keys not given (e.g. for a multi-parent graph)."""

    def build_task(self, values: Mapping) -> Union[Task, MultiParentTask]:
        """The task of the merged settings (one-line :class:`CLIError`)."""

    def settle(self, values: dict, task) -> tuple:
        """``(updates to the settings, the trainer's validated config)``; one-line :class:`CLIError`."""

    def train(self, rc: RunConfig, **run):
        """The trajectory. ``run``: ``checkpoint_path``, ``checkpoint_every``, ``resume``, ``progress``, ``client``."""

    def references(self, rc: RunConfig, trajectory, sampled: bool = True) -> tuple:
        """``(reference entries, Stage-2 objective or None)``."""

    def checks(self, rc: RunConfig, trajectory, refs: dict, objective=None) -> tuple:
        """``(list of CheckResult, extra report sections)``."""

    def plots(self, folder: str, rc: RunConfig, trajectory, refs: dict, context: str = "") -> None:
        """Write the figures into ``folder``."""

    def check_conflicts(self, values: Mapping, given: set) -> None:
        """Refuse settings of this kind that contradict each other (``given``: the keys the user set)."""

    def notes(self, rc: RunConfig) -> list:
        """Console lines before training."""

    def check_resume(self, path: str, rc: RunConfig) -> None:
        """Refuse a damaged or foreign checkpoint before anything is written."""

    def markdown(self, report: Mapping) -> list:
        """Its section of ``report.md`` (lines), after the verdicts."""


@dataclass(frozen=True, eq=False)
class RunConfig(Mapping, Generic[C]):
    """A run's settings, resolved and frozen: a read-only mapping of the config keys, and what they build.

    ``cfg["S"]``, ``cfg.get("gradient")``, ``dict(cfg)`` read the settings (``T`` fixed by the graph,
    every ``"auto"`` resolved); they are what ``report.json`` records under ``config``.

    Attributes
    ----------
    settings : Mapping
        The settings (read-only).
    kind : Kind
        The kind of run (trainer, checks, figures, report section).
    task : Task or MultiParentTask
    train : C
        The trainer's config object, validated once (the kind's ``settle``): a
        :class:`popgrad.TrainConfig`, :class:`popgrad.MultiHeadTrainConfig` or
        :class:`popgrad.train.catformer.CatFormerTrainConfig` for the built-in kinds.
    """

    settings: Mapping[str, Union[int, float, bool, str]]
    kind: Kind
    task: Union[Task, MultiParentTask]
    train: C

    def __getitem__(self, key):
        return self.settings[key]

    def __iter__(self):
        return iter(self.settings)

    def __len__(self):
        return len(self.settings)


#: The registry: one line per kind of run (the first kind's model is the default ``--model``).
KINDS: dict = {k.name: k for k in (reduced_single.KIND, reduced_k_head.KIND, catformer.KIND, transformer.KIND)}


def register(kind: Kind) -> Kind:
    """Add ``kind`` to :data:`KINDS` (replacing one of the same name); its flags and ``--model`` value
    appear on the command line, in config files and in sweeps. Returns ``kind``."""
    if not isinstance(kind, Kind):
        raise TypeError(f"register: kind must implement popgrad.app.kinds.Kind, got {type(kind).__name__}")
    mine = {f.key: f for f in flags()}
    for f in kind.flags:
        if f.key in mine and mine[f.key].spec != f.spec:
            raise ValueError(f"register: kind {kind.name!r} redefines flag {f.flag} with another kind or range")
    KINDS[kind.name] = kind
    return kind


def models() -> tuple:
    """The ``--model`` values, in registry order (the first is the default)."""
    return tuple(dict.fromkeys(k.model for k in KINDS.values()))


def model_flag() -> Flag:
    """``--model``: its choices and help from the registry."""
    first = {}
    for k in KINDS.values():
        first.setdefault(k.model, k.summary)
    return Flag("model", "str", choices=models(),
                help="; ".join(f"{m}: {s}" if s else m for m, s in first.items()))


def flags() -> tuple:
    """Every config key of ``popgrad run``: the task's, ``--model``, each kind's (once), the run's."""
    out = {f.key: f for f in TASK_FLAGS}
    out["model"] = model_flag()
    for k in KINDS.values():
        for f in k.flags:
            have = out.get(f.key)
            if have is None:
                out[f.key] = f
            elif have.choices and f.choices and set(f.choices) - set(have.choices):
                # two kinds share a key with different choices (--gradient): the flag offers both sets, each
                # kind's settle checks its own, and the help names both
                out[f.key] = replace(have, choices=tuple(dict.fromkeys(have.choices + f.choices)),
                                     help=f"{have.help}; {f.help}")
    for f in RUN_FLAGS:
        out.setdefault(f.key, f)
    return tuple(out.values())


def kind_of(values: Mapping) -> Kind:
    """The kind of run of (merged or given) settings: ``--model`` (default: the first registered kind's),
    then the first kind of that model whose ``selects`` accepts them."""
    model = values.get("model", models()[0])
    for k in KINDS.values():
        if k.model == model and k.selects(values):
            return k
    raise CLIError(f"--model {model!r}: use {' or '.join(models())}")
