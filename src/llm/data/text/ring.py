"""Shared-memory slots for a text worker's messages: its windows written once, read in place by the main process.

Why: a message of ~256k tokens (512 KB to 1 MB) crossed the DataLoader's pipe as bytes: copied into a pickle
by the worker's feeder thread, through the kernel, and out again in the main process. With nothing but a small
reference crossing the pipe instead, the on-the-fly stream of long GPT-2 documents ran ~5% faster on 2 cores
(paired runs, docs/benchmarks.md). Each worker has a ring of slots in one anonymous shared mapping, made by the main process before the
DataLoader forks its workers; a semaphore per worker counts its free slots. The worker takes a slot before it
writes a message (waiting while the main process is that far behind); the main process gives it back once it
has copied the windows out. A worker's messages are opened in the order it sends them (the DataLoader serves
workers in turn), so its slots are reused in turn, and a reference out of that order is refused by name.

Only workers forked from the main process inherit the mapping: a forkserver's or a spawned worker has no ring,
and a message bigger than a slot still crosses the pipe as bytes.
"""

from __future__ import annotations

import mmap
import os
from multiprocessing.context import BaseContext

SlotRef = tuple[int, int, int]  # (worker, its message number, bytes written): what the message carries
_WAIT_S = 1.0  # how often a worker waiting for a free slot checks that the main process is still there


class MessageRing:
    """`slots` slots of `slot_bytes` per worker in one shared mapping; make it before the workers fork."""

    def __init__(self, workers: int, slots: int, slot_bytes: int, ctx: BaseContext):
        if slots < 1 or workers < 1:
            raise ValueError(f"a message ring needs at least one worker and one slot, got {workers} and {slots}")
        self.workers, self.slots = workers, slots
        self.slot_bytes = -(-slot_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
        # anonymous and MAP_SHARED (mmap's default): the workers forked after this write the pages this process
        # reads; pages are only backed once written
        self._memory = mmap.mmap(-1, workers * slots * self.slot_bytes)
        self._free = [ctx.Semaphore(slots) for _ in range(workers)]
        self._expected = [0] * workers  # the main process's side: each worker's next message number
        self._owner = os.getpid()

    def _view(self, worker: int, number: int, nbytes: int) -> memoryview:
        start = (worker * self.slots + number % self.slots) * self.slot_bytes
        return memoryview(self._memory)[start : start + nbytes]

    def writer(self, worker: int) -> SlotWriter:
        """The side of DataLoader worker `worker` (its id), in that worker's process."""
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} has no slots in a ring made for {self.workers} workers")
        return SlotWriter(self, worker)

    def read(self, ref: SlotRef) -> memoryview:
        """The bytes a worker wrote for message `ref` (main process); `release` it once copied out."""
        worker, number, nbytes = ref
        due = self._expected[worker] if 0 <= worker < self.workers else None
        if number != due or not 0 < nbytes <= self.slot_bytes:
            raise RuntimeError(f"text worker {worker} sent message {number} of {nbytes} bytes through its shared slots, "
                               f"but message {due} was due (slots of {self.slot_bytes} bytes): the stream cannot "
                               "go on safely")
        return self._view(worker, number, nbytes)

    def release(self, ref: SlotRef) -> None:
        """Message `ref` was copied out: its worker may write into its slot again."""
        worker = ref[0]
        self._expected[worker] += 1
        self._free[worker].release()


class SlotWriter:
    """A worker's side of the ring: `take` a slot for each message, in order."""

    def __init__(self, ring: MessageRing, worker: int):
        self.ring, self.worker, self.sent = ring, worker, 0

    def take(self, nbytes: int) -> tuple[memoryview, SlotRef] | None:
        """A free slot's first `nbytes` bytes to write the message into, and the reference the message carries;
        None when the message does not fit a slot (it crosses the pipe as bytes). Waits for a free slot."""
        ring = self.ring
        if not 0 < nbytes <= ring.slot_bytes:
            return None
        while not ring._free[self.worker].acquire(timeout=_WAIT_S):
            if os.getppid() != ring._owner:  # the main process is gone: nobody will free a slot
                os._exit(1)
        number, self.sent = self.sent, self.sent + 1
        return ring._view(self.worker, number, nbytes), (self.worker, number, nbytes)
