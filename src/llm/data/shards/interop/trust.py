"""A peer's index held to our trust rule: every count it states is cross-checked against the files.

LitData chunks and MDS shards share one layout: `count: uint32`, `offsets: uint32[count + 1]`
(absolute byte offsets in the uncompressed file), then the items. So both formats' indexes
are checked the same way before anything is served: each file listed once, every count a
non-negative integer, each file's size, and the offsets table against the index (first
entry right after the table, never decreasing, last entry at the end of the items).
A lie is one sentence naming the file and the index field; nothing is guessed.
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.format.pread import ShardError
from llm.data.shards.format.validate import ManifestError

FIX = "the index does not describe the file; restore the folder's index.json or write the folder again with its writer"


def count_field(where: Path, entry: str, field: str, value: Any) -> int:
    """`value` as a non-negative integer count, or a ManifestError naming the entry and field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestError(f"{where}: {entry} has {field} {value!r}, expected a non-negative integer; {FIX}")
    return value


def unique_files(where: Path, names: list[str], label: str) -> None:
    """Each file listed once: a file listed twice would be served twice."""
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first:
            raise ManifestError(f"{where}: {label} {i} lists the file {name!r} again (already {label} {first[name]}), "
                                "so its items would be served twice; restore the folder's index.json or write the "
                                "folder again with its writer")
        first[name] = i


def check_size(path: Path, expected: int, field: str, where: Path) -> None:
    """The file is there with the size its index entry states."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise ShardError(f"shard {path} is missing (listed in {where}); restore it or write the folder again") from None
    if size != expected:
        raise ShardError(f"shard {path} has {size} bytes but {where} says {field} {expected}: {FIX}")


def read_header(path: Path, compressed: bool, raw_size: int) -> np.ndarray:
    """A chunk's offsets table (int64, count + 1 entries), checked to fit in its `raw_size` bytes.

    Only the header is read (one open; a zstd file is decompressed as far as the table).
    """
    with open(path, "rb") as f:
        stream: Any = f
        if compressed:
            import zstandard

            stream = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        try:
            head = stream.read(4)
            count = int.from_bytes(head, "little") if len(head) == 4 else -1
            if count < 0 or 4 * (count + 2) > raw_size:
                raise ShardError(f"shard {path} starts with an item count {count} whose offsets table does not fit "
                                 f"in its {raw_size} bytes: the file is corrupt or not this format")
            table = stream.read(4 * (count + 1))
        except ShardError:
            raise
        except Exception as e:  # zstandard.ZstdError: a corrupt compressed file
            raise ShardError(f"shard {path} does not decompress ({e}): the file is corrupt") from None
    if len(table) != 4 * (count + 1):
        raise ShardError(f"shard {path} ends inside its offsets table: the file is truncated")
    return np.frombuffer(table, "<u4").astype(np.int64)


def check_offsets(path: Path, offsets: np.ndarray, expected: int, count_name: str, end: int | None,
                  end_name: str, where: Path, header_extra: bool = False) -> None:
    """The offsets table against the index: its count, its first entry, order, and its end (when known).

    `header_extra`: the format may put more header after the table (MDS: its shard's JSON config).
    """
    count = len(offsets) - 1
    if count != expected:
        raise ShardError(f"shard {path} holds {count} items but {where} says {count_name} {expected}: {FIX}")
    first = int(offsets[0])
    if first < 4 * (count + 2) or (first != 4 * (count + 2) and not header_extra):
        raise ShardError(f"shard {path} has its first item at byte {int(offsets[0])}, not right after its offsets "
                         f"table (byte {4 * (count + 2)}): the file is corrupt")
    if end is not None and int(offsets.max()) > end:
        bad = int(np.argmax(offsets > end))
        raise ShardError(f"shard {path} has item {bad} at byte {int(offsets[bad])}, past the end of its items at "
                         f"byte {end} ({end_name} in {where}): the file is corrupt or the index does not describe it")
    steps = np.diff(offsets)
    if len(steps) and int(steps.min()) < 0:
        bad = int(np.argmax(steps < 0)) + 1
        raise ShardError(f"shard {path} has item {bad} at byte {int(offsets[bad])}, before item {bad - 1} at byte "
                         f"{int(offsets[bad - 1])} (offsets must not decrease): the file is corrupt")
    if end is not None and int(offsets[-1]) != end:
        raise ShardError(f"shard {path} has its items end at byte {int(offsets[-1])} but {where} says {end_name} "
                         f"{end}: {FIX}")


def check_item_span(path: Path, item: int, used: int, span: int) -> None:
    """An item's column / leaf sizes add up to the bytes its offsets give it."""
    if used != span:
        raise ShardError(f"shard {path} item {item}: its field sizes add up to {used} bytes but its offsets give it "
                         f"{span}: the file or its index's column list is corrupt")


# What decoding a lying item raises (a changed encoding, a corrupt file): turned into one sentence.
DECODE_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, IndexError, EOFError, OSError, OverflowError,
                                                  KeyError, AttributeError, RuntimeError, struct.error,
                                                  pickle.UnpicklingError)


def decode_error(path: Path, item: int, what: str, error: BaseException) -> ShardError:
    """The sentence for an item that does not decode as its index says."""
    return ShardError(f"shard {path} item {item}: {what} does not decode ({type(error).__name__}: {error}); "
                      "the file or its index's encoding is wrong")
