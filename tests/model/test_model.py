"""The reduced model's forward pass (popgrad.model.reduced, DESIGN §3)."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import popgrad as pg
from popgrad.model import reduced as model

TOL = 1e-12


@st.composite
def model_inputs(draw, min_S=2, max_S=4, min_T=2, max_T=8, max_n=20):
    """``(A1, A2, seqs)``: random parameters (non-symmetric A2) and sequences."""
    S = draw(st.integers(min_S, max_S))
    T = draw(st.integers(min_T, max_T))
    n = draw(st.integers(1, max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([0.1, 1.0, 5.0]))
    A1 = scale * rng.normal(size=(T, T))
    A2 = scale * rng.normal(size=(S, S))
    seqs = rng.integers(0, S, size=(n, T))
    return A1, A2, seqs


def predict_loop(A1, A2, seq):
    """DESIGN §3 written out with scalar loops, one sequence."""
    T = len(seq)
    S = A2.shape[0]
    P = np.zeros((T, T))
    for i in range(T):
        m = max(A1[i, j] for j in range(i + 1))
        z = sum(math.exp(A1[i, j] - m) for j in range(i + 1))
        for j in range(i + 1):
            P[i, j] = math.exp(A1[i, j] - m) / z
    q = seq[-1]
    u = [sum(P[i, j] * A2[q, seq[j]] for j in range(T)) for i in range(T)]
    m = max(u)
    z = sum(math.exp(x - m) for x in u)
    a = [math.exp(x - m) / z for x in u]
    f = np.zeros(S)
    for i in range(T):
        f[seq[i]] += a[i]
    return f


# ------------------------------------------------------------- the forward
@given(model_inputs())
def test_predict_matches_scalar_loops(inp):
    A1, A2, seqs = inp
    f = pg.predict(A1, A2, seqs)
    assert f.shape == (len(seqs), A2.shape[0])
    for m, seq in enumerate(seqs):
        np.testing.assert_allclose(f[m], predict_loop(A1, A2, seq), rtol=TOL, atol=TOL)


@given(model_inputs())
def test_predict_rows_are_distributions(inp):
    A1, A2, seqs = inp
    f = pg.predict(A1, A2, seqs)
    assert np.all(f >= 0)
    np.testing.assert_allclose(f.sum(axis=1), 1.0, rtol=0, atol=TOL)
    # a token absent from the sequence gets no mass
    for m, seq in enumerate(seqs):
        absent = np.setdiff1d(np.arange(A2.shape[0]), seq)
        assert np.all(f[m, absent] == 0.0)


@given(model_inputs())
def test_zero_parameters_give_empirical_frequency(inp):
    _, A2, seqs = inp
    S, T = A2.shape[0], seqs.shape[1]
    f = pg.predict(np.zeros((T, T)), np.zeros((S, S)), seqs)
    freq = np.stack([np.bincount(s, minlength=S) / T for s in seqs])
    np.testing.assert_allclose(f, freq, rtol=0, atol=TOL)


@given(model_inputs(), st.data())
def test_row_shifts_change_nothing(inp, data):
    A1, A2, seqs = inp
    T, S = A1.shape[0], A2.shape[0]
    f = pg.predict(A1, A2, seqs)
    i = data.draw(st.integers(0, T - 1))
    q = data.draw(st.integers(0, S - 1))
    c = data.draw(st.floats(-5, 5))
    A1s, A2s = A1.copy(), A2.copy()
    A1s[i, :] += c
    A2s[q, :] += c
    np.testing.assert_allclose(pg.predict(A1s, A2s, seqs), f, rtol=0, atol=TOL)


@given(model_inputs())
def test_upper_triangle_of_A1_is_ignored(inp):
    A1, A2, seqs = inp
    T = A1.shape[0]
    P = model.first_layer_attention(A1)
    assert np.all(P[np.triu_indices(T, 1)] == 0.0)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=TOL)
    noisy = A1 + np.triu(np.full((T, T), 7.0), 1)
    np.testing.assert_array_equal(pg.predict(noisy, A2, seqs), pg.predict(A1, A2, seqs))


def test_softmax_is_stable_for_large_scores():
    x = np.array([[1000.0, 1000.0, -1000.0], [-1e308, 0.0, 0.0]])
    p = model.softmax(x, axis=1)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p, [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]], rtol=0, atol=TOL)
    # large A2: the forward pass stays finite and normalized
    f = pg.predict(np.zeros((4, 4)), 800.0 * np.eye(3), [[0, 1, 2, 0], [2, 2, 1, 0]])
    np.testing.assert_allclose(f.sum(axis=1), 1.0, rtol=0, atol=TOL)
    np.testing.assert_allclose(f[0], [1.0, 0.0, 0.0], rtol=0, atol=TOL)


# --------------------------------------------------------------- causality
def test_causal_mask_on_hand_built_sequences():
    """Changing tokens after position i never changes the layer-1 output at i."""
    S, T = 3, 6
    rng = np.random.default_rng(11)
    A1 = rng.normal(size=(T, T)) * 3
    base = np.array([0, 2, 1, 1, 0, 2])
    for i in range(T):
        variants = [base.copy()]
        for tail in itertools.product(range(S), repeat=T - 1 - i):
            v = base.copy()
            v[i + 1 :] = tail
            variants.append(v)
        x = model.layer1_output(A1, np.array(variants), S)
        np.testing.assert_array_equal(x[:, i, :], np.broadcast_to(x[0, i, :], x[:, i, :].shape))
        # and changing a token at or before i does change it (the mask is not trivially constant)
        if i >= 1:
            w = base.copy()
            w[0] = (w[0] + 1) % S
            assert not np.array_equal(model.layer1_output(A1, w, S)[0, i], x[0, i])


def test_layer2_scores_depend_on_prefix_and_query_only():
    S, T = 3, 5
    rng = np.random.default_rng(5)
    A1, A2 = rng.normal(size=(T, T)), rng.normal(size=(S, S))
    a = np.array([[1, 0, 2, 2, 1]])
    b = np.array([[1, 0, 0, 1, 1]])  # same prefix up to position 1, same query
    ua, ub = model.second_layer_scores(A1, A2, a), model.second_layer_scores(A1, A2, b)
    np.testing.assert_array_equal(ua[0, :2], ub[0, :2])
    assert not np.allclose(ua[0, 2:4], ub[0, 2:4])


def test_layer1_output_is_a_distribution_over_tokens():
    A1 = np.random.default_rng(0).normal(size=(4, 4))
    x = model.layer1_output(A1, [[0, 1, 1, 2]], S=3)
    np.testing.assert_allclose(x.sum(axis=2), 1.0, rtol=0, atol=TOL)
    np.testing.assert_allclose(x[0, 0], [1.0, 0.0, 0.0], rtol=0, atol=TOL)


# -------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "A1, A2, seqs, match",
    [
        (np.zeros((3, 4)), np.zeros((2, 2)), [[0, 1, 0]], "A1 must be a square matrix"),
        (np.zeros((3, 3)), np.zeros((2, 3)), [[0, 1, 0]], "A2 must be a square matrix"),
        (np.array([[0, 0, 0], [0, np.nan, 0], [0, 0, 0]]), np.zeros((2, 2)), [[0, 1, 0]], r"A1\[1, 1\]"),
        (np.zeros((3, 3)), np.array([[0, np.inf], [0, 0]]), [[0, 1, 0]], r"A2\[0, 1\]"),
        (np.zeros((3, 3)), np.zeros((2, 2)), [[0, 1]], "T = 3"),
        (np.zeros((3, 3)), np.zeros((2, 2)), [[0, 2, 1]], "tokens must be in 0..1"),
        (np.zeros((3, 3)), np.zeros((2, 2)), [[0, -1, 1]], "negative token"),
        (np.zeros((3, 3)), np.zeros((2, 2)), [[0, 0.5, 1]], "integer tokens"),
    ],
)
def test_predict_validation(A1, A2, seqs, match):
    with pytest.raises(ValueError, match=match):
        pg.predict(A1, A2, seqs)


def test_single_sequence_is_a_batch_of_one():
    f = pg.predict(np.zeros((3, 3)), np.eye(2), [0, 1, 1])
    assert f.shape == (1, 2)
