"""The public surface (issue 26 item 7): deprecated names importable but not in ``__all__``; the missing
public names exported."""
import warnings

import pytest

import popgrad as pg


def test_every_public_name_exists_once_and_none_is_deprecated():
    assert len(pg.__all__) == len(set(pg.__all__))
    assert [n for n in pg.__all__ if not hasattr(pg, n)] == []
    assert set(pg.DEPRECATED).isdisjoint(pg.__all__)
    assert {"Optimizer", "stage1_row_noise"} <= set(pg.__all__)
    assert pg.Optimizer is __import__("popgrad.train.optim", fromlist=["Optimizer"]).Optimizer
    assert pg.stage1_row_noise is pg.engine.noise.stage1_row_noise
    assert "catformer_rows_loss_and_grad" in pg.__all__
    assert pg.catformer_rows_loss_and_grad is pg.engine.catformer.catformer_rows_loss_and_grad
    assert ">>> rows = pg.catformer_rows_loss_and_grad(" in pg.catformer_rows_loss_and_grad.__doc__


@pytest.mark.parametrize("name", pg.DEPRECATED)
def test_deprecated_names_still_import(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # importing is silent; calling warns (tests/engine)
        exec(f"from popgrad import {name}")
    assert callable(getattr(pg, name))
