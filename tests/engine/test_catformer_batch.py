"""The dense batch kernel (popgrad.engine.catformer_rows.catformer_batch_loss_and_grad) against the NumPy reference
and the trie rows kernel: values, finite differences, row losses, blocks, thread counts."""
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import catformer as E
from popgrad.engine.catformer_rows import catformer_batch_loss_and_grad
from popgrad.model.catformer import CatFormerParams, catformer_forward
from popgrad.train.catformer import _row_losses
from tests.engine.test_catformer import HEADS, assert_same, random_params
from tests.threads import stdout_per_thread_count


@st.composite
def batch_cases(draw):
    S = draw(st.integers(1, 4))
    T = draw(st.integers(1, 6))
    n = draw(st.integers(0, 40))
    heads = draw(st.sampled_from(HEADS))
    readout = draw(st.sampled_from(["softmax", "linear"]))
    model = pg.CatFormer(S, T, heads=heads, readout=readout)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([0.1, 1.0, 3.0]))
    params = random_params(model, seed, scale, scale)
    seqs = rng.integers(0, S, size=(n, T))
    w = rng.random((n, S)) * (rng.random((n, 1)) < 0.9)  # some rows of zero weight
    if n and draw(st.booleans()):
        w[:, rng.integers(0, S)] = 0.0  # zero classes (the log is skipped there)
    eps = draw(st.sampled_from([None, 0.0, 0.05])) if readout == "softmax" else 0.1
    per = draw(st.sampled_from([1, 3, 256]))
    return model, params, seqs, w, eps, per


@given(batch_cases())
@settings(max_examples=40, deadline=None)
def test_batch_kernel_equals_numpy_reference_and_trie_kernel(case):
    model, params, seqs, w, eps, per = case
    opts = pg.EngineOptions(catformer_rows_per_block=per)
    r = catformer_batch_loss_and_grad(seqs, w, model, params, eps, options=opts)
    assert_same(r, E.catformer_rows_loss_and_grad_numpy(seqs, w, model, params, eps))
    assert_same(r, E.catformer_rows_loss_and_grad(seqs, w, model, params, eps, options=opts))
    # every row's loss, against the reference forward
    f = catformer_forward(model, params, seqs)[0] if len(seqs) else np.zeros((0, model.S))
    e = 0.0 if eps is None else eps
    with np.errstate(divide="ignore", invalid="ignore"):
        want = -np.sum(np.where(w > 0, w * np.log(f + e), 0.0), axis=1)
    np.testing.assert_allclose(r.row_loss, want, rtol=1e-12, atol=1e-300)
    assert np.all(r.row_loss[~np.any(w > 0, axis=1)] == 0.0)
    lo = catformer_batch_loss_and_grad(seqs, w, model, params, eps, options=opts, want_grad=False)
    assert lo.loss == r.loss and lo.dA is None and lo.dW is None
    np.testing.assert_array_equal(lo.row_loss, r.row_loss)


@given(batch_cases())
@settings(max_examples=10, deadline=None)
def test_batch_gradient_equals_finite_differences(case):
    model, params, seqs, w, eps, _ = case
    r = catformer_batch_loss_and_grad(seqs, w, model, params, eps)
    rng = np.random.default_rng(1)
    V = [rng.standard_normal(a.shape) for a in params.A]
    VW = rng.standard_normal(params.W.shape)
    if model.readout == "linear":
        VW = np.abs(VW)
    h = 1e-5

    def at(s):
        p = CatFormerParams([a + s * v for a, v in zip(params.A, V)], params.W + s * VW)
        return catformer_batch_loss_and_grad(seqs, w, model, p, eps, want_grad=False).loss

    fd = (at(h) - at(-h)) / (2 * h)
    exact = sum(float(np.sum(d * v)) for d, v in zip(r.dA, V)) + float(np.sum(r.dW * VW))
    assert abs(fd - exact) <= 1e-6 * max(1.0, abs(exact))


def test_batch_at_the_official_size_matches_the_trie_kernel():
    """S = 10, T = 20 (beyond any enumeration), both head layouts, a sampled batch of the continuous prior."""
    task = pg.Task(pg.chain(20), pg.DirichletPrior(10, 0.1))
    b = task.sample(24, 0)
    for heads in ((1, 1), (2, 1)):
        model = pg.CatFormer(10, 20, heads=heads)
        p = random_params(model, 4, 0.3, 0.3)
        r = catformer_batch_loss_and_grad(b.seqs, b.targets / 24, model, p)
        assert_same(r, E.catformer_rows_loss_and_grad(b.seqs, b.targets / 24, model, p))
        # the trainer's per-row losses (kernel, times n) against its NumPy forward
        np.testing.assert_allclose(r.row_loss * 24, _row_losses(model, p, b.seqs, b.targets, 0.0), rtol=1e-12)


def test_blocks_change_rounding_only_and_reruns_are_bit_identical():
    model = pg.CatFormer(3, 5, heads=(2, 1))
    params = random_params(model, 3)
    rng = np.random.default_rng(0)
    seqs, w = rng.integers(0, 3, size=(300, 5)), rng.random((300, 3))
    ref = catformer_batch_loss_and_grad(seqs, w, model, params)
    again = catformer_batch_loss_and_grad(seqs, w, model, params)
    assert again.loss == ref.loss
    for a, b in zip((*again.dA, again.dW, again.row_loss), (*ref.dA, ref.dW, ref.row_loss)):
        np.testing.assert_array_equal(a, b)
    for per in (1, 7, 10**4):
        opts = pg.EngineOptions(catformer_rows_per_block=per)
        r = catformer_batch_loss_and_grad(seqs, w, model, params, options=opts)
        assert_same(r, ref, 1e-13)
        np.testing.assert_array_equal(r.row_loss, ref.row_loss)  # a row's loss never depends on its block
    perm = rng.permutation(300)
    assert_same(catformer_batch_loss_and_grad(seqs[perm], w[perm], model, params), ref, 1e-13)


def test_batch_thread_count_independence_in_a_fresh_process():
    code = textwrap.dedent("""
        import numpy as np, popgrad as pg
        from popgrad.engine.catformer_rows import catformer_batch_loss_and_grad
        model = pg.CatFormer(3, 6, heads=(2, 1))
        p = model.init(0.5, 3)
        rng = np.random.default_rng(0)
        seqs, w = rng.integers(0, 3, size=(500, 6)), rng.random((500, 3))
        r = catformer_batch_loss_and_grad(seqs, w, model, pg.CatFormerParams(p.A, np.ones(p.W.shape)),
                                          options=pg.EngineOptions(catformer_rows_per_block=16,
                                                                   parallel_min_sequences=1))
        print(repr(r.loss), [a.tobytes().hex() for a in r.dA], r.dW.tobytes().hex(), r.row_loss.tobytes().hex())
        """)
    outs = stdout_per_thread_count(code)
    assert outs[0] == outs[1]


def test_batch_bad_arguments():
    model = pg.CatFormer(2, 3)
    p = model.zeros()
    seqs = np.zeros((2, 3), dtype=int)
    with pytest.raises(ValueError, match=r"w must have shape \(n, S\) = \(2, 2\)"):
        catformer_batch_loss_and_grad(seqs, np.ones((2, 3)), model, p)
    with pytest.raises(ValueError, match="finite and >= 0"):
        catformer_batch_loss_and_grad(seqs, -np.ones((2, 2)), model, p)
    with pytest.raises(ValueError, match="tokens must be in"):
        catformer_batch_loss_and_grad(2 * np.ones((2, 3), dtype=int), np.ones((2, 2)), model, p)
    with pytest.raises(TypeError, match="model must be"):
        catformer_batch_loss_and_grad(seqs, np.ones((2, 2)), "m", p)
    with pytest.raises(ValueError, match="eps is required"):
        catformer_batch_loss_and_grad(seqs, np.ones((2, 2)), pg.CatFormer(2, 3, readout="linear"), p)
    empty = catformer_batch_loss_and_grad(np.zeros((0, 3), dtype=int), np.zeros((0, 2)), model, p)
    assert empty.loss == 0.0 and np.all(empty.dW == 0) and empty.row_loss.shape == (0,)


@pytest.mark.parametrize("heads", [(1, 1), (2, 1), (1, 1, 1)])
def test_large_layer1_scores_take_the_exp_path(heads):
    """Layer-1 scores come from a table of exp(Ã - rowmax); where its products underflow (|Ã| in the hundreds)
    the row is recomputed with exp: still the reference's numbers."""
    model = pg.CatFormer(3, 6, heads=heads)
    p = random_params(model, 2)
    p = CatFormerParams([p.A[0] * 300.0, *p.A[1:]], p.W)
    rng = np.random.default_rng(0)
    seqs, w = rng.integers(0, 3, size=(60, 6)), rng.random((60, 3))
    r = catformer_batch_loss_and_grad(seqs, w, model, p)
    assert_same(r, E.catformer_rows_loss_and_grad_numpy(seqs, w, model, p))
