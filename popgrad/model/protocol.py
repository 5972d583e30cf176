"""The one seam between a model and the rest of popgrad: the :class:`Model` protocol (DESIGN §26).

Every model popgrad trains exactly implements five members (a ``typing.Protocol``: no base class to
derive from, a plain class with these members is a model)::

    S, T                                    # alphabet size, sequence length (query last)
    param_shapes()                          # name -> shape of every parameter array
    init(scale, seed)                       # a start: name -> float64 array (the names of param_shapes)
    predict(params, seqs)                   # (n, S) next-token probabilities, the NumPy reference forward
    loss_and_grad_rows(params, seqs, w, eps)
        # (loss, grads) with loss = -Σ_n Σ_c w[n, c] log(f[n, c] + eps) and grads under the parameter
        # names: the NumPy reference backward. w are row weights times targets, so an exact enumeration
        # (w = the task's exact weights) and a sampled batch (w = y / n) make the same call.
    layer1_attention(params, seqs)          # (n, H, T, T) layer-1 attention probabilities per sequence:
        # H heads, rows causal (zero above the diagonal) and summing to 1; the checks average it with
        # the task's exact weights.

Optional members (read with :func:`model_attr`; absent means the default):

* ``complex_safe: bool = False`` -- ``loss_and_grad_rows`` works on complex parameters (holomorphic:
  a softmax shifted by the real part, no ``abs``/``max`` of complex values), so the Hessian-vector
  product can be taken by a complex step through it (:func:`popgrad.hvp`);
* ``default_eps(task) -> float`` -- the loss perturbation when a caller passes ``eps=None``
  (default: ``task.default_eps``, the paper's ``T_eff**-0.5``);
* ``query_attention(params, seqs) -> (n, H_2, T)`` -- the layer-2 attention of the query (last position)
  over the positions, what the induction-head check reads
  (:func:`popgrad.checks.check_model_induction_head`; ``H_2 = 0`` for a model with one layer; absent:
  that check is not applicable).

:func:`as_model` checks an object against the protocol (one line naming the missing members),
:func:`check_params` validates a parameter mapping against ``param_shapes`` (missing, extra,
misshapen, non-finite entries: one line naming the parameter and the fix), :func:`check_task_and_model`
a task and a model of the same ``S`` and ``T``. :func:`popgrad.testing.check_model` runs the
conformance checks any user's model can run.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from .._validation import ArgumentTypeError

__all__ = ["Model", "MEMBERS", "as_model", "is_model", "check_params", "param_dict", "check_task_and_model",
           "model_attr", "model_eps", "model_name", "n_parameters", "flatten", "unflatten"]

#: The members every :class:`Model` has (attributes first).
MEMBERS = ("S", "T", "param_shapes", "init", "predict", "loss_and_grad_rows", "layer1_attention")


@runtime_checkable
class Model(Protocol):
    """What every model popgrad trains implements (module docstring: the members and their contract).

    Attributes
    ----------
    S : int
        Alphabet size.
    T : int
        Sequence length, the query included.

    Examples
    --------
    >>> import popgrad as pg
    >>> isinstance(pg.ReducedModel(3, 4), pg.Model), isinstance(pg.CatFormer(3, 4), pg.Model)
    (True, True)
    >>> dict(pg.ReducedModel(3, 4).param_shapes())
    {'A1': (4, 4), 'A2': (3, 3)}
    """

    S: int
    T: int

    def param_shapes(self) -> Mapping:
        """``name -> shape`` (a tuple of int) of every parameter array."""

    def init(self, scale, seed) -> Mapping:
        """A seeded start: ``name -> float64 array`` with the names and shapes of :meth:`param_shapes`."""

    def predict(self, params, seqs) -> np.ndarray:
        """``(n, S)`` next-token probabilities of the sequences ``seqs`` ``(n, T)`` (NumPy reference forward)."""

    def loss_and_grad_rows(self, params, seqs, w, eps) -> tuple:
        """``(loss, grads)``: ``loss = -Σ_n Σ_c w[n, c] log(f[n, c] + eps)``, ``grads`` under the parameter names."""

    def layer1_attention(self, params, seqs) -> np.ndarray:
        """``(n, H, T, T)`` layer-1 attention probabilities of every sequence (causal rows summing to 1)."""


def is_model(obj) -> bool:
    """Whether ``obj`` has every member of :class:`Model` (``S``, ``T`` and the five methods)."""
    return not isinstance(obj, type) and isinstance(obj, Model)


def as_model(model, where: str = "model"):
    """``model`` itself when it implements :class:`Model`; else a one-line ``TypeError`` naming what is missing."""
    if isinstance(model, type):
        raise ArgumentTypeError(f"{where} must be a model instance, got the class {model.__name__}: "
                                f"instantiate it, e.g. {model.__name__}(S, T)")
    missing = [m for m in MEMBERS if not hasattr(model, m)]
    if missing:
        raise ArgumentTypeError(
            f"{where} must implement popgrad.Model ({', '.join(MEMBERS)}); {type(model).__name__} lacks "
            f"{', '.join(missing)}: add {'them' if len(missing) > 1 else 'it'} (see popgrad.Model)")
    for m in MEMBERS[2:]:
        if not callable(getattr(model, m)):
            raise ArgumentTypeError(f"{where}.{m} must be a method (popgrad.Model), "
                                    f"got {type(getattr(model, m)).__name__}")
    for a in ("S", "T"):
        v = getattr(model, a)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < 1:
            raise ValueError(f"{where}.{a} must be a positive integer, got {v!r}")
    return model


def model_name(model) -> str:
    """A short text naming the model (its ``repr`` when short, else its class)."""
    text = repr(model)
    return text if len(text) <= 80 and not text.startswith("<") else type(model).__name__


def model_attr(model, name: str, default):
    """An optional member of a model (``complex_safe``, ``default_eps``, ``query_attention``), or ``default``."""
    return getattr(model, name, default)


def model_eps(task, model, eps):
    """The loss perturbation of a call: ``eps`` validated, or the model's ``default_eps(task)``
    (``task.default_eps`` for a model without that member)."""
    from .._validation import as_eps

    if eps is None:
        fn = getattr(model, "default_eps", None)
        return as_eps(task, None) if fn is None else as_eps(task, fn(task))
    return as_eps(task, eps)


def _shapes(model) -> dict:
    shapes = model.param_shapes()
    if not isinstance(shapes, Mapping) or not shapes:
        raise ArgumentTypeError(f"{model_name(model)}.param_shapes() must return a non-empty mapping name -> shape, "
                                f"got {type(shapes).__name__}")
    out = {}
    for k, s in shapes.items():
        if not isinstance(k, str) or not k or "." in k:
            raise ValueError(f"{model_name(model)}.param_shapes(): parameter names must be non-empty strings "
                             f"without '.', got {k!r}")
        try:
            out[k] = tuple(int(d) for d in s)
        except TypeError:
            raise ArgumentTypeError(f"{model_name(model)}.param_shapes()[{k!r}] must be a tuple of int, "
                                    f"got {s!r}") from None
    return out


def param_dict(params) -> dict:
    """``params`` as a plain ``dict`` name -> value (any mapping, :class:`popgrad.CatFormerParams` included)."""
    if isinstance(params, Mapping):
        return dict(params.items())
    keys = getattr(params, "keys", None)
    if callable(keys):
        return {k: params[k] for k in keys()}
    raise ArgumentTypeError(f"params must be a mapping name -> array (as model.init(scale, seed) returns), "
                            f"got {type(params).__name__}")


def check_params(model, params, name: str = "params", dtype=np.float64) -> dict:
    """``params`` as ``{name: contiguous finite array}`` in the order of ``model.param_shapes()``.

    One-line errors naming the parameter and the fix: a missing entry, an extra entry, a wrong shape, a
    non-real or non-finite entry. ``dtype=complex`` accepts complex entries (the complex step).
    """
    shapes = _shapes(model)
    given = param_dict(params)
    missing = [k for k in shapes if k not in given]
    extra = [k for k in given if k not in shapes]
    if missing:
        raise ValueError(f"{name} lacks {', '.join(repr(k) for k in missing)} (shape "
                         f"{', '.join(str(shapes[k]) for k in missing)}): pass every parameter of "
                         f"{model_name(model)}.param_shapes() ({', '.join(shapes)}), e.g. model.init(scale, seed)")
    if extra:
        raise ValueError(f"{name} has {', '.join(repr(k) for k in extra)}, not a parameter of {model_name(model)} "
                         f"(its parameters: {', '.join(shapes)}): drop {'them' if len(extra) > 1 else 'it'}")
    out = {}
    for k, shape in shapes.items():
        v = given[k]
        if dtype is np.float64 and np.iscomplexobj(v):
            raise ArgumentTypeError(f"{name}[{k!r}] must be real (float64), got a complex array")
        try:
            a = np.ascontiguousarray(v, dtype=dtype)
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"{name}[{k!r}] must be a real array of shape {shape}, "
                                    f"got {type(v).__name__}") from None
        if a.shape != shape:
            raise ValueError(f"{name}[{k!r}] must have shape {shape}, got {a.shape}: use the shapes of "
                             f"model.param_shapes()")
        if not np.all(np.isfinite(a)):
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
            raise ValueError(f"{name}[{k!r}]{list(bad)} = {a[bad]} is not finite: parameters must be finite")
        out[k] = a
    return out


def check_task_and_model(task, model):
    """``model`` checked against :class:`Model` and against the task's ``S`` and ``T`` (one-line errors)."""
    from ..task.tasks import check_task

    check_task(task)
    as_model(model)
    if (int(model.S), int(model.T)) != (task.S, task.T):
        raise ValueError(f"the model has S = {model.S}, T = {model.T} but the task has S = {task.S}, T = {task.T}: "
                         f"build the model for the task, e.g. {type(model).__name__}({task.S}, {task.T}, ...)")
    return model


def n_parameters(model) -> int:
    """The number of scalar parameters (Python integers: no overflow)."""
    return sum(math.prod(s) for s in _shapes(model).values())


def flatten(model, params) -> np.ndarray:
    """The parameters as one vector, in the order of ``param_shapes()`` (C order inside each array)."""
    shapes = _shapes(model)
    return np.concatenate([np.asarray(params[k]).ravel() for k in shapes]) if shapes else np.zeros(0)


def unflatten(model, x) -> dict:
    """The inverse of :func:`flatten`: ``{name: array}`` of the model's shapes (a view of ``x`` when possible)."""
    out, i = {}, 0
    for k, s in _shapes(model).items():
        n = math.prod(s)
        out[k] = np.asarray(x[i:i + n]).reshape(s)
        i += n
    return out
