import os

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
