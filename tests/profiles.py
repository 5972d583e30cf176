"""Hypothesis profiles of the suite, and the rule that scales every test's own example budget.

``popgrad`` (default, CI): derandomized, ``max_examples = 40`` for tests without
their own budget; a test's ``@settings(max_examples=n)`` (or
:func:`budget` ``(n)``) runs ``n`` examples.

``thorough`` (``POPGRAD_HYPOTHESIS_PROFILE=thorough``): random, 500 for tests
without a budget, and every test's own budget multiplied by
``THOROUGH_FACTOR = 500/40``: the decorated tests by :func:`scale_items`
(called from ``conftest.pytest_collection_modifyitems``), the ones that build
their settings at run time by :func:`budget`.
"""
from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "POPGRAD_HYPOTHESIS_PROFILE"
CI_MAX_EXAMPLES = 40
THOROUGH_MAX_EXAMPLES = 500
THOROUGH_FACTOR = THOROUGH_MAX_EXAMPLES / CI_MAX_EXAMPLES


def register_and_load() -> str:
    """Register ``popgrad`` and ``thorough`` and load the one ``$POPGRAD_HYPOTHESIS_PROFILE`` names."""
    settings.register_profile(
        "popgrad",
        deadline=None,
        max_examples=CI_MAX_EXAMPLES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
        derandomize=True,  # CI sees the same examples every run; use the "thorough" profile to explore
    )
    settings.register_profile("thorough", parent=settings.get_profile("popgrad"),
                              max_examples=THOROUGH_MAX_EXAMPLES, derandomize=False)
    name = active_profile()
    settings.load_profile(name)
    return name


def active_profile() -> str:
    return os.environ.get(PROFILE_ENV, "popgrad")


def budget(n: int) -> int:
    """A test's own example budget ``n`` under the active profile (``n`` in CI, ``⌈n·500/40⌉`` thorough)."""
    return math.ceil(n * THOROUGH_FACTOR) if active_profile() == "thorough" else int(n)


def scale_items(items) -> int:
    """Under ``thorough``, multiply the budget of every collected hypothesis test that set its own.

    A test without its own ``max_examples`` already has the profile's 500. Each
    test function is scaled once (parametrized items share it). Returns how many
    were scaled.
    """
    if active_profile() != "thorough":
        return 0
    done, n = set(), 0
    for item in items:
        fn = getattr(item, "obj", None)
        fn = getattr(fn, "__func__", fn)
        if fn is None or not hasattr(fn, "hypothesis") or id(fn) in done:
            continue
        done.add(id(fn))
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is None or own.max_examples == THOROUGH_MAX_EXAMPLES:
            continue
        fn._hypothesis_internal_use_settings = settings(own, max_examples=budget(own.max_examples))
        n += 1
    return n
