"""Training the k-head model exactly: stage-wise (Algorithm 1 with k heads) or joint (DESIGN §8, §9).

Initialization breaks the head symmetry deterministically: with identical
heads the gradients of the heads are identical (the loss is symmetric under
permuting heads), so identical heads stay identical forever. popgrad starts
from::

    A1^h(0) = init_scale · Z^h   (lower triangle incl. the diagonal; Z^h i.i.d. N(0, 1)
                                  from numpy.random.default_rng(init_seed), heads in order)
    A2^h(0) = β0 · I

``init_scale = 0`` gives identical heads (and they stay identical: tested).

Schedules (learning rates in the natural units of :mod:`popgrad.train.config`,
``η1 = lr1·S·T/β0``, ``η2 = lr2·S``):

* ``"two-stage"``: Stage 1 moves every ``A1^h`` with ``A2`` frozen at
  ``β0·I`` for ``steps1`` steps; Stage 2 moves every ``A2^h`` with ``A1``
  frozen for ``steps2`` steps.
* ``"joint"``: both move at every step for ``steps1 + steps2`` steps, with
  ``η1 = lr1·S·T`` (no ``1/β0``: ``A2`` leaves its initial scale at once)
  and ``η2``; this is how the paper's released code trains the multi-parent
  model (jointly, with Adam; popgrad uses exact full-batch gradient descent).

What the reduced k-head model learns depends on the schedule. Its query is
the soft vector ``Q^h = P^h[T-1,:] X``: at initialization ``P^h[T-1,:]`` is
nearly uniform, so ``Q^h`` is the sequence's token histogram and the
first-order (small-``β0``) gradient of ``A1^h`` rewards keys whose token is
frequent in the sequence, i.e. the diagonal (a unigram/copy solution).
Stage-wise training at small ``β0`` therefore tends to the diagonal. Joint
training at ``β0 = 2`` lets the query rows and the key rows co-adapt; what
it reaches was measured (``examples/multi_parent.py``, S = 2, T = 12,
Dirichlet(1) tensors closed under ``symmetrize="full"``): on the 3-gram the
two heads split the parents one-to-one from a random start, on the paper's
two-parent graph they settle in a mixed local minimum (one head mostly on
``i-1``) whose loss is above that of the specialized solution, which is a
stable minimum when started near the construction. Priors with few atoms
(or relabeling closure only, whose ``E[π]`` is not uniform) add
"copy a token" shortcuts that training finds first.

Returns the :class:`popgrad.Trajectory` of the single-parent dynamics with
per-head arrays: ``A1 (n, k, T, T)``, ``A2 (n, k, S, S)``,
``attn_parent (n, k, T)`` (head ``h``'s attention on slot ``h``'s parent,
:func:`attention_to_slot_parents`), ``cosine`` all NaN (no idealized
gradient for k heads). Checkpoint/resume and divergence detection are those
of :func:`popgrad.train_two_stage` (same machinery).
"""
from __future__ import annotations

import numpy as np

from .._validation import ArgumentTypeError
from ..engine.api import exact_loss_and_grad
from ..engine.table import prepare_table
from ..task.tasks import MultiParentTask, check_task
from .config import MultiHeadTrainConfig
from .loop import StepValues, run_schedule, start_state
from .reduced import MultiHeadScheme, attention_to_slot_parents, initial_parameters
from .trajectory import Trajectory

__all__ = ["MultiHeadTrainConfig", "MultiHeadScheme", "train_multi_head", "initial_parameters",
           "attention_to_slot_parents"]


def train_multi_head(
    task: MultiParentTask,
    *,
    beta0: float = MultiHeadTrainConfig.beta0,
    lr1: float = MultiHeadTrainConfig.lr1,
    steps1: int = MultiHeadTrainConfig.steps1,
    lr2: float = MultiHeadTrainConfig.lr2,
    steps2: int = MultiHeadTrainConfig.steps2,
    schedule: str = MultiHeadTrainConfig.schedule,
    init_seed: int = MultiHeadTrainConfig.init_seed,
    init_scale: float = MultiHeadTrainConfig.init_scale,
    A1_init=None,
    record_every: int = MultiHeadTrainConfig.record_every,
    eps: float | None = None,
    divergence_patience: int = MultiHeadTrainConfig.divergence_patience,
    config: MultiHeadTrainConfig | None = None,
    checkpoint_path=None,
    checkpoint_every: int = 0,
    resume: bool = False,
    progress: bool = False,
    client=None,
) -> Trajectory:
    """Train the k-head model exactly and record the trajectory.

    Parameters
    ----------
    task : MultiParentTask
    beta0 : float
        ``A2^h(0) = β0·I``.
    lr1, lr2 : float
        Natural-unit learning rates (module docstring).
    steps1, steps2 : int
        Stage lengths (``"joint"``: ``steps1 + steps2`` joint steps).
    schedule : {"joint", "two-stage"}
    init_seed : int
        Seed of the symmetry-breaking ``A1(0)``.
    init_scale : float
        Standard deviation of ``A1(0)`` (``0``: identical heads).
    A1_init : array_like, shape (k, T, T), optional
        Start from this ``A1`` instead (e.g. a weak construction, to test
        whether a solution is a stable minimum); ``init_seed`` and
        ``init_scale`` are then unused. Not part of the checkpoint's
        configuration check.
    record_every : int
        Record every this many steps (and the first/last step of each stage).
    eps : float, optional
        Loss perturbation; default ``T_eff ** -0.5``.
    divergence_patience : int
        Stop when the loss stays above its start (of the stage) for this many steps, or at once on a
        non-finite loss or parameter (as :func:`popgrad.train_two_stage`).
    config : MultiHeadTrainConfig, optional
        Every setting at once (``popgrad run`` passes its resolved one); the keyword settings
        above are then unused.
    checkpoint_path, checkpoint_every, resume, progress, client
        As in :func:`popgrad.train_two_stage`.

    Returns
    -------
    Trajectory
        ``A1 (n, k, T, T)``, ``A2 (n, k, S, S)``, ``attn_parent (n, k, T)``,
        ``cosine`` NaN; ``config`` is a :class:`MultiHeadTrainConfig`.
    """
    check_task(task, MultiParentTask, "train_multi_head (train_two_stage trains single-parent tasks)")
    if config is None:
        config = MultiHeadTrainConfig(
            beta0=beta0, lr1=lr1, steps1=steps1, lr2=lr2, steps2=steps2, gradient="exact", schedule=schedule,
            record_every=record_every, eps=eps, divergence_patience=divergence_patience,
            init_seed=init_seed, init_scale=init_scale,
        )
    elif not isinstance(config, MultiHeadTrainConfig):
        raise ArgumentTypeError(f"config must be a popgrad.MultiHeadTrainConfig, got {type(config).__name__}")
    cfg = config.validate()
    task.check_size()
    prepare_table(task)  # many exact steps on one task: the weight table, once (the one rule, DESIGN §20)
    if A1_init is not None:
        A1_init = np.array(A1_init, dtype=np.float64)
        shape = (task.k, task.T, task.T)
        if A1_init.shape != shape or not np.all(np.isfinite(A1_init)):
            raise ValueError(f"A1_init must be a finite array of shape (k, T, T) = {shape}, "
                             f"got shape {A1_init.shape}")
    scheme = MultiHeadScheme(task, cfg, A1_init)
    state = start_state(task, scheme, checkpoint_path, checkpoint_every, resume)

    def evaluate(t, stage, record) -> StepValues:
        res = exact_loss_and_grad(task, state.arrays["A1"], state.arrays["A2"], cfg.eps, client=client)
        return StepValues(res.loss, {"A1": res.dA1, "A2": res.dA2})

    return run_schedule(task, scheme, state, evaluate, checkpoint_path=checkpoint_path,
                        checkpoint_every=checkpoint_every, progress=progress)
