"""The NumPy reference decides nothing with the engines' code; the k-head brute force has no ``_forward`` (issue 23).

* ``popgrad.engine.reference`` imports none of the code it checks (kernels,
  engines, orbit reduction, model forward passes, task weights): read from
  its source.
* An ``A2`` 1e-8 (and 0.005) off ``span{I, 11ᵀ}`` on a relabeling-closed
  prior is not projected: the engine equals the reference, which sums every
  sequence at the ``A2`` given, to 1e-12, while the projected ``A2`` is
  visibly different. A span tolerance loosened to 1e-2 fails here.
* A k-head loss written per sequence from the definition (loops, no
  :mod:`popgrad.model.multihead`) against the engine and the reference, and
  its central differences against both gradients.
"""
import ast
import inspect
import itertools

import numpy as np
import pytest

import popgrad as pg
from popgrad.engine import reference
from popgrad.engine import symmetry as sym_mod

ALLOWED_IMPORTS = {
    "__future__", "itertools", "math", "numpy",
    "popgrad._validation",  # argument checks only
    "popgrad.task.tasks",  # the task classes, for isinstance
    "popgrad.engine.options",  # EngineOptions.numpy_chunk
    "popgrad.engine.result",  # the LossAndGrad NamedTuple
}


def _imports(module):
    tree = ast.parse(inspect.getsource(module))
    pkg = module.__name__.rsplit(".", 1)[0]
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.setdefault(a.name, set())
        elif isinstance(node, ast.ImportFrom):
            base = (pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg) if node.level else ""
            if node.module is None:  # "from .. import _validation": each name is a module
                for a in node.names:
                    out.setdefault(f"{base}.{a.name}", set())
                continue
            name = f"{base}.{node.module}" if node.level else node.module
            out.setdefault(name, set()).update(a.name for a in node.names)
    return out


def test_reference_imports_none_of_the_code_it_checks():
    imp = _imports(reference)
    assert set(imp) <= ALLOWED_IMPORTS, set(imp) - ALLOWED_IMPORTS
    assert imp.get("popgrad.task.tasks", set()) <= {"ExactTask", "MultiParentTask"}
    assert imp.get("popgrad.engine.result", set()) == {"LossAndGrad"}


# ================================================================ A2 off the span
def closed_task(S=3, T=6, seed=0):
    return pg.Task(pg.random_tree(T, seed=seed, root_prob=0.3), pg.dirichlet_prior(S, 1.0, 2, seed, symmetrize=True))


def off_span(S, delta, seed=0):
    rng = np.random.default_rng(seed)
    return 0.7 * np.eye(S) + 0.2 + delta * rng.normal(size=(S, S))


def projected(A2):
    eye = np.eye(A2.shape[0], dtype=bool)
    return np.where(eye, A2[eye].mean(), A2[~eye].mean())


def rel(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(b)))


@pytest.mark.parametrize("delta", [1e-8, 5e-3])
def test_A2_off_the_span_is_not_projected(delta):
    task = closed_task()
    assert sym_mod.exactly_closed(task.prior)
    A1 = np.random.default_rng(1).normal(size=(task.T, task.T))
    A2 = off_span(task.S, delta)
    assert not sym_mod.symmetry_applies(task, A2)
    ref = reference.exact_loss_and_grad_numpy(task, A1, A2)  # every sequence, A2 as given
    res = pg.exact_loss_and_grad(task, A1, A2)  # symmetry="auto"
    assert rel(res.loss, ref.loss) <= 1e-13
    assert rel(res.dA1, ref.dA1) <= 1e-12 and rel(res.dA2, ref.dA2) <= 1e-12, (rel(res.dA1, ref.dA1), rel(res.dA2, ref.dA2))
    proj = reference.exact_loss_and_grad_numpy(task, A1, projected(A2))
    assert rel(proj.dA2, ref.dA2) > 100 * 1e-12  # projecting would be seen: the test tells the two apart
    with pytest.raises(ValueError, match="span"):
        reference.exact_loss_and_grad_numpy(task, A1, A2, symmetry="on")


def test_reference_orbit_reduction_needs_A2_exactly_in_the_span():
    task = closed_task(S=3, T=5)
    A1 = np.random.default_rng(2).normal(size=(5, 5))
    A2 = projected(off_span(3, 0.3))
    full = reference.exact_loss_and_grad_numpy(task, A1, A2)
    red = reference.exact_loss_and_grad_numpy(task, A1, A2, symmetry="on")
    assert rel(red.loss, full.loss) <= 1e-13 and rel(red.dA1, full.dA1) <= 1e-12 and rel(red.dA2, full.dA2) <= 1e-12
    A2[0, 1] = np.nextafter(A2[0, 1], 1.0)  # one ulp off: the reference refuses, it does not round
    with pytest.raises(ValueError, match="span"):
        reference.exact_loss_and_grad_numpy(task, A1, A2, symmetry="on")
    open_task = pg.Task(task.graph, pg.dirichlet_prior(3, 1.0, 2, 0, symmetrize=False))
    with pytest.raises(ValueError, match="relabeling-closed"):
        reference.exact_loss_and_grad_numpy(open_task, A1, projected(A2), symmetry="on")


# ============================================================ k-head brute force
def brute_loss_multi(task, A1, A2, eps):
    """``-Σ_s Σ_c w(s,c) log(f_c(s) + ε)`` from the definitions (DESIGN §9), one sequence at a time."""
    S, T, k = task.S, task.T, task.k
    parents = [tuple(int(x) for x in row) for row in np.asarray(task.graph.parents)]
    tp = tuple(int(x) for x in task.graph.target_parents)
    P = np.zeros((k, T, T))
    for h in range(k):
        for i in range(T):
            e = np.exp(A1[h, i, : i + 1] - A1[h, i, : i + 1].max())
            P[h, i, : i + 1] = e / e.sum()

    def row(s, ps):
        return sum(s[p] * S ** (k - 1 - n) for n, p in enumerate(ps))

    loss, total = 0.0, 0.0
    for s in itertools.product(range(S), repeat=T):
        w = np.zeros(S)
        for pi, rho in zip(task.prior.atoms, task.prior.weights):
            p = rho
            for i in range(T):
                p *= 1.0 / S if parents[i][0] < 0 else pi[row(s, parents[i]), s[i]]
            w += p * pi[row(s, tp)]
        total += w.sum()
        H = np.zeros((k, T, S))  # H[h, i] = Σ_{j ≤ i} P^h[i, j] e_{s_j}
        for h in range(k):
            for i in range(T):
                for j in range(i + 1):
                    H[h, i, s[j]] += P[h, i, j]
        u = np.array([sum(H[h, T - 1] @ A2[h] @ H[h, i] for h in range(k)) for i in range(T)])
        a = np.exp(u - u.max())
        a /= a.sum()
        f = np.zeros(S)
        for i in range(T):
            f[s[i]] += a[i]
        loss -= float(np.sum(w * np.log(f + eps)))
    assert abs(total - 1.0) <= 1e-12
    return loss


MULTI = [pg.two_parent(4), pg.ngram(4, 3)]


@pytest.mark.parametrize("graph", MULTI, ids=["two_parent", "trigram"])
def test_k_head_loss_and_gradients_against_a_per_sequence_brute_force(graph):
    task = pg.MultiParentTask(graph, pg.dirichlet_tensor_prior(2, graph.k, 1.0, 2, 5))
    rng = np.random.default_rng(3)
    A1, A2 = rng.normal(size=(task.k, 4, 4)), rng.normal(size=(task.k, 2, 2))
    eps = task.default_eps
    L = brute_loss_multi(task, A1, A2, eps)
    res = pg.exact_loss_and_grad(task, A1, A2)
    ref = reference.exact_loss_and_grad_numpy(task, A1, A2)
    assert abs(res.loss - L) <= 1e-12 * abs(L) and abs(ref.loss - L) <= 1e-12 * abs(L)
    h = 1e-5
    g1, g2 = np.zeros_like(A1), np.zeros_like(A2)
    for idx in itertools.product(*map(range, A1.shape)):
        if idx[2] <= idx[1]:
            Ap, Am = A1.copy(), A1.copy()
            Ap[idx] += h
            Am[idx] -= h
            g1[idx] = (brute_loss_multi(task, Ap, A2, eps) - brute_loss_multi(task, Am, A2, eps)) / (2 * h)
    for idx in itertools.product(*map(range, A2.shape)):
        Ap, Am = A2.copy(), A2.copy()
        Ap[idx] += h
        Am[idx] -= h
        g2[idx] = (brute_loss_multi(task, A1, Ap, eps) - brute_loss_multi(task, A1, Am, eps)) / (2 * h)
    scale = max(np.abs(g1).max(), np.abs(g2).max())
    for out in (res, ref):
        assert np.abs(out.dA1 - g1).max() <= 1e-7 * scale and np.abs(out.dA2 - g2).max() <= 1e-7 * scale
