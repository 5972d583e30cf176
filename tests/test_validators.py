"""One family of validators (issue 19): one task validator, one idealized-gradient predicate, an explicit expansion."""
import numpy as np
import pytest

import popgrad as pg
from popgrad.task import check_task
from popgrad.task.tasks import ExactTask
from popgrad.theory import has_idealized_gradient


def _single():
    return pg.Task(pg.chain(5), pg.dirichlet_prior(2, 1.0, 2, seed=0))


def _multi():
    return pg.MultiParentTask(pg.two_parent(5), pg.dirichlet_tensor_prior(2, 2, 1.0, 2, seed=0))


@pytest.mark.parametrize("kind, wrong, want", [
    (ExactTask, "not a task", "popgrad.Task or popgrad.MultiParentTask"),
    (pg.Task, _multi(), r"popgrad.Task \(graph \+ prior\)"),
    (pg.MultiParentTask, _single(), "popgrad.MultiParentTask"),
])
def test_one_exception_type_for_every_kind(kind, wrong, want):
    with pytest.raises(TypeError, match=f"task must be a {want}.*got {type(wrong).__name__}"):
        check_task(wrong, kind)
    with pytest.raises(ValueError):  # ArgumentTypeError: also a ValueError for popgrad 0.1 callers
        check_task(wrong, kind)


def test_check_task_returns_the_task_and_names_the_purpose():
    t = _single()
    assert check_task(t) is t and check_task(t, pg.Task) is t
    with pytest.raises(TypeError, match="for the Stage-1 field"):
        pg.stage1_field(_multi())


@pytest.mark.parametrize("call", [
    lambda t: pg.exact_loss_and_grad(t, np.zeros((5, 5)), np.zeros((2, 2))),
    lambda t: pg.train_two_stage(t, steps1=1, steps2=0),
    lambda t: pg.idealized_gradient(t),
    lambda t: pg.train_multi_head(t, steps1=1),
])
def test_public_functions_raise_the_same_type(call):
    """A wrong task type is a TypeError in every layer (engine, train, theory), never a bare ValueError."""
    with pytest.raises(TypeError, match="task must be a popgrad"):
        call(object())


def test_idealized_gradient_predicate():
    task = _single()
    assert has_idealized_gradient(task)
    pg.idealized_gradient(task)  # exists where the predicate says so
    reducible = pg.FinitePrior(np.array([[[1.0, 0.0], [0.5, 0.5]]]))  # state 1 is transient: μ = (1, 0)
    bad = pg.Task(pg.chain(5), reducible)
    assert not has_idealized_gradient(bad)
    with pytest.raises(ValueError, match="stationary probability"):
        pg.idealized_gradient(bad)
    assert not has_idealized_gradient(_multi())  # no idealized gradient for k heads
    assert not has_idealized_gradient("not a task")
    from popgrad.train.algorithm1 import idealized_available

    assert idealized_available is has_idealized_gradient  # the old name


def test_the_predicate_never_expands_an_implicit_closure():
    """S = 10: the closure would have 3,628,800 atoms; ``expand()`` refuses it, the predicate reads the base draws."""
    prior = pg.dirichlet_prior(10, 1.0, 1, seed=0, symmetrize=True)
    assert prior.implicit_closure
    assert has_idealized_gradient(pg.Task(pg.chain(3), prior))
    with pytest.raises(ValueError, match="atoms"):
        prior.expand()


def test_expand_is_the_full_atom_set():
    base = pg.dirichlet_prior(3, 1.0, 2, seed=1, symmetrize=False)
    closed = pg.FinitePrior.relabeling_closure(base.atoms, base.weights)
    atoms, weights = closed.expand()
    want_atoms, want_weights = pg.relabel_closure(base.atoms, base.weights)
    assert atoms.shape == (12, 3, 3) and np.array_equal(atoms, want_atoms) and np.array_equal(weights, want_weights)
    assert closed.atoms is atoms and closed.weights is weights  # the properties read the expansion
    assert not atoms.flags.writeable
    a, w = base.expand()
    assert a is base.atoms and w is base.weights  # a plain prior: no copy
