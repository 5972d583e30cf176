"""Kind ``reduced-k-head``: the reduced ``k``-head model on a multi-parent task (``--graph ngram|two-parent``).

Trainer :func:`popgrad.train_multi_head` (seeded symmetry-breaking start, ``init_seed = --seed``) on
the prior :func:`popgrad.dirichlet_tensor_prior` with ``symmetrize="full"``; checks
``head_specialization`` in place of graph recovery, loss convergence against the count estimator of
"Knowl 9", roots per head; gradient alignment and OOD are reported as not applicable (no idealized
k-head gradient, no k-parent OOD check), never faked; no T sweep; no ``gradient_cosine.png``.
"""
from __future__ import annotations

import os

from ... import checks as C
from ...checks.suites import exact_reference_losses
from ...train.config import MultiHeadTrainConfig
from ...train.multihead import train_multi_head
from .. import plots as P
from ..report import reference_value
from ..settings import CLIError
from ..tasks import MULTI_PARENT_TASK_DEFAULTS, is_multi_parent
from ._common import KindBase, validated
from .reduced_single import DEFAULTS, FLAGS, a1_hat, a1_hat_record, check_schedule, train_kwargs

__all__ = ["KIND", "MULTI_PARENT_DEFAULTS"]

_MULTI = MultiHeadTrainConfig()

#: Defaults that replace :data:`popgrad.app.kinds.reduced_single.DEFAULTS` for the reduced model on
#: ``--graph ngram|two-parent`` unless given in the config file or by a flag: k heads train jointly from a
#: seeded start (the training values are :class:`popgrad.MultiHeadTrainConfig`'s, as in
#: :func:`popgrad.train_multi_head`).
MULTI_PARENT_DEFAULTS = dict(
    MULTI_PARENT_TASK_DEFAULTS, beta0=_MULTI.beta0, lr1=_MULTI.lr1, steps1=_MULTI.steps1, lr2=_MULTI.lr2,
    steps2=_MULTI.steps2, schedule=_MULTI.schedule, record_every=50, checkpoint_every=500,
)


class ReducedKHead(KindBase):
    """The reduced k-head model on a multi-parent task."""

    name = "reduced-k-head"
    model = "reduced"
    flags = FLAGS
    defaults = DEFAULTS
    check_names = ("head_specialization", "gradient_alignment", "loss_convergence", "ood_generalization",
                   "roots_uniform")
    figures = ("attention.png", "loss.png", "attention_to_parent.png")
    config_class = MultiHeadTrainConfig

    def selects(self, values):
        return is_multi_parent(values)

    def graph_defaults(self, values):
        return MULTI_PARENT_DEFAULTS

    def settle(self, cfg, task):
        check_schedule(cfg)
        if cfg["gradient"] not in ("auto", "exact"):
            raise CLIError(f"--gradient {cfg['gradient']} is not available for multi-parent graphs: use exact")
        if cfg["stage2"] not in ("auto", "exact"):
            raise CLIError(f"--stage2 {cfg['stage2']} is not available for multi-parent graphs: use exact")
        task.check_size()  # the k-head job needs the exact population throughout
        train = validated(MultiHeadTrainConfig, **train_kwargs(cfg), init_seed=cfg["seed"])
        return dict(gradient="exact", stage2="exact"), train

    def train(self, rc, **run):
        return train_multi_head(rc.task, config=rc.train, **run)

    def references(self, rc, traj, sampled=True):
        return exact_reference_losses(rc.task), None

    def checks(self, rc, traj, refs, objective=None):
        task = rc.task
        A1_hat = a1_hat(rc, traj)
        results = [
            C.check_head_specialization(task, A1_hat),
            C.not_applicable(
                "gradient_alignment", "grad_A1 L = -(b0/(S T)) J(P_i)(g_i + O(T_eff^-1/2)) (Knowl 3)",
                "the idealized gradient is derived for single-parent trees with a token query; the k-head model's "
                "query is the soft layer-1 output of the last position",
            ),
            C.check_loss_convergence(task, traj.final_A1, traj.final_A2, rc["beta0"],
                                     references={k: reference_value(v) for k, v in refs.items()},
                                     init_seed=traj.config.init_seed, init_scale=traj.config.init_scale,
                                     trajectory=traj if rc["schedule"] == "two-stage" else None),
            C.not_applicable(
                "ood_generalization", "sup_c |f(s)_c - pi~(c|s_T)| small for an unseen pi~ (Knowl 4)",
                "Knowl 4 is stated for single-parent graphs; popgrad has no k-parent out-of-distribution check",
            ),
            C.check_roots(task, A1_hat),
        ]
        extra = {"multi_parent": {
            "k": task.k,
            "target_parents": [int(x) for x in task.graph.target_parents],
            "prior": "dirichlet_tensor_prior(symmetrize='full'): relabelings of parents and predicted token",
            "roots": "draw uniformly (popgrad's stated k-parent process)",
            "loss_sweep": "not run for multi-parent graphs",
        }}
        return results, extra

    def plots(self, out, rc, traj, refs, context=""):
        graph = rc.task.graph
        r = a1_hat_record(rc, traj)
        P.plot_head_attention(graph, traj.A1[r], os.path.join(out, "attention.png"),
                              title=f"at step {int(traj.step[r])}", context=context)
        P.plot_loss(traj, refs, os.path.join(out, "loss.png"), context=context)
        P.plot_head_attention_to_parent(traj, graph, os.path.join(out, "attention_to_parent.png"), context=context)


KIND = ReducedKHead()
