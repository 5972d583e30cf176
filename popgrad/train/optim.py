"""Optimizers as gradient transformations, with optax's names and semantics (DESIGN §14).

An optimizer is an object with two methods (optax's ``GradientTransformation``)::

    state = opt.init(params)                              # a mapping of arrays
    updates, state = opt.update(grads, state, params)     # grads, updates: the layout of params
    params = apply_updates(params, updates)               # params + updates, leaf by leaf

``params``, ``grads`` and ``updates`` are mappings name → float64 array (the
full model: ``A_1 … A_L, W``; lists and tuples of arrays work too), and the
state is a mapping of arrays (nested mappings allowed; keys without ``"."``),
so a checkpoint saves it whole and a resumed run is bit-identical. Any object
with these two methods can train the full model
(``train_catformer(optimizer=...)``); the building blocks, as in optax:

* :func:`scale_by_learning_rate` (``u ← −lr_t·u``; a float or a schedule) and
  :func:`scale_by_schedule` (``u ← s(t)·u``), with ``t`` the count of updates so far;
* :func:`add_decayed_weights` (``u ← u + wd·θ``);
* :func:`scale_by_adam` (bias-corrected moments, ``u ← m̂/(√v̂ + eps)``);
* :func:`chain` (apply one after the other);
* schedules are functions of the step: :func:`constant_schedule`,
  :func:`cosine_decay_schedule` (``lr·½(1 + cos(π·min(t, steps)/steps))``,
  ``alpha = 0``, exponent 1).

The official rules (each bit-identical to optax, tests/train/test_optim.py):

* :func:`sgd` = ``scale_by_learning_rate(lr)``; the official SGD with coupled
  decay is ``chain(add_decayed_weights(wd), sgd(lr))`` (``g ← g + wd·θ``; ``θ ← θ − lr_t·g``);
* :func:`adam` = ``chain(scale_by_adam(b1, b2, eps), scale_by_learning_rate(lr))``;
* :func:`adamw` = ``chain(scale_by_adam(...), add_decayed_weights(wd), scale_by_learning_rate(lr))``
  (decoupled decay)::

      m ← (1 − b1)·g + b1·m          v ← (1 − b2)·g² + b2·v        (m, v start at 0)
      n = count + 1                  m̂ = m / (1 − b1ⁿ)             v̂ = v / (1 − b2ⁿ)
      u = m̂ / (√v̂ + eps) + wd·θ      θ ← θ + (−lr_t)·u

:class:`Optimizer` is the validated string form (``"sgd"``/``"gd"``,
``"adam"``, ``"adamw"`` with ``lr``, ``lr_schedule``, ``steps``,
``weight_decay``) that ``popgrad run`` and ``train_catformer(optimizer="adamw",
...)`` use; it is itself such an object (:meth:`Optimizer.transformation`).
Defaults ``b1 = 0.9``, ``b2 = 0.999``, ``eps = 1e-8`` are optax's.

A new optimizer is one function here returning :class:`GradientTransformation`
(or any object with ``init``/``update``; a ``name`` attribute identifies it in
checkpoints and a ``learning_rate(t)`` method is recorded in the trajectory).

**Linearisation.** The study of the symmetric start
(:func:`popgrad.checks.symmetry_breaking.follow_symmetric_start`) carries the first-order
expansion of a rule's step about a head-symmetric point; it reads it from the rule's
``linearisation`` attribute, a :class:`Linearisation` (the kind of recursion, the
learning-rate schedule, the weight decay and how it enters, Adam's constants), and
refuses a rule whose ``linearisation`` is ``None`` or absent. :func:`sgd`, :func:`adam`,
:func:`adamw` and every named rule (:data:`LINEARISED`) carry theirs; a rule added to
:data:`NAMED` without an entry in :data:`LINEARISED`, a :func:`chain` and any other object
carry none until one is given (``GradientTransformation(..., linearisation=...)``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from .._validation import as_int, as_real

__all__ = ["OPTIMIZERS", "NAMED", "LINEARISED", "LR_SCHEDULES", "Optimizer", "Linearisation", "linearisation_of",
           "GradientTransformation", "GradientTransformationLike",
           "learning_rate", "constant_schedule", "cosine_decay_schedule", "sgd", "adam", "adamw", "chain",
           "add_decayed_weights", "scale_by_adam", "scale_by_learning_rate", "scale_by_schedule", "apply_updates",
           "tree_map", "flatten_state", "unflatten_state"]

#: Learning-rate schedules of the string form.
LR_SCHEDULES = ("constant", "cosine")


# ------------------------------------------------------------------ trees (mappings / sequences of arrays)
def tree_map(f, tree, *rest):
    """``f`` applied leaf by leaf to ``tree`` and the trees ``rest`` of the same layout.

    A tree is a mapping (its keys in the order of ``tree``), a list/tuple, or an array leaf.
    """
    if isinstance(tree, Mapping):
        return {k: tree_map(f, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [tree_map(f, v, *(r[i] for r in rest)) for i, v in enumerate(tree)]
    return f(tree, *rest)


def apply_updates(params, updates):
    """``params + updates`` leaf by leaf (``optax.apply_updates``); new arrays, nothing in place."""
    return tree_map(lambda p, u: p + u, params, updates)


def flatten_state(state, prefix: str = "") -> dict:
    """The leaves of a (nested) state mapping under ``"."``-joined keys: ``{"0.count": …, "1.mu.W": …}``."""
    out = {}
    if isinstance(state, (list, tuple)):
        state = {str(i): v for i, v in enumerate(state)}
    if not isinstance(state, Mapping):
        raise TypeError(f"optimizer state must be a mapping of arrays, got {type(state).__name__} at "
                        f"{prefix.rstrip('.') or 'the top'}")
    for k, v in state.items():
        if not isinstance(k, str) or not k or "." in k:
            raise ValueError(f"optimizer state keys must be non-empty strings without '.', got {k!r}")
        if isinstance(v, (Mapping, list, tuple)):
            out.update(flatten_state(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = np.asarray(v)
    return out


def unflatten_state(flat: Mapping, like):
    """The state of layout ``like`` (as :meth:`init` returns) with its leaves read from ``flat``."""
    def walk(node, prefix):
        if isinstance(node, Mapping):
            return {k: walk(v, f"{prefix}{k}.") for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return type(node)(walk(v, f"{prefix}{i}.") for i, v in enumerate(node))
        return flat[prefix[:-1]]
    return walk(like, "")


# ------------------------------------------------------------------ schedules (functions of the step)
def constant_schedule(value: float) -> Callable[[int], float]:
    """``t ↦ value`` (``optax.constant_schedule``)."""
    value = float(value)

    def schedule(count: int) -> float:
        return value
    schedule.name = f"constant_schedule({value!r})"
    return schedule


def cosine_decay_schedule(init_value: float, decay_steps: int) -> Callable[[int], float]:
    """``t ↦ init_value·½(1 + cos(π·min(t, decay_steps)/decay_steps))`` (``optax.cosine_decay_schedule``,
    ``alpha = 0``, ``exponent = 1``)."""
    init_value = float(init_value)
    decay_steps = as_int(decay_steps, "decay_steps", minimum=1)

    def schedule(count: int) -> float:
        return init_value * (0.5 * (1.0 + math.cos(math.pi * min(count, decay_steps) / decay_steps)))
    schedule.name = f"cosine_decay_schedule({init_value!r}, {decay_steps})"
    return schedule


def learning_rate(lr: float, schedule: str, steps: int, t: int) -> float:
    """``lr_t`` of step ``t`` of the string form: ``lr`` or ``lr·½(1 + cos(π·min(t, steps)/steps))``."""
    if schedule == "constant":
        return float(lr)
    return cosine_decay_schedule(lr, steps)(t)


def _schedule_name(s) -> str:
    return getattr(s, "name", None) or getattr(s, "__qualname__", type(s).__name__)


# ------------------------------------------------------------------ transformations
@dataclass(frozen=True)
class Linearisation:
    """What a study needs to linearise one rule's step about a head-symmetric point (module docstring).

    Attributes
    ----------
    kind : {"gd", "adam"}
        ``"gd"``: ``δ ← δ − η_t (H δ + wd δ)``; ``"adam"``: the first-order Adam recursion of
        :mod:`popgrad.checks.symmetry_breaking` (moments ``μ``, ``ν``, bias correction, the ``eps`` term).
    learning_rate : callable
        ``t ↦ η_t`` (the rule's schedule).
    weight_decay : float
        ``wd ≥ 0``.
    decay : {"coupled", "decoupled"}
        ``"coupled"``: the rule transforms ``g + wd θ`` (sgd, adam with decay); ``"decoupled"``: ``wd θ``
        joins the transformed update (adamw). The same for ``kind="gd"``.
    b1, b2, eps : float
        Adam's constants (read for ``kind="adam"`` only).
    """

    kind: str
    learning_rate: Callable[[int], float]
    weight_decay: float = 0.0
    decay: str = "coupled"
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self):
        if self.kind not in ("gd", "adam"):
            raise ValueError(f"Linearisation.kind must be 'gd' or 'adam', got {self.kind!r}")
        if self.decay not in ("coupled", "decoupled"):
            raise ValueError(f"Linearisation.decay must be 'coupled' or 'decoupled', got {self.decay!r}")
        if not callable(self.learning_rate):
            raise TypeError(f"Linearisation.learning_rate must be a schedule t -> lr_t, got "
                            f"{type(self.learning_rate).__name__}")
        object.__setattr__(self, "weight_decay", as_real(self.weight_decay, "weight_decay", minimum=0))


def linearisation_of(rule):
    """The rule's :class:`Linearisation` (its ``linearisation`` attribute), or ``None`` when it has none."""
    lin = getattr(rule, "linearisation", None)
    if lin is not None and not isinstance(lin, Linearisation):
        raise TypeError(f"{getattr(rule, 'name', type(rule).__name__)}.linearisation must be a "
                        f"popgrad.train.optim.Linearisation or None, got {type(lin).__name__}")
    return lin


@runtime_checkable
class GradientTransformationLike(Protocol):
    """What ``train_catformer(optimizer=...)`` accepts besides a name: ``init`` and ``update``."""

    def init(self, params) -> Mapping: ...

    def update(self, grads, state, params=None) -> tuple: ...


@dataclass(frozen=True)
class GradientTransformation:
    """``init(params) → state`` and ``update(grads, state, params) → (updates, state)`` (optax's pair).

    ``name`` identifies the rule (a checkpoint must be resumed with the same one); ``learning_rate``,
    when given, is the schedule ``t ↦ lr_t`` the trajectory records; ``linearisation``, when given, the
    :class:`Linearisation` the symmetry study reads (``None``: the study refuses the rule).
    """

    init: Callable[[Any], Mapping]
    update: Callable[..., tuple]
    name: str = "custom"
    learning_rate: Callable[[int], float] | None = None
    linearisation: Linearisation | None = None


def _count(state) -> int:
    return int(state["count"])


def scale_by_schedule(step_size_fn: Callable[[int], float]) -> GradientTransformation:
    """``u ← step_size_fn(count)·u``, ``count`` = updates so far (``optax.scale_by_schedule``)."""
    def init(params):
        return {"count": np.array(0, dtype=np.int64)}

    def update(updates, state, params=None):
        s = float(step_size_fn(_count(state)))
        return tree_map(lambda u: u * s, updates), {"count": np.array(_count(state) + 1, dtype=np.int64)}

    return GradientTransformation(init, update, f"scale_by_schedule({_schedule_name(step_size_fn)})")


def scale_by_learning_rate(learning_rate, *, flip_sign: bool = True) -> GradientTransformation:
    """``u ← −lr_t·u`` (``optax.scale_by_learning_rate``); ``learning_rate`` a float or a schedule ``t ↦ lr_t``."""
    sched = learning_rate if callable(learning_rate) else constant_schedule(
        as_real(learning_rate, "learning_rate", minimum=0))
    m = -1.0 if flip_sign else 1.0
    inner = scale_by_schedule(lambda count: m * sched(count))
    return GradientTransformation(inner.init, inner.update, f"scale_by_learning_rate({_schedule_name(sched)})", sched)


def add_decayed_weights(weight_decay: float = 0.0) -> GradientTransformation:
    """``u ← u + wd·θ`` (``optax.add_decayed_weights``); needs ``params``."""
    wd = as_real(weight_decay, "weight_decay", minimum=0)

    def init(params):
        return {}

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("add_decayed_weights needs params: call update(grads, state, params)")
        return tree_map(lambda u, p: u + wd * p, updates, params), state

    return GradientTransformation(init, update, f"add_decayed_weights({wd!r})")


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> GradientTransformation:
    """Adam's bias-corrected moments (``optax.scale_by_adam``, ``eps_root = 0``): ``u ← m̂/(√v̂ + eps)``."""
    for name, v in (("b1", b1), ("b2", b2)):
        v = as_real(v, name, minimum=0)
        if v >= 1:
            raise ValueError(f"{name} must be in [0, 1), got {v}")
    b1, b2, eps = float(b1), float(b2), as_real(eps, "eps", minimum=0, strict=True)

    def init(params):
        zeros = tree_map(lambda p: np.zeros_like(np.asarray(p, dtype=np.float64)), params)
        return {"count": np.array(0, dtype=np.int64), "mu": zeros, "nu": tree_map(np.copy, zeros)}

    def update(updates, state, params=None):
        n = _count(state) + 1
        c1 = 1.0 - b1**n
        c2 = 1.0 - b2**n
        mu = tree_map(lambda g, m: (1.0 - b1) * g + b1 * m, updates, state["mu"])
        nu = tree_map(lambda g, v: (1.0 - b2) * (g * g) + b2 * v, updates, state["nu"])
        out = tree_map(lambda m, v: (m / c1) / (np.sqrt(v / c2) + eps), mu, nu)
        return out, {"count": np.array(n, dtype=np.int64), "mu": mu, "nu": nu}

    return GradientTransformation(init, update, f"scale_by_adam(b1={b1!r}, b2={b2!r}, eps={eps!r})")


def chain(*transforms) -> GradientTransformation:
    """Apply ``transforms`` one after the other (``optax.chain``); state ``{"0": …, "1": …}``."""
    for i, tr in enumerate(transforms):
        if not isinstance(tr, GradientTransformationLike):
            raise TypeError(f"chain: transform {i} must have init and update methods, got {type(tr).__name__}")

    def init(params):
        return {str(i): tr.init(params) for i, tr in enumerate(transforms)}

    def update(updates, state, params=None):
        new = {}
        for i, tr in enumerate(transforms):
            updates, new[str(i)] = tr.update(updates, state[str(i)], params)
        return updates, new

    lrs = [tr.learning_rate for tr in transforms if getattr(tr, "learning_rate", None) is not None]
    name = "chain(" + ", ".join(getattr(tr, "name", type(tr).__qualname__) for tr in transforms) + ")"
    return GradientTransformation(init, update, name, lrs[0] if len(lrs) == 1 else None)


def sgd(learning_rate) -> GradientTransformation:
    """Plain gradient descent ``θ ← θ − lr_t·g`` (``optax.sgd`` without momentum)."""
    inner = scale_by_learning_rate(learning_rate)
    return GradientTransformation(inner.init, inner.update, f"sgd({_schedule_name(inner.learning_rate)})",
                                  inner.learning_rate, Linearisation("gd", inner.learning_rate))


def adam(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> GradientTransformation:
    """``optax.adam``: ``chain(scale_by_adam(b1, b2, eps), scale_by_learning_rate(learning_rate))``."""
    inner = chain(scale_by_adam(b1, b2, eps), scale_by_learning_rate(learning_rate))
    return GradientTransformation(inner.init, inner.update, inner.name.replace("chain(", "adam(", 1),
                                  inner.learning_rate,
                                  Linearisation("adam", inner.learning_rate, 0.0, "coupled", b1, b2, eps))


def adamw(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 1e-4) -> GradientTransformation:
    """``optax.adamw``: Adam with decoupled weight decay ``u ← m̂/(√v̂ + eps) + wd·θ`` before ``−lr_t``."""
    inner = chain(scale_by_adam(b1, b2, eps), add_decayed_weights(weight_decay),
                  scale_by_learning_rate(learning_rate))
    return GradientTransformation(inner.init, inner.update, inner.name.replace("chain(", "adamw(", 1),
                                  inner.learning_rate,
                                  Linearisation("adam", inner.learning_rate, weight_decay, "decoupled", b1, b2, eps))


# ------------------------------------------------------------------ the string form
def _coupled(wd, core):
    """``g ← g + wd·θ`` before ``core`` (left out at ``wd = 0``: bit-identical to optax's ``+ 0·θ``)."""
    return chain(add_decayed_weights(wd), core) if wd else core


#: The official rules by name: ``name → build(schedule, settings)`` (settings: the :class:`Optimizer`).
#: A named optimizer (``popgrad run --optimizer NAME``) is one entry here.
NAMED = {
    "gd": lambda sched, o: _coupled(o.weight_decay, sgd(sched)),
    "sgd": lambda sched, o: _coupled(o.weight_decay, sgd(sched)),
    "adam": lambda sched, o: _coupled(o.weight_decay, adam(sched, o.b1, o.b2, o.eps)),
    "adamw": lambda sched, o: adamw(sched, o.b1, o.b2, o.eps, weight_decay=o.weight_decay) if o.weight_decay
    else adam(sched, o.b1, o.b2, o.eps),
}

#: Optimizer names (the keys of :data:`NAMED`): ``"gd"`` and ``"sgd"`` are the same rule.
OPTIMIZERS = tuple(NAMED)

#: The linearisation of each named rule: ``name → build(schedule, settings)`` (a :class:`Linearisation`).
#: A rule of :data:`NAMED` without an entry here has none: the symmetry study refuses it.
LINEARISED = {
    "gd": lambda sched, o: Linearisation("gd", sched, o.weight_decay, "coupled"),
    "sgd": lambda sched, o: Linearisation("gd", sched, o.weight_decay, "coupled"),
    "adam": lambda sched, o: Linearisation("adam", sched, o.weight_decay, "coupled", o.b1, o.b2, o.eps),
    "adamw": lambda sched, o: Linearisation("adam", sched, o.weight_decay, "decoupled", o.b1, o.b2, o.eps),
}

@dataclass(frozen=True)
class Optimizer:
    """One of the official optimizers by name, validated; a transformation itself (``init``/``update``).

    Parameters
    ----------
    name : {"gd", "sgd", "adam", "adamw"}
    lr : float
        Peak learning rate (``> 0``).
    lr_schedule : {"constant", "cosine"}
    steps : int
        ``decay_steps`` of the cosine schedule (the run's length, ``>= 1``).
    weight_decay : float
        ``wd >= 0``: coupled for ``"sgd"``/``"gd"``/``"adam"``
        (``chain(add_decayed_weights(wd), …)``), decoupled for ``"adamw"``.
    b1, b2, eps : float
        Adam's constants (optax defaults).
    """

    name: str = "sgd"
    lr: float = 1.0
    lr_schedule: str = "cosine"
    steps: int = 1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self):
        if not isinstance(self.name, str) or self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS} or an object with init and update methods, "
                             f"got {self.name!r}")
        if not isinstance(self.lr_schedule, str) or self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        object.__setattr__(self, "lr", as_real(self.lr, "lr", minimum=0, strict=True))
        object.__setattr__(self, "steps", as_int(self.steps, "steps", minimum=1))
        object.__setattr__(self, "weight_decay", as_real(self.weight_decay, "weight_decay", minimum=0))
        for name in ("b1", "b2"):
            v = as_real(getattr(self, name), name, minimum=0)
            if v >= 1:
                raise ValueError(f"{name} must be in [0, 1), got {v}")
            object.__setattr__(self, name, v)
        object.__setattr__(self, "eps", as_real(self.eps, "eps", minimum=0, strict=True))
        object.__setattr__(self, "_tx", self._build())

    @property
    def is_adam(self) -> bool:
        return self.name in ("adam", "adamw")

    @property
    def linearisation(self) -> Linearisation | None:
        """The :class:`Linearisation` of this rule (:data:`LINEARISED`), ``None`` for a rule without one."""
        build = LINEARISED.get(self.name)
        return None if build is None else build(self.schedule(), self)

    def schedule(self) -> Callable[[int], float]:
        """The learning-rate schedule ``t ↦ lr_t``."""
        if self.lr_schedule == "constant":
            return constant_schedule(self.lr)
        return cosine_decay_schedule(self.lr, self.steps)

    def _build(self) -> GradientTransformation:
        return NAMED[self.name](self.schedule(), self)

    def transformation(self) -> GradientTransformation:
        """The optax-style transformation of this rule."""
        return self._tx

    def learning_rate(self, t: int) -> float:
        """The learning rate of step ``t``."""
        return self.schedule()(t)

    lr_at = learning_rate

    def init(self, params):
        """The state before the first step (a mapping: counts, and Adam's zero moments shaped like ``params``)."""
        return self._tx.init(params)

    def update(self, grads, state, params=None):
        """``(updates, new_state)`` of one step (optax semantics)."""
        return self._tx.update(grads, state, params)

    def step(self, t: int, params, grads, state):
        """Apply one update: ``(new_params, new_state)``. ``t`` is the step (it must equal the updates so far)."""
        counts = [int(v) for k, v in flatten_state(state).items() if k.split(".")[-1] == "count"]
        if counts and counts[-1] != t:
            raise ValueError(f"step t = {t} but the state has taken {counts[-1]} updates: pass the state of step t")
        updates, state = self._tx.update(grads, state, params)
        return apply_updates(params, updates), state
