"""The full model's trie kernel: a parent's leaves as one group (last layer as products) and the canonical walk
(orbit reduction in the trie), against the NumPy reference, finite differences and across block layouts
(popgrad/engine/_kernels/catformer_walk.py ``_leaf_group``, ``_block``; DESIGN §18, §21)."""
import numpy as np
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import catformer as E
from popgrad.engine import catformer_symmetry as Y
from popgrad.engine.symmetry import orbit_sizes
from popgrad.model.catformer import CatFormerParams
from tests.engine.test_catformer import HEADS, random_params
from tests.engine.test_catformer_symmetry import closed_task, equivariant_params
from tests.strategies import multi_tasks, tasks

#: prefix_block_sequences: 1 (every token fixed: a block is one leaf), 2 and 3 (the parent fixed: a block is
#: one parent's leaves, or a deeper walk), 10**6 (one block, the whole walk)
BLOCKS = [1, 2, 3, 10**6]


def assert_close(r, ref, tol=1e-12):
    """Loss to ``tol`` relative; every gradient entry to ``tol`` times the largest entry of the whole gradient
    (a layer whose gradient nearly cancels, e.g. 1e-5 against 0.1 elsewhere, keeps the absolute rounding of
    the sum: 1e-16 there is 1e-11 of its own largest entry, in the reference's own rounding too)."""
    assert abs(r.loss - ref.loss) <= tol * max(abs(ref.loss), 1.0)
    scale = max(float(np.max(np.abs(b))) for b in ref.dA + [ref.dW])
    for a, b in zip(r.dA + [r.dW], ref.dA + [ref.dW]):
        assert a.shape == b.shape
        assert float(np.max(np.abs(a - b))) <= tol * max(scale, 1e-300)


@given(data=st.data(), heads=st.sampled_from(HEADS), bs=st.sampled_from(BLOCKS), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([0.1, 1.0, 3.0]), readout=st.sampled_from(["softmax", "linear"]))
@settings(max_examples=25, deadline=None)
def test_grouped_leaves_equal_reference_and_differences(data, heads, bs, seed, scale, readout):
    """Any block layout: the kernel = NumPy reference to 1e-12; a directional central difference."""
    multi = data.draw(st.booleans())
    task = data.draw(multi_tasks(max_S=3, max_T=5, max_k=2, max_sequences=250) if multi
                     else tasks(max_S=4, max_T=6, max_sequences=250))
    model = pg.CatFormer(task.S, task.T, heads=heads, readout=readout)
    params = random_params(model, seed, scale, scale)
    opts = pg.EngineOptions(prefix_block_sequences=bs)
    r = pg.catformer_loss_and_grad(task, model, params, options=opts, symmetry="off")
    assert_close(r, E.catformer_loss_and_grad_numpy(task, model, params))
    rng = np.random.default_rng(seed % 1000)
    V = [rng.standard_normal(a.shape) for a in params.A]
    VW = rng.standard_normal(params.W.shape)
    if readout == "linear":
        VW = np.abs(VW)
    h = 1e-5

    def at(s):
        return pg.catformer_loss(task, model, CatFormerParams([a + s * v for a, v in zip(params.A, V)],
                                                              params.W + s * VW), options=opts, symmetry="off")

    fd = (at(h) - at(-h)) / (2 * h)
    exact = sum(float(np.sum(d * v)) for d, v in zip(r.dA, V)) + float(np.sum(r.dW * VW))
    assert abs(fd - exact) <= 1e-6 * max(1.0, abs(exact))


@given(S=st.integers(2, 4), T=st.integers(2, 5), heads=st.sampled_from([(1, 1), (2, 1), (1,), (1, 1, 1)]),
       bs=st.sampled_from(BLOCKS), seed=st.integers(0, 2**31), scale=st.sampled_from([0.0, 0.3, 2.0]))
@settings(max_examples=25, deadline=None)
def test_canonical_walk_equals_reference(S, T, heads, bs, seed, scale):
    """The orbit-reduced trie walk (every block layout, including non-canonical fixed prefixes) = the NumPy
    reference over every sequence, to 1e-12; the gradient has the same bits on every coordinate orbit."""
    if S**T > 1100:
        T = 4
    task = closed_task(S, T, seed % 5)
    model = pg.CatFormer(S, T, heads=heads)
    p = equivariant_params(model, seed, scale)
    opts = pg.EngineOptions(prefix_block_sequences=bs)
    red = pg.catformer_loss_and_grad(task, model, p, options=opts, symmetry="on")
    assert_close(red, E.catformer_loss_and_grad_numpy(task, model, p))
    assert Y.equivariance_defect(model, CatFormerParams(red.dA, red.dW)) == 0.0
    assert pg.catformer_loss(task, model, p, options=opts, symmetry="on") == red.loss


def test_canonical_walk_visits_one_sequence_per_orbit():
    """Loss of the canonical walk with the orbit factors set to 1 = the NumPy loss over the canonical
    sequences only (what the walk visits, and nothing else)."""
    S, T = 3, 5
    task = closed_task(S, T, 1)
    model = pg.CatFormer(S, T, heads=(1, 1))
    p = equivariant_params(model, 4, 0.5)
    seqs, w = task.all_sequences()
    first = np.array([all(s[t] <= max(s[:t], default=-1) + 1 for t in range(T)) for s in seqs])
    expect = E.catformer_rows_loss_and_grad_numpy(seqs[first], w[first], model, p).loss
    for bs in BLOCKS:
        job = E.blocks(task, model, p, 0.0, False, pg.EngineOptions(prefix_block_sequences=bs))
        job = job._replace(canon=True, orbit=np.ones(S + 1))
        got = E.finish_blocks(job, E.run_blocks(task, job)).loss
        assert abs(got - expect) <= 1e-13 * abs(expect), bs
    job = job._replace(orbit=orbit_sizes(S))
    full = E.catformer_loss_and_grad_numpy(task, model, p).loss
    assert abs(E.finish_blocks(job, E.run_blocks(task, job)).loss - full) <= 1e-13 * abs(full)


def test_parallel_and_serial_kernels_give_the_same_slots():
    """The parallel and the serial dispatchers run the same blocks into the same slots, bit for bit, for the
    full and the canonical walk (what makes the result independent of the thread count)."""
    task = closed_task(3, 6, 2)
    model = pg.CatFormer(3, 6, heads=(2, 1))
    for params, canon in ((random_params(model, 3), False), (equivariant_params(model, 3), True)):
        job = E.blocks(task, model, params, 0.0, True, pg.EngineOptions(prefix_block_sequences=9))
        job = job._replace(canon=canon, orbit=orbit_sizes(3))
        out = [E.run_blocks(task, job._replace(parallel=par)) for par in (True, False)]
        np.testing.assert_array_equal(out[0].loss, out[1].loss)
        np.testing.assert_array_equal(out[0].gr, out[1].gr)
        assert job.n_blocks > 1 and np.count_nonzero(out[0].loss) >= 2
