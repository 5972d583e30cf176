"""Old module paths still import for one release and warn (popgrad._compat); nothing else in tests uses them."""
import importlib

import numpy as np
import pytest

import popgrad as pg
from popgrad.engine import reference
from popgrad.engine import baselines


def test_old_exact_path_warns_and_forwards():
    # ``import popgrad.exact`` then ``popgrad.exact.x`` fails: install() does not set the package attribute
    # (reported to the lead); the module object itself is registered and forwards
    exact = importlib.import_module("popgrad.exact")
    from popgrad import exact as exact_from

    assert exact_from is exact
    with pytest.warns(DeprecationWarning, match="popgrad.exact is deprecated"):
        fn = exact.exact_loss_and_grad
    assert fn is pg.exact_loss_and_grad
    with pytest.warns(DeprecationWarning):
        assert exact.exact_loss_and_grad_numpy is reference.exact_loss_and_grad_numpy


def test_old_multihead_names_import_with_a_warning():
    with pytest.warns(DeprecationWarning):
        from popgrad.multihead import exact_loss_and_grad_multi  # noqa: F401
    with pytest.warns(DeprecationWarning):
        from popgrad.multihead import construction_params
    assert construction_params is baselines.construction_params


@pytest.mark.parametrize("old, name, new", [
    ("popgrad.multiparent", "MultiParentTask", "popgrad.task.tasks"),
    ("popgrad.dynamics", "train_two_stage", "popgrad.train.algorithm1"),
    ("popgrad.cli", "main", "popgrad.app.cli"),
    ("popgrad.information", "pairwise_joint", "popgrad.theory.information"),
])
def test_moved_modules_forward(old, name, new):
    mod = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        got = getattr(mod, name)
    assert got is getattr(importlib.import_module(new), name)


def test_deprecated_multi_aliases_warn_and_keep_their_task_check():
    """The ``_multi`` names forward to the one API; the old k-head entry point still rejects a single-parent task."""
    task = pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(2, 2, 1.0, 2, 0, symmetrize=True))
    A1, A2 = np.zeros((2, 5, 5)), np.zeros((2, 2, 2))
    with pytest.warns(DeprecationWarning):
        old = pg.exact_loss_and_grad_multi(task, A1, A2)
    new = pg.exact_loss_and_grad(task, A1, A2)
    assert old.loss == new.loss and np.array_equal(old.dA1, new.dA1)
    assert pg.MultiLossAndGrad is pg.LossAndGrad
    single = pg.Task(pg.chain(5), pg.dirichlet_prior(2, 1.0, 1, 0))
    for fn in (pg.exact_loss_and_grad_multi, pg.exact_loss_multi):
        with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="task must be a popgrad.MultiParentTask"):
            fn(single, A1, A2)


def test_model_and_task_paths_are_now_packages_that_keep_the_old_names():
    """``popgrad.model`` / ``popgrad.task`` are real subpackages now (no stand-in, no warning)."""
    from popgrad.model import reduced
    from popgrad.task import tasks

    assert pg.model.softmax is reduced.softmax and pg.model.predict is reduced.predict
    assert pg.task.Task is tasks.Task and pg.task.sequence_weights_numpy is tasks.sequence_weights_numpy
