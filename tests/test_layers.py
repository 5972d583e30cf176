"""Layers in one direction (issue 19): subpackages import each other at most one way, and theory/ imports no engine;
inside one subpackage, no two modules import each other, directly or through others (issue 26).

The import graph is read from the source (every ``import`` statement, function-level ones included), so a
lazy import counts too. The root package (``popgrad/__init__.py``, the facade that re-exports every layer)
is not a layer; the private top-level modules (``_validation``, ``_io``, ``_compat``, ...) are leaves.
"""
import ast
import pathlib
import warnings

import pytest

import popgrad as pg

ROOT = pathlib.Path(pg.__file__).parent
#: The data flow, upstream first (README, DESIGN §11): a layer may import only layers before it.
ORDER = ("task", "model", "theory", "engine", "train", "checks", "app")


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "popgrad"


def import_graph() -> dict:
    """``{layer: {imported layer: [(module, imported module), ...]}}`` between different layers."""
    graph: dict = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts)
        package = module[: -len(".__init__")] if module.endswith(".__init__") else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                if t == "popgrad" or t.startswith("popgrad."):
                    a, b = _layer(module.replace(".__init__", "")), _layer(t)
                    if a != b:
                        graph.setdefault(a, {}).setdefault(b, []).append((module, t))
    return graph


def _module_name(path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.parts[-1] == "__init__" else rel.parts)


def module_graph() -> dict:
    """``{module: {imported module: line}}`` between popgrad's modules (``popgrad.app.kinds`` is the package's
    ``__init__``), every ``import`` statement counted, function-level and ``TYPE_CHECKING`` ones included.

    ``from X import name`` is an edge to the module ``X.name`` when that is a module, else to ``X``.
    The implicit import of a parent package (Python imports ``popgrad.app`` before ``popgrad.app.jobs``) is
    not an edge: an ``__init__`` that re-exports its modules would otherwise close a circle with each of them.
    """
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict = {m: {} for m in paths}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in paths and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in paths and t != module:
                    graph[module].setdefault(t, node.lineno)
    return graph


def circles_within_layers(graph=None) -> list:
    """Every import circle among the modules of one layer (strongly connected components of more than one
    module, or a module importing itself), each as a sorted list of modules."""
    graph = module_graph() if graph is None else graph
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm, iterative over each node's edges
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if _layer(w) != _layer(v):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_inside_a_subpackage():
    """``app/config.py`` ↔ ``app/kinds.py`` (a lazy import one way, a top-level one the other) was such a circle."""
    circles = circles_within_layers()
    g = module_graph()
    assert circles == [], [{m: sorted(set(g[m]) & set(c)) for m in c} for c in circles]


def test_the_circle_check_catches_a_circle():
    """Two modules of one layer importing each other (one of them lazily) are found, and a circle that spans
    layers is the other test's business."""
    g = module_graph()
    assert "popgrad.app.config" in g and "popgrad.app.kinds" in g["popgrad.app.config"]
    g["popgrad.app.kinds"] = dict(g["popgrad.app.kinds"], **{"popgrad.app.config": 1})
    assert ["popgrad.app.config", "popgrad.app.kinds"] in circles_within_layers(g)
    three = {"popgrad.x.a": {"popgrad.x.b": 1}, "popgrad.x.b": {"popgrad.x.c": 1}, "popgrad.x.c": {"popgrad.x.a": 1}}
    assert circles_within_layers(three) == [["popgrad.x.a", "popgrad.x.b", "popgrad.x.c"]]
    assert circles_within_layers({"popgrad.x.a": {"popgrad.y.b": 1}, "popgrad.y.b": {"popgrad.x.a": 1}}) == []


def test_the_graph_sees_the_known_edges():
    """The parser finds imports that certainly exist (so the checks below cannot pass on an empty graph)."""
    g = import_graph()
    assert "task" in g["engine"] and "engine" in g["train"] and "theory" in g["checks"] and "engine" in g["app"]
    assert "app" in g["popgrad"]  # the facade's lazy ``from .app.sweep import sweep`` counts


def test_no_two_subpackages_import_each_other():
    g = import_graph()
    both = sorted({tuple(sorted((a, b))) for a in g for b in g[a] if a in g.get(b, {}) and "popgrad" not in (a, b)})
    assert both == [], {pair: (g[pair[0]][pair[1]][:2], g[pair[1]][pair[0]][:2]) for pair in both}


@pytest.mark.parametrize("layer", ORDER)
def test_layers_import_only_upstream(layer):
    """The data flow has one direction: ``task → model → theory → engine → train → checks → app``."""
    g = import_graph()
    later = set(ORDER[ORDER.index(layer) + 1:])
    bad = {b: edges[:3] for b, edges in g.get(layer, {}).items() if b in later}
    assert not bad, f"{layer} imports downstream layers: {bad}"


def test_theory_imports_no_engine():
    assert "engine" not in import_graph().get("theory", {})


def test_moved_reference_losses_keep_their_old_paths_with_a_warning():
    """``popgrad.theory.bayes_loss`` and ``popgrad.theory.baselines.*`` forward to ``popgrad.engine.baselines``."""
    import popgrad.theory as theory
    from popgrad.engine import baselines

    with pytest.warns(DeprecationWarning, match=r"popgrad\.engine\.baselines\.bayes_loss"):
        assert theory.bayes_loss is pg.bayes_loss is baselines.bayes_loss
    with pytest.warns(DeprecationWarning, match="popgrad.theory.baselines.construction_params is deprecated"):
        from popgrad.theory.baselines import construction_params
    assert construction_params is baselines.construction_params
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pg.optimal_loss is baselines.optimal_loss  # the public name: no warning
        with pytest.raises(AttributeError):
            theory.not_a_name  # noqa: B018


def test_distributed_uses_no_private_names_of_other_modules():
    """engine/distributed.py only splits, ships and concatenates: it drives the engines through their block
    runners, never through another module's private names (``single._prefix_plan``, ``_kernels``...)."""
    path = ROOT / "engine" / "distributed.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = set()
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            shared = {"_validation", "_io", "__future__"}  # popgrad's shared helpers, not another module's internals
            if node.module and any(p.startswith("_") and p not in shared for p in node.module.split(".")):
                bad.append(f"from {'.' * node.level}{node.module} import ...")
            for a in node.names:
                if a.name.startswith("_") and a.name != "annotations":
                    bad.append(f"import of private name {a.name}")
                modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            bad.append(f"{node.value.id}.{node.attr} (line {node.lineno})")
    assert bad == [], bad
