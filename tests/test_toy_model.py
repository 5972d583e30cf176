"""The seam, end to end: a model defined here, in one test file, gets the whole public API with no other file
changed -- the exact loss and gradient (finite differences, a brute-force sum), ``client=``, training with SGD
and AdamW, checkpoint and resume, an HVP and the graph-recovery check."""
import json

import numpy as np
import pytest

import popgrad as pg
from popgrad.testing import check_model


# ---------------------------------------------------------------- the toy model (one attention layer, under 60 lines)
def _softmax(x, axis):
    e = np.exp(x - np.max(x.real, axis=axis, keepdims=True))  # shift by the real part: holomorphic
    return e / e.sum(axis=axis, keepdims=True)


class Toy:
    """One causal positional attention layer ``P = softmax(MASK(A))`` that copies tokens, read out by matching
    the copied token to the query: ``u_i = β <h_i, e_q>``, ``f = Σ_i softmax(u)_i e_{s_i}``."""

    complex_safe = True

    def __init__(self, S, T):
        self.S, self.T = S, T

    def __repr__(self):
        return f"Toy({self.S}, {self.T})"

    def param_shapes(self):
        return {"A": (self.T, self.T), "beta": (1,)}

    def init(self, scale, seed):
        rng = np.random.default_rng(seed)
        return {"A": scale * rng.standard_normal((self.T, self.T)), "beta": 1.0 + scale * rng.standard_normal(1)}

    def _forward(self, p, seqs):
        low = np.tri(self.T, dtype=bool)
        P = np.where(low, _softmax(np.where(low, p["A"], -np.inf), 1), 0.0)
        M = (seqs == seqs[:, -1:]).astype(float)  # M[n, j] = [s_j = q]
        V = M @ P.T  # the attention's mass on the query token
        a = _softmax(p["beta"][0] * V, 1)
        f = np.stack([np.sum(a * (seqs == c), axis=1) for c in range(self.S)], axis=1)
        return P, M, V, a, f

    def predict(self, p, seqs):
        return self._forward(p, np.asarray(seqs))[-1]

    def layer1_attention(self, p, seqs):
        P = self._forward(p, np.asarray(seqs))[0]
        return np.broadcast_to(P, (len(seqs), 1, self.T, self.T)).copy()

    def loss_and_grad_rows(self, p, seqs, w, eps):
        P, M, V, a, f = self._forward(p, seqs)
        pos = w > 0
        loss = -np.sum(np.where(pos, w * np.log(np.where(pos, f + eps, 1.0)), 0.0))
        r = np.where(pos, -w / np.where(pos, f + eps, 1.0), 0.0)
        delta = a * (np.take_along_axis(r, seqs, axis=1) - np.sum(f * r, axis=1, keepdims=True))
        G = (p["beta"][0] * delta).T @ M
        low = np.tri(self.T, dtype=bool)
        dA = np.where(low, P * (G - np.sum(P * G, axis=1, keepdims=True)), 0.0)
        return loss, {"A": dA, "beta": np.array([np.sum(delta * V)])}


# ---------------------------------------------------------------- the tests
def _task(T=4, S=2, seed=0):
    return pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=0.5, n_atoms=3, seed=seed))


def _brute(task, model, params, eps):
    seqs, w = task.all_sequences()
    f = model.predict(params, seqs)
    return -float(np.sum(w * np.log(f + eps)))


def test_conformance():
    report = check_model(Toy(2, 4), _task())
    assert set(report) == set(pg.testing.CHECKS) and report["gradient"] == "ok" and report["complex_step"] == "ok"


@pytest.mark.parametrize("S, T", [(2, 3), (3, 4)])
def test_exact_loss_and_gradient(S, T):
    task, model = _task(T, S), Toy(S, T)
    params = model.init(0.7, 1)
    eps = task.default_eps
    res = pg.loss_and_grad(task, model, params)
    assert res.engine == "generic" and sorted(res.grads) == ["A", "beta"]
    assert res.loss == pytest.approx(_brute(task, model, params, eps), rel=1e-12)
    h = 1e-6
    for name, shape in model.param_shapes().items():
        for idx in np.ndindex(shape):
            if name == "A" and idx[1] > idx[0]:
                assert res.grads[name][idx] == 0.0  # masked: above the diagonal nothing depends on A
                continue
            up = {k: v.copy() for k, v in params.items()}
            dn = {k: v.copy() for k, v in params.items()}
            up[name][idx] += h
            dn[name][idx] -= h
            fd = (_brute(task, model, up, eps) - _brute(task, model, dn, eps)) / (2 * h)
            assert res.grads[name][idx] == pytest.approx(fd, rel=1e-6, abs=1e-9)


def test_blocks_do_not_change_the_sum():
    """Small blocks (many slots) give the one-block sum to rounding."""
    task, model = _task(5, 3), Toy(3, 5)
    params = model.init(0.5, 2)
    a = pg.loss_and_grad(task, model, params)
    b = pg.loss_and_grad(task, model, params, options=pg.EngineOptions(direct_block_sequences=7, max_blocks=1024))
    assert b.loss == pytest.approx(a.loss, rel=1e-13)
    for k in a.grads:
        np.testing.assert_allclose(b.grads[k], a.grads[k], rtol=1e-11, atol=1e-15)


def test_client_is_bit_identical(client):
    task, model = _task(5, 3), Toy(3, 5)
    params = model.init(0.5, 3)
    opts = pg.EngineOptions(direct_block_sequences=16)
    local = pg.loss_and_grad(task, model, params, options=opts)
    remote = pg.loss_and_grad(task, model, params, options=opts, client=client)
    assert remote.loss == local.loss
    assert all(np.array_equal(remote.grads[k], local.grads[k]) for k in local.grads)
    v = model.init(1.0, 4)
    assert all(np.array_equal(a, b) for a, b in zip(pg.hvp(task, model, params, v).values(),
                                                      pg.hvp(task, model, params, v, client=client).values()))
    kw = dict(optimizer="adamw", lr=0.05, init_scale=0.2, record_every=1, options=opts)
    a, b = pg.train_model(task, model, 3, **kw), pg.train_model(task, model, 3, **kw, client=client)
    assert np.array_equal(a.loss, b.loss) and np.array_equal(a.final["A"], b.final["A"])


@pytest.mark.parametrize("optimizer, lr", [("sgd", 20.0), ("adamw", 0.05)])
def test_train_model(optimizer, lr):
    task, model = _task(4, 2), Toy(2, 4)
    traj = pg.train_model(task, model, 30, optimizer=optimizer, lr=lr, init_scale=0.0, record_every=1)
    assert traj.status == "completed" and traj.step.tolist() == list(range(31))
    assert traj.loss[-1] < traj.loss[0] - 1e-4
    assert traj.loss[0] == pg.loss_and_grad(task, model, model.init(0.0, 0)).loss
    np.testing.assert_array_equal(traj.params["A"][-1], traj.final["A"])


def test_checkpoint_and_resume(tmp_path, monkeypatch):
    task, model = _task(4, 2), Toy(2, 4)
    kw = dict(optimizer="adamw", lr=0.05, init_scale=0.1, init_seed=3, record_every=1)
    whole = pg.train_model(task, model, 12, **kw)
    ck = tmp_path / "toy.npz"
    real, calls = model.loss_and_grad_rows, []

    def interrupted(*a):
        calls.append(1)
        if len(calls) > 7:
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(model, "loss_and_grad_rows", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pg.train_model(task, model, 12, **kw, checkpoint_path=ck, checkpoint_every=5)
    monkeypatch.setattr(model, "loss_and_grad_rows", real)
    with np.load(ck) as z:
        assert json.loads(str(z["meta_json"]))["t"] == 5 and "opt0.0.mu.A" in z.files
    resumed = pg.train_model(task, model, 12, **kw, checkpoint_path=ck, resume=True)
    assert np.array_equal(resumed.loss, whole.loss) and np.array_equal(resumed.params["A"], whole.params["A"])
    with pytest.raises(ValueError, match="different task or configuration"):
        pg.train_model(task, model, 12, **dict(kw, lr=0.01), checkpoint_path=ck, resume=True)


def test_hvp_against_the_gradient():
    task, model = _task(4, 2), Toy(2, 4)
    params, v = model.init(0.5, 5), model.init(1.0, 6)
    Hv = pg.hvp(task, model, params, v)
    h = 1e-5
    up = pg.loss_and_grad(task, model, {k: params[k] + h * v[k] for k in params}).grads
    dn = pg.loss_and_grad(task, model, {k: params[k] - h * v[k] for k in params}).grads
    for k in params:
        np.testing.assert_allclose(Hv[k], (up[k] - dn[k]) / (2 * h), rtol=1e-5, atol=1e-9)


def test_graph_recovery():
    task, model = _task(8, 2), Toy(2, 8)  # T = 8: the smallest chain a random start cannot pass by chance
    untrained = pg.checks.check_model_graph_recovery(task, model, model.init(0.0, 0), hypotheses=None)
    random = pg.checks.check_model_graph_recovery(task, model, model.init(1.0, 1), hypotheses=None)
    assert random.details["chance_of_passing_at_random"] < 1e-3
    barely = pg.train_model(task, model, 3, lr=20.0, init_scale=0.0)
    trained = pg.train_model(task, model, 200, optimizer="adamw", lr=0.1, init_scale=0.0)
    assert untrained.status == random.status == "fail"
    assert pg.checks.check_model_graph_recovery(task, model, barely.final, hypotheses=None).status == "fail"
    ok = pg.checks.check_model_graph_recovery(task, model, trained.final, hypotheses=None)
    assert ok.status == "pass", ok.details
