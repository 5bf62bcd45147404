"""Shard writers: documents or items in, finished shard files (and their ShardInfo) out.

Token shard layout (little-endian, no header; counts live in the manifest):
    tokens[tokens]      uint16 or uint32
    doc_ends[documents] uint64, exclusive end offset of each document in this shard
Item shard layout:
    blob                item records back to back (v2: laid out by the manifest's item_layout,
                        see serializers.py and records.py; v1: one pickle each)
    offsets[items + 1]  uint64, item i is blob[offsets[i]:offsets[i+1]]
Documents never straddle two shards; blocks may (the reader joins shards).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.format import verified
from llm.data.shards.format.checksum import checksum_bytes, checksum_parts
from llm.data.shards.format.encryption import Encryption
from llm.data.shards.format.manifest import ShardInfo
from llm.data.shards.format.records import ItemCodec
from llm.data.storage.local import write_file

DEFAULT_CHUNK_BYTES = 64 << 20
_UINT16_MAX = (1 << 16) - 1
_UINT32_MAX = (1 << 32) - 1


def as_token_array(doc: object, where: str) -> np.ndarray:
    """A document from user code (numpy, torch, list) to a 1-D int64 array, with a clear error."""
    if hasattr(doc, "numpy") and hasattr(doc, "detach"):  # a torch tensor, without importing torch
        doc = doc.detach().cpu().numpy()
    try:
        arr = np.asarray(doc)
    except (ValueError, OverflowError) as e:
        raise ValueError(f"{where}: expected a 1-D integer array of token ids ({e})") from None
    if arr.dtype == object and arr.ndim == 1 and all(isinstance(v, int) for v in arr.tolist()):
        check_token_range(np.array([min(arr.tolist()), max(arr.tolist())], dtype=object), where)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or arr.size == 0):
        raise ValueError(f"{where}: expected a 1-D integer array of token ids, got shape {arr.shape} dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize <= 4:
        # uint8/16/32 ids fit every shard dtype as they are: no range scan, and no int64 copy
        # (the writer casts once, into the shard's dtype)
        return arr
    check_token_range(arr, where)
    return arr.astype(np.int64, copy=False)


def check_token_range(tokens: np.ndarray, where: str) -> None:
    """Ids must fit the widest shard dtype (uint32): a larger or negative id would wrap silently."""
    if not tokens.size:
        return
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi > _UINT32_MAX:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{where}: token id {bad} does not fit in a shard (ids must be in [0, {_UINT32_MAX}])")


def check_batch(tokens: np.ndarray, lengths: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """A DocumentBatch from user code: integer ids in range, lengths >= 0 that add up to the ids."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    if tokens.ndim != 1 or not (np.issubdtype(tokens.dtype, np.integer) or tokens.size == 0):
        raise ValueError(f"{where}: DocumentBatch.tokens must be a 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}")
    if lengths.ndim != 1 or not (np.issubdtype(lengths.dtype, np.integer) or lengths.size == 0):
        raise ValueError(f"{where}: DocumentBatch.lengths must be a 1-D integer array, got dtype {lengths.dtype}")
    check_token_range(tokens, where)
    if lengths.size and int(lengths.min()) < 0 or int(lengths.sum()) != tokens.size:
        raise ValueError(f"{where}: DocumentBatch.lengths add up to {int(lengths.sum())}, not to its {tokens.size} tokens (or one is negative)")
    return tokens.astype(np.int64, copy=False), lengths.astype(np.int64, copy=False)


def _fits_uint16(dtype: np.dtype) -> bool:
    return dtype.kind == "u" and dtype.itemsize <= 2


TAIL_MAX_BYTES = 4 << 20  # a task's last shard is handed to the driver (to be joined) only below this


def is_small(size: int, count: int, chunk_bytes: int | None, chunk_count: int | None) -> bool:
    """A last shard far below its limit (a quarter of chunk_bytes / chunk_size, and 4 MiB): worth
    joining with its neighbours rather than writing alone. Tasks are cut for parallelism, so a
    small input in many tasks would otherwise leave one tiny shard per task."""
    return (size < TAIL_MAX_BYTES and (chunk_bytes is None or size <= chunk_bytes // 4)
            and (chunk_count is None or count <= chunk_count // 4))


def _write_shard(path: Path, parts: list[bytes | memoryview], compression: str | None,
                 encryption: Encryption | None = None, few_large_parts: bool = False) -> tuple[int, int, str]:
    """Write parts to path (compressed, then encrypted, when asked); returns (stored bytes, raw bytes, checksum).

    `few_large_parts` (a token shard: ids and doc ends), stored as they are, are written and hashed
    part by part, unjoined; an item shard, a part per item, is joined: one write, not one per item."""
    if compression is None and encryption is None and few_large_parts:
        views = [memoryview(p).cast("B") for p in parts]
        write_file(path, views)
        checksum = checksum_parts(views)
        verified.remember_written(path, checksum)
        size = sum(len(v) for v in views)
        return size, size, checksum
    raw = b"".join(parts)
    data = raw
    if compression == "zstd":
        import zstandard

        data = zstandard.ZstdCompressor(level=3).compress(raw)
    elif compression is not None:
        raise ValueError(f"unknown compression {compression!r}; expected 'zstd' or none")
    if encryption is not None:  # the whole shard, as LitData's level="chunk"; the checksum is of the ciphertext
        data = encryption.encrypt(data)
    write_file(path, data)
    checksum = checksum_bytes(data)
    verified.remember_written(path, checksum)
    return len(data), len(raw), checksum


class _ShardWriter:
    """What both writers share: where shards go, how they are stored, and the entries written."""

    def __init__(self, folder: Path, prefix: str, chunk_bytes: int | None, chunk_count: int | None,
                 compression: str | None, encryption: Encryption | None):
        self.folder, self.prefix, self.compression = folder, prefix, compression
        self.encryption = encryption
        self.chunk_bytes = chunk_bytes or (None if chunk_count else DEFAULT_CHUNK_BYTES)
        self.shards: list[ShardInfo] = []

    def _write(self, parts: list[bytes | memoryview], few_large_parts: bool = False,
               **counts: Any) -> None:
        """Write the next shard and add its entry (`counts`: its documents and tokens, or items)."""
        name = f"{self.prefix}-{len(self.shards):05d}.bin"
        stored, raw, checksum = _write_shard(self.folder / name, parts, self.compression,
                                              self.encryption, few_large_parts)
        self.shards.append(ShardInfo(file=name, bytes=stored, raw_bytes=raw, checksum=checksum,
                                     compression=self.compression, **counts))


class TokenShardWriter(_ShardWriter):
    """Accumulates documents and cuts a shard when it reaches `chunk_bytes` or `chunk_tokens`."""

    def __init__(
        self,
        folder: Path,
        prefix: str,
        dtype: str = "uint16",
        chunk_bytes: int | None = None,
        chunk_tokens: int | None = None,
        compression: str | None = None,
        encryption: Encryption | None = None,
    ):
        super().__init__(folder, prefix, chunk_bytes, chunk_tokens, compression, encryption)
        self.dtype = dtype
        self.chunk_tokens = chunk_tokens
        self._pieces: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._tokens = 0

    def add(self, doc: np.ndarray) -> None:
        """Add one document (1-D int64, ids >= 0)."""
        self.add_batch(doc, np.array([doc.size], dtype=np.int64))

    def add_batch(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Add documents given as one flat id array and their lengths (the fast path)."""
        if tokens.size and self.dtype == "uint16" and not _fits_uint16(tokens.dtype) and int(tokens.max()) > _UINT16_MAX:
            self.flush()  # this and later shards widen; earlier ones stay compact
            self.dtype = "uint32"
        while lengths.size:
            # Take the documents that fit in this shard (at least one, so a huge document stands alone).
            ends = np.cumsum(lengths)
            fit = int(np.searchsorted(ends, self._room(), side="right"))
            take = max(fit, 1 if self._tokens == 0 else 0)
            if take:
                cut = int(ends[take - 1])
                self._pieces.append(tokens[:cut])
                self._lengths.append(lengths[:take])
                self._tokens += cut
                tokens, lengths = tokens[cut:], lengths[take:]
            if lengths.size or self._room() <= 0:
                self.flush()

    def _room(self) -> int:
        """Tokens that still fit in the current shard."""
        limits = []
        if self.chunk_tokens is not None:
            limits.append(self.chunk_tokens)
        if self.chunk_bytes is not None:
            limits.append(self.chunk_bytes // (2 if self.dtype == "uint16" else 4))
        return min(limits) - self._tokens

    def small_tail(self) -> tuple[np.ndarray, np.ndarray] | None:
        """What is buffered (ids, lengths), taken out unwritten if it is far below a shard (see `is_small`)."""
        if not self._lengths or not is_small(self._tokens * np.dtype(self.dtype).itemsize, self._tokens, self.chunk_bytes, self.chunk_tokens):
            return None
        tail = np.concatenate(self._pieces), np.concatenate(self._lengths)
        self._pieces, self._lengths, self._tokens = [], [], 0
        return tail

    def flush(self) -> None:
        """Write what is buffered as one shard."""
        if not self._lengths:
            return
        # one pass: the pieces (int64 or the caller's unsigned ids, all in range) straight into the
        # shard's little-endian dtype
        tokens = np.concatenate(self._pieces, dtype=np.dtype(self.dtype).newbyteorder("<"), casting="unsafe")
        lengths = np.concatenate(self._lengths)
        doc_ends = np.cumsum(lengths, dtype=np.uint64)
        self._write([tokens.data, doc_ends.astype("<u8", copy=False).data], few_large_parts=True,
                    documents=int(lengths.size), tokens=int(tokens.size), dtype=self.dtype)
        self._pieces, self._lengths, self._tokens = [], [], 0


class ItemShardWriter(_ShardWriter):
    """Items of any type (nested dicts/lists/tuples of numbers, strings, arrays, tensors, images...)
    into item shards: the first item fixes the layout, every item is one record of it."""

    def __init__(
        self,
        folder: Path,
        prefix: str,
        chunk_bytes: int | None = None,
        chunk_items: int | None = None,
        compression: str | None = None,
        encryption: Encryption | None = None,
    ):
        super().__init__(folder, prefix, chunk_bytes, chunk_items, compression, encryption)
        self.chunk_items = chunk_items
        self._blobs: list[bytes] = []
        self._size = 0
        self.codec: ItemCodec | None = None

    @property
    def layout(self) -> Any:
        """The layout of this writer's items (None before the first item)."""
        return None if self.codec is None else self.codec.layout

    def add(self, item: object) -> None:
        """Add one item; StructureError (naming the field) when it does not match the first item."""
        if self.codec is None:
            self.codec = ItemCodec.for_item(item)
        self.add_record(self.codec.encode(item))

    def add_record(self, blob: bytes) -> None:
        """Add one item already encoded (a record of this dataset's layout)."""
        self._blobs.append(blob)
        self._size += len(blob)
        if (self.chunk_items and len(self._blobs) >= self.chunk_items) or (
            self.chunk_bytes and self._size >= self.chunk_bytes
        ):
            self.flush()

    def small_tail(self) -> list[bytes] | None:
        """The buffered records, taken out unwritten if they are far below a shard (see `is_small`)."""
        if not self._blobs or not is_small(self._size, len(self._blobs), self.chunk_bytes, self.chunk_items):
            return None
        tail, self._blobs, self._size = self._blobs, [], 0
        return tail

    def flush(self) -> None:
        if not self._blobs:
            return
        offsets = np.zeros(len(self._blobs) + 1, dtype="<u8")
        np.cumsum([len(b) for b in self._blobs], out=offsets[1:])
        self._write([*self._blobs, offsets.data], items=len(self._blobs))
        self._blobs, self._size = [], 0
