import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "popgrad",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
    derandomize=True,  # CI sees the same examples every run; use the "thorough" profile to explore
)
settings.register_profile("thorough", parent=settings.get_profile("popgrad"), max_examples=500, derandomize=False)
settings.load_profile(os.environ.get("POPGRAD_HYPOTHESIS_PROFILE", "popgrad"))


@pytest.fixture(scope="module")
def client():
    """A local Dask cluster for one test module: 2 single-threaded worker processes (closed after the module)."""
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                           env={"NUMBA_NUM_THREADS": "1"})
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()
