"""The ledger's on-disk format: one self-checking segment file per commit and rank, plus the run header.

A run's ledger is a folder:

* `ledger.json`: `{version, run, sources}`, written once by the first run (rank 0). `run` is a
  random id that every segment repeats, so a segment copied in from another run is named;
  `sources` lists each source's name and fingerprint (and for token shards its path and
  sample count, so `audit` knows what a complete epoch is).
* `r{rank:05d}-g{generation:04d}-{first_step:012d}-{last_step:012d}.seg`: the steps one rank
  trained between two checkpoints, written when the checkpoint is committed (see writer.py).

A segment is `MAGIC`, a little-endian u32 header length, a JSON header (run, rank,
generation, steps, topology, the segment's `names` table, the `skipped` steps: read but not
trained, `data.skip_batches`), the zstd-compressed row and
piece tables, and a trailer of the payload's length and xxh3-64 digest. A truncated or
damaged segment fails its trailer check, so it is named, never half read.

Rows are the samples of a batch, pieces the documents (or token blocks) a row holds:

* `ROW`: `step`, `row` (position in this rank's batch), `crc` (a 32-bit checksum of the row's token ids:
  the low half of xxh3-64, `row_crcs` in shards/read/ledger.py; over the ids
  as little-endian int64), `loss` (NaN when not recorded).
* `PIECE`: `row_ref` (index into the segment's rows), `source`, `epoch`, `name` (index into
  the segment's names table: a file or object; -1 for a shard sample), `item` (sample index
  for shards, record number for text), `start`, `end` (the token range of the document that
  the row holds; for a shard block, 0 and the block size).

Why this shape: runs of consecutive ids and repeated columns (step, source, epoch) compress
to almost nothing under zstd once `item` is delta-coded, so a sample costs its checksum plus
a few bytes (bench/ measures it), and a segment is one atomic file, committed with the
checkpoint exactly like the cursor.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
import zstandard

VERSION = 1
MAGIC = b"LLMLEDG1"
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


def _delta(items: np.ndarray) -> np.ndarray:
    out = items.copy()
    out[1:] = items[1:] - items[:-1]  # wraps modulo 2**64 and back: exact for any order
    return out


def _undelta(deltas: np.ndarray) -> np.ndarray:
    return np.cumsum(deltas, dtype=np.uint64)


def encode_segment(header: dict[str, Any], rows: np.ndarray, pieces: np.ndarray) -> bytes:
    """The bytes of one segment file (header, compressed tables, trailer)."""
    rows, pieces = np.ascontiguousarray(rows, ROW), np.ascontiguousarray(pieces, PIECE).copy()
    pieces["item"] = _delta(pieces["item"])
    # column-major: each column's runs sit together, which is what makes them compress
    columns = [rows[f].tobytes() for f in ROW.names] + [pieces[f].tobytes() for f in PIECE.names]
    head = json.dumps({**header, "rows": len(rows), "pieces": len(pieces)}, sort_keys=True).encode()
    payload = struct.pack("<I", len(head)) + head + zstandard.ZstdCompressor(level=3).compress(b"".join(columns))
    return MAGIC + payload + _TRAILER.pack(len(payload), xxhash.xxh3_64_intdigest(payload))


def decode_segment(data: bytes, where: str) -> Segment:
    """A segment from its bytes, or a LedgerError naming `where` (truncated, damaged, not a segment)."""
    if not data.startswith(MAGIC):
        raise LedgerError(f"{where} is not a ledger segment (it does not start with {MAGIC!r}); remove it from the ledger folder")
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
    at = 0
    for table, n in ((rows, n_rows), (pieces, n_pieces)):
        for f in table.dtype.names:
            size = table.dtype[f].itemsize * n
            table[f] = np.frombuffer(raw, dtype=table.dtype[f], count=n, offset=at)
            at += size
    pieces["item"] = _undelta(pieces["item"])
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
    if header.get("version") != VERSION:
        raise LedgerError(f"{path} was written by ledger version {header.get('version')!r}; this llm reads "
                          f"version {VERSION}; read it with the llm release that wrote it")
    sources = header.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(x, dict) for x in sources):
        raise LedgerError(f"{path} key 'sources' is {str(sources)[:60]!r}, not the list of sources the run wrote; "
                          "restore the header")
    return header


def row_checksums(tokens: Any) -> np.ndarray:
    """The 32-bit checksum of each row's token ids that every ledger records: the low half of xxh3-64 over
    them as little-endian int64 (the same whatever dtype the data stores). xxh3, not crc32: the shard
    loader only copies memory, and crc32 alone cost half as much again as that copy (bench/ledger.py)."""
    rows = np.ascontiguousarray(np.asarray(tokens), dtype="<i8").reshape(len(tokens), -1)
    digest = xxhash.xxh3_64_intdigest
    return np.fromiter((digest(r) & 0xFFFFFFFF for r in rows), dtype=np.uint32, count=len(rows))
