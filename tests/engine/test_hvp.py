"""Exact Hessian-vector products and restricted spectra (engine.hvp, DESIGN §22).

References, each independent of the complex-step code under test:
* JAX: ``jax.jvp(jax.grad(loss))`` of a JAX implementation of each model written here (skipped without JAX);
* Richardson-extrapolated central differences of the engines' exact (numba) gradients;
* dense Hessians at tiny sizes (symmetry, restricted eigenvalues).
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import hvp as H


# ------------------------------------------------------------------ tiny tasks
def two_parent_task(S=2, T=4, atoms=3, seed=0):
    return pg.MultiParentTask(pg.two_parent(T), pg.dirichlet_tensor_prior(S, 2, 0.5, atoms, seed=seed))


def chain_task(S=2, T=4, seed=0):
    return pg.Task(pg.chain(T), pg.dirichlet_prior(S, 1.0, 3, seed=seed))


def cat_point(model, scale, seed):
    p = model.init(scale, seed)
    W = scale * np.random.default_rng(seed + 1000).standard_normal(p.W.shape)
    return pg.CatFormerParams(p.A, W)


def cat_grad_flat(task, model, x, eps=None):
    r = pg.catformer_loss_and_grad(task, model, H.unflatten_params(model, x), eps=eps)
    return H.flatten_params(pg.CatFormerParams(r.dA, r.dW))


def richardson(grad, x, v, h=1e-3):
    """Central differences at h and h/2, Richardson-extrapolated: error O(h^4)."""
    c = lambda s: (grad(x + s * v) - grad(x - s * v)) / (2 * s)  # noqa: E731
    return (4 * c(h / 2) - c(h)) / 3


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


# ------------------------------------------------------------------ the gradient inside is the engine's
@pytest.mark.parametrize("heads,readout", [((1, 1), "softmax"), ((2, 1), "softmax"), ((1, 2), "linear")])
def test_complex_gradient_at_real_point_equals_engine(heads, readout):
    task = two_parent_task(T=5)
    model = pg.CatFormer(2, 5, heads=heads, readout=readout)
    p = cat_point(model, 0.4, 1)
    if readout == "linear":  # keep f + eps > 0: a small readout
        p = pg.CatFormerParams(p.A, 0.05 * p.W)
    eps = None if readout == "softmax" else 0.5
    ref = pg.catformer_loss_and_grad(task, model, p, eps=eps)
    loss, dA, dW = H.catformer_grad_complex(task, model, p, 0.0 if eps is None else eps)
    assert abs(loss - ref.loss) <= 1e-13 * abs(ref.loss)
    for a, b in zip(dA, ref.dA):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-14)
    np.testing.assert_allclose(dW, ref.dW, rtol=0, atol=1e-14)


# ------------------------------------------------------------------ vs central differences of the exact gradient
@pytest.mark.parametrize("heads", [(1, 1), (2, 1), (2, 2)])
def test_catformer_hvp_matches_richardson(heads):
    task = two_parent_task(T=4)
    model = pg.CatFormer(2, 4, heads=heads)
    p = cat_point(model, 0.5, 2)
    v = cat_point(model, 1.0, 3)
    hv = H.flatten_params(pg.catformer_hvp(task, model, p, v))
    fd = richardson(lambda x: cat_grad_flat(task, model, x), H.flatten_params(p), H.flatten_params(v))
    assert rel(hv, fd) < 1e-8


@pytest.mark.parametrize("kind", ["two_parent", "chain"])
def test_catformer_hvp_on_a_continuous_prior_matches_richardson(kind):
    """The official task's continuous priors (no atoms: the weight table) against differences of the exact gradient."""
    if kind == "two_parent":
        task = pg.MultiParentTask(pg.two_parent(4), pg.DirichletTensorPrior(2, 2, 0.3))
        model = pg.CatFormer(2, 4, heads=(2, 1))
    else:
        task = pg.Task(pg.chain(4), pg.DirichletPrior(3, 0.5))
        model = pg.CatFormer(3, 4, heads=(1, 1))
    p = cat_point(model, 0.5, 4)
    v = cat_point(model, 1.0, 5)
    hv = H.flatten_params(pg.catformer_hvp(task, model, p, v))
    fd = richardson(lambda x: cat_grad_flat(task, model, x), H.flatten_params(p), H.flatten_params(v))
    assert rel(hv, fd) < 1e-8


def test_rows_hvp_matches_richardson_of_the_rows_gradient():
    """The batch loss's Hessian (what one sampled step descends) against differences of the rows kernel's gradient."""
    from popgrad.engine.catformer import catformer_rows_loss_and_grad

    task = pg.MultiParentTask(pg.two_parent(5), pg.DirichletTensorPrior(2, 2, 0.3))
    model = pg.CatFormer(2, 5, heads=(2, 1))
    b = task.sample(37, 0)
    w = b.targets / 37
    p, v = cat_point(model, 0.5, 6), cat_point(model, 1.0, 7)

    def grad(x):
        r = catformer_rows_loss_and_grad(b.seqs, w, model, H.unflatten_params(model, x))
        return H.flatten_params(pg.CatFormerParams(r.dA, r.dW))

    hv = H.flatten_params(H.catformer_rows_hvp(b.seqs, w, model, p, v))
    assert rel(hv, richardson(grad, H.flatten_params(p), H.flatten_params(v))) < 1e-8
    with pytest.raises(ValueError, match="w must have shape"):
        H.catformer_rows_hvp(b.seqs, w[:, :1], model, p, v)


def test_reduced_single_hvp_matches_richardson():
    task = chain_task(S=3, T=4)
    rng = np.random.default_rng(0)
    A1, A2, V1, V2 = rng.standard_normal((4, 4)), rng.standard_normal((3, 3)), rng.standard_normal((4, 4)), \
        rng.standard_normal((3, 3))
    h1, h2 = pg.hvp(task, A1, A2, (V1, V2))
    assert np.all(h1[np.triu_indices(4, 1)] == 0)

    def g(x):
        r = pg.exact_loss_and_grad(task, x[:16].reshape(4, 4), x[16:].reshape(3, 3))
        return np.concatenate([r.dA1.ravel(), r.dA2.ravel()])

    fd = richardson(g, np.concatenate([A1.ravel(), A2.ravel()]), np.concatenate([V1.ravel(), V2.ravel()]))
    assert rel(np.concatenate([h1.ravel(), h2.ravel()]), fd) < 1e-8


def test_reduced_multi_hvp_matches_richardson():
    task = two_parent_task(T=5)
    rng = np.random.default_rng(1)
    A1, A2 = rng.standard_normal((2, 5, 5)), rng.standard_normal((2, 2, 2))
    V1, V2 = rng.standard_normal((2, 5, 5)), rng.standard_normal((2, 2, 2))
    h1, h2 = pg.hvp(task, A1, A2, (V1, V2))
    n1 = A1.size

    def g(x):
        r = pg.exact_loss_and_grad(task, x[:n1].reshape(A1.shape), x[n1:].reshape(A2.shape))
        return np.concatenate([r.dA1.ravel(), r.dA2.ravel()])

    fd = richardson(g, np.concatenate([A1.ravel(), A2.ravel()]), np.concatenate([V1.ravel(), V2.ravel()]))
    assert rel(np.concatenate([h1.ravel(), h2.ravel()]), fd) < 1e-8


@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(0.0, 2.0), T=st.integers(2, 4))
@settings(max_examples=8, deadline=None)
def test_hvp_is_linear_and_symmetric(seed, scale, T):
    """<u, H v> = <v, H u> and H(a u + v) = a H u + H v, to rounding (any point, any directions)."""
    task = two_parent_task(T=T, seed=seed % 5)
    model = pg.CatFormer(2, T, heads=(2, 1))
    p = cat_point(model, scale, seed % 1000)
    u, v = cat_point(model, 1.0, seed % 997 + 1), cat_point(model, 1.0, seed % 991 + 2)
    fu, fv = H.flatten_params(u), H.flatten_params(v)
    hu = H.flatten_params(pg.catformer_hvp(task, model, p, u))
    hv = H.flatten_params(pg.catformer_hvp(task, model, p, v))
    scl = np.linalg.norm(hu) * np.linalg.norm(fv) + 1e-300
    assert abs(fu @ hv - fv @ hu) <= 1e-12 * scl
    comb = H.flatten_params(pg.catformer_hvp(task, model, p, H.unflatten_params(model, 2.5 * fu + fv)))
    assert rel(comb, 2.5 * hu + hv) < 1e-12


def test_zero_direction_gives_zero():
    task = two_parent_task()
    model = pg.CatFormer(2, 4, heads=(2, 1))
    out = pg.catformer_hvp(task, model, cat_point(model, 0.3, 0), model.zeros())
    assert all(np.all(a == 0) for a in out.A) and np.all(out.W == 0)


# ------------------------------------------------------------------ JAX: jvp of grad of an independent model
def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        pytest.skip("JAX not installed (the bench extra)")
    jax.config.update("jax_enable_x64", True)
    return jax, jnp


def _jax_catformer_loss(jnp, model, seqs, w):
    S, T = model.S, model.T
    x0 = np.zeros((len(seqs), T, S + T))
    x0[np.arange(len(seqs))[:, None], np.arange(T), seqs] = 1.0
    x0[:, np.arange(T), S + np.arange(T)] = 1.0
    mask = np.tril(np.ones((T, T), dtype=bool))

    def loss(A, W):
        h = jnp.asarray(x0)
        for Al in A:
            outs = [h]
            for k in range(Al.shape[0]):
                z = jnp.einsum("nia,ab,njb->nij", h, Al[k], h)
                z = jnp.where(mask, z, -jnp.inf)
                P = jnp.exp(z - z.max(axis=2, keepdims=True))
                P = P / P.sum(axis=2, keepdims=True)
                outs.append(P @ h)
            h = jnp.concatenate(outs, axis=2)
        logits = h[:, -1, :] @ W
        logf = logits - jnp.log(jnp.sum(jnp.exp(logits - logits.max(axis=1, keepdims=True)), axis=1,
                                        keepdims=True)) - logits.max(axis=1, keepdims=True)
        return -jnp.sum(w * logf)

    return loss


@pytest.mark.parametrize("heads", [(1, 1), (2, 1)])
def test_catformer_hvp_matches_jax(heads):
    jax, jnp = _jax()
    T = 5
    task = two_parent_task(T=T)
    model = pg.CatFormer(2, T, heads=heads)
    seqs, w = next(task.enumerate(chunk_size=task.n_sequences))
    loss = _jax_catformer_loss(jnp, model, seqs, w)
    p, v = cat_point(model, 0.6, 5), cat_point(model, 1.0, 6)
    f = lambda A, W: jax.grad(loss, argnums=(0, 1))(A, W)  # noqa: E731
    _, (tA, tW) = jax.jvp(f, ([jnp.asarray(a) for a in p.A], jnp.asarray(p.W)),
                          ([jnp.asarray(a) for a in v.A], jnp.asarray(v.W)))
    ref = H.flatten_params(pg.CatFormerParams([np.asarray(a) for a in tA], np.asarray(tW)))
    got = H.flatten_params(pg.catformer_hvp(task, model, p, v))
    assert rel(got, ref) < 1e-8


def _jax_reduced_loss(jnp, task, seqs, w, eps, multi):
    S, T = task.S, task.T
    X = (seqs[:, :, None] == np.arange(S)).astype(float)
    mask = np.tril(np.ones((T, T), dtype=bool))

    def sm(z):
        z = jnp.where(mask, z, -jnp.inf)
        e = jnp.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def loss(A1, A2):
        if multi:
            Hh = jnp.einsum("hij,njc->nhic", sm(A1), X)
            kappa = jnp.einsum("nhb,hbc->nhc", Hh[:, :, -1, :], A2)
            u = jnp.einsum("nhic,nhc->ni", Hh, kappa)
        else:
            V = A2[seqs[:, -1][:, None], seqs]
            u = V @ sm(A1).T
        a = jnp.exp(u - u.max(axis=1, keepdims=True))
        a = a / a.sum(axis=1, keepdims=True)
        f = jnp.einsum("ni,nic->nc", a, X)
        return -jnp.sum(w * jnp.log(f + eps))

    return loss


@pytest.mark.parametrize("multi", [False, True])
def test_reduced_hvp_matches_jax(multi):
    jax, jnp = _jax()
    task = two_parent_task(T=5) if multi else chain_task(S=3, T=5)
    seqs, w = next(task.enumerate(chunk_size=task.n_sequences))
    eps = task.default_eps
    loss = _jax_reduced_loss(jnp, task, seqs, w, eps, multi)
    rng = np.random.default_rng(3)
    sh1 = (2, 5, 5) if multi else (5, 5)
    sh2 = (2, task.S, task.S) if multi else (task.S, task.S)
    A1, A2, V1, V2 = (rng.standard_normal(s) for s in (sh1, sh2, sh1, sh2))
    _, (t1, t2) = jax.jvp(lambda a, b: jax.grad(loss, argnums=(0, 1))(a, b), (A1, A2), (V1, V2))
    t1 = np.where(np.tri(5, dtype=bool), np.asarray(t1), 0.0)
    h1, h2 = pg.hvp(task, A1, A2, (V1, V2))
    assert rel(np.concatenate([h1.ravel(), h2.ravel()]), np.concatenate([t1.ravel(), np.asarray(t2).ravel()])) < 1e-8


# ------------------------------------------------------------------ dense Hessian and restricted spectra
def symmetric_point(model, layer=0, heads=(0, 1), scale=0.5, seed=0):
    x = H.flatten_params(cat_point(model, scale, seed))
    perm = H.head_swap(model, layer, heads)
    return H.unflatten_params(model, (x + x[perm]) / 2), perm


@pytest.mark.parametrize("heads,layer,pair", [((2, 1), 0, (0, 1)), ((3, 1), 0, (2, 0)), ((1, 2), 1, (0, 1))])
def test_swap_leaves_the_loss_unchanged(heads, layer, pair):
    task = two_parent_task(T=4)
    model = pg.CatFormer(2, 4, heads=heads)
    p = cat_point(model, 0.8, 4)
    perm = H.head_swap(model, layer, pair)
    assert np.array_equal(perm[perm], np.arange(perm.size)) and not np.array_equal(perm, np.arange(perm.size))
    x = H.flatten_params(p)
    a = pg.catformer_loss(task, model, p)
    b = pg.catformer_loss(task, model, H.unflatten_params(model, x[perm]))
    assert abs(a - b) <= 1e-13 * abs(a)


def test_dense_hessian_is_symmetric_and_matches_differences():
    task = two_parent_task(T=3)
    model = pg.CatFormer(2, 3, heads=(2, 1))
    p = cat_point(model, 0.5, 7)
    Hd = H.catformer_hessian_dense(task, model, p)
    assert np.abs(Hd - Hd.T).max() <= 1e-13 * np.abs(Hd).max()
    x = H.flatten_params(p)
    e = np.zeros(x.size)
    j = int(np.argmax(np.abs(np.diag(Hd))))
    e[j] = 1.0
    fd = richardson(lambda y: cat_grad_flat(task, model, y), x, e)
    assert rel(Hd[:, j], fd) < 1e-8


@pytest.mark.parametrize("heads,layer,pair", [((2, 1), 0, (0, 1)), ((3, 1), 0, (0, 2))])
def test_antisymmetric_vectors_stay_antisymmetric_at_a_symmetric_point(heads, layer, pair):
    task = two_parent_task(T=4)
    model = pg.CatFormer(2, 4, heads=heads)
    p, perm = symmetric_point(model, layer, pair, seed=3)
    y = np.random.default_rng(0).standard_normal(perm.size)
    ya, ys = (y - y[perm]) / 2, (y + y[perm]) / 2
    ha = H.flatten_params(pg.catformer_hvp(task, model, p, H.unflatten_params(model, ya)))
    hs = H.flatten_params(pg.catformer_hvp(task, model, p, H.unflatten_params(model, ys)))
    assert np.abs(ha + ha[perm]).max() <= 1e-13 * np.abs(ha).max()  # swap(H v) = −H v
    assert np.abs(hs - hs[perm]).max() <= 1e-13 * np.abs(hs).max()


@pytest.mark.parametrize("subspace", ["head_antisymmetric", "head_symmetric", None])
def test_spectrum_matches_the_dense_restriction(subspace):
    task = two_parent_task(T=3)
    model = pg.CatFormer(2, 3, heads=(2, 1))
    p, perm = symmetric_point(model, seed=1)
    Hd = H.catformer_hessian_dense(task, model, p)
    n = perm.size
    if subspace is None:
        B = np.eye(n)
    else:
        b = H.subspace_basis(perm, subspace)
        B = np.stack([H.basis_embed(n, b, e) for e in np.eye(b[0].size)], axis=1)
        assert np.allclose(B.T @ B, np.eye(B.shape[1]), atol=1e-15)
    ev = np.linalg.eigvalsh(B.T @ Hd @ B)
    sp = pg.hessian_spectrum(task, model, p, k=3, which="both", subspace=subspace)
    want = np.concatenate([ev[:3], ev[-3:]])
    scale = np.abs(ev).max()
    assert np.abs(sp.values - want).max() <= 1e-8 * scale
    for j, lam in enumerate(sp.values):  # eigenvectors: H x = λ x, in the subspace
        x = sp.vectors[:, j]
        assert np.linalg.norm(Hd @ x - lam * x) <= 1e-7 * scale
        if subspace == "head_antisymmetric":
            assert np.abs(x + x[perm]).max() <= 1e-12


def test_reduced_multi_spectrum_and_swap():
    task = two_parent_task(T=4)
    rng = np.random.default_rng(2)
    a1, a2 = rng.standard_normal((4, 4)), rng.standard_normal((2, 2))
    A1, A2 = np.stack([a1, a1]), np.stack([a2, a2])
    Hd = H.reduced_hessian_dense(task, A1, A2)
    perm = H._reduced_swap(A1.shape, A2.shape, (0, 1))
    b = H.subspace_basis(perm, "head_antisymmetric")
    n = perm.size
    B = np.stack([H.basis_embed(n, b, e) for e in np.eye(b[0].size)], axis=1)
    ev = np.linalg.eigvalsh(B.T @ Hd @ B)
    sp = pg.hessian_spectrum(task, "reduced", (A1, A2), k=2, which="both", subspace="head_antisymmetric")
    assert np.abs(sp.values - np.concatenate([ev[:2], ev[-2:]])).max() <= 1e-8 * np.abs(ev).max()
    # the antisymmetric block is exact: the Hessian maps it into itself
    Pa = B @ B.T
    assert np.abs((np.eye(n) - Pa) @ Hd @ Pa).max() <= 1e-13 * np.abs(Hd).max()


# ------------------------------------------------------------------ errors and client=
def test_bad_arguments_are_named():
    task = two_parent_task()
    model = pg.CatFormer(2, 4, heads=(2, 1))
    p = model.zeros()
    with pytest.raises(ValueError, match="v"):
        pg.catformer_hvp(task, model, p, pg.CatFormerParams(p.A[:1], p.W))
    with pytest.raises(TypeError, match="model"):
        pg.catformer_hvp(task, "m", p, p)
    with pytest.raises(ValueError, match="subspace"):
        pg.hessian_spectrum(task, model, p, subspace="anti")
    with pytest.raises(ValueError, match="heads"):
        pg.hessian_spectrum(task, model, p, subspace="head_antisymmetric", heads=(0, 2))
    with pytest.raises(ValueError, match="which"):
        pg.hessian_spectrum(task, model, p, which="all")
    with pytest.raises(ValueError, match="v\\[1\\]"):
        pg.hvp(task, np.zeros((2, 4, 4)), np.zeros((2, 2, 2)), (np.zeros((2, 4, 4)), np.zeros((2, 3, 3))))
    with pytest.raises(TypeError, match="v must be a pair"):
        pg.hvp(task, np.zeros((2, 4, 4)), np.zeros((2, 2, 2)), np.zeros(3))


def test_client_is_bit_identical(client):
    task = two_parent_task(T=5)
    model = pg.CatFormer(2, 5, heads=(2, 1))
    p, v = cat_point(model, 0.5, 1), cat_point(model, 1.0, 2)
    from popgrad.engine import complex_step as C  # the module whose CHUNK the sums read

    old = C.CHUNK
    try:
        C.CHUNK = 8  # several chunks
        loc = H.flatten_params(pg.catformer_hvp(task, model, p, v))
        dist = H.flatten_params(pg.catformer_hvp(task, model, p, v, client=client))
    finally:
        C.CHUNK = old
    assert np.array_equal(loc, dist)


def test_reduced_single_spectrum_matches_dense():
    task = chain_task(S=2, T=4)
    rng = np.random.default_rng(4)
    A1, A2 = rng.standard_normal((4, 4)), rng.standard_normal((2, 2))
    Hd = H.reduced_hessian_dense(task, A1, A2)
    assert np.abs(Hd - Hd.T).max() <= 1e-13 * np.abs(Hd).max()
    ev = np.linalg.eigvalsh(Hd)
    sp = pg.hessian_spectrum(task, "reduced", (A1, A2), k=2)
    assert np.abs(sp.values - np.concatenate([ev[:2], ev[-2:]])).max() <= 1e-8 * np.abs(ev).max()
    with pytest.raises(ValueError, match="subspace needs two heads"):
        pg.hessian_spectrum(task, "reduced", (A1, A2), subspace="head_antisymmetric")


def test_spectra_moved_to_hessian_keep_their_old_import_paths():
    """engine.hvp was split (complex_step: products; hessian: spectra); every name stays importable from engine.hvp."""
    import popgrad.engine.hessian as Hs

    for name in ("head_swap", "subspace_basis", "basis_embed", "basis_project", "HessianSpectrum", "hessian_spectrum",
                 "catformer_hessian_dense", "reduced_hessian_dense", "_reduced_swap"):
        assert getattr(H, name) is getattr(Hs, name)
    from popgrad.engine.hvp import hessian_spectrum  # noqa: F401  (the from-import path too)

    assert pg.hessian_spectrum is Hs.hessian_spectrum and pg.HessianSpectrum is Hs.HessianSpectrum
    assert H.catformer_hvp is pg.catformer_hvp and "head_swap" in H.__all__
