"""The ledger's on-disk format: one self-checking segment file per commit and rank, plus the run header.

A run's ledger is a folder:

* `ledger.json`: `{version, run, checksum, sources}`, written once by the first run (rank 0); `checksum`
  names the rule of the rows' checksums (version 1 headers have none: theirs was "xxh3-int64"; version 2
  wrote "wsum32", version 3 "wword64"). `run` is a random id that every segment repeats, so a segment copied
  in from another run is named; `sources` lists each source's name and fingerprint (and for token shards its
  path, sample count, so `audit` knows what a complete epoch is, and since version 3 `checksum_dtype`, the
  dtype its shards store the ids in, which rule "wword64" checksums).
* `r{rank:05d}-g{generation:04d}-{first_step:012d}-{last_step:012d}.seg`: the steps one rank
  trained between two checkpoints, written when the checkpoint is committed (see writer.py).

A segment is `MAGIC2`, a little-endian u32 header length, a JSON header (run, rank,
generation, steps, topology, the segment's `names` table, the `skipped` steps: read but not
trained, `data.skip_batches`; `checksum`, the rule its rows' checksums follow; `columns`, how each
column is stored: `encode_segment`), the zstd-compressed column data, and a trailer of the payload's
length and xxh3-64 digest. A truncated or damaged segment fails its trailer check, so it is named, never
half read. Segments of the first layout (`MAGIC`, every column whole: ledger versions 1 and 2) are still read.

Rows are the samples of a batch, pieces the documents (or token blocks) a row holds:

* `ROW`: `step`, `row` (position in this rank's batch), `crc` (a 32-bit checksum of the row's token ids,
  by the rule the header names: `row_checksums`; versions 2 and 1 used `row_checksums_v2`, `row_checksums_v1`),
  `loss` (NaN when not recorded).
* `PIECE`: `row_ref` (index into the segment's rows), `source`, `epoch`, `name` (index into
  the segment's names table: a file or object; -1 for a shard sample), `item` (sample index
  for shards, record number for text), `start`, `end` (the token range of the document that
  the row holds; for a shard block, 0 and the block size).

Why this shape: most columns are one value (source, epoch, name, start, end, the loss when none is
recorded), a range (row_ref) or runs (a step and a row's place in it), stored as such; what is left,
the checksums and the ids (as differences, in the narrowest integer type that holds them), goes to zstd.
A sample costs its checksum plus a few bytes (bench/ledger.py measures it), and a segment is one atomic
file, committed with the checkpoint exactly like the cursor.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
import zstandard

VERSION = 3  # 3: `row_checksums` over the ids as stored; 2: `row_checksums_v2`; 1: `row_checksums_v1`
READS = (1, 2, 3)
MAGIC = b"LLMLEDG1"  # the first segment layout (ledger versions 1 and 2): read, no longer written
MAGIC2 = b"LLMLEDG2"  # columns stored by codec (encode_segment), since ledger version 3
HEADER_NAME = "ledger.json"
SEGMENT_SUFFIX = ".seg"

ROW = np.dtype([("step", "<u8"), ("row", "<u4"), ("crc", "<u4"), ("loss", "<f4")])
PIECE = np.dtype([("row_ref", "<u4"), ("source", "<u2"), ("epoch", "<u4"), ("name", "<i4"),
                  ("item", "<u8"), ("start", "<u4"), ("end", "<u4")])
_TRAILER = struct.Struct("<QQ")  # payload length, xxh3-64 of the payload


class LedgerError(ValueError):
    """A ledger that cannot be read or does not belong here; the message names the file."""


def segment_name(rank: int, generation: int, first_step: int, last_step: int) -> str:
    return f"r{rank:05d}-g{generation:04d}-{first_step:012d}-{last_step:012d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, int, int, int] | None:
    """(rank, generation, first_step, last_step) of a segment file name, None for other files."""
    if not (name.startswith("r") and name.endswith(SEGMENT_SUFFIX)):
        return None
    parts = name[1:-len(SEGMENT_SUFFIX)].split("-")
    if len(parts) != 4 or not parts[1].startswith("g"):
        return None
    try:
        return int(parts[0]), int(parts[1][1:]), int(parts[2]), int(parts[3])
    except ValueError:
        return None


@dataclass
class Segment:
    """One decoded segment: its header and its row and piece tables."""

    header: dict[str, Any]
    rows: np.ndarray  # ROW
    pieces: np.ndarray  # PIECE

    @property
    def names(self) -> list[str]:
        return list(self.header.get("names", []))


class Runs:
    """A column given as runs: `values[k]` repeated `lengths[k]` times (the rows' steps: one run per batch)."""

    def __init__(self, values: np.ndarray, lengths: np.ndarray):
        self.values, self.lengths = np.asarray(values), np.asarray(lengths, np.int64)

    def array(self, dtype: np.dtype) -> np.ndarray:
        return np.repeat(self.values.astype(dtype), self.lengths)


class RunIndex:
    """A column that counts 0, 1, ... within each run of the column `of` (a row's position in its batch); the runs
    hold distinct values one after the other (steps only go forward), which is how a reader finds them again."""

    def __init__(self, of: str):
        self.of = of


class Columns:
    """A ROW or PIECE table held column by column, each an array, one value for every row (a Python or NumPy
    scalar), `Runs`, `RunIndex`, or `range(start, start + n)` (a piece's row_ref): what the loader knows of its
    rows without building them, and what `encode_segment` stores without looking at (bench/ledger.py).
    `table[name]` and `materialize()` give the plain arrays."""

    def __init__(self, dtype: np.dtype, n: int, columns: dict[str, Any]):
        self.dtype, self.n, self.columns = dtype, n, columns

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> np.ndarray:
        c, dtype = self.columns[name], self.dtype[name]
        if isinstance(c, Runs):
            return c.array(dtype)
        if isinstance(c, RunIndex):
            lengths = self.columns[c.of].lengths
            return (np.arange(self.n) - np.repeat(np.cumsum(lengths) - lengths, lengths)).astype(dtype)
        if isinstance(c, range):
            return np.arange(c.start, c.start + self.n, dtype=dtype)
        if np.ndim(c) == 0:
            return np.full(self.n, c, dtype)
        return np.asarray(c, dtype)

    def __setitem__(self, name: str, value: Any) -> None:
        self.columns[name] = value

    def materialize(self) -> np.ndarray:
        out = np.empty(self.n, self.dtype)
        for name in self.dtype.names:
            out[name] = self[name]
        return out


def as_table(table: Any, dtype: np.dtype) -> np.ndarray:
    """A table (structured array or `Columns`) as a structured array of `dtype`."""
    return table.materialize() if isinstance(table, Columns) else np.asarray(table, dtype)


# columns stored as differences from the previous row (wrapping modulo 2**64): sorted or shuffled ids, steps
_DELTA = frozenset({"step", "row_ref", "item"})
_NARROW = [np.dtype(t) for t in ("<u1", "<i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8")]


def _delta(items: np.ndarray) -> np.ndarray:
    items = np.asarray(items)
    items = items.view(np.uint64) if items.dtype.kind in "iu" and items.dtype.itemsize == 8 else items.astype(np.uint64)
    out = np.empty(len(items), np.uint64)
    out[:1] = items[:1]
    np.subtract(items[1:], items[:-1], out=out[1:])  # wraps modulo 2**64 and back: exact for any order
    return out


def _undelta(deltas: np.ndarray) -> np.ndarray:
    return np.cumsum(deltas, dtype=np.uint64)


def _narrowest(values: np.ndarray) -> tuple[Any, np.ndarray | None]:
    """("const", value) when every value is one, else (the narrowest dtype that holds them, the values in it)."""
    if values.dtype.kind == "f":
        if np.isnan(values).all():
            return None, None  # every value NaN (JSON holds no NaN as a plain number)
        return np.dtype("<f4"), np.ascontiguousarray(values, "<f4")
    if not values.size:
        return 0, None
    lo, hi = values.min(), values.max()
    if lo == hi:
        return int(lo), None
    for t in _NARROW:
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return t, values.astype(t)
    raise AssertionError("unreachable: every integer fits int64 or uint64")


def _encode_column(name: str, c: Any, dtype: np.dtype, blobs: list[Any]) -> list[Any]:
    """One column's spec for the segment header (its blobs appended to `blobs`)."""
    if isinstance(c, Runs):
        values, lengths = _narrowest(_delta(c.values).view(np.int64)), _narrowest(c.lengths)
        spec: list[Any] = ["runs", len(c.lengths)]
        for kind, arr in (values, lengths):
            spec.append(kind if arr is None else kind.str)
            if arr is not None:
                blobs.append(arr)
        return spec
    if isinstance(c, RunIndex):
        return ["runindex", c.of]
    if isinstance(c, range):
        return ["range", c.start]
    if np.ndim(c) == 0:
        value = np.asarray(c, dtype)
        return ["nan"] if dtype.kind == "f" and np.isnan(value) else ["const", value.item()]
    values = np.asarray(c)
    delta = name in _DELTA and len(values) > 1
    kind, arr = _narrowest(_delta(values).view(np.int64) if delta else values)
    if arr is None:
        return ["nan"] if kind is None else (["const", kind, "delta"] if delta else ["const", kind])
    blobs.append(arr)
    return ["raw", kind.str, "delta"] if delta else ["raw", kind.str]


def _decode_column(spec: list[Any], n: int, dtype: np.dtype, raw: memoryview, at: int, table: np.ndarray
                   ) -> tuple[np.ndarray, int]:
    def take(t: str, count: int) -> np.ndarray:
        nonlocal at
        out = np.frombuffer(raw, dtype=np.dtype(t), count=count, offset=at)
        at += count * np.dtype(t).itemsize
        return out
    kind = spec[0]
    if kind == "runs":
        k, vt, lt = spec[1], spec[2], spec[3]
        values = np.full(k, vt, np.int64) if isinstance(vt, int) else take(vt, k).astype(np.int64)
        lengths = np.full(k, lt, np.int64) if isinstance(lt, int) else take(lt, k).astype(np.int64)
        if lengths.sum() != n or (lengths < 0).any():
            raise ValueError(f"runs of {int(lengths.sum())} rows in a table of {n}")
        return np.repeat(_undelta(values.view(np.uint64)), lengths).astype(dtype), at
    if kind == "runindex":
        of = table[spec[1]]
        starts = np.flatnonzero(np.r_[True, of[1:] != of[:-1]]) if n else np.zeros(0, np.int64)
        return (np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))).astype(dtype), at
    if kind == "range":
        return np.arange(spec[1], spec[1] + n, dtype=np.int64).astype(dtype), at
    if kind == "nan":
        return np.full(n, np.nan, dtype), at
    if kind == "const":
        values = np.full(n, spec[1], np.int64 if isinstance(spec[1], int) and spec[1] < 2**63 else np.uint64)
    elif kind == "raw":
        values = take(spec[1], n)
        values = values.astype(np.int64) if values.dtype.kind in "iu" and values.dtype != np.uint64 else values
    else:
        raise ValueError(f"column codec {kind!r}")
    if "delta" in spec[2:]:
        values = _undelta(values.view(np.uint64) if values.dtype.itemsize == 8 else values.astype(np.uint64))
    return values.astype(dtype), at


_LOCAL = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    """This thread's zstd compressor (level 1: the loader's commit is on the training path), made once: a new one
    costs more than compressing a commit's columns."""
    c = getattr(_LOCAL, "zstd", None)
    if c is None:
        c = _LOCAL.zstd = zstandard.ZstdCompressor(level=1)
    return c


def encode_segment(header: dict[str, Any], rows: Any, pieces: Any) -> bytes:
    """The bytes of one segment file (header, compressed columns, trailer); `rows` and `pieces` are structured
    arrays (ROW, PIECE) or `Columns`.

    Each column is stored the cheapest way its values allow, named in the header's `columns`: one value for all
    rows (a shard's name, start, end, the loss column when none was set), a range or runs (a piece's row, a row's
    step and its position in the batch), else its values (differences from the previous row for steps and ids)
    in the narrowest integer type that holds them. Only those reach zstd (level 1): the checksums and the ids,
    about 8 bytes a sample; zstd spent most of a commit on the other 42 bytes of regular columns."""
    blobs: list[Any] = []
    specs = {}
    for key, table, dtype in (("rows", rows, ROW), ("pieces", pieces, PIECE)):
        cols = table.columns if isinstance(table, Columns) else {f: np.asarray(table)[f] for f in dtype.names}
        specs[key] = [_encode_column(f, cols[f], dtype[f], blobs) for f in dtype.names]
    size = sum(b.nbytes for b in blobs)
    stream = _compressor().compressobj(size=size)
    body = [stream.compress(np.ascontiguousarray(b).data) for b in blobs] + [stream.flush()]
    head = json.dumps({**header, "rows": len(rows), "pieces": len(pieces), "columns": specs}, sort_keys=True).encode()
    payload = b"".join([struct.pack("<I", len(head)), head, *body])
    return MAGIC2 + payload + _TRAILER.pack(len(payload), xxhash.xxh3_64_intdigest(payload))


def decode_segment(data: bytes, where: str) -> Segment:
    """A segment from its bytes, or a LedgerError naming `where` (truncated, damaged, not a segment)."""
    if not data.startswith((MAGIC, MAGIC2)):
        raise LedgerError(f"{where} is not a ledger segment (it does not start with {MAGIC2!r} or {MAGIC!r}); remove it "
                          "from the ledger folder")
    if len(data) < len(MAGIC) + _TRAILER.size + 4:
        raise LedgerError(f"{where} is truncated ({len(data)} bytes); it was cut while written, so its steps are not counted")
    payload = data[len(MAGIC):-_TRAILER.size]
    length, digest = _TRAILER.unpack(data[-_TRAILER.size:])
    if length != len(payload) or xxhash.xxh3_64_intdigest(payload) != digest:
        raise LedgerError(f"{where} is truncated or damaged (its trailer does not match its {len(payload)} bytes); "
                          "its steps are not counted")
    (head_len,) = struct.unpack_from("<I", payload)
    header = json.loads(payload[4:4 + head_len])
    raw = zstandard.ZstdDecompressor().decompress(payload[4 + head_len:])  # the frame records its size
    n_rows, n_pieces = int(header["rows"]), int(header["pieces"])
    rows, pieces = np.empty(n_rows, ROW), np.empty(n_pieces, PIECE)
    if data.startswith(MAGIC):  # the first segment layout: every column whole, ids as differences
        at = 0
        for table, n in ((rows, n_rows), (pieces, n_pieces)):
            for f in table.dtype.names:
                size = table.dtype[f].itemsize * n
                table[f] = np.frombuffer(raw, dtype=table.dtype[f], count=n, offset=at)
                at += size
        pieces["item"] = _undelta(pieces["item"])
        return Segment(header, rows, pieces)
    at, view = 0, memoryview(raw)
    try:
        for key, table, n in (("rows", rows, n_rows), ("pieces", pieces, n_pieces)):
            for f, spec in zip(table.dtype.names, header["columns"][key], strict=True):
                table[f], at = _decode_column(spec, n, table.dtype[f], view, at, table)
    except (KeyError, TypeError, ValueError) as e:  # a header that passed its digest but that this llm cannot follow
        raise LedgerError(f"{where} has columns this llm cannot decode ({type(e).__name__}: {e}); read it with the llm "
                          "release that wrote it") from None
    return Segment(header, rows, pieces)


def read_header(folder: Path) -> dict[str, Any] | None:
    """The folder's `ledger.json` checked (None when there is none), or a LedgerError naming it."""
    path = folder / HEADER_NAME
    if not path.is_file():
        if path.exists():
            raise LedgerError(f"{path} is not a file; restore the run's ledger header or start an empty ledger folder")
        return None
    try:
        header = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise LedgerError(f"{path} is not a ledger header ({e}); restore it or start an empty ledger folder") from None
    if not isinstance(header, dict) or not isinstance(header.get("run"), str):
        raise LedgerError(f"{path} has no run id; restore it or start an empty ledger folder")
    if header.get("version") not in READS:
        raise LedgerError(f"{path} was written by ledger version {header.get('version')!r}; this llm reads "
                          f"versions {', '.join(map(str, READS))}; read it with the llm release that wrote it")
    checksum_rule(header, str(path))  # a rule this llm does not know is named now, not as mismatched rows
    sources = header.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(x, dict) for x in sources):
        raise LedgerError(f"{path} key 'sources' is {str(sources)[:60]!r}, not the list of sources the run wrote; "
                          "restore the header")
    return header


CHECKSUM = "wword64"  # the rule new ledgers record (header "checksum"); version 2: "wsum32", 1: "xxh3-int64"
_WEIGHTS = np.zeros(0, np.uint32)
_WORD_WEIGHTS = np.zeros(0, "<u8")


def _word_weights(words: int) -> np.ndarray:
    """W_j = splitmix64(j + 1) | 1 for j < words (splitmix64's finalizer over (j + 1) * golden gamma), grown once."""
    global _WORD_WEIGHTS
    w = _WORD_WEIGHTS  # one read: another thread may swap in a longer table meanwhile, never a shorter one
    if len(w) < words:
        with np.errstate(over="ignore"):
            x = np.arange(1, max(words, 2 * len(w), 64) + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
        _WORD_WEIGHTS = w = (x | np.uint64(1)).astype("<u8")
    return w[:words]


def row_checksums(tokens: Any, dtype: Any = None) -> np.ndarray:
    """The 32-bit checksum of each row's token ids as stored (rule "wword64", ledger version 3).

    The row's ids in `dtype` (the source's stored dtype, which the ledger header records per source as
    `checksum_dtype`; None: int64, what a text row holds), as little-endian bytes zero-padded to a multiple of 8,
    read as little-endian uint64 words x_j; s = sum of x_j * W_j modulo 2**64 with W_j = splitmix64(j + 1) | 1;
    the checksum is (s xor s >> 32) modulo 2**32. Ids in another dtype are cast to `dtype` first (as numpy's
    `astype` does: a value that does not fit wraps), so the audit, which reads the rows again in the loader's
    dtype, gets the checksum the reader threads took on the stored rows.

    Odd weights make any single changed token change s (a token is at most 16 bits of a word shifted by at most
    48: the change is never a multiple of 2**64), and distinct weights make a swap or a shifted run change it too;
    folded to the 32 bits kept, a change is missed with probability about 2**-32. It is not a keyed hash: it finds
    data that changed, not data forged to match. Why this rule (version 2 weighted each id, version 1 hashed each
    row with xxh3 from Python): on a uint16 shard it is one integer matrix-vector product over a quarter as many
    words as there are ids, on the rows as read, before the loader widens them (bench/ledger.py has the numbers).
    """
    rows = np.asarray(tokens)
    if rows.ndim != 2:
        rows = rows.reshape(len(rows), -1) if rows.size else rows.reshape(len(rows), 0)
    stored = np.dtype(np.int64 if dtype is None else dtype).newbyteorder("<")
    if rows.dtype != stored:
        rows = rows.astype(stored)  # values cast as numpy casts them (a narrower dtype wraps)
    rows = np.ascontiguousarray(rows)
    n, nbytes = len(rows), rows.shape[1] * stored.itemsize
    if n == 0:
        return np.zeros(0, np.uint32)
    if nbytes % 8:  # a row of a width that does not fill whole words: zero bytes after it
        padded = np.zeros((n, nbytes + 8 - nbytes % 8), np.uint8)
        padded[:, :nbytes] = rows.view(np.uint8).reshape(n, nbytes)
        rows = padded
    words = rows.view("<u8").reshape(n, rows.shape[1] * rows.dtype.itemsize // 8)
    s = words @ _word_weights(words.shape[1])  # integer matmul wraps modulo 2**64: exact in any order
    return ((s ^ (s >> np.uint64(32))) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def _weights(length: int) -> np.ndarray:
    """w_i = fmix32(i + 1) | 1 (MurmurHash3's 32-bit finalizer) for i < length, grown once and shared."""
    global _WEIGHTS
    w = _WEIGHTS  # one read: another thread may swap in a longer table meanwhile, never a shorter one
    if len(w) < length:
        x = np.arange(1, max(length, 2 * len(w)) + 1, dtype=np.uint64).astype(np.uint32)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x85EBCA6B)
        x ^= x >> np.uint32(13)
        x *= np.uint32(0xC2B2AE35)
        x ^= x >> np.uint32(16)
        _WEIGHTS = w = x | np.uint32(1)
    return w[:length]


def row_checksums_v2(tokens: Any, dtype: Any = None) -> np.ndarray:
    """Rule "wsum32" (ledger version 2): sum over the row of id_i * w_i modulo 2**32, ids taken modulo 2**32 (their
    values, whatever dtype holds them; `dtype` is not used), w_i = fmix32(i + 1) | 1. Kept so that a version 2
    ledger is still audited and resumed with its own rule."""
    rows = np.asarray(tokens)
    if rows.ndim != 2:
        rows = rows.reshape(len(rows), -1) if rows.size else rows.reshape(len(rows), 0)
    n, length = rows.shape
    out = np.empty(n, np.uint32)
    if n == 0:
        return out
    w = _weights(length)
    if rows.dtype.kind in "iu" and rows.dtype.itemsize == 8 and rows.dtype.isnative:
        # 64-bit ids: one pass, no copy; unsigned wrap-around modulo 2**64 keeps the low 32 bits exact, and a
        # negative id's two's complement is its value modulo 2**32
        return (np.ascontiguousarray(rows).view(np.uint64) @ w.astype(np.uint64)).astype(np.uint32)
    block = max(1, (1 << 16) // max(length, 1))  # 256 KB of uint32: the three passes stay in cache
    buf = np.empty((min(block, n), length), np.uint32)
    for lo in range(0, n, block):
        part = rows[lo:lo + block]
        b = buf[:len(part)]
        np.copyto(b, part, casting="unsafe")  # values modulo 2**32 (a negative int64 wraps, as documented)
        np.multiply(b, w, out=b)
        np.add.reduce(b, axis=1, out=out[lo:lo + len(part)])
    return out


def row_checksums_v1(tokens: Any, dtype: Any = None) -> np.ndarray:
    """Rule "xxh3-int64" (ledger version 1): the low half of xxh3-64 over each row's ids as little-endian int64.
    Kept so that a version 1 ledger is still audited (`dtype` is not used: the ids' values decide)."""
    rows = np.ascontiguousarray(np.asarray(tokens), dtype="<i8").reshape(len(tokens), -1)
    digest = xxhash.xxh3_64_intdigest
    return np.fromiter((digest(r) & 0xFFFFFFFF for r in rows), dtype=np.uint32, count=len(rows))


# rule name -> f(rows, dtype): the rows' checksums, dtype the source's `checksum_dtype` (used by "wword64" only)
RULES: dict[str, Callable[..., np.ndarray]] = {CHECKSUM: row_checksums, "wsum32": row_checksums_v2,
                                               "xxh3-int64": row_checksums_v1}
# the rules whose checksum depends on the dtype the ids are stored in (the header names it per source)
BY_DTYPE = frozenset({CHECKSUM})


def checksum_name(header: dict[str, Any] | None) -> str:
    """The checksum rule a ledger header names (version 1 headers name none: theirs was "xxh3-int64")."""
    if header is None:
        return CHECKSUM  # a fresh ledger: this version's rule
    return "xxh3-int64" if header.get("version") == 1 else str(header.get("checksum"))


def checksum_rule(header: dict[str, Any] | None, where: str = "the ledger header") -> Callable[..., np.ndarray]:
    """The function that computes the rows' checksums the way the ledger with this header recorded them."""
    name = checksum_name(header)
    if name not in RULES:
        version = (header or {}).get("version")
        raise LedgerError(f"{where} names checksum rule {name!r} (ledger version {version!r}); this llm knows "
                          f"{', '.join(sorted(RULES))}; read it with the llm release that wrote it")
    return RULES[name]
