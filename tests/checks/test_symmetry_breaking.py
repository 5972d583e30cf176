"""The symmetric start, its linearisation along exact trajectories, and the read-outs (checks.symmetry_breaking)."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.checks import symmetry_breaking as sb
from popgrad.engine import hvp as H
from popgrad.model.catformer import embed


def task_model(S=2, T=4, heads=(2, 1)):
    task = pg.MultiParentTask(pg.two_parent(T), pg.dirichlet_tensor_prior(S, 2, 0.3, 3, seed=1))
    return task, pg.CatFormer(S, T, heads=heads)


def test_symmetric_start_is_symmetric_plus_epsilon():
    task, model = task_model()
    perm = H.head_swap(model)
    s0 = H.flatten_params(sb.symmetric_start(model, 1e-2, 3, epsilon=0))
    assert np.array_equal(s0, s0[perm])
    x = H.flatten_params(sb.symmetric_start(model, 1e-2, 3, epsilon=1e-5))
    d = (x - x[perm]) / 2
    assert abs(np.linalg.norm(d) - 1e-5) < 1e-18
    np.testing.assert_array_equal((x + x[perm]) / 2, s0)
    # the Hessian direction: the most negative antisymmetric eigenvector
    xh = H.flatten_params(sb.symmetric_start(model, 1e-2, 3, epsilon=1e-5, direction="hessian", task=task))
    sp = pg.hessian_spectrum(task, model, H.unflatten_params(model, s0), k=1, which="smallest",
                             subspace="head_antisymmetric")
    dh = (xh - xh[perm]) / 2
    assert abs(abs(dh @ sp.vectors[:, 0]) / 1e-5 - 1) < 1e-8
    with pytest.raises(ValueError, match="antisymmetric"):
        sb.symmetric_start(model, 1e-2, 3, epsilon=1e-5, direction=s0)


@pytest.mark.parametrize("opt,lr", [("gd", 1.0), ("adamw", 1e-2)])
def test_trajectory_is_train_catformers(opt, lr):
    task, model = task_model()
    st = sb.symmetric_start(model, 1e-3, 0, 1e-6)
    run = sb.follow_symmetric_start(task, model, st, 4, optimizer=opt, lr=lr, lr_schedule="cosine",
                                    weight_decay=1e-3, spectrum_every=2)
    tr = pg.train_catformer(task, model, 4, optimizer=opt, lr=lr, lr_schedule="cosine", weight_decay=1e-3, init=st,
                            record_every=1)
    assert np.array_equal(run.loss, tr.loss)
    assert np.array_equal(run.final.W, tr.final.W) and all(np.array_equal(a, b) for a, b in zip(run.final.A, tr.final.A))
    assert np.allclose(run.delta, [np.linalg.norm(sb.antisymmetric_part(model, tr.params(r))) for r in range(5)],
                       rtol=1e-14, atol=0)


def test_gd_linearisation_matches_the_measured_difference():
    """δ_{t+1} = (I − η H_anti) δ_t: at ε = 1e-9 the measured difference follows it to O(ε) relative."""
    task, model = task_model(T=5)
    st = sb.symmetric_start(model, 1e-1, 2, 1e-9)
    run = sb.follow_symmetric_start(task, model, st, 12, optimizer="gd", lr=2.0, lr_schedule="constant",
                                    spectrum_every=6)
    assert np.nanmax(run.err_lin) < 1e-6
    # and the measured difference really moved (the check is not of a constant)
    assert abs(run.delta[-1] / run.delta[0] - 1) > 1e-3


def test_adam_linearisation_matches_the_measured_difference():
    """The Adam recursion (moments to first order, bias correction, decoupled decay) at ε far below Adam's eps."""
    task, model = task_model(T=5)
    st = sb.symmetric_start(model, 1e-1, 2, 1e-13)
    run = sb.follow_symmetric_start(task, model, st, 10, optimizer="adamw", lr=1e-2, lr_schedule="cosine",
                                    weight_decay=1e-2, spectrum_every=5)
    assert np.nanmax(run.err_lin) < 1e-3
    assert run.delta[-1] > 10 * run.delta[0]  # Adam amplifies the antisymmetric part
    # a larger perturbation leaves the linear regime: the error grows with ε (it is not identically small)
    run2 = sb.follow_symmetric_start(task, model, sb.symmetric_start(model, 1e-1, 2, 1e-7), 10, optimizer="adamw",
                                     lr=1e-2, lr_schedule="cosine", weight_decay=1e-2, spectrum_every=5)
    assert np.nanmax(run2.err_lin) > 10 * np.nanmax(run.err_lin)


@pytest.mark.parametrize("opt,lr", [("sgd", 1.0), ("adamw", 1e-2)])
def test_sampled_trajectory_is_train_catformers_and_linearised(opt, lr):
    """gradient="sampled": bit-identical to train_catformer's sampled run; the batch-Hessian linearisation holds."""
    task = pg.MultiParentTask(pg.two_parent(4), pg.DirichletTensorPrior(2, 2, 0.3))
    model = pg.CatFormer(2, 4, heads=(2, 1))
    st = sb.symmetric_start(model, 1e-1, 0, 1e-9 if opt == "sgd" else 1e-13)
    kw = dict(optimizer=opt, lr=lr, lr_schedule="cosine", weight_decay=1e-3)
    run = sb.follow_symmetric_start(task, model, st, 6, gradient="sampled", batch_size=16, sample_seed=3,
                                    spectrum_steps=[0], linearize_until=4, **kw)
    tr = pg.train_catformer(task, model, 6, init=st, record_every=1, gradient="sampled", batch_size=16,
                            sample_seed=3, **kw)
    assert np.array_equal(run.final.W, tr.final.W) and all(np.array_equal(a, b) for a, b in zip(run.final.A, tr.final.A))
    assert list(run.spec_step) == [0, 6]
    assert np.all(np.isnan(run.err_lin[5:])) and np.all(np.isfinite(run.err_lin[1:5]))
    assert np.nanmax(run.err_lin) < (1e-6 if opt == "sgd" else 1e-3)
    assert abs(run.delta[4] / run.delta[0] - 1) > 1e-3  # the difference moved
    # the loss recorded is the exact population loss
    assert abs(run.loss[-1] - pg.catformer_loss(task, model, run.final)) < 1e-14


def test_preconditioned_spectrum_with_unit_D_is_the_antisymmetric_spectrum():
    task, model = task_model()
    p = sb.symmetric_start(model, 0.3, 1, 0)
    n = H.flatten_params(p).size
    vals, _ = sb.preconditioned_spectrum(task, model, p, np.ones(n), k=2)
    sp = pg.hessian_spectrum(task, model, p, k=2, subspace="head_antisymmetric")
    np.testing.assert_allclose(vals, sp.values, rtol=0, atol=1e-10 * np.abs(sp.values).max())


def adjacency_params(task, model, beta=6.0):
    p = model.zeros()
    S = model.S
    for h in range(2):
        p.A[0][h, S:, S:] = beta * task.graph.adjacency(h)
    return p


def test_positional_margins_read_each_heads_parent():
    task, model = task_model(T=6)
    m = sb.positional_margins(task, model, adjacency_params(task, model))
    assert np.all(m.preference[0] > 0) and np.all(m.preference[1] < 0)
    rows_two = m.slot_mass[0, :, 0] != m.slot_mass[0, :, 1]
    assert np.all(m.margin[0, rows_two, 0] > 0.5) and np.all(m.margin[1, rows_two, 1] > 0.5)
    np.testing.assert_allclose(m.attention.sum(axis=2), 1.0, atol=1e-14)


def _forward_zeroed(model, params, seqs, off):
    """NumPy forward of heads (m, 1) with the layer-1 outputs of heads ``off`` set to zero (independent of _ablate)."""
    h = embed(model.S, model.T, seqs)
    low = np.tri(model.T, dtype=bool)

    def att(h, A):
        z = np.einsum("nia,ab,njb->nij", h, A, h)
        z = np.where(low, z, -np.inf)
        e = np.exp(z - z.max(axis=2, keepdims=True))
        return e / e.sum(axis=2, keepdims=True)

    outs = [h]
    for k in range(params.A[0].shape[0]):
        o = att(h, params.A[0][k]) @ h
        outs.append(np.zeros_like(o) if k in off else o)
    h1 = np.concatenate(outs, axis=2)
    h2 = np.concatenate([h1, att(h1, params.A[1][0]) @ h1], axis=2)
    z = h2[:, -1] @ params.W
    return z - z.max(axis=1, keepdims=True) - np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1,
                                                                                                   keepdims=True))


def test_head_ablation_is_exact():
    task, model = task_model(T=4)
    p = model.init(0.8, 5)
    p = pg.CatFormerParams(p.A, 0.8 * np.random.default_rng(0).standard_normal(p.W.shape))
    ab = sb.head_ablation(task, model, p)
    seqs, w = next(task.enumerate(chunk_size=task.n_sequences))
    for off, got in (([0], ab.ablated[0]), ([1], ab.ablated[1]), ([0, 1], ab.both)):
        want = -float(np.sum(w * _forward_zeroed(model, p, seqs, off)))
        assert abs(got - want) <= 1e-12 * abs(want)
    assert abs(ab.loss - pg.catformer_loss(task, model, p)) == 0
    assert ab.ablated[0] != ab.loss and ab.ablated[1] != ab.loss
    assert ab.bayes <= min(ab.two_parent, ab.one_parent.min())


def test_slot_count_loss_by_hand():
    task, _ = task_model(T=5)
    g = task.graph
    par, tp = np.asarray(g.parents), np.asarray(g.target_parents)
    for slots in [(0,), (1,), (0, 1)]:
        total = 0.0
        for seqs, w in task.enumerate(chunk_size=7):
            for s, ws in zip(seqs, w):
                cnt = np.zeros(task.S)
                n = 0
                for i in range(task.T - 1):
                    if par[i, 0] >= 0 and all(s[par[i, k]] == s[tp[k]] for k in slots):
                        cnt[s[i]] += 1
                        n += 1
                f = (cnt + 0.5) / (n + task.S * 0.5)
                total -= float(np.sum(ws * np.log(f)))
        assert abs(sb.slot_count_loss(task, slots) - total) <= 1e-12 * total


def test_find_plateaus_rule():
    t = np.arange(300)
    L = 1.0 - 0.5 / (1 + np.exp(-(t - 100) / 5.0))  # flat, a drop at ~100, flat to the end
    pl = sb.find_plateaus(L)
    assert len(pl) == 2
    assert pl[0].start == 0 and 40 < pl[0].stop < 100 and not pl[0].final
    assert pl[1].final and 100 < pl[1].start < 160
    assert sb.find_plateaus(np.ones(50))[0].final


def test_the_study_reads_the_rules_linearisation_and_refuses_a_rule_without_one(monkeypatch):
    """A rule object carrying its linearisation runs the study bit for bit like its name; a custom rule
    without one, and a new named rule without an entry in LINEARISED, are refused in one line (they
    used to get the GD linearisation silently)."""
    from popgrad.train import optim as O

    task, model = task_model()
    st = sb.symmetric_start(model, 1e-1, 2, 1e-9)
    named = sb.follow_symmetric_start(task, model, st, 3, optimizer="gd", lr=0.5, lr_schedule="constant",
                                      spectrum_every=3)
    obj = sb.follow_symmetric_start(task, model, st, 3, optimizer=O.sgd(0.5), spectrum_every=3)
    for a, b in ((named.loss, obj.loss), (named.delta, obj.delta), (named.delta_lin, obj.delta_lin)):
        assert np.array_equal(a, b)
    assert obj.optimizer.startswith("sgd(")
    opt = O.Optimizer("adamw", 1e-2, "cosine", 3, 1e-3)
    a = sb.follow_symmetric_start(task, model, st, 3, optimizer=opt, spectrum_every=3)
    b = sb.follow_symmetric_start(task, model, st, 3, optimizer="adamw", lr=1e-2, lr_schedule="cosine",
                                  weight_decay=1e-3, spectrum_every=3)
    assert np.array_equal(a.delta_lin, b.delta_lin) and np.array_equal(a.plam_min, b.plam_min)

    def momentum(lr, beta=0.9):  # heavy ball: a rule the study has no linearisation for
        def init(params):
            return {"v": O.tree_map(np.zeros_like, params)}

        def update(g, state, params=None):
            v = O.tree_map(lambda v_, g_: beta * v_ + g_, state["v"], g)
            return O.tree_map(lambda v_: -lr * v_, v), {"v": v}

        return O.GradientTransformation(init, update, "momentum")

    with pytest.raises(ValueError, match=r"^optimizer 'momentum' carries no linearisation.*use gd, sgd, adam or "
                                         r"adamw$") as info:
        sb.follow_symmetric_start(task, model, st, 2, optimizer=momentum(0.1))
    assert "\n" not in str(info.value)
    monkeypatch.setitem(O.NAMED, "momentum", lambda sched, o: momentum(o.lr))
    monkeypatch.setattr(O, "OPTIMIZERS", tuple(O.NAMED))
    assert O.Optimizer("momentum", 0.1).linearisation is None
    with pytest.raises(ValueError, match="optimizer 'momentum' carries no linearisation"):
        sb.follow_symmetric_start(task, model, st, 2, optimizer="momentum", lr=0.1)
    # the same rule given its (GD-kind) linearisation would be accepted: the study reads what the rule says
    with pytest.raises(ValueError, match="an optimizer object carries its own"):
        sb.follow_symmetric_start(task, model, st, 2, optimizer=O.sgd(0.5), lr=0.5)
    with pytest.raises(TypeError, match="optimizer must be a name or an object"):
        sb.follow_symmetric_start(task, model, st, 2, optimizer=3)


def test_coupled_adam_linearisation_expands_about_the_decayed_moments():
    """Adam with coupled decay transforms g + wd·θ: its symmetric moments include wd·θ̄, and the linearisation
    follows the measured difference (ε far below Adam's eps). Expanded about the undecayed moments it did not
    (relative error about 1e46 here: where ḡ = 0 the wd·θ̄ term was missing from v̄, so δ̂ was divided by eps)."""
    task, model = task_model(T=5)
    st = sb.symmetric_start(model, 1e-1, 2, 1e-13)
    for wd in (0.5, 0.05):
        run = sb.follow_symmetric_start(task, model, st, 10, optimizer="adam", lr=1e-2, lr_schedule="cosine",
                                        weight_decay=wd, spectrum_every=10, preconditioned=False)
        assert np.nanmax(run.err_lin) < 5e-3, (wd, np.nanmax(run.err_lin))
        assert abs(run.delta[-1] / run.delta[0] - 1) > 1e-2  # the difference moved: not a constant
