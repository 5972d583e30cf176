"""The ``thorough`` hypothesis profile raises every test's own example count; CI stays derandomized (issue 23)."""
import math
import os
import subprocess
import sys
import textwrap

from hypothesis import settings

from .profiles import CI_MAX_EXAMPLES, THOROUGH_FACTOR, THOROUGH_MAX_EXAMPLES, budget

PROBE = textwrap.dedent('''
    import os
    from hypothesis import given, settings, strategies as st
    from tests.profiles import budget

    OUT = os.environ["PROBE_OUT"]

    def note(name):
        with open(OUT, "a") as f:
            f.write(name + "\\n")

    @settings(max_examples=4)
    @given(st.integers())
    def test_own_budget(x):
        note("own")

    @given(st.integers())
    def test_profile_budget(x):
        note("default")

    def test_runtime_budget():
        settings(max_examples=budget(3))(given(st.integers())(lambda x: note("runtime")))()

    def test_profile_is_derandomized_or_not():
        note("derandomize=%s" % settings().derandomize)
''')


def run_probe(tmp_path, profile):
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / f"{profile}.txt"
    env = dict(os.environ, POPGRAD_HYPOTHESIS_PROFILE=profile, PROBE_OUT=str(out),
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                        str(tmp_path / "test_probe.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = out.read_text().split()
    return {k: lines.count(k) for k in ("own", "default", "runtime")}, [x for x in lines if x.startswith("derand")]


def test_ci_profile_keeps_each_test_budget_and_is_derandomized(tmp_path):
    counts, derand = run_probe(tmp_path, "popgrad")
    assert counts == {"own": 4, "default": CI_MAX_EXAMPLES, "runtime": 3}
    assert derand == ["derandomize=True"]


def test_thorough_profile_raises_every_budget(tmp_path):
    counts, derand = run_probe(tmp_path, "thorough")
    assert counts["own"] == budget_thorough(4) and counts["runtime"] == budget_thorough(3)
    assert counts["default"] == THOROUGH_MAX_EXAMPLES
    assert derand == ["derandomize=False"]


def budget_thorough(n):
    return math.ceil(n * THOROUGH_FACTOR)


def test_budget_in_this_session():
    assert budget(7) == (budget_thorough(7) if settings().max_examples == THOROUGH_MAX_EXAMPLES else 7)
