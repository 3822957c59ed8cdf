"""Object storage (s3://, gs://) for checkpoints and artifacts, through fsspec (s3fs, gcsfs).

Where the service is and who the pod is come from the environment, the cloud way: the SDKs read
AWS_ENDPOINT_URL_S3 and AWS_REGION (the operator sets them from spec.storage.s3), and the pod's
service account (IRSA, Workload Identity) or the variables of spec.storage.credentialsSecret.
Nothing here names a credential, and no message carries one.

An object appears whole or not at all: s3fs uploads a large file in parts and the object exists
only once the last part is committed (a single PUT for a small one), and GCS finalises a resumable
upload the same way. So a writer killed mid-upload leaves no object under the name.

Writes are retried with exponential backoff (`RETRY_DELAYS_SECONDS`); the SDK's own connection
timeouts are short, so that an unreachable service is named within seconds rather than minutes.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

from dtrain_common.errors import ConfigError
from dtrain_operator.api.redaction import redact_text
from dtrain_operator.api.storage import is_object_url

log = logging.getLogger("dtrain_trainer")

# Waits between attempts of one write: five attempts over about half a minute.
RETRY_DELAYS_SECONDS = (1.0, 2.0, 4.0, 8.0)
# Parts of a streamed upload: memory holds one part, never the whole checkpoint.
UPLOAD_PART_BYTES = 16 << 20
# botocore's own: a dead endpoint fails in seconds; a slow upload of one part still has minutes.
_S3_CLIENT_CONFIG = {"connect_timeout": 5, "read_timeout": 120, "retries": {"max_attempts": 2, "mode": "standard"}}


class ObjectStoreError(ConfigError):
    """The object store cannot be reached or refuses the job's requests: no restart cures it."""


def _options(url: str) -> dict[str, Any]:
    if url.startswith("s3://"):
        # No listings cache: a checkpoint another process wrote (or removed) is seen at once.
        return {"config_kwargs": _S3_CLIENT_CONFIG, "default_block_size": UPLOAD_PART_BYTES, "use_listings_cache": False}
    return {}


def filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of `url` and the path within it."""
    import fsspec  # the trainer extra's s3fs and gcsfs register the s3 and gs protocols

    try:
        fs, path = fsspec.core.url_to_fs(url, **_options(url))
    except ImportError as exc:
        raise ObjectStoreError(
            f"{url}: this image lacks the package for {url.split('://')[0]}:// ({exc}); install dtrain's trainer extra"
        ) from None
    return fs, path


def join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"


def describe(exc: BaseException) -> str:
    """An SDK error in one line, without anything that looks like a credential."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return redact_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def write_probe_name() -> str:
    """The name of a probe that a write check writes and removes, which no other process uses: not the pid, since
    each pod has a PID namespace of its own, and the ranks of a gang starting together on a shared volume or prefix
    had the same pid, one removing the probe another was about to remove (ENOENT: 'not writable')."""
    return f".dtrain-write-check.{uuid.uuid4().hex}"


def check_writable(url: str, field: str) -> None:
    """`url` takes an object (a probe written and removed), or an ObjectStoreError naming the URL and the error.

    Checked before training, so that a wrong bucket, endpoint or credential fails the job in seconds.
    """
    probe = join(url, write_probe_name())
    try:
        fs, path = filesystem(probe)
        fs.pipe_file(path, b"ok")
        fs.rm_file(path)
    except ObjectStoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - any SDK error (botocore, aiohttp, google) means unreachable
        raise ObjectStoreError(
            f"{field} {url} is unreachable ({describe(exc)}); check the bucket, spec.storage.s3.endpoint "
            "and the credentials (spec.storage.credentialsSecret or the pod's service account)"
        ) from None


@dataclass(frozen=True)
class Upload:
    """How one write to object storage went."""

    url: str
    ok: bool
    seconds: float
    bytes: int = 0
    attempts: int = 1
    error: str | None = None


def with_retries(
    url: str,
    write: Callable[[], int],
    delays: tuple[float, ...] = RETRY_DELAYS_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> Upload:
    """Run `write` (which returns the bytes it wrote) until it succeeds or the delays run out; never raises
    for a storage error: the outcome says what happened."""
    started = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        try:
            size = write()
            return Upload(url, True, time.monotonic() - started, size, attempts)
        except Exception as exc:  # noqa: BLE001 - a storage error is an outcome to report, not a crash
            error = describe(exc)
            if attempts > len(delays):
                return Upload(url, False, time.monotonic() - started, 0, attempts, error)
            delay = delays[attempts - 1]
            log.warning("writing %s failed (%s); attempt %d of %d in %.0f s", url, error, attempts + 1, len(delays) + 1, delay)
            sleep(delay)


@contextmanager
def open_for_writing(url: str) -> Iterator[IO[bytes]]:
    """A file that streams to `url` part by part; the object appears when the block closes without error."""
    fs, path = filesystem(url)
    with fs.open(path, "wb") as handle:
        yield handle


class _PartWriter:
    """Hands a large write to the object file one part at a time (slices, no copies), so that the file's
    buffer, which it uploads as a part whenever it holds a part's worth, never holds more than that:
    torch.save writes a tensor's bytes in one call, which the file would otherwise copy whole."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.written = 0

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), UPLOAD_PART_BYTES):
            self.handle.write(view[start : start + UPLOAD_PART_BYTES])
        self.written += len(view)
        return len(view)

    def flush(self) -> None:
        """The file uploads its parts as they fill, and the last one when it closes."""


def stream_to(url: str, write: Callable[[Any], None]) -> int:
    """Write an object by streaming into it, part by part; the bytes written."""
    with open_for_writing(url) as handle:
        writer = _PartWriter(handle)
        write(writer)
    return writer.written


def upload_file(local: str, url: str) -> Upload:
    def write() -> int:
        fs, path = filesystem(url)
        fs.put_file(local, path)
        return os.path.getsize(local)

    return with_retries(url, write)


def put_bytes(url: str, data: bytes) -> Upload:
    def write() -> int:
        fs, path = filesystem(url)
        fs.pipe_file(path, data)
        return len(data)

    return with_retries(url, write)


def download_file(url: str, local: str) -> None:
    fs, path = filesystem(url)
    fs.get_file(path, local)


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return bool(fs.exists(path))


def read_json(url: str) -> Any:
    """The JSON object at `url`, or None when there is none."""
    fs, path = filesystem(url)
    try:
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def read_text(url: str) -> str | None:
    """The text at `url`, stripped, or None when there is none."""
    fs, path = filesystem(url)
    try:
        return bytes(fs.cat_file(path)).decode().strip() or None
    except FileNotFoundError:
        return None


def list_names(directory: str) -> list[str]:
    """Names of the objects directly under `directory` (empty when there is none)."""
    fs, path = filesystem(directory)
    try:
        entries = fs.ls(path, detail=False, refresh=True)
    except FileNotFoundError:
        return []
    return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries]


def remove(url: str) -> None:
    fs, path = filesystem(url)
    if fs.exists(path):
        fs.rm_file(path)


__all__ = [
    "ObjectStoreError",
    "Upload",
    "check_writable",
    "download_file",
    "exists",
    "filesystem",
    "is_object_url",
    "join",
    "list_names",
    "open_for_writing",
    "put_bytes",
    "read_json",
    "read_text",
    "remove",
    "stream_to",
    "upload_file",
    "with_retries",
]
