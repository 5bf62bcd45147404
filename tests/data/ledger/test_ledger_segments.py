"""The segment layout of ledger version 3 (format.py `encode_segment`): every column stored by the cheapest codec its
values allow, read back exactly, whether the writer gave whole tables or the loader's `Columns`; segments of the first
layout (versions 1 and 2) are still read; a segment whose columns this llm cannot decode is named."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import xxhash
import zstandard

from llm.data.ledger.format import (
    MAGIC,
    MAGIC2,
    PIECE,
    ROW,
    Columns,
    LedgerError,
    RunIndex,
    Runs,
    decode_segment,
    encode_segment,
    segment_parts,
)
from llm.data.skip_documents import SKIPPED

HEADER = {"run": "r", "rank": 0, "generation": 0, "first_step": 1, "last_step": 9, "names": ["a.jsonl"]}


def _tables(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Tables with every kind of column: constant, runs, shuffled, huge, negative, NaN and set losses."""
    rng = np.random.default_rng(seed)
    rows = np.zeros(n, ROW)
    rows["step"] = np.sort(rng.integers(1, 2**63, n, dtype=np.uint64) | np.uint64(2**63))  # past int64
    rows["row"] = rng.integers(0, 40, n)
    rows["crc"] = rng.integers(0, 2**32, n, dtype=np.uint32)
    rows["loss"] = np.where(rng.random(n) < 0.5, np.nan, rng.random(n)).astype(np.float32)
    pieces = np.zeros(n + 3, PIECE)
    pieces["row_ref"] = np.sort(rng.integers(0, max(n, 1), n + 3))
    pieces["source"] = rng.integers(0, 3, n + 3)
    pieces["epoch"] = 7
    pieces["name"] = np.where(rng.random(n + 3) < 0.5, -1, 0)
    pieces["item"] = rng.integers(0, 2**64, n + 3, dtype=np.uint64)  # any order, any size: differences wrap
    pieces["start"], pieces["end"] = rng.integers(0, 2**32, n + 3), SKIPPED
    return rows, pieces


@pytest.mark.parametrize(("n", "seed"), [(1000, 1), (1, 2), (0, 3)])
def test_whole_tables_read_back_exactly(n: int, seed: int) -> None:
    rows, pieces = _tables(n, seed)
    data = encode_segment(HEADER, rows, pieces)
    assert data.startswith(MAGIC2)
    seg = decode_segment(data, "seg")
    assert seg.rows.tobytes() == rows.tobytes() and seg.pieces.tobytes() == pieces.tobytes()
    assert seg.header["names"] == ["a.jsonl"] and seg.header["rows"] == n


def test_the_loaders_columns_read_back_as_the_tables_they_stand_for_and_cost_8_bytes_a_sample() -> None:
    rng = np.random.default_rng(4)
    steps, sizes = np.arange(11, 11 + 1024, dtype=np.uint64), np.full(1024, 32)
    sizes[5] = 0  # a batch left with no rows (every block skipped by id)
    n = int(sizes.sum())
    ids = rng.permutation(100_000)[:n].astype(np.int64)
    rows = Columns(ROW, n, {"step": Runs(steps, sizes), "row": RunIndex("step"),
                            "crc": rng.integers(0, 2**32, n, dtype=np.uint32), "loss": np.float32(np.nan)})
    pieces = Columns(PIECE, n, {"row_ref": range(0, n), "source": np.zeros(n, np.int64), "epoch": np.ones(n, np.int64),
                                "name": -1, "item": ids, "start": 0, "end": 256})
    whole_rows, whole_pieces = rows.materialize(), pieces.materialize()
    assert whole_rows["step"][32 * 5] == 11 + 6 and whole_rows["row"][:34].tolist() == [*range(32), 0, 1]
    assert np.isnan(whole_rows["loss"]).all() and (whole_pieces["name"] == -1).all()
    data = encode_segment(HEADER, rows, pieces)
    seg = decode_segment(data, "seg")
    assert seg.rows.tobytes() == whole_rows.tobytes() and seg.pieces.tobytes() == whole_pieces.tobytes()
    # only the checksums and the (shuffled) ids cost bytes: 4 + 4 a sample (zstd at its fastest level stores random
    # values as they are), the steps' runs, header and trailer under 0.1 more
    assert len(data) / n < 8.1, len(data) / n
    # the same tables given whole are stored alike (the codecs follow the values, not how they were given)
    assert decode_segment(encode_segment(HEADER, whole_rows, whole_pieces), "seg").pieces.tobytes() == seg.pieces.tobytes()


def _first_layout(header: dict, rows: np.ndarray, pieces: np.ndarray) -> bytes:
    """A segment as ledger versions 1 and 2 wrote it: every column whole, ids as differences, one zstd frame."""
    items = pieces["item"].copy()
    items[1:] = pieces["item"][1:] - pieces["item"][:-1]
    columns = [rows[f] for f in ROW.names] + [items if f == "item" else pieces[f] for f in PIECE.names]
    body = zstandard.ZstdCompressor(level=1).compress(b"".join(np.ascontiguousarray(c).tobytes() for c in columns))
    head = json.dumps({**header, "rows": len(rows), "pieces": len(pieces)}).encode()
    payload = struct.pack("<I", len(head)) + head + body
    return MAGIC + payload + struct.pack("<QQ", len(payload), xxhash.xxh3_64_intdigest(payload))


def test_a_segment_of_the_first_layout_is_still_read() -> None:
    rows, pieces = _tables(500, 5)
    seg = decode_segment(_first_layout(HEADER, rows, pieces), "old.seg")
    assert seg.rows.tobytes() == rows.tobytes() and seg.pieces.tobytes() == pieces.tobytes()


def test_a_segment_whose_columns_cannot_be_decoded_is_named() -> None:
    rows, pieces = _tables(10, 6)
    data = encode_segment(HEADER, rows, pieces)
    payload = data[len(MAGIC2):-16]
    (head_len,) = struct.unpack_from("<I", payload)
    head = json.loads(payload[4:4 + head_len])
    head["columns"]["pieces"][4] = ["zigzag", "<i4"]  # a codec of a later llm (its digest still matches)
    new_head = json.dumps(head).encode()
    payload = struct.pack("<I", len(new_head)) + new_head + payload[4 + head_len:]
    forged = MAGIC2 + payload + struct.pack("<QQ", len(payload), xxhash.xxh3_64_intdigest(payload))
    with pytest.raises(LedgerError, match="cannot decode .*column codec 'zigzag'"):
        decode_segment(forged, "later.seg")
    with pytest.raises(LedgerError, match="not a ledger segment"):
        decode_segment(b"LLMLEDG9" + data[8:], "other.seg")


@pytest.mark.parametrize("n", [0, 1, 70_000])  # 70,000 checksums: 280 KB, more than one 128 KiB block
def test_a_segment_framed_as_raw_blocks_reads_back_exactly(n: int) -> None:
    """The shard loader's segments skip zstd (`compress=False`: random checksums, shuffled ids): their columns framed
    as zstd raw blocks, which any zstd decoder reads, and stored byte for byte."""
    rows, pieces = _tables(n, 8)
    data = b"".join(bytes(p) for p in segment_parts(HEADER, rows, pieces, compress=False))
    seg = decode_segment(data, "raw.seg")
    assert seg.rows.tobytes() == rows.tobytes() and seg.pieces.tobytes() == pieces.tobytes()
    if n > 1:  # stored, not compressed: the checksums cost their 4 bytes a row
        assert len(data) > len(encode_segment(HEADER, rows, pieces)) and len(data) > 4 * n
    with pytest.raises(LedgerError, match="truncated or damaged"):
        decode_segment(data[:-17] + data[-16:], "cut.seg")
