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


@pytest.fixture(scope="module")
def client():
    """A local Dask cluster for one test module: 2 single-threaded worker processes (closed after the module)."""
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                           env={"NUMBA_NUM_THREADS": "1"})
    c = Client(cluster)
    c.wait_for_workers(2, timeout=120)  # both registered before the first test (a loaded machine starts them late)
    yield c
    c.close()
    cluster.close()
