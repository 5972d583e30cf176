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

The last rows time the same three passes as matrix products over ``L`` leaves (leaves as rows, BLAS
``dgemm`` through numba's ``np.dot``): what batching the leaves of many parents into one product would
buy, before the cost of the walk's restructuring (every leaf's row and adjoint kept until the batch
runs) and with a summation order that is BLAS's, not the kernel's. ``--S``/``--T`` set the widths of
heads ``(1, 1)``: ``d_0 = S + T``, ``d_in = 2 d_0``.

Usage::

    python benchmarks/probe_leaf_layout.py [--leaves 200000] [--repeats 5] [--S 3] [--T 10]
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core, as the kernel's walks (set before NumPy loads BLAS)
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

U = np.uint64


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


@njit(error_model="numpy")
def blas_products(n, H, Ad, AdT, dA, G, u, du, dAb, Gb):
    """``L`` leaves per pass as BLAS products: ``u = H Ã_d``, ``dÃ_d += Hᵀ du``, ``G += du Ãᵀ_d`` (``H (L, k)`` the
    leaves' dense coordinates, ``Ã_d (k, d_in)`` the dense rows of ``Ã``, ``Ãᵀ_d (d_in, k)``)."""
    L, k = H.shape
    acc = 0.0
    for it in range(0, n, L):
        H[0, it % k] += 1e-9
        np.dot(H, Ad, u)
        for i in range(L):
            for b in range(u.shape[1]):
                du[i, b] = u[i, b] * 1e-3
        np.dot(H.T, du, dAb)
        dA += dAb
        np.dot(du, AdT, Gb)
        G += Gb
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
    ap.add_argument("--S", type=int, default=3)
    ap.add_argument("--T", type=int, default=10)
    args = ap.parse_args()
    D0 = args.S + args.T
    DIN = 2 * D0
    rng = np.random.default_rng(0)
    F = rng.standard_normal(4 * DIN)
    prm = rng.standard_normal(2 * DIN * DIN)
    gr = np.zeros(DIN * DIN)
    base = best_ns(lambda n: per_leaf(n, F, prm, gr, DIN, D0), args.leaves, args.repeats)
    print(f"S = {args.S}, T = {args.T}, heads (1, 1): d_0 = {D0}, d_in = {DIN}: three dense passes, "
          f"{3 * (DIN - D0) * DIN} multiply-adds per leaf; best of {args.repeats} runs of {args.leaves} leaves")
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
    k = DIN - D0
    for L in (3, 9, 27, 81, 243):
        H = rng.standard_normal((L, k))
        Ad = rng.standard_normal((k, DIN))
        AdT = np.ascontiguousarray(rng.standard_normal((DIN, k)))
        dA, dAb = np.zeros((k, DIN)), np.zeros((k, DIN))
        G, Gb = np.zeros((L, k)), np.zeros((L, k))
        u, du = np.zeros((L, DIN)), np.zeros((L, DIN))
        ns = best_ns(lambda n: blas_products(n, H, Ad, AdT, dA, G, u, du, dAb, Gb), args.leaves, args.repeats)
        print(f"| {L} leaves, BLAS products | {ns:.0f} | {base / ns:.2f} |")


if __name__ == "__main__":
    main()
