"""Shards this machine has already checksummed, remembered by file identity, so a restart does not hash them again.

Verifying a shard on first touch costs a full read (0.2-0.5 s per GB); a run that
restarts (or resumes, or a second rank on the same node) would pay it again for
every shard its first batch touches, so the first batch grows with the data. Here a
verified shard is remembered as (device, inode, size, mtime_ns, ctime_ns) ->
checksum, in one append-only file per machine (`$LLM_CACHE_DIR/verified-shards`,
default `~/.cache/llm/verified-shards`). A shard counts as verified only if its
identity is unchanged *and* the remembered checksum is the manifest's. Any write to
the file changes its ctime, which no user call can set back, so a shard edited in
place (even with its size and mtime restored) is hashed again. What it does not see:
bits flipped on disk behind the filesystem's back; `llm-data verify` and
`verify_checksums="always"` always hash.

A file is remembered only if it had not changed for 50 ms when its hash started: file
timestamps tick coarsely, and only then does any later write surely change its ctime.
Writers append one short line each with O_APPEND, so processes share the file without
a lock (a torn or foreign line is skipped, which only means one more hash).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

_MAX_BYTES = 8 << 20  # compacted to its unique entries beyond this
_QUIET_NS = 50_000_000  # a file changed less than 50 ms before its hash is not remembered
_lock = threading.Lock()
_known: dict[tuple[int, ...], str] | None = None
_loaded_from: Path | None = None
_loaded_bytes = 0


def store_path() -> Path:
    base = os.environ.get("LLM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llm")
    return Path(base) / "verified-shards"


def enabled() -> bool:
    return os.environ.get("LLM_REMEMBER_VERIFIED", "1") != "0"


def _identity(path: Path | str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _entries(refresh: bool = False) -> dict[tuple[int, ...], str]:
    """The store's entries: read once per process, then only what other processes appended since."""
    global _known, _loaded_from, _loaded_bytes
    path = store_path()
    if _known is None or _loaded_from != path:
        _known, _loaded_from, _loaded_bytes = {}, path, 0
        refresh = True
    if refresh:
        try:
            with open(path, "rb") as f:
                f.seek(_loaded_bytes)
                tail = f.read()
        except OSError:
            tail = b""
        end = tail.rfind(b"\n") + 1  # a line still being written is read next time
        for line in tail[:end].decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 6 and all(p.isdigit() for p in parts[:5]):
                _known[tuple(int(p) for p in parts[:5])] = parts[5]
        _loaded_bytes += end
        if _loaded_bytes > _MAX_BYTES:
            _compact(path, _known)
            _loaded_bytes = 0
            _known, _loaded_from = None, None
            return _entries()
    return _known


def _compact(path: Path, known: dict[tuple[int, ...], str]) -> None:
    """Rewrite the store with its unique entries (a concurrent append may be lost: one more hash later)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text("".join(" ".join(map(str, k)) + f" {v}\n" for k, v in known.items()))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def is_verified(path: Path | str, checksum: str) -> bool:
    """True if this exact file was checksummed to `checksum` before (by any process on this machine)."""
    if not enabled():
        return False
    key = _identity(path)
    if key is None:
        return False
    with _lock:
        if _entries().get(key) == checksum:
            return True
        return _entries(refresh=True).get(key) == checksum  # another process may have verified it


def identity(path: Path | str) -> tuple[tuple[int, ...] | None, int]:
    """(the file's identity, the time now): take it before hashing, pass it to `remember` after."""
    return _identity(path), time.time_ns()


def remember_written(path: Path | str, checksum: str) -> None:
    """A shard `optimize` just wrote, hashed from the very bytes it wrote: readers here need not hash it.

    No quiet window here: the output folder is locked by the writer, so only a process
    ignoring the lock could change the file within the same timestamp tick.
    """
    key = _identity(path)
    if key is not None:
        _append(key, checksum)


def remember(path: Path | str, checksum: str, before: tuple[tuple[int, ...] | None, int]) -> None:
    """Record that the file at `path` has `checksum` (best effort: never raises).

    `before` is `identity(path)` from when the hash started. Nothing is recorded if the file
    changed since, or if it had changed less than `_QUIET_NS` before: file timestamps tick
    coarsely (a few ms), so a write in the same tick as the one we hashed would keep the
    identity; a file quiet for longer gets a new ctime from any later write.
    """
    if not enabled():
        return
    key, started = before
    if key is None or _identity(path) != key or started - key[4] < _QUIET_NS:
        return
    _append(key, checksum)


def _append(key: tuple[int, ...], checksum: str) -> None:
    if not enabled() or any(c.isspace() for c in checksum):
        return
    line = (" ".join(map(str, key)) + f" {checksum}\n").encode()
    store = store_path()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(store, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write of < 200 bytes with O_APPEND: never interleaved
        finally:
            os.close(fd)
    except OSError:
        return
    with _lock:
        _entries()[key] = checksum
