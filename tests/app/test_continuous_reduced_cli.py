"""``popgrad run --prior continuous`` with the reduced model (the default ``--model``): it trained, then failed
on its references and checks (an ε-oracle loss with no closed form, a loss-only engine call, the field and
the in-distribution OOD quantile summing over atoms). Now the run completes, the atom-based checks say why
they have nothing to test, and the atom-based gradients are refused up front in one line."""
from __future__ import annotations

import json

import pytest

from popgrad.app import cli


def _one_line_error(capsys, rc):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("extra", [[], ["--stage2", "sampled", "--samples", "500"]])
def test_the_reduced_run_on_the_continuous_prior(tmp_path, capsys, extra):
    out = tmp_path / "o"
    rc = cli.main(["run", "--prior", "continuous", "--S", "2", "--T", "5", "--steps1", "20", "--steps2", "20",
                   *extra, "--no-progress", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    report = json.loads((out / "report.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    for name in ("gradient_alignment", "field_dpi"):
        assert checks[name]["status"] == "not_applicable"
        assert "continuous prior has no atoms" in checks[name]["reason"], checks[name]
    # the checks that need no atoms are decided or say which hypothesis fails (gamma = 0 under Dirichlet rows)
    assert checks["graph_recovery"]["status"] in ("pass", "fail", "inconclusive")
    assert checks["ood_generalization"]["details"]["in_distribution_quantile"] is None
    # the per-draw assumptions say why they are not measured (they used to print an error string), and the
    # finite prior's settings, which --prior continuous refuses, are not echoed as if they applied
    assert "not_measured" in report["task"]["assumptions"]
    md = (out / "report.md").read_text()
    assert "Paper assumptions (Knowl 10) per prior draw: not measured" in md and "error =" not in md
    config_line = next(line for line in md.splitlines() if line.startswith("Configuration:"))
    assert "`prior=continuous`" in config_line and "atoms=" not in config_line and "floor=" not in config_line


@pytest.mark.parametrize("args, needle", [
    (["--gradient", "field"], "--gradient field sums over the prior's atoms"),
    (["--gradient", "idealized"], "--gradient idealized sums over the prior's atoms"),
    (["--T", "40"], "what --gradient auto takes beyond enumeration"),
])
def test_atom_based_gradients_are_refused_up_front(tmp_path, capsys, args, needle):
    rc = cli.main(["run", "--prior", "continuous", *args, "--no-progress", "--out", str(tmp_path / "o")])
    err = _one_line_error(capsys, rc)
    assert needle in err and "--prior finite" in err, err
    assert not (tmp_path / "o").exists()
