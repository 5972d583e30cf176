"""Checks of a trained full model (:class:`popgrad.CatFormer`): graph recovery, head specialization, induction head.

All exact for the task's finite prior (enumeration of every sequence):

* :func:`population_attention` -- ``P̄^h = E_s[softmax(MASK(x̃ Ã^(1)_h x̃ᵀ))]``, the
  population-average layer-1 attention of each head (what the official
  ``many_graphs`` notebook samples when it averages attention over a batch);
* :func:`positional_attention` -- ``softmax(MASK(Ã^(1)_h[S:, S:]))``, the attention
  of the positional block alone (the quantity the official ``many_graphs``
  notebook reports as "attention to the parent": it reads
  ``model.A[0][0][vocab_size:, vocab_size:]``);
* :func:`check_catformer_graph_recovery`, :func:`check_catformer_head_specialization`,
  :func:`check_induction_head` -- :class:`CheckResult` with a statement.

Layer-1 blocks of ``Ã^(1)`` (``d_0 = S + T``, token one-hot first):
``[:S, :S]`` token-token, ``[:S, S:]`` token-position, ``[S:, :S]``
position-token, ``[S:, S:]`` position-position (the reduced model's ``A1``;
:func:`popgrad.engine.catformer_attention.score_blocks`).
Layer-2 features of a position: ``h^(1) = [x̃, out_1, …, out_m]`` with head
``h``'s output in columns ``d_0(1+h) : d_0(2+h)``, its token part the first
``S`` of them (the parent token head ``h`` copied).
"""
from __future__ import annotations

import numpy as np

from .._validation import ArgumentTypeError
from ..engine.catformer_attention import catformer_attention
from ..model.catformer import CatFormer, catformer_forward, check_task_model
from ..task.tasks import MultiParentTask
from .results import CheckResult, not_applicable
from .recovery import check_head_specialization

__all__ = ["population_attention", "positional_attention", "attention_to_parent_per_position",
           "check_catformer_graph_recovery", "check_catformer_head_specialization", "check_induction_head",
           "slot_attention", "soft_split", "heads_difference"]

_CHUNK = 2**14


_check = check_task_model


def population_attention(task, model, params) -> np.ndarray:
    """Exact population-average layer-1 attention of each head (:func:`popgrad.catformer_attention`'s ``mean``).

    ``P̄^h[i, j] = Σ_s p(s) softmax_j(MASK(x̃(s) Ã^(1)_h x̃(s)ᵀ))[i, j]`` over every sequence
    (``p(s) = Σ_c w(s, c)``, the task's exact weights).

    Returns
    -------
    ndarray of float64, shape (m_1, T, T)
        Row-stochastic, lower triangular.
    """
    params = _check(task, model, params)
    return catformer_attention(task, model, params, chunk=_CHUNK).mean


def positional_attention(model, params) -> np.ndarray:
    """``softmax_rows(MASK(Ã^(1)_h[S:, S:]))`` per head, shape ``(m_1, T, T)`` (the official metric's matrix)."""
    if not isinstance(model, CatFormer):
        raise ArgumentTypeError(f"model must be a popgrad.CatFormer, got {type(model).__name__}")
    params = model.check_params(params)
    S, T = model.S, model.T
    low = np.tri(T, dtype=bool)
    z = np.where(low, params.A[0][:, S:, S:], -np.inf)
    z = np.exp(z - z.max(axis=2, keepdims=True))
    return z / z.sum(axis=2, keepdims=True)


def attention_to_parent_per_position(graph, P) -> np.ndarray:
    """``P[h, i, p(i)]`` for every head and non-root position ``i`` (NaN for roots), shape ``(m, T)``.

    For a single-parent graph ``p(i)`` is the parent; for a k-parent graph the value is the
    largest attention any single parent of ``i`` receives.
    """
    P = np.asarray(P, dtype=np.float64)
    m, T = P.shape[0], P.shape[1]
    out = np.full((m, T), np.nan)
    par = np.asarray(graph.parents)
    nr = graph.non_roots
    if par.ndim == 1:
        out[:, nr] = P[:, nr, par[nr]]
    else:
        for i in nr:
            out[:, i] = P[:, i, par[i]].max(axis=1)
    return out


def check_catformer_graph_recovery(task, model, params) -> CheckResult:
    """Layer 1 of the full model attends to each position's parent (single-parent tasks).

    Value: the fraction of non-root positions ``i < T-1`` whose population-average attention
    row ``P̄^h[i, :]`` (of the head attending most to parents) has its argmax at ``p(i)``;
    threshold 1. Details: per position ``P̄[i, p(i)]`` and its mean over non-roots (the
    official ``many_graphs`` "average attention" summary), and the same two for the official
    metric's matrix :func:`positional_attention`.
    """
    params = _check(task, model, params)
    statement = "layer 1 of the full model attends to each position's parent (argmax of the population attention)"
    if isinstance(task, MultiParentTask):
        return not_applicable("catformer_graph_recovery", statement, "k-parent task: see head_specialization")
    graph = task.graph
    nr = [int(i) for i in graph.non_roots if i < task.T - 1]
    if not nr:
        return not_applicable("catformer_graph_recovery", statement, "the graph has no non-root position")
    Pbar = population_attention(task, model, params)
    Ppos = positional_attention(model, params)
    to_par = attention_to_parent_per_position(graph, Pbar)
    to_par_pos = attention_to_parent_per_position(graph, Ppos)
    h = int(np.argmax(np.nanmean(to_par[:, nr], axis=1)))
    par = graph.parents
    hits = [i for i in nr if int(np.argmax(Pbar[h, i, : i + 1])) == par[i]]
    details = {
        "head": h,
        "attention_to_parent": {i: float(to_par[h, i]) for i in nr},
        "mean_attention_to_parent": float(np.mean(to_par[h, nr])),
        "positional_block_attention_to_parent": {i: float(to_par_pos[h, i]) for i in nr},
        "positional_block_mean_attention_to_parent": float(np.mean(to_par_pos[h, nr])),
        "rows_with_argmax_not_parent": [i for i in nr if i not in hits],
    }
    value = len(hits) / len(nr)
    return CheckResult("catformer_graph_recovery", float(value), 1.0, value >= 1.0, ">=", statement, details)


def check_catformer_head_specialization(task, model, params) -> CheckResult:
    """Each layer-1 head of the full model attends to one parent slot, the heads split the slots one-to-one.

    :func:`popgrad.checks.check_head_specialization` applied to the population-average
    attention :func:`population_attention` (``m_1`` must equal ``k``).
    """
    params = _check(task, model, params)
    statement = ("each layer-1 head of the full model attends to one parent slot (population attention), "
                 "and the heads split the k slots one-to-one")
    if not isinstance(task, MultiParentTask):
        return not_applicable("head_specialization", statement, "single-parent task")
    if model.heads[0] != task.k:
        return not_applicable("head_specialization", statement,
                              f"layer 1 has {model.heads[0]} heads for k = {task.k} parents")
    Pbar = population_attention(task, model, params)
    low = np.tri(task.T, dtype=bool)
    logits = np.where(low, np.log(np.maximum(Pbar, np.finfo(float).tiny)), 0.0)  # softmax(MASK(log P̄)) = P̄
    res = check_head_specialization(task, logits)
    return res._replace(statement=statement, details={**res.details, "attention": "population average"})


def _margin(B) -> float:
    """``min_a (B[a, a] − max_{b≠a} B[a, b])``: how much each query token prefers its own token."""
    S = B.shape[0]
    off = np.where(np.eye(S, dtype=bool), -np.inf, B)
    return float(np.min(np.diag(B) - off.max(axis=1)))


def check_induction_head(task, model, params) -> CheckResult:
    """Layer 2 formed an induction head: it matches the query's parent token against the parent token layer 1 copied.

    For each parent slot ``σ`` of the target (single parent: the query itself) with the
    layer-1 head ``h`` that attends most to that slot's parents, the token-token block of
    each layer-2 head ``g``, rows = the query's copy of the target's slot-``σ`` parent token
    (the raw token ``0:S`` when that parent is the query, and head ``h``'s output token part
    ``d_0(1+h) : d_0(1+h)+S``), columns = head ``h``'s output token part of the key::

        B = Ã^(2)_g[rows, d_0(1+h) : d_0(1+h)+S]       margin(B) = min_a (B[a,a] − max_{b≠a} B[a,b])

    An induction head scores the key whose copied parent token equals the query's token
    highest: ``margin > 0``. Value: the smallest over slots of the best (over ``g`` and the row
    choices) margin divided by ``max |Ã^(2)|``; threshold 0, passes when ``> 0``. Details:
    every block and margin, and for single-parent tasks the exact mass the query's layer-2
    attention puts on positions ``j`` with ``s_{p(j)} = s_{T-1}`` against uniform attention.
    """
    params = _check(task, model, params)
    statement = ("layer 2 is an induction head: in its token-token block (query's parent token x the parent token "
                 "layer 1 copied into the key) every query token scores its own token highest")
    if model.n_layers < 2:
        return not_applicable("induction_head", statement, "the model has one layer")
    S, T, d0 = model.S, model.T, model.dims[0]
    A2 = params.A[1]
    scale = float(np.max(np.abs(A2)))
    Pbar = population_attention(task, model, params)
    graph = task.graph
    if isinstance(task, MultiParentTask):
        slots = [(s, int(graph.target_parents[s]), graph.slot_parents(s)) for s in range(task.k)]
    else:
        slots = [(0, T - 1, np.asarray(graph.parents))]
    per_slot = {}
    for s, target_parent, par in slots:
        rows_nr = [int(i) for i in np.flatnonzero(par[: T - 1] >= 0)]
        if not rows_nr:
            return not_applicable("induction_head", statement, "the graph has no non-root position")
        score = [np.mean(Pbar[h, rows_nr, par[rows_nr]]) for h in range(model.heads[0])]
        h = int(np.argmax(score))
        cols = slice(d0 * (1 + h), d0 * (1 + h) + S)
        row_choices = {f"head {h} output": slice(d0 * (1 + h), d0 * (1 + h) + S)}
        if target_parent == T - 1:
            row_choices = {"query token": slice(0, S), **row_choices}
        blocks = {(g, name): A2[g, r, cols] for g in range(A2.shape[0]) for name, r in row_choices.items()}
        margins = {key: _margin(B) for key, B in blocks.items()}
        best = max(margins, key=margins.get)
        per_slot[s] = {"layer1_head": h, "best_layer2_head": int(best[0]), "best_rows": best[1],
                       "margin": margins[best], "block": blocks[best].tolist(),
                       "margins": {f"layer-2 head {g}, rows {name}": v for (g, name), v in margins.items()}}
    worst = min(v["margin"] for v in per_slot.values())
    value = worst / scale if scale > 0 else 0.0
    details = {"slots": per_slot, "max_abs_A2": scale}
    if not isinstance(task, MultiParentTask):
        details.update(_matching_mass(task, model, params))
    return CheckResult("induction_head", float(value), 0.0, value > 0, ">", statement, details)


def _matching_mass(task, model, params) -> dict:
    """``E_s[Σ_j P^(2)[T-1, j] 1{j non-root, s_{p(j)} = s_{T-1}}]`` (layer-2 head 0) and its value under
    uniform attention ``E_s[#{j: s_{p(j)} = s_{T-1}} / T]``."""
    T = task.T
    par = np.asarray(task.graph.parents)
    nr = np.flatnonzero(par >= 0)
    mass = base = 0.0
    for seqs, w in task.enumerate(chunk_size=_CHUNK):
        p = w.sum(axis=1)
        probs = catformer_forward(model, params, seqs)[3]
        last = probs[1][:, 0, T - 1, :]  # (n, T)
        match = np.zeros(last.shape)
        match[:, nr] = seqs[:, par[nr]] == seqs[:, [T - 1]]
        mass += float(p @ np.sum(last * match, axis=1))
        base += float(p @ (match.sum(axis=1) / T))
    return {"query_attention_on_matching_parent_tokens": mass, "same_under_uniform_attention": base}


def slot_attention(graph, P) -> np.ndarray:
    """``M[h, σ]``: head ``h``'s mean attention on slot ``σ``'s parent over the rows that have parents.

    Rows: non-roots ``i < T-1`` and the last row (whose slot parents are the target's),
    :meth:`popgrad.MultiParentGraph.slot_parents`. ``P`` is ``(m, T, T)`` attention (e.g.
    :func:`population_attention`, or ``head_attention(A1)`` of the reduced model).

    Returns
    -------
    ndarray of float64, shape (m, k)
    """
    P = np.asarray(P, dtype=np.float64)
    k = graph.k
    slots = np.stack([graph.slot_parents(s) for s in range(k)])
    rows = np.flatnonzero(slots[0] >= 0)
    return np.stack([[float(np.mean(P[h, rows, slots[s, rows]])) for s in range(k)] for h in range(P.shape[0])])


def soft_split(M) -> bool:
    """Whether the heads prefer distinct slots: ``argmax_σ M[h, σ]`` is a permutation (strict preferences)."""
    M = np.asarray(M, dtype=np.float64)
    best = M.argmax(axis=1)
    strict = all(np.sum(M[h] == M[h, best[h]]) == 1 for h in range(M.shape[0]))
    return bool(strict and len(set(best.tolist())) == M.shape[0] == M.shape[1])


def heads_difference(A) -> np.ndarray:
    """``‖Ã_0 − Ã_1‖_F`` of a layer's first two heads for a stack of records ``(n, m, d, d)``; shape ``(n,)``."""
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 4 or A.shape[1] < 2:
        raise ValueError(f"A must be a record stack (n, m >= 2, d, d), got shape {A.shape}")
    return np.sqrt(np.sum((A[:, 0] - A[:, 1]) ** 2, axis=(1, 2)))
