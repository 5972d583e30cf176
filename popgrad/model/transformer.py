"""The standard transformer of the official ``tf_with_mlp.ipynb`` (Figure 8 of the paper), in NumPy.

This is the ``Transformer`` class of the official ``catformer.py`` (its ``muLinear`` and ``MLP`` included),
written as a :class:`popgrad.Model`: a reference forward (:meth:`Transformer.predict`) and its reverse mode
(:meth:`Transformer.loss_and_grad_rows`), vectorised over rows. The exact population loss and gradient come
from the generic exact engine (it sums ``loss_and_grad_rows`` over the enumeration with the exact weights);
a sampled batch is the same call with the batch's soft labels.

**The model.** For a sequence ``s`` of length ``T`` over ``[S]``, width ``d = S + T``, layers
``ℓ = 1 … L`` (one head each)::

    h⁰_t   = wte[s_t] + wpe[t]                                  # trained embeddings, (S, d) and (T, d)
    P      = softmax_rows(MASK(h Aℓ hᵀ))                         # row t attends to j ≤ t (diagonal included)
    u      = (P h) Vℓ                                            # value matrix (d, d)
    δ      = relu(u W1ℓ + √d b1ℓ) W2ℓ + √d b2ℓ                   # the official MLP, widths [d, d, d]
    hℓ     = hℓ⁻¹ + δ                                            # residual stream
    f      = softmax(h^L_{T-1} W)                                # readout of the last position, W (d, S)

``muLinear(x) = x (W √(out/in)) + b √out`` is the official muP-style layer: with widths ``[d, d, d]`` the
weight factor is 1 and the bias factor ``√d``. Parameters, by name: ``wte``, ``wpe``; per layer ``ℓ``
``Aℓ`` (shape ``(1, d, d)``, the official ``A[ℓ-1]``), ``Vℓ``, ``mlpℓ_W1``, ``mlpℓ_b1``, ``mlpℓ_W2``,
``mlpℓ_b2``; and ``W``.

**The official initialisation** (:meth:`Transformer.init` with ``scale = 1``): ``Aℓ = 0``, ``W = 0``, the
MLP's last layer ``W2 = 0``, every bias 0, and ``Vℓ``, ``mlpℓ_W1``, ``wte``, ``wpe`` each
``N(0, 1)/√d`` -- drawn with popgrad's generator (``numpy.random.default_rng``), not JAX's keys, so the
same law but not the same draw.

The reverse mode is written *complex-safe* (no ``abs``, ``max`` or comparisons on complex values; softmax is
stabilised with the real parts' maximum, ReLU's gate reads the real part), so a complex-step
Hessian-vector product may pass complex parameters: ``complex_safe = True``.
"""
from __future__ import annotations

import math

import numpy as np

from .._validation import ArgumentTypeError, as_int, as_real, as_rng, is_int

__all__ = ["Transformer"]

#: Copies of the parameters a training holds at once (parameters, gradient, optimizer state, workspace).
TRAINING_COPIES = 4

#: Bytes of intermediate arrays one call of the row kernels keeps at once (rows are processed in chunks).
CHUNK_BYTES = 2**25


def _short(t) -> str:
    text = str(tuple(t))
    return text if len(text) <= 60 else text[:50] + "...)"


class Transformer:
    """The official ``Transformer`` of ``catformer.py`` (trained by ``tf_with_mlp.ipynb``), a :class:`popgrad.Model`.

    Parameters
    ----------
    S : int
        Alphabet size (``≥ 1``).
    T : int
        Sequence length, the query included (``≥ 1``).
    heads : sequence of int, default (1, 1)
        Heads per layer, ``L = len(heads) ≥ 1`` layers. Every entry must be 1: the official class takes a
        head count per layer but its value matrix is ``d × d``, so only one head per layer runs there.

    Attributes
    ----------
    S, T, heads
    d : int
        The width ``S + T`` of the residual stream.
    n_layers : int
    complex_safe : bool
        ``True``: :meth:`loss_and_grad_rows` accepts complex parameters (complex-step HVPs).

    Examples
    --------
    >>> import popgrad as pg
    >>> model = pg.Transformer(3, 5)
    >>> isinstance(model, pg.Model), model.d, list(model.param_shapes())[:4]
    (True, 8, ['wte', 'wpe', 'A1', 'V1'])
    >>> params = model.init(1.0, seed=0)          # the official law: W = 0, so the start predicts uniformly
    >>> model.predict(params, [[0, 1, 2, 0, 1]]).round(4)
    array([[0.3333, 0.3333, 0.3333]])
    >>> task = pg.Task(pg.chain(5), pg.DirichletPrior(3, 0.1))
    >>> res = pg.loss_and_grad(task, model, params, eps=0.0)   # the generic exact engine
    >>> round(res.loss, 6), res.grads["W"].shape
    (1.098612, (8, 3))
    """

    __slots__ = ("_S", "_T", "_heads", "_d")

    complex_safe = True

    def __init__(self, S, T, heads=(1, 1)):
        self._S = as_int(S, "S", minimum=1)
        self._T = as_int(T, "T", minimum=1)
        if isinstance(heads, (str, bytes)) or not hasattr(heads, "__len__"):
            raise ArgumentTypeError(f"heads must be a sequence of head counts per layer, e.g. (1, 1), got {heads!r}")
        if len(heads) < 1:
            raise ValueError("heads must name at least one layer, e.g. heads=(1, 1)")
        hs = []
        for i, m in enumerate(heads):
            if not is_int(m):
                raise ArgumentTypeError(f"heads[{i}] must be an integer number of heads, got {m!r}")
            if int(m) != 1:
                raise ValueError(
                    f"heads[{i}] = {int(m)}: the official Transformer runs one head per layer (its value matrix "
                    f"is d × d, so more heads do not compose); use heads=(1,) * n_layers, or popgrad.CatFormer "
                    f"for several heads")
            hs.append(1)
        self._heads = tuple(hs)
        self._d = self._S + self._T
        _check_size(self)

    # ----------------------------------------------------------- attributes
    @property
    def S(self) -> int:
        return self._S

    @property
    def T(self) -> int:
        return self._T

    @property
    def heads(self) -> tuple:
        return self._heads

    @property
    def d(self) -> int:
        return self._d

    @property
    def n_layers(self) -> int:
        return len(self._heads)

    def __repr__(self):
        return f"Transformer(S={self._S}, T={self._T}, heads={self._heads})"

    def __eq__(self, other):
        return isinstance(other, Transformer) and (self._S, self._T, self._heads) == \
            (other._S, other._T, other._heads)

    def __hash__(self):
        return hash(("Transformer", self._S, self._T, self._heads))

    # ----------------------------------------------------------- parameters
    def param_shapes(self) -> dict:
        """Name → shape, in a fixed order: ``wte``, ``wpe``, per layer ``Aℓ Vℓ mlpℓ_W1 mlpℓ_b1 mlpℓ_W2
        mlpℓ_b2``, then ``W``."""
        S, T, d = self._S, self._T, self._d
        out = {"wte": (S, d), "wpe": (T, d)}
        for l, m in enumerate(self._heads, start=1):
            out[f"A{l}"] = (m, d, d)
            out[f"V{l}"] = (d, d)
            out[f"mlp{l}_W1"] = (d, d)
            out[f"mlp{l}_b1"] = (d,)
            out[f"mlp{l}_W2"] = (d, d)
            out[f"mlp{l}_b2"] = (d,)
        out["W"] = (d, S)
        return out

    def zeros(self) -> dict:
        """All-zero parameters (not the official start: see :meth:`init`)."""
        return {k: np.zeros(s) for k, s in self.param_shapes().items()}

    def init(self, scale=1.0, seed=0) -> dict:
        """The official initialisation law, drawn with ``numpy.random.default_rng(seed)``.

        ``Aℓ``, ``W``, ``mlpℓ_W2`` and the biases are 0; ``Vℓ``, ``mlpℓ_W1``, ``wte``, ``wpe`` are
        ``scale · N(0, 1)/√d`` entrywise (``scale = 1``: the official law), drawn in the official key order
        (per layer ``Vℓ`` then ``mlpℓ_W1``; then ``wte``, ``wpe``).

        Parameters
        ----------
        scale : float, default 1
            Factor on the random entries (``≥ 0``).
        seed : int
            Seed of ``numpy.random.default_rng``.
        """
        scale = as_real(scale, "scale", minimum=0.0)
        rng = as_rng(seed, "seed")
        d = self._d
        p = self.zeros()
        sd = scale / math.sqrt(d)
        with np.errstate(over="ignore"):
            for l in range(1, self.n_layers + 1):
                p[f"V{l}"] = sd * rng.standard_normal((d, d))
                p[f"mlp{l}_W1"] = sd * rng.standard_normal((d, d))
            p["wte"] = sd * rng.standard_normal((self._S, d))
            p["wpe"] = sd * rng.standard_normal((self._T, d))
        if not all(np.all(np.isfinite(a)) for a in p.values()):
            raise ValueError(f"scale = {scale:g} overflows: scale * N(0, 1) is not finite; use scale = 1 "
                             "(the official law)")
        return p

    def check_params(self, params) -> dict:
        """``params`` as a dict of contiguous finite arrays of this model's shapes (float64; complex128 where
        an entry is complex, for complex-step HVPs).

        Raises
        ------
        TypeError
            ``params`` is not a mapping name → array.
        ValueError
            A missing, extra or misshapen entry, or a non-finite value (the message names it).
        """
        shapes = self.param_shapes()
        if not hasattr(params, "keys") or not hasattr(params, "__getitem__"):
            raise ArgumentTypeError(f"params must be a mapping name -> array (model.init(1.0, seed)) for {self!r}, "
                                    f"got {type(params).__name__}")
        missing = [k for k in shapes if k not in params]
        if missing:
            raise ValueError(f"params lacks {_names(missing)} of {self!r}: start from model.init(1.0, seed) "
                             f"(names: {', '.join(shapes)})")
        extra = [k for k in params.keys() if k not in shapes]
        if extra:
            raise ValueError(f"params has {_names(extra)}, not a parameter of {self!r}: drop it "
                             f"(names: {', '.join(shapes)})")
        return {k: _finite(params[k], s, f"params[{k!r}]") for k, s in shapes.items()}

    # -------------------------------------------------------------- forward
    def predict(self, params, seqs) -> np.ndarray:
        """Next-token probabilities ``f(s) = softmax(h^L_{T-1} W)`` (the NumPy reference forward).

        Parameters
        ----------
        params : mapping name → array
        seqs : array_like of int, shape (n, T) or (T,)
            Tokens in ``0 … S-1``, query last.

        Returns
        -------
        f : ndarray, shape (n, S)
            Rows are distributions (float64; complex for complex parameters).
        """
        p = self.check_params(params)
        seqs = self._seqs(seqs)
        out = [self._forward(p, seqs[i:j])[0] for i, j in self._chunks(len(seqs))]
        return np.concatenate(out, axis=0) if out else np.zeros((0, self._S), dtype=_dtype(p))

    def default_eps(self, task) -> float:
        """``0``: the official loss is the plain cross entropy of the softmax readout (no ε)."""
        return 0.0

    def layer1_attention(self, params, seqs) -> np.ndarray:
        """The layer-1 attention ``softmax_rows(MASK(h⁰ A1 h⁰ᵀ))``: shape ``(n, 1, T, T)``, causal rows summing
        to 1 (the notebook's ``get_attn(x, model, i=0)``)."""
        p = self.check_params(params)
        seqs = self._seqs(seqs)
        h = p["wte"][seqs] + p["wpe"][None]
        out = []
        for k in range(p["A1"].shape[0]):
            Z = _bmm_t(_mm(h, p["A1"][k]), h)
            out.append(_softmax_rows(Z, np.tri(self._T, dtype=bool)))
        return np.stack(out, axis=1)

    # -------------------------------------------------------------- backward
    def loss_and_grad_rows(self, params, seqs, w, eps=0.0):
        """``(loss, grads)`` with ``loss = −Σ_n Σ_c w[n, c] log(f[n, c] + ε)`` (log-softmax when ``ε = 0``)
        and ``grads`` the gradient of ``loss`` by parameter name (the NumPy reference backward).

        Parameters
        ----------
        params : mapping name → array
            Real, or complex for a complex-step HVP (then ``loss`` and ``grads`` are complex).
        seqs : array_like of int, shape (n, T)
        w : array_like, shape (n, S)
            Row weights times targets (an enumeration's exact weights, or a batch's soft labels over ``n``).
        eps : float, default 0
            The loss perturbation ``ε ≥ 0``.
        """
        p = self.check_params(params)
        seqs = self._seqs(seqs)
        w = _weights(w, len(seqs), self._S)
        eps = as_real(eps, "eps", minimum=0.0)
        grads = {k: np.zeros(s, dtype=_dtype(p)) for k, s in self.param_shapes().items()}
        loss = 0.0
        for i, j in self._chunks(len(seqs)):
            loss = loss + self._rows(p, seqs[i:j], w[i:j], eps, grads)
        if not np.iscomplexobj(loss):
            loss = float(loss)
        return loss, grads

    # ------------------------------------------------------------ internals
    def _seqs(self, seqs) -> np.ndarray:
        seqs = np.asarray(seqs)
        if seqs.ndim == 1:
            seqs = seqs[None, :]
        if seqs.ndim != 2 or seqs.shape[1] != self._T:
            raise ValueError(f"seqs must have shape (n, T) with T = {self._T} for {self!r}, got shape {seqs.shape}")
        if seqs.dtype.kind not in "iu":
            if seqs.dtype.kind == "f" and np.all(np.isfinite(seqs)) and np.all(seqs == np.round(seqs)):
                seqs = seqs.astype(np.int64)
            else:
                raise ArgumentTypeError(f"seqs must hold integer tokens, got dtype {seqs.dtype}")
        seqs = seqs.astype(np.int64, copy=False)
        if seqs.size and (seqs.min() < 0 or seqs.max() >= self._S):
            bad = int(seqs.min()) if seqs.min() < 0 else int(seqs.max())
            raise ValueError(f"seqs has token {bad}: tokens must be in 0..{self._S - 1} for {self!r}")
        return seqs

    def _chunks(self, n):
        T, d = self._T, self._d
        per_row = 8 * 2 * self.n_layers * (4 * T * T + 8 * T * d) + 1
        step = max(1, CHUNK_BYTES // per_row)
        return [(i, min(n, i + step)) for i in range(0, n, step)]

    def _forward(self, p, seqs):
        """``(f, z, hL, logits-side caches)`` for one chunk; the last layer runs at the last position only."""
        T, d, L = self._T, self._d, self.n_layers
        rd = math.sqrt(d)
        mask = np.tri(T, dtype=bool)
        h = p["wte"][seqs] + p["wpe"][None]  # (n, T, d)
        cache = []
        for l in range(1, L + 1):
            last = l == L
            q = h[:, -1:, :] if last else h  # queries: only the last position feeds the readout
            A = p[f"A{l}"][0]
            qA = _mm(q, A)
            P = _softmax_rows(_bmm_t(qA, h), None if last else mask)
            att = np.matmul(P, h)
            u = _mm(att, p[f"V{l}"])
            a1 = _mm(u, p[f"mlp{l}_W1"]) + rd * p[f"mlp{l}_b1"]
            on = a1.real > 0
            m = np.where(on, a1, 0.0)
            delta = _mm(m, p[f"mlp{l}_W2"]) + rd * p[f"mlp{l}_b2"]
            cache.append((h, q, qA, P, att, u, on, m))
            if last:
                h = h[:, -1, :] + delta[:, 0, :]
            else:
                h = h + delta
        z = h @ p["W"]
        zr = z.real
        zmax = zr.max(axis=1, keepdims=True)
        e = np.exp(z - zmax)
        se = e.sum(axis=1, keepdims=True)
        return e / se, z - zmax - np.log(se), h, cache

    def _rows(self, p, seqs, w, eps, grads):
        """Loss of one chunk; adds its gradient into ``grads``."""
        n = len(seqs)
        T, d, S, L = self._T, self._d, self._S, self.n_layers
        rd = math.sqrt(d)
        f, logf, hL, cache = self._forward(p, seqs)
        pos = w != 0
        if eps == 0.0:
            loss = -np.sum(w[pos] * logf[pos])
            dz = -w + f * w.sum(axis=1, keepdims=True)
        else:
            fe = f + eps
            loss = -np.sum(w[pos] * np.log(fe[pos]))
            r = np.where(pos, -w / np.where(pos, fe, 1.0), 0.0)  # dL/df
            dz = f * (r - np.sum(f * r, axis=1, keepdims=True))
        grads["W"] += hL.T @ dz
        g = dz @ p["W"].T  # (n, d): adjoint of h^L at the last position
        for l in range(L, 0, -1):
            last = l == L
            h, q, qA, P, att, u, on, m = cache[l - 1]
            A = p[f"A{l}"][0]
            gq = g[:, None, :] if last else g  # adjoint of the layer's output at its query rows
            if last:
                dh = np.zeros_like(h, dtype=np.result_type(h, g))
                dh[:, -1, :] = g
            else:
                dh = g.copy()
            grads[f"mlp{l}_W2"] += _flat(m).T @ _flat(gq)
            grads[f"mlp{l}_b2"] += rd * _flat(gq).sum(axis=0)
            da1 = np.where(on, _mm(gq, p[f"mlp{l}_W2"].T), 0.0)
            grads[f"mlp{l}_W1"] += _flat(u).T @ _flat(da1)
            grads[f"mlp{l}_b1"] += rd * _flat(da1).sum(axis=0)
            du = _mm(da1, p[f"mlp{l}_W1"].T)
            grads[f"V{l}"] += _flat(att).T @ _flat(du)
            datt = _mm(du, p[f"V{l}"].T)  # (n, Tq, d)
            dh += np.matmul(np.swapaxes(P, 1, 2), datt)
            dP = _bmm_t(datt, h)  # (n, Tq, T)
            dZ = P * (dP - np.sum(P * dP, axis=2, keepdims=True))
            dqA = np.matmul(dZ, h)  # Z = qA hᵀ
            dh += np.matmul(np.swapaxes(dZ, 1, 2), qA)
            grads[f"A{l}"][0] += _flat(q).T @ _flat(dqA)
            dq = _mm(dqA, A.T)
            if last:
                dh[:, -1, :] += dq[:, 0, :]
            else:
                dh += dq
            g = dh
        gf = _flat(g)
        onehot = np.zeros((n * T, S))
        onehot[np.arange(n * T), seqs.ravel()] = 1.0
        grads["wte"] += onehot.T @ gf
        grads["wpe"] += g.sum(axis=0)
        return loss


# ============================================================ helpers
def _flat(x):
    return x.reshape(-1, x.shape[-1])


def _mm(x, M):
    """``x @ M`` for ``x (n, t, a)`` as one BLAS product."""
    return (x.reshape(-1, x.shape[-1]) @ M).reshape(x.shape[:-1] + (M.shape[1],))


def _bmm_t(a, b):
    """``a bᵀ`` per row: ``(n, i, k), (n, j, k) -> (n, i, j)``."""
    return np.matmul(a, np.swapaxes(b, 1, 2))


def _softmax_rows(Z, mask):
    """Row softmax of ``Z (n, i, j)``, entries outside ``mask (i, j)`` excluded; stabilised with the real parts'
    maximum (complex-safe)."""
    if mask is None:
        zmax = Z.real.max(axis=-1, keepdims=True)
        e = np.exp(Z - zmax)
    else:
        zmax = np.where(mask, Z.real, -np.inf).max(axis=-1, keepdims=True)
        e = np.exp(np.where(mask, Z - zmax, -np.inf))
    return e / e.sum(axis=-1, keepdims=True)


def _dtype(p):
    return np.complex128 if any(np.iscomplexobj(a) for a in p.values()) else np.float64


def _names(keys) -> str:
    keys = [repr(k) for k in keys]
    return ("entry " if len(keys) == 1 else "entries ") + ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")


def _finite(a, shape, name) -> np.ndarray:
    try:
        arr = np.asarray(a)
        dt = np.complex128 if np.iscomplexobj(arr) else np.float64
        arr = np.ascontiguousarray(arr, dtype=dt)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{name} must be a real array of shape {shape}") from None
    if arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {arr.shape}: start from model.init(1.0, seed)")
    if not np.all(np.isfinite(arr)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        raise ValueError(f"{name}{list(bad)} = {arr[bad]} is not finite: parameters must be finite")
    return arr


def _weights(w, n, S) -> np.ndarray:
    try:
        w = np.ascontiguousarray(w, dtype=np.float64)
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"w must be a real array of shape (n, S) = ({n}, {S})") from None
    if w.shape != (n, S):
        raise ValueError(f"w must have shape (n, S) = ({n}, {S}) (row weights times targets), got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError("w has a non-finite entry: row weights times targets must be finite")
    return w


def _check_size(model) -> None:
    """Refuse a model whose training cannot fit in memory, naming its size (as :class:`popgrad.CatFormer`):
    the parameters as float64, about :data:`TRAINING_COPIES` times over, against half of the memory this
    process may use (:func:`popgrad._io.memory_limit`). Python integers throughout: no overflow."""
    from .._io import memory_limit, size_text as _bytes

    S, T, d, L = model._S, model._T, model._d, len(model._heads)
    n = (S + T) * d + L * (4 * d * d + 2 * d) + d * S
    need = TRAINING_COPIES * 8 * n
    limit = memory_limit()
    if limit is None:
        limit = 2**40
    if need > limit // 2:
        count = f"{n:,}" if n < 10**15 else f"about 10^{len(str(n)) - 1}"
        raise ValueError(
            f"Transformer(S={S}, T={T}, heads={_short(model._heads)}) has {count} parameters (width d = {d}; "
            f"training holds about {_bytes(need)}), more than half of the {_bytes(limit)} this process may use: "
            f"use fewer layers, or a smaller S or T")
