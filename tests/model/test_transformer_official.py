"""popgrad.Transformer against JAX autodiff of the official ``Transformer`` class (runs when JAX is installed).

The official source is stored below as data (no network at test time): the ``muLinear``, ``MLP`` and
``Transformer`` classes of ``catformer.py`` (its imports included; its ``CatFormer`` class left out) and the
``InContextTree`` task of ``problems.py``, verbatim from ``eshnich/transformers-learn-causal-structure`` at
commit ``OFFICIAL_COMMIT``. They import ``simple_pytree``, which popgrad does not depend on: when it is not
installed, :func:`load_official` puts a small stand-in of ``Pytree`` / ``static_field`` in its place (the
classes register as JAX pytrees; static fields stay out of the leaves), written here.

``benchmarks/bench_transformer.py`` loads the same source through :func:`load_official`.
"""
import math
import sys
import types

import numpy as np
import pytest

import popgrad as pg

OFFICIAL_COMMIT = "7d5e4569f77485e7bbeb7ee7834fb56453439aa4"

#: ``catformer.py`` of the official repository: everything but the ``CatFormer`` class, verbatim.
OFFICIAL_CATFORMER_SOURCE = r"""import jax
from jax import nn
from jax import numpy as jnp
from jax import random as jr
from simple_pytree import Pytree, static_field


class muLinear(Pytree):
    def __init__(self, input_dim, output_dim, key, bias=True, zero_init=False):
        if zero_init:
            self.W = jnp.zeros([input_dim, output_dim])
        else:
            self.W = jr.normal(key, [input_dim, output_dim]) / jnp.sqrt(output_dim)
        if bias:
            self.b = jnp.zeros(output_dim)

    def __call__(self, x):
        x @= self.W * jnp.sqrt(self.W.shape[1] / self.W.shape[0])
        if hasattr(self, "b"):
            x += self.b * jnp.sqrt(len(self.b))
        return x


class MLP(Pytree):
    activation = static_field()

    def __init__(self, widths, activation, key):
        self.activation = activation

        keys = jr.split(key, len(widths) - 1)
        layers = []
        for i in range(len(widths) - 2):
            layers.append(muLinear(widths[i], widths[i + 1], keys[i]))
        layers.append(muLinear(widths[-2], widths[-1], keys[-1], zero_init=True))
        self.layers = layers

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        x = self.layers[-1](x)
        return x


class Transformer(Pytree):
    vocab_size: int = static_field()

    def attn(self, x, A):
        T = x.shape[-2]
        attn = jnp.einsum("...ij,jk,...lk -> ...il", x, A, x)
        attn = jnp.where(jnp.tri(T), attn, -jnp.inf)
        attn = nn.softmax(attn)
        attn = jnp.einsum("...ij,...jk->...ik", attn, x)
        return attn

    def embed(self, x):
        wte = self.wte[x]
        wpe = jnp.broadcast_to(self.wpe, (*x.shape, self.wpe.shape[-1]))
        return wte + wpe
        
    def __init__(
        self,
        seq_len,
        vocab_size,
        heads,
        key
    ):
        
        self.vocab_size = vocab_size
        d = seq_len + vocab_size
        self.A = []
        self.V = []
        self.mlps = []
        keys = jr.split(key, 2*len(heads)+2)
        for i in range(len(heads)):
            n_head = heads[i]
            self.A.append(jnp.zeros([n_head, d, d]))
            self.V.append(jr.normal(keys[2*i],[d, d])/jnp.sqrt(d))
            self.mlps.append(MLP(widths = [d, d, d], activation = nn.relu, key = keys[2*i + 1]))
        self.W = jnp.zeros((d, vocab_size))
        
        
        self.wte = jr.normal(keys[-2], [vocab_size, d]) / jnp.sqrt(d)
        self.wpe = jr.normal(keys[-1], [seq_len, d]) / jnp.sqrt(d)

        
    def get_attn(x):
        x = self.embed(x)

    def __call__(self, x):
        x = self.embed(x)

        for i in range(len(self.A)):
            Ai = self.A[i]
            Vi = self.V[i]
            mlpi = self.mlps[i]
            attn = jax.vmap(self.attn, (None, 0), -2)(x, Ai)
            attn = attn.reshape(*attn.shape[:-2], -1)
            delta = attn@Vi
            delta = jax.vmap(mlpi)(delta)
            x = x + delta
        x = x[..., -1, :]
        return nn.softmax(x @ self.W)
"""

#: ``problems.py`` of the official repository up to ``InContextTree`` (included), verbatim.
OFFICIAL_PROBLEMS_SOURCE = r"""from collections import namedtuple
from dataclasses import dataclass
from functools import partial
from typing import Optional, Sequence

import jax
from jax import jit, lax
from jax import numpy as jnp
from jax import random as jr
from jax import vmap
from jax.numpy import linalg as jla


def get_stationary(pi):
    mu = jla.svd(pi.T - jnp.eye(pi.shape[0]))[-1][-1]
    return mu / mu.sum()


class InContextTree:
    def __init__(self, vocab_size, dag, alpha):
        assert jnp.all(dag < jnp.arange(len(dag)))
        self.vocab_size = vocab_size
        self.dag = dag
        self.alpha = alpha

    def sample(self, key):
        pi_key, seq_key, test_key = jr.split(key, 3)
        prior = self.alpha * jnp.ones(self.vocab_size)
        pi = jr.dirichlet(pi_key, prior, [self.vocab_size])
        mu = get_stationary(pi)
        x = jnp.zeros((len(self.dag) + 1,), dtype=int)

        def step(i, carry):
            x, k = carry
            k, subkey = jr.split(k)
            p = jnp.where(self.dag[i] == -1, mu, pi[x[self.dag[i]]])
            x = x.at[i].set(jr.choice(subkey, pi.shape[0], p=p))
            return x, k

        x, _ = lax.fori_loop(0, len(self.dag), step, (x, seq_key))
        test_token = jr.choice(test_key, self.vocab_size)
        x = x.at[-1].set(test_token)
        y = pi[test_token]
        return x, y

    def bayes(self, seq):
        s, seq = seq[-1], seq[:-1]
        counts = jnp.zeros(self.vocab_size)
        counts = counts.at[seq].add(seq[self.dag] == s)
        counts += self.alpha
        return counts / counts.sum()
"""


def _simple_pytree_standin():
    """A stand-in ``simple_pytree`` module: ``Pytree`` subclasses register as JAX pytrees whose leaves are the
    instance attributes not declared with ``static_field()`` (those ride along as static data)."""
    import jax

    mod = types.ModuleType("simple_pytree")

    class _Static:
        pass

    def static_field():
        return _Static()

    class Pytree:
        def __init_subclass__(cls, **kw):
            super().__init_subclass__(**kw)
            static = sorted({k for c in cls.__mro__ for k, v in vars(c).items() if isinstance(v, _Static)})

            def flatten(obj):
                d = vars(obj)
                keys = tuple(sorted(k for k in d if k not in static))
                return [d[k] for k in keys], (keys, tuple((k, d[k]) for k in static if k in d))

            def unflatten(aux, children):
                obj = object.__new__(cls)
                keys, st = aux
                for k, v in zip(keys, children):
                    obj.__dict__[k] = v
                for k, v in st:
                    obj.__dict__[k] = v
                return obj

            jax.tree_util.register_pytree_node(cls, flatten, unflatten)

    mod.Pytree, mod.static_field = Pytree, static_field
    return mod


def load_official():
    """``(catformer, problems)``: the official modules built from the stored source (JAX must be installed;
    float64 is switched on)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    if "_popgrad_official_catformer" in sys.modules:
        return sys.modules["_popgrad_official_catformer"], sys.modules["_popgrad_official_problems"]
    try:
        import simple_pytree  # noqa: F401
    except ImportError:
        sys.modules["simple_pytree"] = _simple_pytree_standin()
    out = []
    for name, src in (("_popgrad_official_catformer", OFFICIAL_CATFORMER_SOURCE),
                      ("_popgrad_official_problems", OFFICIAL_PROBLEMS_SOURCE)):
        mod = types.ModuleType(name)
        exec(compile(src, f"<official {name[18:]}.py>", "exec"), mod.__dict__)
        sys.modules[name] = mod
        out.append(mod)
    return tuple(out)


def to_official(cf, model, params, key=0):
    """The official ``Transformer`` of ``model``'s sizes holding popgrad's ``params`` (as JAX arrays)."""
    import jax.numpy as jnp
    from jax import random as jr

    off = cf.Transformer(seq_len=model.T, vocab_size=model.S, heads=list(model.heads), key=jr.PRNGKey(key))
    off.wte, off.wpe, off.W = (jnp.asarray(params[k]) for k in ("wte", "wpe", "W"))
    for l in range(model.n_layers):
        off.A[l] = jnp.asarray(params[f"A{l + 1}"])
        off.V[l] = jnp.asarray(params[f"V{l + 1}"])
        lay = off.mlps[l].layers
        lay[0].W, lay[0].b = jnp.asarray(params[f"mlp{l + 1}_W1"]), jnp.asarray(params[f"mlp{l + 1}_b1"])
        lay[1].W, lay[1].b = jnp.asarray(params[f"mlp{l + 1}_W2"]), jnp.asarray(params[f"mlp{l + 1}_b2"])
    return off


def from_official(model, off) -> dict:
    """popgrad's parameter mapping from an official ``Transformer`` (or its gradient pytree)."""
    p = {"wte": off.wte, "wpe": off.wpe, "W": off.W}
    for l in range(model.n_layers):
        p[f"A{l + 1}"], p[f"V{l + 1}"] = off.A[l], off.V[l]
        lay = off.mlps[l].layers
        p[f"mlp{l + 1}_W1"], p[f"mlp{l + 1}_b1"] = lay[0].W, lay[0].b
        p[f"mlp{l + 1}_W2"], p[f"mlp{l + 1}_b2"] = lay[1].W, lay[1].b
    return {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}


# ---------------------------------------------------------------------------------------------- tests
def _jax():
    pytest.importorskip("jax")
    return load_official()


def _random_point(model, seed):
    """Every parameter nonzero: the official law plus N(0, 0.3²) on every entry (A, W2, biases, W included)."""
    rng = np.random.default_rng(seed)
    p = model.init(1.0, seed)
    return {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize("S,T,heads,eps", [(2, 4, (1, 1), 0.0), (3, 6, (1, 1), 0.1), (3, 5, (1, 1, 1), 0.0)])
def test_loss_and_grad_equal_jax_autodiff_of_the_official_class(S, T, heads, eps):
    cf, _ = _jax()
    import jax
    import jax.numpy as jnp

    model = pg.Transformer(S, T, heads=heads)
    params = _random_point(model, seed=S * 100 + T)
    rng = np.random.default_rng(7)
    seqs = rng.integers(0, S, size=(50, T))
    w = rng.random((50, S)) * (rng.random((50, 1)) < 0.8)  # some all-zero rows, as an enumeration has

    def loss(off):
        return -jnp.sum(jnp.asarray(w) * jnp.log(off(jnp.asarray(seqs)) + eps))

    L_j, g_j = jax.jit(jax.value_and_grad(loss))(to_official(cf, model, params))
    L, g = model.loss_and_grad_rows(params, seqs, w, eps)
    assert abs(L - float(L_j)) <= 1e-12 * abs(float(L_j))
    gj = from_official(model, g_j)
    assert set(gj) == set(g)
    for k in g:
        assert _rel(g[k], gj[k]) <= 1e-12, k
    f_j = np.asarray(to_official(cf, model, params)(jnp.asarray(seqs)))
    assert _rel(model.predict(params, seqs), f_j) <= 1e-12


def test_layer1_attention_is_the_notebooks_get_attn():
    cf, _ = _jax()
    import jax.numpy as jnp
    from jax import nn

    model = pg.Transformer(3, 5)
    params = _random_point(model, 3)
    seqs = np.random.default_rng(1).integers(0, 3, size=(20, 5))
    off = to_official(cf, model, params)
    x = off.embed(jnp.asarray(seqs))  # tf_with_mlp.ipynb's get_attn(x, model, i=0)
    a = jnp.einsum("...ij,jk,...lk -> ...il", x, off.A[0][0], x)
    a = nn.softmax(jnp.where(jnp.tri(5), a, -jnp.inf))
    assert _rel(model.layer1_attention(params, seqs)[:, 0], np.asarray(a)) <= 1e-12


def test_init_follows_the_official_law():
    """Zero where the official init is zero, the same shapes, and N(0, 1/d) entries elsewhere (the official draw's
    own statistics on the same entries agree)."""
    cf, _ = _jax()
    model = pg.Transformer(10, 20)
    off = from_official(model, cf.Transformer(seq_len=20, vocab_size=10, heads=[1, 1],
                                              key=__import__("jax").random.PRNGKey(0)))
    ours = model.init(1.0, 0)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in off.items()}
    d = model.d
    for k in ours:
        zero_off = not np.any(off[k])
        assert zero_off == (not np.any(ours[k])), k
        if not zero_off:
            for v in (ours[k], off[k]):
                assert abs(np.std(v) * math.sqrt(d) - 1) < 0.15, k
                assert abs(np.mean(v)) * math.sqrt(d) < 0.15, k
