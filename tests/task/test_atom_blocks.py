"""The weight kernels read the atoms in cache-sized blocks (``popgrad.task._weights.atom_block``): every row still
sums its atoms in increasing order, so the table is bit for bit the atom-by-atom sum, for any block size."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.task import _weights
from popgrad.task.reference import sequence_weights_numpy


@pytest.mark.parametrize("S, T, draws", [(5, 4, 2), (3, 6, 60), (2, 7, 3)])
def test_blocked_weights_are_the_atom_by_atom_sums(S, T, draws):
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=draws, seed=1, floor=0.1))
    arr = task.kernel_arrays()
    K = arr[2].shape[0]
    n = S**T
    seqs = np.empty((n, T), dtype=np.int64)
    w = np.empty((n, S))
    _weights.chunk_weights(0, *arr, seqs, w)
    ref = np.empty((n, S))
    for m in range(n):
        _weights.sequence_weight_row(seqs[m], *arr, ref[m])
    np.testing.assert_array_equal(w, ref)
    for kernel in (_weights.rows_weights, _weights.rows_weights_serial):
        got = np.full((n, S), np.nan)
        kernel(seqs, *arr, got)
        np.testing.assert_array_equal(got, ref)
    np.testing.assert_allclose(w, sequence_weights_numpy(seqs, *arr), rtol=1e-12, atol=1e-300)
    if S == 5:
        assert _weights.atom_block(K, S) < K  # more than one block: the case the blocks change
    assert 1 <= _weights.atom_block(K, S) <= K and _weights.atom_block(1, S) == 1
