"""On PYTHONPATH of one test "node": its trainer process (RANK set, unlike torchrun's agent) starts
DTRAIN_TEST_SLOW_START seconds late, as a worker stuck before the pre-flight check would be."""

import os
import time

if os.environ.get("RANK") is not None and os.environ.get("DTRAIN_TEST_SLOW_START"):
    time.sleep(float(os.environ["DTRAIN_TEST_SLOW_START"]))
