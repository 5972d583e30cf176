"""Checks of any :class:`popgrad.Model` that read its attention (DESIGN §26): graph recovery, head
specialization, induction head.

* :func:`model_population_attention` -- ``P̄^h[i, j] = Σ_s p(s) · layer1_attention(θ, s)[h, i, j]``, the
  exact population average of the model's layer-1 attention (``p(s) = Σ_c w(s, c)``, the task's exact
  weights, every sequence enumerated);
* :func:`check_model_graph_recovery` -- layer 1 attends to each position's parent (Knowl 1.1 for any
  model): a :class:`CheckResult`;
* :func:`check_model_head_specialization` -- the layer-1 heads split the parent slots one-to-one (Knowl 9
  for any model; the rule of :func:`popgrad.checks.check_catformer_head_specialization`);
* :func:`check_model_induction_head` -- layer 2 selects the positions whose copied parent token matches the
  query (the rule of :func:`popgrad.checks.check_induction_head`), read from the optional member
  ``query_attention(params, seqs)`` (``(n, H_2, T)``, the layer-2 attention of the query; a model without
  it is not applicable).

Every check here is behind the hypotheses (:func:`popgrad.checks.within_hypotheses`) and the chance guard
(:func:`popgrad.checks.chance.chance_guard`).
"""
from __future__ import annotations

import math

import numpy as np

from .._validation import ArgumentTypeError
from ..engine.generic import exact_rows
from ..model.protocol import check_params, check_task_and_model, model_attr, model_name
from ..task.tasks import MultiParentTask
from ._common import _hypotheses
from .chance import chance_guard
from .hypotheses import NEEDS, within_hypotheses
from .recovery import check_head_specialization
from .results import ATTENTION_LIFT, CheckResult, attention_lift, not_applicable

__all__ = ["model_population_attention", "check_model_graph_recovery", "check_model_head_specialization",
           "check_model_induction_head", "model_query_attention", "model_matching_mass"]

_CHUNK = 4096


def model_population_attention(task, model, params, chunk: int = _CHUNK) -> np.ndarray:
    """The exact population-average layer-1 attention of any model, ``(H, T, T)`` (module docstring).

    Enumerates every sequence (``task.check_size()`` first) in chunks of ``chunk`` and averages
    ``model.layer1_attention(params, seqs)`` with the sequence probabilities ``p(s) = Σ_c w(s, c)``.
    """
    check_task_and_model(task, model)
    p = check_params(model, params)
    task.check_size()
    total = None
    for start in range(0, task.n_sequences, int(chunk)):
        seqs, w = exact_rows(task, start, min(task.n_sequences, start + int(chunk)))
        P = np.asarray(model.layer1_attention(p, seqs), dtype=np.float64)
        part = np.einsum("n,nhij->hij", w.sum(axis=1), P)
        total = part if total is None else total + part
    return total


def check_model_graph_recovery(task, model, params, hypotheses="auto") -> CheckResult:
    """Layer 1 of any model attends to each position's parent (Knowl 1.1; single-parent tasks, DESIGN §15, §26).

    For the layer-1 head attending most to parents and every non-root position ``i < T-1``, with uniform
    attention ``u_i = 1/(i+1)``: the lift ``(a_i − u_i)/(1 − u_i)`` of the exact population-average
    attention to the parent ``a_i = P̄[i, p(i)]`` (:func:`model_population_attention`). Knowl 8's
    construction attends to the parent with weight → 1 (lift 1); a model that learned nothing attends
    uniformly (lift 0). Value: the smallest lift over rows; threshold :data:`ATTENTION_LIFT`; passes when
    it is reached and every row's argmax is the parent. ``"not_applicable"`` on a k-parent task or a
    graph without a non-root position before the query; ``"inconclusive"`` when a Knowl 10 assumption
    fails on the task (``hypotheses="auto"`` measures them; ``None`` skips), and a pass is inconclusive
    when a random start would pass the same rows too often (:func:`popgrad.checks.chance.chance_guard`:
    with one head a chain is decided from ``T = 8``).
    """
    check_task_and_model(task, model)
    statement = ("layer 1 attends to each position's parent, at least halfway from uniform attention to "
                 "Knowl 8's construction (exact population average)")
    name = "model_graph_recovery"
    if isinstance(task, MultiParentTask):
        return not_applicable(name, statement, "k-parent task: the heads split the parents (head specialization)")
    graph = task.graph
    nr = [int(i) for i in graph.non_roots if i < task.T - 1]
    if not nr:
        return not_applicable(name, statement, "the graph has no non-root position before the query")
    Pbar = model_population_attention(task, model, params)
    par = np.asarray(graph.parents)
    to_par = Pbar[:, nr, par[nr]]  # (H, rows)
    h = int(np.argmax(to_par.mean(axis=1)))
    u = np.array([1.0 / (i + 1) for i in nr])
    lift = attention_lift(to_par[h], u)
    hits = [i for i in nr if int(np.argmax(Pbar[h, i, : i + 1])) == par[i]]
    value = float(lift.min())
    details = {
        "head": h,
        "attention_to_parent": {i: float(a) for i, a in zip(nr, to_par[h])},
        "uniform_attention_to_parent": {i: float(v) for i, v in zip(nr, u)},
        "lift": {i: float(v) for i, v in zip(nr, lift)},
        "rows_with_argmax_not_parent": [i for i in nr if i not in hits],
        "rule": (f"passes when min_i (a_i - 1/(i+1)) / (1 - 1/(i+1)) >= {ATTENTION_LIFT:g} and every argmax is "
                 "the parent"),
    }
    passed = value >= ATTENTION_LIFT and len(hits) == len(nr)
    res = CheckResult(name, value, ATTENTION_LIFT, passed, ">=", statement, details)
    res = within_hypotheses(res, _hypotheses(task, hypotheses), needs=NEEDS["graph_recovery"])
    # a pass a random start reaches too often is no evidence (few rows with parents: small T)
    return chance_guard(res, [i + 1 for i in nr], choices=Pbar.shape[0], what="rows with parents")


def _attention_logits(Pbar, T):
    """``log P̄`` on and below the diagonal (0 above): ``softmax(MASK(log P̄)) = P̄`` (rows positive)."""
    low = np.tri(T, dtype=bool)
    return np.where(low, np.log(np.maximum(Pbar, np.finfo(float).tiny)), 0.0)


def check_model_head_specialization(task, model, params, hypotheses="auto") -> CheckResult:
    """Each layer-1 head of any model attends to one parent slot, the heads split the ``k`` slots one-to-one
    (Knowl 9; k-parent tasks, DESIGN §15, §26).

    :func:`popgrad.checks.check_head_specialization` (the slot of every head's argmax row by row, the best of
    the ``k!`` assignments, the smallest lift on the assigned slot's parent; threshold
    :data:`ATTENTION_LIFT`) applied to the exact population-average layer-1 attention
    :func:`model_population_attention` -- the rule :func:`popgrad.checks.check_catformer_head_specialization`
    applies to the full model, so the two give the same verdict on a :class:`popgrad.CatFormer`.
    ``"not_applicable"`` on a single-parent task or when layer 1 has not ``k`` heads; ``"inconclusive"``
    when a Knowl 10 assumption the statement needs fails (``hypotheses="auto"`` measures them; ``None``
    skips), and a pass is inconclusive when a random start passes the same ``(head, row)`` pairs too often
    (:func:`popgrad.checks.chance.chance_guard`, best of the ``k!`` assignments: on the two-parent graph
    decided from ``T = 5``).
    """
    check_task_and_model(task, model)
    statement = ("each layer-1 head attends to one parent slot (exact population average), and the heads split "
                 "the k slots one-to-one")
    name = "head_specialization"
    if not isinstance(task, MultiParentTask):
        return not_applicable(name, statement, "single-parent task: see graph recovery")
    Pbar = model_population_attention(task, model, params)
    if Pbar.shape[0] != task.k:
        return not_applicable(name, statement, f"layer 1 has {Pbar.shape[0]} heads for k = {task.k} parents")
    res = check_head_specialization(task, _attention_logits(Pbar, task.T), hypotheses=hypotheses)
    res = res._replace(statement=statement, details={**res.details, "attention": "population average"})
    if not res.decided:
        return res
    rows = res.details["rows"]
    return chance_guard(res, [i + 1 for i in rows] * task.k,
                        choices=math.factorial(task.k) if task.k <= 6 else 1, what="(head, row) pairs")


def model_query_attention(model, params, seqs) -> np.ndarray:
    """``(n, H_2, T)``: the layer-2 attention of the query (last position) of every sequence, read from the
    model's optional member ``query_attention(params, seqs)`` (:mod:`popgrad.model.protocol`).

    ``H_2 = 0`` for a model without a second layer. Raises a one-line ``TypeError`` for a model without the
    member (its induction head cannot be read).
    """
    fn = model_attr(model, "query_attention", None)
    if fn is None:
        raise ArgumentTypeError(f"{model_name(model)} has no query_attention(params, seqs) (the layer-2 attention of "
                                "the query, (n, H, T)): add it to read its induction head (see popgrad.Model)")
    P = np.asarray(fn(params, seqs), dtype=np.float64)
    n = np.asarray(seqs).shape[0]
    if P.ndim != 3 or P.shape[0] != n or P.shape[2] != model.T:
        raise ValueError(f"{model_name(model)}.query_attention must return shape (n, H, T) = ({n}, H, {model.T}), "
                         f"got {P.shape}")
    return P


def _induction_slots(task):
    """``[(target position, parents of every position for that slot)]`` and the key positions ``j < T-1``
    whose every slot parent exists (the positions an induction head can select)."""
    T, graph = task.T, task.graph
    if isinstance(task, MultiParentTask):
        slots = [(int(graph.target_parents[s]), np.asarray(graph.slot_parents(s))) for s in range(task.k)]
    else:
        slots = [(T - 1, np.asarray(graph.parents))]
    keys = np.flatnonzero(np.all([par[: T - 1] >= 0 for _, par in slots], axis=0))
    return slots, keys


def model_matching_mass(task, model, params, chunk: int = _CHUNK):
    """``(m, u, m*)`` of :func:`check_model_induction_head`, exact over every sequence.

    ``m[g] = Σ_s p(s) Σ_{j matches} A_g(s)[j]`` for every layer-2 head ``g`` (``A = query_attention``),
    ``u = Σ_s p(s) #matches(s) / T`` (uniform attention) and ``m*`` Knowl 8's construction's mass (uniform
    over the matches and, single parent, the roots whose prefix is all the query token: the model limit of
    :func:`popgrad.engine.baselines.count_estimator_predict`; nothing when no position matches).
    """
    check_task_and_model(task, model)
    p = check_params(model, params)
    task.check_size()
    T = task.T
    slots, keys = _induction_slots(task)
    single = not isinstance(task, MultiParentTask)
    roots = [j for j in range(T - 1) if j not in set(keys.tolist())]
    mass, base, top = None, 0.0, 0.0
    for start in range(0, task.n_sequences, int(chunk)):
        seqs, w = exact_rows(task, start, min(task.n_sequences, start + int(chunk)))
        ps = w.sum(axis=1)
        A = model_query_attention(model, p, seqs)
        match = np.ones((len(seqs), keys.size), dtype=bool)
        for tp, par in slots:
            match &= seqs[:, par[keys]] == seqs[:, [tp]]
        part = np.array([float(ps @ np.sum(A[:, g, keys] * match, axis=1)) for g in range(A.shape[1])])
        mass = part if mass is None else mass + part
        n = match.sum(axis=1)
        base += float(ps @ (n / T))
        same = np.cumprod(seqs[:, : T - 1] == seqs[:, [T - 1]], axis=1)
        extra = same[:, roots].sum(axis=1) if (single and roots) else 0
        top += float(ps @ np.where(n > 0, n / np.maximum(n + extra, 1), 0.0))
    return mass, base, top


def check_model_induction_head(task, model, params, hypotheses="auto") -> CheckResult:
    """Layer 2 of any model is an induction head: the query attends to the positions whose copied parent token
    matches, and layer 1 copies the parents (DESIGN §15, §26).

    The rule of :func:`popgrad.checks.check_induction_head` for any :class:`popgrad.Model` with the optional
    member ``query_attention`` (the layer-2 attention of the query, ``(n, H_2, T)``): for every layer-2 head
    ``g`` the exact mass ``m_g`` the query puts on the key positions ``j < T-1`` whose slot-``σ`` parent token
    equals the query's (single parent: the query token; k parents: the target's slot-``σ`` parent token), its
    lift ``(m_g − u)/(m* − u)`` over uniform attention ``u`` towards Knowl 8's construction ``m*``
    (:func:`model_matching_mass`), and the copy lift: for every slot the best layer-1 head's smallest lift of
    the population attention to that parent over the key rows (:func:`model_population_attention`). Value:
    the smaller of the best matching-mass lift and the copy lift; threshold :data:`ATTENTION_LIFT`.
    ``"not_applicable"`` for a model without ``query_attention``, a graph without a key position or one where
    no position can match; ``"inconclusive"`` when a Knowl 10 assumption fails (those of graph recovery on a
    single-parent task, of head specialization on a k-parent one; ``hypotheses="auto"`` measures them,
    ``None`` skips) and when a random start's layer 1 passes the copy rows too often (chance guard, best
    of the layer-1 heads: a chain is decided from ``T = 8``, the two-parent graph with two heads too).
    On a :class:`popgrad.CatFormer` inside the hypotheses: the value and verdict of
    :func:`popgrad.checks.check_induction_head` (which does not read the hypotheses).
    """
    check_task_and_model(task, model)
    statement = ("layer 2 is an induction head: the query's attention mass on the positions whose copied parent "
                 "token(s) match its own is at least halfway from uniform attention to the construction's, and layer 1 "
                 "copies the parents")
    name = "induction_head"
    if model_attr(model, "query_attention", None) is None:
        return not_applicable(name, statement, f"{model_name(model)} exposes no layer-2 query attention "
                                               "(the optional member query_attention of popgrad.Model)")
    slots, keys = _induction_slots(task)
    if keys.size == 0:
        return not_applicable(name, statement, "the graph has no non-root position")
    p = check_params(model, params)
    if model_query_attention(model, p, np.zeros((1, task.T), dtype=np.int64)).shape[1] == 0:
        return not_applicable(name, statement, f"{model_name(model)} has no layer-2 attention (one layer)")
    mass, uniform, top = model_matching_mass(task, model, p)
    if not top - uniform > 0:
        return not_applicable(name, statement,
                              "no position can match the query (or every one always does): nothing to select")
    lifts = attention_lift(mass, uniform, top)
    g = int(np.argmax(lifts))
    Pbar = model_population_attention(task, model, params)
    u_rows = 1.0 / (keys + 1.0)
    per_slot = [[float(attention_lift(Pbar[h, keys, par[keys]], u_rows).min()) for h in range(Pbar.shape[0])]
                for _, par in slots]
    copy_lift = min(max(v) for v in per_slot)
    value = float(min(lifts[g], copy_lift))
    details = {
        "layer2_head": g,
        "query_attention_on_matching_parent_tokens": float(mass[g]),
        "query_attention_on_matching_per_layer2_head": [float(v) for v in mass],
        "same_under_uniform_attention": float(uniform),
        "same_for_the_construction": float(top),
        "lift_per_layer2_head": [float(v) for v in lifts],
        "matching_mass_lift": float(lifts[g]),
        "layer1_copy_lift": copy_lift,
        "layer1_copy_lift_per_slot_and_head": per_slot,
        "key_positions": [int(j) for j in keys],
        "rule": (f"passes when min((m - u) / (m* - u), layer-1 copy lift) >= {ATTENTION_LIFT:g}: m the query's "
                 "layer-2 mass on matching positions, u its value at uniform attention, m* the construction's; the "
                 "copy lift: the smallest lift over rows of the layer-1 attention to each parent slot (best head)"),
    }
    res = CheckResult(name, value, ATTENTION_LIFT, value >= ATTENTION_LIFT, ">=", statement, details)
    needs = NEEDS["head_specialization"] if isinstance(task, MultiParentTask) else NEEDS["graph_recovery"]
    res = within_hypotheses(res, _hypotheses(task, hypotheses), needs=needs)
    # the copy lift alone asks every key row of the best layer-1 head to reach the lift: its chance bounds the pass
    return chance_guard(res, keys + 1, choices=Pbar.shape[0], what="key rows layer 1 must copy")
