"""Deprecated: the reference losses moved to :mod:`popgrad.engine.baselines` (they enumerate ``S**T``).

``from popgrad.theory.baselines import bayes_loss`` still works for one
release: every name warns with a ``DeprecationWarning`` and forwards to
:mod:`popgrad.engine.baselines`. The forward is resolved by name at
attribute access, so :mod:`popgrad.theory` imports nothing from the engine.
"""
from .._compat import moved_attribute

_NEW = "popgrad.engine.baselines"


def __getattr__(name):
    return moved_attribute(__name__, name, _NEW)
