"""The documentation: docstring examples run, the API page lists every public name, the gallery's
helpers (example titles, figure scraper) work. The site itself is built by ``make docs`` (CI)."""
import doctest
import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

import popgrad

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(DOCS / "_ext"))
import popgrad_docs  # noqa: E402  (docs/_ext/popgrad_docs.py: the API page and the gallery's helpers)


# ---- docstring examples --------------------------------------------------------------------------------

def _modules():
    """Every module of the popgrad package (imported: a module that does not import is a failure)."""
    names = ["popgrad"] + [m.name for m in pkgutil.walk_packages(popgrad.__path__, "popgrad.")]
    return [importlib.import_module(n) for n in sorted(names)]


def _doctests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = []
    for module in _modules():
        tests += [t for t in finder.find(module) if t.examples]
    return sorted(tests, key=lambda t: t.name)


DOCTESTS = _doctests()


def test_docstrings_have_examples():
    """The doctest run below is not empty (the count only grows as docstrings gain examples)."""
    assert len(DOCTESTS) >= 4, [t.name for t in DOCTESTS]


@pytest.mark.parametrize("test", DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_docstring_example(test):
    """Every ``>>>`` example in popgrad's docstrings runs and prints what it says."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = []
    result = runner.run(test, out=out.append)
    assert result.failed == 0, "".join(out)
    assert result.attempted == len(test.examples)


# ---- the API page ----------------------------------------------------------------------------------------

def _autosummary_entries(text):
    """``(currentmodule, name)`` of every entry of every autosummary table of an API page."""
    entries, module, in_table = [], None, False
    for line in text.splitlines():
        if line.startswith(".. currentmodule::"):
            module = line.split("::")[1].strip()
        elif line.startswith(".. autosummary::"):
            in_table = True
        elif in_table and line.startswith("   ") and not line.strip().startswith(":"):
            entries.append(f"{module}.{line.strip()}")
        elif in_table and line and not line.startswith(" "):
            in_table = False
    return entries


def test_api_page_lists_every_public_name_once():
    entries = _autosummary_entries(popgrad_docs.api_rst())
    expected = [f"popgrad.{n}" for n in popgrad.__all__] + [f"popgrad.checks.{n}" for n in popgrad.checks.__all__]
    assert sorted(entries) == sorted(expected)
    assert len(entries) == len(set(entries))


def test_api_groups_partition_all():
    groups = popgrad_docs.api_groups()
    names = [n for _, ns in groups for n in ns]
    assert sorted(names) == sorted(popgrad.__all__)
    titles = dict(groups)
    # deprecated names are importable but not in __all__ (issue 26 item 7): no section lists them
    assert popgrad_docs.DEPRECATED not in titles
    assert {"exact_loss_multi", "MultiLossAndGrad"}.isdisjoint(names) and "LossAndGrad" in names
    assert "catformer_rows_loss_and_grad" in titles["Engines: exact population losses and gradients, reference losses"]
    assert "chain" in titles["Tasks: graphs, priors, exact sequence weights"]
    assert "DEFAULT_MAX_SEQUENCES" in titles["Tasks: graphs, priors, exact sequence weights"]
    assert "DEFAULT_OPTIONS" in titles["Engines: exact population losses and gradients, reference losses"]


def test_a_name_added_to_all_appears_and_a_missing_one_is_reported(monkeypatch):
    """The page follows ``__all__`` at build time, and the end-of-build check names what is missing."""
    monkeypatch.setattr(popgrad, "docs_probe", popgrad.chain, raising=False)
    monkeypatch.setattr(popgrad, "__all__", popgrad.__all__ + ["docs_probe"])
    assert "popgrad.docs_probe" in _autosummary_entries(popgrad_docs.api_rst())
    documented = set(popgrad_docs.expected_api_names()) - {"popgrad.docs_probe", "popgrad.checks.check_ood"}
    assert popgrad_docs.missing_api_names(documented) == ["popgrad.docs_probe", "popgrad.checks.check_ood"]
    assert popgrad_docs.missing_api_names(popgrad_docs.expected_api_names()) == []


def test_every_public_name_has_a_docstring():
    """An API page of names without text would pass the build check; every callable needs its own words."""
    bare = [n for n in popgrad.__all__
            if callable(getattr(popgrad, n)) and not (getattr(popgrad, n).__doc__ or "").strip()]
    assert bare == []


# ---- the gallery ---------------------------------------------------------------------------------------

SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_example_has_a_gallery_title(script):
    """sphinx-gallery takes the page title from the docstring's first lines: a reST title."""
    import ast

    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8")), clean=False)
    assert doc, f"{script.name}: no module docstring"
    title, underline, blank = (doc.splitlines() + ["", "", ""])[:3]
    assert title.strip() and set(underline) == {"="} and len(underline) >= len(title), script.name
    assert blank == "", script.name


def test_gallery_runs_every_example_and_skips_the_helpers():
    import re

    conf = (DOCS / "conf.py").read_text(encoding="utf-8")
    ns = {}
    exec(compile(re.search(r"sphinx_gallery_conf = \{.*?\n\}", conf, re.S).group(0), "conf.py", "exec"),
         {"ROOT": ROOT, "str": str}, ns)
    cfg = ns["sphinx_gallery_conf"]
    for path in EXAMPLES.glob("*.py"):
        runs = re.search(cfg["filename_pattern"], str(path)) and not re.search(cfg["ignore_pattern"], str(path))
        assert bool(runs) == (not path.name.startswith("_")), path.name


def test_reset_argv_gives_quick_and_a_fresh_out_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(popgrad_docs, "GALLERY_OUT", tmp_path)
    stale = tmp_path / "induction_head" / "old.png"
    stale.parent.mkdir()
    stale.write_bytes(b"x")
    argv = popgrad_docs.reset_argv({}, {"src_file": str(EXAMPLES / "induction_head.py")})
    assert argv == ["--quick", "--out", str(tmp_path / "induction_head")]
    assert not stale.exists() and stale.parent.is_dir()


def test_png_scraper_collects_each_new_figure_once(tmp_path, monkeypatch):
    pytest.importorskip("sphinx_gallery")  # the `docs` extra
    monkeypatch.setattr(popgrad_docs, "GALLERY_OUT", tmp_path / "out")
    out = tmp_path / "out" / "demo"
    out.mkdir(parents=True)
    for name in ("b.png", "a.png"):
        (out / name).write_bytes(name.encode())
    targets = iter(tmp_path / f"sphx_glr_demo_{k:03d}.png" for k in range(1, 10))
    block_vars = {"src_file": str(tmp_path / "demo.py"), "image_path_iterator": targets}
    conf = {"src_dir": str(tmp_path)}
    rst = popgrad_docs.png_scraper(None, block_vars, conf)
    assert "sphx_glr_demo_001.png" in rst and "sphx_glr_demo_002.png" in rst
    assert (tmp_path / "sphx_glr_demo_001.png").read_bytes() == b"a.png"  # file-name order
    assert popgrad_docs.png_scraper(None, block_vars, conf) == ""  # nothing new in the next block
    (out / "c.png").write_bytes(b"c")
    assert "sphx_glr_demo_003.png" in popgrad_docs.png_scraper(None, block_vars, conf)


def test_an_example_ending_with_sys_exit_does_not_end_the_build():
    """``sys.exit(main())`` in an example: status 0 is a normal end, another status the example's failure
    (sphinx-gallery reports it), never a silent exit of the whole build."""
    pytest.importorskip("sphinx_gallery")
    import types

    from sphinx_gallery import gen_rst

    popgrad_docs.catch_system_exit()
    popgrad_docs.catch_system_exit()  # idempotent
    main = types.ModuleType("__main__")
    ran = []
    main.__dict__["ran"] = ran
    gen_rst._exec_once(compile("ran.append(1); raise SystemExit(0)", "ex.py", "exec"), main)()
    gen_rst._exec_once(compile("import sys; sys.exit()", "ex.py", "exec"), main)()
    assert ran == [1]
    with pytest.raises(RuntimeError, match="exited with status 3"):
        gen_rst._exec_once(compile("raise SystemExit(3)", "ex.py", "exec"), main)()
    with pytest.raises(ValueError):  # other errors pass through unchanged
        gen_rst._exec_once(compile("raise ValueError('x')", "ex.py", "exec"), main)()
