"""Re-runs one failing case of tests/test_fuzz.py from the reproduction blob
hypothesis printed with it (same hypothesis version), without editing the test:

    python3 scripts/reproduce_fuzz_failure.py test_fuzz_attention_backward cuda 6.168.3 'AXic...'

Prints the drawn case (hypothesis notes) and the failure, or "passed". Set
CUDA_LAUNCH_BLOCKING=1 to see which kernel a CUDA error comes from.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from hypothesis import Verbosity, given, reproduce_failure, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import test_fuzz  # noqa: E402


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    name, device, version, blob = sys.argv[1:]
    test = getattr(test_fuzz, name)
    # the softmax tests carry their own settings, which cannot be decorated twice:
    # rebuild them from the undecorated body and the same strategy (same draws)
    if "softmax" in name:
        test = given(case=test_fuzz.softmax_cases())(test.hypothesis.inner_test)
    test = settings(verbosity=Verbosity.verbose, print_blob=False, deadline=None)(test)
    test = reproduce_failure(version, blob.encode())(test)
    try:
        test(device=device)
    except Exception as e:  # the failure is the output
        print(f"FAILED: {type(e).__name__}: {e}")
        sys.exit(1)
    print("passed")


if __name__ == "__main__":
    main()
