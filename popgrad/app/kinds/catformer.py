"""Kind ``catformer``: the full disentangled transformer (``--model catformer``), trained jointly, any task.

Trainer :func:`popgrad.train_catformer` with the official optimizers, on the exact population gradient
(``--gradient exact``, the default) or on a fresh sampled batch per step (``--gradient sampled
--batch-size 1024 --sample-seed 0``, any size). Exact: references at ``ε = 0``
(:func:`popgrad.checks.suites.softmax_reference_losses`: the softmax readout's loss); checks
``catformer_graph_recovery`` (single-parent), ``head_specialization`` (k-parent, on the
population-average attention) and ``induction_head``. Sampled: the same read-outs on a held-out sample
of :data:`READOUT_SAMPLES` sequences (:mod:`popgrad.checks.catformer_sampled`), each labelled sampled
with its standard error (the references: the official ``bayes`` estimator and, where known, the task's
Bayes loss); the positional block and the induction margin are exact (parameters). Figures
``loss.png``, ``attention.png`` (population-average layer-1 attention of each head beside the true
graph), ``attention_to_parent.png``.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ...checks import catformer as CC
from ..._io import over_half_of_memory, size_text
from ...checks.catformer_sampled import (forward_flops, readout_peak_bytes, sampled_catformer_checks,
                                         sampled_readouts)
from ...checks.suites import softmax_reference_losses
from ...model.catformer import CatFormer
from ...train.catformer import CATFORMER_GRADIENTS, CatFormerScheme, CatFormerTrainConfig, train_catformer
from ...train.loop import load_checkpoint
from ...train.optim import LR_SCHEDULES, OPTIMIZERS
from .. import plots as P
from ..report import fmt, fmt_se, reference_value
from ..settings import CLIError, Flag
from ..tasks import MULTI_PARENT_TASK_DEFAULTS, is_multi_parent, too_large
from ._common import KindBase, common_defaults, refuse_batch_flags_unless_sampled, refuse_past_memory

__all__ = ["KIND", "CATFORMER_DEFAULTS", "FLAGS", "parse_heads", "READOUT_SAMPLES", "READOUT_SEED",
           "check_readout_memory"]

#: Held-out sequences of the sampled read-outs (``--gradient sampled``), and their seed (not a training seed:
#: training batches use ``SeedSequence([sample_seed, t])``).
READOUT_SAMPLES = 8192
READOUT_SEED = 2**31 - 1

#: Defaults of ``--model catformer`` (the official single-parent recipe: SGD, lr 1, cosine decay, zero
#: start); ``record_every`` not given is ``max(1, steps // 128)`` (the official ``n_save = 128``).
CATFORMER_DEFAULTS = dict(model="catformer", heads="1,1", optimizer="sgd", lr=1.0, lr_schedule="cosine",
                          weight_decay=0.0, init_scale=0.0, init_seed=0, steps=300, gradient="exact",
                          batch_size=1024, sample_seed=0)

_c = CATFORMER_DEFAULTS
FLAGS = (
    Flag("heads", "str", help=f"catformer: heads per layer, e.g. 2,1 (default {_c['heads']})"),
    Flag("optimizer", "str", choices=OPTIMIZERS,
         help=f"catformer: the official optimizers on the exact gradient (default {_c['optimizer']})"),
    Flag("lr", "real", 0, True, help=f"catformer: peak learning rate (default {_c['lr']:g})"),
    Flag("lr_schedule", "str", choices=LR_SCHEDULES,
         help=f"catformer: optax.cosine_decay_schedule(lr, steps) or constant (default {_c['lr_schedule']})"),
    Flag("weight_decay", "real", 0, help="catformer: weight decay (sgd/adam coupled, adamw decoupled; default 0)"),
    Flag("init_scale", "real", 0, help="catformer: start every Ã at init-scale * N(0, 1), W = 0 (default 0: the "
                                       "zero start)"),
    Flag("init_seed", "int", 0, help="catformer: seed of the start (default 0)"),
    Flag("steps", "int", 1, help=f"catformer: optimizer steps (default {_c['steps']})"),
    Flag("gradient", "str", choices=CATFORMER_GRADIENTS,
         help="catformer: the exact population gradient (default) or a fresh sampled batch per step, any size"),
    Flag("batch_size", "int", 1, help=f"catformer --gradient sampled: sequences per step (default {_c['batch_size']})"),
    Flag("sample_seed", "int", 0, help="catformer --gradient sampled: seed of the batches (default 0)"),
)


def batch_bytes_per_sequence(task) -> int:
    """An upper estimate of one sampled sequence's share of a step's peak memory: ``(3T + 4S² + 4S) x 8``
    bytes (the draw: tokens, uniforms, a fresh ``π`` per sequence for the continuous prior, the label; the
    rows kernel's sorted copy). Measured peaks: 0.4-0.8 of it (S = 2…5, T = 6…64, both priors)."""
    return (3 * task.T + 4 * task.S**2 + 4 * task.S) * 8


def check_batch_size(n, task) -> None:
    """Refuse ``--batch-size`` whose step cannot fit in memory (half of what this process may use), in one line."""
    refuse_past_memory("--batch-size", n, batch_bytes_per_sequence(task), "per step",
                       "n x (3T + 4S^2 + 4S) x 8 bytes, an upper estimate", " (default 1024)")


def _duration(seconds: float) -> str:
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172800 else f"{seconds / 86400:.0f} days"


def check_readout_memory(task, heads) -> None:
    """Refuse, in one line, a sampled run whose read-outs on :data:`READOUT_SAMPLES` held-out sequences cannot
    fit in memory (half of what this process may use: :func:`popgrad._io.over_half_of_memory`, the rule of
    ``--batch-size``), before anything is trained or written (:func:`readout_peak_bytes`)."""
    model = CatFormer(task.S, task.T, heads=heads)
    need = readout_peak_bytes(task, model, READOUT_SAMPLES)
    memory = over_half_of_memory(need)
    if memory is not None:
        raise CLIError(f"the sampled read-outs need about {size_text(need)} at S = {task.S}, T = {task.T}, heads "
                       f"{','.join(map(str, heads))} ({READOUT_SAMPLES:,} held-out sequences and one forward pass of "
                       f"the model, whose rows grow as T x (S + T) x 2^layers), more than half of the "
                       f"{size_text(memory)} this process may use: use a smaller --T (or --S, fewer --heads)")


def readout_seconds(task, heads) -> float:
    """The read-outs' time on this machine, estimated before the run: one forward pass timed at ``T' = min(T,
    32)`` (the same ``S`` and heads, 64 sequences), scaled by the flop ratio :func:`forward_flops` and the
    ``2 x READOUT_SAMPLES`` forward passes the read-outs make."""
    import time

    from ...model.catformer import catformer_forward

    Tp = min(task.T, 32)
    probe = CatFormer(task.S, Tp, heads=heads)
    params = probe.init(0.1, 0)
    seqs = np.random.default_rng(0).integers(0, task.S, size=(64, Tp))
    catformer_forward(probe, params, seqs[:2])
    t0 = time.perf_counter()
    catformer_forward(probe, params, seqs)
    per = (time.perf_counter() - t0) / 64
    return per * forward_flops(CatFormer(task.S, task.T, heads=heads)) / forward_flops(probe) * 2 * READOUT_SAMPLES


def parse_heads(text) -> tuple:
    """``--heads 2,1`` as ``(2, 1)``: heads per layer, each >= 1."""
    parts = str(text).split(",")
    if not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise CLIError(f"--heads {text!r}: give the heads of each layer as integers >= 1, e.g. 2,1")
    return tuple(int(p) for p in parts)


def _model(rc) -> CatFormer:
    return CatFormer(rc.task.S, rc.task.T, heads=rc.train.heads)


def _sampled(rc) -> bool:
    return rc.train.gradient == "sampled"


_LAST = {}  # one entry: the read-outs of the last (task, parameters), shared by references, checks and plots


def _readouts(rc, params):
    """The sampled read-outs (same held-out sample for the references and the checks); the task's Bayes
    loss where it is cheap (a finite prior, uniform roots, or S <= 3)."""
    key = (id(rc.task), tuple(a.tobytes() for a in (*params.A, params.W)))
    if _LAST.get("key") != key:
        _LAST.clear()
        _LAST.update(key=key, value=_compute_readouts(rc, params))
    return _LAST["value"]


def _compute_readouts(rc, params):
    task = rc.task
    cheap = not getattr(task, "continuous", False) or getattr(task.prior, "roots", "uniform") == "uniform" \
        or task.S <= 3
    return sampled_readouts(task, _model(rc), params, n=READOUT_SAMPLES, seed=READOUT_SEED,
                            alpha=rc["alpha"], bayes=cheap)


def _population(rc, params):
    """Population-average layer-1 attention: exact, or sampled (mean) for ``--gradient sampled``."""
    if _sampled(rc):
        return _readouts(rc, params)["population"]["mean"]
    return CC.population_attention(rc.task, _model(rc), params)


def _attention_to_parent(rc, traj, r):
    return CC.attention_to_parent_per_position(rc.task.graph, _population(rc, traj.params(r)))


def _most_attended_parent(graph, P) -> np.ndarray:
    """Shape ``(m, T)``: for each head and non-root ``i``, the parent of ``i`` with the largest ``P[h, i, ·]``
    (-1 for roots); single-parent graphs: the parent."""
    P = np.asarray(P)
    par = np.asarray(graph.parents)
    out = np.full((P.shape[0], P.shape[1]), -1, dtype=np.int64)
    for i in graph.non_roots:
        cand = np.atleast_1d(par[i])
        cand = cand[cand >= 0]
        out[:, i] = cand[np.argmax(P[:, i, cand], axis=1)]
    return out


class CatFormerKind(KindBase):
    """The full disentangled transformer, trained jointly with an official optimizer."""

    name = "catformer"
    model = "catformer"
    summary = "the full disentangled transformer, trained jointly (its flags below)"
    flags = FLAGS
    defaults = dict(common_defaults(record_every=False), **CATFORMER_DEFAULTS)
    check_names = ("catformer_graph_recovery", "head_specialization", "induction_head")
    figures = ("loss.png", "attention.png", "attention_to_parent.png")
    config_class = CatFormerTrainConfig

    def graph_defaults(self, values):
        return MULTI_PARENT_TASK_DEFAULTS if is_multi_parent(values) else {}

    def check_conflicts(self, values, given):
        refuse_batch_flags_unless_sampled(values, given)
        if "init_seed" in given and not values.get("init_scale"):
            raise CLIError(f"--init-seed {values['init_seed']} has no effect at --init-scale 0 (the zero start "
                           "draws nothing; as a sweep axis it would only repeat cells): give --init-scale > 0 "
                           "(e.g. 1e-4, the official two-parent start) or drop --init-seed")

    def settle(self, cfg, task):
        heads = parse_heads(cfg["heads"])
        for key, choices in (("optimizer", OPTIMIZERS), ("lr_schedule", LR_SCHEDULES),
                             ("gradient", CATFORMER_GRADIENTS)):
            if cfg[key] not in choices:
                raise CLIError(f"--{key.replace('_', '-')} {cfg[key]!r}: use {', '.join(choices)}")
        sampled = cfg["gradient"] == "sampled"
        if not sampled:
            try:
                task.check_size()  # the exact gradient enumerates every sequence
            except ValueError:
                # issue 32: the ways out of the full model (not the reduced model's field or sampled Stage 2)
                what, how = too_large(task)
                raise CLIError(f"--model catformer needs the exact population with --gradient exact (it trains "
                               f"on every sequence): {what}; use {how}, or train on sampled batches: "
                               "--gradient sampled") from None
        if sampled:  # every allocation of the run, sized before it starts: the training batch, the read-outs
            check_batch_size(cfg["batch_size"], task)
            check_readout_memory(task, heads)
        steps = cfg["steps"]
        record_every = cfg.get("record_every") or max(1, steps // 128)
        train = CatFormerTrainConfig(
            S=task.S, T=task.T, heads=heads, steps=steps, optimizer=cfg["optimizer"], lr=cfg["lr"],
            lr_schedule=cfg["lr_schedule"], weight_decay=cfg["weight_decay"],
            init="normal" if cfg["init_scale"] > 0 else "zero", init_scale=cfg["init_scale"],
            init_seed=cfg["init_seed"] if cfg["init_scale"] > 0 else 0, record_every=record_every,
            gradient=cfg["gradient"], batch_size=cfg["batch_size"] if sampled else None,
            sample_seed=cfg["sample_seed"] if sampled else None)
        try:
            train.optimizer_rule()
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        return dict(record_every=record_every), train

    def train(self, rc, **run):
        c = rc.train
        init = ("normal", c.init_scale, c.init_seed) if c.init == "normal" else "zero"
        return train_catformer(rc.task, _model(rc), c.steps, optimizer=c.optimizer, lr=c.lr,
                               lr_schedule=c.lr_schedule, weight_decay=c.weight_decay, init=init,
                               record_every=c.record_every, gradient=c.gradient, batch_size=c.batch_size,
                               sample_seed=c.sample_seed, **run)

    def notes(self, rc):
        if not _sampled(rc):
            return []
        b = rc.train.batch_size
        se = ("recorded losses are batch estimates with their SE" if b >= 2 else
              "a batch of 1 has no standard error (--batch-size >= 2 for one), so the recorded losses' noise is not "
              "judged: only a non-finite loss stops the run")
        secs = readout_seconds(rc.task, rc.train.heads)
        took = f" (about {_duration(secs)} on this machine, estimated from a timed forward pass)" if secs > 60 else ""
        return [f"sampled gradient: batches of {b} (sample seed {rc.train.sample_seed}); {se}; read-outs on "
                f"{READOUT_SAMPLES} held-out sequences{took}"]

    def references(self, rc, traj, sampled=True):
        """The references at ``ε = 0`` (the softmax readout's loss has no perturbation); with the sampled
        gradient, estimates on the held-out sample (``*_sampled``, with SE): the model's loss there, the
        official ``bayes`` estimator's, the task's Bayes loss where known, and the differences."""
        if not _sampled(rc):
            return softmax_reference_losses(rc.task), None
        L = _readouts(rc, traj.final)["losses"]
        names = {"L_model": "L_model_heldout_sampled", "L_official_bayes": "L_official_bayes_sampled",
                 "L_official_bayes_line": "L_official_bayes_line_sampled",
                 "L_bayes": "L_bayes_sampled", "model_minus_official_bayes": "model_minus_official_bayes_sampled",
                 "model_minus_official_bayes_line": "model_minus_official_bayes_line_sampled",
                 "model_minus_bayes": "model_minus_bayes_sampled"}
        return {new: L[old] for old, new in names.items() if old in L}, None

    def checks(self, rc, traj, refs, objective=None):
        task, model, params = rc.task, _model(rc), traj.final
        if _sampled(rc):
            return self._sampled_checks(rc, traj, refs)
        results = [CC.check_catformer_graph_recovery(task, model, params),
                   CC.check_catformer_head_specialization(task, model, params),
                   CC.check_induction_head(task, model, params)]
        Pbar = CC.population_attention(task, model, params)
        loss = float(traj.loss[-1])
        names = {"bayes": "L_bayes", "count_estimator": "L_count", "floor": "L_floor_eps"}
        ref = {name: reference_value(refs[key]) for name, key in names.items()}
        extra = {"catformer": {
            "heads": list(model.heads), "final_loss": loss,
            "excess_over": {name: None if v is None else loss - v for name, v in ref.items()},
            "population_attention_layer1": Pbar,
            "attention_to_parent_per_position": CC.attention_to_parent_per_position(task.graph, Pbar),
            "note": "exact population-average layer-1 attention of each head (rows: query position i); attention "
                    "to the parent per position is P[h, i, p(i)] (k-parent: the largest over i's parents)",
        }}
        return results, extra

    def _sampled_checks(self, rc, traj, refs):
        task, model, params = rc.task, _model(rc), traj.final
        ro = _readouts(rc, params)
        results = sampled_catformer_checks(task, model, params, ro)
        pop = ro["population"]
        extra = {"catformer": {
            "heads": list(model.heads), "gradient": "sampled", "readout_samples": ro["n"], "readout_seed": ro["seed"],
            "final_loss": refs["L_model_heldout_sampled"]["value"],
            "final_loss_se": refs["L_model_heldout_sampled"]["se"],
            "excess_over": {"official_bayes": refs["model_minus_official_bayes_sampled"],
                            "official_bayes_line": refs.get("model_minus_official_bayes_line_sampled"),
                            "bayes": refs["model_minus_bayes_sampled"]},
            "population_attention_layer1": pop["mean"], "population_attention_layer1_se": pop["se"],
            "attention_to_parent_per_position": pop["to_parent"],
            "attention_to_parent_per_position_se": pop["to_parent_se"],
            "positional_attention_to_parent_per_position": ro["positional"]["to_parent"],
            "induction": ro.get("induction"),
            "note": f"sampled: population-average layer-1 attention, losses and the matching mass are means over "
                    f"{ro['n']} held-out sequences with their SE; the positional block (the official metric's "
                    "matrix) and the layer-2 margin are exact (parameters)",
        }}
        return results, extra

    def plots(self, out, rc, traj, refs, context=""):
        if _sampled(rc):  # both official reference lines, the task's Bayes loss where known
            refs = {"eps": 0.0, "L_count_edges": refs["L_official_bayes_sampled"],
                    "L_official_bayes_line": refs.get("L_official_bayes_line_sampled"),
                    "L_bayes_eps": refs["L_bayes_sampled"]}
        P.plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)
        Pbar = _population(rc, traj.params(-1))  # the record at traj.step[-1]
        P.plot_population_attention(rc.task.graph, Pbar, os.path.join(out, "attention.png"), context=context,
                                    step=int(traj.step[-1]))
        P.plot_parent_attention_per_position(rc.task.graph, _attention_to_parent(rc, traj, 0),
                                             CC.attention_to_parent_per_position(rc.task.graph, Pbar),
                                             int(traj.step[-1]), os.path.join(out, "attention_to_parent.png"),
                                             context=context, parents=_most_attended_parent(rc.task.graph, Pbar))

    def check_resume(self, path, rc):
        """The checkpoint must be of this task and these settings (its parameters and Adam's moments)."""
        load_checkpoint(path, rc.task, CatFormerScheme(rc.task, _model(rc), rc.train))

    def markdown(self, report):
        """The full model's section of report.md: final loss against the references, attention to the parent."""
        cat = report.get("catformer")
        if not cat:
            return []
        if cat.get("gradient") == "sampled":
            return _sampled_markdown(cat)
        ex = cat["excess_over"]
        lines = ["", "## The full model (population-average layer-1 attention)", "",
                 f"Heads per layer {tuple(cat['heads'])}; final loss {fmt(cat['final_loss'])}; final loss minus the "
                 f"Bayes loss {fmt(ex['bayes'])}, minus the exact floor {fmt(ex['floor'])}, minus the (smoothed) "
                 f"count estimator {fmt(ex['count_estimator'])}.", ""]
        rows = cat["attention_to_parent_per_position"]
        cols = [i for i in range(len(rows[0])) if any(r[i] is not None and math.isfinite(r[i]) for r in rows)]
        lines += ["| head | " + " | ".join(f"P̄[{i}, p({i})]" for i in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        lines += [f"| {h} | " + " | ".join(fmt(r[i]) for i in cols) + " |" for h, r in enumerate(rows)]
        return lines


def _pm(v) -> str:
    if not isinstance(v, dict) or v.get("value") is None:
        return "n/a" + (f" ({v['reason']})" if isinstance(v, dict) and v.get("reason") else "")
    return f"{fmt(v['value'])} ± {fmt_se(v['se'])}"


def _sampled_markdown(cat) -> list:
    ex = cat["excess_over"]
    n = cat["readout_samples"]
    lines = ["", f"## The full model, sampled read-outs (n = {n:,} held-out sequences, ± SE)", "",
             f"Heads per layer {tuple(cat['heads'])}; loss on the held-out sample {fmt(cat['final_loss'])} ± "
             f"{fmt_se(cat['final_loss_se'])} (sampled); minus the edges-only count estimator {_pm(ex['official_bayes'])}, "
             + (f"minus the official bayes line (roots counted) {_pm(ex['official_bayes_line'])}, "
                if ex.get("official_bayes_line") else "")
             + f"minus the task's Bayes loss {_pm(ex['bayes'])} (same sample, sampled).", ""]
    rows = cat["attention_to_parent_per_position"]
    ses = cat["attention_to_parent_per_position_se"]
    posb = cat["positional_attention_to_parent_per_position"]
    cols = [i for i in range(len(rows[0])) if rows[0][i] is not None and math.isfinite(rows[0][i])]
    lines += ["| head | read-out | " + " | ".join(f"[{i}, p({i})]" for i in cols) + " |",
              "|---|---|" + "---|" * len(cols)]
    for h in range(len(rows)):
        lines.append(f"| {h} | population attention (sampled) | "
                     + " | ".join(f"{fmt(rows[h][i])} ± {fmt_se(ses[h][i])}" for i in cols) + " |")
        lines.append(f"| {h} | positional block (exact) | " + " | ".join(fmt(posb[h][i]) for i in cols) + " |")
    ind = cat.get("induction")
    if ind:
        mm = ind["matching_minus_uniform"]
        lines += ["", f"Induction head: layer-2 margin {fmt(ind['margin'])} (exact; / max abs(Ã2) = "
                      f"{fmt(ind['margin_over_max_abs'])}); the query's layer-2 attention on positions whose parent "
                      f"token equals the query's minus the same under uniform attention: {_pm(mm)} (sampled)."]
    return lines


KIND = CatFormerKind()
