"""The main job ``popgrad run``, one code path for every kind of run.

:func:`run` takes a resolved configuration (:func:`popgrad.app.config.resolve`: defaults, then the
config file, then flags; or a full settings dict), checks everything it can before anything is
written (:func:`prepare`), trains, runs the checks, and writes ``report.json``, ``report.md``,
``trajectory.npz``, ``checkpoint.npz`` and the figures into ``cfg["out"]``. What differs between
kinds of run (the reduced model on single- or multi-parent tasks, the full transformer) is one
record of :mod:`popgrad.app.kinds` (trainer, checks, figures, report sections), looked up once; the
command line (:mod:`popgrad.app.cli`) only parses.
"""
from __future__ import annotations

import math
import os
import time

from .. import checks as C
from .._io import OutputDir, OutputDirError, check_output_dir
from .._validation import as_int
from ..task import Task, chain
from .config import (DEFAULTS, MULTI_PARENT_DEFAULTS, MULTI_PARENT_GRAPHS, CLIError, CLITypeError, RunConfig,
                     settle)
from .kinds import KINDS
from .tasks import build_task, graph_family
from .plots import plot_loss, run_context
from .report import build_report, write_report
from .scheduler import HANDSHAKE_TIMEOUT, check_scheduler_address, connect_scheduler

__all__ = ["DEFAULTS", "MULTI_PARENT_DEFAULTS", "MULTI_PARENT_GRAPHS", "CLIError", "CLITypeError", "build_task",
           "validate_config", "prepare", "run", "RUN_OUTPUTS", "EXIT_DIVERGED", "connect_scheduler",
           "check_scheduler_address", "HANDSHAKE_TIMEOUT", "estimate_field_seconds", "log_checks"]

#: Every file ``popgrad run`` may write into ``--out`` (besides ``checkpoint.npz``); those a run does
#: not produce are removed when it finishes (stale outputs of an earlier, different run).
RUN_OUTPUTS = ("report.json", "report.md", "report.html", "trajectory.npz", "attention.png", "loss.png",
               "gradient_cosine.png", "attention_to_parent.png")


def run_outputs() -> tuple:
    """:data:`RUN_OUTPUTS` and every figure a registered kind of run may write."""
    return tuple(dict.fromkeys(RUN_OUTPUTS + tuple(f for k in KINDS.values() for f in k.figures)))

#: Exit status of ``popgrad run`` when training diverged (the report is written, with the status).
EXIT_DIVERGED = 3


# ------------------------------------------------------------------ checks
def validate_config(cfg) -> tuple:
    """Every check of a run's settings that needs no output folder: ``(task, trainer config)``.

    ``cfg`` is a :class:`popgrad.app.config.RunConfig` or a full settings dict (then settled:
    the task built, ``T`` fixed, "auto" resolved, the trainer's config validated; one-line
    :class:`CLIError` or ``ValueError``). Used by :func:`run` and by ``popgrad sweep``.
    """
    rc = _settled(cfg)
    return rc.task, rc.train


def _settled(cfg) -> RunConfig:
    rc = settle(cfg)
    try:
        as_int(rc["checkpoint_every"], "--checkpoint-every", minimum=0)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    return rc


def output_paths(cfg, resume: bool):
    """``(out, checkpoint)`` paths, validated before anything is written."""
    out = check_output_dir(cfg["out"], "--out", run_outputs() + ("checkpoint.npz",))
    ckpt = os.path.join(out, "checkpoint.npz")
    if resume and not os.path.exists(ckpt):
        raise CLIError(f"--resume: no checkpoint at {ckpt}; run once without --resume")
    return out, ckpt


def prepare(cfg, resume: bool):
    """Every check of a run, before anything is written: ``(run config, out, checkpoint path)``."""
    rc = _settled(cfg)
    out, ckpt = output_paths(rc, resume)
    if resume:  # a damaged checkpoint is refused now, not after the folder is locked
        rc.kind.check_resume(ckpt, rc)
    return rc, out, ckpt


#: How the console and report.md show each status.
STATUS_TAGS = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "not_applicable": "N/A "}


def log_checks(results, out: str, log=print) -> None:
    """One line per check, then where the report is."""
    for c in results:
        tag = STATUS_TAGS[c.status]
        if c.status in ("pass", "fail"):  # the outcome (the relation that holds), not the rule
            log(f"  [{tag}] {c.name}: {c.outcome}")
        elif c.status == "inconclusive":
            log(f"  [{tag}] {c.name}: {c.outcome}; {c.reason}")
        else:
            log(f"  [{tag}] {c.name}: {c.reason}")
        if c.kind == "sampled" and c.status != "not_applicable" and c.details.get("rule"):
            log(f"         rule: {c.details['rule']}")
    log(f"report: {os.path.join(out, 'report.md')}")


#: Stage 1 with the field at T >= FIELD_ESTIMATE_MIN_T: the run first says how long the field will take,
#: measured on this machine at the two sizes FIELD_ESTIMATE_SIZES and extrapolated.
FIELD_ESTIMATE_MIN_T = 1024
FIELD_ESTIMATE_SIZES = (256, 512)


def estimate_field_seconds(cfg: dict, task, log=print):
    """Seconds the Stage-1 field of ``task`` will take (computed once, before the first step), or ``None``.

    Only for ``gradient = "field"`` at ``T >= FIELD_ESTIMATE_MIN_T``: the field of the same graph
    family (a chain for a parents string) and prior is timed at the two sizes
    :data:`FIELD_ESTIMATE_SIZES` and extrapolated as ``T^p`` (``p`` measured, between 2 and 4; the
    counts method is ``O(K S^2 T^3)`` for a chain). Logs one line when it is more than a minute.
    """
    if cfg.get("gradient") != "field" or task.T < FIELD_ESTIMATE_MIN_T:  # the field: single-parent only
        return None
    from ..engine.field import stage1_field

    family = graph_family(cfg["graph"], cfg["seed"]) or chain
    stage1_field(Task(family(8), task.prior, max_sequences=task.max_sequences))  # kernels loaded: not timed
    times = []
    for T in FIELD_ESTIMATE_SIZES:
        small = Task(family(T), task.prior, max_sequences=task.max_sequences)
        t0 = time.perf_counter()
        stage1_field(small)
        times.append(max(time.perf_counter() - t0, 1e-6))
    (T1, T2), (t1, t2) = FIELD_ESTIMATE_SIZES, times
    p = min(4.0, max(2.0, math.log(t2 / t1) / math.log(T2 / T1)))
    seconds = t2 * (task.T / T2) ** p
    if seconds > 60:
        log(f"Stage 1 at T = {task.T}: the first-order field is computed once before the first step, about "
            f"{_duration(seconds)} on this machine (measured {t1:.2g} s at T = {T1} and {t2:.2g} s at T = {T2}, "
            f"growing as T^{p:.1f}); a smaller --T is faster")
    return seconds


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# --------------------------------------------------------------------- run
def run(cfg, resume: bool = False, progress: bool = True, log=print, figures: bool = True,
        client=None, scheduler: str | None = None, worker_timeout: float = 60.0) -> dict:
    """The main job for any kind of run. Returns the report dictionary.

    ``cfg``: a :class:`popgrad.app.config.RunConfig` or a full settings dict. ``figures=False``
    skips the PNG figures (``popgrad sweep``). ``client`` (a ``dask.distributed.Client``), or
    ``scheduler`` (an address to connect to, closed at the end): split the training's exact
    enumerations over its workers (:mod:`popgrad.engine.distributed`; same bits).

    Everything that can be checked is checked first (:func:`prepare`); the folder is then written as
    a whole through :class:`popgrad._io.OutputDir` (locked, staged, stale outputs removed), except
    ``checkpoint.npz``, written in place so that ``--resume`` works after an interrupt. A diverged
    run still writes its report (``report["trajectory"]["status"] == "diverged"``).
    """
    if client is None and scheduler:
        rc, _, _ = prepare(cfg, resume)  # every check of the settings first: no wait for a scheduler
        client = connect_scheduler(scheduler, worker_timeout, log)
        try:
            return run(rc, resume, progress, log, figures, client=client)
        finally:
            client.close()
    rc, out, _ = prepare(cfg, resume)
    kind, task = rc.kind, rc.task
    log(task.summary())
    for line in kind.notes(rc):
        log(line)
    from ..engine._kernels.cache import kernels_cached

    if not kernels_cached():
        log("compiling kernels (first run only)…")
    estimate_field_seconds(rc, task, log)
    t0 = time.perf_counter()
    with OutputDir(out, outputs=run_outputs(), flag="--out") as od:
        ckpt = od.keep("checkpoint.npz")
        traj = kind.train(rc, checkpoint_path=ckpt, checkpoint_every=rc["checkpoint_every"], resume=resume,
                          progress=progress, client=client)
        t_train = time.perf_counter() - t0
        log(f"training: {traj.status} after step {int(traj.step[-1]) if len(traj.step) else 0} in {t_train:.1f} s {traj.message}".rstrip())
        diverged = traj.status != "completed"
        refs, objective = kind.references(rc, traj, not diverged)
        results, extra = _checks_diverged(traj, kind.check_names) if diverged else kind.checks(rc, traj, refs,
                                                                                              objective)
        extra = {"timing_seconds": {"training": t_train, "total": time.perf_counter() - t0}, **extra}
        report = build_report(dict(rc), task, traj, results, refs, extra)
        if diverged:  # no check ran: a diverged run is never "all passed" (a sweep row would count it a success)
            report["all_passed"] = False
        stage = od.staging
        traj.save(os.path.join(stage, "trajectory.npz"))
        if figures:
            context = run_context(rc, task)
            if diverged:
                plot_loss(traj, refs, os.path.join(stage, "loss.png"), context=context)
            else:
                kind.plots(stage, rc, traj, refs, context)
        shown = ("loss.png",) if diverged else kind.figures
        write_report(stage, report, sections=kind.markdown(report),
                     figures=[os.path.join(stage, f) for f in shown] if figures else ())
        try:
            od.commit()
        except OSError as exc:
            raise OutputDirError(f"--out {out}: cannot write the outputs: {exc.strerror or exc}") from None
    log_checks(results, out, log)
    return report


def _checks_diverged(traj, names):
    reason = f"training diverged: {traj.message}"
    nan = float("nan")
    return [C.CheckResult(name, nan, nan, None, "n/a", "", {"reason": reason}, status="inconclusive", reason=reason)
            for name in names], {}
