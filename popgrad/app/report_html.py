"""``report.html``: a run's report as one self-contained page a reader opens in a browser.

The page is ``report.md`` converted by `markdown-it-py <https://markdown-it-py.readthedocs.io>`_
(CommonMark with tables; raw HTML in the text is escaped, never passed through): the verdict table
first (each status cell coloured), then the figures, embedded as base64 PNG data where report.md links
them (no file beside the page is needed), then the rest of the report.
"""
from __future__ import annotations

import base64
import html
import os

from markdown_it import MarkdownIt

__all__ = ["render_html", "markdown_to_html"]

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.6rem 0; font-size: 0.92rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.pass { background: #e3f6e3; } td.fail { background: #fbe0e0; }
td.inconclusive { background: #fff4d6; } td.not_applicable { color: #666; }
code { background: #f5f5f5; padding: 0 0.2rem; }
img { max-width: 100%; border: 1px solid #ddd; }
"""

#: The status cells of the verdict table (report.md's tags) and their CSS class.
_STATUS_CLASS = {"PASS": "pass", "FAIL": "fail", "INCONCLUSIVE": "inconclusive", "n/a": "not_applicable"}


def _parser() -> MarkdownIt:
    # CommonMark, raw HTML off (escaped), tables on; HTML (not XHTML) void tags
    return MarkdownIt("commonmark", {"html": False, "xhtmlOut": False}).enable("table")


def markdown_to_html(markdown: str, images=None) -> str:
    """Markdown (report.md) as HTML: CommonMark with pipe tables, every text escaped.

    ``images``: ``{file name: data URI}``; an image whose source is a key is embedded, any other image
    is dropped (the page stays self-contained). A table cell that holds only a status tag (``PASS``,
    ``FAIL``, ``INCONCLUSIVE``, ``n/a``) in a column headed ``status`` gets its class for the colour.
    """
    md = _parser()
    tokens = md.parse(markdown)
    status_col, col = None, 0
    for i, tok in enumerate(tokens):
        if tok.type == "thead_open":
            status_col = None
        if tok.type in ("th_open", "td_open"):
            content = tokens[i + 1].content.strip() if i + 1 < len(tokens) else ""
            if tok.type == "th_open" and content == "status":
                status_col = col
            if tok.type == "td_open" and col == status_col and content in _STATUS_CLASS:
                tok.attrSet("class", _STATUS_CLASS[content])
            col += 1
        elif tok.type == "tr_open":
            col = 0
        elif tok.type == "inline" and tok.children:
            kept = []
            for child in tok.children:
                if child.type == "image":
                    src = os.path.basename(str(child.attrGet("src") or ""))
                    if not images or src not in images:
                        continue
                    child.attrSet("src", images[src])
                kept.append(child)
            tok.children = kept
    return md.renderer.render(tokens, md.options, {})


def _data_uri(path) -> str:
    with open(path, "rb") as fh:
        return "data:image/png;base64," + base64.b64encode(fh.read()).decode("ascii")


def render_html(report: dict, markdown: str, figures=()) -> str:
    """The report as one self-contained HTML page: ``markdown`` (report.md) converted, with the
    ``figures`` (PNG paths; those that exist) embedded where report.md links them."""
    t = report.get("task", {})
    title = html.escape(f"popgrad run report: graph {t.get('graph', '')}, S = {t.get('S')}, T = {t.get('T')}")
    if markdown.startswith("# "):  # report.md's title: the page has its own
        markdown = markdown.split("\n", 1)[1] if "\n" in markdown else ""
    images = {os.path.basename(str(p)): _data_uri(p) for p in figures if os.path.exists(p)}
    body = markdown_to_html(markdown, images)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{title}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{title}</h1>\n{body}\n</body>\n</html>\n")
