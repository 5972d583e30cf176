"""``report.html``: a run's report as one self-contained page a reader opens in a browser.

The verdict table comes first, then the whole of ``report.md`` (its headings, tables and lists,
converted here: report.md uses a small, fixed subset of Markdown), then the figures, embedded as
base64 PNG data (no file beside the page is needed). Every text is HTML-escaped.
"""
from __future__ import annotations

import base64
import html
import os
import re

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
figure { margin: 1rem 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
"""

_STATUS = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "not_applicable": "n/a"}


def _inline(text: str) -> str:
    """Escape, then the inline Markdown report.md uses: ``code``, **bold**, _italic_ (whole words)."""
    out = html.escape(text.replace("\\|", "|"), quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"(?<![\w])_([^_]+)_(?![\w])", r"<em>\1</em>", out)


def _cells(row: str) -> list:
    cells = re.split(r"(?<!\\)\|", row.strip())
    return [c.strip() for c in cells[1:-1]]


def markdown_to_html(markdown: str) -> str:
    """The subset of Markdown report.md uses (``#`` headings, pipe tables, ``-`` lists, paragraphs) as HTML."""
    out, para, items, table = [], [], [], []

    def flush():
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()
        if table:
            head, body = _cells(table[0]), [_cells(r) for r in table[2:]]
            rows = ["<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"]
            rows += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body]
            out.append("<table>" + "".join(rows) + "</table>")
            table.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            if not table:
                flush()
            table.append(line)
            continue
        if table:
            flush()
        heading = re.match(r"(#{1,6}) (.*)", line)
        if heading:
            flush()
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif line.startswith("- "):
            if para:
                flush()
            items.append(line[2:])
        elif not line.strip():
            flush()
        else:
            if items:
                flush()
            para.append(line)
    flush()
    return "\n".join(out)


def _verdicts(report: dict) -> str:
    rows = ["<tr><th>check</th><th>status</th><th>value</th><th></th><th>threshold</th><th>kind</th>"
            "<th>reason</th></tr>"]
    for c in report.get("checks", []):
        status = c.get("status") or ("pass" if c.get("passed") else "fail")
        value, threshold = c.get("value"), c.get("threshold")
        num = (lambda x: "n/a" if x is None else (f"{x:.4g}" if isinstance(x, float) else html.escape(str(x))))
        rows.append(f'<tr><td>{html.escape(c["name"])}</td><td class="{html.escape(status)}">'
                    f'{_STATUS.get(status, html.escape(status))}</td><td>{num(value)}</td>'
                    f'<td>{html.escape(str(c.get("comparison", "")))}</td><td>{num(threshold)}</td>'
                    f'<td>{html.escape(str(c.get("kind", "exact")))}</td>'
                    f'<td>{html.escape(str(c.get("reason", "")))}</td></tr>')
    counts = report.get("status_counts") or {}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    return (f"<h2>Verdicts</h2>\n<table>{''.join(rows)}</table>\n"
            f"<p>{html.escape(summary)}; all decided checks passed: {report.get('all_passed')}; run status: "
            f"<strong>{html.escape(str(report.get('trajectory', {}).get('status')))}</strong></p>")


def _figures(paths) -> str:
    parts = []
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, "rb") as fh:
            data = base64.b64encode(fh.read()).decode("ascii")
        name = html.escape(os.path.basename(path))
        parts.append(f'<figure><img alt="{name}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{name}</figcaption></figure>")
    return ("<h2>Figures</h2>\n" + "\n".join(parts)) if parts else ""


def render_html(report: dict, markdown: str, figures=()) -> str:
    """The report as one self-contained HTML page: verdicts, then ``markdown`` (report.md), then the
    ``figures`` (PNG paths; those that exist are embedded as base64)."""
    t = report.get("task", {})
    title = html.escape(f"popgrad run report: graph {t.get('graph', '')}, S = {t.get('S')}, T = {t.get('T')}")
    if markdown.startswith("# "):  # report.md's title: the page has its own
        markdown = markdown.split("\n", 1)[1] if "\n" in markdown else ""
    body = markdown_to_html(markdown)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{title}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{title}</h1>\n{_verdicts(report)}\n{body}\n{_figures(figures)}\n</body>\n</html>\n")
