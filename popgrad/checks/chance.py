"""The chance guard of the attention checks: a pass a random start reaches too often is no evidence.

An attention statement ("every scored row puts at least lift ``L`` of its attention on its target key")
is checked on a few rows; with one or two scored rows a random start clears it by luck (at ``T = 3`` a
random positional block passes the full model's graph recovery about one time in four). The guard
bounds the probability that a **random start** passes the rule and leaves a pass that chance explains
inconclusive.

**The null distribution.** A random start (``Ã = scale·N(0, 1)`` entries, any scale, or any start
whose attention rows are exchangeable over their keys and independent across rows) gives a row with
``n`` keys an attention vector ``a`` whose law is invariant under permuting the keys. The rule asks
``a_target ≥ a_min = u + L(1 − u)`` with ``u = 1/n``. At most ``⌊1/a_min⌋`` entries of a probability
vector can reach ``a_min``, and by exchangeability each key is equally likely to be one of them, so

    P(row passes) ≤ min(1, ⌊1/a_min⌋ / n)        (= 1/n for every lift L > 0 up to 1 at L = 1/2: a_min > 1/2)

with equality in the large-scale limit (the softmax of i.i.d. scores becomes one-hot at a uniform key).
Rows are independent, so a rule over rows ``R`` passes with probability at most ``Π_{i∈R} p_i``; a rule
that picks the best of ``c`` candidates (heads, slot assignments) at most ``c`` times that (union
bound). :func:`chance_of_passing` is that bound; it is what the guard reads, not a number of rows typed
in: it depends on how many keys each scored row has.

**The guard.** :func:`chance_guard` turns a ``"pass"`` into ``"inconclusive"`` (with the reason and the
figure) when the bound exceeds :data:`CHANCE_LEVEL`; a ``"fail"`` stays a fail (the statement is false
for these parameters whatever the size). At ``ATTENTION_LIFT = 1/2`` and one head a chain is decided
from ``T = 8`` (``1/7! = 2e-4``); at ``T = 3`` (one scored row with two keys) a pass has chance 1/2.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .results import ATTENTION_LIFT, CheckResult, inconclusive

__all__ = ["CHANCE_LEVEL", "row_pass_chance", "chance_of_passing", "chance_guard"]

#: A pass is evidence only when a random start passes the same rule with probability at most this (a
#: one-sided test at level 1e-3: fewer than one random start in a thousand passes).
CHANCE_LEVEL = 1e-3


def row_pass_chance(n_keys: int, lift: float = ATTENTION_LIFT) -> Fraction:
    """The largest probability that an exchangeable random attention row over ``n_keys`` keys puts at least
    ``u + lift·(1 − u)`` (``u = 1/n_keys``) on a given key: ``min(1, ⌊1/a_min⌋ / n_keys)`` (module docstring).

    Exact (a :class:`fractions.Fraction`). A row with one key always passes (chance 1).
    """
    n = int(n_keys)
    if n < 1:
        raise ValueError(f"n_keys must be >= 1, got {n_keys!r}")
    lift = Fraction(lift).limit_denominator(10**12) if not isinstance(lift, Fraction) else lift
    u = Fraction(1, n)
    a_min = u + lift * (1 - u)
    if a_min <= 0:
        return Fraction(1)
    return min(Fraction(1), Fraction(math.floor(1 / a_min), n))


def chance_of_passing(n_keys, lift: float = ATTENTION_LIFT, choices: int = 1) -> float:
    """Upper bound on the probability that a random start passes "every scored row reaches ``lift``".

    Parameters
    ----------
    n_keys : sequence of int
        The number of keys of each scored row (row ``i`` of a causal mask has ``i + 1``), one entry per
        (row, head) event the rule requires; rows must be independent under the null (distinct rows of
        one head, or rows of distinct heads).
    lift : float
        The rule's lift threshold (default :data:`~popgrad.checks.results.ATTENTION_LIFT`).
    choices : int
        How many candidates the rule may pick its best from (heads, slot permutations): the bound is
        multiplied by it (union bound).

    Returns
    -------
    float
        ``min(1, choices · Π row_pass_chance(n))``; 1.0 when no row is scored.
    """
    p = Fraction(1)
    for n in n_keys:
        p *= row_pass_chance(n, lift)
    return float(min(Fraction(1), int(choices) * p))


def chance_guard(result: CheckResult, n_keys, lift: float = ATTENTION_LIFT, choices: int = 1,
                 level: float = CHANCE_LEVEL, what: str = "scored rows") -> CheckResult:
    """``result`` with the chance of a random start passing its rule in the details, and, when that chance
    exceeds ``level``, a pass turned ``"inconclusive"`` with the reason (a fail, inconclusive or not
    applicable result keeps its status).

    For any check whose rule is "every scored row puts at least ``lift`` of its attention on its target
    key" (graph recovery of any model, head specialization, the copy of an induction head): give the
    number of keys of each scored row and the number of candidates the rule picks from. Details added:
    ``chance_of_passing_at_random`` (:func:`chance_of_passing`), ``chance_level``, ``chance_rule``.
    """
    n_keys = [int(n) for n in np.ravel(np.asarray(n_keys, dtype=np.int64))] if np.size(n_keys) else []
    p = chance_of_passing(n_keys, lift, choices)
    rule = (f"decided only when a random start (attention rows exchangeable over their keys) passes with "
            f"probability <= {level:g}: bound choices x prod_rows floor(1/a_min)/n_keys = {p:.3g} "
            f"({len(n_keys)} {what}, {choices} choice{'s' if choices != 1 else ''})")
    details = {**(result.details or {}), "chance_of_passing_at_random": p, "chance_level": level,
               "chance_rule": rule}
    out = result._replace(details=details)
    if result.status == "pass" and p > level:
        keys = ", ".join(str(n) for n in n_keys[:8]) + (", ..." if len(n_keys) > 8 else "")
        return inconclusive(out, f"chance: a random start passes this rule with probability up to {p:.3g} > "
                                 f"{level:g} ({len(n_keys)} {what} with {keys} keys"
                                 f"{f', best of {choices}' if choices > 1 else ''}): too few rows to tell "
                                 "learning from luck; a larger T (more rows with parents) decides it")
    return out
