"""Every example script runs to completion and writes its figures (smoke test)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
#: Scripts at the paper's scale run in their --quick form here (the full runs are minutes; see README).
QUICK = {"paper_figure2.py", "paper_figure9.py", "alignment_at_scale.py", "catformer_figure2.py", "catformer_figure9.py",
         "catformer_symmetry.py", "catformer_two_parent.py"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script, tmp_path):
    env = dict(os.environ, MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, script, "--out", str(tmp_path / "out")] + (["--quick"] if script in QUICK else []),
        cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    pngs = list((tmp_path / "out").glob("*.png"))
    assert pngs, f"{script} wrote no figure"


def test_readme_python_example_runs(capsys):
    """The README's "Ten lines of Python" stay true."""
    import re

    text = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    code = re.search(r"## Ten lines of Python\n\n```python\n(.*?)```", text, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "passed=True" in out and "Task S=3 T=8" in out
