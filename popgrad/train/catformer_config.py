"""The settings of one full-model training run (:class:`CatFormerTrainConfig`, DESIGN §19).

Validated once, where the config is built (:meth:`CatFormerTrainConfig.__post_init__`); every later layer
(:func:`popgrad.train.catformer.train_catformer`, its scheme, the checkpoint) receives the object.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .._validation import ArgumentTypeError, as_int, as_real
from .optim import LR_SCHEDULES, OPTIMIZERS, GradientTransformationLike, Optimizer

__all__ = ["CatFormerTrainConfig", "CATFORMER_GRADIENTS", "DEFAULT_BATCH_SIZE"]

#: The full model's gradients: the exact population one, or a fresh sampled batch at every step.
CATFORMER_GRADIENTS = ("exact", "sampled")

#: The batch size of ``gradient="sampled"`` when none is given (the official code's).
DEFAULT_BATCH_SIZE = 1024

_RULE_SETTINGS = ("lr", "lr_schedule", "weight_decay")


def _optimizer_name(opt) -> str:
    if isinstance(opt, str):
        return opt
    return str(getattr(opt, "name", None) or f"{type(opt).__module__}.{type(opt).__qualname__}")


@dataclass(frozen=True)
class CatFormerTrainConfig:
    """Settings of one :func:`train_catformer` run, validated where it is built (everything a checkpoint
    must match).

    ``optimizer`` is a name of :data:`popgrad.train.optim.OPTIMIZERS` (with ``lr``, ``lr_schedule``,
    ``weight_decay``) or an optax-style object with ``init``/``update`` (those three are then unused).
    ``init`` is ``"zero"``, ``"normal"`` (with ``init_scale``, ``init_seed``) or ``"given"``
    (``init_fingerprint`` is then the SHA-256 of the given arrays). ``record_every=None`` resolves to
    ``max(1, steps // 128)``. ``gradient`` is ``"exact"`` or ``"sampled"``; ``batch_size`` (default 1024)
    and ``sample_seed`` (default 0) belong to the sampled gradient only.
    """

    S: int = 2
    T: int = 2
    heads: tuple = (1, 1)
    readout: str = "softmax"
    steps: int = 1
    optimizer: object = "sgd"
    lr: float = 1.0
    lr_schedule: str = "cosine"
    weight_decay: float = 0.0
    init: str = "zero"
    init_scale: float = 0.0
    init_seed: int = 0
    init_fingerprint: str = ""
    record_every: int | None = 1
    eps: float | None = None
    divergence_patience: int = 100
    gradient: str = "exact"
    batch_size: int | None = None
    sample_seed: int | None = None

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        put("S", as_int(self.S, "S", minimum=2))
        put("T", as_int(self.T, "T", minimum=1))
        if isinstance(self.heads, (list, tuple)) and self.heads:
            put("heads", tuple(as_int(h, "heads", minimum=1) for h in self.heads))
        else:
            raise ValueError(f"heads must be a non-empty tuple of head counts per layer, got {self.heads!r}")
        if self.readout not in ("softmax", "linear"):
            raise ValueError(f"readout must be 'softmax' or 'linear', got {self.readout!r}")
        put("steps", as_int(self.steps, "steps", minimum=1))
        opt = self.optimizer
        if isinstance(opt, str):
            if opt not in OPTIMIZERS:
                raise ValueError(f"optimizer must be one of {OPTIMIZERS} or an object with init and update "
                                 f"methods (popgrad.train.optim.adamw(...), ...), got {opt!r}")
        elif not isinstance(opt, GradientTransformationLike):
            raise ArgumentTypeError(f"optimizer must be one of {OPTIMIZERS} or an object with init and update "
                                    f"methods, got {type(opt).__name__}")
        if not isinstance(self.lr_schedule, str) or self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        put("lr", as_real(self.lr, "lr", minimum=0, strict=True))
        put("weight_decay", as_real(self.weight_decay, "weight_decay", minimum=0))
        if self.init not in ("zero", "normal", "given"):
            raise ValueError(f"init must be 'zero', 'normal' or 'given', got {self.init!r}")
        put("init_scale", as_real(self.init_scale, "init scale", minimum=0))
        put("init_seed", as_int(self.init_seed, "init seed", minimum=0))
        put("record_every", max(1, self.steps // 128) if self.record_every is None
            else as_int(self.record_every, "record_every", minimum=1))
        if self.eps is not None:
            put("eps", as_real(self.eps, "eps", minimum=0))
        put("divergence_patience", as_int(self.divergence_patience, "divergence_patience", minimum=1))
        if not isinstance(self.gradient, str) or self.gradient not in CATFORMER_GRADIENTS:
            raise ValueError(f"gradient must be one of {CATFORMER_GRADIENTS}, got {self.gradient!r}")
        if self.gradient == "sampled":
            put("batch_size", DEFAULT_BATCH_SIZE if self.batch_size is None
                else as_int(self.batch_size, "batch_size", minimum=1))
            put("sample_seed", 0 if self.sample_seed is None else as_int(self.sample_seed, "sample_seed", minimum=0))
        else:
            for name in ("batch_size", "sample_seed"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is only used with gradient='sampled': drop it or set "
                                     f"gradient='sampled'")
        # the named rule, built (and its settings checked) here once
        put("_rule", Optimizer(opt, lr=self.lr, lr_schedule=self.lr_schedule, steps=self.steps,
                               weight_decay=self.weight_decay) if isinstance(opt, str) else opt)

    def optimizer_rule(self):
        """The optimizer object: :class:`popgrad.train.optim.Optimizer` of a name, or the object given."""
        if self._rule is None:
            raise ValueError(f"this configuration was read from a file: its optimizer {self.optimizer!r} was an "
                             "object and cannot be rebuilt from its name; pass the object as optimizer=")
        return self._rule

    def to_dict(self) -> dict:
        """The settings as JSON-able values (an optimizer object by its ``name``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["heads"] = list(self.heads)
        out["optimizer"] = _optimizer_name(self.optimizer)
        return out

    @classmethod
    def from_dict(cls, d) -> "CatFormerTrainConfig":
        """The config :meth:`to_dict` wrote (files of earlier versions lack the newer settings: defaults).
        An optimizer object comes back as its name (a description: it cannot be run again)."""
        d = dict(d)
        d["heads"] = tuple(d["heads"])
        name = d.get("optimizer", "sgd")
        if name not in OPTIMIZERS:
            d["optimizer"] = "sgd"
        out = cls(**d)
        if name not in OPTIMIZERS:  # a description only: the object cannot be rebuilt from its name
            object.__setattr__(out, "optimizer", name)
            object.__setattr__(out, "_rule", None)
        return out
