"""Every allocation of a sampled full-model run is sized before it starts: the read-outs too, not only the
training batch (the same rule, ``popgrad._io.over_half_of_memory``; one line, exit 2, nothing written)."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import popgrad as pg
from popgrad.app import cli
from popgrad.checks import catformer_sampled as cs


def _limit(monkeypatch, nbytes):
    import resource

    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit",
                        lambda lim: (nbytes, resource.RLIM_INFINITY) if lim == resource.RLIMIT_AS else real(lim))


def test_readouts_past_memory_are_refused_before_training(monkeypatch, tmp_path, capsys):
    """The case of the report: batches of 1 fit, the 8192 read-out sequences at T = 4096 do not."""
    _limit(monkeypatch, 6_000_000_000)
    out = tmp_path / "o"

    def run(*a, **k):
        raise AssertionError("the run started: the read-outs were not sized before training")

    monkeypatch.setattr(cli, "run", run)
    rc = cli.main(["run", "--model", "catformer", "--gradient", "sampled", "--S", "16", "--T", "4096", "--steps", "1",
                   "--batch-size", "1", "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "the sampled read-outs need about" in err and "use a smaller --T" in err
    assert not out.exists()


@pytest.mark.parametrize("S, T, heads", [(2, 6, (1, 1)), (3, 12, (2, 1)), (2, 40, (1, 2))])
def test_the_estimate_bounds_the_measured_peak(S, T, heads):
    task = pg.Task(pg.chain(T), pg.dirichlet_prior(S=S, alpha=1.0, n_atoms=2, seed=0))
    model = pg.CatFormer(S, T, heads=heads)
    params = model.init(0.5, 1)
    n = 300
    cs.sampled_readouts(task, model, params, n=n, seed=1, alpha=1.0)  # warm (imports, compiles)
    tracemalloc.start()
    try:
        cs.sampled_readouts(task, model, params, n=n, seed=1, alpha=1.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= cs.readout_peak_bytes(task, model, n), (peak, cs.readout_peak_bytes(task, model, n))


def test_forward_passes_are_chunked_by_memory(monkeypatch):
    """At a size whose forward pass per sequence is large, the read-outs run one sequence at a time (the same
    numbers as one chunk)."""
    big = pg.CatFormer(16, 4096)
    assert cs.readout_rows_per_chunk(big) == 1 and cs.readout_rows_per_chunk(pg.CatFormer(2, 6)) == 4096
    task = pg.Task(pg.chain(8), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=2, seed=0))
    model = pg.CatFormer(2, 8)
    params = model.init(1.0, 2)
    whole = cs.sampled_readouts(task, model, params, n=50, seed=3, alpha=1.0)
    seen = []
    real = cs.catformer_forward
    monkeypatch.setattr(cs, "READOUT_CHUNK_BYTES", 7 * cs.forward_bytes_per_sequence(model))
    monkeypatch.setattr(cs, "catformer_forward", lambda m, p, s: seen.append(len(s)) or real(m, p, s))
    parts = cs.sampled_readouts(task, model, params, n=50, seed=3, alpha=1.0)
    assert max(seen) == 7
    np.testing.assert_allclose(parts["population"]["mean"], whole["population"]["mean"], rtol=1e-12, atol=1e-15)
    assert parts["losses"]["L_model"]["value"] == pytest.approx(whole["losses"]["L_model"]["value"], rel=1e-12)


def test_the_readouts_time_is_estimated_before_the_run(monkeypatch):
    """What fits in memory can still take days: the run says how long before it starts, from a timed probe at a
    small T (never the run's own size) scaled by the flop count."""
    import popgrad.model.catformer as mc
    from popgrad.app.kinds.catformer import readout_seconds

    probed = []
    real = mc.catformer_forward
    monkeypatch.setattr(mc, "catformer_forward", lambda m, p, s: probed.append((m.T, len(s))) or real(m, p, s))
    big = pg.Task(pg.chain(4096), pg.dirichlet_prior(S=16, alpha=1.0, n_atoms=1, seed=0, symmetrize=False))
    days = readout_seconds(big, (1, 1)) / 86400
    assert days > 1 and probed and max(T for T, _ in probed) <= 32 and max(n for _, n in probed) <= 64, probed
    small = pg.Task(pg.chain(12), pg.dirichlet_prior(S=2, alpha=1.0, n_atoms=1, seed=0))
    assert 0 < readout_seconds(small, (1, 1)) < readout_seconds(big, (1, 1)) / 1e4
    assert cs.forward_flops(pg.CatFormer(2, 6)) == 2 * 6 * 8**2 + 4 * 36 * 8 + 2 * 6 * 16**2 + 4 * 36 * 16
