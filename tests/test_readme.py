"""The README is for users and stays true: its quick start runs and every verdict it prints passes
inside its hypotheses; the docs pages that include README (and the command-line page) find their
markers; no work-log text (rounds, issue numbers, test counts)."""
import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _quick_start_blocks() -> list:
    section = README[README.index("## Quick start"):README.index("## Where to go next")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_readme_is_for_users():
    for heading in ("## Install", "## Two commands", "## Quick start", "## Where to go next", "## Citing",
                    "## License"):
        assert heading in README, heading
    assert "pip install ." in README and all(f'".[{extra}]"' in README for extra in ("test", "bench", "docs"))
    assert "make demo" in README and "make test" in README
    assert "docs/_static/demo_attention.png" in README and (ROOT / "docs/_static/demo_attention.png").is_file()
    for worklog in (r"this round", r"previous round", r"\bissue \d+", r"\d+ passed", r"<owner>"):
        assert not re.search(worklog, README, re.I), worklog
    assert len(README.splitlines()) < 250


@pytest.mark.parametrize("i", range(4))
def test_quick_start_runs_and_every_printed_verdict_passes(i):
    blocks = _quick_start_blocks()
    assert len(blocks) == 4
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[i], f"README.md quick start {i}", "exec"), {})
    text = out.getvalue()
    verdicts = re.findall(r"^(PASS|FAIL|INCONCLUSIVE|N/A) \w+", text, re.M) + re.findall(r"^(pass|fail|inconclusive) ",
                                                                                          text, re.M)
    assert all(v.upper() == "PASS" for v in verdicts), text
    if i == 0:
        assert verdicts == ["PASS"] * 3 and "Task S=3 T=8" in text and "uniform mean=True" in text
        # the outputs the README shows are the ones printed
        for line in ("outcome: 0.9764 ≥ 0.875: met", "outcome: 0.9623 > 0: met", "outcome: -0.06504 ≤ -0.04958: met"):
            assert line in text and line in README
    if i == 1:
        assert verdicts == ["pass"] and text.split()[1:3] == ["-0.4306", "≤"]
    if i == 2:
        first, second = text.splitlines()[1].split()
        assert float(first) == pytest.approx(float(second), rel=1e-12)
    if i == 3:
        assert text.splitlines()[0].startswith("0.693147 ") and "0.693147 -> 0.623232" in text


def _includes(page: Path):
    text = page.read_text(encoding="utf-8")
    for m in re.finditer(r"```\{include\} (\S+)\n((?::[a-z-]+: .*\n)*)```", text):
        opts = dict(re.findall(r":([a-z-]+): \"(.*)\"", m.group(2)))
        yield (page.parent / m.group(1)).resolve(), opts


def test_docs_includes_find_their_markers():
    """The pages that include parts of README.md and of the command-line page find their markers."""
    seen = 0
    for page in (ROOT / "docs").rglob("*.md"):
        if "_build" in page.parts:
            continue
        for target, opts in _includes(page):
            if target.name not in ("README.md", "command_line.md"):
                continue
            body = target.read_text(encoding="utf-8")
            start = body.index(opts["start-after"]) if "start-after" in opts else 0
            if "end-before" in opts:
                assert opts["end-before"] in body[start:], (page.name, opts["end-before"])
            seen += 1
    assert seen >= 8


def test_included_readme_text_has_no_repository_links():
    """README links are repository paths; inside the site they would not resolve (warnings are errors)."""
    for page in (ROOT / "docs").rglob("*.md"):
        for target, opts in _includes(page):
            if target.name != "README.md":
                continue
            body = target.read_text(encoding="utf-8")
            start = body.index(opts["start-after"])
            part = body[start:body.index(opts["end-before"], start)]
            assert not re.search(r"\]\((?!https?:)[^)]*\)", part), (page.name, opts)
