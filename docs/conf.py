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
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3

# ---- the gallery: every example, run with --quick; figures collected from its --out folder -------------
sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"\.py$",  # run them all
    "ignore_pattern": r"(^|[\\/])_[^\\/]*\.py$",  # _common.py, _catformer.py: helpers, not examples
    "reset_argv": "popgrad_docs.reset_argv",
    "image_scrapers": ("popgrad_docs.png_scraper",),
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "min_reported_time": 0,
    "show_signature": False,
}

# ---- HTML --------------------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"popgrad {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path = []
html_show_sourcelink = False
