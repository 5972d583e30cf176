"""The sampled-batch kernel of the disentangled transformer: one sequence at a time, dense rows (DESIGN §18, §23).

The trie kernel (:func:`popgrad.engine._kernels.catformer.run_rows`) shares the rows of a common prefix
between consecutive sorted rows: worth it over an enumeration or a weight table (long shared prefixes),
not over a sampled batch (``S = 10``, ``T = 20``, 1024 rows share one or two tokens), where it pays a sort,
the node bookkeeping and a readout precomputed per prefix node (``hw[t] = H[t] W`` for every row ``t``).
This kernel takes the rows in the given order, each sequence on its own, layer by layer:

* every non-last layer, every head ``g``, every row ``t``: ``u = H[t] Ã_g`` (the two ones of
  ``x̃_t = [e_{s_t}, e_t]`` as two row gathers, the dense coordinates ``d_0 …`` as row updates),
  scores ``z_j = u[s_j] + u[S + j] + u[d_0:] · H[j, d_0:]`` (``j ≤ t``), softmax, output
  ``Σ_j P_j H[j]`` into ``H[t]`` (and its transpose ``Ht``);
* the last layer at row ``T-1`` only, its heads' outputs into ``hv = [H[T-1] | out_1 | …]``;
  logits ``hv W`` (the one-hot coordinates as two row gathers);
* reverse mode in the opposite order (the readout, the last layer's heads, then layers
  ``L-1 … 1`` rows ``T-1 … 0``): the adjoints ``G[j]`` of the rows, ``dÃ`` and ``dW`` accumulated
  in the block's slot.

Layer 1 reads only ``x̃``: its scores come from a table ``EA = exp(Ã - rowmax)`` (no ``exp`` per score) and
its ``dÃ`` is four scatters per score (:func:`_rows_dense_block`). The long inner loops are updates of a
contiguous vector (``y += a·x``), not reductions, so LLVM vectorizes them without reassociating a sum (no
``fastmath``); one function per block, no helper calls (numba counts references of every array passed to a
function, atomically: those updates cost more than the arithmetic); indices are unsigned (numba wraps a
negative signed index, a compare per access that keeps LLVM from vectorizing). Block ``b`` is rows
``b·per … (b+1)·per - 1`` in the given order, into slot ``b``; the caller adds the slots in block order,
so the bits depend on the rows, their order and ``per`` only (not on the thread count).

Parameters are padded to ``(n_heads, d_max, d_max)`` (head ``g`` uses its top-left ``d_in × d_in``),
with their transposes ``AT`` and ``WT`` for the adjoint products.
"""
import numpy as np
from numba import njit, prange

from .twins import twins

U = np.uint64

#: Slots of the uint64 size vector ``dims`` (built by :func:`popgrad.engine.catformer_rows.dense_job`).
I_T, I_S, I_D0, I_DW, I_NH, I_DMAX, I_DL, I_DL1, I_NINNER, I_NLAST = range(10)


@njit(cache=True, error_model="numpy")
def _rows_dense_block(lo, hi, seqs, w, dims, hinfo, A, AT, EA, W, WT, eps, softmax_readout, want_grad, row_loss,
                      dA, dW):
    """Rows ``lo … hi-1`` in order: their loss (returned), per-row losses into ``row_loss[lo:hi]``, and
    (``want_grad``) their gradient added into ``dA (n_heads, d_max, d_max)``, ``dW (d_L, S)``.

    A row whose weights are all zero contributes nothing (its ``row_loss`` is 0). One function, no helper
    calls: numba updates an atomic reference count for every array passed to a function (inlined or not),
    which cost more than the arithmetic here.

    Per head ``g`` (layer-major; the last layer's heads at row ``T-1`` only) and row ``t``:
    ``u = H[t] Ã_g`` (two row gathers for ``x̃_t``, row updates for the dense coordinates ``d_0 …``), scores
    ``z_j = u[s_j] + u[S+j] + u[d_0:] · H[j, d_0:]`` (``j ≤ t``), softmax, output ``o = Σ_j P_j H[j]``. A layer-1
    head reads only ``x̃``: ``exp(z_tj - c) = R[s_j] R[S+j]`` with ``R = EA[s_t] ⊙ EA[S+t]`` and
    ``EA = exp(Ã - rowmax)`` (``c`` the two rows' maxima, a constant of the row; every factor ``≤ 1``), so no
    ``exp`` per score; a row whose total falls below ``1e-200`` (underflow would cost precision) is computed
    with ``exp``. Reverse mode per head and row from the adjoint ``do`` of its output: ``dP_j = do · H[j]``,
    ``G[j] += P_j do``, ``dz = P ⊙ (dP - P·dP)``, ``du = Σ_j dz_j H[j]``, ``G[j] += dz_j u``,
    ``dÃ_g += H[t]ᵀ du``, ``G[t] += Ã_g du`` (coordinates ``≥ d_0`` of ``G`` only: ``x̃`` needs no adjoint).
    """
    T, S, d0, dw, nh, dmax = dims[I_T], dims[I_S], dims[I_D0], dims[I_DW], dims[I_NH], dims[I_DMAX]
    dL, dl1, n_inner = dims[I_DL], dims[I_DL1], dims[I_NINNER]
    H = np.zeros((T, dw))
    Ht = np.zeros((dw, T))
    G = np.zeros((T, dw))
    Pr = np.zeros((nh, T, T))
    Uq = np.zeros((nh, T, dmax))
    hv = np.zeros(dL)
    dh = np.zeros(dL)
    zc = np.zeros(S)
    dz = np.zeros(S)
    wv = np.zeros(S)
    o = np.zeros(dmax)
    dP = np.zeros(T)
    du = np.zeros(dmax)
    Rt = np.zeros(d0)
    s = np.zeros(T, dtype=np.uint64)
    for t in range(T):  # x̃_t: the position one-hot is fixed
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
            row_loss[r] = 0.0
            continue
        for t in range(T):
            s[t] = U(seqs[r, t])
            H[t, s[t]] = 1.0
            Ht[s[t], t] = 1.0
        # ================================================================ forward
        for g in range(nh):
            din = hinfo[g, 1]
            out = hinfo[g, 2]
            last = g >= n_inner
            t0 = t1 if last else U(0)
            for t in range(t0, T):
                n = t + U(1)
                st = s[t]
                ok = False
                if din == d0 and not last:  # layer 1: the exp table, R = EA[s_t] ⊙ EA[S+t] (tokens, positions ≤ t)
                    pt = S + t
                    for c in range(S + n):
                        Rt[c] = EA[g, st, c] * EA[g, pt, c]
                    tot = 0.0
                    for j in range(n):
                        e = Rt[s[j]] * Rt[S + j]
                        Pr[g, t, j] = e
                        tot += e
                    if tot >= 1e-200:
                        if n == U(1):  # exactly 1 (e · (1/e) need not be): its exact zero gradient
                            Pr[g, t, 0] = 1.0
                        else:
                            inv = 1.0 / tot
                            for j in range(n):
                                Pr[g, t, j] *= inv
                        ok = True
                if not ok:
                    for b in range(din):
                        Uq[g, t, b] = A[g, st, b] + A[g, S + t, b]
                    for a in range(d0, din):
                        x = H[t, a]
                        for b in range(din):
                            Uq[g, t, b] += x * A[g, a, b]
                    for j in range(n):
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
                    for j in range(n):
                        Pr[g, t, j] *= inv
                # output o = Σ_j P_j H[j, :din]
                for a in range(din):
                    o[a] = 0.0
                for j in range(n):
                    p = Pr[g, t, j]
                    o[s[j]] += p
                    o[S + j] += p
                for j in range(n):
                    p = Pr[g, t, j]
                    for a in range(d0, din):
                        o[a] += p * H[j, a]
                if last:
                    base = dl1 * (U(1) + g - n_inner)
                    for a in range(din):
                        hv[base + a] = o[a]
                else:
                    for a in range(din):
                        H[t, out + a] = o[a]
                        Ht[out + a, t] = o[a]
        for a in range(dl1):
            hv[a] = H[t1, a]
        sT = s[t1]
        for c in range(S):
            zc[c] = W[sT, c] + W[S + t1, c]
        for a in range(d0, dL):
            x = hv[a]
            for c in range(S):
                zc[c] += x * W[a, c]
        # ---- loss -Σ_c w_c log(f_c + ε) and dz = ∂/∂logits (the trie kernel's _leaf, same formulas)
        rl = 0.0
        if softmax_readout:
            m = zc[0]
            for c in range(U(1), S):
                if zc[c] > m:
                    m = zc[c]
            for c in range(S):
                zc[c] -= m
            tot = 0.0
            for c in range(S):
                tot += np.exp(zc[c])
            lt = np.log(tot)
            if eps == 0.0:
                for c in range(S):
                    wc = wv[c]
                    if wc > 0.0:
                        rl -= wc * (zc[c] - lt)
                    dz[c] = np.exp(zc[c] - lt) * tot_w - wc
            else:
                rbar = 0.0
                for c in range(S):
                    f = np.exp(zc[c] - lt)
                    wc = wv[c]
                    if wc > 0.0:
                        rl -= wc * np.log(f + eps)
                        dz[c] = -wc / (f + eps)
                    else:
                        dz[c] = 0.0
                    rbar += f * dz[c]
                for c in range(S):
                    dz[c] = np.exp(zc[c] - lt) * (dz[c] - rbar)
        else:
            for c in range(S):
                wc = wv[c]
                if wc > 0.0:
                    rl -= wc * np.log(zc[c] + eps)
                    dz[c] = -wc / (zc[c] + eps)
                else:
                    dz[c] = 0.0
        row_loss[r] = rl
        loss += rl
        if want_grad:
            # ============================================================ reverse
            # readout: dW += hvᵀ dz, dhv = W dz (coordinates ≥ d_0)
            for c in range(S):
                dW[sT, c] += dz[c]
            for c in range(S):
                dW[S + t1, c] += dz[c]
            for a in range(d0, dL):
                x = hv[a]
                for c in range(S):
                    dW[a, c] += x * dz[c]
            for a in range(dL):
                dh[a] = 0.0
            for c in range(S):
                gc = dz[c]
                for a in range(d0, dL):
                    dh[a] += gc * WT[c, a]
            for a in range(d0, dl1):
                G[t1, a] += dh[a]
            for gg in range(nh):  # heads in reverse: the last layer's, then layers L-1 … 1
                g = nh - U(1) - gg
                din = hinfo[g, 1]
                out = hinfo[g, 2]
                last = g >= n_inner
                nt = U(1) if last else T
                base = dl1 * (U(1) + g - n_inner) if last else out
                for tt in range(nt):
                    t = t1 - tt
                    n = t + U(1)
                    # dP_j = do · H[j] with do = dh[base:] (last layer) or G[t, out:] (the output's adjoint)
                    if last:
                        for j in range(n):
                            dP[j] = dh[base + s[j]] + dh[base + S + j]
                        for a in range(d0, din):
                            da = dh[base + a]
                            for j in range(n):
                                dP[j] += da * Ht[a, j]
                        for j in range(n):
                            p = Pr[g, t, j]
                            for a in range(d0, din):
                                G[j, a] += p * dh[base + a]
                    else:
                        for j in range(n):
                            dP[j] = G[t, base + s[j]] + G[t, base + S + j]
                        for a in range(d0, din):
                            da = G[t, base + a]
                            for j in range(n):
                                dP[j] += da * Ht[a, j]
                        for j in range(n):
                            p = Pr[g, t, j]
                            for a in range(d0, din):
                                G[j, a] += p * G[t, base + a]
                    m = 0.0
                    for j in range(n):
                        m += Pr[g, t, j] * dP[j]
                    for j in range(n):
                        dP[j] = Pr[g, t, j] * (dP[j] - m)  # now dz_j
                    st = s[t]
                    if din == d0:  # layer 1 (x̃ only): dÃ[s_t or S+t, s_j or S+j] += dz_j
                        pt = S + t
                        for j in range(n):
                            c = dP[j]
                            sj = s[j]
                            pj = S + j
                            dA[g, st, sj] += c
                            dA[g, st, pj] += c
                            dA[g, pt, sj] += c
                            dA[g, pt, pj] += c
                        continue
                    for b in range(din):
                        du[b] = 0.0
                    for j in range(n):
                        c = dP[j]
                        du[s[j]] += c
                        du[S + j] += c
                    for j in range(n):
                        c = dP[j]
                        for a in range(d0, din):
                            du[a] += c * H[j, a]
                            G[j, a] += c * Uq[g, t, a]
                    for b in range(din):
                        dA[g, st, b] += du[b]
                    for b in range(din):
                        dA[g, S + t, b] += du[b]
                    for a in range(d0, din):
                        x = H[t, a]
                        for b in range(din):
                            dA[g, a, b] += x * du[b]
                    for b in range(din):
                        c = du[b]
                        for a in range(d0, din):
                            G[t, a] += c * AT[g, b, a]
            for t in range(T):
                for a in range(d0, dw):
                    G[t, a] = 0.0
        for t in range(T):
            H[t, s[t]] = 0.0
            Ht[s[t], t] = 0.0
    return loss


def _run_rows_dense_body(seqs, w, per, dims, hinfo, A, AT, EA, W, WT, eps, softmax_readout, want_grad, row_loss,
                         loss_out, dA_out, dW_out):
    """Block ``b`` = rows ``b·per … min(n, (b+1)·per) - 1`` into slot ``b`` (``loss_out[b]``, ``dA_out[b]``,
    ``dW_out[b]``); per-row losses into ``row_loss``."""
    n = seqs.shape[0]
    for b in prange(loss_out.shape[0]):
        lo = b * per
        hi = min(n, lo + per)
        loss_out[b] = _rows_dense_block(lo, hi, seqs, w, dims, hinfo, A, AT, EA, W, WT, eps, softmax_readout,
                                        want_grad, row_loss, dA_out[b], dW_out[b])


run_rows_dense, run_rows_dense_serial = twins(_run_rows_dense_body)


# the slots are added in block order into slot 0 by single.sum_slots (thread-count independent)
