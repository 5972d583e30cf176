"""Readable reports (issue 33 item 4): report.md has tables with 4 significant digits and no Python repr;
report.html is one well-formed, self-contained page with the verdicts first and every figure embedded."""
import base64
import json
import re
from html.parser import HTMLParser

import pytest

from popgrad.app import cli
from popgrad.app.report import detail_lines, fmt, render_markdown
from popgrad.app.report_html import markdown_to_html, render_html

VOID = {"meta", "img", "br", "hr", "link", "input"}


class _Checker(HTMLParser):
    """Every non-void element closed in order; the images' data collected."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.images, self.tags = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def parse_html(text):
    checker = _Checker()
    checker.feed(text)
    checker.close()
    assert checker.errors == [] and checker.stack == [], (checker.errors, checker.stack)
    assert text.startswith("<!DOCTYPE html>")
    return checker


def long_numbers(text) -> list:
    """Decimal numbers in ``text`` with more than 4 significant digits."""
    return [m for m in re.findall(r"\d+\.\d+", text) if len(m.replace(".", "").lstrip("0")) > 4]


def no_repr(text) -> bool:
    return "{'" not in text and "array(" not in text and long_numbers(text) == []


def test_details_are_tables_with_four_significant_digits():
    per_row = {"1": {"parent": 0, "field_argmax": 0, "field_diagonal_over_parent": -0.48477267710155786},
               "2": {"parent": 1, "field_argmax": 1, "field_diagonal_over_parent": -5.921638809812833e-17}}
    lines = detail_lines("per_row", per_row)
    assert lines[:4] == ["- per_row:", "", "| row | parent | field_argmax | field_diagonal_over_parent |",
                         "|---|---|---|---|"]
    assert lines[4] == "| 1 | 0 | 0 | -0.4848 |" and lines[5] == "| 2 | 1 | 1 | -5.922e-17 |"
    matrix = detail_lines("pi_ood", [[0.35557403956041206, 0.6444259604395879], [0.5, 0.5]])
    assert "| 0 | 0.3556 | 0.6444 |" in matrix and matrix[0].startswith("- pi_ood (matrix")
    assert detail_lines("per_position", [0.123456, None]) [-3:-1] == ["| 0 | 0.1235 |", "| 1 | n/a |"]
    assert detail_lines("per_head", {"0": 0.5, "1": 0.25})[-3:-1] == ["| 0 | 0.5 |", "| 1 | 0.25 |"]
    assert detail_lines("rows_with_wrong_argmax", []) == ["- rows_with_wrong_argmax: none"]
    nested = {"method": "x", "inner": {"a": [0.123456789, {"b": 2.0000001}]}}
    assert fmt(nested) == "method: x, inner: a: [0.1235, b: 2]"
    for v in (per_row, nested, [[1.23456789]], {"a": [1.0, 2.123456]}, [{"x": 1.0}]):
        assert no_repr("\n".join(detail_lines("k", v)))


def test_markdown_to_html_escapes_and_keeps_tables():
    out = markdown_to_html("# T <1>\n\n| a | b \\| c |\n|---|---|\n| `x` | **y** |\n\n- item_one & two\n")
    assert "<h1>T &lt;1&gt;</h1>" in out and "<th>b | c</th>" in out
    assert "<td><code>x</code></td><td><strong>y</strong></td>" in out and "<li>item_one &amp; two</li>" in out
    parse_html(render_html({"checks": [], "task": {}}, "para <b>\n"))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports") / "run"
    code = cli.main(["run", "--S", "2", "--T", "5", "--steps1", "4", "--steps2", "2", "--no-sweep", "--out", str(out),
                     "--no-progress"])
    assert code == 0
    return out


def test_report_md_of_a_run_has_no_python_repr(tiny_run):
    md = (tiny_run / "report.md").read_text()
    assert "{'" not in md and "array(" not in md and long_numbers(md) == []
    assert "- per_row:" in md and "| row | parent | field_argmax |" in md  # field_dpi's rows as a table


def test_report_html_is_well_formed_self_contained_and_holds_every_figure(tiny_run):
    text = (tiny_run / "report.html").read_text()
    page = parse_html(text)
    figures = sorted(p.name for p in tiny_run.glob("*.png"))
    assert figures == ["attention.png", "attention_to_parent.png", "gradient_cosine.png", "loss.png"]
    embedded = [base64.b64decode(src.split(",", 1)[1]) for src in page.images]
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert sorted(embedded) == sorted((tiny_run / f).read_bytes() for f in figures)
    assert "src=\"http" not in text and "href=" not in text  # nothing outside the page
    report = json.loads((tiny_run / "report.json").read_text())
    first_table = text.index("<table>")
    assert text.index("<h2>Verdicts</h2>") < first_table < text.index("Reference losses")
    verdicts = text[first_table:text.index("</table>", first_table)]
    assert all(f"<td>{c['name']}</td>" in verdicts for c in report["checks"])
    assert render_markdown(report).count("| check | value |") == 1
