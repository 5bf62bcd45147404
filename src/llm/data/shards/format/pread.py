"""Token blocks read with `preadv` straight into the batch: no mapped pages, so memory stays flat.

Trade-off: gathering blocks through a memory map costs page faults, and the kernel maps
more than every faulted page (fault-around), so resident memory grows much faster than the
bytes read and has to be given back with madvise (which then costs re-faults). A `preadv` per
block copies the bytes from the page cache into the output row: about as fast as the mapped
gather, and the process holds no pages of the dataset at all. Used for plain (uncompressed, local or cached) shards; the
file descriptors are pooled, pinned while in use, and checked to be the verified file.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def _max_open() -> int:
    """Descriptors a pool keeps open (unpinned ones beyond are closed, oldest first): a quarter
    of the process's limit, between 128 and 4,096. A shuffled chunk touches nearly every shard,
    so a pool smaller than the shard count reopens files on every chunk (docs/benchmarks-more.md,
    "Memory with data size")."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 128
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(128, min(4096, soft // 4))


MAX_OPEN = _max_open()


class ShardError(ValueError):
    """A shard file is missing, has the wrong size, or fails its checksum."""


class ShardChanged(ShardError):
    """The file at a shard's path is no longer the one whose checksum was verified."""


class DatasetChanged(ShardChanged):
    """The dataset folder was rewritten (re-optimized, overwritten, removed) while a reader streamed it."""


class DescriptorPool:
    """Open read-only descriptors by shard index, pinned while a read uses them."""

    def __init__(self, limit: int = MAX_OPEN):
        self.limit = limit
        self._open: OrderedDict[int, list[int]] = OrderedDict()  # shard -> [fd, pins]
        self._lock = threading.Lock()

    @contextmanager
    def use(self, shards: Sequence[int], path_of: Callable[[int], str | Path],
            identities: Sequence[tuple[int, int] | None]) -> Iterator[list[int]]:
        """The descriptors of these shards, pinned together (each opened on first use and
        checked against its `identities` entry, (dev, inode) of the verified file)."""
        with self._lock:
            opened, entries = self._open, []
            try:
                for i, identity in zip(shards, identities):
                    entry = opened.get(i)
                    if entry is None:
                        entry = opened[i] = [self._open_checked(path_of(i), identity), 0]
                    entry[1] += 1
                    entries.append(entry)
            except BaseException:
                for entry in entries:
                    entry[1] -= 1
                raise
            if len(opened) > self.limit:  # recency matters only once some must be closed
                for i in shards:
                    opened.move_to_end(i)
                self._close_unpinned()
        try:
            yield [entry[0] for entry in entries]
        finally:
            with self._lock:
                for entry in entries:
                    entry[1] -= 1

    @staticmethod
    def _open_checked(path: str | Path, identity: tuple[int, int] | None) -> int:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:  # it was verified (so present) before: the dataset was rewritten since
            raise DatasetChanged(f"shard {path} was removed after its checksum was verified: the dataset changed "
                                 "under this reader; recreate the dataset to read the new one") from None
        st = os.fstat(fd)
        if identity is not None and (st.st_dev, st.st_ino) != identity:
            os.close(fd)
            raise ShardChanged(f"shard {path} was replaced after its checksum was verified; reopen the dataset")
        return fd

    def _close_unpinned(self) -> None:
        excess = len(self._open) - self.limit
        if excess <= 0:  # the common case: no scan of the open descriptors
            return
        for i in [i for i, (_, pins) in self._open.items() if not pins][:excess]:
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


def read_rows(fds: Sequence[int], offsets: np.ndarray, width: int, stored: np.dtype, out: np.ndarray,
              dest: np.ndarray, where: Callable[[int], str | Path]) -> None:
    """out[dest[k]] = the `width` tokens at token offset offsets[k] of the file open as fds[k]
    (stored dtype, little-endian); `where(k)` names that file in an error."""
    nbytes = width * stored.itemsize
    run = None
    if out.dtype == stored and out.flags.c_contiguous:
        targets, rows = out, dest  # straight into the batch rows: no temporary
    else:
        run = _one_run(dest)
        # rows of another dtype go through a temporary; when they fill one run of rows (a whole batch or chunk: the
        # usual case) each is read into its place in that run, so widening them is one copy, not a scatter
        # (2.4x faster on a chunk of 2,048 uint16 rows of 256 widened to int64)
        targets = np.empty((len(dest), width), dtype=stored)
        rows = np.arange(len(dest)) if run is None else dest - run
    for k, fd, row, at in zip(range(len(fds)), fds, rows.tolist(), (offsets * stored.itemsize).tolist()):
        got = os.preadv(fd, [targets[row]], at)
        if got != nbytes:
            raise ShardChanged(f"shard {where(k)} ended after {at + got} bytes while reading a block: the file was truncated")
    if targets is not out:
        if run is None:
            out[dest] = targets
        else:
            out[run:run + len(dest)] = targets


def _one_run(dest: np.ndarray) -> int | None:
    """The first row when `dest` holds every row of one run first, first + 1, ... exactly once, in any order; else
    None (rows apart, or one twice: then only a scatter puts each where it belongs)."""
    if not len(dest):
        return None
    first = int(dest.min())
    if int(dest.max()) - first + 1 != len(dest):
        return None
    seen = np.zeros(len(dest), bool)
    seen[dest - first] = True
    return first if seen.all() else None
