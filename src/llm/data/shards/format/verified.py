"""Shards this machine has already checksummed, remembered by file identity, so a restart does not hash them again.

Verifying a shard on first touch costs a full read; a run that
restarts (or resumes, or a second rank on the same node) would pay it again for
every shard its first batch touches, so the first batch grows with the data. Here a
verified shard is remembered as (device, inode, size, mtime_ns, ctime_ns) ->
checksum, in one small append-only file per dataset folder
(`$LLM_CACHE_DIR/verified/<hash of the folder>`, default `~/.cache/llm/verified/`). A shard counts as verified only if its
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

import hashlib
import os
import threading
import time
from pathlib import Path

from llm.data.shards.format import verified_index
from llm.data.storage.local import cache_home

_MAX_BYTES = 1 << 20  # a store is compacted to its unique entries beyond this (and twice their size)
_QUIET_NS = 50_000_000  # a file changed less than 50 ms before its hash is not remembered
_PARSE_AFTER = 64  # lookups answered by a substring search of the store before it is parsed whole
_INDEX_AFTER = 256 << 10  # unindexed store bytes beyond which a sorted index is written (verified_index.py)
_lock = threading.Lock()
_stores: dict[Path, _Store] = {}  # store file -> what this process has read of it
# (folder, store base) -> store file; a folder retargeted by a symlink later only costs hashes (keys are file identities)
_store_paths: dict[tuple[str, Path], Path] = {}


class _Store:
    """What this process read of one store: a sorted index of its first part when the store is
    large (verified_index.py), and the lines past it, parsed into a dict only once many lookups
    need it, so the first batch of a dataset with 10^4-10^5 shards does not parse or search
    every line (a few lookups by substring search are cheaper than one parse; many are not).
    """

    def __init__(self) -> None:
        self.raw = b"\n"  # whole lines read past the index (a leading newline: every line starts after one)
        self.loaded = 0  # bytes of the file read (or covered by the index)
        self.parsed: dict[tuple[int, ...], str] | None = None
        self.lookups = 0
        self.compact_at = _MAX_BYTES  # file size beyond which duplicates are worth rewriting away
        self.index: verified_index.StoreIndex | None = None
        self.file: tuple[int, int] | None = None  # (device, inode) of the store file read

    def everything(self) -> dict[tuple[int, ...], str]:
        """Every entry, the index's and the lines past it (the last line of an identity wins)."""
        known = self.index.to_dict() if self.index is not None else {}
        known.update(self.parsed if self.parsed is not None else _parse(self.raw))
        return known

    def add(self, lines: bytes) -> None:
        self.raw += lines
        if self.parsed is not None:
            self.parsed.update(_parse(lines))

    def get(self, key: tuple[int, ...]) -> str | None:
        found = self._get_unindexed(key)  # lines past the index are the later ones
        if found is None and self.index is not None:
            return self.index.get(key)
        return found

    def _get_unindexed(self, key: tuple[int, ...]) -> str | None:
        if self.parsed is None:
            self.lookups += 1
            if self.lookups <= _PARSE_AFTER:  # the last line for this identity wins
                at = self.raw.rfind(b"\n" + _key_bytes(key) + b" ")
                if at < 0:
                    return None
                end = self.raw.find(b"\n", at + 1)
                parts = self.raw[at + 1 : end].split()
                return parts[5].decode(errors="replace") if len(parts) == 6 else None
            self.parsed = _parse(self.raw)
        return self.parsed.get(key)

    def remember(self, key: tuple[int, ...], checksum: str) -> None:
        if self.parsed is not None:
            self.parsed[key] = checksum
        else:  # as if read from the file: our own append is in it now
            self.raw += _key_bytes(key) + f" {checksum}\n".encode()


def _key_bytes(key: tuple[int, ...]) -> bytes:
    return " ".join(map(str, key)).encode()


def _parse(lines: bytes) -> dict[tuple[int, ...], str]:
    return verified_index.parse_lines(lines)


def _base() -> Path:
    return cache_home() / "verified"


def store_path(shard: Path | str) -> Path:
    """The store of the folder holding `shard`: one small file per dataset folder, so a process
    reads only the entries of the datasets it opens (O(shards), once)."""
    folder, base = os.path.dirname(os.path.abspath(shard)), _base()
    known = _store_paths.get((folder, base))
    if known is None:  # realpath walks every component: once per folder, not once per shard touched
        known = _store_paths[(folder, base)] = base / hashlib.sha256(os.path.realpath(folder).encode()).hexdigest()[:24]
    return known


def manifests_folder() -> Path:
    """Where the shard tables of checked manifests are remembered (shard_table.py)."""
    return _base() / "manifests"


def enabled() -> bool:
    return os.environ.get("LLM_REMEMBER_VERIFIED", "1") != "0"


def _identity(path: Path | str) -> tuple[int, ...] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _entries(store: Path, refresh: bool = False) -> _Store:
    """A store as this process knows it: read once, then only what other processes appended since."""
    known = _stores.get(store)
    if known is None:
        known, refresh = _Store(), True
    if refresh:
        tail = _read_new(store, known)
        end = tail.rfind(b"\n") + 1  # a line still being written is read next time
        known.add(tail[:end])
        known.loaded += end
        rows = _compact(store, known) if known.loaded > known.compact_at else None
        if len(known.raw) > _INDEX_AFTER and known.file is not None:
            index = verified_index.write(store, known.file, known.loaded, known.index, known.raw, rows)
            if index is not None:
                known.index, known.raw, known.lookups = index, b"\n", 0
                known.parsed = None if known.parsed is None else {}
    _stores[store] = known
    return known


def _read_new(store: Path, known: _Store) -> bytes:
    """The store's bytes past what `known` holds; a process new to the store starts past its index.

    The store only grows by appends, or is replaced whole (a compaction: a new file), so reading
    on from `known.loaded` is right while the file is the same one and a line ends there;
    otherwise everything is read again from the start (index included)."""
    try:
        with open(store, "rb") as f:
            st = os.fstat(f.fileno())
            file = (st.st_dev, st.st_ino)
            if known.file != file and known.loaded:  # replaced since we read it: start over
                known.raw, known.loaded, known.parsed, known.index = b"\n", 0, None, None
            known.file = file
            if not known.loaded:  # a process new to this store: what its index covers need not be read
                index = verified_index.load(store, file)
                if index is not None and index.covered <= st.st_size:
                    known.index, known.loaded = index, index.covered
            if known.loaded:
                f.seek(known.loaded - 1)
                if f.read(1) != b"\n":  # not where a line ends: not the bytes we indexed or read
                    f.seek(0)
                    known.raw, known.loaded, known.parsed, known.index = b"\n", 0, None, None
            return f.read()
    except OSError:
        return b""


def _compact(path: Path, store: _Store) -> tuple | None:
    """Rewrite the store with its unique entries (a concurrent append may be lost: one more hash later).

    Returns the entries of `store.raw` (verified_index.parse) when it parsed them and left the store as it was.

    Why: `verify_checksums="always"` and `llm-data verify` hash on every read and append again,
    so each such run adds ranks x shards lines that every process then reads whole; compacted,
    the file stays under max(1 MiB, twice its unique entries).
    """
    # A store of mostly unique entries (optimize remembers every shard it wrote: 10^5 lines) would
    # be parsed by every new process only to learn that; the size of its unique entries found
    # last time is kept beside it, so a process parses it only once it has doubled since.
    hint = path.with_name(f"{path.name}.unique")
    try:
        unique_bytes = int(hint.read_bytes())
    except (OSError, ValueError):
        unique_bytes = 0
    rows = None
    if not unique_bytes and store.index is None and store.loaded == len(store.raw) - 1:
        rows = verified_index.well_formed(store.raw)
        if rows is not None and verified_index.all_distinct(rows[0]):
            unique_bytes = store.loaded  # every line read, none repeats an identity (C passes, ~10x cheaper than a parse)
            _write_hint(hint, unique_bytes)
    if unique_bytes and store.loaded <= 2 * unique_bytes:
        store.compact_at = max(_MAX_BYTES, 2 * unique_bytes)
        return rows
    unique = store.everything()
    text = b"".join(_key_bytes(k) + f" {v}\n".encode() for k, v in unique.items())
    store.compact_at = max(_MAX_BYTES, 2 * len(text))  # next time only once it doubled again
    _write_hint(hint, len(text))
    if len(text) * 2 > store.loaded:  # mostly unique already: rewriting would not shrink it much
        return None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    store.raw, store.loaded, store.parsed, store.index = b"\n" + text, len(text), unique, None
    store.file = None  # the new file: its identity is taken at the next read
    return None


def _write_hint(hint: Path, unique_bytes: int) -> None:
    try:
        hint.write_bytes(str(unique_bytes).encode())  # best effort: without it, the next process parses
    except OSError:
        pass


def is_verified(path: Path | str, checksum: str) -> bool:
    """True if this exact file was checksummed to `checksum` before (by any process on this machine)."""
    if not enabled():
        return False
    key = _identity(path)
    if key is None:
        return False
    store = store_path(path)
    with _lock:
        if _entries(store).get(key) == checksum:
            return True
        return _entries(store, refresh=True).get(key) == checksum  # another process may have verified it


def recorded(path: Path | str, key: tuple[int, ...] | None) -> str | None:
    """The checksum remembered for the file at `path` while its identity is `key` (`identity(path)[0]`), or None.

    Manifest.load uses it to name index.json's bytes without reading them (shard_table.py)."""
    if key is None or not enabled():
        return None
    store = store_path(path)
    with _lock:
        return _entries(store).get(key) or _entries(store, refresh=True).get(key)


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
        _append(store_path(path), key, checksum)


def remember(path: Path | str, checksum: str, before: tuple[tuple[int, ...] | None, int]) -> None:
    """Record that the file at `path` has `checksum` (best effort: never raises).

    `before` is `identity(path)` from when the hash started. Nothing is recorded if the file
    changed since, or if it had changed less than `_QUIET_NS` before: file timestamps tick
    coarsely (a few ms), so a write in the same tick as the one we hashed would keep the
    identity; a file quiet for longer gets a new ctime from any later write.
    """
    key, started = before
    if key is None or _identity(path) != key or started - key[4] < _QUIET_NS or key[4] % 1_000_000_000 == 0:
        # (a ctime on a whole second: a file system that keeps whole seconds, where a later write
        # within that second would keep the identity; nothing is remembered there)
        return
    _append(store_path(path), key, checksum)


def _append(store: Path, key: tuple[int, ...], checksum: str) -> None:
    if not enabled() or any(c.isspace() for c in checksum):
        return
    line = _key_bytes(key) + f" {checksum}\n".encode()
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
        _entries(store).remember(key, checksum)
