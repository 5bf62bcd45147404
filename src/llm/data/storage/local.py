"""Local paths: durable whole-file writes, write-by-rename and directory fsync."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def cache_home() -> Path:
    """The user cache folder of this library: $LLM_CACHE_DIR, else $XDG_CACHE_HOME/llm, else ~/.cache/llm."""
    return Path(os.environ.get("LLM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llm"))


def fsync_dir(path: str | Path) -> None:
    """Make renames and creations inside `path` durable: a rename only survives a power cut
    once the directory entry itself has reached the disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory fds (Windows): best effort
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory; nothing more can be done
        pass
    finally:
        os.close(fd)


def write_file(path: str | Path, parts: bytes | memoryview | Iterable[bytes | memoryview]) -> int:
    """Write bytes to `path` and fsync it; returns the number of bytes written.

    Goes through `os.writev` (a list or tuple of parts, all at hand) or `os.write` (parts as they come) in a loop
    that carries on after short writes (they happen on full or network disks), so an out-of-space error surfaces
    here as an OSError, never as a silently short file.
    """
    if isinstance(parts, (bytes, bytearray, memoryview)):
        parts = [parts]
    total = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if isinstance(parts, (list, tuple)):  # all at hand: one writev for many parts (a ledger segment's blocks)
            total = _write_all(fd, [memoryview(p).cast("B") for p in parts])
        else:
            for part in parts:
                total += _write_all(fd, [memoryview(part).cast("B")])
        os.fsync(fd)
    finally:
        os.close(fd)
    return total


def _write_all(fd: int, views: list[memoryview]) -> int:
    """Write every view, in order, with as few `writev` calls as the kernel allows (short writes go on)."""
    total, limit = 0, 1024 if hasattr(os, "writev") else 1  # 1024: Linux's IOV_MAX
    views = [v for v in views if v.nbytes]  # an empty one would be written as 0 bytes, forever
    while views:
        n = os.writev(fd, views[:limit]) if limit > 1 else os.write(fd, views[0])
        total += n
        while n:
            if n >= views[0].nbytes:
                n -= views[0].nbytes
                views.pop(0)
            else:
                views[0], n = views[0][n:], 0
    return total


def atomic_write(path: str | Path, data: bytes | memoryview | Iterable[bytes | memoryview]) -> None:
    """Replace `path` with `data` by write-to-temp, fsync, rename, directory fsync.

    A reader (or a crash at any moment) sees the old file or the new one, never half;
    a failed write (disk full) removes its temporary file and leaves the old one in place.
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        write_file(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs on this machine (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def same_file(path: str | Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd` (not removed or replaced since)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
