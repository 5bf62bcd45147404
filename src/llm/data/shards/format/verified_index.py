"""A sorted, memory-mapped index of a large verified-shards store: a lookup reads a few pages, not the store.

`optimize` remembers every shard it wrote (verified.py), so the store of a folder of 10^5 shards
holds 10^5 lines (8 MB); searching them for each shard a first batch touches, or parsing them,
grows with the shard count in every new process. Once a store holds more unindexed bytes than
`verified._INDEX_AFTER`, a process writes `<store>.idx`: every entry's identity as int64 columns
sorted by inode, its checksum, and which bytes of which store file (device, inode, length) it
covers. A new process maps it, reads the store only past those bytes, and looks an identity up
by binary search.

Why an index can be trusted as far as it is used: every store line is a fact that never turns
false (a checksum of a file whose identity includes its ctime, which any write changes), so an
index, even of an older store, answers right or not at all. A lookup counts only if the whole
identity matches and the checksum is the manifest's: a damaged entry can match only a file with
those very contents, and otherwise costs one more hash. What ties an index to its store is where
the unread lines begin: it is used only for the same file (device and inode, read through the
open descriptor), at least as long as the bytes covered, whose covered part ends in a newline;
otherwise the store is read whole, as without an index. The file is written atomically; one whose
sizes do not add up is ignored.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from llm.data.shards.format import framed

_MAGIC = b"llm-verified-index\n"
_VERSION = 1
_WIDTH = 64  # checksums parsed at most this long on the fast path (ours are 24 bytes)
_KEYS = ("ino", "dev", "size", "mtime", "ctime")  # stored in this order; an identity is (dev, ino, size, mtime, ctime)


class StoreIndex:
    """The entries of a store's first `covered` bytes (of the store file `file` = (dev, inode)), sorted by inode."""

    def __init__(self, file: tuple[int, int], covered: int, columns: dict[str, np.ndarray], sums: np.ndarray):
        self.file, self.covered = file, covered
        self.columns, self.sums = columns, sums

    def __len__(self) -> int:
        return len(self.sums)

    def get(self, key: tuple[int, ...]) -> str | None:
        """The checksum of identity `key` (the latest line of that identity), or None."""
        dev, ino, size, mtime, ctime = key
        inos = self.columns["ino"]
        lo, hi = int(np.searchsorted(inos, ino, "left")), int(np.searchsorted(inos, ino, "right"))
        c = self.columns
        for j in range(hi - 1, lo - 1, -1):  # a stable sort kept each inode's lines in file order
            if (int(c["dev"][j]), int(c["size"][j]), int(c["mtime"][j]), int(c["ctime"][j])) == (dev, size, mtime, ctime):
                return bytes(self.sums[j]).decode(errors="replace")
        return None

    def to_dict(self) -> dict[tuple[int, ...], str]:
        """Every entry as verified._parse gives them (for a compaction, which rewrites the store whole)."""
        c = {name: column.tolist() for name, column in self.columns.items()}
        sums = [bytes(s).decode(errors="replace") for s in self.sums.tolist()]
        return dict(zip(zip(c["dev"], c["ino"], c["size"], c["mtime"], c["ctime"]), sums))


def index_path(store: Path) -> Path:
    return store.with_name(f"{store.name}.idx")


def load(store: Path, file: tuple[int, int]) -> StoreIndex | None:
    """The index of `store` if it was made of the store file `file` (device, inode); None otherwise."""
    mapped = framed.mapped(index_path(store))
    found = None if mapped is None else framed.unframe(mapped, _MAGIC)
    if found is None:
        return None
    header, at = found
    try:
        n, width, body = header["entries"], header["width"], _aligned(at)
        if header.get("version") != _VERSION or tuple(header["file"]) != file or len(mapped) != body + n * (8 * len(_KEYS) + width):
            return None
        columns = {name: np.frombuffer(mapped, np.int64, n, body + 8 * n * k) for k, name in enumerate(_KEYS)}
        sums = np.frombuffer(mapped, f"S{width}", n, body + 8 * n * len(_KEYS)) if width else np.zeros(n, "S1")
        return StoreIndex(file, int(header["covered"]), columns, sums)
    except (ValueError, KeyError, TypeError):
        return None


def write(store: Path, file: tuple[int, int], covered: int, previous: StoreIndex | None, lines: bytes,
          parsed: tuple[np.ndarray, np.ndarray] | None = None) -> StoreIndex | None:
    """Index the store file `file`'s first `covered` bytes: `previous` (its first part) and `lines` (the rest;
    `parsed`: `parse(lines)` if already made). Best effort: None if the index could not be written (the store is
    then searched as before)."""
    keys, sums = parsed if parsed is not None else parse(lines)
    if previous is not None:
        keys = np.concatenate([np.stack([previous.columns[name] for name in _KEYS], axis=1), keys])
        width = max(previous.sums.dtype.itemsize, sums.dtype.itemsize)
        sums = np.concatenate([previous.sums.astype(f"S{width}"), sums.astype(f"S{width}")])
    order = np.argsort(keys[:, 0], kind="stable")  # by inode; each inode's lines stay in file order
    keys, sums = keys[order], sums[order]
    width = sums.dtype.itemsize if len(sums) else 0
    header = {"version": _VERSION, "file": list(file), "covered": covered, "entries": len(sums), "width": width}
    parts = [framed.frame(_MAGIC, header, pad_to=8)]
    parts += [np.ascontiguousarray(keys[:, k]).tobytes() for k in range(len(_KEYS))] + [sums.tobytes()]
    return load(store, file) if framed.replace(index_path(store), parts) else None


def parse(lines: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The entries of store lines as (int64 rows of `_KEYS`, checksums), in file order.

    One C pass (np.loadtxt) when every line is well formed; otherwise line by line, skipping torn
    or foreign lines as verified._parse does."""
    fast = well_formed(lines)
    if fast is not None:
        return fast
    known = parse_lines(lines)
    keys = np.array(list(known), dtype=np.int64).reshape(-1, len(_KEYS))[:, [1, 0, 2, 3, 4]]
    return keys, np.array([s.encode() for s in known.values()], dtype="S").reshape(-1)


def parse_lines(lines: bytes) -> dict[tuple[int, ...], str]:
    """Store lines as identity -> checksum, line by line: the last line of an identity wins."""
    known: dict[tuple[int, ...], str] = {}
    for line in lines.split(b"\n"):
        parts = line.split()
        if len(parts) == 6:
            try:
                known[(int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]))] = parts[5].decode()
            except (ValueError, UnicodeDecodeError):  # a torn or foreign line: one more hash later, nothing worse
                pass
    return known


def all_distinct(keys: np.ndarray) -> bool:
    """Whether no identity (a row of `parse`'s keys) is listed twice: a store with nothing to compact."""
    keys = keys[np.lexsort(keys.T[::-1])]
    return not bool(np.any(np.all(keys[1:] == keys[:-1], axis=1)))


def well_formed(lines: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """`parse(lines)` in one C pass (np.loadtxt) if every line is well formed, else None."""
    if not lines.strip():
        return np.zeros((0, len(_KEYS)), np.int64), np.zeros(0, "S1")
    try:
        rows = np.loadtxt(io.BytesIO(lines), dtype=[("key", "<i8", (5,)), ("sum", f"S{_WIDTH}")], delimiter=" ",
                          comments=None, encoding="latin1", ndmin=1)
    except (ValueError, OverflowError):
        return None
    longest = int(np.char.str_len(rows["sum"]).max()) if len(rows) else 0
    if longest >= _WIDTH:  # some may be cut short
        return None
    return rows["key"][:, [1, 0, 2, 3, 4]], rows["sum"].astype(f"S{max(1, longest)}")


def _aligned(offset: int) -> int:
    return (offset + 7) // 8 * 8
