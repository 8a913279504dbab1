"""Object store: one small layer over fsspec for `file://`, `s3://` and `memory://`.

Every stage reads and writes through this module, so the commit protocol lives in one place:

* `put` is atomic per object (temp file + rename on POSIX; a single PUT on S3).
* `commit(key, data)` writes the object, then a small `<key>.commit` JSON record carrying its sha256 and size.
  Readers list and read only committed objects (`list_committed`, `get_verified`), so a crash between the two
  writes leaves an invisible orphan that the next run overwrites deterministically.
* Transient errors (connection resets, 5xx, throttling) are retried with exponential backoff.

Credentials for S3 come from the standard AWS environment variables, or from files in the folder named by
`FLASHDRAFT_S3_SECRET_DIR` (a mounted Kubernetes Secret with keys AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY).
They are never read from config files and never appear in logs or reprs.
"""

from __future__ import annotations

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

log = logging.getLogger(__name__)
T = TypeVar("T")

COMMIT_SUFFIX = ".commit"
SECRET_DIR_ENV = "FLASHDRAFT_S3_SECRET_DIR"


class StoreError(RuntimeError):
    """An object-store operation failed for a reason a retry will not fix."""


class ChecksumError(StoreError):
    """Stored bytes do not match their commit record."""


class NotCommittedError(StoreError):
    """The object has no commit record (missing, or a partial write from a crashed run)."""


@dataclass(frozen=True)
class CommitRecord:
    key: str
    sha256: str
    size: int
    meta: dict[str, Any]

    def to_json(self) -> bytes:
        return json.dumps({"key": self.key, "sha256": self.sha256, "size": self.size, "meta": self.meta},
                          sort_keys=True).encode()


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    text = f"{type(exc).__name__} {exc}"
    markers = ("SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttl", "503", "500",
               "Connection", "EndpointConnectionError", "ReadTimeout", "IncompleteRead")
    return any(m in text for m in markers)


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


class ObjectStore:
    """Keys are `/`-separated paths relative to `root`; the same code runs on every backend."""

    def __init__(self, root: str, storage: StorageConfig | None = None, *, retries: int = 5,
                 backoff_s: float = 0.2):
        scheme = root.split("://", 1)[0] if "://" in root else "file"
        if scheme not in ("file", "memory", "s3"):
            raise StoreError(f"unsupported storage scheme {scheme!r} in {root!r}")
        storage = storage or StorageConfig(root=root)
        path = root.split("://", 1)[1] if "://" in root else root
        self.scheme = scheme
        self.retries = retries
        self.backoff_s = backoff_s
        if scheme == "file":
            self.fs = fsspec.filesystem("file", auto_mkdir=True)
            self.base = str(Path(path).expanduser().resolve())
        elif scheme == "memory":
            self.fs = fsspec.filesystem("memory")
            self.base = "/" + path.strip("/")
        elif scheme == "s3":
            endpoint = storage.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get(
                "AWS_ENDPOINT_URL")
            client_kwargs: dict[str, Any] = {}
            if endpoint:
                client_kwargs["endpoint_url"] = endpoint
            if storage.region:
                client_kwargs["region_name"] = storage.region
            # Checksums are ours (sha256 in commit records). botocore's flexible checksums would also reject
            # byte-range GETs from servers that send the whole object's checksum header.
            config_kwargs = {"s3": {"addressing_style": "path" if storage.path_style else "virtual"},
                             "request_checksum_calculation": "when_required",
                             "response_checksum_validation": "when_required"}
            self.fs = fsspec.filesystem("s3", client_kwargs=client_kwargs, config_kwargs=config_kwargs,
                                        use_listings_cache=False, skip_instance_cache=True, **_s3_credentials())
            self.base = path.strip("/")
        self.root = root
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

    def child(self, prefix: str) -> ObjectStore:
        """A store rooted at `prefix` below this one (same filesystem and credentials)."""
        sub = object.__new__(ObjectStore)
        sub.__dict__.update(self.__dict__)
        sub.base = self._p(prefix)
        sub.root = self.url(prefix)
        return sub

    # -- retries ------------------------------------------------------------------------------------------
    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except Exception as exc:
                if attempt == self.retries or not _is_transient(exc):
                    raise
                delay = self.backoff_s * (2**attempt) * (1 + random.random() * 0.25)
                log.warning("%s failed (%s: %s); retry %d/%d in %.2fs", what, type(exc).__name__, exc,
                            attempt + 1, self.retries, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    # -- plain objects ------------------------------------------------------------------------------------
    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        path = self._p(key)
        if self.scheme == "file":
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"

            def _write() -> None:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)

            try:
                self._retry(f"put {key}", _write)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:
            self._retry(f"put {key}", lambda: self.fs.pipe_file(path, bytes(data)))

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """Whole object, or bytes [start, end) by range request."""
        path = self._p(key)
        try:
            return self._retry(f"get {key}", lambda: self.fs.cat_file(path, start=start, end=end))
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
        return self._retry(f"exists {key}", lambda: self.fs.exists(self._p(key)))

    def size(self, key: str) -> int:
        return int(self._retry(f"size {key}", lambda: self.fs.size(self._p(key))))

    def delete(self, key: str) -> None:
        path = self._p(key)
        try:
            self._retry(f"delete {key}", lambda: self.fs.rm_file(path))
        except FileNotFoundError:
            pass

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys (relative to root) of every object under `prefix` (recursive)."""
        base = self._p(prefix)
        try:
            found = self._retry(f"list {prefix}", lambda: self.fs.find(base))
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

    def put_json(self, key: str, obj: Any) -> None:
        self.put(key, json.dumps(obj, indent=2, sort_keys=True).encode())

    def get_json(self, key: str) -> Any:
        return json.loads(self.get(key))

    # -- commit protocol ----------------------------------------------------------------------------------
    def commit(self, key: str, data: bytes | bytearray | memoryview, meta: dict[str, Any] | None = None
               ) -> CommitRecord:
        """Write `data`, then its commit record. Only after this returns is `key` visible to readers."""
        record = CommitRecord(key=key, sha256=sha256_hex(data), size=len(data), meta=meta or {})
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
        return CommitRecord(key=raw["key"], sha256=raw["sha256"], size=raw["size"], meta=raw.get("meta", {}))

    def is_committed(self, key: str) -> bool:
        return self.exists(key + COMMIT_SUFFIX)

    def get_verified(self, key: str) -> bytes:
        """The committed bytes of `key`, checked against the sha256 in its commit record."""
        record = self.read_commit(key)
        if record is None:
            raise NotCommittedError(f"{self.url(key)} is not committed (missing or a partial write)")
        data = self.get_chunked(key, 0, record.size)
        if len(data) != record.size or sha256_hex(data) != record.sha256:
            raise ChecksumError(
                f"checksum mismatch for {self.url(key)}: expected sha256 {record.sha256[:12]}… size {record.size}, "
                f"got {sha256_hex(data)[:12]}… size {len(data)}"
            )
        return data

    def get_json_verified(self, key: str) -> Any:
        return json.loads(self.get_verified(key))

    def list_committed(self, prefix: str = "") -> list[str]:
        """Keys under `prefix` that have a commit record (the record files themselves are not listed)."""
        return [k[: -len(COMMIT_SUFFIX)] for k in self.list(prefix) if k.endswith(COMMIT_SUFFIX)]

    def uncommit(self, key: str) -> None:
        """Remove the commit record first (readers stop seeing it), then the object."""
        self.delete(key + COMMIT_SUFFIX)
        self.delete(key)


def open_store(storage: StorageConfig, run_id: str | None = None) -> ObjectStore:
    """The store for a run: `storage.root/<run_id>/` (or the root itself when run_id is None)."""
    store = ObjectStore(storage.root, storage)
    return store.child(run_id) if run_id else store
