"""Argument validation shared by every public function (one place).

Conventions, as NumPy and scikit-learn use them: a value of the wrong *type*
raises :class:`ArgumentTypeError` (a ``TypeError``), a value of the right type
but out of range raises ``ValueError``; both messages name the argument, what
it must be, and what was given. :class:`ArgumentTypeError` is also a
``ValueError`` so that code written against popgrad 0.1 (which raised
``ValueError`` for both) keeps working.

Validators convert once at the boundary; kernels then trust their input.
"""
from __future__ import annotations

import math
import os
import sys
import warnings

import numpy as np

__all__ = [
    "ArgumentTypeError",
    "as_int",
    "as_real",
    "as_eps",
    "as_bool",
    "as_permutation",
    "as_rng",
    "as_square",
    "as_heads",
    "as_seqs",
    "is_int",
    "warn_inf",
    "count_text",
]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (a ``TypeError``; also a ``ValueError`` for popgrad 0.1 callers)."""


def is_int(x) -> bool:
    """True for a Python or NumPy integer that is not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def as_int(x, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``int(x)`` after checking that ``x`` is an integer (not a bool) within ``[minimum, maximum]``."""
    parts = [f"{op} {b}" for op, b in ((">=", minimum), ("<=", maximum)) if b is not None]
    want = f"{name} must be an integer" + (" " + " and ".join(parts) if parts else "")
    if not is_int(x):
        raise ArgumentTypeError(f"{want}, got {x!r}")
    v = int(x)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise ValueError(f"{want}, got {v}")
    return v


def as_real(x, name: str, minimum: float | None = None, strict: bool = False, hint: str = "") -> float:
    """``float(x)`` after checking that ``x`` is a finite real number (not a bool, not a string),
    ``> minimum`` (``strict``) or ``>= minimum``. ``hint`` is appended to the message."""
    if minimum == 0 and strict:
        want = f"{name} must be a positive finite number{hint}"
    else:
        want = f"{name} must be a finite number" + ("" if minimum is None else f" {'>' if strict else '>='} {minimum:g}") + hint
    msg = f"{want}, got {x!r}"
    if isinstance(x, (bool, np.bool_, str, bytes)):
        raise ArgumentTypeError(msg)
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise ArgumentTypeError(msg) from None
    if not math.isfinite(v):
        raise ValueError(f"{want}, got {v}" if minimum is not None else f"{name} must be finite, got {v}")
    if minimum is not None and (v <= minimum if strict else v < minimum):
        raise ValueError(f"{want}, got {v!r}")
    return v


def as_bool(x, name: str) -> bool:
    """``x`` when it is a bool (Python or NumPy); a string such as ``"False"`` is refused, not read as true."""
    if not isinstance(x, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, got {x!r}")
    return bool(x)


def as_permutation(perm, n: int, name: str = "perm") -> np.ndarray:
    """``perm`` as an int64 array holding each of ``0 .. n-1`` exactly once (a relabeling of ``n`` tokens)."""
    arr = np.asarray(perm)
    if arr.dtype.kind not in "iu" and not (arr.dtype.kind == "O" and all(is_int(x) for x in arr.ravel())):
        raise ArgumentTypeError(f"{name} must be a permutation of 0..{n - 1} (integers), got {perm!r}")
    arr = arr.astype(np.int64)
    if arr.shape != (n,) or not np.array_equal(np.sort(arr), np.arange(n)):
        raise ValueError(f"{name} must be a permutation of 0..{n - 1} (each token exactly once), got "
                         f"{arr.tolist() if arr.size <= 20 else arr.shape}")
    return arr


def as_rng(seed, name: str = "seed") -> np.random.Generator:
    """``numpy.random.default_rng(seed)`` after checking ``seed``: ``None``, an integer ``>= 0`` (or a
    sequence of them), or a NumPy ``Generator`` / ``SeedSequence`` / ``BitGenerator``; the error names
    ``name`` (NumPy's own message does not)."""
    if seed is None or isinstance(seed, (np.random.Generator, np.random.SeedSequence, np.random.BitGenerator)):
        return np.random.default_rng(seed)
    if is_int(seed):
        if seed < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {int(seed)}")
        return np.random.default_rng(int(seed))
    if isinstance(seed, (list, tuple, np.ndarray)) and all(is_int(x) for x in np.ravel(np.asarray(seed, dtype=object))):
        if any(int(x) < 0 for x in np.ravel(np.asarray(seed, dtype=object))):
            raise ValueError(f"{name} must hold integers >= 0, got {seed!r}")
        return np.random.default_rng(seed)
    raise ArgumentTypeError(f"{name} must be an integer >= 0 (or None), got {seed!r}")


def as_eps(task, eps) -> float:
    """The loss perturbation: ``task.default_eps`` (``T_eff**-0.5``) for ``None``, else a finite number ``>= 0``."""
    if eps is None:
        return float(task.default_eps)
    msg = f"eps must be a finite number >= 0 (or None for T_eff**-0.5), got {eps!r}"
    if isinstance(eps, (bool, np.bool_, str, bytes)):
        raise ArgumentTypeError(msg)
    try:
        v = float(eps)
    except (TypeError, ValueError):
        raise ArgumentTypeError(msg) from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"eps must be a finite number >= 0 (or None for T_eff**-0.5), got {v}")
    return v


def as_square(M, name: str) -> np.ndarray:
    """A finite float64 square matrix, or an error naming the first bad entry."""
    return _as_squares(M, name, 2, "a real square matrix", "a square matrix")


def as_heads(M, name: str) -> np.ndarray:
    """A finite float64 array of shape ``(k, n, n)``: one square matrix per head."""
    what = "shape (k, n, n), one square matrix per head"
    return _as_squares(M, name, 3, f"a real array of {what}", what)


def as_reduced(A1, A2, T: int, S: int, k: int | None = None, square=as_square) -> tuple:
    """The reduced model's ``(A1, A2)`` checked against a task's sizes: ``(T, T)``/``(S, S)`` (``k=None``, a
    single-parent task; each converted by ``square``, :func:`as_square` or a fast path over it), or
    ``(k, T, T)``/``(k, S, S)`` for ``k`` heads (``(T, T)``/``(S, S)`` accepted when ``k = 1``)."""
    if k is not None:
        if k == 1 and np.ndim(A1) == 2:
            A1 = np.asarray(A1)[None]
        if k == 1 and np.ndim(A2) == 2:
            A2 = np.asarray(A2)[None]
        A1, A2 = as_heads(A1, "A1"), as_heads(A2, "A2")
        want1, want2 = ("(k, T, T)", (k, T, T)), ("(k, S, S)", (k, S, S))
    else:
        A1, A2 = square(A1, "A1"), square(A2, "A2")
        want1, want2 = ("(T, T)", (T, T)), ("(S, S)", (S, S))
    for name, M, (sym, want) in (("A1", A1, want1), ("A2", A2, want2)):
        if M.shape != want:
            raise ValueError(f"{name} must have shape {sym} = ({', '.join(map(str, want))}) for this task, got {M.shape}")
    return A1, A2


def _as_squares(M, name, ndim, kind, shape_text) -> np.ndarray:
    """A finite float64 array whose last two axes are square (``ndim`` axes in all)."""
    raw = M if isinstance(M, np.ndarray) else None
    try:
        if raw is None:
            raw = np.asarray(M)
        if raw.dtype.kind in "USVaMmc" or (raw.dtype.kind == "O" and any(
                isinstance(x, (str, bytes, complex)) for x in raw.ravel())):
            raise TypeError(raw.dtype)
        M = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        got = f", got an array of dtype {raw.dtype}" if raw is not None else f", got {type(M).__name__}"
        raise ArgumentTypeError(f"{name} must be {kind} (real numbers{got})") from None
    if M.ndim != ndim or M.shape[-1] != M.shape[-2]:
        have = "have" if ndim == 3 else "be"
        raise ValueError(f"{name} must {have} {shape_text}, got shape {M.shape}")
    if not np.all(np.isfinite(M)):
        idx = tuple(int(x) for x in np.argwhere(~np.isfinite(M))[0])
        where = ", ".join(map(str, idx))
        raise ValueError(f"{name}[{where}] = {M[idx]} is not finite: {name} must be finite (replace inf/NaN)")
    return M


def as_seqs(seqs, T, S=None) -> np.ndarray:
    """Integer token sequences of shape ``(n, T)`` (a single ``(T,)`` sequence is promoted), tokens in ``0..S-1``."""
    seqs = np.asarray(seqs)
    if seqs.ndim == 1:
        seqs = seqs[None, :]
    if seqs.ndim != 2 or seqs.shape[1] != T:
        raise ValueError(f"seqs must have shape (n, T) with T = {T} (the size of A1), got shape {seqs.shape}")
    if seqs.dtype.kind not in "iu":
        if seqs.dtype.kind == "f" and np.all(np.isfinite(seqs)) and np.all(seqs == np.round(seqs)):
            seqs = seqs.astype(np.int64)
        else:
            raise ArgumentTypeError(f"seqs must hold integer tokens, got dtype {seqs.dtype}")
    seqs = seqs.astype(np.int64, copy=False)
    if seqs.size and seqs.min() < 0:
        raise ValueError(f"seqs has a negative token {int(seqs.min())}: tokens must be in 0..S-1")
    if S is not None and seqs.size and seqs.max() >= S:
        raise ValueError(
            f"seqs has token {int(seqs.max())} but A2 is {S}×{S}: tokens must be in 0..{S - 1}"
        )
    return seqs


def _outside_level() -> int:
    """The ``stacklevel`` that attributes a warning issued by this module's caller to the first caller outside
    popgrad."""
    pkg = os.path.dirname(os.path.abspath(__file__))
    level, frame = 2, sys._getframe(2)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(pkg):
        frame, level = frame.f_back, level + 1
    return level


def warn_inf(where: str) -> None:
    """RuntimeWarning for an infinite loss, attributed to the first caller outside popgrad."""
    level = _outside_level()
    warnings.warn(
        f"{where}: the loss is infinite: with eps = 0 some token has zero predicted mass but positive "
        "weight (use eps > 0, e.g. eps=None for T_eff**-0.5); gradients are undefined (NaN)",
        RuntimeWarning,
        stacklevel=level,
    )


def warn_grad_overflow(where: str, grads, params) -> bool:
    """RuntimeWarning when a finite loss has a gradient with inf or NaN entries (float64 overflow in the
    backward pass: the full model's gradients grow with products of its parameters); returns whether it
    warned. Attributed to the first caller outside popgrad, like :func:`warn_inf`."""
    bad = sum(int(np.size(g) - np.count_nonzero(np.isfinite(g))) for g in grads)
    if not bad:
        return False
    total = sum(int(np.size(g)) for g in grads)
    big = max((float(np.max(np.abs(p))) for p in params if np.size(p)), default=0.0)
    level = _outside_level()
    warnings.warn(
        f"{where}: the loss is finite but {bad:,} of {total:,} gradient entries are inf or NaN: the backward "
        f"pass overflows float64 at these parameters (largest |entry| {big:.3g}); scale the parameters down "
        "(a smaller init or learning rate)",
        RuntimeWarning,
        stacklevel=level,
    )
    return True


def count_text(n: int) -> str:
    """An integer for a message: ``"59,049"``, or ``"about 10^4932"`` from 10**15 on (never ``str`` of a
    huge integer: Python refuses more than 4300 digits, and nobody reads them)."""
    n = int(n)
    if abs(n) < 10**15:
        return f"{n:,}"
    return f"about 10^{math.log10(abs(n)):.0f}"
