"""The weight-table k-head kernel shares the prefix engine's leaf (``head_forward``/``head_backward``, issue 26):
with ``ε = 0`` a token mass that underflows to 0 gives the finite exact loss (issue 27), not ``inf``."""
import numpy as np

from popgrad.engine._kernels import table as kt


def _logsumexp(x):
    m = np.max(x)
    return m + np.log(np.sum(np.exp(x - m)))


def test_underflowing_token_mass_gives_the_finite_exact_loss():
    k, T, S = 2, 4, 3
    rng = np.random.default_rng(3)
    P = np.tril(rng.random((k, T, T)) + 0.1)
    P /= P.sum(axis=2, keepdims=True)
    A2 = 5000.0 * rng.normal(size=(k, S, S))  # scores spread over far more than 745
    seqs = np.array([[0, 1, 2, 0], [2, 2, 1, 0], [1, 0, 0, 2]], dtype=np.int64)
    w = np.array([[0.2, 0.5, 0.3], [0.1, 0.7, 0.2], [0.6, 0.1, 0.3]])
    loss = np.zeros(1)
    kt.loss_grad_multi_rows(seqs, w, P, A2, 0.0, 3, False, loss, np.zeros((1, k, 1, 1)), np.zeros((1, k, 1, 1)))
    want = 0.0
    underflow = False
    for s, ws in zip(seqs, w):
        X = (s[:, None] == np.arange(S)).astype(float)
        H = np.einsum("hij,jc->hic", P, X)
        kap = np.einsum("hb,hbc->hc", H[:, T - 1], A2)
        u = np.einsum("hic,hc->i", H, kap)
        f = np.exp(u - u.max()) / np.exp(u - u.max()).sum() @ X
        underflow |= bool(np.any(f[np.isin(np.arange(S), s)] == 0.0))
        for c in range(S):
            log_f = _logsumexp(u[s == c]) - _logsumexp(u) if np.any(s == c) else -np.inf
            want -= ws[c] * log_f
    assert underflow, "the inputs must make some f_c underflow (else the test checks nothing new)"
    assert np.isfinite(want)
    np.testing.assert_allclose(loss[0], want, rtol=1e-12)
