"""The modules split for size (issue 26) keep their old import paths: each name moved out of
``task/tasks.py``, ``task/priors.py``, ``theory/information.py`` and ``app/sweep.py`` is the same object
at its old path as at its new home, and ``popgrad`` re-exports what it did."""
import importlib

import pytest

import popgrad as pg

MOVED = {
    "popgrad.task.tasks": {
        "popgrad.task.reference": ["decode_sequences", "sequence_weights_numpy", "parent_rows",
                                   "sequence_weights_multi_numpy"],
        "popgrad.task.table": ["TABLE_BUDGET_BYTES", "TABLE_CHUNK", "_merge_accuracy"],
        "popgrad.task.sampling": ["Sample"],
    },
    "popgrad.task.priors": {
        "popgrad.task.stationary": ["stationary_distribution", "STOCHASTIC_ATOL", "_as_stochastic", "_gth"],
        "popgrad.task.relabeling": ["relabel", "relabel_closure", "closed_under_relabeling", "MAX_CLOSURE_ATOMS",
                                    "_inverse_perms"],
    },
    "popgrad.theory.information": {
        "popgrad.theory.chain": ["ChainInformation", "chain_information", "normalized_kernel",
                                 "chi2_mutual_information", "sigma2", "dobrushin_coefficient",
                                 "chi2_contraction_coefficient", "deviation_norm2", "MU_MIN", "_as_transition",
                                 "_as_mu", "_kernels"],
        "popgrad.theory.joints": ["lca_distances", "pairwise_joint"],
    },
    "popgrad.app.sweep": {
        "popgrad.app.sweep_results": ["cell_id", "summary_row", "cached_row", "cached_report", "write_csv_atomic",
                                      "CONFIG_KEYS", "CELL_FACTS", "REPORT_KEYS", "FIRST_COLUMNS"],
        "popgrad.app.sweep_cluster": ["check_workers", "MAX_WORKERS_PER_CORE", "CLOSE_TIMEOUT_INTERRUPTED",
                                      "_start_client", "_stop_workers_now", "_close"],
    },
}
CASES = [(old, new, name) for old, homes in MOVED.items() for new, names in homes.items() for name in names]


@pytest.mark.parametrize("old, new, name", CASES, ids=[f"{o}.{n}" for o, _, n in CASES])
def test_a_moved_name_is_the_same_object_at_its_old_path(old, new, name):
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


def test_old_module_all_still_lists_its_public_names():
    for old in ("popgrad.task.tasks", "popgrad.task.priors", "popgrad.theory.information", "popgrad.app.sweep"):
        mod = importlib.import_module(old)
        missing = [n for n in mod.__all__ if not hasattr(mod, n)]
        assert not missing, (old, missing)


def test_the_package_exports_the_moved_public_names_unchanged():
    assert pg.Sample is pg.task.sampling.Sample and pg.stationary_distribution is pg.task.stationary.stationary_distribution
    assert pg.relabel_closure is pg.task.relabeling.relabel_closure
    assert pg.chain_information is pg.theory.chain.chain_information
    assert pg.pairwise_joint is pg.theory.joints.pairwise_joint


def test_a_task_keeps_its_slots_with_the_table_base():
    task = pg.Task(pg.chain(4), pg.dirichlet_prior(2, 1.0, 2, 0))
    assert not hasattr(task, "__dict__")
    assert isinstance(task, pg.task.table.WeightTable) and task.weight_table().shape == (16, 2)
