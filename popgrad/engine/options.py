"""The engine's tunables in one object, passed explicitly (no module globals to overwrite).

:class:`EngineOptions` holds every knob of the exact engines: block sizes,
batch sizes, table limits, the thread-pool threshold, the weight-cache
budget. None of them changes a result beyond rounding (the block structure
fixes the summation order, so for given options the bits are fixed; tests
vary them). Pass ``options=EngineOptions(...)`` to
:func:`popgrad.exact_loss_and_grad` and friends; the default is
:data:`DEFAULT_OPTIONS`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .._validation import as_int, as_real
from ._kernels.specialize import MODES as SPECIALIZE_MODES

__all__ = ["EngineOptions", "DEFAULT_OPTIONS", "ENGINES"]

#: Public engine names: ``"auto"`` picks ``"prefix"`` unless a row range of ``A2`` exceeds ``a2_range_limit``.
ENGINES = ("auto", "prefix", "direct")


@dataclass(frozen=True)
class EngineOptions:
    """Tunables of the exact engines (positive integers except ``a2_range_limit`` and ``catformer_specialize*``).

    Attributes
    ----------
    prefix_block_sequences : int
        Smallest number of sequences per block of the prefix engine (whole subtrees).
    prefix_batch_groups : int
        Leaf groups ``S**h`` per batch node the prefix engine aims at.
    prefix_table_max : int
        Largest factor table ``S**(ctx + h) * K`` of the batched leaves.
    parallel_min_sequences : int
        Tasks that visit fewer sequences run their blocks on the calling thread
        (waking the pool costs more than it saves). Same blocks, same bits.
    weight_cache_bytes : int
        Largest leaf-weight cache of one task (the weights depend on the task only).
    weight_cache_total : int
        Budget of all cached leaf weights (least recently used dropped first).
    direct_block_sequences : int
        Sequences per block of the direct engine and of the rows kernel.
    max_blocks : int
        Largest number of blocks (one ``T×T`` slot each) of the direct, prefix and k-head engines.
    sym_min_blocks : int
        Smallest number of canonical prefixes (blocks) with the orbit reduction on a parallel run.
    numpy_chunk : int
        Sequences per chunk of the NumPy references and the reference losses.
    multi_block_sequences : int
        Smallest number of sequences per block of the k-head engine.
    a2_range_limit : float
        ``"auto"`` uses the prefix engine when ``max_q (max_b A2[q,b] - min_b A2[q,b])``
        is at most this (its exponential tables must stay far from underflow).
    catformer_rows_per_block : int
        Rows per block of the full model's rows kernel (sampled batches, weight tables).
    catformer_specialize : {"auto", "on", "off"}
        The full model's exact walks compiled for the model's layout, its sizes as constants
        (:mod:`popgrad.engine._kernels.specialize`; the same bits, 1.4–1.5× faster at ``S = 3, T = 10``, one
        compile of 20–35 s per walk and layout, cached on disk): ``"on"`` always, ``"off"`` never, ``"auto"``
        once this process's calls on the layout have spent ``catformer_specialize_seconds`` in the general
        walks (a training run pays at most about as much again as it has already spent; a one-off gradient
        never compiles).
    catformer_specialize_seconds : float
        See ``catformer_specialize`` (``≥ 0``; wall seconds).
    noise_block_sequences : int
        Smallest number of sequences per block of the gradient-noise engine.
    noise_max_blocks : int
        Largest number of blocks of the gradient-noise engine (one ``D×D`` slot each).
    field_parallel_min_work : int
        Smallest work estimate (inner steps) for which a Stage-1 field kernel uses the thread
        pool; below it the ``_serial`` twin runs (same iterations, same bits).
    """

    prefix_block_sequences: int = 4096
    prefix_batch_groups: int = 64
    prefix_table_max: int = 2**18
    parallel_min_sequences: int = 2**15
    weight_cache_bytes: int = 2**26
    weight_cache_total: int = 2**27
    direct_block_sequences: int = 4096
    max_blocks: int = 1024
    sym_min_blocks: int = 32
    numpy_chunk: int = 2**14
    multi_block_sequences: int = 4096
    a2_range_limit: float = 500.0
    field_parallel_min_work: int = 4_000_000
    catformer_rows_per_block: int = 256
    catformer_specialize: str = "auto"
    catformer_specialize_seconds: float = 30.0
    noise_block_sequences: int = 2048
    noise_max_blocks: int = 64

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "catformer_specialize":
                if not isinstance(v, str) or v not in SPECIALIZE_MODES:
                    raise ValueError(f"EngineOptions.catformer_specialize must be 'auto', 'on' or 'off', got {v!r}")
            elif f.name == "catformer_specialize_seconds":
                as_real(v, "EngineOptions.catformer_specialize_seconds", minimum=0)
            elif f.name == "a2_range_limit":
                if as_real(v, "EngineOptions.a2_range_limit") <= 0:
                    raise ValueError(f"EngineOptions.a2_range_limit must be a number > 0, got {v!r}")
            else:
                as_int(v, f"EngineOptions.{f.name}", minimum=0 if f.name.startswith(("weight_cache", "field_")) else 1)

    def plan_key(self) -> tuple:
        """The fields a plan depends on (part of the plan-cache key)."""
        return (self.prefix_block_sequences, self.prefix_batch_groups, self.prefix_table_max, self.sym_min_blocks,
                self.max_blocks, self.parallel_min_sequences, self.weight_cache_bytes)


#: The defaults every public function uses when ``options`` is not given.
DEFAULT_OPTIONS = EngineOptions()
