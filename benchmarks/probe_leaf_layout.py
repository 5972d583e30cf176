"""Probe (issue 29; not a test): would a leaf-innermost layout speed up the last layer's dense passes?

The full model's leaf group (``popgrad/engine/_kernels/catformer_leaves.py``) runs, per leaf, three dense
passes over the last layer's ``Ã`` (``d_in × d_in``, its dense rows ``d_0 … d_in-1``): ``u = h Ã``,
``dÃ += hᵀ du`` and ``G += du Ãᵀ``. They run per leaf on flat vectors (the kernel's layout). A redesign that
batches ``L`` leaves in the innermost (SIMD) dimension, structure of arrays, would run them as
``(d × L)`` updates. This probe times both on the same arithmetic (``S = 3, T = 10``: ``d_0 = 13``,
``d_in = 26``) and prints nanoseconds per leaf; the dense passes are about a third of a leaf's time in the
whole gradient (DESIGN §18), so a layout change pays at most that share times its speed-up. In the
leaves-innermost layout ``dÃ += hᵀ du`` is a sum over the leaves, a reduction that LLVM does not vectorize
without reassociating it (no ``fastmath`` in popgrad); in the kernel's layout every pass is an update
``y += a·x`` of a contiguous row of ``d_in`` numbers, which it vectorizes as it is.

Usage::

    python benchmarks/probe_leaf_layout.py [--leaves 200000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from numba import njit

U = np.uint64
D0, DIN = 13, 26


@njit(error_model="numpy")
def per_leaf(n, F, prm, gr, din_, d0_):
    """The kernel's layout: one leaf at a time, flat vectors, unsigned offsets."""
    din, d0 = U(din_), U(d0_)
    oH, oU, odu, oG = U(0), din, U(2) * din, U(3) * din
    acc = 0.0
    for it in range(n):
        F[oH + d0 + U(it % 13)] += 1e-9  # a new leaf's row (keeps the loop from being hoisted)
        for b in range(din):
            F[oU + b] = prm[b] + prm[din + b]
        for a in range(d0, din):
            x = F[oH + a]
            if x != 0.0:
                ra = a * din
                for b in range(din):
                    F[oU + b] += x * prm[ra + b]
        for b in range(din):
            F[odu + b] = F[oU + b] * 1e-3
        for a in range(d0, din):
            x = F[oH + a]
            if x != 0.0:
                ra = a * din
                for b in range(din):
                    gr[ra + b] += x * F[odu + b]
        for b in range(din):
            c = F[odu + b]
            if c != 0.0:
                rb = din * din + b * din
                for a in range(d0, din):
                    F[oG + a] += c * prm[rb + a]
        acc += F[oU]
    return acc


@njit(error_model="numpy")
def leaves_innermost(n, H, A, AT, dA, G, u, du, L, d0, din):
    """``L`` leaves per pass, leaves the innermost dimension (``H[a, i]``, ``u[b, i]``)."""
    acc = 0.0
    for it in range(0, n, L):
        H[d0 + it % 13, 0] += 1e-9
        for b in range(din):
            for i in range(L):
                u[b, i] = A[0, b] + A[1, b]
        for a in range(d0, din):
            for b in range(din):
                x = A[a, b]
                for i in range(L):
                    u[b, i] += H[a, i] * x
        for b in range(din):
            for i in range(L):
                du[b, i] = u[b, i] * 1e-3
        for a in range(d0, din):
            for b in range(din):
                s = 0.0
                for i in range(L):
                    s += H[a, i] * du[b, i]
                dA[a, b] += s
        for a in range(d0, din):
            for b in range(din):
                x = AT[a, b]
                for i in range(L):
                    G[a, i] += du[b, i] * x
        acc += u[0, 0]
    return acc


def best_ns(fn, n, repeats):
    fn(10)
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn(n)
        ts.append(time.perf_counter() - t)
    return 1e9 * min(ts) / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--leaves", type=int, default=200000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    F = rng.standard_normal(4 * DIN)
    prm = rng.standard_normal(2 * DIN * DIN)
    gr = np.zeros(DIN * DIN)
    base = best_ns(lambda n: per_leaf(n, F, prm, gr, DIN, D0), args.leaves, args.repeats)
    print(f"d_0 = {D0}, d_in = {DIN}: three dense passes, {3 * (DIN - D0) * DIN} multiply-adds per leaf; "
          f"best of {args.repeats} runs of {args.leaves} leaves")
    print("| layout | ns per leaf | vs per leaf |")
    print("|---|---|---|")
    print(f"| per leaf, flat (the kernel's) | {base:.0f} | 1.00 |")
    for L in (3, 4, 8, 9, 16, 27, 32):
        H = rng.standard_normal((DIN, L))
        A = rng.standard_normal((DIN, DIN))
        AT = np.ascontiguousarray(A.T)
        dA = np.zeros((DIN, DIN))
        G, u, du = np.zeros((DIN, L)), np.zeros((DIN, L)), np.zeros((DIN, L))
        ns = best_ns(lambda n: leaves_innermost(n, H, A, AT, dA, G, u, du, L, D0, DIN), args.leaves, args.repeats)
        print(f"| {L} leaves innermost | {ns:.0f} | {base / ns:.2f} |")


if __name__ == "__main__":
    main()
