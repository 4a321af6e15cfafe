"""pytest configuration shared by the test files: hypothesis profiles for the
property-based tests (tests/test_fuzz.py) and CUDA memory hygiene.

Hypothesis profiles, chosen with TORCH_OSS_FUZZ_PROFILE (default "ci"):

  ci    derandomize=True (a fixed seed: every CI run draws the same cases), no
        example database, deadline=None; TORCH_OSS_FUZZ_CI_EXAMPLES examples
        per fuzz test and device (default 60: 240 CPU cases). Keeps
        tests/test_fuzz.py around a minute on a 2-core CPU.
  long  fresh random cases on each run, deadline=None;
        TORCH_OSS_FUZZ_LONG_EXAMPLES examples per fuzz test and device
        (default 3000: 4 fuzz tests x 3000 = 12,000 cases per device). Meant
        for the GPU:  TORCH_OSS_FUZZ_PROFILE=long pytest tests/test_fuzz.py -k cuda
  dev   a quick random smoke run (20 examples) while editing.

TORCH_OSS_FUZZ_NO_SHRINK=1 reports a failing case as drawn, without shrinking it,
and skips the replay of failures saved in the example database (fresh cases only).

A failing case prints its reproduction blob (print_blob=True); paste it into
@reproduce_failure or rerun with the same profile (ci is fully reproducible).
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

_SLOW_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("TORCH_OSS_FUZZ_CI_EXAMPLES", "60")),
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_CHECKS,
)
settings.register_profile(
    "long",
    max_examples=int(os.environ.get("TORCH_OSS_FUZZ_LONG_EXAMPLES", "3000")),
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_CHECKS,
)
settings.register_profile(
    "dev",
    max_examples=20,
    derandomize=False,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_CHECKS,
)
FUZZ_PROFILE = os.environ.get("TORCH_OSS_FUZZ_PROFILE", "ci")
if os.environ.get("TORCH_OSS_FUZZ_NO_SHRINK", "") not in ("", "0"):
    # report the first failing case as drawn, without minimising it (shrinking
    # re-runs a failing test hundreds of times: too slow for a GPU session),
    # and draw fresh cases only: no replay of failures saved by earlier runs
    # (scripts/fuzz_chunks.sh counts fresh cases)
    settings.register_profile(FUZZ_PROFILE + "-noshrink", parent=settings.get_profile(FUZZ_PROFILE),
                              phases=[Phase.explicit, Phase.generate])
    FUZZ_PROFILE += "-noshrink"
settings.load_profile(FUZZ_PROFILE)


def pytest_report_header(config):
    return (f"hypothesis profile: {FUZZ_PROFILE} (max_examples={settings().max_examples}, "
            f"derandomize={settings().derandomize})")


@pytest.fixture
def cuda_memory_freed():
    """Frees cached CUDA memory after a test that allocates gigabytes, so the
    next test starts from an empty device."""
    yield
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
