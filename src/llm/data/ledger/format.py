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
column is stored: `encode_segment`), the column data as one zstd frame (compressed at `LEVEL`, or, for the shard
loader's, raw blocks: `raw_frame`), and a trailer of the payload's
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

from llm.data.ledger.checksums import (  # noqa: F401  (re-exported: the ledger's names live here)
    BY_DTYPE,
    CHECKSUM,
    RULES,
    row_checksums,
    row_checksums_v1,
    row_checksums_v2,
)
from llm.data.ledger.columns import (  # noqa: F401
    Chunks,
    Columns,
    RunIndex,
    Runs,
    _decode_column,
    _encode_column,
    _undelta,
    as_table,
)

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


_LOCAL = threading.local()
# zstd's fastest levels: what is left for zstd after the codecs is the checksums (random) and ids; shuffled ids, at
# level 1, shrank from 4 bytes to 2.7 for 5.4 ns a sample (a sixth of the loader's 1% budget), at a negative level zstd
# stores them as they are in 0.5 ns; runs of like values (a text stream's record numbers) still shrink
LEVEL = -1


def _compressor() -> zstandard.ZstdCompressor:
    """This thread's zstd compressor (the loader's commit is on the training path), made once: a new one costs more
    than compressing a commit's columns."""
    c = getattr(_LOCAL, "zstd", None)
    if c is None:
        c = _LOCAL.zstd = zstandard.ZstdCompressor(level=LEVEL)
    return c


def encode_segment(header: dict[str, Any], rows: Any, pieces: Any) -> bytes:
    """The bytes of one segment file (header, compressed columns, trailer): `segment_parts` joined."""
    return b"".join(segment_parts(header, rows, pieces))


def segment_parts(header: dict[str, Any], rows: Any, pieces: Any, compress: bool = True) -> list[Any]:
    """One segment file as the consecutive parts to write (header, compressed columns, trailer), never joined into
    one buffer; `rows` and `pieces` are structured arrays (ROW, PIECE) or `Columns`.

    Each column is stored the cheapest way its values allow, named in the header's `columns`: one value for all
    rows (a shard's name, start, end, the loss column when none was set), a range or runs (a piece's row, a row's
    step and its position in the batch), else its values (differences from the previous row for steps and ids) in the
    narrowest integer type that holds them. Only those reach zstd: the checksums and the ids, about 8 bytes a sample;
    zstd spent most of a commit on the other 42 bytes of regular columns. `compress=False` (the shard loader's
    segments: random checksums and shuffled ids, which zstd cannot shrink) frames them as zstd's raw blocks, read
    back alike, without a pass over them."""
    blobs: list[Any] = []
    specs = {}
    for key, table, dtype in (("rows", rows, ROW), ("pieces", pieces, PIECE)):
        cols = table.columns if isinstance(table, Columns) else {f: np.asarray(table)[f] for f in dtype.names}
        specs[key] = [_encode_column(f, cols[f], dtype[f], blobs) for f in dtype.names]
    blobs = [memoryview(np.ascontiguousarray(b)).cast("B") for b in blobs]
    if compress:
        stream = _compressor().compressobj(size=sum(b.nbytes for b in blobs))
        body = [stream.compress(b) for b in blobs] + [stream.flush()]
    else:
        body = raw_frame(blobs)
    head = json.dumps({**header, "rows": len(rows), "pieces": len(pieces), "columns": specs}, sort_keys=True).encode()
    parts = [struct.pack("<I", len(head)) + head, *(b for b in body if len(b))]
    digest = xxhash.xxh3_64()
    for part in parts:
        digest.update(part)
    length = sum(len(part) for part in parts)
    return [MAGIC2, *parts, _TRAILER.pack(length, digest.intdigest())]


_RAW_BLOCK = 128 << 10  # zstd's largest block


def raw_frame(blobs: list[memoryview]) -> list[Any]:
    """A zstd frame holding `blobs` (flat byte views) as raw blocks, as the format (RFC 8878) allows: its header
    (magic, single segment, an 8-byte content size), then each blob cut into blocks of at most 128 KiB, each after
    its 3-byte header (last-block bit, type 0: raw, size). Any zstd decoder reads it; nothing is copied or scanned."""
    total = sum(b.nbytes for b in blobs)
    out: list[Any] = [struct.pack("<IBQ", 0xFD2FB528, 0xE0, total)]
    blocks = [b[at:at + _RAW_BLOCK] for b in blobs if b.nbytes for at in range(0, b.nbytes, _RAW_BLOCK)] or [b""]
    for i, block in enumerate(blocks):
        size = len(block)
        header = (size << 3) | (i == len(blocks) - 1)  # bits 1-2, the block type, stay 0: raw
        out += [struct.pack("<I", header)[:3], block]
    return out


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
