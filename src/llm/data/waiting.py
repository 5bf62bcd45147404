"""What each reader of this process is waiting for (a shard, an object, a partition) and the remote requests in flight.

The data watchdog (`llm.data.watchdog`) reads this when a loader hands no batch for too long. Readers
mark what they read when they open it (`reading`, per shard or partition, never per sample) and the
storage layer marks each remote request while it runs (`in_flight`). In the training process the
watchdog reads these marks directly. A DataLoader worker process mirrors its oldest mark and its
oldest request into its own fixed-size slot of a small shared file (`WorkerSlots`), which the
loader's process created and reads: a stalled, or killed, worker is still named with what it read.
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

_TEXT = 480  # bytes of each mark's text in a slot (longer ones are cut)
_SLOT = struct.Struct(f"<Qqdd{_TEXT}s{_TEXT}s")  # seq, pid, reading since, request since, reading, request
_SLOT_BYTES = 1024
_TOKENS = itertools.count(1)


class _Marks:
    """This process's marks: per thread what it reads, per request what it asks; mirrored to a slot in a worker."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.reading: dict[int, tuple[str, str, float]] = {}  # thread ident -> (thread name, what, since)
        self.requests: dict[int, tuple[str, str, float]] = {}  # token -> (thread name, what, since)
        self.slot: tuple[mmap.mmap, int] | None = None

    def mirror(self) -> None:
        """Write the oldest mark and the oldest request into this worker's slot (caller holds the lock)."""
        if self.slot is None:
            return
        buf, at = self.slot
        read = min(self.reading.values(), key=lambda m: m[2], default=("", "", 0.0))
        req = min(self.requests.values(), key=lambda m: m[2], default=("", "", 0.0))
        seq = struct.unpack_from("<Q", buf, at)[0]
        struct.pack_into("<Q", buf, at, seq + 1)  # odd: a reader retries (a seqlock)
        _SLOT.pack_into(buf, at, seq + 1, self.pid, read[2], req[2], read[1].encode()[:_TEXT], req[1].encode()[:_TEXT])
        struct.pack_into("<Q", buf, at, seq + 2)


_marks = _Marks()


def _here() -> _Marks:
    global _marks
    if _marks.pid != os.getpid():  # a forked child starts without its parent's marks (and without its slot)
        _marks = _Marks()
    return _marks


def mark_reading(what: str | None) -> None:
    """This thread now reads `what` (None: nothing); a reader calls it per shard or partition."""
    marks, me = _here(), threading.current_thread()
    with marks.lock:
        if what is None:
            marks.reading.pop(me.ident or 0, None)
        else:
            marks.reading[me.ident or 0] = (me.name, what, time.monotonic())
        marks.mirror()


@contextmanager
def reading(what: str) -> Iterator[None]:
    """Mark `what` as read by this thread while the block runs (the earlier mark comes back after it)."""
    marks, me = _here(), threading.current_thread()
    before = marks.reading.get(me.ident or 0)
    mark_reading(what)
    try:
        yield
    finally:
        with marks.lock:
            if before is None:
                marks.reading.pop(me.ident or 0, None)
            else:
                marks.reading[me.ident or 0] = before
            marks.mirror()


@contextmanager
def in_flight(what: str) -> Iterator[None]:
    """Mark a remote request (`reading s3://bucket/key`) as in flight while the block runs."""
    marks, token = _here(), next(_TOKENS)
    with marks.lock:
        marks.requests[token] = (threading.current_thread().name, what, time.monotonic())
        marks.mirror()
    try:
        yield
    finally:
        with marks.lock:
            marks.requests.pop(token, None)
            marks.mirror()


def _age(since: float, now: float) -> str:
    return f"{now - since:.1f} s"


def local_lines() -> list[str]:
    """What this process's threads read and ask now, one phrase each, oldest first."""
    marks, now = _here(), time.monotonic()
    with marks.lock:
        reading, requests = list(marks.reading.values()), list(marks.requests.values())
    out = [f"thread {name} reads {what} (for {_age(since, now)})" for name, what, since in sorted(reading, key=lambda m: m[2])]
    out += [f"thread {name}'s request in flight for {_age(since, now)}: {what}"
            for name, what, since in sorted(requests, key=lambda m: m[2])]
    return out


@dataclass(frozen=True)
class WorkerMark:
    """One worker's slot as read: its pid, what it reads and the request in flight, with their ages (None: nothing)."""

    worker: int
    pid: int
    reading: str
    reading_s: float | None
    request: str
    request_s: float | None

    def alive(self) -> bool:
        """Whether the worker process still runs (a zombie, killed but not yet reaped, does not)."""
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
        except (OSError, IndexError):
            try:
                os.kill(self.pid, 0)
                return True
            except OSError:
                return False

    def phrase(self) -> str:
        """`worker 1 (pid 123) reads shard X (for 3.0 s), its request in flight for 2.9 s: reading s3://...`."""
        who = f"worker {self.worker} (pid {self.pid})"
        alive = self.alive()
        doing = ("reads" if alive else "has exited while reading") + f" {self.reading} (for {self.reading_s:.1f} s)" \
            if self.reading else ("is not reading any shard or object" if alive else "has exited")
        if self.request:
            doing += f", its request in flight for {self.request_s:.1f} s: {self.request}"
        return f"{who} {doing}"


class WorkerSlots:
    """One slot per DataLoader worker in a small shared file: the worker writes its marks, this process reads them."""

    def __init__(self, workers: int):
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        fd, self.path = tempfile.mkstemp(prefix="llm-watch-", dir=folder)
        try:
            os.ftruncate(fd, max(1, workers) * _SLOT_BYTES)
            self._buf = mmap.mmap(fd, max(1, workers) * _SLOT_BYTES)
        finally:
            os.close(fd)
        self.workers = workers
        # the file goes when this object does (workers hold their own mapping until they exit)
        weakref.finalize(self, _remove, self.path, self._buf)

    def clear(self) -> None:
        """Forget the previous workers' marks (a new pass starts new workers)."""
        self._buf[:] = bytes(len(self._buf))

    def hook(self, user_init: Callable[[int], Any] | None) -> WorkerInit:
        """A `worker_init_fn` that gives each worker its slot, then runs the user's own `worker_init_fn`."""
        return WorkerInit(self.path, user_init)

    def read(self) -> list[WorkerMark]:
        """Each worker's marks (workers that never started are left out)."""
        now, out = time.monotonic(), []
        for w in range(self.workers):
            at = w * _SLOT_BYTES
            for _ in range(100):  # a worker writing its slot right now: read it again
                seq, pid, rs, qs, read, req = _SLOT.unpack_from(self._buf, at)
                if not seq % 2 and struct.unpack_from("<Q", self._buf, at)[0] == seq:
                    break
                time.sleep(0.001)
            if pid:
                read_text, req_text = read.rstrip(b"\0").decode(errors="replace"), req.rstrip(b"\0").decode(errors="replace")
                out.append(WorkerMark(w, pid, read_text, now - rs if read_text else None,
                                      req_text, now - qs if req_text else None))
        return out


def _remove(path: str, buf: mmap.mmap) -> None:
    buf.close()
    try:
        os.unlink(path)
    except OSError:
        pass


class WorkerInit:
    """The picklable `worker_init_fn` of `WorkerSlots.hook`: attach slot `worker_id`, then call the user's."""

    def __init__(self, path: str, user_init: Callable[[int], Any] | None):
        self.path, self.user_init = path, user_init

    def __call__(self, worker_id: int) -> None:
        attach_slot(self.path, worker_id)
        if self.user_init is not None:
            self.user_init(worker_id)


def attach_slot(path: str, worker: int) -> None:
    """In a worker process: mirror this process's marks into slot `worker` of the shared file at `path`."""
    marks = _here()
    fd = os.open(path, os.O_RDWR)
    try:
        buf = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    with marks.lock:
        marks.slot = (buf, worker * _SLOT_BYTES)
        struct.pack_into("<Q", buf, worker * _SLOT_BYTES, 0)
        marks.mirror()
