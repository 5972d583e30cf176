"""How far sampled training of the full model strays from the exact run: the linear-response prediction.

SGD with learning rate ``η_t`` (weight decay ``wd``) on a fresh batch of ``B`` draws per step, started
where the exact run starts. A draw is what :func:`popgrad.train_catformer` (``gradient="sampled"``)
uses: a sequence ``s`` with its *soft* label ``y = π(·|s_{T-1})`` (a fresh ``π`` per draw under a
continuous prior, an atom's row under a finite one), whose gradient is ``g(s, y) = J_sᵀ (f(s) − y)``
(``J_s = ∂z/∂θ`` the logits' Jacobian, ``f = softmax z``; softmax readout, cross entropy). The batch
gradient is ``∇L(θ) + ξ`` with ``E ξ = 0`` at every ``θ`` and ``Cov ξ = Σ(θ)/B``::

    Σ = Σ_s J_sᵀ K_s J_s − ḡḡᵀ,   K_s = P(s) f fᵀ − f w_sᵀ − w_s fᵀ + M_s,   ḡ = Σ_s J_sᵀ (P(s) f − w_s)

with ``w_s[c] = P(s) E[y_c | s]`` the task's exact weights and ``M_s[c, c'] = P(s) E[y_c y_c' | s]``
the soft labels' second moments (:func:`soft_label_moments`; **not** ``diag(w_s)``: a soft label is
not a one-hot draw). Linearising around the exact run ``θ_t``, the deviation ``δ_t = θ^sampled_t − θ_t``
obeys ``δ_{t+1} = (I − η_t H_t) δ_t − η_t ξ_t`` with ``H_t = ∇²L(θ_t) + wd·I``, so its covariance
``C_t`` (``C_0 = 0``) follows::

    C_{t+1} = (I − η_t H_t) C_t (I − η_t H_t)ᵀ + η_t² Σ_t / B.

``C_t`` is exactly proportional to ``1/B``: it is propagated once for ``B = 1`` and scaled. ``H`` and
``Σ`` are evaluated exactly (dense Hessian from exact Hessian-vector products,
:func:`popgrad.engine.hvp.catformer_hessian_dense`; ``Σ`` from every sequence) at the given points of
the exact run and held constant until the next one (exact when every step is given; the grid's effect
is measured by refining it). Predictions at each given point:

* ``E‖δ‖² = tr C`` (``sq_dist``);
* the loss gap ``ΔL = L(θ^s) − L(θ) ≈ ∇L·δ + ½ δᵀHδ``: the quadratic part of its mean ``½ tr(H C)``
  (``loss_bias``, ``∝ 1/B``) and its spread ``sqrt(∇Lᵀ C ∇L + ½ tr((HC)²))`` (``loss_sd``; the first
  term is the linear part's, ``∝ 1/√B``; the second the quadratic part's for a Gaussian ``δ``,
  ``∝ 1/B``, which dominates where ``∇L`` is small); ``loss_rms = sqrt(loss_bias² + loss_sd²)``
  predicts the RMS gap over seeds. The mean gap also has a part ``∇L · E δ`` of the same order as
  ``loss_bias`` (``E δ`` is second order, driven by the third derivatives), left out: ``loss_bias`` is
  the whole mean gap only where ``∇L ≈ 0``;
* the official attention read-out ``a`` (layer-1 positional block's mean attention to the parent,
  :func:`attention_readout`): spread ``sqrt(∇aᵀ C ∇a)`` (``attn_sd``, delta method).

Where it applies: while ``δ`` stays in the region where ``∇L`` is linear, i.e. large ``B`` or few
``η``-steps; where ``I − ηH`` has eigenvalues of modulus ``> 1`` (a saddle the exact run passes, a
step above the edge of stability) ``C`` grows geometrically and the prediction is an upper scale, not a
value. :func:`catformer_linear_response` reports ``growth`` (the largest ``|1 − η λ|`` per segment) so a
user sees where that happens.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .._validation import ArgumentTypeError, as_int, as_real
from ..engine.catformer import catformer_loss_and_grad
from ..engine.hvp import catformer_hessian_dense, flatten_params
from ..model.catformer import CatFormer, CatFormerParams, backward_from_logits, catformer_forward, check_task_model
from ..task.dirichlet import DirichletPrior, edge_counts_single, stationary_expectations
from ..task.tasks import Task
from ..train.catformer import CatFormerTrajectory

__all__ = ["CatFormerLinearResponse", "catformer_linear_response", "soft_label_moments", "logit_jacobian",
           "gradient_noise_covariance", "attention_readout", "propagate_covariance"]


class CatFormerLinearResponse(NamedTuple):
    """Linear-response prediction of sampled SGD around an exact run of the full model (module docstring).

    Attributes
    ----------
    step : int64 (n,)
        The exact run's steps where ``H``, ``Σ`` were evaluated and the predictions are given.
    batch_sizes : int64 (k,)
    sq_dist : float64 (k, n)
        Predicted ``E‖θ^s_t − θ_t‖²`` (every parameter, flat).
    loss_sd : float64 (k, n)
        Predicted standard deviation of ``L(θ^s_t) − L(θ_t)``: ``sqrt(∇Lᵀ C ∇L + ½ tr((HC)²))``.
    loss_bias : float64 (k, n)
        ``½ tr(H C)``: the quadratic part of the mean loss gap.
    loss_rms : float64 (k, n)
        ``sqrt(loss_bias² + loss_sd²)``: the predicted RMS loss gap over seeds.
    attn_sd : float64 (k, n)
        Predicted standard deviation of the attention read-out's gap (:func:`attention_readout`).
    loss, attn : float64 (n,)
        The exact run's loss and attention read-out at ``step``.
    growth : float64 (n,)
        ``max |1 − η λ(H)|`` over the segment that starts at ``step`` (the last entry: at the last point,
        with the last ``η``): above 1 the linearised deviation grows there.
    cov : float64 (n, P, P) or None
        ``C_t`` for ``B = 1`` (divide by ``B``), kept with ``keep_cov=True``.
    """

    step: np.ndarray
    batch_sizes: np.ndarray
    sq_dist: np.ndarray
    loss_sd: np.ndarray
    loss_bias: np.ndarray
    loss_rms: np.ndarray
    attn_sd: np.ndarray
    loss: np.ndarray
    attn: np.ndarray
    growth: np.ndarray
    cov: np.ndarray | None = None


# ============================================================ the soft labels' second moments
def soft_label_moments(task: Task, seqs) -> np.ndarray:
    """``M[m, c, c'] = P(s_m) E[y_c y_c' | s_m]``, ``y = π(·|s_{T-1})`` the soft label of a draw, ``(n, S, S)``.

    ``Σ_c' M[m, c, c'] = w(s_m, c)`` (the task's weights). A finite prior: the sum over its atoms; the
    continuous :class:`popgrad.DirichletPrior`: the prior mean of ``P(s | π) π(c|q) π(c'|q)``, the weight
    table's statistic with two label edges (:func:`popgrad.task.dirichlet.stationary_expectations`: the
    same closed form, quadrature or Monte-Carlo draws as the weights, so consistent with them).
    """
    if not isinstance(task, Task):
        raise ArgumentTypeError(f"task must be a single-parent popgrad.Task, got {type(task).__name__}")
    S, T = task.S, task.T
    seqs = np.asarray(seqs, dtype=np.int64)
    if seqs.ndim != 2 or seqs.shape[1] != T:
        raise ValueError(f"seqs must have shape (n, T) = (n, {T}), got {seqs.shape}")
    parents = np.asarray(task.graph.parents)
    q = seqs[:, T - 1]
    N = len(seqs)
    if task.continuous:
        prior = task.prior
        if not isinstance(prior, DirichletPrior):
            raise ValueError(f"soft_label_moments: unsupported continuous prior {prior!r}")
        n, r = edge_counts_single(seqs, parents, S)
        cc = np.array([(c, d) for c in range(S) for d in range(S)])
        nl = np.repeat(n[:, None], S * S, axis=1)  # (N, S*S, S, S)
        rows = np.arange(N)[:, None]
        np.add.at(nl, (rows, np.arange(S * S)[None, :], q[:, None], cc[None, :, 0]), 1)
        np.add.at(nl, (rows, np.arange(S * S)[None, :], q[:, None], cc[None, :, 1]), 1)
        nl = nl.reshape(N * S * S, S, S)
        if prior.roots == "uniform":
            rr = np.zeros((N * S * S, S), dtype=np.int64)
            scale = np.repeat(float(S) ** (-1.0 - r.sum(axis=1)), S * S)
        else:
            rr = np.repeat(r, S * S, axis=0)
            scale = np.full(N * S * S, 1.0 / S)
        key = np.concatenate([nl.reshape(len(nl), S * S), rr], axis=1)
        uniq, inv = np.unique(key, axis=0, return_inverse=True)
        vals, _, _ = stationary_expectations(uniq[:, :S * S].reshape(-1, S, S), uniq[:, S * S:], prior.alpha)
        M = (vals[inv.reshape(-1)] * scale).reshape(N, S, S)
        return 0.5 * (M + M.transpose(0, 2, 1))
    atoms, weights = task.prior.expand()
    mu = task.prior.stationary
    logp = np.zeros((N, len(weights)))
    with np.errstate(divide="ignore"):
        la, lm = np.log(atoms), np.log(mu)
        for i in range(T - 1):
            p = int(parents[i])
            logp += lm[:, seqs[:, i]].T if p < 0 else la[:, seqs[:, p], seqs[:, i]].T
    pk = np.exp(logp) * (np.asarray(weights) / S)[None, :]  # (N, K): P(s, atom k)
    lab = atoms[:, q, :].transpose(1, 0, 2)  # (N, K, S): π_k(·|q)
    M = np.einsum("nk,nkc,nkd->ncd", pk, lab, lab)
    return 0.5 * (M + M.transpose(0, 2, 1))


# ============================================================ per-sequence logit Jacobians
def logit_jacobian(model: CatFormer, params: CatFormerParams, seqs) -> np.ndarray:
    """``J[m, c] = ∂z_c(s_m)/∂θ`` in :func:`popgrad.engine.hvp.flatten_params` coordinates, ``(n, S, P)``.

    Reverse mode of :func:`popgrad.model.catformer.catformer_backward` with the batch kept, one class
    at a time (the per-sequence gradient of ``−Σ_c y_c log f_c`` is ``J_sᵀ (f Σ_c y_c − y)``).
    """
    params = model.check_params(params)
    seqs = np.asarray(seqs, dtype=np.int64)
    f, z, h, probs = catformer_forward(model, params, seqs)
    n, S = z.shape
    out = []
    for c in range(S):
        dz = np.zeros((n, S))
        dz[:, c] = 1.0
        dA, dW = backward_from_logits(model, params, h, probs, dz, per_row=True)
        dA = [x.reshape(n, -1) for x in dA]
        out.append(np.concatenate(dA + [dW.reshape(n, -1)], axis=1))
    return np.stack(out, axis=1)


def gradient_noise_covariance(task: Task, model: CatFormer, params: CatFormerParams, chunk: int = 1024) -> tuple:
    """``(ḡ, Σ)``: the exact gradient and the covariance of one draw's gradient (module docstring), flat.

    ``ḡ`` equals the population gradient (:func:`popgrad.catformer_loss_and_grad`) to rounding.
    """
    params = check_task_model(task, model, params)
    if model.readout != "softmax":
        raise ValueError("the linear response needs the softmax readout (cross entropy, eps = 0)")
    task.check_size()
    P = flatten_params(params).size
    gbar = np.zeros(P)
    second = np.zeros((P, P))
    for seqs, w in task.enumerate(chunk_size=int(chunk)):
        J = logit_jacobian(model, params, seqs)
        f = catformer_forward(model, params, seqs)[0]
        M = soft_label_moments(task, seqs)
        ps = w.sum(axis=1)
        K = ps[:, None, None] * f[:, :, None] * f[:, None, :] - f[:, :, None] * w[:, None, :] \
            - w[:, :, None] * f[:, None, :] + M
        gbar += np.einsum("ncp,nc->p", J, ps[:, None] * f - w)
        X = np.einsum("ncd,ndp->ncp", K, J)
        second += J.reshape(-1, P).T @ X.reshape(-1, P)
    sigma = second - np.outer(gbar, gbar)
    return gbar, 0.5 * (sigma + sigma.T)


# ============================================================ the official read-out
def attention_readout(task, model: CatFormer, params: CatFormerParams) -> tuple:
    """``(a, ∇a)``: the layer-1 positional block's attention to the parent, averaged over the non-root
    positions before the query (head 0; :func:`popgrad.checks.catformer.positional_attention`), and its
    gradient in flat coordinates (``softmax`` rows: ``∂P_ip/∂Ã_ij = P_ip (δ_jp − P_ij)``). ``(nan, 0)``
    when no such position exists."""
    params = model.check_params(params)
    S, T = model.S, model.T
    d0 = model.dims[0]
    grad = np.zeros(flatten_params(params).size)
    par = np.asarray(task.graph.parents)
    nr = [i for i in range(T - 1) if par[i] >= 0]
    if not nr:
        return math.nan, grad
    A = params.A[0][0]
    total = 0.0
    for i in nr:
        z = A[S + i, S:S + i + 1]
        e = np.exp(z - z.max())
        p = e / e.sum()
        pp = p[par[i]]
        total += pp
        d = -pp * p
        d[par[i]] += pp
        grad[(S + i) * d0 + S: (S + i) * d0 + S + i + 1] += d / len(nr)
    return total / len(nr), grad


# ============================================================ propagation
def propagate_covariance(H_list, sigma_list, lrs, segments) -> list:
    """``C`` for ``B = 1`` at the start of each segment and after the last: ``len(H_list) + 1`` matrices.

    Segment ``r`` runs ``segments[r]`` steps with ``H_list[r]`` and ``sigma_list[r]`` held constant and the
    learning rates ``lrs[r]`` (one per step): ``C ← (I − ηH) C (I − ηH)ᵀ + η² Σ``, done in ``H``'s
    eigenbasis (elementwise per step, exact for symmetric ``H``).
    """
    P = H_list[0].shape[0]
    C = np.zeros((P, P))
    out = [C.copy()]
    for H, Sig, eta, k in zip(H_list, sigma_list, lrs, segments):
        lam, V = np.linalg.eigh(0.5 * (H + H.T))
        Ct = V.T @ C @ V
        St = V.T @ Sig @ V
        for t in range(int(k)):
            a = 1.0 - eta[t] * lam
            Ct = np.outer(a, a) * Ct + eta[t] ** 2 * St
        C = V @ Ct @ V.T
        C = 0.5 * (C + C.T)
        out.append(C.copy())
    return out


def _points(trajectory, steps, model):
    if isinstance(trajectory, CatFormerTrajectory):
        if steps is not None:
            raise ValueError("steps: given by the trajectory's records; drop steps= (or pass a list of params)")
        if trajectory.config.gradient != "exact":
            raise ValueError(f"trajectory must be an exact run (gradient='exact'), got gradient="
                             f"{trajectory.config.gradient!r}")
        if trajectory.status != "completed":
            raise ValueError(f"trajectory must be a completed run, got status {trajectory.status!r}")
        return [trajectory.params(r) for r in range(len(trajectory.step))], np.asarray(trajectory.step, np.int64)
    if isinstance(trajectory, (str, bytes)) or not isinstance(trajectory, Sequence) or not trajectory:
        raise ArgumentTypeError("trajectory must be a popgrad CatFormerTrajectory or a non-empty list of "
                                "CatFormerParams")
    plist = [model.check_params(p) for p in trajectory]
    st = np.arange(len(plist), dtype=np.int64) if steps is None else np.asarray(steps)
    if st.shape != (len(plist),) or not np.issubdtype(st.dtype, np.integer) or np.any(np.diff(st) <= 0) \
            or st[0] < 0:
        raise ValueError(f"steps must be {len(plist)} increasing integers >= 0 (the step of each params)")
    return plist, st.astype(np.int64)


def _lr_of(lr, trajectory, last_step):
    """Per-step learning rates ``0 … last_step-1``."""
    if isinstance(trajectory, CatFormerTrajectory) and trajectory.config.optimizer not in ("sgd", "gd"):
        raise ValueError(f"the linear response models plain SGD; the trajectory used "
                         f"{trajectory.config.optimizer!r}")
    if lr is None:
        if not isinstance(trajectory, CatFormerTrajectory):
            raise ValueError("lr is required with a list of params (a float, or one value per step)")
        cfg = trajectory.config
        rule = cfg.optimizer_rule().learning_rate
        return np.array([float(rule(t)) for t in range(last_step)]) if callable(rule) \
            else np.full(last_step, cfg.lr)
    if np.ndim(lr) == 0:
        return np.full(last_step, as_real(lr, "lr", minimum=0, strict=True))
    arr = np.asarray(lr, dtype=np.float64)
    if arr.ndim != 1 or len(arr) < last_step or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"lr must be a float > 0 or {last_step} (or more) finite per-step values > 0")
    return arr[:last_step]


def catformer_linear_response(task, model, trajectory, lr=None, batch_size=1024, *, steps=None,
                              weight_decay=None, keep_cov: bool = False,
                              progress: bool = False) -> CatFormerLinearResponse:
    """Linear-response prediction of sampled SGD's distance to the exact run (module docstring).

    Parameters
    ----------
    task : Task
        Single-parent, enumerable (``task.check_size()``); finite or continuous prior.
    model : CatFormer
        Softmax readout.
    trajectory : CatFormerTrajectory or list of CatFormerParams
        The exact run: every record of a trajectory (``gradient="exact"``, SGD), or the parameters at
        ``steps`` (``H`` and ``Σ`` are evaluated there and held constant until the next one: record
        every step for the exact recursion, or a grid whose effect you measure by refining it). The
        first point is the start of the sampled runs (``δ_0 = 0``).
    lr : float or array, optional
        ``η`` (constant) or one value per step; default: the trajectory's SGD schedule.
    batch_size : int or sequence of int
        ``B`` (the prediction scales as ``1/B``; several at once cost nothing more).
    steps : sequence of int, optional
        The step of each given params (default ``0, 1, …``); only with a list.
    weight_decay : float, optional
        SGD's ``wd`` (``H + wd·I``); default the trajectory's (0 for a list).
    keep_cov : bool
        Keep ``C_t`` (``B = 1``) in the result.
    progress : bool
        Print one line per evaluated point.

    Returns
    -------
    CatFormerLinearResponse
    """
    check_task_model(task, model, None)  # validates the task and the model
    if not isinstance(task, Task):
        raise ArgumentTypeError(f"task must be a single-parent popgrad.Task, got {type(task).__name__}")
    if model.readout != "softmax":
        raise ValueError("the linear response needs the softmax readout (cross entropy, eps = 0)")
    task.check_size()
    Bs = np.atleast_1d(np.asarray(batch_size, dtype=object))
    Bs = np.array([as_int(b, "batch_size", minimum=1) for b in Bs], dtype=np.int64)
    plist, st = _points(trajectory, steps, model)
    lrs = _lr_of(lr, trajectory, int(st[-1]))
    if weight_decay is None:
        wd = trajectory.config.weight_decay if isinstance(trajectory, CatFormerTrajectory) else 0.0
    else:
        wd = as_real(weight_decay, "weight_decay", minimum=0)
    n = len(plist)
    Hs, Sigs, gL, gA, loss, attn, growth = [], [], [], [], np.zeros(n), np.zeros(n), np.zeros(n)
    for r, p in enumerate(plist):
        H = catformer_hessian_dense(task, model, p)
        H = 0.5 * (H + H.T) + wd * np.eye(H.shape[0])
        gbar, Sig = gradient_noise_covariance(task, model, p)
        res = catformer_loss_and_grad(task, model, p, symmetry="off")
        loss[r] = res.loss
        attn[r], ga = attention_readout(task, model, p)
        Hs.append(H)
        Sigs.append(Sig)
        gL.append(flatten_params((res.dA, res.dW)))
        gA.append(ga)
        lam = np.linalg.eigvalsh(H)
        eta = lrs[min(int(st[r]), len(lrs) - 1)] if len(lrs) else 0.0
        growth[r] = float(np.max(np.abs(1.0 - eta * lam)))
        if progress:
            print(f"linear response: step {st[r]} ({r + 1}/{n}), loss {loss[r]:.5f}, max|1-ηλ| {growth[r]:.4f}",
                  flush=True)
    seg = np.diff(st)
    Cs = propagate_covariance(Hs[:-1], Sigs[:-1], [lrs[a:b] for a, b in zip(st[:-1], st[1:])], seg)
    sq = np.array([np.trace(C) for C in Cs])
    lsd = np.array([max(0.0, float(g @ C @ g)) for g, C in zip(gL, Cs)])
    quad = np.array([0.5 * float(np.sum((H @ C) * (H @ C).T)) for H, C in zip(Hs, Cs)])  # ½ tr((HC)²), ∝ 1/B²
    lb = np.array([0.5 * float(np.sum(H * C)) for H, C in zip(Hs, Cs)])
    asd = np.array([max(0.0, float(g @ C @ g)) for g, C in zip(gA, Cs)])
    inv = 1.0 / Bs[:, None].astype(float)
    sd = np.sqrt(lsd[None] * inv + quad[None] * inv**2)
    bias = lb[None] * inv
    return CatFormerLinearResponse(st, Bs, sq[None] * inv, sd, bias, np.sqrt(bias**2 + sd**2),
                                   np.sqrt(asd[None] * inv), loss, attn, growth,
                                   np.stack(Cs) if keep_cov else None)
