"""Old module paths, kept importable for one release (as QuantEcon.py does for its moved modules).

``import popgrad.exact`` (or ``from popgrad.multihead import ...``) still works:
each old name is a stand-in module whose attribute access warns with a
``DeprecationWarning`` naming the new home and forwards to it. Nothing else in
popgrad imports these paths. They go in popgrad 0.3.
"""
from __future__ import annotations

import importlib
import sys
import types
import warnings

#: old module -> the new modules that hold its names (searched in order).
MOVED = {
    "graphs": ("popgrad.task.graphs",),
    "priors": ("popgrad.task.priors",),
    "multiparent": ("popgrad.task.multigraphs", "popgrad.task.tensor_priors", "popgrad.task.tasks"),
    "exact": ("popgrad.engine.api", "popgrad.engine.result", "popgrad.engine.symmetry", "popgrad.engine.reference",
              "popgrad.engine.baselines", "popgrad.engine.single"),
    "multihead": ("popgrad.model.multihead", "popgrad.engine.api", "popgrad.engine.result",
                  "popgrad.engine.baselines"),
    "information": ("popgrad.theory.information",),
    "dpi": ("popgrad.theory.dpi",),
    "dynamics": ("popgrad.train.algorithm1", "popgrad.train.config", "popgrad.train.loop", "popgrad.train.trajectory"),
    "multidynamics": ("popgrad.train.multihead",),
    "cli": ("popgrad.app.cli", "popgrad.app.jobs"),
    "multirun": ("popgrad.app.jobs",),
    "report": ("popgrad.app.report",),
    "plots": ("popgrad.app.plots",),
}


class _MovedModule(types.ModuleType):
    """A stand-in for a moved module: attribute access warns and forwards."""

    def __init__(self, old: str, targets: tuple):
        super().__init__(f"popgrad.{old}", f"Deprecated: moved to {', '.join(targets)}.")
        self._targets = targets

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        for target in self._targets:
            mod = importlib.import_module(target)
            if hasattr(mod, name):
                warnings.warn(
                    f"{self.__name__} is deprecated and will be removed in popgrad 0.3: "
                    f"use {target}.{name} (or popgrad.{name} where it is public)",
                    DeprecationWarning, stacklevel=2,
                )
                return getattr(mod, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r} "
                             f"(it moved to {', '.join(self._targets)})")


def moved_attribute(old: str, name: str, new: str):
    """``getattr(new, name)`` with a ``DeprecationWarning`` that ``old.name`` moved (for a module's ``__getattr__``).

    ``new`` is imported by name when the attribute is first asked for, so the old module imports nothing
    from the new one (``popgrad.theory`` keeps the moved reference losses this way without importing the
    engine).
    """
    if name.startswith("__"):
        raise AttributeError(name)
    mod = importlib.import_module(new)
    if not hasattr(mod, name):
        raise AttributeError(f"module {old!r} has no attribute {name!r}")
    warnings.warn(f"{old}.{name} is deprecated and will be removed in popgrad 0.3: use {new}.{name} "
                  f"(or popgrad.{name} where it is public)", DeprecationWarning, stacklevel=3)
    return getattr(mod, name)


def install() -> None:
    """Register the stand-ins in ``sys.modules`` and as attributes of ``popgrad`` (``popgrad/__init__``
    calls this once). ``popgrad.task`` and ``popgrad.model`` are real subpackages now and re-export the
    public names of the old modules, so they need no stand-in."""
    pkg = sys.modules["popgrad"]
    for old, targets in MOVED.items():
        name = f"popgrad.{old}"
        if name not in sys.modules:
            sys.modules[name] = _MovedModule(old, targets)
            setattr(pkg, old, sys.modules[name])
