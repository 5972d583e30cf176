"""Small shared helpers of the example scripts (arguments, settings, statistics).

The gallery's teaching pages (induction_head.py, icl_function.py, ...) use none of them: each shows the public
API it runs."""
import argparse
import os

import numpy as np

import popgrad as pg

#: Algorithm 1 settings shared by the examples (natural units, see popgrad.dynamics).
TRAIN = dict(beta0=1e-3, lr1=2.0, steps1=300, lr2=2.0, steps2=300)
#: ``--quick`` (every example): half the steps -- a smoke test, same code path.
QUICK_TRAIN = dict(TRAIN, steps1=150, steps2=150)


def train_settings(quick: bool) -> dict:
    """:data:`TRAIN`, or :data:`QUICK_TRAIN` for ``--quick``."""
    return dict(QUICK_TRAIN if quick else TRAIN)


def parser(description, out_default, quick_help="half the steps (a smoke test)"):
    """The examples' argument parser: ``--out`` and ``--quick`` for every script."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=out_default, help="folder for the figures")
    p.add_argument("--quick", action="store_true", help=quick_help)
    return p


def finite_stats(a, axis=0):
    """``(mean, sd, min, max, count)`` of the finite entries of ``a`` along ``axis``; NaN where there are
    none (a root position has no parent), without NumPy's "Mean of empty slice" warnings."""
    a = np.asarray(a, dtype=float)
    ok = np.isfinite(a)
    n = ok.sum(axis=axis)
    some = n > 0
    safe = np.maximum(n, 1)
    mean = np.where(some, np.where(ok, a, 0.0).sum(axis=axis) / safe, np.nan)
    dev = np.where(ok, a - np.expand_dims(np.where(some, mean, 0.0), axis), 0.0)
    sd = np.where(some, np.sqrt((dev**2).sum(axis=axis) / safe), np.nan)
    lo = np.where(some, np.where(ok, a, np.inf).min(axis=axis), np.nan)
    hi = np.where(some, np.where(ok, a, -np.inf).max(axis=axis), np.nan)
    return mean, sd, lo, hi, n


def random_branching(T, seed=0, branches=2):
    """A random tree with ``branches`` chains from root 0: each later context position extends one of the
    chains chosen uniformly at random, so ``T_eff = T / branches`` grows with T (``random_tree`` draws a new
    tree, and T_eff, at every T)."""
    rng = np.random.default_rng(seed)
    parents = np.full(T, -1)
    last = [0] * branches
    for i in range(1, T - 1):
        b = int(rng.integers(branches))
        parents[i] = last[b]
        last[b] = i
    return pg.CausalGraph(parents)


def ensure_out(path):
    os.makedirs(path, exist_ok=True)
    return path
