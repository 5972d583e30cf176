"""The one exact front end for every :class:`popgrad.Model`: :func:`loss_and_grad` (DESIGN §26).

It validates once (the task, the model against the protocol and the task's ``S`` and ``T``, every
parameter by name, ``ε``, the size) and lets the model choose its engine:

* :class:`popgrad.ReducedModel` on its task kind -- the fast engines of :func:`popgrad.exact_loss_and_grad`
  (prefix / direct with the orbit reduction, or k heads), bit for bit that call;
* :class:`popgrad.CatFormer` -- :func:`popgrad.catformer_loss_and_grad` (the trie and rows kernels, the
  weight-table path, the orbit reduction), bit for bit that call;
* any other model -- the generic exact engine (:mod:`popgrad.engine.generic`): the enumeration in blocks,
  one ``loss_and_grad_rows`` call per block.

Every path takes ``client=`` (bit-identical to local) and returns one :class:`ModelLossAndGrad`
(``loss``, ``grads`` under the parameter names, ``engine``). :func:`rows_loss_and_grad` is the same
loss on given rows with given weights (a sampled batch: ``w = y / n``), through the model's fast rows
kernel where it has one; :func:`hvp` the Hessian-vector product of any model.
"""
from __future__ import annotations

import numpy as np

from .._validation import as_seqs
from ..model.catformer import CatFormer, CatFormerParams
from ..model.protocol import check_params, check_task_and_model, model_eps, model_name, n_parameters
from ..model.reduced_model import ReducedModel
from . import generic as _generic
from ._args import options_or_default
from .generic import ModelLossAndGrad

__all__ = ["loss_and_grad", "rows_loss_and_grad", "hvp", "hessian_operator", "ModelLossAndGrad", "validate",
           "check_memory", "TRAINING_COPIES"]

#: Copies of the parameters a training holds at once (parameters, gradient, optimizer state, workspace).
TRAINING_COPIES = 4


def check_memory(model) -> None:
    """Refuse, up front and naming its size, a model whose training cannot fit in half of this process's memory."""
    from .._io import memory_limit, size_text

    n = n_parameters(model)
    need = TRAINING_COPIES * 8 * n
    limit = memory_limit() or 2**40
    if need > limit // 2:
        raise ValueError(f"{model_name(model)} has {n:,} parameters (training holds about {size_text(need)}), more "
                         f"than half of the {size_text(limit)} this process may use: use a smaller model")


def validate(task, model, params, eps, name="params"):
    """``(params dict, eps)`` after the one validation of a ``(task, model, params)`` triple."""
    check_task_and_model(task, model)
    check_memory(model)
    p = check_params(model, params, name)
    return p, model_eps(task, model, eps)


def _engine_of(task, model) -> str:
    if isinstance(model, ReducedModel) and model.fast_task(task):
        return "reduced" if model.heads == 1 else "k-head"
    if isinstance(model, CatFormer):
        return "catformer"
    return "generic"


def loss_and_grad(task, model, params, *, eps=None, client=None, options=None) -> ModelLossAndGrad:
    """Exact population loss and gradients of any :class:`popgrad.Model` (DESIGN §26).

    Parameters
    ----------
    task : Task or MultiParentTask
        Graph and prior; ``S**T`` must pass ``task.check_size()``.
    model : Model
        Same ``S`` and ``T`` as the task (:class:`popgrad.ReducedModel`, :class:`popgrad.CatFormer`, or
        your own class with the members of :class:`popgrad.Model`).
    params : mapping
        ``name -> array`` with the names and shapes of ``model.param_shapes()`` (``model.init(scale, seed)``;
        a :class:`popgrad.CatFormerParams` works too); finite.
    eps : float, optional
        ``ε >= 0`` in ``-Σ w log(f + ε)``; default ``model.default_eps(task)`` when the model has that
        member, else ``task.default_eps`` (``T_eff**-0.5``).
    client : dask.distributed.Client, optional
        Split the enumeration's blocks over the client's workers; bit-identical to ``client=None``.
    options : EngineOptions, optional
        Engine tunables (block sizes); default :data:`popgrad.DEFAULT_OPTIONS`.

    Returns
    -------
    ModelLossAndGrad
        ``loss``, ``grads`` (``name -> array``), ``engine`` (which engine ran).

    Raises
    ------
    TypeError, ValueError
        A task or model of the wrong type, different ``S`` or ``T``, a missing, extra, misshapen or
        non-finite parameter (one line naming it and the fix).
    TaskTooLargeError
        If ``S**T`` exceeds ``task.max_sequences`` (before any work).

    Examples
    --------
    >>> import popgrad as pg
    >>> task = pg.Task(pg.chain(3), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=2, seed=0))
    >>> model = pg.CatFormer(2, 3)
    >>> res = pg.loss_and_grad(task, model, model.init(0.1, seed=0))
    >>> res.engine, sorted(res.grads)
    ('catformer', ['A_1', 'A_2', 'W'])
    """
    p, eps = validate(task, model, params, eps)
    return _exact(task, model, p, eps, True, client, options)


def _exact(task, model, p, eps, want_grad, client, options) -> ModelLossAndGrad:
    """The engine the model chooses, on validated input."""
    engine = _engine_of(task, model)
    if engine in ("reduced", "k-head"):
        from .api import _dispatch
        from ._args import validate as _reduced_validate

        A1, A2, eps = _reduced_validate(task, p["A1"], p["A2"], eps)
        r = _dispatch(task, A1, A2, eps, want_grad, "auto", "auto", options, client)
        return ModelLossAndGrad(r.loss, {"A1": r.dA1, "A2": r.dA2} if want_grad else None, engine)
    if engine == "catformer":
        from .catformer import _dispatch as _cat_dispatch

        cp = model.check_params(CatFormerParams.from_mapping(p))
        r = _cat_dispatch(task, model, cp, eps, want_grad, client, options_or_default(options), "auto")
        grads = {**{f"A_{i + 1}": a for i, a in enumerate(r.dA)}, "W": r.dW} if want_grad else None
        return ModelLossAndGrad(r.loss, grads, engine)
    if client is not None:
        from . import distributed as _distributed

        _distributed.check_client(client)
    return _generic.exact(task, model, p, eps, want_grad, client, options)


def loss(task, model, params, *, eps=None, client=None, options=None) -> float:
    """The exact population loss only (the model's ``predict`` on the generic engine: no backward pass)."""
    p, eps = validate(task, model, params, eps)
    return _exact(task, model, p, eps, False, client, options).loss


def rows_loss_and_grad(model, params, seqs, w, eps, options=None) -> ModelLossAndGrad:
    """``-Σ_n Σ_c w[n, c] log(f_c(s_n) + ε)`` and its gradients on given rows (a sampled batch: ``w = y / n``).

    The model's fast rows kernel where it has one (the reduced single-parent model:
    :func:`popgrad.engine.single.rows_loss_and_grad`; the CatFormer: its dense batch kernel), else the
    model's own ``loss_and_grad_rows``. ``params`` validated (:func:`validate`), ``eps`` a number.
    """
    seqs = as_seqs(seqs, model.T, model.S)
    w = np.ascontiguousarray(w, dtype=np.float64)
    if w.shape != (seqs.shape[0], model.S):
        raise ValueError(f"w must have shape (n, S) = ({seqs.shape[0]}, {model.S}), got {w.shape}")
    if isinstance(model, ReducedModel) and model.heads == 1:
        from .single import rows_loss_and_grad as _rows

        r = _rows(seqs, w, params["A1"], params["A2"], float(eps), options_or_default(options))
        return ModelLossAndGrad(r.loss, {"A1": r.dA1, "A2": r.dA2}, "reduced")
    if isinstance(model, CatFormer):
        from .catformer_rows import catformer_batch_loss_and_grad

        r = catformer_batch_loss_and_grad(seqs, w, model, CatFormerParams.from_mapping(params), float(eps))
        return ModelLossAndGrad(r.loss, {**{f"A_{i + 1}": a for i, a in enumerate(r.dA)}, "W": r.dW}, "catformer")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        l, g = model.loss_and_grad_rows(params, seqs, w, float(eps))
    return ModelLossAndGrad(float(l), {k: np.asarray(g[k], dtype=np.float64) for k in model.param_shapes()}, "generic")


def hvp(task, model, params, v, eps=None, client=None) -> dict:
    """Exact Hessian-vector product ``H v`` of any model's population loss (DESIGN §22, §26).

    ``params`` and ``v`` mappings with the model's names and shapes; returns ``H v`` as ``name -> array``.
    The reduced model: :func:`popgrad.engine.complex_step.hvp`; the CatFormer:
    :func:`popgrad.catformer_hvp`; any other model: a complex step through its ``loss_and_grad_rows``
    on the generic engine's blocks when it declares ``complex_safe = True``, else a one-line refusal.
    """
    p, eps = validate(task, model, params, eps)
    try:
        vd = check_params(model, v, "v")
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (v is the direction: the structure of params)") from None
    task.check_size()
    if isinstance(model, ReducedModel) and model.fast_task(task):
        from .complex_step import _reduced_hvp

        H1, H2 = _reduced_hvp(task, p["A1"], p["A2"], vd["A1"], vd["A2"], eps, client)
        return {"A1": H1, "A2": H2}
    if isinstance(model, CatFormer):
        from .complex_step import _catformer_hvp_flat, flatten_params

        cp = model.check_params(CatFormerParams.from_mapping(p))
        cv = model.check_params(CatFormerParams.from_mapping(vd))
        r = _catformer_hvp_flat(task, model, cp, flatten_params(cv), eps, client)
        return dict(r.items())
    if client is not None:
        from . import distributed as _distributed

        _distributed.check_client(client)
    return _generic.model_hvp(task, model, p, vd, eps, client)



def hessian_operator(task, model, params, eps=None, client=None, heads=(0, 1), method=None, reduced_swap=None):
    """``(n, matvec, perm_fn)``: the population Hessian of any model as the operator
    :func:`popgrad.hessian_spectrum` runs Lanczos on (DESIGN §22, §26).

    ``matvec(x)`` is :func:`hvp` in the flat coordinates of :func:`popgrad.model.protocol.flatten` (the order
    of ``param_shapes()``; the reduced model: ``[A1 | A2]``, the coordinates of ``model="reduced"``);
    ``perm_fn()`` the head swap of the ``subspace=`` restrictions: the k-head :class:`popgrad.ReducedModel`'s
    (heads ``heads``), ``None`` for one head, and for any other model a one-line refusal (no head swap known).
    ``method`` (``"tangent"``/``"complex_step"``) chooses the reduced model's product on its fast task (as
    ``model="reduced"``: the same bits); every other model has the complex step of :func:`hvp` only.
    ``reduced_swap(A1shape, A2shape, heads)`` is the k-head reduced model's flat swap (the caller's:
    :mod:`popgrad.engine.hessian` passes its own, so neither module imports the other's).
    """
    from ..model.protocol import flatten, unflatten

    p, eps_ = validate(task, model, params, eps)
    task.check_size()
    n = n_parameters(model)

    if isinstance(model, ReducedModel) and model.fast_task(task):
        from .complex_step import _reduced_hvp

        def matvec(x):
            v = unflatten(model, np.asarray(x, dtype=np.float64))
            return np.concatenate([h.ravel() for h in _reduced_hvp(task, p["A1"], p["A2"], v["A1"], v["A2"], eps_,
                                                                    client, method)])
    else:
        def matvec(x):
            return flatten(model, hvp(task, model, p, unflatten(model, np.asarray(x, dtype=np.float64)), eps_,
                                      client))

    if isinstance(model, ReducedModel):
        if model.heads == 1 or reduced_swap is None:
            return n, matvec, None
        return n, matvec, lambda: reduced_swap(p["A1"].shape, p["A2"].shape, heads)

    def refuse():
        raise ValueError(f"subspace= needs a head swap of the parameters and {model_name(model)} has none known: "
                         "use subspace=None (the full spectrum)")

    return n, matvec, refuse
