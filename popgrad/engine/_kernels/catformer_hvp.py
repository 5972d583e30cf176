"""Exact Hessian-vector products of the disentangled transformer: one tangent sweep per row (DESIGN §22).

Forward-over-reverse in real arithmetic: the dense per-sequence kernel of
:mod:`popgrad.engine._kernels.catformer_rows` (its layout, its order of rows and heads) where every
forward quantity ``x`` carries its tangent ``ẋ = dx/dτ`` along ``θ + τ v`` and every adjoint ``ḡ`` of the
reverse pass its tangent too; the tangents of the parameter adjoints are ``H v``. Per head ``g`` and row
``t`` (``n = t + 1`` keys), with ``V_g`` the direction of ``Ã_g`` (``Ḣ`` is zero on the input ``x̃``):

* forward: ``u̇ = Ḣ[t] Ã_g + H[t] V_g``, ``ż_j = u̇ · H[j] + u · Ḣ[j]``, ``Ṗ = P ⊙ (ż − P·ż)``,
  ``ȯ = Σ_j Ṗ_j H[j] + P_j Ḣ[j]``; logits ``ż = ḣ W + h V_W``;
* the readout: ``δ = ∂ℓ/∂z`` and ``δ̇ = (∂²ℓ/∂z²) ż`` (softmax with ``ε = 0``: ``δ̇ = (Σ_c w_c) ḟ``,
  ``ḟ = f ⊙ (ż − f·ż)``; with ``ε > 0`` through ``r_c = −w_c/(f_c + ε)``, ``ṙ_c = w_c ḟ_c/(f_c + ε)²``;
  linear: ``δ̇_c = w_c ż_c/(z_c + ε)²``);
* reverse: ``d(dW) = ḣᵀ δ + hᵀ δ̇``, ``ḋh = V_W δ + W δ̇``; per head, from the output adjoint ``do`` and
  its tangent: ``ḋP_j = ḋo · H[j] + do · Ḣ[j]``, ``Ġ[j] += Ṗ_j do + P_j ḋo``, ``ḋz = Ṗ ⊙ (dP − P·dP) +
  P ⊙ (ḋP − Ṗ·dP − P·ḋP)``, ``ḋu = Σ_j ḋz_j H[j] + dz_j Ḣ[j]``, ``Ġ[j] += ḋz_j u + dz_j u̇``,
  ``d(dÃ_g) += Ḣ[t]ᵀ du + H[t]ᵀ ḋu``, ``Ġ[t] += V_g du + Ã_g ḋu``.

No step size, no cancellation: the products are exact to rounding at any scale of ``v`` (linear in
``v``). Block ``b`` is rows ``b·per … (b+1)·per − 1`` in the given order into slot ``b``; the caller adds the
slots in block order (thread-count independent bits). ``cache=True``, no ``fastmath``. The reference is
the complex step of :mod:`popgrad.engine.complex_step`.
"""
import numpy as np
from numba import njit, prange

from .twins import twins

U = np.uint64

#: Slots of the uint64 size vector ``dims`` (as :mod:`popgrad.engine._kernels.catformer_rows`).
I_T, I_S, I_D0, I_DW, I_NH, I_DMAX, I_DL, I_DL1, I_NINNER, I_NLAST = range(10)


@njit(cache=True, error_model="numpy")
def _rows_hvp_block(lo, hi, seqs, w, dims, hinfo, A, AT, EA, W, WT, VA, VAT, VW, VWT, eps, softmax_readout,
                    HA, HW):
    """Rows ``lo … hi-1`` in order: their loss (returned) and the tangent of their gradient along ``V``
    (``H v``) added into ``HA (n_heads, d_max, d_max)``, ``HW (d_L, S)``. Rows of zero weight are skipped."""
    T, S, d0, dw, nh, dmax = dims[I_T], dims[I_S], dims[I_D0], dims[I_DW], dims[I_NH], dims[I_DMAX]
    dL, dl1, n_inner = dims[I_DL], dims[I_DL1], dims[I_NINNER]
    H = np.zeros((T, dw))
    Ht = np.zeros((dw, T))
    Hd = np.zeros((T, dw))
    Hdt = np.zeros((dw, T))
    G = np.zeros((T, dw))
    Gd = np.zeros((T, dw))
    Pr = np.zeros((nh, T, T))
    Pd = np.zeros((nh, T, T))
    Uq = np.zeros((nh, T, dmax))
    Ud = np.zeros((nh, T, dmax))
    hv = np.zeros(dL)
    hvd = np.zeros(dL)
    dh = np.zeros(dL)
    dhd = np.zeros(dL)
    zc = np.zeros(S)
    zcd = np.zeros(S)
    fz = np.zeros(S)
    fd = np.zeros(S)
    dz = np.zeros(S)
    dzd = np.zeros(S)
    wv = np.zeros(S)
    o = np.zeros(dmax)
    od = np.zeros(dmax)
    dP = np.zeros(T)
    dPd = np.zeros(T)
    du = np.zeros(dmax)
    dud = np.zeros(dmax)
    do = np.zeros(dmax)
    dod = np.zeros(dmax)
    Rt = np.zeros(d0)
    s = np.zeros(T, dtype=np.uint64)
    for t in range(T):
        H[t, S + t] = 1.0
        Ht[S + t, t] = 1.0
    t1 = T - U(1)
    loss = 0.0
    for r in range(lo, hi):
        alive = False
        tot_w = 0.0
        for c in range(S):
            wv[c] = w[r, c]
            tot_w += wv[c]
            if wv[c] != 0.0:
                alive = True
        if not alive:
            continue
        for t in range(T):
            s[t] = U(seqs[r, t])
            H[t, s[t]] = 1.0
            Ht[s[t], t] = 1.0
        # ================================================================ forward with tangents
        for g in range(nh):
            din = hinfo[g, 1]
            out = hinfo[g, 2]
            last = g >= n_inner
            t0 = t1 if last else U(0)
            for t in range(t0, T):
                n = t + U(1)
                st = s[t]
                pt = S + t
                for b in range(din):
                    Uq[g, t, b] = A[g, st, b] + A[g, pt, b]
                    Ud[g, t, b] = VA[g, st, b] + VA[g, pt, b]
                for a in range(d0, din):
                    x = H[t, a]
                    xd = Hd[t, a]
                    for b in range(din):
                        Uq[g, t, b] += x * A[g, a, b]
                        Ud[g, t, b] += x * VA[g, a, b] + xd * A[g, a, b]
                for j in range(n):
                    Pr[g, t, j] = Uq[g, t, s[j]] + Uq[g, t, S + j]
                    Pd[g, t, j] = Ud[g, t, s[j]] + Ud[g, t, S + j]
                for a in range(d0, din):
                    ua = Uq[g, t, a]
                    uda = Ud[g, t, a]
                    for j in range(n):
                        Pr[g, t, j] += ua * Ht[a, j]
                        Pd[g, t, j] += uda * Ht[a, j] + ua * Hdt[a, j]
                ok = False
                if n == U(1):  # one key: P = 1 exactly, Ṗ = 0
                    Pr[g, t, 0] = 1.0
                    Pd[g, t, 0] = 0.0
                    ok = True
                elif din == d0 and not last:  # layer 1: exp(z_tj - c) = R[s_j] R[S+j], R = EA[s_t] ⊙ EA[S+t]
                    for c in range(S + n):
                        Rt[c] = EA[g, st, c] * EA[g, pt, c]
                    tot = 0.0
                    for j in range(n):
                        e = Rt[s[j]] * Rt[S + j]
                        Pr[g, t, j] = e
                        tot += e
                    if tot >= 1e-200:  # else underflow would cost precision: the exp below
                        inv = 1.0 / tot
                        mz = 0.0
                        for j in range(n):
                            Pr[g, t, j] *= inv
                            mz += Pr[g, t, j] * Pd[g, t, j]
                        for j in range(n):
                            Pd[g, t, j] = Pr[g, t, j] * (Pd[g, t, j] - mz)
                        ok = True
                if not ok:
                    for j in range(n):  # the scores again (the table's products overwrote them)
                        Pr[g, t, j] = Uq[g, t, s[j]] + Uq[g, t, S + j]
                    for a in range(d0, din):
                        ua = Uq[g, t, a]
                        for j in range(n):
                            Pr[g, t, j] += ua * Ht[a, j]
                    m = Pr[g, t, 0]
                    for j in range(U(1), n):
                        if Pr[g, t, j] > m:
                            m = Pr[g, t, j]
                    tot = 0.0
                    for j in range(n):
                        e = np.exp(Pr[g, t, j] - m)
                        Pr[g, t, j] = e
                        tot += e
                    inv = 1.0 / tot
                    mz = 0.0
                    for j in range(n):
                        Pr[g, t, j] *= inv
                        mz += Pr[g, t, j] * Pd[g, t, j]
                    for j in range(n):
                        Pd[g, t, j] = Pr[g, t, j] * (Pd[g, t, j] - mz)
                for a in range(din):
                    o[a] = 0.0
                    od[a] = 0.0
                for j in range(n):
                    p = Pr[g, t, j]
                    pd = Pd[g, t, j]
                    o[s[j]] += p
                    o[S + j] += p
                    od[s[j]] += pd
                    od[S + j] += pd
                for j in range(n):
                    p = Pr[g, t, j]
                    pd = Pd[g, t, j]
                    for a in range(d0, din):
                        o[a] += p * H[j, a]
                        od[a] += pd * H[j, a] + p * Hd[j, a]
                if last:
                    base = dl1 * (U(1) + g - n_inner)
                    for a in range(din):
                        hv[base + a] = o[a]
                        hvd[base + a] = od[a]
                else:
                    for a in range(din):
                        H[t, out + a] = o[a]
                        Ht[out + a, t] = o[a]
                        Hd[t, out + a] = od[a]
                        Hdt[out + a, t] = od[a]
        for a in range(dl1):
            hv[a] = H[t1, a]
            hvd[a] = Hd[t1, a]
        sT = s[t1]
        for c in range(S):
            zc[c] = W[sT, c] + W[S + t1, c]
            zcd[c] = VW[sT, c] + VW[S + t1, c]
        for a in range(d0, dL):
            x = hv[a]
            xd = hvd[a]
            for c in range(S):
                zc[c] += x * W[a, c]
                zcd[c] += x * VW[a, c] + xd * W[a, c]
        # ---- the readout: δ = ∂ℓ/∂z (dz) and its tangent δ̇ (dzd)
        rl = 0.0
        if softmax_readout:
            m = zc[0]
            for c in range(U(1), S):
                if zc[c] > m:
                    m = zc[c]
            tot = 0.0
            for c in range(S):
                zc[c] -= m
                tot += np.exp(zc[c])
            lt = np.log(tot)
            mz = 0.0
            for c in range(S):
                fz[c] = np.exp(zc[c] - lt)
                mz += fz[c] * zcd[c]
            for c in range(S):
                fd[c] = fz[c] * (zcd[c] - mz)
            if eps == 0.0:
                for c in range(S):
                    wc = wv[c]
                    if wc > 0.0:
                        rl -= wc * (zc[c] - lt)
                    dz[c] = fz[c] * tot_w - wc
                    dzd[c] = fd[c] * tot_w
            else:
                rbar = 0.0
                rbard = 0.0
                for c in range(S):  # dz holds r_c, dzd ṙ_c for now
                    wc = wv[c]
                    if wc > 0.0:
                        fe = fz[c] + eps
                        rl -= wc * np.log(fe)
                        dz[c] = -wc / fe
                        dzd[c] = wc * fd[c] / (fe * fe)
                    else:
                        dz[c] = 0.0
                        dzd[c] = 0.0
                    rbar += fz[c] * dz[c]
                    rbard += fd[c] * dz[c] + fz[c] * dzd[c]
                for c in range(S):
                    rc = dz[c]
                    dz[c] = fz[c] * (rc - rbar)
                    dzd[c] = fd[c] * (rc - rbar) + fz[c] * (dzd[c] - rbard)
        else:
            for c in range(S):
                wc = wv[c]
                if wc > 0.0:
                    fe = zc[c] + eps
                    rl -= wc * np.log(fe)
                    dz[c] = -wc / fe
                    dzd[c] = wc * zcd[c] / (fe * fe)
                else:
                    dz[c] = 0.0
                    dzd[c] = 0.0
        loss += rl
        # ================================================================ reverse with tangents
        for c in range(S):
            HW[sT, c] += dzd[c]
            HW[S + t1, c] += dzd[c]
        for a in range(d0, dL):
            x = hv[a]
            xd = hvd[a]
            for c in range(S):
                HW[a, c] += xd * dz[c] + x * dzd[c]
        for a in range(dL):
            dh[a] = 0.0
            dhd[a] = 0.0
        for c in range(S):
            gc = dz[c]
            gcd = dzd[c]
            for a in range(d0, dL):
                dh[a] += gc * WT[c, a]
                dhd[a] += gc * VWT[c, a] + gcd * WT[c, a]
        for a in range(d0, dl1):
            G[t1, a] += dh[a]
            Gd[t1, a] += dhd[a]
        for gg in range(nh):
            g = nh - U(1) - gg
            din = hinfo[g, 1]
            out = hinfo[g, 2]
            last = g >= n_inner
            nt = U(1) if last else T
            base = dl1 * (U(1) + g - n_inner) if last else out
            for tt in range(nt):
                t = t1 - tt
                n = t + U(1)
                if last:
                    for a in range(din):
                        do[a] = dh[base + a]
                        dod[a] = dhd[base + a]
                else:
                    for a in range(din):
                        do[a] = G[t, base + a]
                        dod[a] = Gd[t, base + a]
                for j in range(n):
                    dP[j] = do[s[j]] + do[S + j]
                    dPd[j] = dod[s[j]] + dod[S + j]
                for a in range(d0, din):
                    da = do[a]
                    dda = dod[a]
                    for j in range(n):
                        dP[j] += da * Ht[a, j]
                        dPd[j] += dda * Ht[a, j] + da * Hdt[a, j]
                for j in range(n):
                    p = Pr[g, t, j]
                    pd = Pd[g, t, j]
                    for a in range(d0, din):
                        G[j, a] += p * do[a]
                        Gd[j, a] += pd * do[a] + p * dod[a]
                m = 0.0
                md = 0.0
                for j in range(n):
                    m += Pr[g, t, j] * dP[j]
                    md += Pd[g, t, j] * dP[j] + Pr[g, t, j] * dPd[j]
                for j in range(n):
                    p = Pr[g, t, j]
                    dPd[j] = Pd[g, t, j] * (dP[j] - m) + p * (dPd[j] - md)  # ḋz_j
                    dP[j] = p * (dP[j] - m)  # dz_j
                st = s[t]
                pt = S + t
                if din == d0:  # layer 1 (x̃ only, no tangent): d(dÃ)[s_t or S+t, s_j or S+j] += ḋz_j
                    for j in range(n):
                        c = dPd[j]
                        sj = s[j]
                        pj = S + j
                        HA[g, st, sj] += c
                        HA[g, st, pj] += c
                        HA[g, pt, sj] += c
                        HA[g, pt, pj] += c
                    continue
                for b in range(din):
                    du[b] = 0.0
                    dud[b] = 0.0
                for j in range(n):
                    c = dP[j]
                    cd = dPd[j]
                    du[s[j]] += c
                    du[S + j] += c
                    dud[s[j]] += cd
                    dud[S + j] += cd
                for j in range(n):
                    c = dP[j]
                    cd = dPd[j]
                    for a in range(d0, din):
                        du[a] += c * H[j, a]
                        dud[a] += cd * H[j, a] + c * Hd[j, a]
                        G[j, a] += c * Uq[g, t, a]
                        Gd[j, a] += cd * Uq[g, t, a] + c * Ud[g, t, a]
                for b in range(din):
                    HA[g, st, b] += dud[b]
                    HA[g, pt, b] += dud[b]
                for a in range(d0, din):
                    x = H[t, a]
                    xd = Hd[t, a]
                    for b in range(din):
                        HA[g, a, b] += x * dud[b] + xd * du[b]
                for b in range(din):
                    c = du[b]
                    cd = dud[b]
                    for a in range(d0, din):
                        G[t, a] += c * AT[g, b, a]
                        Gd[t, a] += c * VAT[g, b, a] + cd * AT[g, b, a]
        for t in range(T):
            for a in range(d0, dw):
                G[t, a] = 0.0
                Gd[t, a] = 0.0
            H[t, s[t]] = 0.0
            Ht[s[t], t] = 0.0
    return loss


def _run_rows_hvp_body(seqs, w, per, dims, hinfo, A, AT, EA, W, WT, VA, VAT, VW, VWT, eps, softmax_readout,
                       loss_out, HA_out, HW_out):
    """Block ``b`` = rows ``b·per … min(n, (b+1)·per) - 1`` into slot ``b`` (``loss_out[b]``, ``HA_out[b]``,
    ``HW_out[b]``)."""
    n = seqs.shape[0]
    for b in prange(loss_out.shape[0]):
        lo = b * per
        hi = min(n, lo + per)
        loss_out[b] = _rows_hvp_block(lo, hi, seqs, w, dims, hinfo, A, AT, EA, W, WT, VA, VAT, VW, VWT, eps,
                                      softmax_readout, HA_out[b], HW_out[b])


run_rows_hvp, run_rows_hvp_serial = twins(_run_rows_hvp_body)


@njit(cache=True)
def sum_hvp_slots(loss_out, HA_out, HW_out):
    """Add the slots in block order into slot 0 (sequential: thread-count independent); return the loss."""
    loss = loss_out[0]
    for b in range(1, loss_out.shape[0]):
        loss += loss_out[b]
        HA_out[0] += HA_out[b]
        HW_out[0] += HW_out[b]
    loss_out[0] = loss
    return loss
