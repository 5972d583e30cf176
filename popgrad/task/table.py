"""A task's weight table: every sequence's exact weights ``w(s_m, c)`` in enumeration order (DESIGN §20).

:class:`WeightTable` is the part of :class:`popgrad.task.tasks.ExactTask` that computes, keeps and reads
the table: computed once and kept when it fits :data:`TABLE_BUDGET_BYTES`, recomputed in chunks of
:data:`TABLE_CHUNK` sequences past it. For a continuous prior (:class:`popgrad.DirichletPrior`) the
weights come from the sufficient statistics and :attr:`WeightTable.weight_accuracy` says how exact they
are; for a finite prior they are the per-atom sums of DESIGN §2.
"""
from __future__ import annotations

import numpy as np

from .dirichlet import WeightAccuracy
from .reference import decode_sequences

__all__ = ["WeightTable", "TABLE_BUDGET_BYTES", "TABLE_CHUNK"]

#: Largest weight table (with its sequences) a task keeps in memory; past it the table is recomputed in
#: chunks of ``TABLE_CHUNK`` sequences whenever it is read.
TABLE_BUDGET_BYTES = 512 * 2**20
#: Sequences per chunk when a table is computed (or streamed past the budget).
TABLE_CHUNK = 2**16


class WeightTable:
    """The weight-table methods of an exact task (a base class of :class:`popgrad.task.tasks.ExactTask`).

    The task provides ``S``, ``T``, ``n_sequences``, ``continuous``, ``enumerable``, ``check_size``,
    ``kernel_arrays``, ``_fill_chunk`` (finite priors), ``_continuous_rows`` (continuous priors) and the
    slots ``_prior``, ``_table``, ``_accuracy``.
    """

    __slots__ = ()

    def _table_rows(self, start, stop):
        """``(w (n, S), WeightAccuracy)`` for sequences ``start … stop-1``, computed (never cached)."""
        S, T = self.S, self.T
        if self.continuous:
            return self._continuous_rows(decode_sequences(start, stop, S, T))
        seqs = np.empty((stop - start, T), dtype=np.int64)
        w = np.empty((stop - start, S), dtype=np.float64)
        self._fill_chunk(start, self.kernel_arrays(), seqs, w)
        return w, WeightAccuracy(True, 0.0, "sum over the finite prior's atoms")

    def _continuous_rows(self, seqs):
        raise NotImplementedError

    @property
    def table_cached(self) -> bool:
        """Whether :meth:`weight_table` fits in :data:`TABLE_BUDGET_BYTES` (then it is computed once and kept)."""
        return self.n_sequences * (self.S + self.T) * 8 <= TABLE_BUDGET_BYTES

    def weight_table(self) -> np.ndarray:
        """``w[m, c] = w(s_m, c)`` for every sequence in enumeration order, ``(S**T, S)`` float64, read-only.

        Computed once per task and kept (when it fits in :data:`TABLE_BUDGET_BYTES`; otherwise
        ``ValueError``: read it in chunks with :meth:`weight_rows`). For a continuous prior the weights come
        from the sufficient statistics (DESIGN §20; :attr:`weight_accuracy` says how exact they are); for a
        finite prior they are the per-atom sums of DESIGN §2.
        """
        self.check_size()
        if self._table is None:
            if not self.table_cached:
                raise ValueError(
                    f"the weight table of S**T = {self.n_sequences:,} sequences needs more than "
                    f"{TABLE_BUDGET_BYTES / 2**20:.0f} MB: read it in chunks with task.weight_rows(start, stop)")
            n = self.n_sequences
            w = np.empty((n, self.S))
            acc = []
            chunk = 2**20 if self.continuous else TABLE_CHUNK  # continuous: fewer repeated statistics
            for start in range(0, n, chunk):
                stop = min(n, start + chunk)
                w[start:stop], a = self._table_rows(start, stop)
                acc.append(a)
            w.setflags(write=False)
            self._accuracy = _merge_accuracy(acc)
            self._table = w
        return self._table

    def weight_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start … stop-1`` of :meth:`weight_table` (from the kept table, or computed past the budget)."""
        if self.table_cached:
            return self.weight_table()[start:stop]
        w, a = self._table_rows(start, stop)
        self._accuracy = a if self._accuracy is None else _merge_accuracy([self._accuracy, a])
        return w

    @property
    def weight_accuracy(self) -> WeightAccuracy:
        """How exact the weights are (:class:`popgrad.task.dirichlet.WeightAccuracy`): exact to rounding for a
        finite prior and for uniform roots; a quadrature bound for stationary roots (computes the table)."""
        if self._accuracy is None:
            if not self.continuous:
                return WeightAccuracy(True, 0.0, "sum over the finite prior's atoms")
            if self._prior.roots == "uniform":
                return WeightAccuracy(True, 0.0, "Dirichlet-multinomial closed form")
            if self.table_cached:
                self.weight_table()
            else:
                for start in range(0, self.n_sequences, TABLE_CHUNK):
                    self.weight_rows(start, min(self.n_sequences, start + TABLE_CHUNK))
        return self._accuracy

    def _weights_summary(self) -> str:
        if not self.continuous:
            return ""
        if not self.enumerable:
            return "\n  weights: not computed (S**T beyond the enumeration limit)"
        return "\n  " + self.weight_accuracy.summary()


def _merge_accuracy(parts) -> WeightAccuracy:
    """One :class:`WeightAccuracy` for a table computed in chunks (the worst bound)."""
    return WeightAccuracy(all(a.exact for a in parts), max((a.bound for a in parts), default=0.0),
                          parts[0].method if parts else "", any(a.statistical for a in parts))
