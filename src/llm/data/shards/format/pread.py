"""Token blocks read with `preadv` straight into the batch: no mapped pages, so memory stays flat.

Trade-off: gathering blocks through a memory map costs page faults, and the kernel maps
~64 KB around every faulted page (fault-around), so resident memory grows ~16x faster than
the bytes read and has to be given back with madvise (which then costs re-faults). A
`preadv` per block copies the bytes from the page cache into the output row, one system
call of ~1 us per 4 KB block: about as fast as the mapped gather, and the process holds no
pages of the dataset at all. Used for plain (uncompressed, local or cached) shards; the
file descriptors are pooled, pinned while in use, and checked to be the verified file.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

MAX_OPEN = 128  # descriptors kept open per process (unpinned ones beyond are closed, oldest first)


class ShardError(ValueError):
    """A shard file is missing, has the wrong size, or fails its checksum."""


class ShardChanged(ShardError):
    """The file at a shard's path is no longer the one whose checksum was verified."""


class DescriptorPool:
    """Open read-only descriptors by shard index, pinned while a read uses them."""

    def __init__(self, limit: int = MAX_OPEN):
        self.limit = limit
        self._open: OrderedDict[int, list[int]] = OrderedDict()  # shard -> [fd, pins]
        self._lock = threading.Lock()

    @contextmanager
    def use(self, i: int, path_of: Callable[[int], Path], identity: tuple[int, int] | None) -> Iterator[int]:
        """The descriptor of shard i (opened on first use and checked against `identity` (dev, inode))."""
        with self._lock:
            entry = self._open.get(i)
            if entry is None:
                path = path_of(i)  # built only when opening: this runs for every shard of every gather
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                st = os.fstat(fd)
                if identity is not None and (st.st_dev, st.st_ino) != identity:
                    os.close(fd)
                    raise ShardChanged(f"shard {path} was replaced after its checksum was verified; reopen the dataset")
                entry = self._open[i] = [fd, 0]
            entry[1] += 1
            self._open.move_to_end(i)
            self._close_unpinned()
        try:
            yield entry[0]
        finally:
            with self._lock:
                entry[1] -= 1

    def _close_unpinned(self) -> None:
        for i in [i for i, (_, pins) in self._open.items() if not pins][: max(0, len(self._open) - self.limit)]:
            os.close(self._open.pop(i)[0])

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._open.values():
                os.close(fd)
            self._open.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


def read_rows(fd: int, offsets: np.ndarray, width: int, stored: np.dtype, out: np.ndarray, dest: np.ndarray,
              where: Callable[[], Path]) -> None:
    """out[dest[k]] = the `width` tokens at token offset offsets[k] of the file (stored dtype, little-endian)."""
    itemsize = stored.itemsize
    nbytes = width * itemsize
    if out.dtype == stored and out.flags.c_contiguous:
        targets, rows = out, dest  # straight into the batch rows: no temporary
    else:
        targets, rows = np.empty((len(dest), width), dtype=stored), np.arange(len(dest))
    for row, offset in zip(rows.tolist(), offsets.tolist()):
        got = os.preadv(fd, [targets[row]], offset * itemsize)
        if got != nbytes:
            raise ShardChanged(f"shard {where()} ended after {offset * itemsize + got} bytes while reading a block: the file was truncated")
    if targets is not out:
        out[dest] = targets
