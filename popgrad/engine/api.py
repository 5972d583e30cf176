"""The exact engine's front end: one ``exact_loss_and_grad`` for every task kind (DESIGN §3–§4, §9, §10).

Everything here is a finite sum over all ``S**T`` sequences with their exact
weights ``w(s, c)`` (DESIGN §2): no sampling (except in
:func:`sampled_loss_and_grad`, which says so). The population is exact *for
the task's finite prior*. The front end validates once, then dispatches on
the task kind to a specialized engine, through its block runner
(:mod:`popgrad.engine.blocks`: ``blocks`` → ``run_blocks`` → ``finish_blocks``;
with ``client=`` the ranges run on Dask workers, :mod:`popgrad.engine.distributed`):

* :class:`popgrad.Task` (single-parent): :mod:`popgrad.engine.single`
  (``engine="prefix"`` or ``"direct"``, with the exact relabeling-orbit
  reduction of :mod:`popgrad.engine.symmetry` when it applies);
* :class:`popgrad.MultiParentTask` (k heads): :mod:`popgrad.engine.multi`.

The NumPy references are in :mod:`popgrad.engine.reference`. Plans and weight
caches are keyed by ``task.fingerprint`` (equal tasks share them);
:func:`clear_caches` forgets them. Tunables live in one
:class:`popgrad.EngineOptions` passed explicitly.
"""
from __future__ import annotations

import sys
import warnings

from ..task.tasks import MultiParentTask, check_task
from . import catformer_symmetry as _catformer_symmetry
from . import multi as _multi
from . import single as _single
from . import symmetry as _symmetry
from . import table as _table
from ._args import options_or_default, validate
from .options import ENGINES
from .reference import exact_loss_and_grad_numpy
from .result import LossAndGrad
from .single import rows_loss_and_grad

__all__ = [
    "exact_loss_and_grad", "exact_loss", "exact_loss_and_grad_numpy", "sampled_loss_and_grad", "clear_caches",
    "exact_loss_and_grad_multi", "exact_loss_multi", "exact_loss_and_grad_multi_numpy",
]


def exact_loss_and_grad(task, A1, A2, eps=None, symmetry="auto", engine="auto", options=None,
                        client=None) -> LossAndGrad:
    """Exact population loss and gradients of the reduced model (DESIGN §3–§4).

    Parameters
    ----------
    task : Task or MultiParentTask
        Graph and finite prior; ``S**T`` must pass ``task.check_size()``.
        The engine is chosen by the task kind: the single-parent engines
        (prefix / direct) or the k-head engine.
    A1 : array_like, shape (T, T), or (k, T, T) for a k-parent task
        First-layer scores; only the lower triangle (diagonal included) is
        used. Finite.
    A2 : array_like, shape (S, S), or (k, S, S) for a k-parent task
        Second-layer scores. Finite.
    eps : float, optional
        Loss perturbation ``ε ≥ 0``; default ``task.default_eps``
        (``T_eff ** -0.5``). With ``ε = 0`` a token with zero predicted mass
        and positive weight makes the loss ``inf`` (a ``RuntimeWarning`` is
        issued and ``dA1``, ``dA2`` are NaN: the gradient is undefined).
    symmetry : {"auto", "off", "on"}, default "auto"
        Exact relabeling-orbit reduction (DESIGN §10): when the prior is
        exactly closed under token relabeling and ``A2 ∈ span{I, 11ᵀ}``
        (:func:`symmetry_applies`), only one canonical sequence per orbit is
        enumerated (about ``S!`` fewer), weighted by its orbit size, and
        ``dA2`` is symmetrized back; the result equals the full enumeration
        up to rounding (and ``dA2`` lies exactly in the span). ``"auto"``
        uses it when it applies, ``"off"`` never, ``"on"`` raises
        ``ValueError`` when it does not apply. k-parent tasks have no reduction
        (``"auto"`` means off there).
    engine : {"auto", "prefix", "direct"}, default "auto"
        Single-parent engine (module :mod:`popgrad.engine.single`): ``"auto"``
        uses the prefix engine unless a row range of ``A2`` exceeds
        ``options.a2_range_limit``; both give the same sums up to rounding.
        Ignored for k-parent tasks (one engine).
    options : EngineOptions, optional
        Engine tunables (block sizes, caches); default :data:`DEFAULT_OPTIONS`.
    client : dask.distributed.Client, optional
        Split this one enumeration over the client's workers
        (:mod:`popgrad.engine.distributed`): the engine's blocks in contiguous
        chunks, one per worker, each worker keeping the task, its plan and
        weight cache between calls; the per-block partial sums are added in
        block order, so the result is bit-identical to ``client=None``.
        Every engine (prefix, direct, k-head). ``None``: this process.

    Returns
    -------
    LossAndGrad
        ``loss`` (float), ``dA1`` (zero above the diagonal), ``dA2``; shapes as ``A1``, ``A2``.

    Raises
    ------
    ValueError
        On a wrong shape, a non-finite entry or an invalid ``eps``.
    TaskTooLargeError
        If ``S**T`` exceeds ``task.max_sequences`` (raised before any work).
    """
    A1, A2, eps = validate(task, A1, A2, eps)
    return _dispatch(task, A1, A2, eps, True, symmetry, engine, options, client)


def exact_loss(task, A1, A2, eps=None, symmetry="auto", engine="auto", options=None, client=None) -> float:
    """Exact population loss only (forward pass; cheaper than :func:`exact_loss_and_grad`).

    Same parameters (``client`` too), conventions and errors as :func:`exact_loss_and_grad`.

    Returns
    -------
    float
        ``L = -Σ_s Σ_c w(s, c) log(f_c(s) + ε)``.
    """
    A1, A2, eps = validate(task, A1, A2, eps)
    return _dispatch(task, A1, A2, eps, False, symmetry, engine, options, client).loss


def _dispatch(task, A1, A2, eps, want_grad, symmetry, engine, options, client=None) -> LossAndGrad:
    """Run the engine of the task's kind on validated input (lean: the training loop calls it often)."""
    opts = options_or_default(options)
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if symmetry not in _symmetry.SYMMETRY_MODES:
        raise ValueError(f"symmetry must be one of {_symmetry.SYMMETRY_MODES}, got {symmetry!r}")
    if isinstance(task, MultiParentTask) and symmetry == "on":
        raise ValueError("symmetry='on': the k-head engine has no orbit reduction; use symmetry='auto' or 'off'")
    if client is not None:  # one enumeration over the client's workers (imports no Dask itself)
        from . import distributed as _distributed

        _distributed.check_client(client)
    if isinstance(task, MultiParentTask):
        runner, job = _multi, _multi.blocks(task, A1, A2, eps, want_grad, opts)
    else:
        runner, job = _single, _single.blocks(task, A1, A2, eps, want_grad, engine, symmetry, opts)
    if client is None:
        partials = runner.run_blocks(task, job)
    else:  # the same blocks over the client's workers
        partials = _distributed.run_blocks(client, task, job, runner.block_work(task, job), runner.run_blocks)
    return runner.finish_blocks(job, partials)


def sampled_loss_and_grad(task, A1, A2, n, seed, eps=None, options=None) -> LossAndGrad:
    """Monte-Carlo estimate of :func:`exact_loss_and_grad` from ``n`` draws (soft labels).

    ``task.sample(n, seed)`` draws sequences ``s_m`` and their soft labels
    ``y_m = π_m(· | s_{m,T-1})``; the estimate is the same model loss and
    gradient summed with weights ``w(s_m, c) = y_m[c] / n``: unbiased, since
    ``E[Σ_m y_m[c] [s_m = s]] / n = w(s, c)``. This is what a training loop
    on sampled batches sees (the paper's code uses ``n = 1024``); the
    benchmark compares its error and cost with the exact sum. Uses the
    fused per-sequence kernel (:func:`popgrad.engine._kernels.single.loss_grad_rows`),
    blocks of ``options.direct_block_sequences`` rows (thread-count independent).

    Parameters
    ----------
    task : Task
    A1, A2 : array_like
        As in :func:`exact_loss_and_grad`.
    n : int
        Number of draws.
    seed : int or numpy Generator seed
        Passed to ``task.sample``.
    eps : float, optional
        Default ``task.default_eps``.

    Returns
    -------
    LossAndGrad
        The estimates of the loss, ``dA1``, ``dA2``.
    """
    A1, A2, eps = validate(task, A1, A2, eps)
    opts = options_or_default(options)
    if isinstance(task, MultiParentTask):
        raise ValueError("sampled_loss_and_grad: the sampled estimate is implemented for single-parent tasks only")
    sample = task.sample(n, seed)
    return rows_loss_and_grad(sample.seqs, sample.targets / n, A1, A2, eps, opts)


def clear_caches() -> None:
    """Forget every cached engine plan, leaf-weight cache and closure verdict.

    Caches are keyed by the task fingerprint (or the prior's identity) and
    never change a result; clearing them only frees memory (the next call on a
    task rebuilds what it needs).
    """
    _single.clear_plans()
    _table.clear_tables()
    _symmetry._CLOSED.clear()
    _catformer_symmetry.clear_orbit_tables()
    tangent = sys.modules.get(__package__ + ".tangent")
    if tangent is not None:  # the enumeration rows the Hessian-vector kernels keep
        tangent.clear_rows()
    dist = sys.modules.get(__package__ + ".distributed")
    if dist is not None:  # the worker-side caches of this process (a worker, or a threads-only cluster)
        dist.clear_worker_caches()


# ------------------------------------------------------- deprecated aliases (one release)
def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"popgrad.{old} is deprecated and will be removed in popgrad 0.3: use popgrad.{new} "
                  "(it serves every task kind)", DeprecationWarning, stacklevel=3)


def exact_loss_and_grad_multi(task, A1, A2, eps=None) -> LossAndGrad:
    """Deprecated alias of :func:`exact_loss_and_grad` (which serves k-parent tasks too)."""
    _deprecated("exact_loss_and_grad_multi", "exact_loss_and_grad")
    check_task(task, MultiParentTask)
    return exact_loss_and_grad(task, A1, A2, eps)


def exact_loss_multi(task, A1, A2, eps=None) -> float:
    """Deprecated alias of :func:`exact_loss`."""
    _deprecated("exact_loss_multi", "exact_loss")
    check_task(task, MultiParentTask)
    return exact_loss(task, A1, A2, eps)


def exact_loss_and_grad_multi_numpy(task, A1, A2, eps=None) -> LossAndGrad:
    """Deprecated alias of :func:`popgrad.engine.reference.exact_loss_and_grad_numpy`."""
    _deprecated("exact_loss_and_grad_multi_numpy", "engine.reference.exact_loss_and_grad_numpy")
    return exact_loss_and_grad_numpy(task, A1, A2, eps)
