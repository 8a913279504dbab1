"""A fault-injecting HTTP proxy for S3 on 127.0.0.1: sits between the store client and the real S3 server the
tests start (rclone serve s3) and misbehaves the way production object stores do.

Per request, with seeded probabilities: 503 SlowDown (not forwarded, like S3 throttling), 500 InternalError (not
forwarded), a connection reset after part of the response body (forwarded first: the server applied a PUT the
client never hears about), added latency, and a byte flipped in the body of a whole-object GET of a data object
(bytes corrupted in flight, which only a checksum catches): the first such read of a key in the run, or with
`FaultPlan.corrupt_per_process` the first in each client process (a pipeline's stages are processes: each must
verify what it reads, not only the first stage to read a key). `outage(seconds)` (or `outage_after`) takes the whole
store down: every connection is reset until it ends. Everything is counted in `counts`. `intercept(hook)` lets a
test act at an exact point of a client's request stream (the kill loops SIGKILL the client at its n-th write).

Deterministic from the seed: the decision for a request depends only on (seed, method, path, query, range, how
many identical requests came before), not on thread timing, so the same run gets the same faults.

Requests are forwarded verbatim (Host included, so SigV4 signatures stay valid); one upstream connection per
client connection.
"""

from __future__ import annotations

import hashlib
import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
              "expect"}
ERRORS = {"slowdown": (503, "SlowDown", "Please reduce your request rate."),
          "error500": (500, "InternalError", "We encountered an internal error. Please try again.")}


@dataclass
class FaultPlan:
    """Per-request probabilities (checked in this order, at most one fault per request) and their parameters;
    `corrupt` is the probability for a GET of an object ending in `corrupt_suffixes` (applied when the response
    carries the whole object)."""

    seed: int = 0
    slowdown: float = 0.0
    error500: float = 0.0
    reset: float = 0.0
    corrupt: float = 0.0
    latency: float = 0.0
    latency_s: float = 0.05
    corrupt_suffixes: tuple[str, ...] = (".fds", ".safetensors", ".parquet")
    corrupt_per_process: bool = False  # "first read" per client process (found by its connection), not per run

    @classmethod
    def mixed(cls, seed: int, rate: float) -> FaultPlan:
        """Faults on `rate` of all requests over every kind; every first read of a whole data object corrupted."""
        return cls(seed=seed, slowdown=rate * 0.35, error500=rate * 0.2, reset=rate * 0.25, latency=rate * 0.2,
                   corrupt=1.0)


class S3FaultProxy:
    def __init__(self, upstream: str, plan: FaultPlan | None = None):
        up = urlparse(upstream)
        self.upstream = (up.hostname, up.port)
        self.plan = plan or FaultPlan()
        self.counts: Counter = Counter()
        self.log: list[tuple[str, str, str]] = []  # (method, path, fault) of every injected fault
        self._outage_when: tuple[Callable[[str, str], bool], float | None] | None = None
        self._seen: Counter = Counter()
        self._read_by: set[tuple[int | None, str]] = set()  # (client pid, request) already served once
        self.corrupted: list[tuple[int | None, str]] = []  # (client pid, path) of every corrupted read
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._hook: Callable[[str, str, str], bool] | None = None
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.handle_error = lambda request, address: None  # resets are the point, not news
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="s3-fault-proxy")
        self._thread.start()

    # -- control ----------------------------------------------------------------------------------------------
    def outage(self, seconds: float | None) -> None:
        """Reset every connection for `seconds` (None: until `restore()`)."""
        with self._lock:
            self._down_until = float("inf") if seconds is None else time.monotonic() + seconds
            self.counts["outages"] += 1

    def outage_after(self, when: Callable[[str, str], bool], seconds: float | None) -> None:
        """Start an outage of `seconds` (None: until `restore()`) at the first request (method, path) matching
        `when`; that request is the first one refused."""
        with self._lock:
            self._outage_when = (when, seconds)

    def intercept(self, hook: Callable[[str, str, str], bool] | None) -> None:
        """Call `hook(method, path, phase)` for every request: phase "sent" before it is forwarded, "applied" after
        the server answered it. When the hook returns True the client's connection is reset at that point (the
        request never reached the server, or reached it and the client never heard back). None removes it."""
        with self._lock:
            self._hook = hook

    def _intercepted(self, method: str, path: str, phase: str) -> bool:
        hook = self._hook
        return hook is not None and hook(method, path, phase)

    def restore(self) -> None:
        with self._lock:
            self._down_until = 0.0

    def set_plan(self, plan: FaultPlan) -> None:
        with self._lock:
            self.plan, self._seen, self._read_by = plan, Counter(), set()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def injected(self) -> dict[str, int]:
        """Requests seen and faults injected by kind."""
        return dict(self.counts)

    # -- decisions --------------------------------------------------------------------------------------------
    def client_pid(self, port: int) -> int | None:
        """The pid of the local process whose TCP connection to this proxy comes from `port` (psutil)."""
        import psutil

        mine = self._server.server_address[1]
        for c in psutil.net_connections(kind="tcp4"):
            if c.laddr and c.laddr.port == port and c.raddr and c.raddr.port == mine:
                return c.pid
        return None

    def _decide(self, method: str, path: str, rng_key: str, pid: int | None = None) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            if self._outage_when is not None and self._outage_when[0](method, path):
                seconds = self._outage_when[1]
                self._outage_when = None
                self._down_until = float("inf") if seconds is None else time.monotonic() + seconds
                self.counts["outages"] += 1
            if time.monotonic() < self._down_until:
                self.counts["outage"] += 1
                self.log.append((method, path, "outage"))
                return "outage"
            n = self._seen[rng_key]
            self._seen[rng_key] += 1
            plan = self.plan
            first = n == 0
            if plan.corrupt_per_process:
                first = (pid, rng_key) not in self._read_by
                self._read_by.add((pid, rng_key))
        rng = random.Random(hashlib.sha256(f"{plan.seed}|{rng_key}|{n}".encode()).digest())
        x = rng.random()
        for kind in ("slowdown", "error500", "reset", "latency"):
            p = getattr(plan, kind)
            if x < p:
                return kind
            x -= p
        # Corruption is drawn separately, over the requests it can hit: there are few of them (whole-object reads
        # of data objects), and a rate over all requests would rarely reach one.
        # Only first reads: in-flight corruption is transient, the re-read comes back clean.
        if (first and method == "GET" and path.split("?")[0].endswith(plan.corrupt_suffixes)
                and rng.random() < plan.corrupt):
            return "corrupt"
        return None

    def _record(self, method: str, path: str, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1
            self.log.append((method, path, kind))

    def _handler_class(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            upstream: http.client.HTTPConnection | None = None
            pid: int | None = None  # the client process, looked up once per connection (corrupt_per_process)

            def log_message(self, *args) -> None:  # quiet
                pass

            def finish(self) -> None:
                if self.upstream is not None:
                    self.upstream.close()
                try:
                    super().finish()
                except OSError:
                    pass

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _reset(self) -> None:
                """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed server or balancer would."""
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()

            def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                for attempt in range(2):  # a stale keep-alive upstream connection gets one reconnect
                    if self.upstream is None:
                        self.upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                    try:
                        self.upstream.request(self.command, self.path, body=body or None, headers=headers)
                        resp = self.upstream.getresponse()
                        data = resp.read()
                        return resp.status, resp.reason, resp.getheaders(), data
                    except (ConnectionError, http.client.HTTPException, OSError):
                        self.upstream.close()
                        self.upstream = None
                        if attempt == 1:
                            raise
                raise AssertionError("unreachable")

            def _send(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes,
                      cut: int | None = None) -> None:
                """One write for the whole response (separate small writes stall on Nagle + delayed ACK)."""
                head = self.command == "HEAD"  # a HEAD's Content-Length is the object's size: keep it
                lines = [f"HTTP/1.1 {status} {reason}"]
                lines += [f"{k}: {v}" for k, v in headers
                          if k.lower() not in HOP_BY_HOP and (head or k.lower() != "content-length")]
                if not head:
                    lines.append(f"Content-Length: {len(body)}")
                out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
                if not head:
                    out += body if cut is None else body[:cut]
                self.wfile.write(out)

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def _handle(self) -> None:
                body = self._read_body()
                method, path = self.command, self.path
                if proxy._intercepted(method, path, "sent"):
                    self._reset()
                    return
                rng_key = f"{method} {path} {self.headers.get('Range', '')}"
                if proxy.plan.corrupt_per_process and self.pid is None:
                    self.pid = proxy.client_pid(self.client_address[1])
                fault = proxy._decide(method, path, rng_key, self.pid)
                if fault == "outage":
                    self._reset()
                    return
                if fault in ERRORS:
                    proxy._record(method, path, fault)
                    status, code, message = ERRORS[fault]
                    xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}'
                           f"</Message><Resource>{path}</Resource><RequestId>fault-proxy</RequestId></Error>")
                    self._send(status, "Service Unavailable" if status == 503 else "Internal Server Error",
                               [("Content-Type", "application/xml")], xml.encode())
                    return
                if fault == "latency":
                    proxy._record(method, path, fault)
                    time.sleep(proxy.plan.latency_s)
                try:
                    status, reason, headers, data = self._forward(body)
                except OSError:  # the real server is down: so is the proxy, to the client
                    self._reset()
                    return
                if proxy._intercepted(method, path, "applied"):
                    self._reset()
                    return
                if fault == "reset":
                    proxy._record(method, path, fault)
                    if data and method != "HEAD":
                        self._send(status, reason, headers, data, cut=len(data) // 2)
                    self._reset()
                    return
                if fault == "corrupt":
                    if status in (200, 206) and data and _covers_whole(dict(headers)):
                        proxy._record(method, path, fault)
                        proxy.corrupted.append((self.pid, path.split("?")[0]))
                        i = int.from_bytes(hashlib.sha256(data).digest()[:4], "big") % len(data)
                        data = data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1:]
                self._send(status, reason, headers, data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler


def _covers_whole(headers: dict[str, str]) -> bool:
    """The response carries the whole object: no Content-Range, or one spanning it ("bytes 0-99/100"). rclone
    answers range GETs with 200 and a Content-Range, so the status alone does not tell."""
    value = next((v for k, v in headers.items() if k.lower() == "content-range"), None)
    if value is None:
        return True
    try:
        span, total = value.split(" ", 1)[1].split("/")
        start, end = (int(x) for x in span.split("-"))
        return start == 0 and end + 1 == int(total)
    except (IndexError, ValueError):
        return False
