"""The disentangled transformer and Knowl 7/8 conversions (popgrad.model.catformer, DESIGN §14)."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.model.catformer import CatFormerParams

TOL = 1e-12
HEADS = [(1, 1), (2, 1), (1, 1, 1), (1,), (2, 2)]


def every_sequence(S, T):
    return np.array(list(itertools.product(range(S), repeat=T)), dtype=np.int64)


def predict_loop(model, params, seq):
    """DESIGN §14 written out with Python lists and scalar loops, one sequence (independent of the module)."""
    S, T = model.S, model.T
    rows = [[1.0 if a == seq[t] or a == S + t else 0.0 for a in range(S + T)] for t in range(T)]
    for A in params.A:
        d = len(rows[0])
        new = [list(r) for r in rows]
        for k in range(A.shape[0]):
            for t in range(T):
                z = [sum(rows[t][a] * A[k, a, b] * rows[j][b] for a in range(d) for b in range(d))
                     for j in range(t + 1)]
                m = max(z)
                e = [math.exp(v - m) for v in z]
                p = [v / sum(e) for v in e]
                new[t] += [sum(p[j] * rows[j][a] for j in range(t + 1)) for a in range(d)]
        rows = new
    out = [sum(rows[T - 1][a] * params.W[a, c] for a in range(len(rows[0]))) for c in range(S)]
    if model.readout == "softmax":
        m = max(out)
        e = [math.exp(v - m) for v in out]
        out = [v / sum(e) for v in e]
    return np.array(out)


def random_params(model, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    p = model.init(scale, seed)
    return CatFormerParams(p.A, scale * rng.standard_normal(p.W.shape))


# ---------------------------------------------------------------------- the model
def test_dims_and_shapes():
    m = pg.CatFormer(3, 10, heads=(2, 1))
    assert m.dims == (13, 39, 78)
    p = m.zeros()
    assert [a.shape for a in p.A] == [(2, 13, 13), (1, 39, 39)]
    assert p.W.shape == (78, 3)
    assert m.S == 3 and m.T == 10 and m.heads == (2, 1) and m.readout == "softmax"


def test_init_is_seeded_normal_with_zero_readout():
    m = pg.CatFormer(2, 4, heads=(1, 2))
    p, q = m.init(1e-4, 7), m.init(1e-4, 7)
    for a, b in zip(p.A, q.A):
        np.testing.assert_array_equal(a, b)
    assert np.all(p.W == 0) and 1e-6 < np.std(p.A[1]) < 1e-3
    assert not np.array_equal(p.A[0], m.init(1e-4, 8).A[0])


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("readout", ["softmax", "linear"])
def test_predict_equals_scalar_loops(heads, readout):
    m = pg.CatFormer(2, 3, heads=heads, readout=readout)
    p = random_params(m, 3)
    seqs = every_sequence(2, 3)
    f = m.predict(p, seqs)
    for s, row in zip(seqs, f):
        np.testing.assert_allclose(row, predict_loop(m, p, s), rtol=0, atol=TOL)
    if readout == "softmax":
        np.testing.assert_allclose(f.sum(axis=1), 1.0, atol=TOL)


def test_causal():
    """Changing a token never changes the output through a masked path: f depends on the whole sequence only
    through rows ≤ T-1 -- with the last layer read at T-1, the rows below it see only their prefixes."""
    m = pg.CatFormer(3, 4, heads=(1, 1))
    p = random_params(m, 0)
    from popgrad.model.catformer import catformer_forward
    seqs = every_sequence(3, 4)
    h = catformer_forward(m, p, seqs)[2]
    # row 1 of every layer depends on s_0, s_1 only
    key = seqs[:, 0] * 3 + seqs[:, 1]
    for k in range(9):
        rows = h[key == k, 1]
        np.testing.assert_allclose(rows, rows[0][None].repeat(len(rows), 0), atol=0)


@pytest.mark.parametrize("bad, err", [
    (dict(S=0), ValueError), (dict(T=1.5), TypeError), (dict(heads=()), ValueError), (dict(heads=(1, 0)), ValueError),
    (dict(heads=3), TypeError), (dict(heads=(1, "a")), TypeError), (dict(readout="relu"), ValueError),
])
def test_bad_model_arguments(bad, err):
    kw = dict(S=2, T=3, heads=(1, 1), readout="softmax")
    kw.update(bad)
    with pytest.raises(err):
        pg.CatFormer(**kw)


def test_bad_params():
    m = pg.CatFormer(2, 3)
    p = m.zeros()
    with pytest.raises(TypeError, match="params"):
        m.predict(np.zeros(3), [[0, 1, 0]])
    with pytest.raises(ValueError, match=r"params.A\[1\]"):
        m.predict(CatFormerParams([p.A[0], np.zeros((1, 5, 5))], p.W), [[0, 1, 0]])
    bad = p.W.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"params.W\[2, 1\]"):
        m.predict(CatFormerParams(p.A, bad), [[0, 1, 0]])
    with pytest.raises(ValueError, match="A must be a list of 2"):
        m.predict(CatFormerParams(p.A[:1], p.W), [[0, 1, 0]])
    with pytest.raises(ValueError, match="token"):
        m.predict(p, [[0, 2, 0]])


# ---------------------------------------------------------------------- Knowl 7
def random_standard(S, T, d, heads, seed, readout="softmax"):
    rng = np.random.default_rng(seed)
    layers = [[tuple(rng.standard_normal((d, d)) / math.sqrt(d) for _ in range(3)) for _ in range(m)]
              for m in heads]
    return pg.StandardTransformer(rng.standard_normal((d, S)), rng.standard_normal((d, T)), layers,
                                  rng.standard_normal((S, d)), readout=readout)


@given(seed=st.integers(0, 2**32 - 1), heads=st.sampled_from(HEADS[:3]), d=st.integers(1, 9),
       S=st.integers(2, 3), T=st.integers(2, 4), readout=st.sampled_from(["softmax", "linear"]))
@settings(max_examples=25)
def test_standard_to_disentangled_same_function(seed, heads, d, S, T, readout):
    std = random_standard(S, T, d, heads, seed, readout)
    model, params = pg.to_disentangled(std)
    assert model.heads == heads and model.readout == readout
    seqs = every_sequence(S, T)
    np.testing.assert_allclose(model.predict(params, seqs), std.predict(seqs), rtol=0, atol=TOL * 10)


@given(seed=st.integers(0, 2**32 - 1), heads=st.sampled_from(HEADS[:3]), S=st.integers(2, 3),
       T=st.integers(2, 4), readout=st.sampled_from(["softmax", "linear"]))
@settings(max_examples=25)
def test_disentangled_to_standard_same_function(seed, heads, S, T, readout):
    model = pg.CatFormer(S, T, heads=heads, readout=readout)
    params = random_params(model, seed)
    std = pg.to_standard(model, params)
    assert std.d == model.dims[-1]
    seqs = every_sequence(S, T)
    np.testing.assert_allclose(std.predict(seqs), model.predict(params, seqs), rtol=0, atol=TOL)
    back_model, back = pg.to_disentangled(std)  # a round trip keeps the function (not the parameters' width)
    np.testing.assert_allclose(back_model.predict(back, seqs), model.predict(params, seqs), rtol=0, atol=TOL)


def test_standard_residual_differs_from_no_residual():
    """A non-vacuous check: dropping the residual stream's embedding part from the readout changes the function."""
    std = random_standard(2, 3, 4, (1, 1), 5)
    seqs = every_sequence(2, 3)
    model, params = pg.to_disentangled(std)
    wrong = CatFormerParams(params.A, np.ascontiguousarray(params.W * np.r_[np.zeros(5), np.ones(15)][:, None]))
    assert np.abs(model.predict(wrong, seqs) - std.predict(seqs)).max() > 1e-3


def test_bad_standard():
    with pytest.raises(ValueError, match="P must have shape"):
        pg.StandardTransformer(np.zeros((3, 2)), np.zeros((2, 4)), [[(np.eye(3),) * 3]], np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"layers\[0\]\[0\]"):
        pg.StandardTransformer(np.zeros((3, 2)), np.zeros((3, 4)), [[(np.eye(3),) * 2]], np.zeros((2, 3)))
    with pytest.raises(TypeError, match="StandardTransformer"):
        pg.to_disentangled("x")


# ---------------------------------------------------------------------- Knowl 8
@given(seed=st.integers(0, 2**32 - 1), S=st.integers(2, 3), T=st.integers(2, 5),
       scale=st.sampled_from([0.1, 1.0, 4.0]))
@settings(max_examples=25)
def test_reduced_model_inside(seed, S, T, scale):
    rng = np.random.default_rng(seed)
    A1, A2 = scale * rng.standard_normal((T, T)), scale * rng.standard_normal((S, S))
    model, params = pg.catformer_from_reduced(A1, A2, S, T)
    assert model.heads == (1, 1) and model.readout == "linear"
    seqs = every_sequence(S, T)
    np.testing.assert_allclose(model.predict(params, seqs), pg.predict(A1, A2, seqs), rtol=0, atol=TOL)
