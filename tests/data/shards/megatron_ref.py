"""Megatron's indexed dataset written and read from its format description alone (not from our reader).

The `.idx` (Megatron-LM megatron/core/datasets/indexed_dataset.py, `_IndexWriter` / `_IndexReader`):
the 9 bytes `MMIDIDX\\x00\\x00`, `<Q` version 1, `<B` dtype code (1 uint8, 2 int8, 3 int16, 4 int32,
5 int64, 6 float64, 7 float32, 8 uint16), `<Q` sequence count, `<Q` document count, then int32
sequence lengths, int64 sequence pointers (byte offsets into the `.bin`), int64 document indices.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

CODE_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}


def write(prefix: Path, documents: list[list[np.ndarray]], code: int) -> None:
    """Documents of sequences (Megatron's add_item per sequence, end_document per document)."""
    dtype = np.dtype(CODE_DTYPES[code])
    lengths, pointers, doc_index, offset = [], [], [0], 0
    with open(f"{prefix}.bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                f.write(np.asarray(seq, dtype=dtype).tobytes(order="C"))
                lengths.append(len(seq))
                pointers.append(offset)
                offset += len(seq) * dtype.itemsize
            doc_index.append(len(lengths))
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(np.array(lengths, dtype=np.int32).tobytes(order="C"))
        f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        f.write(np.array(doc_index, dtype=np.int64).tobytes(order="C"))


def read(prefix: Path) -> tuple[np.dtype, list[np.ndarray], list[int]]:
    """(dtype, every sequence's tokens, document indices) as Megatron's _IndexReader + IndexedDataset get them."""
    data = Path(f"{prefix}.idx").read_bytes()
    assert data[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack("<Q", data[9:17])
    assert version == 1
    (code,) = struct.unpack("<B", data[17:18])
    dtype = np.dtype(CODE_DTYPES[code])
    (seq_count,) = struct.unpack("<Q", data[18:26])
    (doc_count,) = struct.unpack("<Q", data[26:34])
    at = 34
    lengths = np.frombuffer(data, np.int32, seq_count, at)
    at += lengths.nbytes
    pointers = np.frombuffer(data, np.int64, seq_count, at)
    at += pointers.nbytes
    documents = np.frombuffer(data, np.int64, doc_count, at)
    at += documents.nbytes
    assert at == len(data), "no sequence modes: a text dataset"
    bin_data = np.memmap(f"{prefix}.bin", dtype=np.uint8, mode="r")
    seqs = [np.frombuffer(bin_data, dtype, int(n), int(p)) for n, p in zip(lengths, pointers)]
    return dtype, seqs, documents.tolist()
