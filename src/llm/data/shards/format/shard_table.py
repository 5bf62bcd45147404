"""The shard list as numpy columns, and its copy remembered per checked manifest: a flat open at 10^4-10^5 shards.

Parsing index.json into ~10 Python objects per shard, a `ShardInfo` each, and a stat of every
file is O(shards) of Python, plus full garbage-collector passes in a process that imported torch.
Here the shard list is
a few numpy arrays (counts, a blob of file names, a blob of checksums, small codes for
dtype and compression); `table[i]` builds one `ShardInfo` when shard i is first touched.

After a manifest passed every cross-check (validate.py), its table is remembered on this
machine, beside the verified-shards store (verified.py): one file per manifest, named by the
xxh3-128 digest of the index.json bytes it came from, holding the table and the manifest's
other fields. The checks are a pure function of those bytes, so a later open of those very bytes reads that file instead of the JSON: one read and
a few `np.frombuffer` views, whatever the shard count. The file is written atomically and
carries an xxh3 digest of its body; one that does not read back whole is ignored (the
manifest is then parsed and checked again, as on a first open).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from llm.data.shards.format import framed, verified

COUNTS = ("bytes", "raw_bytes", "tokens", "documents", "items")  # int64 columns
_MAGIC = b"llm-shard-table\n"
_VERSION = 1


@dataclass(frozen=True)
class ShardInfo:
    """One shard file. `tokens` counts tokens (kind tokens) and `items` items (kind items)."""

    file: str
    bytes: int
    checksum: str  # "xxh3_64:<hex>" of the file as stored (compressed bytes when compressed)
    documents: int = 0
    tokens: int = 0
    items: int = 0
    dtype: str | None = None  # token dtype of this shard (a run may widen uint16 to uint32)
    compression: str | None = None
    raw_bytes: int = 0  # size before compression; equals `bytes` when uncompressed


class ShardTable(Sequence):
    """Every shard's manifest entry, column by column; `table[i]` is shard i's `ShardInfo` (made on first use)."""

    def __init__(self, counts: dict[str, np.ndarray], files: tuple[bytes | np.ndarray, np.ndarray],
                 checksums: tuple[bytes | np.ndarray, np.ndarray],
                 dtypes: tuple[list, np.ndarray], compressions: tuple[list, np.ndarray]):
        self.counts = counts  # name -> int64 array, one value per shard
        self._files, self._checksums = files, checksums  # (utf-8 blob, int64 end offsets)
        self._dtypes, self._compressions = dtypes, compressions  # (distinct values, uint8 code per shard)
        self._infos: dict[int, ShardInfo] = {}  # ShardInfo of the shards touched so far
        self._distinct: dict[str, list] = {}

    def __len__(self) -> int:
        return len(self.counts["bytes"])

    def __getitem__(self, i: int) -> ShardInfo:  # type: ignore[override]
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"a ShardTable is indexed by shard number, got {i!r}; use list(table) for slices")
        i = int(i)
        info = self._infos.get(i)
        if info is None:
            if not -len(self) <= i < len(self):
                raise IndexError(f"shard {i} of {len(self)}")
            info = self._infos[i % len(self)] = self._build(i % len(self))
        return info

    def __iter__(self) -> Iterator[ShardInfo]:
        return (self[i] for i in range(len(self)))

    def _build(self, i: int) -> ShardInfo:
        values = {name: int(column[i]) for name, column in self.counts.items()}
        return ShardInfo(file=_string(self._files, i), checksum=_string(self._checksums, i),
                         dtype=self._dtypes[0][self._dtypes[1][i]],
                         compression=self._compressions[0][self._compressions[1][i]], **values)

    def column(self, name: str) -> np.ndarray:
        """One count of every shard (`bytes`, `raw_bytes`, `tokens`, `documents`, `items`) as int64."""
        return self.counts[name]

    def distinct(self, key: str) -> list:
        """The distinct values of `dtype` or `compression` among the shards (codes are given in first-seen order)."""
        found = self._distinct.get(key)
        if found is None:  # asked several times while a dataset opens: one pass over 10^5 codes
            values, codes = self._dtypes if key == "dtype" else self._compressions
            present = np.bincount(codes, minlength=len(values))  # not np.unique: it imports numpy.ma (~30 ms)
            found = self._distinct[key] = [values[c] for c in np.flatnonzero(present).tolist()]
        return list(found)

    @classmethod
    def from_infos(cls, infos: Sequence[ShardInfo]) -> ShardTable:
        """The table of a list of `ShardInfo` (a manifest built in memory or parsed from JSON)."""
        counts = {name: np.array([getattr(s, name) for s in infos], dtype=np.int64).reshape(-1) for name in COUNTS}
        return cls(counts, _strings([s.file for s in infos]), _strings([s.checksum for s in infos]),
                   _codes([s.dtype for s in infos]), _codes([s.compression for s in infos]))

    @classmethod
    def from_columns(cls, columns: dict[str, list]) -> ShardTable:
        """The table of checked manifest entries given key by key (validate.shard_columns), no `ShardInfo` made."""
        counts = {name: np.asarray(columns[name], dtype=np.int64).reshape(-1) for name in COUNTS}
        return cls(counts, _strings(columns["file"]), _strings(columns["checksum"]),
                   _codes(columns["dtype"]), _codes(columns["compression"]))

    def __getstate__(self) -> dict:
        return dict(self.__dict__, _infos={}, _distinct={})  # workers build the entries they touch

    # ---- the remembered copy ----------------------------------------------------------------

    def to_bytes(self, meta: dict) -> bytes:
        """This table and `meta` (JSON values: the manifest's other fields) as one self-checking file."""
        parts = [self.counts[name] for name in COUNTS] + [self._files[1], self._checksums[1]]
        parts += [self._dtypes[1], self._compressions[1]]
        body = b"".join(memoryview(np.ascontiguousarray(p)).tobytes() for p in parts + [self._files[0], self._checksums[0]])
        header = {"version": _VERSION, "shards": len(self), "meta": meta, "dtypes": self._dtypes[0],
                  "compressions": self._compressions[0], "files_bytes": len(self._files[0]),
                  "checksums_bytes": len(self._checksums[0]), "digest": xxhash.xxh3_64_hexdigest(body)}
        return framed.frame(_MAGIC, header) + body

    @classmethod
    def from_bytes(cls, raw: bytes | mmap.mmap) -> tuple[ShardTable, dict] | None:
        """(table, meta) of `to_bytes`'s output; None for anything else (torn, foreign, another version).

        The columns are views of `raw` (a memory map stays mapped while the table lives)."""
        found = framed.unframe(raw, _MAGIC)
        if found is None:
            return None
        header, at = found
        try:
            body = memoryview(raw)[at:]
            if header.get("version") != _VERSION or xxhash.xxh3_64_hexdigest(body) != header.get("digest"):
                return None
            n = header["shards"]
            sizes = [8 * n] * len(COUNTS) + [8 * (n + 1)] * 2 + [n, n, header["files_bytes"], header["checksums_bytes"]]
            if sum(sizes) != len(body):
                return None
            views, offset = [], 0
            for size in sizes:
                views.append(body[offset : offset + size])
                offset += size
            counts = {name: np.frombuffer(views[k], np.int64) for k, name in enumerate(COUNTS)}
            k = len(COUNTS)
            files = (np.frombuffer(views[k + 4], np.uint8), np.frombuffer(views[k], np.int64))
            checksums = (np.frombuffer(views[k + 5], np.uint8), np.frombuffer(views[k + 1], np.int64))
            dtypes = (header["dtypes"], np.frombuffer(views[k + 2], np.uint8))
            compressions = (header["compressions"], np.frombuffer(views[k + 3], np.uint8))
            for values, codes in (dtypes, compressions):
                if len(codes) and int(codes.max()) >= len(values):
                    return None
            return cls(counts, files, checksums, dtypes, compressions), header["meta"]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None


def _strings(values: list[str]) -> tuple[bytes | np.ndarray, np.ndarray]:
    blob = "".join(values).encode("utf-8", "surrogatepass")
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    if len(blob) == int(lengths.sum()):  # ASCII (file names, checksums): characters are bytes
        return blob, np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths, dtype=np.int64)])
    encoded = [v.encode("utf-8", "surrogatepass") for v in values]
    ends = np.concatenate([[0], np.cumsum([len(e) for e in encoded], dtype=np.int64)]).astype(np.int64)
    return b"".join(encoded), ends


def _string(column: tuple[bytes | np.ndarray, np.ndarray], i: int) -> str:
    blob, ends = column  # blob: bytes, or uint8 views of a remembered table
    return bytes(blob[int(ends[i]) : int(ends[i + 1])]).decode("utf-8", "surrogatepass")


def _codes(values: list) -> tuple[list, np.ndarray]:
    distinct = list(dict.fromkeys(values))
    if len(distinct) > 255:
        raise ValueError(f"{len(distinct)} distinct values do not fit a one-byte code")
    if len(distinct) == 1:  # the usual case: one dtype, one compression for every shard
        return distinct, np.zeros(len(values), dtype=np.uint8)
    lookup = {v: k for k, v in enumerate(distinct)}
    return distinct, np.array([lookup[v] for v in values], dtype=np.uint8)


# ---- where remembered tables live -----------------------------------------------------------


def _table_path(digest: str) -> Path:
    return verified.manifests_folder() / f"{digest}.table"


def recall(digest: str) -> tuple[ShardTable, dict] | None:
    """The table and meta of the manifest whose index.json bytes have the digest `digest`, if they
    passed every cross-check on this machine before (and the remembered file reads back whole)."""
    if not verified.enabled():
        return None
    # Mapped, not read: its pages are the page cache's, not copied into this process (framed.py:
    # a table is only ever replaced whole, so the mapped file keeps its bytes).
    raw = framed.mapped(_table_path(digest))
    return None if raw is None else ShardTable.from_bytes(raw)


def remember(digest: str, table: ShardTable, meta: dict) -> None:
    """Keep the table (and `meta`) of a manifest that just passed every cross-check (atomic, best effort)."""
    if not verified.enabled():
        return
    try:
        framed.replace(_table_path(digest), [table.to_bytes(meta)])  # a full disk: parsed again next time
    except (ValueError, TypeError):  # a field JSON cannot write: parsed again next time
        pass
