"""Kind ``transformer``: the official standard transformer of ``tf_with_mlp.ipynb`` (``--model transformer``).

Model :class:`popgrad.Transformer` (trained embeddings, per layer attention, value, the official MLP and a
residual stream; the official initialisation law), trainer :func:`popgrad.train_model` on the exact
population gradient (the generic exact engine; ``--gradient exact``, the default) or a fresh sampled
batch per step (``--gradient sampled --batch-size 1024``, any size). Defaults are the notebook's recipe:
the chain, the continuous Dirichlet(α = 0.1) prior, heads (1, 1), AdamW (optax defaults) with
``cosine_decay_schedule(0.01, steps)``, weight decay 2e-4, ``steps = 2^12``, loss at ``ε = 0``; at
``S = 3, T = 8`` (the notebook's ``S = 10, T = 20`` is not enumerable: give ``--S 10 --T 20 --gradient
sampled`` for it).

References at ``ε = 0`` (:func:`popgrad.checks.suites.softmax_reference_losses`) for the exact gradient;
for the sampled one, the model's and the official ``bayes`` estimator's losses on :data:`READOUT_SAMPLES`
held-out sequences (sampled, with SE). Check ``model_graph_recovery``
(:func:`popgrad.checks.model_checks.check_model_graph_recovery`, the exact population attention; not
applicable where the task cannot be enumerated). Figures ``loss.png`` and ``attention.png`` (the
layer-1 attention averaged over the population, or over the held-out sample, beside the graph).
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..._io import atomic_savez
from ...checks.model_checks import check_model_graph_recovery, model_population_attention
from ...checks.results import attention_lift, not_applicable
from ...checks.suites import softmax_reference_losses
from ...engine.baselines import official_bayes_loss, official_bayes_predict
from ...engine.sampled import estimate
from ...model.transformer import Transformer
from ...task import MultiParentTask
from ...train.catformer_config import CATFORMER_GRADIENTS
from ...train.loop import load_checkpoint
from ...train.model_trainer import ModelScheme, ModelTrainConfig, train_model
from ...train.optim import LR_SCHEDULES, OPTIMIZERS
from .. import plots as P
from ..report import fmt, fmt_se, reference_value
from ..settings import CLIError
from ..tasks import too_large
from . import catformer as _catformer
from ._common import KindBase, common_defaults, refuse_batch_flags_unless_sampled

__all__ = ["KIND", "TRANSFORMER_DEFAULTS", "READOUT_SAMPLES", "READOUT_SEED"]

#: Held-out sequences of the sampled read-outs and their seed (as ``--model catformer``).
READOUT_SAMPLES = _catformer.READOUT_SAMPLES
READOUT_SEED = _catformer.READOUT_SEED

#: The notebook's recipe (``tf_with_mlp.ipynb``), at an enumerable size.
TRANSFORMER_DEFAULTS = dict(model="transformer", S=3, T=8, alpha=0.1, prior="continuous", heads="1,1",
                            optimizer="adamw", lr=0.01, lr_schedule="cosine", weight_decay=2e-4, init_scale=1.0,
                            init_seed=0, steps=2**12, gradient="exact", batch_size=1024, sample_seed=0)

#: The flags: the keys of ``--model catformer`` (same specs; this kind's defaults above).
_KEYS = ("heads", "optimizer", "lr", "lr_schedule", "weight_decay", "init_scale", "init_seed", "steps", "gradient",
         "batch_size", "sample_seed")
FLAGS = tuple(f for f in _catformer.FLAGS if f.key in _KEYS)


def _model(rc) -> Transformer:
    return Transformer(rc.task.S, rc.task.T, heads=_catformer.parse_heads(rc["heads"]))


def _sampled(rc) -> bool:
    return rc.train.gradient == "sampled"


def _enumerable(task) -> bool:
    try:
        task.check_size()
    except ValueError:
        return False
    return True


class TransformerTrajectory:
    """A :class:`popgrad.train.model_trainer.ModelTrajectory` as ``popgrad run`` writes it (``save``)."""

    def __init__(self, traj):
        self._traj = traj

    def __getattr__(self, name):
        return getattr(self._traj, name)

    def params(self, r: int) -> dict:
        return self._traj.params_at(r)

    def save(self, path) -> None:
        """``trajectory.npz``: the records (``step``, ``stage``, ``loss``, ``loss_se``, ``grad_norm``, ``lr``),
        the recorded parameters ``p_<name>`` and the final ones ``final_<name>`` (written atomically)."""
        t = self._traj
        arrays = {k: np.asarray(getattr(t, k)) for k in ("step", "stage", "loss", "loss_se", "grad_norm", "lr")}
        arrays.update({f"p_{k}": np.asarray(v) for k, v in t.params.items()})
        arrays.update({f"final_{k}": np.asarray(v) for k, v in t.final.items()})
        atomic_savez(path, **arrays)


_LAST = {}  # the held-out read-outs of the last (task, parameters), shared by references, checks and plots


def _heldout(rc, params):
    key = (id(rc.task), tuple(np.asarray(v).tobytes() for v in params.values()))
    if _LAST.get("key") != key:
        task, model = rc.task, _model(rc)
        sample = task.sample(READOUT_SAMPLES, READOUT_SEED)
        seqs, y = sample.seqs, sample.targets
        f = model.predict(params, seqs)
        fo = official_bayes_predict(task.graph, seqs, task.S, rc["alpha"])
        lm, lo = _xent(y, f), _xent(y, fo)
        line = {}
        if not isinstance(task, MultiParentTask):  # the official single-parent line counts the roots
            lq = _xent(y, official_bayes_predict(task.graph, seqs, task.S, rc["alpha"], root_quirk=True))
            line = {"L_official_bayes_line_sampled": _est(lq), "model_minus_official_bayes_line_sampled": _est(lm - lq)}
        rows = max(1, 2**25 // (32 * task.T * task.T))  # chunks of the (n, 1, T, T) attention: bounded memory
        att = sum(np.sum(model.layer1_attention(params, seqs[i:i + rows]), axis=0)
                  for i in range(0, len(seqs), rows)) / len(seqs)
        _LAST.clear()
        _LAST.update(key=key, value={
            "L_model_heldout_sampled": _est(lm), "L_official_bayes_sampled": _est(lo),
            "model_minus_official_bayes_sampled": _est(lm - lo), **line, "attention": att})
    return _LAST["value"]


def _xent(y, f):
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(y > 0, y * np.log(np.where(y > 0, f, 1.0)), 0.0), axis=1)


def _est(x) -> dict:
    e = estimate(x)
    return {"value": float(e.value), "se": float(e.se), "n": int(np.size(x)), "kind": "sampled"}


def _population(rc, params):
    """Layer-1 attention ``(H, T, T)``: the exact population average, or the held-out sample's mean."""
    if _enumerable(rc.task):
        return model_population_attention(rc.task, _model(rc), params)
    return _heldout(rc, params)["attention"]


def _to_parent(graph, Pbar) -> list:
    """``[h][i] = P̄[h, i, p(i)]`` (None for roots and the query)."""
    par = np.asarray(graph.parents)
    T = Pbar.shape[-1]
    return [[float(Pbar[h, i, par[i]]) if i < T - 1 and par[i] >= 0 else None for i in range(T)]
            for h in range(Pbar.shape[0])]


class TransformerKind(KindBase):
    """The official standard transformer (``tf_with_mlp.ipynb``), trained jointly with AdamW."""

    name = "transformer"
    model = "transformer"
    summary = "the standard transformer of tf_with_mlp.ipynb (the catformer flags, the notebook's defaults)"
    flags = FLAGS
    defaults = dict(common_defaults(record_every=False), **TRANSFORMER_DEFAULTS)
    check_names = ("model_graph_recovery",)
    figures = ("loss.png", "attention.png")

    def check_conflicts(self, values, given):
        refuse_batch_flags_unless_sampled(values, given)

    def settle(self, cfg, task):
        try:
            heads = _catformer.parse_heads(cfg["heads"])
            Transformer(task.S, task.T, heads=heads)  # one head per layer; the size refusal
        except ValueError as exc:
            raise CLIError(str(exc).replace("heads=(1,) * n_layers", "--heads 1,1").replace(
                "popgrad.CatFormer", "--model catformer")) from None
        for key, choices in (("optimizer", OPTIMIZERS), ("lr_schedule", LR_SCHEDULES),
                             ("gradient", CATFORMER_GRADIENTS)):
            if cfg[key] not in choices:
                raise CLIError(f"--{key.replace('_', '-')} {cfg[key]!r}: use {', '.join(choices)}")
        sampled = cfg["gradient"] == "sampled"
        if not sampled and not _enumerable(task):
            what, how = too_large(task)
            raise CLIError(f"--model transformer needs the exact population with --gradient exact (it trains on "
                           f"every sequence): {what}; use {how}, or train on sampled batches: --gradient sampled")
        if sampled:
            _catformer.check_batch_size(cfg["batch_size"], task)
        steps = cfg["steps"]
        record_every = cfg.get("record_every") or max(1, steps // 128)
        try:
            train = ModelTrainConfig(
                steps=steps, optimizer=cfg["optimizer"], lr=cfg["lr"], lr_schedule=cfg["lr_schedule"],
                weight_decay=cfg["weight_decay"], gradient=cfg["gradient"],
                batch_size=cfg["batch_size"] if sampled else None, sample_seed=cfg["sample_seed"] if sampled else None,
                eps=0.0, record_every=record_every, init_scale=cfg["init_scale"], init_seed=cfg["init_seed"])
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        return dict(record_every=record_every), train

    def train(self, rc, **run):
        return TransformerTrajectory(train_model(rc.task, _model(rc), rc.train.steps, config=rc.train, **run))

    def notes(self, rc):
        if not _sampled(rc):
            return ["exact population gradient: the generic exact engine (every sequence, exact weights)"]
        return [f"sampled gradient: batches of {rc.train.batch_size} (sample seed {rc.train.sample_seed}); recorded "
                f"losses are batch estimates with their SE; read-outs on {READOUT_SAMPLES} held-out sequences"]

    def references(self, rc, traj, sampled=True):
        """Exact: the references at ``ε = 0``; sampled: the held-out estimates (model, official ``bayes``)."""
        if not _sampled(rc):
            refs = softmax_reference_losses(rc.task)
            value = float(official_bayes_loss(rc.task, alpha=rc["alpha"]))
            refs["L_official_bayes"] = {"value": value, "kind": "exact"}
            if not isinstance(rc.task, MultiParentTask):
                value = float(official_bayes_loss(rc.task, alpha=rc["alpha"], root_quirk=True))
                refs["L_official_bayes_line"] = {"value": value, "kind": "exact"}
            return refs, None
        ho = _heldout(rc, traj.final)
        return {k: v for k, v in ho.items() if k != "attention"}, None

    def checks(self, rc, traj, refs, objective=None):
        task, model, params = rc.task, _model(rc), traj.final
        statement = ("layer 1 attends to each position's parent, at least halfway from uniform attention to "
                     "Knowl 8's construction (exact population average)")
        if _enumerable(task):
            results = [check_model_graph_recovery(task, model, params)]
        else:
            results = [not_applicable("model_graph_recovery", statement,
                                      "the exact population attention needs an enumerable task; the held-out "
                                      "sample's attention to the parent is in the report (sampled)")]
        Pbar = _population(rc, params)
        to_parent = _to_parent(task.graph, Pbar)
        lift = None
        if not isinstance(task, MultiParentTask):
            par = np.asarray(task.graph.parents)
            rows = [i for i in range(task.T - 1) if par[i] >= 0]
            if rows:
                a = np.array([Pbar[0, i, par[i]] for i in rows])
                lift = float(np.mean(attention_lift(a, 1.0 / (np.array(rows) + 1.0))))
        loss = refs["L_model_heldout_sampled"]["value"] if _sampled(rc) else float(traj.loss[-1])
        extra = {"transformer": {
            "heads": list(model.heads), "gradient": rc.train.gradient, "final_loss": loss,
            "final_loss_se": refs["L_model_heldout_sampled"]["se"] if _sampled(rc) else None,
            "official_bayes": (refs["L_official_bayes_sampled"] if _sampled(rc)
                               else refs.get("L_official_bayes")),
            "official_bayes_line": (refs.get("L_official_bayes_line_sampled") if _sampled(rc)
                                    else refs.get("L_official_bayes_line")),
            "attention_kind": "exact" if _enumerable(task) else f"sampled ({READOUT_SAMPLES} held-out sequences)",
            "population_attention_layer1": Pbar, "attention_to_parent_per_position": to_parent,
            "mean_attention_lift_to_parent": lift,
            "note": "layer-1 attention averaged over the population (exact) or the held-out sample (sampled); "
                    "attention to the parent per position is P[0, i, p(i)]; the lift (a - 1/(i+1))/(1 - 1/(i+1))",
        }}
        return results, extra

    def plots(self, out, rc, traj, refs, context=""):
        if _sampled(rc):
            refs = {"eps": 0.0, "L_count_edges": refs["L_official_bayes_sampled"],
                    "L_official_bayes_line": refs.get("L_official_bayes_line_sampled")}
        else:
            refs = dict(refs, L_count_edges=refs.get("L_official_bayes"))
        P.plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)
        P.plot_population_attention(rc.task.graph, _population(rc, traj.final), os.path.join(out, "attention.png"),
                                    context=context, step=int(traj.step[-1]))

    def check_resume(self, path, rc):
        """The checkpoint must be of this task, this model and these settings."""
        model = _model(rc)
        load_checkpoint(path, rc.task, ModelScheme(rc.task, model, rc.train, model.init(rc.train.init_scale,
                                                                                         rc.train.init_seed)))

    def markdown(self, report):
        tf = report.get("transformer")
        if not tf:
            return []
        ob = tf.get("official_bayes")
        obv = reference_value(ob) if isinstance(ob, dict) else None
        ol = tf.get("official_bayes_line")
        olv = reference_value(ol) if isinstance(ol, dict) else None
        se = f" ± {fmt_se(tf['final_loss_se'])}" if tf.get("final_loss_se") is not None else ""
        lines = ["", f"## The standard transformer (layer-1 attention: {tf['attention_kind']})", "",
                 f"Heads per layer {tuple(tf['heads'])}, {tf['gradient']} gradient; final loss {fmt(tf['final_loss'])}"
                 f"{se}; edges-only count estimator {fmt(obv)}"
                 + (f"; the official bayes line (roots counted) {fmt(olv)}" if olv is not None else "")
                 + "; mean attention lift to the parent "
                 f"{fmt(tf['mean_attention_lift_to_parent'])}.", ""]
        rows = tf["attention_to_parent_per_position"]
        cols = [i for i in range(len(rows[0])) if rows[0][i] is not None and math.isfinite(rows[0][i])]
        if cols:
            lines += ["| head | " + " | ".join(f"P̄[{i}, p({i})]" for i in cols) + " |", "|---|" + "---|" * len(cols)]
            lines += [f"| {h} | " + " | ".join(fmt(r[i]) for i in cols) + " |" for h, r in enumerate(rows)]
        return lines


KIND = TransformerKind()
