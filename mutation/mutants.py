"""Mutation check of popgrad's formulas (``make mutants``; not run in CI: minutes, not seconds).

Two kinds of mutants, each applied to a private copy of the package and its
tests (``popgrad/``, ``tests/``, ``pyproject.toml``; numba's on-disk cache is
copied along, so only a mutated kernel file recompiles), then the test files
that should catch it are run (``pytest -x``, with a timeout):

* **targeted** (:data:`TARGETED`): hand-written wrong formulas in the core,
  kernels included (the four survivors of issue 23 first). Each names the
  tests that must kill it; a survivor here is a defect of the suite.
* **operators** (``--ast``): every arithmetic, comparison, boolean and
  numeric-constant mutation (:class:`_Points`) inside the formula functions of
  ``theory/`` and ``checks/`` listed in :data:`AST_SCOPE`, written back with
  ``ast.unparse``. Survivors are listed for a person to explain
  (``mutation/REPORT.md``).

A mutant is *killed* when the tests fail (or error, or time out; the report
says which), *survived* when they pass. Before any mutant the unmutated copy
must pass the same tests (the baseline), else the tool stops.

Usage::

    python mutation/mutants.py                 # targeted mutants
    python mutation/mutants.py --ast           # operator mutants of theory/ and checks/
    python mutation/mutants.py --all --jobs 2 --out mutation/last_run.md
    python mutation/mutants.py --list          # what would run
"""
from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

T_DPI = ["tests/theory/test_dpi_closed_forms.py", "tests/theory/test_dpi.py"]
T_INFO = ["tests/theory/test_dpi_closed_forms.py", "tests/theory/test_idealized_scale.py",
          "tests/theory/test_information.py"]
T_CHECKS = ["tests/checks/test_pinned.py", "tests/checks/test_validation.py"]
T_REF = ["tests/engine/test_reference_independence.py"]
T_SYM = ["tests/engine/test_reference_independence.py", "tests/engine/test_symmetry.py"]
T_FIELD = ["tests/theory/test_idealized_scale.py", "tests/checks/test_pinned.py", "tests/engine/test_field.py"]


@dataclass(frozen=True)
class Mutant:
    """One wrong formula: replace the only occurrence of ``old`` in ``path`` by ``new``."""

    id: str
    path: str
    old: str
    new: str
    tests: tuple
    note: str


def _m(id, path, old, new, tests, note):
    return Mutant(id, path, old, new, tuple(tests), note)


#: The targeted mutants. The first four survived the whole suite before issue 23.
TARGETED = (
    _m("dpi-mu-wrong-axis", "popgrad/theory/dpi.py",
       '"col": float((dev2 / mu[None, :]).sum()),', '"col": float((dev2 / mu[:, None]).sum()),', T_DPI,
       "‖(π-1μᵀ)D^{-1/2}‖² divided by μ along rows: 4.4× too large on CE_RARE"),
    _m("recovery-threshold-2C", "popgrad/checks/recovery.py",
       "threshold = 1.0 - C / task.T", "threshold = 1.0 - 2 * C / task.T", T_CHECKS,
       "graph recovery threshold 1 - C/T weakened to 1 - 2C/T"),
    _m("span-rtol-1e-2", "popgrad/engine/symmetry.py",
       "\nSPAN_RTOL = 1e-15\n", "\nSPAN_RTOL = 1e-2\n", T_SYM,
       "A2 within 1e-2 of span{I, 11ᵀ} projected onto it: 5 % error in dA2 at A2 = I + 0.005·noise"),
    _m("idealized-scale-beta0-over-T", "popgrad/theory/information.py",
       "return -(beta0 / (S * T)) * (P * (np.tril(g) - inner))", "return -(beta0 / T) * (P * (np.tril(g) - inner))",
       ["tests/theory/test_idealized_scale.py"], "idealized Stage-1 gradient β0/(S·T) → β0/T"),
    # ---- theory/
    _m("dpi-row-norm-axis", "popgrad/theory/dpi.py",
       '"row": float((mu[:, None] * dev2).sum()),', '"row": float((mu[None, :] * dev2).sum()),', T_DPI,
       "D^{1/2}(π-1μᵀ) weighted by μ of the column"),
    _m("dpi-reading-no-half", "popgrad/theory/dpi.py",
       "val = (1.0 - alphas[a]) / 2.0 * norms[b]", "val = (1.0 - alphas[a]) * norms[b]", T_DPI,
       "the paper's (1-α)/2 without the 1/2"),
    _m("dpi-gamma3-no-2", "popgrad/theory/dpi.py",
       "    gamma3 = gamma**3 / (2 * S)\n    out = []", "    gamma3 = gamma**3 / S\n    out = []", T_DPI,
       "γ³/(2S) → γ³/S in the readings"),
    _m("dpi-Q-squared", "popgrad/theory/dpi.py",
       "float(weights @ ((1.0 - qn[:, n]) * I)),", "float(weights @ ((1.0 - qn[:, n] ** 2) * I)),", T_DPI,
       "dpi_Q bound with ‖Q‖² instead of ‖Q‖"),
    _m("dpi-Q-wrong-pair", "popgrad/theory/dpi.py",
       "a, b = int(D[j, p]), int(D[p, j])", "a, b = int(D[p, j]), int(D[p, j])", T_DPI,
       "Q_j built from the wrong LCA distance"),
    _m("dpi-holds-sign", "popgrad/theory/dpi.py",
       "return bool(gap >= value - BOUND_TOL * max(1.0, abs(value)))",
       "return bool(gap >= value + 1e-3 * max(1.0, abs(value)))", T_DPI, "holds with a wrong slack"),
    _m("info-dobrushin-mean", "popgrad/theory/information.py",
       "dobrushin=float(0.5 * np.abs(pi[:, None, :] - pi[None, :, :]).sum(axis=2).max()),",
       "dobrushin=float(0.5 * np.abs(pi[:, None, :] - pi[None, :, :]).sum(axis=2).mean()),", T_INFO,
       "Dobrushin coefficient as a mean over pairs"),
    _m("info-gamma-no-S", "popgrad/theory/information.py",
       "gamma=float(min(gmin, np.sqrt(S * dev))),", "gamma=float(min(gmin, np.sqrt(dev))),", T_INFO,
       "γ from Assumption 2 without the S"),
    _m("info-kernel-transpose", "popgrad/theory/information.py",
       "return r[:, :, None] * atoms / r[:, None, :] - r[:, :, None] * r[:, None, :]",
       "return r[:, None, :] * atoms / r[:, :, None] - r[:, :, None] * r[:, None, :]", T_INFO,
       "K = D^{-1/2} π D^{1/2} - √μ√μᵀ (the wrong similarity)"),
    # ---- checks/
    _m("recovery-mean", "popgrad/checks/recovery.py",
       "value = float(attn.min())", "value = float(attn.mean())", T_CHECKS, "graph recovery value: mean over rows"),
    _m("recovery-no-argmax", "popgrad/checks/recovery.py",
       "return res._replace(passed=res.passed and bool(argmax_ok.all()))", "return res._replace(passed=res.passed)",
       T_CHECKS, "graph recovery ignores the argmax condition"),
    _m("field-dpi-normalized-by-competitor", "popgrad/checks/scale.py",
       "mm = float((m_row[p] - m_row[others].max()) / abs(m_row[p]))",
       "mm = float((m_row[p] - m_row[others].max()) / abs(m_row[others].max()))", T_CHECKS,
       "field DPI margin normalized by the competitor"),
    _m("field-dpi-threshold", "popgrad/checks/scale.py",
       'CheckResult("field_dpi", value, 0.0, bool(value > 0),', 'CheckResult("field_dpi", value, 0.0, bool(value > -0.5),',
       T_CHECKS, "field DPI passes with a losing parent"),
    _m("field-dpi-diagonal-competes", "popgrad/checks/scale.py",
       "others = [j for j in range(i) if j != p]\n        m_row, g_row = S * M[i, :i], g[i, :i]",
       "others = [j for j in range(i + 1) if j != p]\n        m_row, g_row = S * M[i, :i + 1], g[i, :i + 1]",
       T_CHECKS, "field DPI lets the diagonal compete"),
    # ---- engine/ and its kernels
    _m("kernel-single-no-rbar", "popgrad/engine/_kernels/single.py",
       "dl[i] = a[i] * (r[s[i]] - rbar)", "dl[i] = a[i] * r[s[i]]", T_SYM + ["tests/engine/test_exact.py"],
       "direct kernel: δ_i without r̄ (softmax Jacobian of layer 2 dropped)"),
    _m("kernel-symmetrize-off", "popgrad/engine/_kernels/single.py",
       "o = off / (S * (S - 1))", "o = off / (S * S)", T_SYM, "orbit-averaged dA2: wrong off-diagonal count"),
    _m("kernel-prefix-dA2", "popgrad/engine/_kernels/prefix.py",
       "dA2[q, b] += pij * hv", "dA2[q, b] += hv", T_REF, "prefix kernel: dA2 without P[i, j]"),
    _m("kernel-multi-no-rbar", "popgrad/engine/_kernels/multi.py",
       "dl[i] = a[i] * (r[s[i]] - rbar)", "dl[i] = a[i] * r[s[i]]", T_REF, "k-head kernel: δ_i without r̄"),
    _m("kernel-field-enum-eps", "popgrad/engine/_kernels/field.py",
       "r[c] = w[c] / (f + eps)", "r[c] = w[c] / (f + 2.0 * eps)", T_FIELD, "enumerated field with 2ε"),
    _m("field-query-count", "popgrad/engine/field.py",
       "g1 = 1.0 / ((m + 1.0) / T + eps)", "g1 = 1.0 / (m / T + eps)", T_FIELD,
       "count generating function forgets the query's own token"),
    _m("field-scale", "popgrad/engine/field.py",
       "return -(float(beta0) / T) * P * (G - np.sum(P * G, axis=1, keepdims=True))",
       "return -(float(beta0) / (2 * T)) * P * (G - np.sum(P * G, axis=1, keepdims=True))", T_FIELD,
       "field gradient β0/T → β0/(2T)"),
    _m("engine-jacobian", "popgrad/engine/result.py",
       "dA1 = P * (G - np.sum(P * G, axis=-1, keepdims=True))", "dA1 = P * G", T_REF,
       "layer-1 softmax Jacobian dropped (shared with the reference before issue 23)"),
    _m("orbit-sizes-comb", "popgrad/engine/symmetry.py",
       "return np.array([math.perm(S, m) for m in range(S + 1)], dtype=np.float64)",
       "return np.array([math.comb(S, m) for m in range(S + 1)], dtype=np.float64)", T_SYM,
       "orbit size S!/(S-m)! → binomial"),
    # ---- task/_weights (the exact weights' kernel)
    _m("weights-query-not-uniform", "popgrad/task/_weights.py",
       "        p = prior_w[k] / S\n        for i in range(T - 1):", "        p = prior_w[k]\n        for i in range(T - 1):",
       T_REF + ["tests/task/test_foundation.py"], "w(s, c) without the query's 1/S"),
    _m("weights-root-by-parent", "popgrad/task/_weights.py",
       "p *= mu[k, s[i]]", "p *= atoms[k, s[i], s[i]]", T_REF + ["tests/task/test_foundation.py"],
       "roots drawn from π's diagonal instead of μ"),
)


# --------------------------------------------------------------- operators
#: Functions whose bodies the operator mutants touch: the formulas of theory/ and checks/.
AST_SCOPE = {
    "popgrad/theory/dpi.py": (["_readings_from_info", "_holds", "_q_norms", "_build_report"], T_DPI),
    "popgrad/theory/information.py": (
        ["_kernels", "chain_information", "lca_distances", "pairwise_joint", "_h_table", "_idealized_from_graph",
         "idealized_grad_A1"], T_INFO),
    "popgrad/checks/recovery.py": (["check_graph_recovery"], T_CHECKS),
    "popgrad/checks/scale.py": (["check_field_dpi"], T_CHECKS),
    "popgrad/checks/results.py": (["_result"], T_CHECKS),
}

_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult,
        ast.FloorDiv: ast.Div}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}


class _Points(ast.NodeTransformer):
    """Counts the mutation points inside the scoped functions; with ``target = k`` mutates the k-th.

    Points: a binary operator (``+ - * / ** //`` swapped as in ``_BIN``), a comparison
    (``< <= > >= == !=``), ``and``/``or``, a unary minus removed, a numeric constant
    ``c → 2c`` (``0 → 1``), a slice or index ``i`` shifted by one is not tried.
    """

    def __init__(self, functions, target=None):
        self.functions = set(functions)
        self.target = target
        self.count = 0
        self.inside = 0
        self.described = None

    def _hit(self, what):
        k = self.count
        self.count += 1
        if k == self.target:
            self.described = what
            return True
        return False

    def visit_FunctionDef(self, node):
        if node.name in self.functions:
            self.inside += 1
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                body = body[1:]  # skip the docstring
            for stmt in body:
                self.visit(stmt)
            self.inside -= 1
            return node
        return self.generic_visit(node)

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if self.inside and type(node.op) in _BIN:
            new = _BIN[type(node.op)]
            if self._hit(f"line {node.lineno}: {type(node.op).__name__} → {new.__name__}"):
                node.op = new()
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if self.inside:
            for n, op in enumerate(node.ops):
                if type(op) in _CMP and self._hit(f"line {node.lineno}: {type(op).__name__} → "
                                                  f"{_CMP[type(op)].__name__}"):
                    node.ops[n] = _CMP[type(op)]()
        return node

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        if self.inside and self._hit(f"line {node.lineno}: {type(node.op).__name__} → "
                                     f"{_BOOL[type(node.op)].__name__}"):
            node.op = _BOOL[type(node.op)]()
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if self.inside and isinstance(node.op, ast.USub) and self._hit(f"line {node.lineno}: unary minus removed"):
            return node.operand
        return node

    def visit_Constant(self, node):
        if self.inside and type(node.value) in (int, float) and not isinstance(node.value, bool):
            v = node.value
            new = 1 if v == 0 else 2 * v
            if self._hit(f"line {node.lineno}: constant {v!r} → {new!r}"):
                return ast.copy_location(ast.Constant(new), node)
        return node

    def visit_Subscript(self, node):
        # indices are positions, not formulas: mutate the value only (a[i] stays a[i])
        node.value = self.visit(node.value)
        if isinstance(node.slice, (ast.Name, ast.Constant)):
            return node
        node.slice = self.visit(node.slice)
        return node


def ast_mutants():
    """Every operator mutant of :data:`AST_SCOPE` as a :class:`Mutant` (``new`` = the whole mutated source)."""
    out = []
    for path, (functions, tests) in AST_SCOPE.items():
        src = open(os.path.join(ROOT, path)).read()
        counter = _Points(functions)
        counter.visit(ast.parse(src))
        for k in range(counter.count):
            p = _Points(functions, target=k)
            tree = p.visit(ast.parse(src))
            new = ast.unparse(ast.fix_missing_locations(tree))
            short = path.split("/", 1)[1]
            out.append(Mutant(f"ast:{short}#{k}", path, None, new, tuple(tests), p.described))
    return out


# ---------------------------------------------------------------- running
def make_copy(dest):
    """Copy ``popgrad/``, ``tests/`` and ``pyproject.toml`` into ``dest`` with their modification times (numba caches stay valid)."""
    ignore = shutil.ignore_patterns(".hypothesis", ".pytest_cache", "*.egg-info")
    for d in ("popgrad", "tests"):
        shutil.copytree(os.path.join(ROOT, d), os.path.join(dest, d), copy_function=shutil.copy2, ignore=ignore)
    for f in ("pyproject.toml",):  # the pytest configuration
        if os.path.exists(os.path.join(ROOT, f)):
            shutil.copy2(os.path.join(ROOT, f), os.path.join(dest, f))


def apply(dest, m: Mutant):
    target = os.path.join(dest, m.path)
    src = open(os.path.join(ROOT, m.path)).read()
    if m.old is None:
        new = m.new
    else:
        n = src.count(m.old)
        if n != 1:
            raise SystemExit(f"mutant {m.id}: {m.old!r} occurs {n} times in {m.path} (must be once): update TARGETED")
        new = src.replace(m.old, m.new)
    with open(target, "w") as f:
        f.write(new)


def restore(dest, m: Mutant):
    shutil.copy2(os.path.join(ROOT, m.path), os.path.join(dest, m.path))


def run_tests(dest, tests, timeout):
    """``(status, seconds, last line)`` of ``pytest -x`` on ``tests`` in the copy."""
    env = dict(os.environ, PYTHONPATH=dest, NUMBA_NUM_THREADS="1")
    env.pop("POPGRAD_HYPOTHESIS_PROFILE", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=dest, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.perf_counter() - t0, f"timeout after {timeout} s"
    dt = time.perf_counter() - t0
    lines = [x for x in (r.stdout + r.stderr).strip().splitlines() if x.strip()]
    last = lines[-1] if lines else ""
    if r.returncode == 0:
        return "survived", dt, last
    if r.returncode == 1:
        return "killed", dt, last
    return f"killed (error {r.returncode})", dt, last


def _worker(mutants, timeout, results, log):
    with tempfile.TemporaryDirectory(prefix="popgrad-mutants-") as dest:
        make_copy(dest)
        for m in mutants:
            apply(dest, m)
            try:
                status, dt, last = run_tests(dest, m.tests, timeout)
            finally:
                restore(dest, m)
            results[m.id] = (status, dt, last)
            log(f"{status:18s} {dt:6.1f}s  {m.id}  ({m.note})")


def baseline(tests, timeout):
    """The unmutated copy on ``tests``; also checks that the copy, not an installed popgrad, is imported."""
    with tempfile.TemporaryDirectory(prefix="popgrad-mutants-base-") as dest:
        make_copy(dest)
        env = dict(os.environ, PYTHONPATH=dest)
        where = subprocess.run([sys.executable, "-c", "import popgrad; print(popgrad.__file__)"], cwd=dest, env=env,
                               capture_output=True, text=True).stdout.strip()
        if not os.path.realpath(where).startswith(os.path.realpath(dest)):
            raise SystemExit(f"the copy's tests would import popgrad from {where!r}, not from the copy {dest}")
        return run_tests(dest, sorted(set(tests)), timeout)


def report(mutants, results, wall):
    killed = [m for m in mutants if results[m.id][0].startswith("killed")]
    survived = [m for m in mutants if results[m.id][0] == "survived"]
    lines = [f"# Mutation run ({time.strftime('%Y-%m-%d %H:%M')}, {wall:.0f} s)", "",
             f"mutants tried: {len(mutants)}, killed: {len(killed)}, survived: {len(survived)}", "",
             "| mutant | file | status | s | what | tests' last line |", "|---|---|---|---|---|---|"]
    for m in mutants:
        st, dt, last = results[m.id]
        lines.append(f"| {m.id} | {m.path} | {st} | {dt:.1f} | {m.note} | {last[:80]} |")
    if survived:
        lines += ["", "## Survivors", ""] + [f"- `{m.id}` ({m.path}): {m.note}" for m in survived]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ast", action="store_true", help="operator mutants of theory/ and checks/ instead of the targeted ones")
    ap.add_argument("--all", action="store_true", help="targeted and operator mutants")
    ap.add_argument("--only", nargs="*", help="mutant ids (or prefixes) to run")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--jobs", type=int, default=1, help="parallel copies (each runs its mutants in turn)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant's test run")
    ap.add_argument("--out", help="write the markdown report here (default: print it)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated copy")
    args = ap.parse_args(argv)

    mutants = list(TARGETED) if not args.ast or args.all else []
    if args.ast or args.all:
        mutants += ast_mutants()
    if args.only:
        mutants = [m for m in mutants if any(m.id == o or m.id.startswith(o) for o in args.only)]
    if args.list:
        for m in mutants:
            print(f"{m.id:45s} {m.path:35s} {m.note}   -> {' '.join(m.tests)}")
        print(f"{len(mutants)} mutants")
        return 0
    if not mutants:
        print("no mutants selected", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if not args.no_baseline:
        tests = sorted({t for m in mutants for t in m.tests})
        st, dt, last = baseline(tests, args.timeout * 2)
        print(f"baseline ({len(tests)} test files, {dt:.0f} s): {st}  {last}", flush=True)
        if st != "survived":
            print("the unmutated copy fails its tests: fix that first", file=sys.stderr)
            return 1
    results = {}

    def log(msg):
        print(msg, flush=True)

    jobs = max(1, args.jobs)
    shards = [mutants[i::jobs] for i in range(jobs)]
    with ThreadPoolExecutor(jobs) as ex:
        for f in [ex.submit(_worker, s, args.timeout, results, log) for s in shards if s]:
            f.result()
    text = report(mutants, results, time.perf_counter() - t0)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        print(f"report: {args.out}")
    else:
        print(text)
    return 0 if all(not results[m.id][0] == "survived" for m in mutants if m in TARGETED) else 1


if __name__ == "__main__":
    sys.exit(main())
