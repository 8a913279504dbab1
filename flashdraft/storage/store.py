"""Object store: one small layer over fsspec for `file://`, `s3://` and `memory://`.

Every stage reads and writes through this module, so the commit protocol and the retry policy live in one place
(docs/failure-model.md has the details):

* `put` is atomic per object (temp file + rename on POSIX; a single PUT on S3).
* `commit(key, data)` writes the object, then a `<key>.commit` record (sha256, size); readers see only committed
  objects (`list_committed`, `get_verified`), so a crash between the two writes leaves an invisible orphan that
  the next run overwrites. Small objects travel inside their record, so re-committing one is a single atomic
  write; a large object re-committed with different bytes is uncommitted first.
* The only retry layer (botocore's and s3fs's retries are off; retries are logged and counted in `io_counters()`):
  throttling, 5xx, resets, timeouts and read checksum mismatches back off (`storage.retries`,
  `storage.retry_base_s`), then raise `StoreUnavailableError`. Missing objects and bad credentials raise at once,
  a full or read-only disk as `StoreFullError` / `StoreReadOnlyError`.

S3 credentials come from the standard AWS environment variables or from `FLASHDRAFT_S3_SECRET_DIR` (a mounted
Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY); never from config files, never in logs or reprs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import hashlib
import json
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import fsspec

from flashdraft.config import StorageConfig
from flashdraft.config.features import STORAGE_SCHEMES, split_uri
from flashdraft.storage import layout

log = logging.getLogger(__name__)
T = TypeVar("T")

COMMIT_SUFFIX = ".commit"
SECRET_DIR_ENV = "FLASHDRAFT_S3_SECRET_DIR"
NO_CREDENTIALS = ("no S3 credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or "
                  f"{SECRET_DIR_ENV} to a folder holding them (a mounted Kubernetes Secret)")


class StoreError(RuntimeError):
    """An object-store operation failed for a reason a retry will not fix."""


class ChecksumError(StoreError):
    """Stored bytes do not match their commit record."""


class NotCommittedError(StoreError):
    """The object has no commit record (missing, or a partial write from a crashed run)."""


class StoreUnavailableError(StoreError):
    """Transient errors outlasted the retry budget (the store is down, or throttling us for too long)."""


class StoreFullError(StoreError):
    """No space (or quota) left on the store's filesystem; committed work is kept, a rerun resumes."""


class StoreReadOnlyError(StoreError):
    """The store's filesystem is mounted read-only."""


@dataclass(frozen=True)
class CommitRecord:
    key: str
    sha256: str
    size: int
    meta: dict[str, Any]
    inline: bytes | None = None  # the object itself, for small objects (see INLINE_MAX_BYTES)

    def to_json(self) -> bytes:
        out = {"key": self.key, "sha256": self.sha256, "size": self.size, "meta": self.meta}
        if self.inline is not None:
            out["inline_b64"] = base64.b64encode(self.inline).decode()
        return json.dumps(out, sort_keys=True).encode()


# Objects up to this size also travel inside their commit record, which makes re-committing them atomic.
INLINE_MAX_BYTES = 16 * 2**10


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


class _IOCounters:
    """Process-wide store counters (thread-safe): operations, retries by cause, operations given up on."""

    KINDS = ("throttled", "server_error", "connection", "timeout", "checksum")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c = {"operations": 0, "retries": 0, "gave_up": 0, **{f"retries_{k}": 0 for k in self.KINDS}}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._c[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._c)


_COUNTERS = _IOCounters()


def io_counters(since: dict[str, int] | None = None) -> dict[str, int]:
    """This process's store operations, retries (total and by cause) and give-ups; minus `since` when given.

    A stage takes a snapshot when it starts and records `io_counters(snapshot)` as `store_io` in its metrics."""
    now = _COUNTERS.snapshot()
    return {k: v - (since or {}).get(k, 0) for k, v in now.items()}


_EREMOTEIO = getattr(errno, "EREMOTEIO", 121)  # s3fs maps HTTP 500 InternalError to it
_TRANSIENT_ERRNO = {errno.EBUSY: "throttled", errno.EAGAIN: "throttled", _EREMOTEIO: "server_error",
                    errno.ETIMEDOUT: "timeout", errno.ECONNRESET: "connection", errno.ECONNREFUSED: "connection",
                    errno.ECONNABORTED: "connection", errno.EPIPE: "connection"}
# Transport failures of botocore / aiohttp / urllib3, matched by class name anywhere in the exception's MRO so this
# module needs none of them installed.
_TRANSPORT_ERRORS = {"HTTPClientError": "connection", "EndpointConnectionError": "connection",
                     "ConnectionClosedError": "connection", "ReadTimeoutError": "timeout",
                     "ConnectTimeoutError": "timeout", "ResponseParserError": "server_error",
                     "IncompleteReadError": "connection", "IncompleteRead": "connection",
                     "ClientPayloadError": "connection", "ClientConnectionError": "connection",
                     "ServerDisconnectedError": "connection", "ServerTimeoutError": "timeout",
                     "ProtocolError": "connection"}
_SERVER_MARKERS = ("SlowDown", "ServiceUnavailable", "InternalError", "reduce your request rate")


def transient_kind(exc: BaseException) -> str | None:
    """Why `exc` is worth retrying ("throttled", "server_error", "connection", "timeout", "checksum"), or None
    when a retry cannot help (missing object, permissions, bad request, full or read-only disk)."""
    if isinstance(exc, ChecksumError):
        return "checksum"
    if isinstance(exc, StoreError | FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError
                  | FileExistsError):
        return None
    if isinstance(exc, ConnectionError):
        return "connection"
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNO:
        return _TRANSIENT_ERRNO[exc.errno]
    for cls in type(exc).__mro__:
        if cls.__name__ in _TRANSPORT_ERRORS:
            return _TRANSPORT_ERRORS[cls.__name__]
    if isinstance(exc, OSError) and exc.errno == errno.EIO and any(m in str(exc) for m in _SERVER_MARKERS):
        return "server_error"  # an S3 error code s3fs does not map, carrying the server's message
    return None


def _s3_credentials() -> dict[str, str]:
    secret_dir = os.environ.get(SECRET_DIR_ENV)
    if secret_dir:
        folder = Path(secret_dir)
        out = {}
        for name, kw in (("AWS_ACCESS_KEY_ID", "key"), ("AWS_SECRET_ACCESS_KEY", "secret"),
                         ("AWS_SESSION_TOKEN", "token")):
            f = folder / name
            if f.is_file():
                out[kw] = f.read_text().strip()
        if "key" not in out or "secret" not in out:
            raise StoreError(f"{SECRET_DIR_ENV}={secret_dir} lacks AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY files")
        return out
    return {}  # s3fs/botocore read the standard AWS_* environment variables themselves


def _base(scheme: str, path: str) -> str:
    """The filesystem path of a store root's URI path: absolute for a file, rooted for memory, bucket/prefix on S3."""
    if scheme == "file":
        return str(Path(path).expanduser().resolve())
    return "/" + path.strip("/") if scheme == "memory" else path.strip("/")


class ObjectStore:
    """Keys are `/`-separated paths relative to `root`; the same code runs on every backend.

    `retries` / `backoff_s` override `storage.retries` / `storage.retry_base_s` (tests use tiny backoffs);
    `timeout_s` the S3 connect/read timeouts (10 s / 60 s; `preflight` uses a short one). `read_only`: opened by
    a command that inspects a run (status, report --run), so a give-up advises running the command again, not
    rerunning a stage."""

    def __init__(self, root: str, storage: StorageConfig | None = None, *, retries: int | None = None,
                 backoff_s: float | None = None, timeout_s: float | None = None, read_only: bool = False):
        scheme, path = split_uri(root)
        if scheme not in STORAGE_SCHEMES:
            raise StoreError(f"unsupported storage scheme {scheme!r} in {root!r}")
        storage = storage or StorageConfig(root=root)
        self.scheme = scheme
        self.retries = storage.retries if retries is None else retries
        self.backoff_s = storage.retry_base_s if backoff_s is None else backoff_s
        self.backoff_max_s = storage.retry_max_s
        self.base = _base(scheme, path)
        if scheme == "file":
            self.fs = fsspec.filesystem("file", auto_mkdir=True)
        elif scheme == "memory":
            self.fs = fsspec.filesystem("memory")
        elif scheme == "s3":
            endpoint = storage.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
                "AWS_ENDPOINT_URL")
            client_kwargs: dict[str, Any] = {}
            if endpoint:
                client_kwargs["endpoint_url"] = endpoint
            if storage.region:
                client_kwargs["region_name"] = storage.region
            # Checksums are ours (sha256 in commit records). botocore's flexible checksums would also reject
            # byte-range GETs from servers that send the whole object's checksum header. Retries are ours too
            # (`_retry`): botocore's (up to 5 attempts) and s3fs's (5 more around each call) would multiply into
            # 25 silent attempts per operation, invisible to logs and metrics.
            config_kwargs = {"s3": {"addressing_style": "path" if storage.path_style else "virtual"},
                             "request_checksum_calculation": "when_required",
                             "response_checksum_validation": "when_required",
                             "retries": {"total_max_attempts": 1}, "connect_timeout": timeout_s or 10,
                             "read_timeout": timeout_s or 60}
            self.fs = fsspec.filesystem("s3", client_kwargs=client_kwargs, config_kwargs=config_kwargs,
                                        use_listings_cache=False, skip_instance_cache=True, **_s3_credentials())
            self.fs.retries = 1  # s3fs: one attempt per call
        self.root = root
        self.read_only = read_only
        self.read_chunk_bytes = storage.read_chunk_bytes
        self.read_threads = storage.read_threads
        self._pool: dict[str, ThreadPoolExecutor] = {}  # shared with child() stores, created on first use
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:  # never includes credentials
        return f"ObjectStore({self.root!r})"

    # -- paths --------------------------------------------------------------------------------------------
    def _p(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.base}/{key}" if key else self.base

    def url(self, key: str = "") -> str:
        return f"{self.root.rstrip('/')}/{key.strip('/')}" if key else self.root

    def at(self, uri: str, *, read_only: bool = True) -> ObjectStore:
        """A store rooted at another URI of the same scheme, with this one's filesystem, endpoint and credentials:
        a run named by a record in this one (a reader of its features) opens with the settings that opened it."""
        scheme, path = split_uri(uri)
        if scheme != self.scheme:
            raise StoreError(f"{uri!r}: another scheme than this store's {self.root!r}")
        other = object.__new__(ObjectStore)
        other.__dict__.update(self.__dict__)
        other.base, other.root, other.read_only = _base(scheme, path), uri.rstrip("/"), read_only
        return other

    def child(self, prefix: str) -> ObjectStore:
        """A store rooted at `prefix` below this one (same filesystem and credentials)."""
        sub = object.__new__(ObjectStore)
        sub.__dict__.update(self.__dict__)
        sub.base = self._p(prefix)
        sub.root = self.url(prefix)
        return sub

    # -- retries ------------------------------------------------------------------------------------------
    def _retry(self, op: str, key: str, fn: Callable[[], T], retries: int | None = None) -> T:
        """Run `fn`, retrying transient errors (see `transient_kind`) with capped exponential backoff + jitter."""
        retries = self.retries if retries is None else retries
        _COUNTERS.add("operations")
        t0 = time.monotonic()
        for attempt in range(retries + 1):
            try:
                return fn()
            except Exception as exc:
                kind = transient_kind(exc)
                if kind is None:
                    raise self._permanent(op, key, exc) from exc
                if attempt == retries:
                    _COUNTERS.add("gave_up")
                    if kind == "checksum":  # the same mismatch on every read: corrupt at rest
                        reads = f"all {attempt + 1} reads" if attempt else "its one read"
                        raise ChecksumError(f"{exc}; the stored bytes are corrupt (mismatched on {reads})"
                                            f"{layout.recompute_remedy(key)}") from exc
                    advice = ("check the store (storage.endpoint_url, the network) and run the command again once it "
                              "answers" if self.read_only else "Nothing was committed by this operation; rerun the "
                              "stage once the store is back: it resumes from its committed outputs")
                    raise StoreUnavailableError(
                        f"{op} {self.url(key)} failed {attempt + 1} times over {time.monotonic() - t0:.1f} s "
                        f"(last error: {type(exc).__name__}: {exc}); the store stayed unavailable past the retry "
                        f"budget (storage.retries={retries}). {advice}") from exc
                _COUNTERS.add("retries")
                _COUNTERS.add(f"retries_{kind}")
                delay = min(self.backoff_max_s, self.backoff_s * 2**attempt) * (0.5 + 0.5 * random.random())
                log.warning("store %s %s: %s (%s: %s); retry %d/%d in %.2f s", op, key, kind, type(exc).__name__,
                            exc, attempt + 1, retries, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _permanent(self, op: str, key: str, exc: Exception) -> Exception:
        """The error to raise for a non-retryable failure: a clear one naming the path for a full or read-only
        local disk or missing S3 credentials (botocore's NoCredentialsError would otherwise reach the terminal as
        a traceback), the original exception otherwise."""
        if any(cls.__name__ in ("NoCredentialsError", "PartialCredentialsError") for cls in type(exc).__mro__):
            return StoreError(f"{op} {self.url(key)}: {NO_CREDENTIALS}")
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreFullError(f"{op} {self.url(key)}: no space left on the store's filesystem ({exc.strerror}). "
                                  "Committed outputs are intact and nothing partial is visible; free space (or raise "
                                  "the quota) and rerun: the stage resumes from what it committed")
        if isinstance(exc, OSError) and exc.errno == errno.EROFS:
            return StoreReadOnlyError(f"{op} {self.url(key)}: the store's filesystem is read-only ({exc.strerror}); "
                                      "remount it read-write (or point storage.root elsewhere) and rerun")
        return exc

    # -- plain objects ------------------------------------------------------------------------------------
    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        path = self._p(key)
        if self.scheme == "file":
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"

            def _write() -> None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                try:
                    with open(tmp, "wb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, path)
                finally:
                    if os.path.exists(tmp):  # a full disk must not keep the partial temp file
                        os.unlink(tmp)

            self._retry("put", key, _write)
        else:
            self._retry("put", key, lambda: self.fs.pipe_file(path, bytes(data)))

    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Write `key` only if no object of that name exists: True when this call created it, False when one was
        there (whoever wrote it). The one primitive leases need (flashdraft/storage/lease.py): on file:// the
        bytes go to a temp file that is hard-linked into place (link(2) fails with EEXIST like O_EXCL, and readers
        never see a half-written object); on S3 a PutObject with `If-None-Match: *` (AWS S3, SeaweedFS, MinIO;
        a server that ignores the header is detected once and logged: see `conditional_writes`)."""
        path = self._p(key)
        if self.scheme == "file":
            return self._retry("create_exclusive", key, lambda: _link_exclusive(path, data))
        if self.scheme == "memory":
            with _MEMORY_CREATE_LOCK:
                if self.fs.exists(path):
                    return False
                self.fs.pipe_file(path, data)
                return True
        try:
            self._retry("create_exclusive", key, lambda: self.fs.pipe_file(path, data, IfNoneMatch="*"))
            return True
        except OSError as exc:
            if not _precondition_failed(exc):
                raise
        try:  # a retried PUT whose first attempt had landed is refused too: then the object is ours
            return self.get(key) == data
        except FileNotFoundError:  # created and deleted in between: the caller decides again
            return False

    def conditional_writes(self) -> bool:
        """Whether this store refuses a second `create_exclusive` of one key (probed once per S3 endpoint and
        process; file:// and memory:// always do). rclone's `serve s3` 1.75 ignores If-None-Match: there a lease
        is best effort and a warning says so once."""
        if self.scheme != "s3":
            return True
        endpoint = str(self.fs.client_kwargs.get("endpoint_url", "aws"))
        if endpoint not in _CONDITIONAL_WRITES:
            key = f"{PREFLIGHT_PREFIX}/exclusive-{uuid.uuid4().hex[:12]}"
            first = self.create_exclusive(key, b"1")
            second = self.create_exclusive(key, b"2")
            self.delete(key)
            _CONDITIONAL_WRITES[endpoint] = first and not second
            if not _CONDITIONAL_WRITES[endpoint]:
                log.warning("the S3 server at %s ignores If-None-Match on PutObject: task leases there are best "
                            "effort (two writers started within a second of each other may both run); AWS S3, "
                            "SeaweedFS and MinIO honour it", endpoint)
        return _CONDITIONAL_WRITES[endpoint]

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """Whole object, or bytes [start, end) by range request."""
        path = self._p(key)
        try:
            return self._retry("get", key, lambda: self.fs.cat_file(path, start=start, end=end))
        except FileNotFoundError:
            raise FileNotFoundError(f"object not found: {self.url(key)}") from None

    def get_chunked(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of `key`; on S3 a span above one `read_chunk_bytes` chunk is fetched as parallel
        range GETs (one connection's bandwidth is the limit on real object stores, ~100 MB/s on S3). Used for
        whole shard parts and for single samples, which reach ~17 MB for Qwen3.6-27B."""
        chunk = self.read_chunk_bytes
        if self.scheme != "s3" or end - start <= chunk:
            return self.get(key, start, end)
        with self._pool_lock:
            if "pool" not in self._pool:
                self._pool["pool"] = ThreadPoolExecutor(self.read_threads, thread_name_prefix="store-read")

        def piece(offset: int) -> bytes:
            try:
                return self.get(key, offset, min(offset + chunk, end))
            except OSError as exc:  # the object is shorter than expected: short bytes, the caller's check fails
                if exc.errno == errno.EINVAL and "InvalidRange" in str(exc):
                    return b""
                raise

        return b"".join(self._pool["pool"].map(piece, range(start, end, chunk)))

    def exists(self, key: str) -> bool:
        return self._retry("exists", key, lambda: self.fs.exists(self._p(key)))

    def size(self, key: str) -> int:
        return int(self._retry("size", key, lambda: self.fs.size(self._p(key))))

    def delete(self, key: str) -> None:
        path = self._p(key)
        try:
            self._retry("delete", key, lambda: self.fs.rm_file(path))
        except FileNotFoundError:
            pass

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys (relative to root) of every object under `prefix` (recursive)."""
        base = self._p(prefix)
        try:
            found = self._retry("list", prefix, lambda: self.fs.find(base))
        except FileNotFoundError:
            return []
        root = self._p("")
        root = root.lstrip("/") if self.scheme != "file" else root
        out = []
        for p in found:
            p = p if self.scheme == "file" else p.lstrip("/")
            rel = p[len(root):].lstrip("/")
            if ".tmp-" in rel.rsplit("/", 1)[-1]:
                continue
            out.append(rel)
        return sorted(out)

    def folders(self, prefix: str = "") -> list[str]:
        """Sorted names of the folders directly under `prefix` (one listing, not recursive): the runs under a
        store root, for `flashdraft status` on a path that holds no run."""
        base = self._p(prefix)
        try:
            entries = self._retry("ls", prefix, lambda: self.fs.ls(base, detail=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")

    def put_json(self, key: str, obj: Any) -> None:
        self.put(key, json.dumps(obj, indent=2, sort_keys=True).encode())

    def get_json(self, key: str) -> Any:
        return json.loads(self.get(key))

    # -- commit protocol ----------------------------------------------------------------------------------
    def commit(self, key: str, data: bytes | bytearray | memoryview, meta: dict[str, Any] | None = None
               ) -> CommitRecord:
        """Write `data`, then its commit record. Only after this returns is `key` visible to readers.

        Idempotent and crash-safe at every point: a retried or repeated commit of the same bytes rewrites the
        same objects; a small object rides inside its record (one atomic write decides old vs new); a large one
        whose committed bytes differ is uncommitted before its bytes change, so no reader ever sees a record
        that disagrees with the object."""
        data = bytes(data)
        inline = data if len(data) <= INLINE_MAX_BYTES else None
        record = CommitRecord(key=key, sha256=sha256_hex(data), size=len(data), meta=meta or {}, inline=inline)
        if inline is None:
            old = self.read_commit(key)
            if old is not None and (old.sha256, old.size) != (record.sha256, record.size):
                self.delete(key + COMMIT_SUFFIX)
        self.put(key, data)
        self.put(key + COMMIT_SUFFIX, record.to_json())
        return record

    def commit_json(self, key: str, obj: Any) -> CommitRecord:
        return self.commit(key, json.dumps(obj, indent=2, sort_keys=True).encode())

    def read_commit(self, key: str) -> CommitRecord | None:
        try:
            raw = json.loads(self.get(key + COMMIT_SUFFIX))
        except FileNotFoundError:
            return None
        inline = base64.b64decode(raw["inline_b64"]) if "inline_b64" in raw else None
        return CommitRecord(key=raw["key"], sha256=raw["sha256"], size=raw["size"], meta=raw.get("meta", {}),
                            inline=inline)

    def is_committed(self, key: str) -> bool:
        return self.exists(key + COMMIT_SUFFIX)

    def get_verified(self, key: str) -> bytes:
        """The committed bytes of `key`, checked against the sha256 in its commit record.

        A mismatch is re-read (three times at most): bytes corrupted in flight differ on the next read, bytes
        corrupted at rest do not, and then ChecksumError names the key."""
        record = self.read_commit(key)
        if record is None:
            raise NotCommittedError(f"{self.url(key)} is not committed (missing or a partial write)")
        if record.inline is not None:
            return self._checked(key, record.sha256, record.size, "", lambda: record.inline)
        return self.get_expected(key, record.sha256, record.size)

    def get_expected(self, key: str, sha256: str, size: int, recorded_in: str | None = None) -> bytes:
        """The bytes of `key`, checked against a sha256 and size recorded for them: by its own commit record, or
        (`recorded_in`, a key of this store) by another record that lists it (an export folder's manifest, a
        shard's DONE record). Re-read on a mismatch as `get_verified` is, then ChecksumError naming both keys."""
        where = f" ({self.url(recorded_in)})" if recorded_in else ""
        return self._checked(key, sha256, size, where, lambda: self.get_chunked(key, 0, size) if size else b"")

    def _checked(self, key: str, sha256: str, size: int, where: str, read: Callable[[], bytes]) -> bytes:
        """`read()` until its bytes match (at most 3 re-reads, counted as checksum retries): one place decides
        what a mismatch is, whichever record holds the expected digest."""

        def attempt() -> bytes:
            data = read()
            if len(data) != size or sha256_hex(data) != sha256:
                raise ChecksumError(
                    f"checksum mismatch for {self.url(key)}: expected sha256 {sha256[:12]}… size {size}{where}, "
                    f"got {sha256_hex(data)[:12]}… size {len(data)}")
            return data

        return self._retry("get_verified", key, attempt, retries=min(self.retries, 3))

    def get_json_verified(self, key: str) -> Any:
        return json.loads(self.get_verified(key))

    def list_committed(self, prefix: str = "") -> list[str]:
        """Keys under `prefix` that have a commit record (the record files themselves are not listed)."""
        return [k[: -len(COMMIT_SUFFIX)] for k in self.list(prefix) if k.endswith(COMMIT_SUFFIX)]

    def uncommit(self, key: str) -> None:
        """Remove the commit record first (readers stop seeing it), then the object."""
        self.delete(key + COMMIT_SUFFIX)
        self.delete(key)


_MEMORY_CREATE_LOCK = threading.Lock()
_CONDITIONAL_WRITES: dict[str, bool] = {}  # S3 endpoint -> it refuses a second If-None-Match create


def _link_exclusive(path: str, data: bytes) -> bool:
    """Create `path` holding `data` unless it exists: a complete temp file, then link(2), which fails if the name
    exists (O_EXCL's guarantee, without a window where the file is there but empty)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _precondition_failed(exc: BaseException) -> bool:
    """An S3 412 PreconditionFailed (s3fs raises it as OSError(EINVAL) carrying the server's message)."""
    cause = exc.__cause__
    code = getattr(cause, "response", {}).get("Error", {}).get("Code") if cause is not None else None
    return code == "PreconditionFailed" or "pre-condition" in str(exc) or "PreconditionFailed" in str(exc)


def open_store(storage: StorageConfig, run_id: str | None = None, *, read_only: bool = False) -> ObjectStore:
    """The store for a run: `storage.root/<run_id>/` (or the root itself when run_id is None); `read_only` for
    commands that inspect a run (see ObjectStore)."""
    store = ObjectStore(storage.root, storage, read_only=read_only)
    return store.child(run_id) if run_id else store


class StorePreflightError(StoreError):
    """The run's store cannot be used; one line naming the setting (or environment variable) and what to do."""


PREFLIGHT_PREFIX = ".preflight"


def _s3_has_credentials() -> bool:
    """Whether botocore's credential chain finds any (environment, profile, Secret folder, instance role)."""
    if os.environ.get(SECRET_DIR_ENV):
        _s3_credentials()  # raises naming the folder when its files are missing
        return True
    import botocore.session

    return botocore.session.get_session().get_credentials() is not None


def _store_setting(storage: StorageConfig, setting: str) -> tuple[str, str, str | None]:
    """(scheme, how to name the store in a message, endpoint) after the checks that need no request: an S3 root
    names a bucket and credentials are there. Raises StorePreflightError."""
    scheme, path = split_uri(storage.root)
    endpoint = storage.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    named = f"{setting} {storage.root}" if setting.startswith("--") else f"{setting}={storage.root}"
    where = named + (f" (endpoint {endpoint})" if endpoint else "")
    if scheme == "s3":
        if not path.strip("/"):
            raise StorePreflightError(f"{named} names no bucket: use s3://BUCKET/PREFIX")
        try:
            found = _s3_has_credentials()
        except StoreError as exc:
            raise StorePreflightError(f"{where}: {exc}") from exc
        if not found:
            raise StorePreflightError(f"{where}: {NO_CREDENTIALS}")
    return scheme, where, endpoint


def preflight(storage: StorageConfig, run_id: str | None = None, *, timeout_s: float = 5.0) -> None:
    """Check once, before any stage runs, that the run's store takes a commit: credentials are there, the server
    answers, the bucket exists and accepts a write, and the committed probe reads back; then remove the probe.

    A short timeout and one retry (not storage.retries) so a wrong endpoint fails in seconds instead of after the
    stage's retry budget. Every failure raises StorePreflightError with one line that names the setting to fix."""
    if split_uri(storage.root)[0] == "memory":
        return
    scheme, where, endpoint = _store_setting(storage, "storage.root")
    store = ObjectStore(storage.root, storage, retries=1, backoff_s=0.2, timeout_s=timeout_s)
    if run_id:
        store = store.child(run_id)
    key = f"{PREFLIGHT_PREFIX}/probe-{uuid.uuid4().hex[:12]}"
    payload = f"flashdraft store preflight {time.time()}".encode()
    try:
        store.commit(key, payload)
        if store.get_verified(key) != payload:
            raise StorePreflightError(f"{where}: a committed probe read back different bytes")
        store.uncommit(key)
        if scheme == "file":  # leave no empty probe folder in the run
            with contextlib.suppress(OSError):
                os.rmdir(store._p(PREFLIGHT_PREFIX))
    except StorePreflightError:
        raise
    except Exception as exc:  # noqa: BLE001 - each failure is translated into the setting to fix
        raise StorePreflightError(_preflight_message(scheme, where, endpoint, storage, exc)) from exc


def check_readable(storage: StorageConfig, run_id: str | None = None, *, setting: str = "storage.root",
                   endpoint_setting: str = "storage.endpoint_url", timeout_s: float = 5.0) -> None:
    """The read-only commands' preflight (status, report, features verify): credentials are there and one
    listing of the run's records answers, with the same short timeout and single retry as `preflight`, so a
    missing credential or a dead endpoint is one line in seconds instead of a traceback or the stages' retry
    budget. Writes nothing. `setting` / `endpoint_setting` name what the person set (`--run`, `--endpoint-url`)."""
    if split_uri(storage.root)[0] == "memory":
        return
    scheme, where, endpoint = _store_setting(storage, setting)
    store = ObjectStore(storage.root, storage, retries=1, backoff_s=0.2, timeout_s=timeout_s, read_only=True)
    if run_id:
        store = store.child(run_id)
    try:
        store._retry("list", "status/", lambda: store.fs.find(store._p("status")))
    except FileNotFoundError as exc:
        if scheme == "s3":  # a missing prefix lists empty; a missing bucket raises (a missing folder is no run)
            raise StorePreflightError(_preflight_message(scheme, where, endpoint, storage, exc, endpoint_setting,
                                                         reading=True)) from exc
    except Exception as exc:  # noqa: BLE001 - each failure is translated into the setting to fix
        raise StorePreflightError(_preflight_message(scheme, where, endpoint, storage, exc, endpoint_setting,
                                                     reading=True)) from exc


def _preflight_message(scheme: str, where: str, endpoint: str | None, storage: StorageConfig, exc: BaseException,
                       endpoint_setting: str = "storage.endpoint_url", reading: bool = False) -> str:
    bucket = split_uri(storage.root)[1].split("/")[0]
    unavailable = isinstance(exc, StoreUnavailableError) or transient_kind(exc) is not None
    if isinstance(exc, StoreUnavailableError) and exc.__cause__ is not None:
        exc = exc.__cause__  # the transport error itself, not the retry summary
    detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    if unavailable:
        if scheme == "s3":
            fix = (f"start the S3 server or fix {endpoint_setting}" if endpoint else
                   f"check the network, or set {endpoint_setting} for a non-AWS server")
        else:
            fix = "check the filesystem"
        return f"{where}: the store does not answer ({detail}); {fix}"
    setting = where.split("=", 1)[0] if where.startswith("storage.") else where.split(" ", 1)[0]
    if scheme == "s3" and isinstance(exc, FileNotFoundError):
        return f"{where}: bucket {bucket!r} does not exist: create it, or fix {setting} ({detail})"
    if scheme == "s3" and isinstance(exc, PermissionError):
        return (f"{where}: the S3 server refused the credentials or the {'listing' if reading else 'write'} "
                f"({detail}); check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or {SECRET_DIR_ENV}) and the bucket's "
                "policy")
    if reading and isinstance(exc, PermissionError):
        return f"{where}: cannot read there ({detail}); fix the folder's permissions"
    if reading:
        return f"{where}: listing the run failed ({detail}); fix {setting}"
    if isinstance(exc, StoreReadOnlyError | StoreFullError | PermissionError):
        return f"{where}: cannot write there ({detail}); fix the folder's permissions or point storage.root elsewhere"
    return f"{where}: a probe commit failed ({detail}); fix the store settings (docs/config-reference.md#storage)"
