"""Sweeps: the main job (:func:`popgrad.app.jobs.run`) on every cell of a grid, in Dask tasks.

``popgrad sweep CONFIG.toml --out DIR [--scheduler ADDRESS] [--workers N] [--figures]``
and :func:`sweep` (``popgrad.sweep(spec, client=None, out=...)``, returns a
pandas DataFrame).

The spec (a TOML file or the same structure as a dict) has three optional
sections; every key is a key of ``popgrad run``'s config file
(:data:`popgrad.app.config.DEFAULTS`, each value checked by
:func:`popgrad.app.config.check_value`, the validator of the flags and config files)::

    [fixed]            # values shared by every cell
    S = 2
    steps1 = 30
    [axes]             # the grid is the Cartesian product of these lists
    graph = ["chain", "icl"]
    T = [6, 8]
    seed = [0, 1]
    [[cells]]          # optional extra cells, each a table of values
    graph = "random"   # (a cell's values override [fixed])
    T = 7

Cell order: the product of the axes in the order they are written, the last
axis fastest, then the explicit cells. Without ``[axes]`` and ``[[cells]]``
the sweep is the single cell ``[fixed]``. Each cell's config is resolved
like ``popgrad run --config``: :data:`popgrad.app.config.DEFAULTS`, the k-head
defaults for ``graph = "ngram" | "two-parent"`` (unless set), then the
cell's values.

Validation, before anything is submitted or written: unknown sections or
keys, ``out`` / ``resume`` (the sweep owns its outputs), wrong types, empty or
duplicate axis values, a key both in ``[fixed]`` and ``[axes]``, two cells with
the same resolved config, and every cell's task and training settings built
through the checks of ``popgrad run`` (ranges of S and T, S**T limit, graph
strings, rates, steps, ...). Each problem is one :class:`popgrad.app.config.CLIError`
line; the CLI exits with status 2.

Outputs in ``DIR``:

* ``cells/<cell-id>/``: the cell's ``report.json``, ``report.md``,
  ``trajectory.npz`` (and ``checkpoint.npz``; figures only with ``--figures``),
  ``log.txt``; ``cell.json`` (time and host of the cell, for a resumed row); ``error.txt`` (traceback) if the cell failed. Every file is
  written atomically (:mod:`popgrad._io`).
* ``results.csv``: one row per finished cell, in the spec's cell order:
  ``cell`` (index), ``cell_id``, every config key, ``status`` (``ok`` /
  ``failed``), ``error`` (one line), ``resumed``, the run's status, every
  check's ``<name>_value`` / ``<name>_passed`` / ``<name>_applicable``,
  ``all_passed``, the reference losses (``L_star``, ``L_bayes``, ...),
  ``final_loss``, ``time_*_s`` timings (``time_cell_s``: wall time of the Dask
  task; empty for resumed cells), the library versions of the run
  (``version_popgrad``, ``version_numpy``, ...). Rewritten atomically (temp
  file, fsync, ``os.replace``) each time a cell finishes. :func:`sweep` returns
  the same table.

Cell id: the first 12 hex digits of the SHA-256 of the cell's resolved config
as canonical JSON (sorted keys, no ``out``). The popgrad version is *not*
part of it, so a rerun after an upgrade finds the cells already done; the
version that ran each cell is in its ``report.json`` and row. (A new key in
``DEFAULTS`` changes every id.)

Resume: rerunning the same command skips every cell whose ``report.json``
exists, parses as JSON, has the report's keys and the cell's config; failed
or missing cells run again (``resumed`` tells which rows were not rerun).

Failures: a cell that raises is recorded (``status = failed``, one-line
``error``) and does not stop the others. A worker that dies is handled by Dask:
its cells are rescheduled on the surviving or restarted workers (up to
``distributed.scheduler.allowed-failures`` times), and ``retries=2`` covers
a task that errs for another reason; a cell lost for good is recorded as
failed. Every cell appears exactly once in ``results.csv``. CLI exit status:
0 when every cell is ok, 1 when at least one failed (stderr says
``K of N cells failed``), 2 for a bad spec or options, an unusable or locked
``--out``, a bad scheduler, a full disk; 130 on Ctrl-C, 143 on SIGTERM
(finished cells are kept; rerun to resume; what the cut-short cells left
behind is removed). ``DIR`` is locked for the sweep (:class:`popgrad._io.FolderLock`).

Sizes: more than :data:`MAX_CELLS` cells, or ``--workers`` above
:data:`popgrad.app.sweep_cluster.MAX_WORKERS_PER_CORE` times the cores, is refused in one line.

Cluster: ``--scheduler tcp://host:8786`` (``client=`` in Python) uses an
existing cluster; ``DIR`` must then be at the same path on every worker (a
shared file system) for ``cells/`` and resume, though ``results.csv`` is
written by this process from the rows the tasks return. Without it a
``LocalCluster(n_workers=N or os.cpu_count(), threads_per_worker=1,
processes=True)`` (N at most the cells to run) is started and closed, with
``NUMBA_NUM_THREADS=1`` in the workers' environment so that N workers do not
oversubscribe N cores, and every cell starts with
:func:`popgrad.engine.distributed.prepare_worker` (a worker that imported
numba before that variable was set would otherwise fail). The workers are
started with SIGINT blocked (a terminal Ctrl-C reaches the command, which
closes them). Start remote workers the
same way: ``NUMBA_NUM_THREADS=1 dask worker tcp://host:8786 --nthreads 1``.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import platform
import signal
import sys
import time
import traceback
from collections.abc import Mapping

from .._io import FolderLock, atomic_write_text, check_output_dir, clear_stale
from .._signals import (Terminated, add_emergency, final_line, remove_emergency, say, set_interrupt_line,
                        signal_seen)
from . import jobs
from .config import ARG_SPECS, CLIError, CLITypeError, checked, load_toml, merge, settle
from .scheduler import check_scheduler_address, connect_scheduler
from .report import versions
from .sweep_cluster import (CLOSE_TIMEOUT_INTERRUPTED, MAX_WORKERS_PER_CORE, _check_client,  # noqa: F401
                            _close, _dashboard, _start_client, _stop_workers_now, check_workers)
from .sweep_results import (CELL_FACTS, CONFIG_KEYS, FIRST_COLUMNS, MODEL_COLUMN_KEYS, REPORT_KEYS,  # noqa: F401
                            _frame, _scalar, cached_report, cached_row, cell_id, summary_row, write_csv_atomic)

__all__ = ["sweep", "load_spec", "expand", "cell_id", "run_cell", "summary_row", "main_sweep", "cached_row",
           "check_workers", "MAX_CELLS"]

SECTIONS = ("fixed", "axes", "cells")
NOT_IN_SWEEP = ("out", "resume")

#: Most cells a spec may have: beyond it the spec is refused before any cell is validated.
MAX_CELLS = 10_000


# -------------------------------------------------------------------- spec
def load_spec(path) -> dict:
    """Read a sweep spec from a TOML file (sections ``[fixed]``, ``[axes]``, ``[[cells]]``)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise CLITypeError(f"a sweep spec is a table with [fixed], [axes], [[cells]] or the path of a TOML file, "
                           f"got {type(path).__name__}")
    return load_toml(path, "sweep spec")


def _value(key, value, where: str):
    """``value`` of config key ``key``, checked by :func:`popgrad.app.config.check_value` (as flags and files)."""
    if key in NOT_IN_SWEEP:
        raise CLIError(f"{where}: key {key!r} is not allowed in a sweep (outputs go to --out DIR; a rerun resumes)")
    if key not in ARG_SPECS:
        known = ", ".join(k for k in sorted(ARG_SPECS) if k not in NOT_IN_SWEEP)
        raise CLIError(f"{where}: unknown key {key!r} (known: {known})")
    return checked(key, value, where, typed=True)


def resolve_cell(values: dict) -> dict:
    """A cell's full config, resolved as ``popgrad run --config`` resolves a file
    (:func:`popgrad.app.config.merge`: defaults, k-head defaults unless given, the values,
    conflicts refused); without ``out``."""
    cfg = merge(values)
    cfg.pop("out")
    return cfg


def validate_cell(cfg: dict) -> dict:
    """Build the cell's task and training settings through ``popgrad run``'s checks (without writing).

    Returns ``cfg`` with ``T`` set from the graph (a parents string fixes ``T``).
    """
    cfg = dict(cfg)
    cfg["T"] = settle(cfg)["T"]  # popgrad run's checks; a parents string fixes T ("auto" stays in the cell)
    return cfg


def _describe(values: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items()) or "(defaults)"


def expand(spec: Mapping, log=None) -> list:
    """Validate a spec; its cells ``[(cell_id, config), ...]`` in order (product of the axes, then ``cells``)."""
    if not isinstance(spec, Mapping):
        raise CLITypeError(f"a sweep spec is a table with [fixed], [axes], [[cells]], got {type(spec).__name__}")
    for key in spec:
        if key not in SECTIONS:
            hint = " (put it under [fixed] or [axes])" if key in ARG_SPECS else ""
            raise CLIError(f"sweep spec: unknown section {key!r}{hint}: use [fixed], [axes], [[cells]]")
    fixed, axes, extra = spec.get("fixed", {}), spec.get("axes", {}), spec.get("cells", [])
    if not isinstance(fixed, Mapping):
        raise CLIError("sweep spec: [fixed] must be a table of key = value")
    if not isinstance(axes, Mapping):
        raise CLIError("sweep spec: [axes] must be a table of key = [values]")
    if not isinstance(extra, list) or not all(isinstance(c, Mapping) for c in extra):
        raise CLIError("sweep spec: cells must be an array of tables ([[cells]])")
    fixed = {k: _value(k, v, "sweep spec [fixed]") for k, v in fixed.items()}
    grid = {}
    for key, values in axes.items():
        if key in fixed:
            raise CLIError(f"sweep spec: {key!r} is both in [fixed] and in [axes]: keep one")
        if not isinstance(values, list):
            raise CLIError(f"sweep spec [axes]: {key} must be a list of values, got {values!r}")
        if not values:
            raise CLIError(f"sweep spec [axes]: {key} is empty: give at least one value")
        vals = [_value(key, v, "sweep spec [axes]") for v in values]
        for i, v in enumerate(vals):
            if v in vals[:i]:
                raise CLIError(f"sweep spec [axes]: {key} lists {v!r} twice")
        grid[key] = vals
    n_cells = math.prod(len(v) for v in grid.values()) * bool(grid) + len(extra) + (not grid and not extra)
    if n_cells > MAX_CELLS:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in grid.items())
        raise CLIError(f"sweep spec has {n_cells:,} cells ({sizes}{' + ' + str(len(extra)) if extra else ''}), "
                       f"more than the limit of {MAX_CELLS:,}: split it into several specs (each its own --out) "
                       "or shorten an axis")
    if log is not None and n_cells >= 1000:
        log(f"sweep: validating {n_cells:,} cells…")
    chosen = []
    if grid:
        names = list(grid)
        chosen += [dict(zip(names, combo)) for combo in itertools.product(*grid.values())]
    for n, c in enumerate(extra, 1):
        chosen.append({k: _value(k, v, f"sweep spec [[cells]] #{n}") for k, v in c.items()})
    if not grid and not extra:
        chosen.append({})
    cells, seen = [], {}
    for n, values in enumerate(chosen):
        merged = {**fixed, **values}
        try:
            cfg = validate_cell(resolve_cell(merged))
        except (CLIError, ValueError) as exc:
            kind = CLITypeError if isinstance(exc, TypeError) else CLIError
            raise kind(f"sweep cell {n} ({_describe(values)}): {exc}") from None
        cid = cell_id(cfg)
        if cid in seen:
            raise CLIError(f"sweep cells {seen[cid]} and {n} ({_describe(values)}) resolve to the same config")
        seen[cid] = n
        cells.append((cid, cfg))
    return cells


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_cell(cfg: dict, cell_dir: str, figures: bool = False, log=None) -> dict:
    """The Dask task of one cell: run the main job into ``cell_dir``; return the cell's row.

    Never raises for a failing cell: the row says ``failed`` with the error in one line
    (the traceback goes to ``cell_dir/error.txt``). Starts with the worker set-up shared with
    the distributed engine (:func:`popgrad.engine.distributed.prepare_worker`).
    """
    from ..engine.distributed import prepare_worker

    t0 = time.perf_counter()
    lines = []

    def _log(msg):
        lines.append(str(msg))
        if log is not None:
            log(msg)

    report, error = None, ""
    try:
        prepare_worker()
        report = jobs.run(dict(cfg, out=cell_dir), resume=False, progress=False, log=_log, figures=figures)
    except Exception as exc:  # a failing cell is a result, not a crash of the sweep
        error = _one_line(exc)
        lines.append(traceback.format_exc())
    row = summary_row(cfg, report, error=error, versions=None if report is not None else versions())
    row["time_cell_s"] = time.perf_counter() - t0
    row["host"] = platform.node()
    try:  # best effort: the report is what counts
        atomic_write_text(os.path.join(cell_dir, "log.txt"), "\n".join(lines) + "\n")
        if report is not None:
            atomic_write_text(os.path.join(cell_dir, CELL_FACTS),
                              json.dumps({"time_cell_s": row["time_cell_s"], "host": row["host"]}) + "\n")
        err = os.path.join(cell_dir, "error.txt")
        if report is None:
            atomic_write_text(err, lines[-1])
        elif os.path.exists(err):
            os.unlink(err)
    except OSError:
        pass
    return row


def sweep(spec, client=None, out: str = "sweep_out", *, scheduler: str | None = None, workers: int | None = None,
          figures: bool = False, progress: bool | None = None, retries: int = 2, log=print, cell_fn=None,
          worker_timeout: float = 60.0):
    """Run the main job on every cell of ``spec``; return the results table (a pandas DataFrame).

    ``spec``: a TOML path or a dict with ``fixed`` / ``axes`` / ``cells`` (module docstring).
    ``client``: a ``dask.distributed.Client`` to use (left open); else ``scheduler`` (an address)
    is connected to (waiting up to ``worker_timeout`` seconds for a first worker), else a
    ``LocalCluster`` of ``workers`` processes (default ``os.cpu_count()``, at most the cells to
    run) is started and closed. ``figures``: write each cell's PNGs. ``progress``: a progress bar
    over cells (default: when stderr is a terminal). ``retries``: Dask retries of a task that
    errs. ``log``: where the sweep's lines go. ``cell_fn``: the task function (default
    :func:`run_cell`, same signature; for instrumentation and tests).

    Writes ``out/cells/<cell-id>/`` and ``out/results.csv``; cells already done are not rerun.
    ``out`` is locked for the sweep (a second sweep into it is refused). Raises
    :class:`popgrad.app.config.CLIError` (a ``ValueError``; :class:`~popgrad.app.config.CLITypeError`,
    also a ``TypeError``, for a value of the wrong type) for a bad spec or options, before
    anything is written or any cluster is started.
    """
    spec_dict = spec if isinstance(spec, Mapping) else load_spec(spec)
    cells = expand(spec_dict, log=log)
    out = check_output_dir(out, "--out", ("results.csv",), folders=("cells",))
    workers = check_workers(workers)
    if scheduler is not None:
        scheduler = check_scheduler_address(scheduler)
        if client is not None or workers is not None:
            raise CLIError("--scheduler connects to an existing cluster: give neither a client nor --workers with it")
    if client is not None:
        _check_client(client)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise CLIError(f"retries {retries!r}: use an integer >= 0")
    if isinstance(worker_timeout, bool) or not isinstance(worker_timeout, (int, float)) or not worker_timeout > 0:
        raise CLIError(f"--worker-timeout {worker_timeout!r}: use a number of seconds > 0")
    cell_fn = run_cell if cell_fn is None else cell_fn
    root = os.path.abspath(out)
    cells_dir = os.path.join(root, "cells")
    csv_path = os.path.join(root, "results.csv")

    own = client is None
    if scheduler is not None:  # refused (one line) before anything is written: no header-only results.csv
        client = connect_scheduler(scheduler, worker_timeout, log)
    try:
        return _sweep_into(cells, root, out, client, own, workers, worker_timeout, figures, progress, retries, log,
                           cell_fn, cells_dir, csv_path)
    finally:
        if own and client is not None:
            client.close()


def _sweep_into(cells, root, out, client, own, workers, worker_timeout, figures, progress, retries, log, cell_fn,
                cells_dir, csv_path):
    os.makedirs(root, exist_ok=True)
    with FolderLock(root, "--out"):
        rows, todo = {}, []
        for i, (cid, cfg) in enumerate(cells):
            row = cached_row(os.path.join(cells_dir, cid), cfg)
            if row is not None and figures and not os.path.exists(os.path.join(cells_dir, cid, "loss.png")):
                row = None  # a rerun with --figures draws the figures the first run did not
            if row is not None:
                rows[i] = dict(row, resumed=True)
            else:
                todo.append(i)
        log(f"sweep: {len(cells)} cells, {len(cells) - len(todo)} already done in {out}, {len(todo)} to run")
        write_csv_atomic(csv_path, _frame(rows))  # the folder takes a write (a full disk shows now, not later)
        if not todo:
            log(f"results: {csv_path}")
            return _frame(rows)
        return _run_cells(cells, rows, todo, client, own, workers, worker_timeout, figures, progress, retries,
                          log, cell_fn, cells_dir, csv_path)


def _run_cells(cells, rows, todo, client, own, workers, worker_timeout, figures, progress, retries, log,
               cell_fn, cells_dir, csv_path):
    from dask.distributed import as_completed
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    cluster = futures = bar = None
    interrupted = False

    def stop_now():  # the watchdog's cleanup (popgrad._signals): what the interrupted path below does
        _stop_workers_now(cluster)
        _clear_cut_cells(own, todo, rows, cells, cells_dir)

    emergency = add_emergency(stop_now)
    try:
        if client is None:  # our own LocalCluster (a --scheduler was connected to before anything was written)
            client, cluster = _start_client(None, workers, len(todo), worker_timeout, log)
        log(f"Dask scheduler: {client.scheduler.address}; dashboard: {_dashboard(client)}")
        os.makedirs(cells_dir, exist_ok=True)
        token = os.urandom(4).hex()
        futures = {}
        for i in todo:
            cid, cfg = cells[i]
            fut = client.submit(cell_fn, cfg, os.path.join(cells_dir, cid), figures,
                                key=f"popgrad-cell-{cid}-{token}", retries=retries, pure=False)
            futures[fut] = i
        show = sys.stderr.isatty() if progress is None else bool(progress)
        bar = tqdm(total=len(cells), initial=len(cells) - len(todo), unit="cell", desc="sweep", disable=not show)
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                row = dict(fut.result(), resumed=False)
            except Exception as exc:  # lost for good (e.g. KilledWorker) or cell_fn raised
                row = dict(summary_row(cells[i][1], None, error=_one_line(exc)), resumed=False)
            rows[i] = row
            write_csv_atomic(csv_path, _frame(rows))
            bar.update(1)
    except BaseException as exc:
        if cluster is not None and isinstance(exc, (KeyboardInterrupt, Terminated)):
            interrupted = True
            _stop_workers_now(cluster)  # interrupted: the cells cut short are cleared below, not waited for
        elif futures and client is not None:
            try:
                client.cancel(list(futures))
            except Exception:
                pass
        raise
    finally:
        try:
            if bar is not None:
                bar.close()
            # Interrupted: the workers are gone; Dask's orderly close of a scheduler holding thousands of
            # tasks takes seconds, so it gets a short while and the process exit ends the rest.
            wait = {"timeout": CLOSE_TIMEOUT_INTERRUPTED} if interrupted else {}
            if cluster is not None and client is not None:  # our LocalCluster's client (a --scheduler's: sweep())
                _close(client, **wait)
            if cluster is not None:
                _close(cluster, **wait)
            # what cells cut short left behind (the cluster is closed: their processes are gone)
            _clear_cut_cells(own, todo, rows, cells, cells_dir)
        finally:
            remove_emergency(emergency)
    df = _frame(rows)
    failed = int((df["status"] != "ok").sum())
    log(f"sweep: {len(todo)} cell{'s' * (len(todo) != 1)} run in {time.perf_counter() - t0:.1f} s; "
        f"{len(df) - failed} ok, {failed} failed; "
        f"results: {csv_path}")
    return df


def _clear_cut_cells(own, todo, rows, cells, cells_dir) -> None:
    """What the cells cut short left behind (staging folders, locks), when the sweep ran them on its own cluster."""
    if own:
        for i in todo:
            if i not in rows:
                clear_stale(os.path.join(cells_dir, cells[i][0]))


# --------------------------------------------------------------------- CLI
def main_sweep(args) -> int:
    """``popgrad sweep``: exit 0 (all ok), 1 (some cells failed), 2 (bad spec/options, unusable ``--out``,
    a full disk), 130 (interrupted), 143 (terminated); every error one line on stderr."""
    set_interrupt_line(lambda sig: _interrupt_line(sig))
    try:
        df = sweep(args.spec, out=args.out, scheduler=args.scheduler, workers=args.workers, figures=args.figures,
                   progress=False if args.no_progress else None, log=say, worker_timeout=args.worker_timeout)
    except (ValueError, OSError) as exc:  # CLIError, OutputDirError; a full disk, a folder that vanished, ...
        sig = signal_seen()
        if sig is not None:  # raised while a signal's exception unwound (a zip file closed mid-write, C code)
            final_line(_interrupt_line(sig))
            return 143 if sig == signal.SIGTERM else 130
        if isinstance(exc, ValueError):
            print(f"popgrad: error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 2
        where = f" {exc.filename}" if exc.filename else ""
        print(f"popgrad: error: cannot write{where}: {exc.strerror or exc} (finished cells are kept; rerun the same "
              "command to resume)", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as exc:
        sig = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        final_line(_interrupt_line(sig))
        return 143 if sig == signal.SIGTERM else 130
    except Exception:
        sig = signal_seen()
        if sig is not None:  # a signal that C code turned into another error (e.g. an interrupted import)
            final_line(_interrupt_line(sig))
            return 143 if sig == signal.SIGTERM else 130
        raise
    failed = int((df["status"] != "ok").sum())
    if failed:
        print(f"popgrad: {failed} of {len(df)} cells failed (see {os.path.join(args.out, 'results.csv')})",
              file=sys.stderr)
        return 1
    return 0


def _interrupt_line(sig) -> str:
    what = "terminated" if sig == signal.SIGTERM else "interrupted"
    return f"popgrad: {what} (finished cells are kept; rerun the same command to resume)"
