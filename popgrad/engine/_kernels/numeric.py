"""Numeric building blocks shared by the numba kernels: a vectorizable ``log``.

``fast_log``: the leaves of the prefix engine take ``S`` logarithms per
sequence; glibc's scalar ``log`` cost about 3.5 ns each and kept the leaf
loops scalar (about a quarter of the engine's time). ``fast_log`` is the
fdlibm / FreeBSD ``__ieee754_log`` algorithm (argument reduction to
``[√2/2, √2)``, a degree-14 minimax polynomial in ``s = f/(2+f)``, both of
fdlibm's final forms selected branch-free) written on the bit pattern with
two one-instruction intrinsics, so LLVM vectorizes the loops that call it.
Error below 1 ulp (fdlibm's bound; measured ≤ 0.87 ulp against a long-double
reference; glibc ≤ 0.52), so a loss may differ from one computed with
``np.log`` in the last bits. Valid for positive *normal* arguments only: the
engines call it only when ``ε ≥ 2.2250738585072014e-308`` (then ``f + ε`` is
normal); with ``ε = 0`` they use ``np.log`` (``log 0 = -inf``).
"""
import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


#: Smallest positive normal float64: ``fast_log`` is exact to < 1 ulp at and above it.
TINY = 2.2250738585072014e-308


#: Accumulator lanes of the vectorized sums (the group axis of the prefix engine is padded to a multiple).
LANES = 8


# ===========================================================================
# A vectorizable logarithm (fdlibm __ieee754_log, branch-free)
# ===========================================================================
@intrinsic
def _f64_bits(typingctx, x):
    """Reinterpret a float64 as int64 (LLVM ``bitcast``; no conversion)."""
    if x != types.float64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def _bits_f64(typingctx, b):
    """Reinterpret an int64 as float64 (LLVM ``bitcast``; no conversion)."""
    if b != types.int64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


_LN2_HI = 6.93147180369123816490e-01


_LN2_LO = 1.90821492927058770002e-10


_LG1 = 6.666666666666735130e-01


_LG2 = 3.999999999940941908e-01


_LG3 = 2.857142874366239149e-01


_LG4 = 2.222219843214978396e-01


_LG5 = 1.818357216161805012e-01


_LG6 = 1.531383769920937332e-01


_LG7 = 1.479819860511658591e-01


@njit(cache=True, error_model="numpy")
def fast_log(x):
    """Natural logarithm of a positive normal float64, error < 1 ulp, vectorizable.

    ``x = 2**k · (1 + f)`` with ``1 + f ∈ [√2/2, √2)``; ``s = f / (2 + f)``;
    ``log(1+f) = f - hfsq + s (hfsq + R(s²))`` with fdlibm's coefficients
    ``Lg1 … Lg7``. Not valid for zero, subnormals, negatives, inf or NaN.
    """
    bits = _f64_bits(x)
    hx = bits >> 32
    k = (hx >> 20) - 1023
    hx = hx & 0x000FFFFF
    i = (hx + 0x95F64) & 0x100000  # 1 + f ≥ √2: use x/2
    k += i >> 20
    f = _bits_f64(((hx | (i ^ 0x3FF00000)) << 32) | (bits & 0xFFFFFFFF)) - 1.0
    dk = float(k)
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    R = t2 + t1
    hfsq = 0.5 * f * f
    big = ((hx - 0x6147A) | (0x6B851 - hx)) > 0
    a = dk * _LN2_HI - ((hfsq - (s * (hfsq + R) + dk * _LN2_LO)) - f)
    b = dk * _LN2_HI - ((s * (f - R) - dk * _LN2_LO) - f)
    return a if big else b


@njit(cache=True, error_model="numpy")
def fast_log_array(x, out):
    """``out[i] = fast_log(x[i])`` (for tests and benchmarks)."""
    for i in range(x.shape[0]):
        out[i] = fast_log(x[i])


# ===========================================================================
# The log of a token's attention mass, without underflow
@njit(cache=True, inline="always")
def log_token_mass(c, s, u, T):
    """``log f_c = log Σ_{i<T: s_i = c} e^{u_i} - log Σ_{i<T} e^{u_i}`` computed without underflow.

    The kernels form ``f_c = Σ_{s_i = c} softmax(u)_i`` and take ``log(f_c + ε)``; with ``ε = 0`` an
    ``f_c`` that underflows to 0 (``u`` spread over more than ~745) would give an infinite loss where the
    exact one is finite. They call this in that case only (so no other result changes): shifted by the
    token's own largest score, the sum is at least 1. ``-inf`` only when no position holds ``c``.
    """
    umax = -math.inf
    m = -math.inf
    for i in range(T):
        if u[i] > umax:
            umax = u[i]
        if s[i] == c and u[i] > m:
            m = u[i]
    if m == -math.inf:
        return -math.inf
    z = 0.0
    acc = 0.0
    for i in range(T):
        z += math.exp(u[i] - umax)
        if s[i] == c:
            acc += math.exp(u[i] - m)
    return (m - umax) + math.log(acc) - math.log(z)


@njit(cache=True, inline="always")
def mix_loss(loss, s, u, umax, w, eps, a, f, r):
    """The reduced models' second layer from its scores ``u`` (``umax = max u``), shared by the direct, rows and
    k-head kernels: ``a = softmax(u)``, ``f[c] = Σ_{s_i = c} a_i``, ``loss - Σ_c w_c log(f_c + ε)``,
    ``r_c = -w_c/(f_c + ε)`` (0 where ``w_c = 0``); returns ``(loss, r̄ = Σ_c f_c r_c)``.

    ``loss`` is the running sum the terms are subtracted from (a kernel's block accumulator or 0). A log of an
    ``f_c + ε`` that underflowed to 0 is taken as :func:`log_token_mass` (finite when ``c`` occurs).
    """
    T = u.shape[0]
    S = f.shape[0]
    Z = 0.0
    for i in range(T):
        a[i] = np.exp(u[i] - umax)
        Z += a[i]
    for c in range(S):
        f[c] = 0.0
    for i in range(T):
        a[i] = a[i] / Z
        f[s[i]] += a[i]
    rbar = 0.0
    for c in range(S):
        if w[c] != 0.0:
            fe = f[c] + eps
            loss -= w[c] * (np.log(fe) if fe != 0.0 else log_token_mass(c, s, u, T))
            r[c] = -w[c] / fe
        else:
            r[c] = 0.0
        rbar += f[c] * r[c]
    return loss, rbar


# ===========================================================================
# The k-head model's per-sequence pieces (DESIGN §9), shared by the k-head kernels
@njit(cache=True, inline="always")
def head_sums(s, P, H):
    """``H[h, i, c] = Σ_{j ≤ i: s_j = c} P^h[i, j]`` for every head ``h`` and row ``i`` (``j`` increasing)."""
    k = P.shape[0]
    T = P.shape[1]
    S = H.shape[2]
    for h in range(k):
        for i in range(T):
            for c in range(S):
                H[h, i, c] = 0.0
            for j in range(i + 1):
                H[h, i, s[j]] += P[h, i, j]


@njit(cache=True, inline="always")
def head_kappa(Q, A2, kap):
    """``κ^h = A2^hᵀ Q^h``: ``kap[h, c] = Σ_b Q[h, b] A2[h, b, c]`` (``b`` increasing)."""
    k = Q.shape[0]
    S = Q.shape[1]
    for h in range(k):
        for c in range(S):
            acc = 0.0
            for b in range(S):
                acc += Q[h, b] * A2[h, b, c]
            kap[h, c] = acc


@njit(cache=True, inline="always")
def head_query_grad(Q, A2, eta, dA2, zeta):
    """Given ``η^h = Σ_i δ_i H^h_i``: ``dA2^h += Q^h η^hᵀ`` and ``ζ^h = A2^h η^h`` (``c`` increasing)."""
    k = Q.shape[0]
    S = Q.shape[1]
    for h in range(k):
        for b in range(S):
            qb = Q[h, b]
            acc = 0.0
            for c in range(S):
                dA2[h, b, c] += qb * eta[h, c]
                acc += A2[h, b, c] * eta[h, c]
            zeta[h, b] = acc


@njit(cache=True, inline="always")
def head_scores(Hs, step, kap, u):
    """``u_i = Σ_h <κ^h, H^h_i>`` (``h``, then ``c`` increasing); returns ``max_i u_i``.

    ``H^h_i`` is read at ``Hs[step·(i+1), h, i]``: ``step = 1`` for the k-head engine's prefix state stack
    (row ``i`` final at depth ``i+1``), ``step = 0`` for one ``(1, k, T, S)`` array.
    """
    k = kap.shape[0]
    S = kap.shape[1]
    T = u.shape[0]
    umax = -np.inf
    for i in range(T):
        d = step * (i + 1)
        acc = 0.0
        for h in range(k):
            for c in range(S):
                acc += kap[h, c] * Hs[d, h, i, c]
        u[i] = acc
        if acc > umax:
            umax = acc
    return umax


@njit(cache=True)
def head_scratch(k, T, S):
    """The k-head per-sequence work arrays: ``Q, κ (k, S)``, ``u, a (T,)``, ``f, r (S,)``, ``δ (T,)``, ``η, ζ (k, S)``."""
    return (np.empty((k, S)), np.empty((k, S)), np.empty(T), np.empty(T), np.empty(S), np.empty(S),
            np.empty(T), np.empty((k, S)), np.empty((k, S)))


@njit(cache=True, inline="always")
def has_weight(w):
    """False when a sequence's total weight ``Σ_c w[c]`` is zero (it then adds nothing)."""
    total = 0.0
    for c in range(w.shape[0]):
        total += w[c]
    return total != 0.0


@njit(cache=True, inline="always")
def head_forward(loss, s, Hs, step, A2, w, eps, Q, kap, u, a, f, r):
    """The k-head model's forward on one sequence from its ``H^h_i`` (read as in :func:`head_scores`):
    ``Q^h = H^h_{T-1}``, ``κ^h = A2^hᵀ Q^h``, ``u_i = Σ_h <κ^h, H^h_i>``, then :func:`mix_loss`;
    returns ``(loss, r̄)``."""
    k = Q.shape[0]
    S = Q.shape[1]
    T = u.shape[0]
    for h in range(k):
        for c in range(S):
            Q[h, c] = Hs[step * T, h, T - 1, c]
    head_kappa(Q, A2, kap)
    umax = head_scores(Hs, step, kap, u)
    return mix_loss(loss, s, u, umax, w, eps, a, f, r)


@njit(cache=True, inline="always")
def head_backward(s, a, r, rbar, Hs, step, Q, A2, dl, eta, dA2, zeta):
    """After :func:`head_forward`: ``δ_i = a_i (r_{s_i} - r̄)``, ``η^h = Σ_i δ_i H^h_i`` (``i`` increasing;
    ``H^h_i`` read as in :func:`head_scores`), ``dA2^h += Q^h η^hᵀ``, ``ζ^h = A2^h η^h``."""
    T = dl.shape[0]
    for i in range(T):
        dl[i] = a[i] * (r[s[i]] - rbar)
    k, S = eta.shape
    for h in range(k):
        for c in range(S):
            acc = 0.0
            for i in range(T):
                acc += dl[i] * Hs[step * (i + 1), h, i, c]
            eta[h, c] = acc
    head_query_grad(Q, A2, eta, dA2, zeta)
