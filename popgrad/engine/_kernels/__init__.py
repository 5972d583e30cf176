"""Numba kernels of the exact engine (numba only; the NumPy references live in :mod:`popgrad.engine.reference`).

* :mod:`.numeric` -- ``fast_log`` and the bit-pattern intrinsics;
* :mod:`.prefix` -- the prefix engine (the default single-parent engine);
* :mod:`.single` -- the direct engine's block, the rows kernels and the per-call helpers;
* :mod:`.multi` -- the k-head engine's block;
* :mod:`.ranges` -- the entries that run a range of the direct or k-head engine's blocks (``run_blocks``);
* :mod:`.field` -- the Stage-1 field (enumeration and count generating functions);
* :mod:`.catformer` -- the full model's per-row pieces (DESIGN §18);
* :mod:`.catformer_leaves` -- the leaves of one parent, grouped (§18);
* :mod:`.catformer_walk` -- the full model's two walks: the enumeration trie (and its canonical walk, §21) and
  explicit rows;
* :mod:`.catformer_rows` -- the full model's sampled-batch kernel (§23);
* :mod:`.cache` -- whether numba's on-disk cache already holds these kernels, and its freshness across modules.
"""
