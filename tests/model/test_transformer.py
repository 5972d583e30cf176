"""popgrad.Transformer (the official tf_with_mlp.ipynb model) without JAX: finite differences, the complex step,
an independent scalar-loop forward, the init law, and bad input (tests/model/test_transformer_official.py
compares against JAX autodiff of the official class)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg


def random_point(model, seed, spread=0.3):
    rng = np.random.default_rng(seed)
    return {k: v + spread * rng.standard_normal(v.shape) for k, v in model.init(1.0, seed).items()}


def predict_loop(model, p, seq):
    """The model written out with Python scalar loops, one sequence (independent of the module)."""
    S, T, d = model.S, model.T, model.d
    h = [[p["wte"][seq[t], a] + p["wpe"][t, a] for a in range(d)] for t in range(T)]
    for l in range(1, model.n_layers + 1):
        A, V = p[f"A{l}"][0], p[f"V{l}"]
        W1, b1, W2, b2 = (p[f"mlp{l}_{k}"] for k in ("W1", "b1", "W2", "b2"))
        new = []
        for t in range(T):
            z = [sum(h[t][a] * A[a, b] * h[j][b] for a in range(d) for b in range(d)) for j in range(t + 1)]
            m = max(z)
            e = [math.exp(v - m) for v in z]
            att = [sum(e[j] / sum(e) * h[j][a] for j in range(t + 1)) for a in range(d)]
            u = [sum(att[a] * V[a, b] for a in range(d)) for b in range(d)]
            r = [max(0.0, sum(u[a] * W1[a, b] for a in range(d)) + math.sqrt(d) * b1[b]) for b in range(d)]
            new.append([h[t][b] + sum(r[a] * W2[a, b] for a in range(d)) + math.sqrt(d) * b2[b] for b in range(d)])
        h = new
    z = [sum(h[T - 1][a] * p["W"][a, c] for a in range(d)) for c in range(S)]
    m = max(z)
    e = [math.exp(v - m) for v in z]
    return np.array([v / sum(e) for v in e])


@pytest.mark.parametrize("S,T,heads", [(2, 3, (1, 1)), (3, 4, (1,)), (2, 4, (1, 1, 1))])
def test_predict_equals_the_scalar_loop(S, T, heads):
    model = pg.Transformer(S, T, heads=heads)
    p = random_point(model, 1, spread=0.5)
    seqs = np.random.default_rng(2).integers(0, S, size=(6, T))
    f = model.predict(p, seqs)
    np.testing.assert_allclose(f.sum(axis=1), 1.0, rtol=0, atol=1e-14)
    for n in range(len(seqs)):
        np.testing.assert_allclose(f[n], predict_loop(model, p, seqs[n]), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("S,T,heads,eps", [(3, 5, (1, 1), 0.0), (2, 4, (1, 1), 0.2), (3, 4, (1,), 0.0),
                                           (2, 3, (1, 1, 1), 0.0)])
def test_backward_against_finite_differences_and_the_complex_step(S, T, heads, eps):
    model = pg.Transformer(S, T, heads=heads)
    p = random_point(model, 3)
    rng = np.random.default_rng(4)
    seqs = rng.integers(0, S, size=(30, T))
    w = rng.random((30, S))
    loss, g = model.loss_and_grad_rows(p, seqs, w, eps)
    f = model.predict(p, seqs)
    assert loss == pytest.approx(-np.sum(w * np.log(f + eps)), rel=1e-13)
    assert set(g) == set(model.param_shapes())
    for k, s in model.param_shapes().items():
        assert g[k].shape == s and g[k].dtype == np.float64
        v = rng.standard_normal(s)
        an = float(np.sum(g[k] * v))
        h = 1e-5
        lp = model.loss_and_grad_rows({**p, k: p[k] + h * v}, seqs, w, eps)[0]
        lm = model.loss_and_grad_rows({**p, k: p[k] - h * v}, seqs, w, eps)[0]
        assert (lp - lm) / (2 * h) == pytest.approx(an, rel=1e-6, abs=1e-8), k
        lc = model.loss_and_grad_rows({**p, k: p[k] + 1e-30j * v}, seqs, w, eps)[0]
        assert lc.imag / 1e-30 == pytest.approx(an, rel=1e-11, abs=1e-12), k


def test_complex_step_hvp_equals_finite_differences_of_the_gradient():
    """complex_safe: grads at params + i h v carry the Hessian-vector product in their imaginary part."""
    model = pg.Transformer(2, 4)
    assert model.complex_safe is True
    p = random_point(model, 5)
    rng = np.random.default_rng(6)
    seqs, w = rng.integers(0, 2, size=(20, 4)), rng.random((20, 2))
    v = {k: rng.standard_normal(a.shape) for k, a in p.items()}
    _, gc = model.loss_and_grad_rows({k: p[k] + 1e-30j * v[k] for k in p}, seqs, w, 0.0)
    h = 1e-5
    _, gp = model.loss_and_grad_rows({k: p[k] + h * v[k] for k in p}, seqs, w, 0.0)
    _, gm = model.loss_and_grad_rows({k: p[k] - h * v[k] for k in p}, seqs, w, 0.0)
    for k in p:
        np.testing.assert_allclose(gc[k].imag / 1e-30, (gp[k] - gm[k]) / (2 * h), rtol=1e-5, atol=1e-7)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 12), cut=st.integers(0, 12), seed=st.integers(0, 2**16))
def test_rows_add_up_over_any_split(n, cut, seed):
    """The loss and gradient of a set of rows are the sums over any split of the rows."""
    cut = min(cut, n)
    model = pg.Transformer(2, 3)
    p = random_point(model, seed % 7)
    rng = np.random.default_rng(seed)
    seqs, w = rng.integers(0, 2, size=(n, 3)), rng.random((n, 2))
    L, g = model.loss_and_grad_rows(p, seqs, w)
    La, ga = model.loss_and_grad_rows(p, seqs[:cut], w[:cut])
    Lb, gb = model.loss_and_grad_rows(p, seqs[cut:], w[cut:])
    assert La + Lb == pytest.approx(L, rel=1e-12, abs=1e-14)
    for k in g:
        np.testing.assert_allclose(ga[k] + gb[k], g[k], rtol=1e-11, atol=1e-13)


def test_chunked_rows_equal_one_chunk(monkeypatch):
    from popgrad.model import transformer as tm

    model = pg.Transformer(3, 5)
    p = random_point(model, 8)
    rng = np.random.default_rng(9)
    seqs, w = rng.integers(0, 3, size=(40, 5)), rng.random((40, 3))
    L, g = model.loss_and_grad_rows(p, seqs, w, 0.1)
    f = model.predict(p, seqs)
    monkeypatch.setattr(tm, "CHUNK_BYTES", 1)  # one row per chunk
    L1, g1 = model.loss_and_grad_rows(p, seqs, w, 0.1)
    assert L1 == pytest.approx(L, rel=1e-13)
    np.testing.assert_allclose(model.predict(p, seqs), f, rtol=1e-14)
    for k in g:
        np.testing.assert_allclose(g1[k], g[k], rtol=1e-12, atol=1e-14)


def test_layer1_attention_is_causal_and_matches_predicts_first_layer():
    model = pg.Transformer(3, 5)
    p = random_point(model, 10, spread=1.0)
    seqs = np.random.default_rng(11).integers(0, 3, size=(7, 5))
    a = model.layer1_attention(p, seqs)
    assert a.shape == (7, 1, 5, 5)
    np.testing.assert_allclose(a.sum(axis=-1), 1.0, atol=1e-14)
    assert np.all(a[..., np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]] == 0)
    h = p["wte"][seqs] + p["wpe"]
    z = np.einsum("nia,ab,njb->nij", h, p["A1"][0], h)
    z = np.where(np.tri(5, dtype=bool), z, -np.inf)
    e = np.exp(z - z.max(axis=2, keepdims=True))
    np.testing.assert_allclose(a[:, 0], e / e.sum(axis=2, keepdims=True), rtol=1e-13, atol=1e-15)
    # at the official start (A = 0) the attention is uniform over the causal prefix
    a0 = model.layer1_attention(model.init(1.0, 0), seqs)[0, 0]
    np.testing.assert_allclose(a0, np.tri(5) / np.arange(1, 6)[:, None], rtol=1e-15)


def test_init_law_and_reproducibility():
    model = pg.Transformer(10, 20)
    p, q, r = model.init(1.0, 0), model.init(1.0, 0), model.init(1.0, 1)
    assert list(p) == list(model.param_shapes())
    for k in p:
        assert p[k].dtype == np.float64 and p[k].shape == model.param_shapes()[k]
        np.testing.assert_array_equal(p[k], q[k])
    for l in (1, 2):
        for k in (f"A{l}", f"mlp{l}_W2", f"mlp{l}_b1", f"mlp{l}_b2"):
            assert not np.any(p[k]), k
        for k in (f"V{l}", f"mlp{l}_W1"):
            assert abs(np.std(p[k]) * math.sqrt(30) - 1) < 0.1 and not np.array_equal(p[k], r[k])
    assert not np.any(p["W"])
    for k in ("wte", "wpe"):
        assert abs(np.std(p[k]) * math.sqrt(30) - 1) < 0.2
    half = model.init(0.5, 0)
    np.testing.assert_allclose(half["V1"], 0.5 * p["V1"], rtol=1e-15)


def test_official_start_predicts_uniform():
    model = pg.Transformer(3, 4)
    f = model.predict(model.init(1.0, 2), np.zeros((2, 4), dtype=int))
    np.testing.assert_allclose(f, 1 / 3, rtol=1e-15)


@pytest.mark.parametrize("change,match", [
    (lambda p: p.pop("V1"), r"params lacks entry 'V1'.*model\.init"),
    (lambda p: p.update(extra=np.zeros(2)), r"params has entry 'extra', not a parameter.*drop it"),
    (lambda p: p.update(W=np.zeros((3, 3))), r"params\['W'\] must have shape \(8, 3\), got \(3, 3\)"),
    (lambda p: p["mlp2_b1"].__setitem__(4, np.nan), r"params\['mlp2_b1'\]\[4\] = nan is not finite"),
    (lambda p: p["wte"].__setitem__((0, 1), np.inf), r"params\['wte'\]\[0, 1\] = inf is not finite"),
])
def test_bad_params_are_one_line_errors(change, match):
    model = pg.Transformer(3, 5)
    p = model.init(1.0, 0)
    change(p)
    for call in (lambda: model.predict(p, [0] * 5), lambda: model.loss_and_grad_rows(p, [[0] * 5], [[1, 0, 0]], 0.0),
                 lambda: model.layer1_attention(p, [0] * 5)):
        with pytest.raises(ValueError, match=match) as e:
            call()
        assert "\n" not in str(e.value)


def test_bad_arguments_are_one_line_errors():
    model = pg.Transformer(3, 5)
    p = model.init(1.0, 0)
    cases = [
        (lambda: pg.Transformer(3, 5, heads=(2, 1)), ValueError, r"heads\[0\] = 2: the official Transformer runs one"),
        (lambda: pg.Transformer(3, 5, heads=()), ValueError, "at least one layer"),
        (lambda: pg.Transformer(3, 5, heads=2), TypeError, "sequence of head counts"),
        (lambda: pg.Transformer(0, 5), ValueError, "S"),
        (lambda: model.predict([1, 2], [0] * 5), TypeError, "params must be a mapping"),
        (lambda: model.predict(p, [0] * 4), ValueError, r"seqs must have shape \(n, T\) with T = 5"),
        (lambda: model.predict(p, [0, 1, 2, 3, 0]), ValueError, r"token 3: tokens must be in 0\.\.2"),
        (lambda: model.loss_and_grad_rows(p, [[0] * 5], [[1, 0]], 0.0), ValueError, r"w must have shape \(n, S\)"),
        (lambda: model.loss_and_grad_rows(p, [[0] * 5], [[1, 0, np.nan]], 0.0), ValueError, "w has a non-finite"),
        (lambda: model.loss_and_grad_rows(p, [[0] * 5], [[1, 0, 0]], -1.0), ValueError, "eps"),
        (lambda: model.init(-1.0, 0), ValueError, "scale"),
        (lambda: model.init(1.0, -3), ValueError, "seed"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match) as e:
            call()
        assert "\n" not in str(e.value)


def test_too_large_is_refused_up_front_with_its_size(monkeypatch):
    from popgrad import _io

    monkeypatch.setattr(_io, "memory_limit", lambda: 2**30)
    pg.Transformer(10, 20)
    with pytest.raises(ValueError, match=r"Transformer\(S=10, T=4000, heads=\(1, 1\)\) has [\d,]+ parameters "
                                         r"\(width d = 4010; training holds about .* GiB\), more than half of the "
                                         r"1\.0 GiB"):
        pg.Transformer(10, 4000)
    monkeypatch.setattr(_io, "memory_limit", lambda: None)
    with pytest.raises(ValueError, match="about 10"):
        pg.Transformer(10, 10**40)  # Python integers: no overflow, an error rather than a hang


def test_protocol_attributes():
    model = pg.Transformer(4, 6, heads=(1, 1, 1))
    assert (model.S, model.T, model.heads, model.d, model.n_layers) == (4, 6, (1, 1, 1), 10, 3)
    assert model == pg.Transformer(4, 6, heads=[1, 1, 1]) and hash(model) == hash(pg.Transformer(4, 6, (1, 1, 1)))
    assert repr(model) == "Transformer(S=4, T=6, heads=(1, 1, 1))"
    shapes = model.param_shapes()
    assert shapes["A2"] == (1, 10, 10) and shapes["W"] == (10, 4) and shapes["mlp3_b2"] == (10,)


# ------------------------------------------------------------------ through the public API (the seam)
def test_exact_loss_and_grad_is_the_weighted_sum_over_every_sequence_and_the_hvp_is_exact():
    import itertools

    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 0.5, 3, seed=1))
    model = pg.Transformer(2, 4)
    p = random_point(model, 12)
    res = pg.loss_and_grad(task, model, p, eps=0.1)
    seqs = np.array(list(itertools.product(range(2), repeat=4)))
    w = np.zeros((16, 2))  # brute force: the finite prior's atoms, the chain's transitions, the query's label
    for pi, mass in zip(task.prior.atoms, task.prior.weights):
        mu = pg.stationary_distribution(pi)
        for n, s in enumerate(seqs):
            pr = mu[s[0]] * np.prod([pi[s[i - 1], s[i]] for i in range(1, 3)]) / 2  # uniform query
            w[n] += mass * pr * pi[s[3]]
    L, g = model.loss_and_grad_rows(p, seqs, w, 0.1)
    assert res.loss == pytest.approx(L, rel=1e-12)
    for k in g:
        np.testing.assert_allclose(res.grads[k], g[k], rtol=1e-10, atol=1e-13)
    rng = np.random.default_rng(13)
    v = {k: rng.standard_normal(a.shape) for k, a in p.items()}
    Hv = pg.hvp(task, model, p, v, eps=0.1)
    h = 1e-5
    gp = pg.loss_and_grad(task, model, {k: p[k] + h * v[k] for k in p}, eps=0.1).grads
    gm = pg.loss_and_grad(task, model, {k: p[k] - h * v[k] for k in p}, eps=0.1).grads
    for k in p:
        np.testing.assert_allclose(Hv[k], (gp[k] - gm[k]) / (2 * h), rtol=1e-5, atol=1e-7)


def test_train_model_steps_it_and_a_bad_task_or_params_is_one_line():
    task = pg.Task(pg.chain(4), pg.DirichletPrior(2, 0.1))
    model = pg.Transformer(2, 4)
    traj = pg.train_model(task, model, 30, optimizer="adamw", lr=0.01, lr_schedule="cosine", weight_decay=2e-4,
                          eps=0.0, record_every=10)
    assert traj.status == "completed" and traj.loss[-1] < traj.loss[0]
    with pytest.raises(ValueError) as e:
        pg.loss_and_grad(pg.Task(pg.chain(5), pg.DirichletPrior(2, 0.1)), model, model.init(1.0, 0))
    assert "\n" not in str(e.value) and "T" in str(e.value)
    bad = model.init(1.0, 0)
    bad.pop("W")
    with pytest.raises(ValueError, match="'W'") as e:
        pg.loss_and_grad(task, model, bad)
    assert "\n" not in str(e.value)


def test_passes_the_model_conformance_checks():
    from popgrad.testing import check_model

    for heads, (S, T) in (((1, 1), (2, 4)), ((1,), (3, 3))):
        got = check_model(pg.Transformer(S, T, heads=heads), pg.Task(pg.chain(T), pg.DirichletPrior(S, 0.1)))
        assert set(got.values()) == {"ok"}, got
