import os
from pathlib import Path

import pytest

from .profiles import register_and_load, scale_items

register_and_load()

#: The full model's specialized kernels (popgrad.engine._kernels.specialize) are generated under the clone's
#: .pytest_cache, not in the user's cache folder (writable wherever the tests run; reused by the next run).
os.environ.setdefault("POPGRAD_KERNEL_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache"
                                                / "popgrad-kernels"))


def pytest_collection_modifyitems(items):
    """``thorough`` raises every test's own hypothesis budget (tests/profiles.py)."""
    scale_items(items)


@pytest.fixture(scope="session")
def _dask_client():
    """One local Dask cluster for the whole test run: 2 single-threaded worker processes, started when the
    first test asks for it (a run without such tests starts none) and closed at the end of the run. Starting
    a cluster costs seconds and each new worker process imports popgrad and loads its compiled kernels again,
    so the modules share one."""
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                           env={"NUMBA_NUM_THREADS": "1"})
    c = Client(cluster)
    c.wait_for_workers(2, timeout=120)  # both registered before the first test (a loaded machine starts them late)
    yield c
    c.close()
    cluster.close()


@pytest.fixture
def client(_dask_client):
    """The run's Dask client (:func:`_dask_client`), checked before each test: open, with both workers (a test
    that restarts a worker leaves the next one a full cluster)."""
    if _dask_client.status != "running":
        pytest.fail("the session's Dask client was closed by an earlier test; a test must not close it")
    _dask_client.wait_for_workers(2, timeout=120)
    return _dask_client
