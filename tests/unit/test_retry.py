"""Retry timing: the reconcile's back-off and the API server's Retry-After."""

from __future__ import annotations

import pytest

from dtrain_operator.controller.kube import ApiError, _retry_after
from dtrain_operator.controller.workqueue import RETRY_MAX_SECONDS, retry_delay


def test_the_backoff_starts_in_milliseconds_and_is_capped():
    delays = [retry_delay(n, RuntimeError()) for n in range(1, 40)]
    assert delays[:3] == [0.005, 0.01, 0.02]
    assert max(delays) == RETRY_MAX_SECONDS and delays == sorted(delays)


def test_the_server_s_retry_after_is_a_floor():
    assert retry_delay(1, ApiError(429, "TooManyRequests", "", retry_after=3.0)) == 3.0
    assert retry_delay(1, ApiError(429, "TooManyRequests", "", retry_after=3600.0)) == RETRY_MAX_SECONDS


@pytest.mark.parametrize(
    "status,header,wait",
    [(429, "2", 2.0), (429, None, 1.0), (429, "soon", 1.0), (503, "5", 5.0), (503, None, None), (409, "5", None)],
)
def test_retry_after_is_read_as_client_go_reads_it(status, header, wait):
    assert _retry_after(status, header) == wait
