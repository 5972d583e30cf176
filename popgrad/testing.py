"""Conformance checks any :class:`popgrad.Model` can run: :func:`check_model` (as scikit-learn's
``check_estimator`` does for estimators).

A model that passes them gets the whole public API through the seam: the exact loss and gradient
(:func:`popgrad.loss_and_grad`, with ``client=``), training (:func:`popgrad.train_model`), the
Hessian-vector product (:func:`popgrad.hvp`, when ``complex_safe``) and the checks that read its
layer-1 attention.
"""
from __future__ import annotations

import math
import pickle

import numpy as np

from .model.protocol import MEMBERS, as_model, check_params, flatten, model_attr, model_eps, unflatten

__all__ = ["check_model", "ModelCheckError", "CHECKS", "OPTIONAL_CHECKS"]

#: The checks :func:`check_model` runs, in order.
CHECKS = ("protocol", "sizes", "param_shapes", "init", "seeds", "predict", "loss", "additivity", "gradient",
          "complex_step", "layer1_attention", "pickle")
#: The checks of optional members, run (and reported) only when the model has the member.
OPTIONAL_CHECKS = ("query_attention",)


class ModelCheckError(AssertionError):
    """A model that does not conform to :class:`popgrad.Model`: the message names the check and the fix."""


def _fail(check, what, fix):
    raise ModelCheckError(f"check_model [{check}]: {what}; {fix}")


def _loss_from_predict(model, params, seqs, w, eps) -> float:
    f = np.asarray(model.predict(params, seqs), dtype=np.float64)
    pos = w > 0
    return -float(np.sum(w[pos] * np.log(f[pos] + eps)))


def check_model(model, task, *, scale: float = 0.5, seed: int = 0, n: int = 24, rtol: float = 1e-6) -> dict:
    """Run the conformance checks of :data:`CHECKS` on ``model`` with rows of ``task``; raise at the first failure.

    Checks: the protocol's members; ``S`` and ``T`` equal the task's; ``param_shapes()`` a mapping of
    names to shapes; ``init(scale, seed)`` float64 finite arrays of those names and shapes, the same for
    the same seed and different for another; ``predict`` rows of shape ``(n, S)``, non-negative, summing
    to 1; ``loss_and_grad_rows``'s loss equal to ``-Σ w log(f + ε)`` from ``predict`` and additive over
    rows (an enumeration in blocks sums its rows); its gradient against central finite differences of
    that loss in random directions; a ``complex_safe`` model's gradient against a complex step; the
    layer-1 attention ``(n, H, T, T)``, causal rows summing to 1; the model pickles (``client=`` ships it).
    Of :data:`OPTIONAL_CHECKS`, those of the members the model has: ``query_attention`` ``(n, H, T)``, rows
    summing to 1.

    Parameters
    ----------
    model : Model
    task : Task or MultiParentTask
        Its sampled rows (``task.sample(n, seed)``, soft labels as weights) are the test inputs.
    scale, seed : float, int
        The start ``model.init(scale, seed)`` the checks run at.
    n : int
        Rows.
    rtol : float
        Relative tolerance of the finite-difference gradient check.

    Returns
    -------
    dict
        ``check name -> "ok"`` (every check of :data:`CHECKS` that applies; ``"skipped: ..."`` otherwise),
        and ``"ok"`` for each check of :data:`OPTIONAL_CHECKS` whose member the model has.

    Raises
    ------
    ModelCheckError
        The first check that fails (an ``AssertionError``; one line naming the check and the fix).

    Examples
    --------
    >>> import popgrad as pg
    >>> from popgrad.testing import check_model
    >>> task = pg.Task(pg.chain(4), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=2, seed=0))
    >>> report = check_model(pg.ReducedModel(2, 4), task)
    >>> report["gradient"]
    'ok'
    """
    out = {}
    try:
        as_model(model)
    except (TypeError, ValueError) as exc:
        _fail("protocol", str(exc), f"implement every member of popgrad.Model ({', '.join(MEMBERS)})")
    out["protocol"] = "ok"
    if (model.S, model.T) != (task.S, task.T):
        _fail("sizes", f"the model has S = {model.S}, T = {model.T} but the task S = {task.S}, T = {task.T}",
              "build the model for the task")
    out["sizes"] = "ok"
    try:
        shapes = dict(model.param_shapes())
        shapes = {k: tuple(int(d) for d in s) for k, s in shapes.items()}
    except Exception as exc:  # noqa: BLE001  (any failure of the user's code is the check's finding)
        _fail("param_shapes", f"param_shapes() failed ({type(exc).__name__}: {exc})",
              "return a mapping name -> tuple of int")
    if not shapes or not all(isinstance(k, str) and k and "." not in k for k in shapes):
        _fail("param_shapes", f"names {list(shapes)}", "use non-empty string names without '.'")
    out["param_shapes"] = "ok"

    params = model.init(scale, seed)
    try:
        names = list(params.keys())
    except AttributeError:
        _fail("init", f"init returned {type(params).__name__}", "return a mapping name -> float64 array")
    if sorted(names) != sorted(shapes):
        _fail("init", f"init returned the names {sorted(names)}, param_shapes() {sorted(shapes)}",
              "return every parameter of param_shapes() and nothing else")
    for k, s in shapes.items():
        a = params[k]
        if not isinstance(a, np.ndarray) or a.dtype != np.float64:
            _fail("init", f"init()[{k!r}] is {type(a).__name__} {getattr(a, 'dtype', '')}", "return float64 arrays")
        if a.shape != s:
            _fail("init", f"init()[{k!r}] has shape {a.shape}, param_shapes() says {s}", "make them agree")
        if not np.all(np.isfinite(a)):
            _fail("init", f"init()[{k!r}] is not finite", "draw finite parameters")
    params = check_params(model, params)
    out["init"] = "ok"
    again, other = model.init(scale, seed), model.init(scale, seed + 1)
    if not all(np.array_equal(params[k], np.asarray(again[k])) for k in shapes):
        _fail("seeds", "init(scale, seed) twice gave different parameters", "draw from numpy.random.default_rng(seed)")
    if scale > 0 and all(np.array_equal(params[k], np.asarray(other[k])) for k in shapes) \
            and any(np.any(params[k]) for k in shapes):
        _fail("seeds", "init with two seeds gave the same parameters", "use the seed")
    out["seeds"] = "ok"

    sample = task.sample(n, np.random.SeedSequence([seed, 7]))
    seqs, w = sample.seqs, sample.targets / n
    f = np.asarray(model.predict(params, seqs))
    if f.shape != (n, task.S):
        _fail("predict", f"predict returned shape {f.shape} for {n} sequences", f"return (n, S) = ({n}, {task.S})")
    if not np.all(np.isfinite(f)) or np.any(f < -1e-12) or not np.allclose(f.sum(axis=1), 1.0, rtol=0, atol=1e-10):
        _fail("predict", "predict rows are not probability distributions (finite, >= 0, summing to 1)",
              "return next-token probabilities")
    out["predict"] = "ok"

    eps = model_eps(task, model, None)
    loss, grads = model.loss_and_grad_rows(params, seqs, w, eps)
    ref = _loss_from_predict(model, params, seqs, w, eps)
    if not math.isclose(float(loss), ref, rel_tol=1e-10, abs_tol=1e-13):
        _fail("loss", f"loss_and_grad_rows gives {float(loss)!r}, -sum w log(predict + eps) gives {ref!r}",
              "compute loss = -sum_n sum_c w[n, c] log(f[n, c] + eps) with the forward of predict")
    try:
        grads = check_params(model, grads, "grads")
    except (TypeError, ValueError) as exc:
        _fail("loss", f"loss_and_grad_rows's gradients: {exc}", "return one gradient per parameter name")
    out["loss"] = "ok"
    h = n // 2
    l1, g1 = model.loss_and_grad_rows(params, seqs[:h], w[:h], eps)
    l2, g2 = model.loss_and_grad_rows(params, seqs[h:], w[h:], eps)
    if not math.isclose(float(l1) + float(l2), float(loss), rel_tol=1e-10, abs_tol=1e-13) or not all(
            np.allclose(np.asarray(g1[k]) + np.asarray(g2[k]), grads[k], rtol=1e-9, atol=1e-13) for k in shapes):
        _fail("additivity", "the loss or gradient of two halves of the rows does not add up to the whole's",
              "sum over the rows (no mean, no normalization by n: w carries the weights)")
    out["additivity"] = "ok"

    rng = np.random.default_rng(seed)
    theta = flatten(model, params)
    g = flatten(model, grads)
    step = 1e-5 * max(1.0, float(np.max(np.abs(theta))) if theta.size else 1.0)
    for _ in range(3):
        v = rng.standard_normal(theta.size)
        lp = _loss_from_predict(model, unflatten(model, theta + step * v), seqs, w, eps)
        lm = _loss_from_predict(model, unflatten(model, theta - step * v), seqs, w, eps)
        fd = (lp - lm) / (2 * step)
        an = float(g @ v)
        tol = rtol * (abs(an) + float(np.linalg.norm(g) * np.linalg.norm(v))) + 1e-9 * abs(ref) + 1e-12
        if not abs(fd - an) <= tol:
            _fail("gradient", f"the gradient along a random direction is {an!r}, finite differences of the loss "
                  f"give {fd!r}", "check the backward pass of loss_and_grad_rows against predict")
    out["gradient"] = "ok"

    if model_attr(model, "complex_safe", False):
        v = rng.standard_normal(theta.size)
        hc = 1e-20
        lc, _ = model.loss_and_grad_rows(unflatten(model, theta + 1j * hc * v), seqs, w, eps)
        cs = float(np.imag(lc) / hc)
        if not math.isclose(cs, float(g @ v), rel_tol=1e-8, abs_tol=1e-12 * (1 + float(np.linalg.norm(g)))):
            _fail("complex_step", f"complex_safe = True but Im L(θ + ih v)/h = {cs!r} differs from <grad, v> = "
                  f"{float(g @ v)!r}", "make loss_and_grad_rows holomorphic (softmax shifted by the real part) or "
                  "set complex_safe = False")
        out["complex_step"] = "ok"
    else:
        out["complex_step"] = "skipped: complex_safe is False"

    P = np.asarray(model.layer1_attention(params, seqs))
    if P.ndim != 4 or P.shape[0] != n or P.shape[2:] != (task.T, task.T):
        _fail("layer1_attention", f"shape {P.shape}", f"return (n, H, T, T) = ({n}, H, {task.T}, {task.T})")
    upper = ~np.tri(task.T, dtype=bool)
    if not np.all(np.isfinite(P)) or np.any(P < -1e-12) or np.any(np.abs(P[:, :, upper]) > 1e-12) \
            or not np.allclose(P.sum(axis=3), 1.0, rtol=0, atol=1e-10):
        _fail("layer1_attention", "rows are not causal probability distributions (>= 0, zero above the diagonal, "
              "summing to 1)", "return the layer-1 attention probabilities of every head")
    out["layer1_attention"] = "ok"

    if model_attr(model, "query_attention", None) is not None:  # optional: the induction-head check reads it
        Q = np.asarray(model.query_attention(params, seqs))
        if Q.ndim != 3 or Q.shape[0] != n or Q.shape[2] != task.T:
            _fail("query_attention", f"shape {Q.shape}", f"return (n, H, T) = ({n}, H, {task.T})")
        if not np.all(np.isfinite(Q)) or np.any(Q < -1e-12) or not np.allclose(Q.sum(axis=2), 1.0, rtol=0,
                                                                                    atol=1e-10):
            _fail("query_attention", "rows are not probability distributions over the T positions",
                  "return the layer-2 attention probabilities of the query of every head")
        out["query_attention"] = "ok"

    try:
        clone = pickle.loads(pickle.dumps(model))
    except Exception as exc:  # noqa: BLE001
        _fail("pickle", f"the model does not pickle ({type(exc).__name__}: {exc})",
              "define it at module level with picklable attributes (client= ships it to Dask workers)")
    if not np.array_equal(np.asarray(clone.predict(params, seqs)), f):
        _fail("pickle", "a pickled copy predicts differently", "keep every setting of the model in its attributes")
    out["pickle"] = "ok"
    return out
