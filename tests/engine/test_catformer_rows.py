"""The full model's loss and gradient over explicit rows (popgrad.engine.catformer.catformer_rows_loss_and_grad)."""
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import catformer as E
from popgrad.model.catformer import CatFormerParams
from tests.engine.test_catformer import HEADS, assert_same, random_params
from tests.strategies import multi_tasks, tasks
from tests.threads import stdout_per_thread_count


@st.composite
def row_cases(draw):
    S = draw(st.integers(1, 3))
    T = draw(st.integers(1, 6))
    n = draw(st.integers(0, 40))
    heads = draw(st.sampled_from(HEADS))
    readout = draw(st.sampled_from(["softmax", "linear"]))
    model = pg.CatFormer(S, T, heads=heads, readout=readout)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([0.1, 1.0, 3.0]))
    params = random_params(model, seed, scale, scale)
    # repeated prefixes and repeated rows (the trie walk), rows of zero weight
    base = rng.integers(0, S, size=(max(1, n // 3), T))
    seqs = base[rng.integers(0, len(base), size=n)].copy()
    if n and T > 1:
        seqs[:, -1] = rng.integers(0, S, size=n)
    w = rng.random((n, S)) * (rng.random((n, 1)) < 0.9)
    eps = draw(st.sampled_from([None, 0.0, 0.05])) if readout == "softmax" else 0.1
    per = draw(st.sampled_from([1, 3, 256]))
    return model, params, seqs, w, eps, per


@given(row_cases())
@settings(max_examples=40, deadline=None)
def test_rows_kernel_equals_numpy_reference(case):
    model, params, seqs, w, eps, per = case
    opts = pg.EngineOptions(catformer_rows_per_block=per)
    r = E.catformer_rows_loss_and_grad(seqs, w, model, params, eps, options=opts)
    ref = E.catformer_rows_loss_and_grad_numpy(seqs, w, model, params, eps)
    assert_same(r, ref)
    lo = E.catformer_rows_loss_and_grad(seqs, w, model, params, eps, options=opts, want_grad=False)
    assert lo.loss == r.loss and lo.dA is None and lo.dW is None


@given(row_cases())
@settings(max_examples=25, deadline=None)
def test_rows_kernel_in_any_row_order_equals_numpy_reference(case):
    """The kernel itself on unsorted rows (the public functions sort first): consecutive rows with one parent
    form a leaf group and a row whose last token the group already holds starts a new one, so repeats that
    are not adjacent are never merged or dropped."""
    model, params, seqs, w, eps, per = case
    seqs, w, params, eps, opts = E._validate_rows(seqs, w, model, params, eps,
                                                  pg.EngineOptions(catformer_rows_per_block=per))
    job = E.blocks(None, model, params, eps, True, opts)
    order = np.random.default_rng(len(seqs)).permutation(len(seqs))
    seqs, w = np.ascontiguousarray(seqs[order]), np.ascontiguousarray(w[order])
    r = E.finish_blocks(job, E._rows_partials(job, seqs, w, opts))
    assert_same(r, E.catformer_rows_loss_and_grad_numpy(seqs, w, model, params, eps))


@given(row_cases())
@settings(max_examples=10, deadline=None)
def test_rows_gradient_equals_finite_differences(case):
    model, params, seqs, w, eps, _ = case
    r = E.catformer_rows_loss_and_grad(seqs, w, model, params, eps)
    rng = np.random.default_rng(1)
    V = [rng.standard_normal(a.shape) for a in params.A]
    VW = rng.standard_normal(params.W.shape)
    if model.readout == "linear":
        VW = np.abs(VW)
    h = 1e-5

    def at(s):
        p = CatFormerParams([a + s * v for a, v in zip(params.A, V)], params.W + s * VW)
        return E.catformer_rows_loss_and_grad(seqs, w, model, p, eps, want_grad=False).loss

    fd = (at(h) - at(-h)) / (2 * h)
    exact = sum(float(np.sum(d * v)) for d, v in zip(r.dA, V)) + float(np.sum(r.dW * VW))
    assert abs(fd - exact) <= 1e-6 * max(1.0, abs(exact))


@given(st.one_of(tasks(max_S=3, max_T=5, max_sequences=300), multi_tasks(max_S=3, max_T=4, max_k=2,
                                                                        max_sequences=300)),
       st.sampled_from(HEADS), st.integers(0, 2**32 - 1))
@settings(max_examples=15, deadline=None)
def test_all_sequences_with_the_task_weights_is_the_population_loss(task, heads, seed):
    model = pg.CatFormer(task.S, task.T, heads=heads)
    params = random_params(model, seed)
    seqs, w = task.all_sequences()
    r = E.catformer_rows_loss_and_grad(seqs, w, model, params)
    assert_same(r, pg.catformer_loss_and_grad(task, model, params))


def test_row_order_and_block_size_change_rounding_only():
    model = pg.CatFormer(3, 5, heads=(2, 1))
    params = random_params(model, 3)
    rng = np.random.default_rng(0)
    seqs = rng.integers(0, 3, size=(300, 5))
    w = rng.random((300, 3))
    ref = E.catformer_rows_loss_and_grad(seqs, w, model, params)
    perm = rng.permutation(300)
    same = E.catformer_rows_loss_and_grad(seqs[perm], w[perm], model, params)
    assert same.loss == ref.loss  # the rows are sorted (tokens, then weights): any permutation, the same bits
    for a, b in zip(same.dA, ref.dA):
        np.testing.assert_array_equal(a, b)
    for per in (1, 7, 10**4):
        assert_same(E.catformer_rows_loss_and_grad(seqs, w, model, params,
                                                   options=pg.EngineOptions(catformer_rows_per_block=per)), ref, 1e-13)


def test_rows_thread_count_independence_in_a_fresh_process():
    code = textwrap.dedent("""
        import numpy as np, popgrad as pg
        from popgrad.engine.catformer import catformer_rows_loss_and_grad
        model = pg.CatFormer(3, 6, heads=(2, 1))
        p = model.init(0.5, 3)
        rng = np.random.default_rng(0)
        seqs, w = rng.integers(0, 3, size=(500, 6)), rng.random((500, 3))
        r = catformer_rows_loss_and_grad(seqs, w, model, pg.CatFormerParams(p.A, np.ones(p.W.shape)),
                                         options=pg.EngineOptions(catformer_rows_per_block=16,
                                                                  parallel_min_sequences=1))
        print(repr(r.loss), [a.tobytes().hex() for a in r.dA], r.dW.tobytes().hex())
        """)
    outs = stdout_per_thread_count(code)
    assert outs[0] == outs[1]


def test_rows_bad_arguments():
    model = pg.CatFormer(2, 3)
    p = model.zeros()
    seqs = np.zeros((2, 3), dtype=int)
    with pytest.raises(ValueError, match=r"w must have shape \(n, S\) = \(2, 2\)"):
        E.catformer_rows_loss_and_grad(seqs, np.ones((2, 3)), model, p)
    with pytest.raises(ValueError, match="finite and >= 0"):
        E.catformer_rows_loss_and_grad(seqs, -np.ones((2, 2)), model, p)
    with pytest.raises(ValueError, match="seqs"):
        E.catformer_rows_loss_and_grad(np.zeros((2, 4), dtype=int), np.ones((2, 2)), model, p)
    with pytest.raises(ValueError, match="tokens must be in"):
        E.catformer_rows_loss_and_grad(2 * np.ones((2, 3), dtype=int), np.ones((2, 2)), model, p)
    with pytest.raises(TypeError, match="model must be"):
        E.catformer_rows_loss_and_grad(seqs, np.ones((2, 2)), "m", p)
    with pytest.raises(ValueError, match="eps is required"):
        E.catformer_rows_loss_and_grad(seqs, np.ones((2, 2)), pg.CatFormer(2, 3, readout="linear"), p)
    empty = E.catformer_rows_loss_and_grad(np.zeros((0, 3), dtype=int), np.zeros((0, 2)), model, p)
    assert empty.loss == 0.0 and np.all(empty.dW == 0)
