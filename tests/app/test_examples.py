"""Every example script runs to completion and writes its figures (smoke test), and the gallery shows them in
the paper's order.

The scripts run with ``--quick`` (each a few seconds), all of them in one Python process started for this
module (:data:`RUNNER`): one ``import popgrad`` and one load of the compiled kernels instead of one per
script. Each script still runs as ``__main__`` with its own ``sys.argv``, a fresh copy of the examples' helper
modules, RuntimeWarnings as errors (as ``python -W error::RuntimeWarning script.py``) and every other warning
shown each time it is issued; its output is captured at the file-descriptor level, so a warning that a
library prints itself is seen too.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))

#: Seconds one script may take before the run counts it as hung (as the one-subprocess-per-script test had).
PER_SCRIPT = 600

#: Runs the scripts named on its command line, one after another, in this process: argv ``results.json
#: out_root script...``; writes one record per script (status, traceback tail, captured output, seconds).
#: A script still running after PER_SCRIPT seconds ends the run with its traceback on stderr.
RUNNER = f"PER_SCRIPT = {PER_SCRIPT}\n" + r'''
import faulthandler, json, os, runpy, sys, tempfile, time, traceback, warnings

results_path, out_root, scripts = sys.argv[1], sys.argv[2], sys.argv[3:]
examples = os.getcwd()
sys.path.insert(0, examples)
records = []
for script in scripts:
    out = os.path.join(out_root, script[:-3])
    capture = tempfile.TemporaryFile(mode="w+b")
    sys.stdout.flush(); sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(capture.fileno(), 1); os.dup2(capture.fileno(), 2)
    ok, error, t0 = True, "", time.perf_counter()
    faulthandler.dump_traceback_later(PER_SCRIPT, exit=True, file=sys.__stderr__)  # a hang: its traceback, exit
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # every warning printed, as in a fresh process
            warnings.simplefilter("error", RuntimeWarning)
            sys.argv = [script, "--out", out, "--quick"]
            try:
                runpy.run_path(os.path.join(examples, script), run_name="__main__")
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise RuntimeError(f"exit status {exc.code!r}") from None
    except BaseException:
        ok, error = False, traceback.format_exc()[-3000:]
    finally:
        faulthandler.cancel_dump_traceback_later()
        seconds = time.perf_counter() - t0
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2)
        os.close(saved[0]); os.close(saved[1])
        try:
            import matplotlib.pyplot as plt
            plt.close("all")
        except Exception:
            pass
        for name, mod in list(sys.modules.items()):  # the examples' helpers (_common, ...) afresh for the next
            if os.path.dirname(os.path.abspath(getattr(mod, "__file__", None) or "/")) == examples:
                del sys.modules[name]
    capture.seek(0)
    text = capture.read().decode("utf-8", "replace")
    records.append({"script": script, "ok": ok, "error": error, "output": text[-20000:], "seconds": seconds})
with open(results_path, "w", encoding="utf-8") as fh:
    json.dump(records, fh)
'''


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """``{script: record}`` of one run of every example (:data:`RUNNER`), with the figures under ``out/``."""
    root = tmp_path_factory.mktemp("examples")
    results = root / "results.json"
    env = dict(os.environ, MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(results), str(root / "out"), *SCRIPTS],
                          cwd=EXAMPLES, env=env, capture_output=True, text=True,
                          timeout=PER_SCRIPT * len(SCRIPTS) + 60)
    assert proc.returncode == 0 and results.exists(), proc.stderr[-3000:]
    records = {r["script"]: r for r in json.loads(results.read_text(encoding="utf-8"))}
    return records, root / "out"


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script, example_runs):
    records, out = example_runs
    rec = records[script]
    assert rec["ok"], rec["error"] + "\n--- output ---\n" + rec["output"][-2000:]
    assert "Warning" not in rec["output"], rec["output"][-2000:]
    pngs = list((out / script[:-3]).glob("*.png"))
    assert pngs, f"{script} wrote no figure"


def test_the_runner_catches_failures_and_warnings(tmp_path):
    """The one-process runner reports a script that fails, exits non-zero or warns, and a RuntimeWarning is an
    error, as ``python -W error::RuntimeWarning script.py`` would make it."""
    (tmp_path / "_helper.py").write_text("VALUE = 1\n")
    scripts = {
        "good.py": "import _helper, _helper as h\nassert h.VALUE == 1\nh.VALUE = 2\nprint('fine')\n",
        "again.py": "import _helper\nassert _helper.VALUE == 1  # a fresh helper module\n",
        "fails.py": "raise ValueError('boom')\n",
        "exits.py": "import sys\nsys.exit(3)\n",
        "exits0.py": "import sys\nsys.exit(0)\n",
        "warns.py": "import warnings\nwarnings.warn('careful', UserWarning)\n",
        "runtime.py": "import numpy as np\nnp.log(np.zeros(1))\n",
        "argv.py": "import sys\nassert sys.argv[1:3] == ['--out', sys.argv[2]] and sys.argv[3] == '--quick'\n",
    }
    for name, code in scripts.items():
        (tmp_path / name).write_text(code)
    results = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(results), str(tmp_path / "out"), *scripts],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rec = {r["script"]: r for r in json.loads(results.read_text())}
    assert rec["good.py"]["ok"] and "fine" in rec["good.py"]["output"] and rec["again.py"]["ok"]
    assert not rec["fails.py"]["ok"] and "ValueError: boom" in rec["fails.py"]["error"]
    assert not rec["exits.py"]["ok"] and "exit status 3" in rec["exits.py"]["error"]
    assert rec["exits0.py"]["ok"] and rec["argv.py"]["ok"]
    assert rec["warns.py"]["ok"] and "UserWarning: careful" in rec["warns.py"]["output"]
    assert not rec["runtime.py"]["ok"] and "RuntimeWarning" in rec["runtime.py"]["error"]


def test_the_gallery_lists_every_example_in_the_papers_order():
    """docs/conf.py orders the gallery by docs/_ext/popgrad_docs.py's PAPER_ORDER: every listed name is an
    example, and the first pages come in the paper's order."""
    sys.path.insert(0, str(EXAMPLES.parent / "docs" / "_ext"))
    try:
        import popgrad_docs
    finally:
        sys.path.pop(0)
    listed = [n for n in popgrad_docs.PAPER_ORDER if n != "*"]
    assert len(set(listed)) == len(listed) and "*" in popgrad_docs.PAPER_ORDER
    assert set(listed) <= set(SCRIPTS) | {"transformer_figure8.py"}, set(listed) - set(SCRIPTS)
    key = popgrad_docs.PaperOrder(str(EXAMPLES))
    order = sorted(SCRIPTS, key=key)
    assert order[:3] == ["induction_head.py", "icl_function.py", "random_trees.py"]
    assert order.index("paper_figure2.py") < order.index("gradient_alignment.py") < order.index("multi_parent.py")
    assert order.index("multi_parent.py") < order.index("paper_figure9.py")
    conf = (EXAMPLES.parent / "docs" / "conf.py").read_text(encoding="utf-8")
    assert '"within_subsection_order": "popgrad_docs.PaperOrder"' in conf


#: The gallery's pages that teach with the public API alone (their notebooks run without the examples' helpers).
PUBLIC_API_PAGES = ("induction_head.py", "icl_function.py", "random_trees.py", "paper_figure2.py",
                    "gradient_alignment.py", "dpi_gaps.py", "ood.py")


@pytest.mark.parametrize("script", PUBLIC_API_PAGES)
def test_teaching_pages_use_the_public_api_only(script):
    text = (EXAMPLES / script).read_text(encoding="utf-8")
    assert not re.search(r"^\s*(from|import)\s+_", text, flags=re.M), f"{script} imports a private helper"
    assert not re.search(r"popgrad\.\w*\._|from popgrad\.[\w.]*\b_\w+ import|import popgrad\._", text)
    assert "# %%" in text  # sphinx-gallery cells

