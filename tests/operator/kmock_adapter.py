"""kmock as the test API server uses it: the one module that names what of kmock it relies on.

The test API server (apiserver.py) and its extensions (admission_refusals.py, pod_logs.py)
import kmock's request, payload and error types from here. Tested with kmock 0.8, which
pyproject.toml pins (`kmock>=0.8,<0.9`), because the server relies on more than kmock documents:
kmock is built to answer what a test scripts, while apiserver.ApiServer extends its
KubernetesEmulator where the operator relies on a real API server's behaviour (resourceVersions,
watch replays, the status subresource, finalizers, admission), and for that it overrides
and uses members kmock keeps private:

- KubernetesEmulator's request hooks: `_handle` (every request), `_serve_list` and
  `_serve_watch` (label selectors, watch replays from a resourceVersion), `_render_error`
  (the Retry-After header of a 429), and `_lock`, which guards its object store;
- `Request._raw_request`, the aiohttp request under kmock's, for the responses that stream
  (watches, followed logs): `raw_request()` here.

A kmock release may rename any of them. An override of a renamed hook would silently override
nothing and the operator's tests would fail far from the cause, so this module refuses to load
when one is missing, and says which.
"""

from __future__ import annotations

import aiohttp.web
import attrs
import kmock

Request = kmock.Request
Payload = kmock.Payload
KubernetesError = kmock.KubernetesError

TESTED_VERSION = "0.8"
EMULATOR_HOOKS = ("_handle", "_serve_list", "_serve_watch", "_render_error")
EMULATOR_FIELDS = ("_lock",)
REQUEST_FIELDS = ("_raw_request",)


def raw_request(request: Request) -> aiohttp.web.BaseRequest | None:
    """The aiohttp request under kmock's (None only for a Request made outside a server, as in kmock's own tests)."""
    return request._raw_request


def _require_internals() -> None:
    emulator_fields = attrs.fields_dict(kmock.KubernetesEmulator)
    request_fields = attrs.fields_dict(kmock.Request)
    missing = (
        [f"KubernetesEmulator.{name}" for name in EMULATOR_HOOKS
         if not callable(getattr(kmock.KubernetesEmulator, name, None))]
        + [f"KubernetesEmulator.{name}" for name in EMULATOR_FIELDS if name not in emulator_fields]
        + [f"Request.{name}" for name in REQUEST_FIELDS if name not in request_fields]
    )
    if missing:
        raise ImportError(
            f"kmock {kmock.__version__} has no {', '.join(missing)}, which the test API server "
            f"(tests/operator/apiserver.py) overrides or uses; it was tested with kmock {TESTED_VERSION}: "
            "install that (pyproject.toml pins it) or port the server to this kmock"
        )


_require_internals()


def is_dry_run(request: Request) -> bool:
    """A server-side dry run (`?dryRun=All`): admission runs, nothing is stored."""
    return request.params.get("dryRun") == "All"
