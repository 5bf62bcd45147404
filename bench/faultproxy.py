"""A fault-injecting, request-counting HTTP proxy in front of a store (S3, Azure or GCS): 503 SlowDown,
resets mid-body, stalls. Used by the storage tests and by the s3 bench (requests and bytes per epoch).

One request per connection (it asks the server to close after each response), so every fault
hits exactly one request. `plan(method, path, attempt)` says what the n-th request for a path gets:
'ok', '503', 'reset' (headers and half the body, then a TCP reset) or 'stall' (no answer at all).
`requests` counts every request by kind (GET, HEAD, LIST, PUT, DELETE), `bytes_in` the response
body bytes the upstream sent for each kind.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable
from urllib.parse import unquote

_SLOWDOWN = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: %d\r\nConnection: close\r\n\r\n")
_SLOWDOWN_BODY = b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"


def request_kind(method: str, target: str) -> str:
    """GET, HEAD, LIST, PUT (any write: PUT, POST, as multipart uploads use both) or DELETE, from the request line.

    A listing is a GET of a bucket or container, not of an object: S3's `?list-type=2`, Azure's `comp=list`,
    GCS's XML `GET /bucket?prefix=`."""
    path, _, query = target.partition("?")
    if method == "GET" and ("list-type=" in query or "comp=list" in query or path.strip("/").count("/") == 0):
        return "LIST"
    return {"POST": "PUT"}.get(method, method)


class FaultProxy:
    def __init__(self, upstream: tuple[str, int], plan: Callable[[str, str, int], str]):
        self.upstream, self.plan = upstream, plan
        self.seen: Counter = Counter()
        self.faults: Counter = Counter()
        self.requests: Counter = Counter()
        self.bytes_in: Counter = Counter()
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            head, body = _read_request(conn)
            if head is None:
                return
            method, path = head.split(b" ", 2)[:2]
            key = (method.decode(), unquote(path.decode().split("?")[0]))  # GCS sends a key's '/' as %2F
            kind = request_kind(key[0], path.decode())
            with self._lock:
                self.seen[key] += 1
                self.requests[kind] += 1
                action = self.plan(key[0], key[1], self.seen[key])
                if action != "ok":
                    self.faults[action] += 1
            if action == "stall":
                conn.recv(1)  # until the client gives up and closes
                return
            if action == "503":
                conn.sendall(_SLOWDOWN % len(_SLOWDOWN_BODY) + _SLOWDOWN_BODY)
                return
            response = _forward(self.upstream, head, body)
            with self._lock:
                self.bytes_in[kind] += max(0, len(response) - response.find(b"\r\n\r\n") - 4)
            if action == "reset":
                conn.sendall(response[: len(response) - max(1, (len(response) - response.find(b"\r\n\r\n")) // 2)])
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            conn.sendall(response)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._sock.close()
        for conn in self._open:
            try:
                conn.close()
            except OSError:
                pass


def _read_request(conn: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
    for line in lines:
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return b"\r\n".join([*lines, b"Connection: close"]), body


def _forward(upstream: tuple[str, int], head: bytes, body: bytes) -> bytes:
    with socket.create_connection(upstream, timeout=30) as up:
        up.sendall(head + b"\r\n\r\n" + body)
        parts = []
        while chunk := up.recv(65536):
            parts.append(chunk)
    return b"".join(parts)
