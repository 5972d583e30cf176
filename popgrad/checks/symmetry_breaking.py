"""Why heads split: the symmetric start, its exact stability, and read-outs a referee would accept (DESIGN §22).

For two heads ``a, b`` of one layer of a :class:`popgrad.CatFormer`, ``swap``
(:func:`popgrad.engine.hvp.head_swap`) exchanges them and leaves the loss unchanged. Write
``θ = θ̄ + δ`` with ``θ̄ = (θ + swap θ)/2`` (head-symmetric) and ``δ = (θ − swap θ)/2``
(head-antisymmetric: the heads' difference). Near the symmetric manifold:

* gradient descent, ``θ ← θ − η_t (∇L + wd θ)``: ``∇L(θ̄ + δ) = ∇L(θ̄) + H(θ̄) δ + O(δ²)`` and ``∇L(θ̄)`` is
  symmetric, so ``δ_{t+1} = (I − η_t (H_anti(θ̄_t) + wd)) δ_t + O(δ²)``: an antisymmetric eigenvalue
  ``λ < 0`` (or ``λ > 2/η``) makes the symmetric state unstable;
* Adam(W), elementwise ``m ← b1 m + (1−b1) g``, ``v ← b2 v + (1−b2) g²``, ``u = m̂/(√v̂ + e)``: with
  ``g = ḡ + γ``, ``γ_t = H(θ̄_t) δ_t`` the antisymmetric part, ``m = m̄ + μ``, ``v = v̄ + ν``, to first order
  ``μ_t = b1 μ_{t−1} + (1−b1) γ_t``, ``ν_t = b2 ν_{t−1} + 2(1−b2) ḡ_t γ_t`` and
  ``Δu_t = μ̂_t/(√v̄̂_t + e) − m̄̂_t ν̂_t / (2 √v̄̂_t (√v̄̂_t + e)²)``, ``δ_{t+1} = δ_t − η_t (Δu_t + wd δ_t)``
  (AdamW; decoupled decay). The leading term is the preconditioned product ``D_t^{-1} H δ`` with
  ``D = √v̄̂ + e``: the stability reading is the spectrum of ``D^{-1/2} H_anti D^{-1/2}``. Where the
  symmetric gradient has never been non-zero (``v̄ = 0``) the expansion holds only while ``|γ| ≪ e``
  (``e = 1e-8``): there Adam multiplies the antisymmetric gradient by ``1/e``.

:func:`follow_symmetric_start` steps the exact trajectory (the optimizers of :mod:`popgrad.train.optim`,
bit-identical to :func:`popgrad.train_catformer`) and carries the linearised ``δ̂`` beside the measured
``δ`` with one exact Hessian-vector product per step.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .._validation import ArgumentTypeError, as_int, as_real
from ..engine.catformer import catformer_loss, catformer_loss_and_grad
from ..engine.catformer_rows import catformer_batch_loss_and_grad
from ..engine.hessian import _tol, basis_embed, basis_project, head_swap, hessian_spectrum, subspace_basis
from ..engine.hvp import _catformer_hvp_flat, _rows_hvp_flat, flatten_params, unflatten_params
from ..model.catformer import CatFormer, CatFormerParams
from ..task.tasks import MultiParentTask
from ..train.optim import GradientTransformationLike, Optimizer, apply_updates, linearisation_of
from .catformer import positional_attention

__all__ = [
    "symmetric_start", "SymmetryRun", "follow_symmetric_start", "PositionalMargins", "positional_margins",
    "HeadAblation", "head_ablation", "slot_count_loss", "Plateau", "find_plateaus", "antisymmetric_part",
    "preconditioned_spectrum", "parent_preference",
]


# ============================================================ the symmetric start
def antisymmetric_part(model, params, layer=0, heads=(0, 1)) -> np.ndarray:
    """``δ = (θ − swap θ)/2`` in flat coordinates (:func:`popgrad.engine.hvp.flatten_params`)."""
    x = flatten_params(model.check_params(params))
    perm = head_swap(model, layer, heads)
    return (x - x[perm]) / 2


def symmetric_start(model, scale=1e-4, seed=0, epsilon=1e-6, direction="random", layer=0, heads=(0, 1),
                    task=None) -> CatFormerParams:
    """Identical heads plus an antisymmetric perturbation of size ``epsilon`` (``init=`` of ``train_catformer``).

    ``θ̄ = (θ_0 + swap θ_0)/2`` with ``θ_0 = model.init(scale, seed)`` (``Ã ~ scale·N(0,1)``, ``W = 0``), so
    the heads ``heads`` of layer ``layer`` are identical (and every later block consistent with them);
    then ``θ = θ̄ + epsilon · d/‖d‖`` with ``d`` antisymmetric (``swap d = −d``):

    * ``direction="random"``: ``d = P_anti z``, ``z ~ N(0, I)`` from ``default_rng(seed + 1)``;
    * ``direction="hessian"``: the eigenvector of the most negative eigenvalue of the antisymmetric
      Hessian at ``θ̄`` (needs ``task``);
    * a :class:`CatFormerParams` (or flat array): its antisymmetric part.

    ``epsilon = 0`` gives the exactly symmetric start.
    """
    if not isinstance(model, CatFormer):
        raise ArgumentTypeError(f"model must be a popgrad.CatFormer, got {type(model).__name__}")
    epsilon = as_real(epsilon, "epsilon", minimum=0)
    perm = head_swap(model, layer, heads)
    x = flatten_params(model.init(scale, seed))
    xs = (x + x[perm]) / 2
    if epsilon == 0:
        return unflatten_params(model, xs)
    if isinstance(direction, str):
        if direction == "random":
            z = np.random.default_rng(int(seed) + 1).standard_normal(x.size)
        elif direction == "hessian":
            if task is None:
                raise ValueError("direction='hessian' needs task= (the Hessian is the task's)")
            sp = hessian_spectrum(task, model, unflatten_params(model, xs), k=1, which="smallest",
                                  subspace="head_antisymmetric", layer=layer, heads=heads)
            z = sp.vectors[:, 0]
        else:
            raise ValueError(f"direction must be 'random', 'hessian', CatFormerParams or a flat array, "
                             f"got {direction!r}")
    elif isinstance(direction, tuple):
        z = flatten_params(model.check_params(direction))
    else:
        z = np.asarray(direction, dtype=np.float64).reshape(-1)
        if z.size != x.size:
            raise ValueError(f"direction must have {x.size} entries (flat parameters), got {z.size}")
    d = (z - z[perm]) / 2
    nd = np.linalg.norm(d)
    if nd == 0:
        raise ValueError("direction has no antisymmetric part: choose a direction that changes the heads "
                         "differently")
    return unflatten_params(model, xs + epsilon * d / nd)


# ============================================================ stability readings
def preconditioned_spectrum(task, model, params, D, k=2, layer=0, heads=(0, 1), tol=0.0):
    """Smallest/largest eigenvalues of ``D^{-1/2} H_anti D^{-1/2}`` (Adam's linearised step matrix, flat ``D > 0``).

    Returns ``(values ascending, vectors in flat coordinates)``; ``D`` must be swap-symmetric.
    """
    from scipy.sparse.linalg import LinearOperator, eigsh

    tol = _tol(tol)
    p = model.check_params(params)
    perm = head_swap(model, layer, heads)
    basis = subspace_basis(perm, "head_antisymmetric")
    n = perm.size
    dim = basis[0].size
    s = 1.0 / np.sqrt(np.asarray(D, dtype=np.float64))
    eps = 0.0 if model.readout == "softmax" else float(task.default_eps)

    def op(y):
        x = basis_embed(n, basis, np.ravel(y)) * s
        return basis_project(basis, flatten_params(_catformer_hvp_flat(task, model, p, x, eps)) * s)

    L = LinearOperator((dim, dim), matvec=op, dtype=np.float64)
    v0 = np.random.default_rng(0).standard_normal(dim)
    lo = eigsh(L, k=k, which="SA", v0=v0, tol=tol)
    hi = eigsh(L, k=k, which="LA", v0=v0, tol=tol)
    vals = np.concatenate([lo[0], hi[0]])
    vecs = np.concatenate([lo[1], hi[1]], axis=1)
    order = np.argsort(vals)
    full = np.stack([basis_embed(n, basis, vecs[:, j]) * s for j in order], axis=1)
    return vals[order], full


def parent_preference(task, model, x, layer=0, heads=(0, 1)) -> np.ndarray:
    """Toward which parent each head moves along a flat direction ``x`` (e.g. ``δ`` or an eigenvector).

    For each head ``h`` of ``heads`` and each row ``i`` with two parent slots (two-parent graph), the
    change of the positional-block logit gap ``x[Ã^(1)_h[S+i, S+p_0(i)]] − x[Ã^(1)_h[S+i, S+p_1(i)]]``;
    returns the mean over rows, shape ``(2,)``: ``> 0`` = toward slot 0 (``(i−1)//2``), ``< 0`` = slot 1.
    Only for ``layer = 0`` and a :class:`popgrad.MultiParentTask` with two slots.
    """
    if layer != 0 or not isinstance(task, MultiParentTask) or task.k != 2:
        raise ValueError("parent_preference reads layer 1 of a two-parent task (layer=0, k=2)")
    P = unflatten_params(model, x).A[0]
    S = model.S
    s0, s1 = task.graph.slot_parents(0), task.graph.slot_parents(1)
    rows = np.flatnonzero((s0 >= 0) & (s0 != s1))
    out = []
    for h in heads:
        out.append(float(np.mean(P[h, S + rows, S + s0[rows]] - P[h, S + rows, S + s1[rows]])) if rows.size else 0.0)
    return np.array(out)


class SymmetryRun(NamedTuple):
    """An exact trajectory from a (near-)symmetric start with its linearisation (:func:`follow_symmetric_start`).

    Per step ``t = 0 … steps`` (before update ``t``; the last entry is after the last update):

    Attributes
    ----------
    step, lr, loss : ndarray
    delta : ndarray
        Measured ``‖δ_t‖`` (flat antisymmetric part, ``δ = (θ − swap θ)/2``).
    delta_lin : ndarray
        The linearised ``‖δ̂_t‖`` (``δ̂_0 = δ_0``; module docstring: GD or the Adam recursion).
    cos_lin : ndarray
        ``cos(δ_t, δ̂_t)``.
    err_lin : ndarray
        ``‖δ_t − δ̂_t‖ / ‖δ_t‖`` (how well the linearisation predicts the measured difference).
    spec_step : ndarray
        Steps where the antisymmetric spectrum was computed.
    lam_min, lam_max : ndarray
        Smallest / largest eigenvalue of ``H_anti(θ̄_t)`` there.
    plam_min : ndarray
        Smallest eigenvalue of Adam's ``D^{-1/2} H_anti D^{-1/2}`` (NaN for GD).
    pref_eig : ndarray (n_spec, 2)
        :func:`parent_preference` of the most negative antisymmetric eigenvector (sign fixed so that it
        points along ``δ_t``): toward which parent each head is pushed.
    pref_delta : ndarray (steps + 1, 2)
        :func:`parent_preference` of the measured ``δ_t`` (NaN when the task is not two-parent).
    final : CatFormerParams
    optimizer : str
    """

    step: np.ndarray
    lr: np.ndarray
    loss: np.ndarray
    delta: np.ndarray
    delta_lin: np.ndarray
    cos_lin: np.ndarray
    err_lin: np.ndarray
    spec_step: np.ndarray
    lam_min: np.ndarray
    lam_max: np.ndarray
    plam_min: np.ndarray
    pref_eig: np.ndarray
    pref_delta: np.ndarray
    final: CatFormerParams
    optimizer: str

    def unstable_step(self):
        """First spectrum step where the antisymmetric direction is unstable (GD: ``λ_min < 0``; Adam: the
        preconditioned ``λ_min < 0``), or ``None``."""
        adam = self.optimizer in ("adam", "adamw") or not np.all(np.isnan(self.plam_min))  # Adam's reading
        lam = self.plam_min if adam else self.lam_min
        idx = np.flatnonzero(lam < 0)
        return int(self.spec_step[idx[0]]) if idx.size else None


def follow_symmetric_start(task, model, start, steps, optimizer="gd", lr=1.0, lr_schedule="constant",
                           weight_decay=0.0, layer=0, heads=(0, 1), spectrum_every=None, k=1,
                           spectrum_tol=1e-8, progress=False, *, gradient="exact", batch_size=1024, sample_seed=0,
                           linearize_until=None, spectrum_steps=None, preconditioned=True) -> SymmetryRun:
    """Step the exact trajectory from ``start`` and the linearised heads' difference beside it (module docstring).

    The update is :meth:`popgrad.train.optim.Optimizer.step` on the exact gradient (the rule of
    :func:`popgrad.train_catformer`; the trajectory is bit-identical to it). ``optimizer``: a name (with
    ``lr``, ``lr_schedule``, ``weight_decay``) or a rule object carrying its own; the linearisation is the
    rule's ``linearisation`` (:class:`popgrad.train.optim.Linearisation`), and a rule without one is refused.
    The linearisation is about the symmetric part ``θ̄_t`` of the measured trajectory, with one exact
    Hessian-vector product (:func:`popgrad.catformer_hvp`) per step; the antisymmetric spectrum (Lanczos, ``k`` per end) every
    ``spectrum_every`` steps (default ``max(1, steps // 16)``; ``eigsh`` tolerance ``spectrum_tol``), or at the
    steps listed in ``spectrum_steps`` (and the last).

    ``gradient="sampled"`` follows ``train_catformer(gradient="sampled", batch_size=, sample_seed=)`` instead
    (bit-identical: batch ``t`` from ``SeedSequence([sample_seed, t])``, the batch-mean loss's gradient). Every
    sequence's loss is swap-invariant, so the batch gradient at a symmetric point is symmetric too: sampling
    noise does not create a heads' difference, it multiplies one. The linearisation then uses the *batch*
    Hessian at ``θ̄_t`` (:func:`popgrad.engine.hvp.catformer_rows_hvp`, ``δ_{t+1} = (I − η_t H_B,t) δ_t`` for
    SGD), i.e. it is the linearisation of the sampled step actually taken; ``loss`` is the exact population
    loss, the spectra the population Hessian's. ``linearize_until``: carry ``δ̂`` only through that step (NaN
    after; the products are the cost). ``preconditioned=False`` skips Adam's preconditioned spectrum.
    """
    if not isinstance(model, CatFormer):
        raise ArgumentTypeError(f"model must be a popgrad.CatFormer, got {type(model).__name__}")
    steps = as_int(steps, "steps", minimum=1)
    spectrum_every = max(1, steps // 16) if spectrum_every is None else as_int(spectrum_every, "spectrum_every",
                                                                               minimum=1)
    if gradient not in ("exact", "sampled"):
        raise ValueError(f"gradient must be 'exact' or 'sampled', got {gradient!r}")
    sampled = gradient == "sampled"
    batch_size = as_int(batch_size, "batch_size", minimum=1)
    sample_seed = as_int(sample_seed, "sample_seed", minimum=0)
    lin_end = steps if linearize_until is None else as_int(linearize_until, "linearize_until", minimum=0)
    spec_at = None if spectrum_steps is None else {as_int(t, "spectrum_steps[]", minimum=0) for t in spectrum_steps}
    spectrum_tol = _tol(spectrum_tol)
    rule, lin = _linearised_rule(optimizer, lr, lr_schedule, steps, weight_decay)
    wd, adam = lin.weight_decay, lin.kind == "adam"
    step = rule.step if isinstance(rule, Optimizer) else _transform_step(rule)
    p = model.check_params(start)
    perm = head_swap(model, layer, heads)
    shapes = [a.shape for a in p.A] + [p.W.shape]
    sizes = [int(np.prod(s)) for s in shapes]
    eps = 0.0 if model.readout == "softmax" else float(task.default_eps)
    two = isinstance(task, MultiParentTask) and task.k == 2 and layer == 0

    def split(x):
        out, off = [], 0
        for s, n in zip(shapes, sizes):
            out.append(x[off:off + n].reshape(s))
            off += n
        return out

    arrays = [a.copy() for a in p.A] + [p.W.copy()]
    state = rule.init(arrays)
    x = flatten_params(p)
    dlin = (x - x[perm]) / 2
    mu_l = np.zeros_like(x)
    nu_l = np.zeros_like(x)
    mbar = np.zeros_like(x)
    vbar = np.zeros_like(x)
    rec = {k_: [] for k_ in ("step", "lr", "loss", "delta", "delta_lin", "cos", "err", "pref")}
    spec = {k_: [] for k_ in ("step", "lmin", "lmax", "plmin", "pref")}
    b1, b2, e = lin.b1, lin.b2, lin.eps
    for t in range(steps + 1):
        x = np.concatenate([a.reshape(-1) for a in arrays])
        delta = (x - x[perm]) / 2
        xbar = (x + x[perm]) / 2
        params = CatFormerParams(arrays[:-1], arrays[-1])
        if sampled:
            batch = task.sample(batch_size, np.random.SeedSequence([sample_seed, t]))
            bw = batch.targets / batch_size
            res = catformer_batch_loss_and_grad(batch.seqs, bw, model, params, eps)  # the trainer's kernel
            loss_t = catformer_loss(task, model, params)
        else:
            res = catformer_loss_and_grad(task, model, params)
            loss_t = res.loss
        g = np.concatenate([a.reshape(-1) for a in res.dA] + [res.dW.reshape(-1)])
        lr_t = lin.learning_rate(t)
        nd, nl = float(np.linalg.norm(delta)), float(np.linalg.norm(dlin))
        rec["step"].append(t)
        rec["lr"].append(lr_t)
        rec["loss"].append(loss_t)
        rec["delta"].append(nd)
        lin_on = t <= lin_end
        rec["delta_lin"].append(nl if lin_on else float("nan"))
        rec["cos"].append(float(delta @ dlin / (nd * nl)) if nd > 0 and nl > 0 and lin_on else float("nan"))
        rec["err"].append(float(np.linalg.norm(delta - dlin) / nd) if nd > 0 and lin_on else float("nan"))
        rec["pref"].append(parent_preference(task, model, delta, layer, heads) if two else np.full(2, np.nan))
        pbar = unflatten_params(model, xbar)
        gbar = (g + g[perm]) / 2
        if adam and lin.decay == "coupled" and wd:  # coupled decay: the rule's moments see g + wd θ
            gbar = gbar + wd * xbar
        if adam:  # the symmetric moments the linearisation expands about
            mbar = (1 - b1) * gbar + b1 * mbar
            vbar = (1 - b2) * gbar * gbar + b2 * vbar
        if (t in spec_at if spec_at is not None else t % spectrum_every == 0) or t == steps:
            sp = hessian_spectrum(task, model, pbar, k=k, which="both", subspace="head_antisymmetric",
                                  layer=layer, heads=heads, tol=spectrum_tol)
            spec["step"].append(t)
            spec["lmin"].append(float(sp.values[0]))
            spec["lmax"].append(float(sp.values[-1]))
            vec = sp.vectors[:, 0]
            if vec @ delta < 0:
                vec = -vec
            spec["pref"].append(parent_preference(task, model, vec, layer, heads) if two else np.full(2, np.nan))
            if adam and preconditioned:
                n_ = t + 1
                D = np.sqrt(vbar / (1 - b2**n_)) + e
                pv, _ = preconditioned_spectrum(task, model, pbar, D, k=k, layer=layer, heads=heads, tol=spectrum_tol)
                spec["plmin"].append(float(pv[0]))
            else:
                spec["plmin"].append(float("nan"))
            if progress:
                print(f"step {t}: loss {loss_t:.6f}, |delta| {nd:.3e} (lin {nl:.3e}), lam_anti "
                      f"[{sp.values[0]:.4g}, {sp.values[-1]:.4g}]", flush=True)
        if t == steps:
            break
        if t >= lin_end:  # no more linearisation: the exact step only
            arrays, state = step(t, arrays, [*res.dA, res.dW], state)
            continue
        # the linearised step (about θ̄_t), then the exact one
        if sampled:
            gam = flatten_params(_rows_hvp_flat(batch.seqs, bw, model, pbar, dlin, eps))
        else:
            gam = flatten_params(_catformer_hvp_flat(task, model, pbar, dlin, eps))
        if adam:
            n_ = t + 1
            c1, c2 = 1 - b1**n_, 1 - b2**n_
            if lin.decay == "coupled" and wd:
                gam = gam + wd * dlin
            mu_l = (1 - b1) * gam + b1 * mu_l
            nu_l = 2 * (1 - b2) * gbar * gam + b2 * nu_l
            sv = np.sqrt(vbar / c2)
            with np.errstate(divide="ignore", invalid="ignore"):
                second = np.where(sv > 0, (mbar / c1) * (nu_l / c2) / (2 * sv * (sv + e) ** 2), 0.0)
            du = (mu_l / c1) / (sv + e) - second
            if lin.decay == "decoupled" and wd:
                du = du + wd * dlin
            dlin = dlin - lr_t * du
        else:
            dlin = dlin - lr_t * (gam + wd * dlin)
        arrays, state = step(t, arrays, [*res.dA, res.dW], state)
    return SymmetryRun(np.array(rec["step"]), np.array(rec["lr"]), np.array(rec["loss"]), np.array(rec["delta"]),
                       np.array(rec["delta_lin"]), np.array(rec["cos"]), np.array(rec["err"]), np.array(spec["step"]),
                       np.array(spec["lmin"]), np.array(spec["lmax"]), np.array(spec["plmin"]),
                       np.array(spec["pref"]), np.array(rec["pref"]), CatFormerParams(arrays[:-1], arrays[-1]),
                       str(getattr(rule, "name", "custom")))


def _linearised_rule(optimizer, lr, lr_schedule, steps, weight_decay):
    """``(rule, its Linearisation)`` of :func:`follow_symmetric_start`: a name is the
    :class:`popgrad.train.optim.Optimizer` of these settings; an object (an ``Optimizer`` or any rule with
    ``init``/``update``) carries its own schedule and decay. A rule without a linearisation is refused."""
    if isinstance(optimizer, str):
        rule = Optimizer(optimizer, lr, lr_schedule, steps, weight_decay)
    elif isinstance(optimizer, GradientTransformationLike):
        if (lr, lr_schedule, weight_decay) != (1.0, "constant", 0.0):
            raise ValueError("lr, lr_schedule and weight_decay go with an optimizer name; an optimizer object carries "
                             "its own: leave them at their defaults")
        rule = optimizer
    else:
        raise ArgumentTypeError(f"optimizer must be a name or an object with init and update methods, "
                                f"got {type(optimizer).__name__}")
    lin = linearisation_of(rule)
    if lin is None:
        name = getattr(rule, "name", type(rule).__name__)
        raise ValueError(f"optimizer {name!r} carries no linearisation (popgrad.train.optim.Linearisation): the "
                         "study cannot linearise its step; give the rule one (linearisation=...) or use gd, sgd, "
                         "adam or adamw")
    return rule, lin


def _transform_step(rule):
    """``step(t, params, grads, state)`` of any ``init``/``update`` rule (optax semantics, as the trainers)."""
    def step(t, params, grads, state):
        updates, state = rule.update(grads, state, params)
        return apply_updates(params, updates), state

    return step


# ============================================================ read-outs
class PositionalMargins(NamedTuple):
    """Each head's positional block read on its parents (the official figure's matrix, DESIGN §19).

    Attributes
    ----------
    attention : ndarray (m, T, T)
        ``softmax_rows(MASK(Ã^(1)_h[S:, S:]))`` per head.
    rows : ndarray (r,)
        Rows with parents (non-roots ``i < T−1`` and the last row, whose slots are the target's parents).
    slot_mass : ndarray (m, r, k)
        Head ``h``'s attention on slot ``σ``'s parent in each row.
    margin : ndarray (m, r, k)
        ``slot_mass`` minus the largest attention of that row on a position that is no parent of it.
    preference : ndarray (m, r)
        Two slots: ``slot_mass[..., 0] − slot_mass[..., 1]`` (``> 0``: the row prefers ``(i−1)//2``).
    """

    attention: np.ndarray
    rows: np.ndarray
    slot_mass: np.ndarray
    margin: np.ndarray
    preference: np.ndarray


def positional_margins(task, model, params) -> PositionalMargins:
    """Per-row margin of each head's positional block on its parents (:class:`PositionalMargins`)."""
    if not isinstance(task, MultiParentTask):
        raise ArgumentTypeError("task must be a popgrad.MultiParentTask (parent slots)")
    A = positional_attention(model, params)
    g = task.graph
    slots = np.stack([g.slot_parents(s) for s in range(g.k)])  # (k, T)
    rows = np.flatnonzero(slots[0] >= 0)
    m = A.shape[0]
    mass = np.zeros((m, rows.size, g.k))
    margin = np.zeros_like(mass)
    for r, i in enumerate(rows):
        par = set(int(slots[s, i]) for s in range(g.k))
        others = [j for j in range(i + 1) if j not in par]
        for h in range(m):
            best_other = max((A[h, i, j] for j in others), default=0.0)
            for s in range(g.k):
                mass[h, r, s] = A[h, i, slots[s, i]]
                margin[h, r, s] = mass[h, r, s] - best_other
    pref = mass[..., 0] - mass[..., 1] if g.k == 2 else np.full((m, rows.size), np.nan)
    return PositionalMargins(A, rows, mass, margin, pref)


def _ablate(model, params, heads_off):
    """Parameters whose function is the model's with the layer-1 outputs of ``heads_off`` set to zero.

    Zeroing the features ``Z`` of ``h^(1)`` (head ``h``'s block) is exactly: every later ``Ã`` with its rows
    and columns at ``Z`` (and at ``Z``'s copies inside later heads' blocks) zeroed, and the same rows of ``W``.
    """
    dims = model.dims
    d0 = dims[0]
    Z = np.zeros(dims[1], dtype=bool)
    for h in heads_off:
        Z[d0 * (1 + h): d0 * (2 + h)] = True
    A = [a.copy() for a in params.A]
    for l in range(1, model.n_layers):
        A[l][:, Z, :] = 0.0
        A[l][:, :, Z] = 0.0
        Z = np.concatenate([Z] * (1 + model.heads[l]))
    W = params.W.copy()
    W[Z, :] = 0.0
    return CatFormerParams(A, W)


def slot_count_loss(task, slots=(0, 1), smoothing=0.5) -> float:
    """Exact loss of the in-context count estimator on the given parent slots (``(σ,)`` one parent, ``(0, 1)`` two).

    ``f_c = (#{i ∈ M : s_i = c} + a) / (|M| + S a)``, ``M = {non-root i ≤ T−2 : s_{p(i)_σ} = s_{tp_σ}`` for every
    ``σ`` in ``slots}``, ``a = smoothing`` (Krichevsky–Trofimov ``1/2`` by default, so the cross entropy is
    finite); ``L = −Σ_s Σ_c w(s, c) log f_c(s)``, every sequence enumerated.
    """
    if not isinstance(task, MultiParentTask):
        raise ArgumentTypeError("task must be a popgrad.MultiParentTask")
    a = as_real(smoothing, "smoothing", minimum=0, strict=True)
    g = task.graph
    par, tp = np.asarray(g.parents), np.asarray(g.target_parents)
    ctx = np.array([i for i in g.non_roots if i < task.T - 1], dtype=np.int64)
    sl = list(slots)
    total = 0.0
    for seqs, w in task.enumerate(chunk_size=4096):
        if ctx.size:
            match = np.all(seqs[:, par[ctx][:, sl]] == seqs[:, tp[sl]][:, None, :], axis=2)
        else:
            match = np.zeros((len(seqs), 0), dtype=bool)
        onehot = (seqs[:, ctx, None] == np.arange(task.S)).astype(np.float64)
        cnt = np.einsum("ni,nic->nc", match.astype(np.float64), onehot)
        f = (cnt + a) / (match.sum(axis=1)[:, None] + task.S * a)
        total -= float(np.sum(w * np.log(f)))
    return total


class HeadAblation(NamedTuple):
    """Exact losses with layer-1 heads' outputs zeroed, beside count references on the same task.

    ``loss``: intact; ``ablated[h]``: head ``h`` zeroed; ``both``: every layer-1 head zeroed; ``one_parent[σ]``:
    :func:`slot_count_loss` on slot ``σ`` alone; ``two_parent``: on both slots; ``bayes``: the Bayes loss.
    """

    loss: float
    ablated: np.ndarray
    both: float
    one_parent: np.ndarray
    two_parent: float
    bayes: float


def head_ablation(task, model, params, smoothing=0.5) -> HeadAblation:
    """Head ablation of layer 1 with the one-parent and two-parent count references (:class:`HeadAblation`)."""
    from ..engine.baselines import bayes_loss

    p = model.check_params(params)
    m = model.heads[0]
    ablated = np.array([catformer_loss(task, model, _ablate(model, p, [h])) for h in range(m)])
    both = catformer_loss(task, model, _ablate(model, p, list(range(m))))
    k = task.k if isinstance(task, MultiParentTask) else 1
    one = np.array([slot_count_loss(task, (s,), smoothing) for s in range(k)])
    two = slot_count_loss(task, tuple(range(k)), smoothing)
    return HeadAblation(catformer_loss(task, model, p), ablated, both, one, two, bayes_loss(task))


class Plateau(NamedTuple):
    """A flat stretch of a loss curve: steps ``start … stop`` (inclusive), its loss, and whether it is the end."""

    start: int
    stop: int
    loss: float
    final: bool


def find_plateaus(loss, rel_tol=1e-3, min_len=None) -> list:
    """Flat stretches of a loss curve (one value per step).

    Rule: with ``Δ = L_0 − min L`` (the total drop) and window ``w = min_len`` (default
    ``max(5, len(loss) // 50)``), step ``t`` is *flat* when the loss drops by less than ``rel_tol · Δ`` over
    ``t … t + w``; a plateau is a maximal run of flat steps of length ``≥ w``, extended by the window. The
    last one is ``final`` when it reaches the end (convergence, not a plateau to escape).
    """
    L = np.asarray(loss, dtype=np.float64)
    n = L.size
    w = max(5, n // 50) if min_len is None else as_int(min_len, "min_len", minimum=1)
    if n <= w:
        return []
    drop = L[0] - L.min()
    if drop <= 0:
        return [Plateau(0, n - 1, float(L[0]), True)]
    flat = (L[:n - w] - L[w:]) < rel_tol * drop
    out = []
    t = 0
    while t < flat.size:
        if flat[t]:
            s = t
            while t < flat.size and flat[t]:
                t += 1
            if t - s >= w:
                stop = min(t - 1 + w, n - 1)
                out.append(Plateau(int(s), int(stop), float(L[s]), stop == n - 1))
        else:
            t += 1
    return out
