"""Readable reports: report.md has tables with 4 significant digits (standard errors 2), rounding noise
shown as 0 and no Python repr; one verdict table whose value column is the outcome, not the rule; losses
grouped by their ε, in nats; report.html is one well-formed, self-contained page (markdown-it-py) with the
verdicts first, the figures next (captioned) and every figure embedded."""
import base64
import json
import re
from html.parser import HTMLParser

import pytest

from popgrad.app import cli
from popgrad.app.report import detail_lines, fmt, fmt_se, render_markdown
from popgrad.checks.results import outcome
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
    # -5.9e-17 beside -0.48 in one column is rounding noise: shown as 0
    assert lines[4] == "| 1 | 0 | 0 | -0.4848 |" and lines[5] == "| 2 | 1 | 1 | 0 |"
    matrix = detail_lines("pi_ood", [[0.35557403956041206, 0.6444259604395879], [0.5, 0.5]])
    assert "| 0 | 0.3556 | 0.6444 |" in matrix and matrix[0].startswith("- pi_ood (matrix")
    assert detail_lines("per_position", [0.123456, None]) [-3:-1] == ["| 0 | 0.1235 |", "| 1 | n/a |"]
    assert detail_lines("per_head", {"0": 0.5, "1": 0.25})[-3:-1] == ["| 0 | 0.5 |", "| 1 | 0.25 |"]
    assert detail_lines("rows_with_wrong_argmax", []) == ["- rows_with_wrong_argmax: none"]
    nested = {"method": "x", "inner": {"a": [0.123456789, {"b": 2.0000001}]}}
    assert fmt(nested) == "method: x, inner: a: [0.1235, b: 2]"
    for v in (per_row, nested, [[1.23456789]], {"a": [1.0, 2.123456]}, [{"x": 1.0}]):
        assert no_repr("\n".join(detail_lines("k", v)))
    # a small value that is not noise next to its peers stays; a lone tiny scalar stays too
    assert detail_lines("sweep_distance", [0.5, 3e-9]) == ["- sweep_distance: 0.5, 3e-09"]
    assert detail_lines("gamma", 1e-34) == ["- gamma: 1e-34"]
    assert detail_lines("sweep_distance", [0.5, 3e-17]) == ["- sweep_distance: 0.5, 0"]
    # standard errors: 2 significant digits
    assert detail_lines("local_exponent_stderr", 0.008721) == ["- local_exponent_stderr: 0.0087"]
    assert fmt_se(0.003412) == "0.0034" and fmt_se(None) == "n/a"
    assert detail_lines("per_position_se", [0.012345, 0.5])[-3:-1] == ["| 0 | 0.012 |", "| 1 | 0.5 |"]


def test_outcome_says_what_holds_not_the_rule():
    assert outcome(-0.3049, "<=", -0.4) == "-0.3049 > -0.4: not met"
    assert outcome(0.4021, "<", 0.0) == "0.4021 ≥ 0: not met"
    assert outcome(0.9751, ">=", 0.9) == "0.9751 ≥ 0.9: met"
    assert outcome(-0.04987, "<=", -0.02923) == "-0.04987 ≤ -0.02923: met"
    assert outcome(0.5, ">", 0.5) == "0.5 ≤ 0.5: not met"
    assert outcome(float("nan"), "n/a", float("nan")) == "n/a" and outcome(None, ">=", 0.5) == "n/a"


def _report(refs, final=0.5, checks=()):
    return {"task": {"graph": "-1,0,-1", "S": 2, "T": 3, "t_eff": 3.0, "n_sequences": 8, "prior_atoms": 2,
                     "note": "n", "assumptions": {}, "hypotheses": {}},
            "config": {}, "references": refs, "checks": list(checks), "all_passed": None,
            "trajectory": {"status": "completed", "message": "", "final_loss": final, "final_loss_kind": "exact"}}


def test_reference_losses_are_grouped_by_eps_and_in_nats():
    refs = {"eps": 0.3162, "L_star": {"value": 0.9227, "kind": "exact"}, "L_bayes": {"value": 1.033, "kind": "exact"},
            "L_star_eps": {"value": 0.3044, "kind": "exact"}, "L_count": {"value": 0.4343, "kind": "exact"},
            "L_count_sampled": {"value": 0.43, "kind": "sampled", "se": 0.0012345, "n": 4000}}
    md = render_markdown(_report(refs, final=0.3844))
    plain = md.index("### Unperturbed cross-entropy (ε = 0)")
    perturbed = md.index("### ε-loss at ε = 0.3162 (the loss the model is trained on)")
    assert plain < perturbed and "value (nats)" in md
    # L* (ε = 0) sits with the plain losses, the final loss with the ε-losses it is comparable to
    assert plain < md.index("L*: the oracle") < perturbed < md.index("L*_ε: the oracle") < md.index("final loss L_ε")
    assert "0.43 ± 0.0012 (n = 4,000)" in md
    # the full model (ε = 0): one group, the final loss in it
    md0 = render_markdown(_report({"eps": 0.0, "L_bayes": {"value": 0.6, "kind": "exact"}}))
    assert "### Cross-entropy (ε = 0: the loss the model is trained on)" in md0 and "ε-loss at" not in md0
    assert "| final loss L(θ̂) | 0.5 | exact |" in md0


def test_one_verdict_table_names_the_statement_first():
    check = {"name": "gradient_alignment", "value": -0.3049, "threshold": -0.4, "comparison": "<=",
             "status": "inconclusive", "reason": "pre-asymptotic", "kind": "exact", "statement": "s", "details": {},
             "passed": None}
    md = render_markdown(_report({"eps": 0.0}, checks=[check]))
    row = next(line for line in md.splitlines() if "| gradient_alignment |" in line)
    assert row.startswith("| attention gradients compute the χ² mutual information (Knowl 3) | gradient_alignment |")
    assert "| -0.3049 > -0.4: not met | INCONCLUSIVE |" in row and "<= -0.4" not in md
    assert md.count("| statement | check | outcome |") == 1
    html_page = render_html(_report({"eps": 0.0}, checks=[check]), md)
    assert html_page.count("<table>") == 1 and html_page.count("<th>outcome</th>") == 1  # the one verdict table
    assert '<td class="inconclusive">INCONCLUSIVE</td>' in html_page


def test_markdown_to_html_escapes_and_keeps_tables():
    out = markdown_to_html("# T <1>\n\n| a | b \\| c |\n|---|---|\n| `x` | **y** |\n\n- item_one & two\n")
    out = re.sub(r">\s+<", "><", out)  # markdown-it-py puts each element on its own line
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
    assert text.count("<h2>Verdicts</h2>") == 1 and text.count("<th>outcome</th>") == 1  # one verdict table
    # the figures come right after the verdicts, each with its caption, before the hypotheses and references
    first_img = text.index("<img")
    assert first_table < first_img < text.index("Hypotheses") < text.index("Reference losses")
    assert "<strong>Figure 1</strong> (attention.png): softmax(A1)" in text
    assert "with L*_ε, L_Bayes,ε and the count estimator" in text  # the caption, literal (no stray emphasis)
    md = (tiny_run / "report.md").read_text()
    assert md.count("| statement | check | outcome |") == 1 and "![loss.png](loss.png)" in md


def test_a_pre_asymptotic_check_says_where_its_regime_is_reached():
    check = {"name": "gradient_alignment", "value": -0.3049, "threshold": -0.4, "comparison": "<=",
             "status": "inconclusive", "reason": "pre-asymptotic: local exponent -0.305", "kind": "exact",
             "statement": "s", "details": {}, "passed": None}
    md = render_markdown(_report({"eps": 0.0}, checks=[check]))
    assert "Pre-asymptotic here; where the regime is reached:" in md
    assert "check_alignment_rate(pg.chain, pair, pg.checks.default_alignment_T(2))" in md
    decided = dict(check, status="fail", reason="")
    assert "where the regime is reached" not in render_markdown(_report({"eps": 0.0}, checks=[decided]))


def test_html_embeds_only_the_run_figures_and_escapes_raw_html(tmp_path):
    png = tmp_path / "loss.png"
    png.write_bytes(b"\x89PNG fake")
    md = "# t\n\n![loss.png](loss.png)\n\n![x](http://example.org/x.png)\n\n<script>alert(1)</script>\n"
    page = render_html({"task": {}}, md, [png])
    checker = parse_html(page)
    assert len(checker.images) == 1 and checker.images[0].startswith("data:image/png;base64,")
    assert "http://example.org" not in page and "<script>" not in page and "&lt;script&gt;" in page
