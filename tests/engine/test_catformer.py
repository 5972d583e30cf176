"""Exact population loss and gradients of the disentangled transformer (popgrad.engine.catformer, DESIGN §18)."""
import textwrap

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import catformer as E
from popgrad.model.catformer import CatFormerParams
from tests.strategies import multi_tasks, tasks
from tests.threads import stdout_per_thread_count

REL = 1e-12  # kernel vs NumPy reference (relative to the largest entry)
FD = 1e-6  # central differences (relative)
HEADS = [(1, 1), (2, 1), (1, 1, 1), (1,), (1, 2)]


def rel(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def assert_same(r, ref, tol=REL):
    assert abs(r.loss - ref.loss) <= tol * max(abs(ref.loss), 1.0)
    assert len(r.dA) == len(ref.dA)
    for a, b in zip(r.dA, ref.dA):
        assert a.shape == b.shape
        assert rel(a, b) <= tol
    assert rel(r.dW, ref.dW) <= tol


def random_params(model, seed, scale=1.0, w_scale=1.0):
    rng = np.random.default_rng(seed)
    p = model.init(scale, seed)
    W = w_scale * rng.standard_normal(p.W.shape)
    if model.readout == "linear":  # keep f + ε > 0: a positive readout of positive features
        W = np.abs(W)
    return CatFormerParams(p.A, W)


@st.composite
def cases(draw, multi=None, max_sequences=400):
    if multi is None:
        multi = draw(st.booleans())
    task = draw(multi_tasks(max_S=3, max_T=5, max_k=2, max_sequences=max_sequences) if multi
                else tasks(max_S=3, max_T=6, max_sequences=max_sequences))
    heads = draw(st.sampled_from(HEADS))
    readout = draw(st.sampled_from(["softmax", "linear"]))
    model = pg.CatFormer(task.S, task.T, heads=heads, readout=readout)
    scale = draw(st.sampled_from([0.1, 1.0, 3.0]))
    params = random_params(model, draw(st.integers(0, 2**32 - 1)), scale, scale)
    eps = draw(st.sampled_from([None, 0.0, 0.05])) if readout == "softmax" else draw(st.sampled_from([None, 0.1]))
    return task, model, params, eps


# ---------------------------------------------------------------- kernel against the NumPy reference
@given(cases())
@settings(max_examples=30)
def test_kernel_equals_numpy_reference(case):
    task, model, params, eps = case
    ref = E.catformer_loss_and_grad_numpy(task, model, params, eps)
    r = pg.catformer_loss_and_grad(task, model, params, eps)
    assert_same(r, ref)
    assert pg.catformer_loss(task, model, params, eps) == r.loss


@given(cases(max_sequences=100))
@settings(max_examples=12)
def test_gradient_equals_finite_differences(case):
    """Directional derivative along a random direction of every parameter, central differences."""
    task, model, params, eps = case
    r = pg.catformer_loss_and_grad(task, model, params, eps)
    rng = np.random.default_rng(1)
    V = [rng.standard_normal(a.shape) for a in params.A]
    VW = rng.standard_normal(params.W.shape)
    if model.readout == "linear":
        VW = np.abs(VW)
    h = 1e-5

    def at(s):
        return pg.catformer_loss(task, model, CatFormerParams([a + s * v for a, v in zip(params.A, V)],
                                                              params.W + s * VW), eps)

    fd = (at(h) - at(-h)) / (2 * h)
    exact = sum(float(np.sum(d * v)) for d, v in zip(r.dA, V)) + float(np.sum(r.dW * VW))
    assert abs(fd - exact) <= FD * max(1.0, abs(exact))


def test_finite_differences_per_entry():
    """A few single entries of every block, central differences (a wrong block cannot hide in a direction)."""
    task = pg.Task(pg.random_tree(4, seed=2), pg.dirichlet_prior(2, 1.0, 2, seed=1))
    model = pg.CatFormer(2, 4, heads=(2, 1))
    params = random_params(model, 5)
    r = pg.catformer_loss_and_grad(task, model, params)
    rng = np.random.default_rng(0)
    h = 1e-6
    for l, a in enumerate(params.A):
        for _ in range(4):
            idx = tuple(int(rng.integers(0, n)) for n in a.shape)
            up, dn = [x.copy() for x in params.A], [x.copy() for x in params.A]
            up[l][idx] += h
            dn[l][idx] -= h
            fd = (pg.catformer_loss(task, model, CatFormerParams(up, params.W))
                  - pg.catformer_loss(task, model, CatFormerParams(dn, params.W))) / (2 * h)
            assert abs(fd - r.dA[l][idx]) <= FD * max(1.0, abs(fd)), (l, idx)
    for _ in range(4):
        idx = tuple(int(rng.integers(0, n)) for n in params.W.shape)
        up, dn = params.W.copy(), params.W.copy()
        up[idx] += h
        dn[idx] -= h
        fd = (pg.catformer_loss(task, model, CatFormerParams(params.A, up))
              - pg.catformer_loss(task, model, CatFormerParams(params.A, dn))) / (2 * h)
        assert abs(fd - r.dW[idx]) <= FD * max(1.0, abs(fd)), idx


@pytest.mark.parametrize("heads", [(1, 1), (2, 1), (1, 1, 1)])
def test_every_sequence_predictions_enter_the_loss(heads):
    """The loss is the weighted log-likelihood of ``model.predict`` on every sequence (an independent sum)."""
    task = pg.Task(pg.chain(5), pg.dirichlet_prior(3, 1.0, 2, seed=3))
    model = pg.CatFormer(3, 5, heads=heads)
    params = random_params(model, 2)
    seqs, w = task.all_sequences()
    f = model.predict(params, seqs)
    expected = -float(np.sum(w * np.log(f)))
    assert abs(pg.catformer_loss(task, model, params) - expected) <= 1e-12 * abs(expected)


# ---------------------------------------------------------------- block structure, threads
@pytest.mark.parametrize("bs", [1, 7, 10**6])
def test_block_size_changes_rounding_only(bs):
    task = pg.Task(pg.random_tree(6, seed=1), pg.dirichlet_prior(3, 1.0, 3, seed=0))
    model = pg.CatFormer(3, 6, heads=(2, 1))
    params = random_params(model, 4)
    ref = pg.catformer_loss_and_grad(task, model, params)
    r = pg.catformer_loss_and_grad(task, model, params, options=pg.EngineOptions(prefix_block_sequences=bs))
    n_fixed, n_blocks = E.block_count(3, 6, pg.EngineOptions(prefix_block_sequences=bs))
    assert n_blocks == 3**n_fixed and 0 <= n_fixed <= 6
    assert_same(r, ref, 1e-13)


def test_zero_weight_subtrees_are_skipped_exactly():
    """A prior with zero transitions: the engine skips dead subtrees; the reference visits every sequence."""
    atoms = np.array([[[0.0, 1.0, 0.0], [0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]])
    task = pg.Task(pg.chain(5), pg.FinitePrior(atoms, [1.0]))
    model = pg.CatFormer(3, 5, heads=(1, 1))
    params = random_params(model, 9)
    assert_same(pg.catformer_loss_and_grad(task, model, params), E.catformer_loss_and_grad_numpy(task, model, params))


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs at least 2 numba threads")
def test_one_and_two_threads_bit_identical():
    task = pg.Task(pg.random_tree(8, seed=0), pg.dirichlet_prior(3, 1.0, 2, seed=0))
    model = pg.CatFormer(3, 8, heads=(1, 1))
    params = random_params(model, 1)
    opts = pg.EngineOptions(prefix_block_sequences=64, parallel_min_sequences=1)
    before = numba.get_num_threads()
    out = {}
    try:
        for n in (1, 2):
            numba.set_num_threads(n)
            out[n] = pg.catformer_loss_and_grad(task, model, params, options=opts)
    finally:
        numba.set_num_threads(before)
    assert out[1].loss == out[2].loss
    for a, b in zip(out[1].dA, out[2].dA):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(out[1].dW, out[2].dW)


def test_thread_count_independence_in_a_fresh_process():
    code = textwrap.dedent("""
        import numpy as np, popgrad as pg
        task = pg.Task(pg.chain(9), pg.dirichlet_prior(3, 1.0, 2, 0))
        model = pg.CatFormer(3, 9, heads=(2, 1))
        p = model.init(0.5, 3)
        r = pg.catformer_loss_and_grad(task, model, pg.CatFormerParams(p.A, np.ones(p.W.shape)),
                                       options=pg.EngineOptions(prefix_block_sequences=81, parallel_min_sequences=1))
        print(repr(r.loss), [a.tobytes().hex() for a in r.dA], r.dW.tobytes().hex())
        """)
    outs = stdout_per_thread_count(code)
    assert outs[0] == outs[1]


# ---------------------------------------------------------------- Knowl 8: the reduced model inside
@given(task=tasks(max_S=3, max_T=6, max_sequences=800), seed=st.integers(0, 2**32 - 1),
       scale=st.sampled_from([0.3, 1.0, 3.0]))
@settings(max_examples=15)
def test_embedded_reduced_model_gradient_blocks(task, seed, scale):
    """``catformer_from_reduced``: ε-loss = exact_loss; dÃ1[S:, S:] (lower triangle) = dA1, dÃ2 block = dA2."""
    S, T = task.S, task.T
    rng = np.random.default_rng(seed)
    A1, A2 = scale * rng.standard_normal((T, T)), scale * rng.standard_normal((S, S))
    model, params = pg.catformer_from_reduced(A1, A2, S, T)
    r = pg.catformer_loss_and_grad(task, model, params)
    ref = pg.exact_loss_and_grad(task, A1, A2, symmetry="off")
    assert abs(r.loss - ref.loss) <= 1e-12 * abs(ref.loss)
    d0 = S + T
    np.testing.assert_allclose(np.tril(r.dA[0][0, S:, S:]), ref.dA1, rtol=0, atol=1e-12 * np.abs(ref.dA1).max())
    np.testing.assert_allclose(r.dA[1][0, :S, d0:d0 + S], ref.dA2, rtol=0, atol=1e-12 * np.abs(ref.dA2).max())
    assert np.all(np.triu(r.dA[0][0, S:, S:], 1) == 0)  # masked scores have no gradient


# ---------------------------------------------------------------- client=
def test_client_is_bit_identical(client):
    task = pg.Task(pg.random_tree(7, seed=0), pg.dirichlet_prior(3, 1.0, 2, seed=0))
    model = pg.CatFormer(3, 7, heads=(2, 1))
    params = random_params(model, 3)
    opts = pg.EngineOptions(prefix_block_sequences=27)
    local = pg.catformer_loss_and_grad(task, model, params, options=opts)
    dist = pg.catformer_loss_and_grad(task, model, params, client=client, options=opts)
    assert dist.loss == local.loss
    for a, b in zip(dist.dA, local.dA):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(dist.dW, local.dW)
    assert pg.catformer_loss(task, model, params, client=client, options=opts) == \
        pg.catformer_loss(task, model, params, options=opts)


# ---------------------------------------------------------------- errors
def test_bad_arguments():
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 1, seed=0))
    model = pg.CatFormer(2, 4)
    params = model.zeros()
    with pytest.raises(TypeError, match="model must be a popgrad.CatFormer"):
        pg.catformer_loss_and_grad(task, "m", params)
    with pytest.raises(ValueError, match=r"CatFormer\(2, 4"):
        pg.catformer_loss_and_grad(task, pg.CatFormer(2, 5), pg.CatFormer(2, 5).zeros())
    with pytest.raises(TypeError, match="task must be"):
        pg.catformer_loss_and_grad("t", model, params)
    with pytest.raises(ValueError, match="eps"):
        pg.catformer_loss_and_grad(task, model, params, eps=-1.0)
    with pytest.raises(TypeError, match="client"):
        pg.catformer_loss_and_grad(task, model, params, client=object())
    big = pg.Task(pg.chain(30), pg.dirichlet_prior(2, 1.0, 1, seed=0))
    with pytest.raises(pg.TaskTooLargeError):
        pg.catformer_loss(big, pg.CatFormer(2, 30), pg.CatFormer(2, 30).zeros())


def test_default_eps_by_readout():
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 1, seed=0))
    soft = pg.CatFormer(2, 4)
    p = random_params(soft, 0)
    assert pg.catformer_loss(task, soft, p) == pg.catformer_loss(task, soft, p, eps=0.0)
    lin = pg.CatFormer(2, 4, readout="linear")
    q = random_params(lin, 0)
    assert pg.catformer_loss(task, lin, q) == pg.catformer_loss(task, lin, q, eps=task.default_eps)


def test_linear_readout_negative_output_is_nan_with_a_warning():
    task = pg.Task(pg.chain(3), pg.dirichlet_prior(2, 1.0, 1, seed=0))
    model = pg.CatFormer(2, 3, readout="linear")
    p = model.zeros()
    W = -np.ones(p.W.shape)  # f = h W < 0 everywhere: log(f + ε) undefined
    with pytest.warns(RuntimeWarning, match="NaN"):
        r = pg.catformer_loss_and_grad(task, model, CatFormerParams(p.A, W), eps=0.1)
    assert np.isnan(r.loss) and np.all(np.isnan(r.dW)) and all(np.all(np.isnan(a)) for a in r.dA)


def test_softmax_eps_zero_never_infinite():
    """The cross entropy is a log-softmax: sharp logits give a large finite loss, not inf."""
    task = pg.Task(pg.chain(3), pg.dirichlet_prior(2, 1.0, 1, seed=0))
    model = pg.CatFormer(2, 3)
    p = model.zeros()
    W = np.zeros(p.W.shape)
    W[:, 0] = 400.0 + 10.0 * np.random.default_rng(0).standard_normal(p.W.shape[0])  # exp(-800): f_1 = 0
    r = pg.catformer_loss_and_grad(task, model, CatFormerParams(p.A, W))
    ref = E.catformer_loss_and_grad_numpy(task, model, CatFormerParams(p.A, W))
    assert np.isfinite(r.loss) and r.loss > 100
    assert_same(r, ref)
