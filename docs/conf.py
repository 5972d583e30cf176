"""Sphinx configuration of popgrad's documentation: ``make docs`` (warnings are errors)."""
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # the popgrad of this checkout, not an installed one
sys.path.insert(0, str(DOCS / "_ext"))
os.environ.setdefault("MPLBACKEND", "Agg")

import popgrad  # noqa: E402

project = "popgrad"
author = "the popgrad authors"
copyright = "popgrad authors, MIT license"
release = version = popgrad.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "popgrad_docs",  # docs/_ext: the API page from popgrad.__all__, the gallery's argv and figure scraper
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build", "results", "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.json", "**.codeobj.json"]

# ---- API reference (api.rst is generated from popgrad.__all__ by popgrad_docs) -----------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": False}
autodoc_typehints = "none"  # the numpydoc Parameters sections carry the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True  # the docstring's own words for each attribute
numpydoc_xref_param_type = False

# ---- Markdown pages (README excerpts, DESIGN.md, the findings) ----------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath"]  # $...$, $$...$$ and \begin{align} blocks, by MathJax
myst_heading_anchors = 3

# ---- the gallery: every example, run with --quick; figures collected from its --out folder -------------
sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"\.py$",  # run them all
    "ignore_pattern": r"(^|[\\/])_[^\\/]*\.py$",  # _common.py, _catformer.py: helpers, not examples
    "reset_argv": "popgrad_docs.reset_argv",
    "image_scrapers": ("popgrad_docs.png_scraper",),
    "within_subsection_order": "popgrad_docs.PaperOrder",  # as the paper tells it (docs/_ext/popgrad_docs.py)
    "download_all_examples": False,
    "remove_config_comments": True,
    "min_reported_time": 0,
    "show_signature": False,
}

# ---- intersphinx: links to NumPy's, SciPy's and Python's pages -----------------------------------------------
# The inventories (objects.inv) are needed at build time. The build runs offline (CI has no network) and with -W,
# where a failed fetch is an error, so intersphinx is off unless POPGRAD_INTERSPHINX says where to find them:
# "online" (fetched from the projects' sites) or a folder holding numpy.inv, scipy.inv and python.inv.
INTERSPHINX_SITES = {"numpy": "https://numpy.org/doc/stable/", "scipy": "https://docs.scipy.org/doc/scipy/",
                     "python": "https://docs.python.org/3/"}
_inventories = os.environ.get("POPGRAD_INTERSPHINX", "").strip()
if _inventories == "online":
    intersphinx_mapping = {name: (url, None) for name, url in INTERSPHINX_SITES.items()}
elif _inventories:
    _folder = Path(_inventories).expanduser().resolve()
    _missing = [f"{name}.inv" for name in INTERSPHINX_SITES if not (_folder / f"{name}.inv").is_file()]
    if _missing:
        raise RuntimeError(f"POPGRAD_INTERSPHINX={_inventories!r}: {', '.join(_missing)} not found in {_folder}; "
                           "download them from the sites in docs/conf.py (INTERSPHINX_SITES), or unset it")
    intersphinx_mapping = {name: (url, str(_folder / f"{name}.inv")) for name, url in INTERSPHINX_SITES.items()}
else:
    intersphinx_mapping = {}

# ---- HTML --------------------------------------------------------------------------------------------------
def _project_urls() -> dict:
    """``[project.urls]`` of pyproject.toml (the package's one list of links: the repository, the paper, ...)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            return {}
    try:
        with open(ROOT / "pyproject.toml", "rb") as fh:
            return dict(tomllib.load(fh).get("project", {}).get("urls", {}))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _icon(name: str, url: str) -> dict:
    icon = ("fa-brands fa-github" if "github.com" in url else "fa-solid fa-file-lines" if "arxiv" in url
            or "proceedings" in url else "fa-solid fa-link")
    return {"name": name, "url": url, "icon": icon, "type": "fontawesome"}


html_theme = "pydata_sphinx_theme"
html_title = f"popgrad {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    # the repository and the paper in the header (from pyproject.toml's [project.urls])
    "icon_links": [_icon(name, url) for name, url in _project_urls().items()],
    "icon_links_label": "Links",
}
html_static_path = ["_ext/static"]
html_css_files = ["popgrad.css"]  # the gallery's output unclipped (docs/_ext/static/popgrad.css)
html_show_sourcelink = False
