"""The full model's exact orbit reduction along equivariant parameters (engine/catformer_symmetry.py, DESIGN §21)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import popgrad as pg
from popgrad.engine import catformer as E
from popgrad.engine import catformer_symmetry as Y
from popgrad.model.catformer import CatFormerParams
from tests.engine.test_catformer import assert_same
from tests.threads import stdout_per_thread_count


def closed_task(S=3, T=5, seed=0, graph=None):
    base = pg.dirichlet_prior(S, 0.5, 2, seed=seed)
    prior = pg.FinitePrior.relabeling_closure(base.atoms, base.weights)
    return pg.Task(graph if graph is not None else pg.random_tree(T, seed=seed), prior)


def equivariant_params(model, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    A = [scale * rng.standard_normal(s) for s in model.shapes()[0]]
    W = scale * rng.standard_normal(model.shapes()[1])
    A, W = Y.symmetrize_params(model, A, W)
    return CatFormerParams(A, W)


@given(S=st.integers(2, 3), T=st.integers(2, 5), heads=st.sampled_from([(1, 1), (2, 1), (1,)]),
       seed=st.integers(0, 2**31))
@settings(max_examples=15, deadline=None)
def test_relabeling_is_a_symmetry_of_the_loss(S, T, heads, seed):
    """``L(σ·θ) = L(θ)`` and ``∇L(σ·θ) = σ·∇L(θ)`` on a closed prior (the action is the right one)."""
    task = closed_task(S, T, seed % 7)
    model = pg.CatFormer(S, T, heads=heads)
    p = model.init(1.0, seed)
    p = CatFormerParams(p.A, np.random.default_rng(seed).standard_normal(p.W.shape))
    sigma = np.random.default_rng(seed + 1).permutation(S)
    r = pg.catformer_loss_and_grad(task, model, p, symmetry="off")
    q = Y.relabel_params(model, p, sigma)
    rq = pg.catformer_loss_and_grad(task, model, q, symmetry="off")
    assert abs(rq.loss - r.loss) <= 1e-12 * abs(r.loss)
    moved = Y.relabel_params(model, CatFormerParams(r.dA, r.dW), sigma)
    assert_same(rq, pg.CatFormerLossAndGrad(r.loss, moved.A, moved.W), 1e-11)


@given(S=st.integers(2, 3), T=st.integers(2, 5), heads=st.sampled_from([(1, 1), (2, 1), (1, 1, 1)]),
       seed=st.integers(0, 2**31), scale=st.sampled_from([0.0, 0.3, 2.0]))
@settings(max_examples=15, deadline=None)
def test_reduced_equals_full_enumeration(S, T, heads, seed, scale):
    task = closed_task(S, T, seed % 5)
    model = pg.CatFormer(S, T, heads=heads)
    p = equivariant_params(model, seed, scale)
    assert Y.is_equivariant(model, p) and Y.reduction_applies(task, model, p)
    full = pg.catformer_loss_and_grad(task, model, p, symmetry="off")
    red = pg.catformer_loss_and_grad(task, model, p, symmetry="on")
    assert_same(red, full, 1e-12)
    assert pg.catformer_loss(task, model, p, symmetry="on") == red.loss
    # the reduced gradient is exactly equivariant: the same bits on every coordinate orbit
    assert Y.equivariance_defect(model, CatFormerParams(red.dA, red.dW)) == 0.0


def test_non_equivariant_start_is_never_reduced():
    task = closed_task(3, 5)
    model = pg.CatFormer(3, 5)
    one = np.zeros(model.shapes()[1])
    one[0, 0] = 1.0  # a readout that favours token 0: not equivariant
    for p in (model.init(1e-4, 0), model.init(1e-14, 1), CatFormerParams(model.zeros().A, one)):
        assert Y.equivariance_defect(model, p) > 0 and not Y.reduction_applies(task, model, p)
        with pytest.raises(ValueError, match="equivariant"):
            pg.catformer_loss_and_grad(task, model, p, symmetry="on")
        assert pg.catformer_loss_and_grad(task, model, p).loss == \
            pg.catformer_loss_and_grad(task, model, p, symmetry="off").loss
    open_task = pg.Task(pg.chain(5), pg.dirichlet_prior(3, 1.0, 2, seed=0, symmetrize=False))
    assert not Y.reduction_applies(open_task, model, model.zeros())
    with pytest.raises(ValueError, match="closed under relabeling"):
        pg.catformer_loss_and_grad(open_task, model, model.zeros(), symmetry="on")
    with pytest.raises(ValueError, match="symmetry must be"):
        pg.catformer_loss_and_grad(task, model, model.zeros(), symmetry="yes")


def _trajectory(task, model, symmetry, rule, steps=12, project=False):
    """Zero start, SGD or AdamW (optax's formulas), the exact gradient with or without the reduction
    (``project``: the unreduced gradient projected with ``Sym``)."""
    p = model.zeros()
    A, W = [a.copy() for a in p.A], p.W.copy()
    mA, vA = [np.zeros_like(a) for a in A], [np.zeros_like(a) for a in A]
    mW, vW = np.zeros_like(W), np.zeros_like(W)
    b1, b2, eps, lr, wd = 0.9, 0.999, 1e-8, 0.05, 0.01
    out = []
    for t in range(1, steps + 1):
        r = pg.catformer_loss_and_grad(task, model, CatFormerParams(A, W), symmetry=symmetry)
        out.append(r.loss)
        dA, dW = Y.symmetrize_params(model, r.dA, r.dW) if project else (r.dA, r.dW)
        for x, g, m, v in list(zip(A, dA, mA, vA)) + [(W, dW, mW, vW)]:
            if rule == "sgd":
                x -= 1.0 * g
            else:
                m *= b1
                m += (1 - b1) * g
                v *= b2
                v += (1 - b2) * g * g
                x -= lr * ((m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps) + wd * x)
    return np.array(out), A, W


@pytest.mark.parametrize("rule,project", [("sgd", False), ("sgd", True), ("adamw", True)])
def test_zero_start_trajectories_with_and_without_the_reduction(rule, project):
    """The reduced trajectory equals the full enumeration's. For AdamW the full enumeration's gradient is
    projected with ``Sym`` (exactly equivariant): unprojected, its rounding noise in the directions where the
    exact gradient vanishes is amplified by Adam's normalization ``m/(√v + ε)`` (test below)."""
    task = closed_task(3, 5, seed=1, graph=pg.chain(5))
    model = pg.CatFormer(3, 5, heads=(1, 1))
    la, Aa, Wa = _trajectory(task, model, "auto", rule)
    lb, Ab, Wb = _trajectory(task, model, "off", rule, project=project)
    assert np.max(np.abs(la - lb)) <= 1e-12 * np.max(np.abs(lb))
    if rule == "sgd":
        scale = max(np.max(np.abs(a)) for a in Ab + [Wb])
        for a, b in zip(Aa + [Wa], Ab + [Wb]):
            assert np.max(np.abs(a - b)) <= 1e-12 * scale
    else:
        # AdamW moves a coordinate whose exact gradient is 0 by lr·g/(|g| + ε): a rounding difference δ of the
        # two sums becomes lr·δ/ε (×1e7 at ε = 1e-8). Such coordinates are the directions the loss does not see
        # (a logit shift common to all classes: the class mean of an equivariant W's position rows; score
        # shifts common to a row), so the parameters differ there (measured up to 9e-10 in W) while the
        # model's outputs agree: compare the predictions on every sequence.
        seqs, _ = task.all_sequences()
        fa = model.predict(CatFormerParams(Aa, Wa), seqs)
        fb = model.predict(CatFormerParams(Ab, Wb), seqs)
        assert np.max(np.abs(fa - fb)) <= 1e-12
    # along the reduced trajectory the parameters stay exactly equivariant (the reduction stays on)
    assert Y.equivariance_defect(model, CatFormerParams(Aa, Wa)) == 0.0
    assert Y.reduction_applies(task, model, CatFormerParams(Aa, Wa))
    assert la[-1] < la[0]


def test_adamw_amplifies_the_rounding_of_an_unreduced_gradient():
    """Why the reduced (exactly equivariant) gradient matters for Adam: the full enumeration's gradient at an
    equivariant point is equivariant only to rounding; Adam divides by ``√v + ε`` and turns that noise into
    steps of the order of ``lr`` within a few steps, so the unreduced trajectory leaves the equivariant
    subspace while the reduced one stays in it exactly."""
    task = closed_task(3, 5, seed=1, graph=pg.chain(5))
    model = pg.CatFormer(3, 5, heads=(1, 1))
    _, Ab, Wb = _trajectory(task, model, "off", "adamw", steps=6)
    _, Aa, Wa = _trajectory(task, model, "auto", "adamw", steps=6)
    assert Y.equivariance_defect(model, CatFormerParams(Aa, Wa)) == 0.0
    assert Y.equivariance_defect(model, CatFormerParams(Ab, Wb)) > 1e-6


def test_coordinate_orbits_partition_the_parameters():
    model = pg.CatFormer(3, 4, heads=(2, 1))
    labels, counts = Y.coordinate_orbits(model)
    lab = np.concatenate(labels)
    assert lab.size == sum(int(np.prod(s)) for s in model.shapes()[0]) + int(np.prod(model.shapes()[1]))
    assert counts.sum() == lab.size and np.all(np.bincount(lab) == counts)
    assert set(np.unique(counts).astype(int)) <= {1, 2, 3, 6}  # orbit sizes divide |S_3| = 6


@given(S=st.integers(2, 4), T=st.integers(2, 5), heads=st.sampled_from([(1, 1), (2, 1), (1,), (1, 2, 1)]),
       seed=st.integers(0, 2**31), equivariant=st.booleans())
@settings(max_examples=25, deadline=None)
def test_equivariance_defect_is_the_relabeled_parameters_distance(S, T, heads, seed, equivariant):
    """The flat-index defect (one gather per generator) is exactly ``max_g max|g·θ − θ|`` of relabel_params."""
    model = pg.CatFormer(S, T, heads=heads)
    rng = np.random.default_rng(seed)
    p = (equivariant_params(model, seed) if equivariant
         else CatFormerParams([rng.standard_normal(s) for s in model.shapes()[0]],
                              rng.standard_normal(model.shapes()[1])))
    ref = 0.0
    for g in Y._generators(S):
        moved = Y.relabel_params(model, p, g)
        for a, b in zip(moved.A + [moved.W], p.A + [p.W]):
            ref = max(ref, float(np.max(np.abs(a - b))))
    assert Y.equivariance_defect(model, p) == ref
    assert (ref == 0.0) == equivariant and Y.is_equivariant(model, p) == equivariant


# ====================================================================== the table path (continuous priors)
def continuous_task(S, T, roots="stationary", seed=1):
    return pg.Task(pg.random_tree(T, seed=seed, root_prob=0.5), pg.DirichletPrior(S, 0.1, roots=roots))


@given(S=st.integers(1, 4), T=st.integers(1, 6))
@settings(max_examples=25, deadline=None)
def test_canonical_codes_are_the_canonical_forms_of_all_sequences(S, T):
    """``canonical_codes`` (restricted growth, lexicographic) is the set of ``canonical_form`` over every
    sequence; ``tau`` is a permutation per row that maps the row to its canonical form."""
    seqs = np.array(np.meshgrid(*[np.arange(S)] * T, indexing="ij")).reshape(T, -1).T
    codes, tau = Y.canonical_form(seqs, S)
    assert np.array_equal(np.unique(codes), Y.canonical_codes(S, T))
    assert np.all(np.sort(tau, axis=1) == np.arange(S))
    powers = S ** np.arange(T - 1, -1, -1)
    assert np.array_equal(np.take_along_axis(tau, seqs, axis=1) @ powers, codes)
    # canonical: each token's first occurrence in the order 0, 1, ...
    canon = (Y.canonical_codes(S, T)[:, None] // powers) % S
    assert np.all(canon[:, 0] == 0) and np.all(np.diff(np.maximum.accumulate(canon, axis=1), axis=1) <= 1)


@pytest.mark.parametrize("S,T,roots", [(2, 7, "stationary"), (3, 5, "uniform"), (3, 4, "stationary"),
                                       (4, 4, "uniform")])
def test_orbit_table_sums_the_weight_table(S, T, roots):
    task = continuous_task(S, T, roots)
    orb = Y.orbit_table(task)
    w = task.weight_table()
    assert orb.seqs.shape == (len(Y.canonical_codes(S, T)), T) and orb.w.shape == (orb.seqs.shape[0], S)
    assert abs(orb.w.sum() - w.sum()) <= 1e-13 * w.sum()
    assert orb.defect <= Y.TABLE_SYM_RTOL and Y.table_reduction_applies(task)
    # the canonical row's weights are the orbit's: n(r) times the canonical sequence's own row
    seqs, _ = task.all_sequences()
    powers = S ** np.arange(T - 1, -1, -1)
    row = {int(c): i for i, c in enumerate(seqs @ powers)}
    codes, _ = Y.canonical_form(seqs, S)
    n = np.bincount(np.searchsorted(Y.canonical_codes(S, T), codes))
    own = w[[row[int(c)] for c in orb.seqs @ powers]]
    assert np.allclose(orb.w, n[:, None] * own, rtol=1e-9, atol=0)


@pytest.mark.parametrize("S,T,roots,heads", [(2, 7, "stationary", (1, 1)), (3, 5, "uniform", (1, 1)),
                                             (3, 4, "stationary", (2, 1)), (4, 4, "uniform", (1, 1))])
@pytest.mark.parametrize("scale", [0.0, 0.5])
def test_continuous_reduced_equals_the_full_table(S, T, roots, heads, scale):
    """The official prior's table path, orbit-reduced along equivariant parameters, is the full table's sum
    (the loss exactly, the gradient as ``Sym`` of it; the table is invariant to its defect)."""
    task = continuous_task(S, T, roots)
    model = pg.CatFormer(S, T, heads=heads)
    p = equivariant_params(model, S * 10 + T, scale)
    assert Y.reduction_applies(task, model, p)
    full = pg.catformer_loss_and_grad(task, model, p, symmetry="off")
    red = pg.catformer_loss_and_grad(task, model, p, symmetry="on")
    assert_same(red, full, 1e-12)
    assert pg.catformer_loss_and_grad(task, model, p).loss == red.loss  # "auto" reduces
    assert pg.catformer_loss(task, model, p, symmetry="on") == red.loss
    assert Y.equivariance_defect(model, CatFormerParams(red.dA, red.dW)) == 0.0
    # against the NumPy reference (independent of both kernels)
    ref = E.catformer_loss_and_grad_numpy(task, model, p)
    assert_same(red, ref, 1e-12)


def test_continuous_non_equivariant_or_non_invariant_is_never_reduced(monkeypatch):
    task = continuous_task(3, 4)
    model = pg.CatFormer(3, 4)
    p = model.init(1e-3, 0)
    assert not Y.reduction_applies(task, model, p)
    with pytest.raises(ValueError, match="equivariant"):
        pg.catformer_loss_and_grad(task, model, p, symmetry="on")
    assert pg.catformer_loss_and_grad(task, model, p).loss == \
        pg.catformer_loss_and_grad(task, model, p, symmetry="off").loss
    # a table whose orbits disagree beyond TABLE_SYM_RTOL is read whole, and "on" says why
    z = model.zeros()
    off = pg.catformer_loss_and_grad(task, model, z, symmetry="off")
    orb = Y.orbit_table(task)
    monkeypatch.setattr(Y, "orbit_table", lambda t: orb._replace(defect=1e-6))
    assert not Y.reduction_applies(task, model, z)
    assert pg.catformer_loss_and_grad(task, model, z).loss == off.loss
    with pytest.raises(ValueError, match="weight table closed under relabeling"):
        pg.catformer_loss_and_grad(task, model, z, symmetry="on")
    # multi-parent tasks are never reduced
    two = pg.MultiParentTask(pg.two_parent(4), pg.DirichletTensorPrior(2, 2, 0.1))
    assert not Y.reduction_applies(two, pg.CatFormer(2, 4), pg.CatFormer(2, 4).zeros())


@pytest.mark.parametrize("rule", ["sgd", "adamw"])
def test_continuous_zero_start_trajectories_with_and_without_the_reduction(rule):
    """A zero start on the official prior: the reduced run (the one ``train_catformer`` takes) equals the full
    table's run with its gradient projected by ``Sym``, and stays exactly equivariant."""
    task = pg.Task(pg.chain(5), pg.DirichletPrior(3, 0.1))
    model = pg.CatFormer(3, 5, heads=(1, 1))
    la, Aa, Wa = _trajectory(task, model, "auto", rule)
    lb, Ab, Wb = _trajectory(task, model, "off", rule, project=True)
    assert np.max(np.abs(la - lb)) <= 1e-12 * np.max(np.abs(lb))
    seqs, _ = task.all_sequences()
    fa = model.predict(CatFormerParams(Aa, Wa), seqs)
    fb = model.predict(CatFormerParams(Ab, Wb), seqs)
    assert np.max(np.abs(fa - fb)) <= 1e-12
    assert Y.equivariance_defect(model, CatFormerParams(Aa, Wa)) == 0.0 and la[-1] < la[0]
    # the trainer takes the reduced path: its trajectory is the reduced one
    if rule == "sgd":
        traj = pg.train_catformer(task, model, 12, optimizer="sgd", lr=1.0, lr_schedule="constant", init="zero",
                                  record_every=1)
        assert np.max(np.abs(np.asarray(traj.loss)[:12] - la)) <= 1e-12 * np.max(np.abs(la))


def test_continuous_reduced_is_the_same_for_any_thread_count():
    code = ("import numpy as np, popgrad as pg\n"
            "from tests.engine.test_catformer_symmetry import continuous_task, equivariant_params\n"
            "task = continuous_task(3, 7, 'uniform'); model = pg.CatFormer(3, 7)\n"
            "p = equivariant_params(model, 3)\n"
            "r = pg.catformer_loss_and_grad(task, model, p, symmetry='on', options=pg.EngineOptions("
            "catformer_rows_per_block=64))\n"
            "print(r.loss.hex(), np.concatenate([a.ravel() for a in r.dA] + [r.dW.ravel()]).tobytes().hex())\n")
    one, two = stdout_per_thread_count(code)
    assert one == two and one


def test_finite_prior_with_its_table_reduces_on_the_table():
    """The one rule (DESIGN §20) decides the path of the reduction too: a closed finite prior with its table
    prepared (K ≥ TABLE_MIN_ATOMS) reduces on the table (orbit-summed rows), otherwise per atom; both equal
    the full sum."""
    from popgrad.engine import table as _table

    prior = pg.dirichlet_prior(3, 0.5, 4, seed=2, symmetrize=True)
    assert prior.K >= _table.TABLE_MIN_ATOMS
    model = pg.CatFormer(3, 5, heads=(1, 1))
    p = equivariant_params(model, 7, 0.5)
    per_atom = pg.Task(pg.random_tree(5, seed=3), prior)
    tabled = pg.Task(pg.random_tree(5, seed=3), prior)
    assert _table.prepare_table(tabled) and _table.use_table(tabled, per_atom=True)
    assert not _table.use_table(per_atom, per_atom=True)
    a = pg.catformer_loss_and_grad(per_atom, model, p, symmetry="on")
    b = pg.catformer_loss_and_grad(tabled, model, p, symmetry="on")
    full = pg.catformer_loss_and_grad(tabled, model, p, symmetry="off")
    assert_same(b, full, 1e-12)
    assert_same(a, full, 1e-12)
    assert Y.orbit_table(tabled).defect <= 1e-14
    assert Y.equivariance_defect(model, CatFormerParams(b.dA, b.dW)) == 0.0


@pytest.mark.parametrize("S,T,roots", [(2, 6, "stationary"), (3, 5, "uniform")])
def test_continuous_reduced_gradient_against_finite_differences(S, T, roots):
    """Central differences of the reduced loss along an equivariant direction (both points stay equivariant,
    so every evaluation is reduced) against the reduced gradient."""
    task = continuous_task(S, T, roots)
    model = pg.CatFormer(S, T, heads=(1, 1))
    p = equivariant_params(model, 11, 0.5)
    v = equivariant_params(model, 12, 1.0)
    g = pg.catformer_loss_and_grad(task, model, p, symmetry="on")
    slope = sum(float(np.sum(a * b)) for a, b in zip(g.dA + [g.dW], v.A + [v.W]))
    h = 1e-5

    def at(t):
        return pg.catformer_loss(task, model, CatFormerParams([a + t * b for a, b in zip(p.A, v.A)],
                                                              p.W + t * v.W), symmetry="on")

    fd = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h)
    assert abs(fd - slope) <= 1e-7 * max(1.0, abs(slope))
