"""The package installs like the ecosystem's: PEP 621 metadata in pyproject.toml with one version source,
the extras, the console script and ``python -m popgrad``, py.typed, LICENSE and CITATION.cff."""
import subprocess
import sys
from pathlib import Path

import yaml

import popgrad

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_pyproject_metadata():
    project = PYPROJECT["project"]
    assert project["name"] == "popgrad" and project["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "popgrad.__version__"}
    assert PYPROJECT["build-system"]["build-backend"] == "setuptools.build_meta"
    assert set(project["optional-dependencies"]) == {"test", "bench", "docs"}
    assert project["scripts"] == {"popgrad": "popgrad.app.cli:main"}
    deps = " ".join(project["dependencies"])
    for name in ("numpy", "scipy", "numba", "matplotlib", "dask[distributed]", "pandas", "markdown-it-py"):
        assert name in deps, name
    assert PYPROJECT["tool"]["setuptools"]["package-data"]["popgrad"] == ["py.typed"]
    assert PYPROJECT["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]
    assert not (ROOT / "setup.cfg").exists() and not (ROOT / "setup.py").exists()  # one place for metadata


def test_license_and_citation():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert PYPROJECT["project"]["license"] == {"text": "MIT"}
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0" and cff["version"] == popgrad.__version__ and cff["license"] == "MIT"
    paper = cff["references"][0]
    assert paper["title"] == "How Transformers Learn Causal Structure with Gradient Descent" and paper["year"] == 2024
    assert [a["family-names"] for a in paper["authors"]] == ["Nichani", "Damian", "Lee"]
    assert any("2402.14735" in str(i["value"]) for i in paper["identifiers"])


def test_py_typed_and_python_m_popgrad():
    assert (ROOT / "popgrad" / "py.typed").is_file()
    proc = subprocess.run([sys.executable, "-m", "popgrad", "--version"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == f"popgrad {popgrad.__version__}", proc.stderr
    proc = subprocess.run([sys.executable, "-m", "popgrad", "run", "--S", "x"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1  # the command's own one-line errors
