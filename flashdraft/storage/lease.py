"""One writer per task: a lease in the run's store, taken before a task writes and renewed while it runs.

Why: preset run_ids are fixed, a KFP retry can start while the pod it replaces still writes, and two
`run-local`s of one run_id share every key. The commit protocol keeps each object whole, but two writers of one
task would interleave its parts and status records.

How (docs/failure-model.md, "Leases"):

* A task's lease is the newest of `leases/<task>/<generation>.json`. Taking it is creating the next generation
  with `ObjectStore.create_exclusive` (`If-None-Match: *` on S3, link(2)/O_EXCL on file://): of two takers,
  exactly one creates it. A generation is never rewritten by anyone but its holder, and the newest is never
  deleted, so a taker that read an old state cannot win.
* The record names its holder (host or pod name, pid, start time) and when it expires. A heartbeat thread
  renews it every `storage.lease_heartbeat_s`; a holder that sees a newer generation has lost it (it stalled
  past the expiry and another writer took over) and its task fails instead of committing its result.
* A second writer that finds a live lease watches it: renewed meanwhile (a live holder) -> refused in one line
  naming the holder; not renewed for `storage.lease_expiry_s` (the holder died: a killed pod, a lost node), or
  past its expiry, or released -> taken over. A holder on this host whose process is gone is taken over at once.
* Released (marked so, not deleted) when the task ends, done or failed.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Any

from flashdraft.storage.layout import LEASES
from flashdraft.storage.store import ObjectStore, StoreError

log = logging.getLogger(__name__)


class LeaseHeld(StoreError):
    """Another live writer holds the task's lease; the message is one line naming it."""


class LeaseLost(StoreError):
    """The holder stalled past its lease's expiry and another writer took the task over."""


@dataclass(frozen=True)
class LeaseRecord:
    """One generation of a task's lease, as stored (JSON)."""

    task: str
    generation: int
    token: str  # this holder's, unique: tells its own record from a taker's
    host: str  # the pod's name on Kubernetes (its hostname)
    pid: int
    started: float  # when the holder took it (epoch seconds)
    renewed: float  # its last heartbeat
    expires: float  # renewed + expiry_s, on the holder's clock
    released: bool = False
    pid_namespace: int = 0  # its pid namespace's inode: pods sharing a node's hostname (hostNetwork) differ here

    def holder(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        ago = max(0.0, time.time() - self.renewed)
        return f"{self.host} pid {self.pid} (since {started}, last renewed {ago:.0f} s ago)"


def lease_prefix(task: str) -> str:
    return f"{LEASES}/{task}/"


def _key(task: str, generation: int) -> str:
    return f"{lease_prefix(task)}{generation:010d}.json"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _process_gone(record: LeaseRecord) -> bool:
    """The holder ran on this host, in this pid namespace, and its process no longer exists (a killed `run-local`
    rerun on one machine)."""
    if record.host != socket.gethostname() or record.pid_namespace != _pid_namespace():
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class TaskLease:
    """The lease of one task in one run's store: `with TaskLease(store, task, ...):` takes it (or raises
    LeaseHeld), renews it from a daemon thread, and releases it on exit. `lost` is set when another writer took
    it over (the runner then fails the task instead of committing)."""

    def __init__(self, store: ObjectStore, task: str, *, expiry_s: float, heartbeat_s: float):
        if heartbeat_s >= expiry_s:
            raise ValueError(f"storage.lease_heartbeat_s={heartbeat_s} must be below storage.lease_expiry_s={expiry_s}")
        self.store, self.task = store, task
        self.expiry_s, self.heartbeat_s = expiry_s, heartbeat_s
        self.record: LeaseRecord | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading ----------------------------------------------------------------------------------------
    def _generations(self) -> list[int]:
        out = []
        for key in self.store.list(lease_prefix(self.task)):
            name = key.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                out.append(int(name[:-5]))
        return sorted(out)

    def _read(self, generation: int) -> LeaseRecord | None:
        try:
            return LeaseRecord(**json.loads(self.store.get(_key(self.task, generation))))
        except FileNotFoundError:
            return None

    def current(self) -> LeaseRecord | None:
        """The newest generation (None: never leased)."""
        gens = self._generations()
        return self._read(gens[-1]) if gens else None

    # -- taking -----------------------------------------------------------------------------------------
    def _new_record(self, generation: int) -> LeaseRecord:
        now = time.time()
        return LeaseRecord(task=self.task, generation=generation, token=uuid.uuid4().hex, host=socket.gethostname(),
                           pid=os.getpid(), started=now, renewed=now, expires=now + self.expiry_s,
                           pid_namespace=_pid_namespace())

    def _try_take(self, generation: int) -> bool:
        record = self._new_record(generation)
        if not self.store.create_exclusive(_key(self.task, generation), _dump(record)):
            return False
        self.record = record
        for old in self._generations():  # the older generations are history; the newest (ours) stays
            if old < generation:
                self.store.delete(_key(self.task, old))
        return True

    def acquire(self) -> None:
        """Take the lease: at once when free (never taken, released, expired, or its process gone), after
        watching a silent one for `expiry_s` (a dead holder), or raise LeaseHeld when its holder renews it."""
        self.store.conditional_writes()  # a server that ignores If-None-Match is logged once
        watched: tuple[str, float] | None = None
        since = time.monotonic()
        while True:
            gens = self._generations()
            current = self._read(gens[-1]) if gens else None
            if current is None or self._free(current, watched, since):
                if self._try_take((gens[-1] if gens else 0) + 1):
                    if current is not None and not current.released:
                        log.warning("%s: took over the expired lease of %s", self.task, current.holder())
                    return
                watched, since = None, time.monotonic()
                continue  # another writer took it first: look at theirs
            if watched is not None and watched != (current.token, current.renewed):
                raise LeaseHeld(f"{self.task}: another writer holds this task's lease: {current.holder()}; it is "
                                f"alive (renewed while this one waited): let it finish, or stop it first "
                                f"({self.store.url(_key(self.task, current.generation))})")
            if watched is None:
                log.info("%s: leased by %s; waiting up to %.0f s for it to renew or expire", self.task,
                         current.holder(), self.expiry_s)
                watched, since = (current.token, current.renewed), time.monotonic()
            time.sleep(min(self.heartbeat_s, self.expiry_s) / 2)

    def _free(self, record: LeaseRecord, watched: tuple[str, float] | None, since: float) -> bool:
        if record.released or time.time() > record.expires or _process_gone(record):
            return True
        silent = watched == (record.token, record.renewed) and time.monotonic() - since > self.expiry_s
        return silent  # not renewed for a whole expiry on this host's clock (clock skew cannot keep it)

    # -- holding ----------------------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.renew()
            except Exception:  # noqa: BLE001 - a store hiccup: the expiry covers several missed beats
                log.warning("%s: renewing the lease failed; retrying in %.0f s", self.task, self.heartbeat_s,
                            exc_info=True)
            if self.lost:
                return

    def renew(self) -> None:
        """Extend the lease, unless a newer generation exists (then `lost` names its holder)."""
        assert self.record is not None
        newest = self._generations()
        if newest and newest[-1] > self.record.generation:
            taker = self._read(newest[-1])
            self.lost = taker.holder() if taker else "another writer"
            log.error("%s: lost the lease to %s (this process stalled past its expiry)", self.task, self.lost)
            return
        now = time.time()
        self.record = replace(self.record, renewed=now, expires=now + self.expiry_s)
        self.store.put(_key(self.task, self.record.generation), _dump(self.record))

    def release(self) -> None:
        """Mark the lease released (a waiting writer takes it at once); nothing when it was lost."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.record is None or self.lost:
            return
        try:
            newest = self._generations()
            if newest and newest[-1] > self.record.generation:
                return
            self.record = replace(self.record, released=True, renewed=time.time())
            self.store.put(_key(self.task, self.record.generation), _dump(self.record))
        except Exception:  # noqa: BLE001 - an unreleased lease expires by itself
            log.warning("%s: releasing the lease failed; it expires in %.0f s", self.task, self.expiry_s,
                        exc_info=True)

    def __enter__(self) -> TaskLease:
        if self.record is None:  # not taken yet by an explicit `acquire`
            self.acquire()
        self._thread = threading.Thread(target=self._heartbeat, daemon=True, name=f"lease-{self.task}")
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def current_lease(store: ObjectStore, task: str) -> LeaseRecord | None:
    """A task's newest lease record (None: never leased), read only: for `flashdraft status`."""
    gens = [int(k.rsplit("/", 1)[-1][:-5]) for k in store.list(lease_prefix(task))
            if k.endswith(".json") and k.rsplit("/", 1)[-1][:-5].isdigit()]
    if not gens:
        return None
    try:
        return LeaseRecord(**json.loads(store.get(_key(task, max(gens)))))
    except FileNotFoundError:
        return None


def describe_writer(store: ObjectStore, task: str) -> str:
    """Who writes a task the status records call running: its live holder, or why nobody does and what to do."""
    lease = current_lease(store, task)
    if lease is None or lease.released:
        return "no writer holds its lease: it was interrupted; resubmit the run (or Retry) to resume it"
    if time.time() > lease.expires:
        return (f"its writer {lease.host} pid {lease.pid} stopped renewing its lease "
                f"{time.time() - lease.renewed:.0f} s ago: resubmit the run (or Retry), it takes over")
    return f"written by {lease.holder()}"


def _dump(record: LeaseRecord) -> bytes:
    return json.dumps(asdict(record), sort_keys=True).encode()
