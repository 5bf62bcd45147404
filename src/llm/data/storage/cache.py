"""The shard cache: remote shards downloaded ahead of use, verified, shared by every process on a machine.

Rules, all enforced with file locks in the cache folder (so threads, DataLoader workers and
ranks on one machine share one copy of each shard):
* a shard is downloaded to `.NAME.SIZE.PID-N.part`, checked against the manifest's size and
  checksum, then renamed into place: a reader never sees a partial or unverified file;
* one download per shard at a time (`.dl-NAME` lock); others wait for it and reuse it;
* readers hold a shared lock on the files they read (a `Pin`); eviction takes the exclusive
  lock without waiting, so a shard in use is never removed;
* bytes in the folder (counting downloads in flight at their final size) stay under
  `max_bytes`, except that a shard needed now may exceed it by at most one shard;
* eviction removes shards this process will not need first, then the one needed furthest
  in the future (the plan says which shards come next: `hint`).

Each cache counts what it does in `counters` (bytes and GET requests of downloads, hits and
misses of readers' opens, evictions; `llm.data.ingest_stats`), per process.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import xxhash

from llm.data.ingest_stats import PROCESS_REMOTE, RemoteCounters
from llm.data.storage.local import cache_home, pid_alive, same_file
from llm.data.storage.s3 import StorageError
from llm.data.waiting import reading

LOCK = ".lock"
_COUNTER = itertools.count()
_WAIT_FOR_ROOM_S = 600.0


class CorruptObject(StorageError):
    """A downloaded object does not match the manifest, twice in a row."""


def default_cache_root() -> Path:
    return cache_home() / "shards"


class _FileLock:
    def __init__(self, path: Path, shared: bool = False, block: bool = True):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if block else fcntl.LOCK_NB))
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> _FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


class Pin:
    """A shared lock on a cached shard: it cannot be evicted while this is open."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


class ShardCache:
    """Cached copies of `shards` (ShardInfo-like: file, bytes, checksum) of a remote folder."""

    def __init__(self, objects: Any, shards: Sequence[Any], folder: Path, max_bytes: int | None = None, prefetch: int = 2):
        self.objects, self.shards, self.folder = objects, list(shards), Path(folder)
        self.max_bytes, self.prefetch = max_bytes, max(0, prefetch)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._largest = max((s.bytes for s in self.shards), default=0)
        self._index = {s.file: i for i, s in enumerate(self.shards)}
        self._setup()

    def _setup(self) -> None:
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._upcoming: dict[int, int] = {}  # shard -> distance in this process's plan (all its reader threads)
        self._hints: dict[int, dict[int, int]] = {}  # reader thread -> its own latest hint
        self._inflight: set[int] = set()
        self._verified: set[tuple[int, int, int]] = set()  # (inode, size, mtime_ns) checked in this process
        self._pool: ThreadPoolExecutor | None = None
        self.counters = RemoteCounters(PROCESS_REMOTE)  # this process's counts only (fresh after fork or pickling)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k in ("objects", "shards", "folder", "max_bytes", "prefetch", "_largest", "_index")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def _check_fork(self) -> None:
        if self._pid != os.getpid():  # locks and thread pools do not survive a fork
            self._setup()

    # ---- reading ------------------------------------------------------------------------

    def open(self, i: int) -> Pin:
        """Shard i, present and verified in the cache, pinned until the Pin is closed."""
        self._check_fork()
        with reading(f"shard {self.shards[i].file} of {self.objects.url()}"):  # named by the data watchdog
            return self._open(i)

    def _open(self, i: int) -> Pin:
        info = self.shards[i]
        path = self.folder / info.file
        waited = False  # a hit: the shard was there, verified, when asked; a miss: the reader waited for a download
        for _ in range(1000):
            pin = self._try_pin(path)
            if pin is not None:
                if self._checked(pin, i):
                    self.counters.add("cache_misses" if waited else "cache_hits")
                    return pin
                waited = True
                continue
            waited = True
            pin = self._download(i, demand=True)
            if pin is not None:
                self.counters.add("cache_misses")
                return pin
        raise StorageError(f"cache {self.folder}: shard {info.file} keeps disappearing while opened; is another program deleting it?")

    def _try_pin(self, path: Path) -> Pin | None:
        while True:
            fd = _open_locked(path, fcntl.LOCK_SH)
            if fd == _BUSY:  # being evicted right now
                time.sleep(0.005)
                continue
            if fd is None:
                return None
            if same_file(path, fd):
                return Pin(path, fd)
            os.close(fd)  # evicted between open and lock
            return None

    def _checked(self, pin: Pin, i: int) -> bool:
        """Verify a cached file once per process (it may predate this run); a bad one is removed."""
        st = os.fstat(pin.fd)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._verified:
            return True
        info = self.shards[i]
        ok = st.st_size == info.bytes and _checksum_fd(pin.fd) == info.checksum
        if ok:
            self._verified.add(key)
            return True
        pin.close()
        with _FileLock(self.folder / LOCK):
            self._evict_path(pin.path)
        return False

    def hint(self, upcoming: Sequence[int]) -> None:
        """The shards this thread needs next, in order: prefetch the first few, evict the last.

        Reader threads share the cache but read different chunks: each thread's latest hint is kept,
        and a shard's distance is the nearest any live thread gives it, so one thread's hint (for
        a later window) does not make the shards another thread is still reading the first evicted."""
        self._check_fork()
        mine: dict[int, int] = {}
        for d, i in enumerate(upcoming):
            mine.setdefault(int(i), d)
        with self._mutex:
            alive = {t.ident for t in threading.enumerate()}
            self._hints = {t: h for t, h in self._hints.items() if t in alive}
            self._hints[threading.get_ident()] = mine
            self._upcoming = {}
            for hint in self._hints.values():
                for i, d in hint.items():
                    if d < self._upcoming.get(i, 1 << 62):
                        self._upcoming[i] = d
            if not self.prefetch:
                return
            todo = [i for i in mine if i not in self._inflight and not (self.folder / self.shards[i].file).exists()]
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.prefetch, thread_name_prefix="llm-prefetch")
            for i in todo[: self.prefetch - len(self._inflight)]:
                self._inflight.add(i)
                self._pool.submit(self._prefetch, i)

    def wait_prefetches(self) -> None:
        """Let this process's prefetches finish (a worker does, before it reports its last counts)."""
        self._check_fork()
        with self._mutex:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _prefetch(self, i: int) -> None:
        try:
            self._download(i, demand=False)
        except Exception:  # the demand fetch retries and reports it
            pass
        finally:
            with self._mutex:
                self._inflight.discard(i)

    # ---- downloading --------------------------------------------------------------------

    def _download(self, i: int, demand: bool) -> Pin | None:
        """Fetch shard i unless present; a demand fetch returns it pinned (no eviction in between)."""
        info = self.shards[i]
        path = self.folder / info.file
        try:
            dl = _FileLock(self.folder / f".dl-{info.file}", block=demand)
        except BlockingIOError:
            return None  # another thread or process is fetching it
        with dl:
            if path.exists():
                return None
            part = self._reserve(info, demand, self._upcoming.get(i, 0))
            if part is None:
                return None
            try:
                self._fetch(info, part)
                fd = os.open(part, os.O_RDONLY)
                fcntl.flock(fd, fcntl.LOCK_SH)  # held across the rename: the new file is pinned at once
                os.rename(part, path)
            finally:
                if part.exists():
                    part.unlink(missing_ok=True)
            st = os.fstat(fd)
            self._verified.add((st.st_ino, st.st_size, st.st_mtime_ns))
            if demand:
                return Pin(path, fd)
            os.close(fd)
            return None

    def _fetch(self, info: Any, part: Path) -> None:
        """Download into `part`, checking size and checksum; a mismatch is downloaded once more."""
        what = ""
        for _ in range(2):
            size, actual = _download_to(self.objects, info.file, part)
            self.counters.add("remote_requests")
            self.counters.add("remote_bytes", size)
            if size == info.bytes and actual == info.checksum:
                return
            what = f"{size} bytes with checksum {actual}, the manifest says {info.bytes} bytes and {info.checksum}"
        raise CorruptObject(
            f"{self.objects.url(info.file)} does not match the dataset's manifest after 2 downloads ({what}): "
            "the object was changed or damaged in the store; restore it or re-run optimize"
        )

    def _reserve(self, info: Any, demand: bool, distance: int) -> Path | None:
        """Make room (evicting), then create the .part file that accounts for the download."""
        deadline = time.monotonic() + _WAIT_FOR_ROOM_S
        while True:
            with _FileLock(self.folder / LOCK):
                used, files = self._usage()
                if self.max_bytes is not None and used + info.bytes > self.max_bytes:
                    used -= self._evict(files, used + info.bytes - self.max_bytes, None if demand else distance)
                limit = None if self.max_bytes is None else self.max_bytes + (self._largest if demand else 0)
                if limit is None or used + info.bytes <= limit:
                    part = self.folder / f".{info.file}.{info.bytes}.{os.getpid()}-{next(_COUNTER)}.part"
                    os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                    return part
            if not demand:
                return None
            if time.monotonic() > deadline:
                raise StorageError(
                    f"cache {self.folder} (max_cache_size {self.max_bytes:,} bytes) has no room for {info.file} "
                    f"({info.bytes:,} bytes): every cached shard is in use; raise max_cache_size"
                )
            time.sleep(0.05)

    def _usage(self) -> tuple[int, list[tuple[str, int]]]:
        """(bytes, [(name, size) of evictable shard files]); downloads in flight count at full size."""
        used, files = 0, []
        for entry in os.scandir(self.folder):
            name = entry.name
            if name.endswith(".part"):
                parts = name.rsplit(".", 3)  # .FILE . SIZE . PID-N . part
                try:
                    size, pid = int(parts[1]), int(parts[2].split("-")[0])
                except (IndexError, ValueError):
                    continue
                if pid != os.getpid() and not pid_alive(pid):
                    os.unlink(entry.path)  # left by a killed process
                    continue
                used += size
            elif not name.startswith("."):
                try:
                    size = entry.stat().st_size
                except FileNotFoundError:
                    continue
                used += size
                files.append((name, size))
        return used, files

    def _evict(self, files: list[tuple[str, int]], need: int, distance: int | None) -> int:
        """Remove unpinned shards until `need` bytes are free; a prefetch only evicts shards needed later."""
        far = 1 << 62

        def rank(item: tuple[str, int]) -> int:
            i = self._index.get(item[0])
            return far if i is None else self._upcoming.get(i, far)

        freed = 0
        for name, size in sorted(files, key=rank, reverse=True):
            if freed >= need:
                break
            if distance is not None and rank((name, size)) <= distance:
                break
            if self._evict_path(self.folder / name):
                freed += size
                self.counters.add("cache_evictions")
        return freed

    def _evict_path(self, path: Path) -> bool:
        fd = _open_locked(path, fcntl.LOCK_EX)
        if fd is None or fd == _BUSY:  # gone, or pinned by a reader
            return False
        try:
            os.unlink(path)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)


_BUSY = -1


def _open_locked(path: Path, lock: int) -> int | None:
    """`path` opened and flocked with `lock` without waiting: its fd, None if it is gone, `_BUSY` if a
    conflicting lock is held (a reader's shared pin against an eviction's exclusive one)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, lock | fcntl.LOCK_NB)
        return fd
    except OSError as e:
        os.close(fd)
        if isinstance(e, BlockingIOError):
            return _BUSY
        raise


def _checksum_fd(fd: int) -> str:
    h = xxhash.xxh3_64()
    offset = 0
    while True:
        block = os.pread(fd, 8 << 20, offset)
        if not block:
            return "xxh3_64:" + h.hexdigest()
        h.update(block)
        offset += len(block)


def _download_to(objects: Any, name: str, part: Path) -> tuple[int, str]:
    """Stream object `name` into `part` (restarted on each retry); returns (bytes, checksum)."""
    fd = os.open(part, os.O_WRONLY | os.O_TRUNC)
    h = xxhash.xxh3_64()
    size = [0]

    def write(chunk: memoryview) -> None:
        h.update(chunk)
        size[0] += len(chunk)
        view = chunk
        while view:
            view = view[os.write(fd, view):]

    def sink(_attempt: int) -> Any:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        h.reset()
        size[0] = 0
        return write

    try:
        objects.get_into(name, sink)
    finally:
        os.close(fd)
    return size[0], "xxh3_64:" + h.hexdigest()
