"""LitData-optimized folders (`index.json` with `chunks` and `config`), read in place.

A LitData chunk file is `num_items: uint32`, `offsets: uint32[num_items + 1]` (absolute
byte offsets in the file), then the items back to back (litdata/streaming/writer.py,
`_create_chunk`). A TokensLoader item is the document's raw token bytes; a PyTreeLoader
item is `sizes: uint32[leaves]` then each leaf's bytes, decoded by its `data_format` and
re-assembled by `data_spec` (a torch pytree spec). A chunk of flat dict rows may instead
end with an Arrow IPC file and the magic `LDARW01\\0` (read with pyarrow).
A file named `*.zstd.bin` is the same bytes compressed whole with zstd.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.format.manifest import ShardInfo
from llm.data.shards.format.pread import ShardError
from llm.data.shards.format.validate import ManifestError
from llm.data.shards.interop.base import (
    ForeignItemReader,
    ForeignManifest,
    ForeignShardBytes,
    ForeignSource,
    ForeignTokenReader,
    file_digest,
)
from llm.data.shards.interop.litdata_codecs import leaf_decoder, token_dtype, unflatten
from llm.data.shards.interop.trust import (
    DECODE_ERRORS,
    FIX,
    check_item_span,
    check_offsets,
    check_size,
    count_field,
    decode_error,
    read_header,
    unique_files,
)

ARROW_MAGIC = b"LDARW01\0"
_CONVERT = "rewrite it with `llm-data convert SRC DST` (reads through litdata itself) and stream DST"


def is_litdata_index(data: Any) -> bool:
    """A LitData index: `chunks` and `config` (ours has `format_version`, MDS has `shards`)."""
    return isinstance(data, dict) and isinstance(data.get("chunks"), list) and isinstance(data.get("config"), dict)


def _header(raw: np.ndarray) -> tuple[int, np.ndarray]:
    n = int(raw[:4].view("<u4")[0])
    return n, raw[4 : 4 * (n + 2)].view("<u4")


def _chunk_info(folder: Path, i: int, chunk: Any, kind: str, dtype: np.dtype | None) -> ShardInfo:
    """Chunk i of the index as a ShardInfo, its counts checked to be counts."""
    where = folder / "index.json"
    if not isinstance(chunk, dict):
        raise ManifestError(f"{where}: chunk {i} is {chunk!r}, not an object with filename, chunk_size and chunk_bytes")
    name = chunk.get("filename")
    if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
        raise ManifestError(f"{where}: chunk {i} has filename {name!r}")
    compressed = name.endswith(".zstd.bin")
    path = folder / name
    if compressed and not path.exists() and (folder / name.replace(".zstd.bin", ".bin")).exists():
        # LitData's own reader, given a local folder, decompresses each chunk in place.
        name, compressed = name.replace(".zstd.bin", ".bin"), False
        path = folder / name
    count = count_field(where, f"chunk {i} ({name})", "chunk_size", chunk.get("chunk_size"))
    raw_bytes = count_field(where, f"chunk {i} ({name})", "chunk_bytes", chunk.get("chunk_bytes"))
    tokens = count_field(where, f"chunk {i} ({name})", "dim", chunk.get("dim")) if kind == "tokens" else 0
    if compressed:
        if not path.is_file():
            raise ShardError(f"shard {path} is missing (listed in {where}); restore it or write the folder again")
        on_disk = path.stat().st_size
    else:
        check_size(path, raw_bytes, "chunk_bytes", where)
        on_disk = raw_bytes
    return ShardInfo(
        file=name, bytes=on_disk, checksum="", documents=count if kind == "tokens" else 0,
        tokens=tokens, items=0 if kind == "tokens" else count,
        dtype=dtype.name if dtype is not None else None, compression="zstd" if compressed else None,
        raw_bytes=raw_bytes,
    )


def _check_chunk(folder: Path, info: ShardInfo, dtype: np.dtype | None) -> None:
    """A chunk's offsets table against chunk_size, chunk_bytes and (tokens) dim."""
    where, path = folder / "index.json", folder / info.file
    offsets = read_header(path, info.compression is not None, info.raw_bytes)
    count = info.documents if dtype is not None else info.items
    arrow = dtype is None and count > 0 and int(offsets[-1]) == int(offsets[0])  # rows in an Arrow footer
    check_offsets(path, offsets, count, "chunk_size", None if arrow else info.raw_bytes, "chunk_bytes", where)
    if dtype is None:
        return
    size = int(offsets[-1] - offsets[0])
    if size != info.tokens * dtype.itemsize or np.any(np.diff(offsets) % dtype.itemsize):
        raise ShardError(f"shard {path} holds {size // dtype.itemsize} tokens of {dtype.name} but {where} says "
                         f"dim {info.tokens}: {FIX}")


class LitDataSource(ForeignSource):
    """A LitData folder: its chunks as shards, TokensLoader chunks as tokens, the rest as items."""

    def __init__(self, folder: Path, data: dict):
        config = data["config"]
        where = folder / "index.json"
        if config.get("encryption"):
            raise ManifestError(f"{where}: LitData chunks are encrypted; {_CONVERT}")
        if config.get("format") == "mds" or config.get("item_loader") not in ("TokensLoader", "PyTreeLoader"):
            raise ManifestError(f"{where}: LitData item_loader {config.get('item_loader')!r} is not read directly; {_CONVERT}")
        if config.get("compression") and config.get("compression_level") not in (None, "chunk"):
            raise ManifestError(f"{where}: LitData compression_level {config['compression_level']!r} (in-file frames); {_CONVERT}")
        self.config = config
        self.formats = list(config.get("data_format") or [])
        kind = "tokens" if config["item_loader"] == "TokensLoader" else "items"
        dtype = token_dtype(self.formats[0]) if kind == "tokens" else None
        shards = [_chunk_info(folder, i, chunk, kind, dtype) for i, chunk in enumerate(data["chunks"])]
        unique_files(where, [s.file for s in shards], "chunk")
        for info in shards:  # before anything is served: each chunk's header against its index entry
            _check_chunk(folder, info, dtype)
        manifest = ForeignManifest(
            kind=kind, shards=shards, dtype=dtype.name if dtype is not None else None,
            foreign_format="litdata", index_digest=file_digest(where),
            details={"item_loader": config["item_loader"], "data_format": self.formats},
        )
        super().__init__(manifest, folder)
        self.dtype = dtype
        self._decoders: list | None = None
        self._unflatten = None
        self._arrow: tuple[int, Any] | None = None  # (shard, table) of the last Arrow footer read

    def __getstate__(self) -> dict:
        # Decoders are closures and tables are big: worker processes rebuild them on first use.
        return {**self.__dict__, "_decoders": None, "_unflatten": None, "_arrow": None}

    def shard_files(self, verify: bool) -> ForeignShardBytes:
        return ForeignShardBytes(self.folder, self.manifest, verify)

    # ---- tokens ----------------------------------------------------------------------------

    def token_layout(self, raw: np.ndarray, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, document ends) of one TokensLoader chunk."""
        n, offsets = _header(raw)
        info = self.manifest.shards[shard]
        start = 4 * (n + 2)
        size = self.dtype.itemsize
        tokens = raw[start : start + info.tokens * size].view(self.dtype.newbyteorder("<"))
        ends = ((offsets[1:].astype(np.int64) - int(offsets[0])) // size).astype(np.uint64)
        return tokens, ends

    def token_reader(self, block_size: int, verify: bool = True) -> ForeignTokenReader:
        if self.manifest.kind != "tokens":
            return super().token_reader(block_size, verify)
        # LitData's TokensLoader: block i lies inside one chunk; each chunk's tail shorter than a
        # block is never served. Keep exactly those tokens, so our block i is their ds[i].
        counts = [s.tokens // block_size * block_size for s in self.manifest.shards]
        return ForeignTokenReader(self.manifest, self.shard_files(verify), self.token_layout, counts)

    # ---- items -----------------------------------------------------------------------------

    def decode_item(self, raw: np.ndarray, local: int, shard: int) -> Any:
        """Item `local` of chunk `shard`, as LitData's PyTreeLoader returns it."""
        path = self.folder / self.manifest.shards[shard].file
        try:
            if raw[-8:].tobytes() == ARROW_MAGIC:
                return self._arrow_row(raw, local, shard)
            return self._tree_item(raw, local, path)
        except ShardError:
            raise
        except DECODE_ERRORS as e:  # a leaf that does not decode as data_format says: the file or index lies
            raise decode_error(path, local, "its leaves", e) from None

    def _arrow_row(self, raw: np.ndarray, local: int, shard: int) -> Any:
        if self._arrow is None or self._arrow[0] != shard:
            table = self._arrow_table(raw)
            info = self.manifest.shards[shard]
            if table.num_rows != info.items:
                raise ShardError(f"shard {self.folder / info.file} holds {table.num_rows} rows but "
                                 f"{self.folder / 'index.json'} says chunk_size {info.items}: {FIX}")
            self._arrow = (shard, table)
        return self._arrow[1].slice(local, 1).to_pylist()[0]

    def _tree_item(self, raw: np.ndarray, local: int, path: Path) -> Any:
        if self._decoders is None:
            self._decoders = [leaf_decoder(f) for f in self.formats]
            self._unflatten = unflatten(self.config["data_spec"])
        _, offsets = _header(raw)
        data = raw[int(offsets[local]) : int(offsets[local + 1])].tobytes()
        k = len(self._decoders)
        sizes = struct.unpack_from(f"<{k}I", data, 0)
        check_item_span(path, local, 4 * k + sum(sizes), len(data))
        leaves, pos = [], 4 * k
        for size, decode in zip(sizes, self._decoders):
            leaves.append(decode(data[pos : pos + size]))
            pos += size
        return self._unflatten(leaves)

    @staticmethod
    def _arrow_table(raw: np.ndarray) -> Any:
        import pyarrow as pa

        size = struct.unpack_from("<I", raw[-12:-8].tobytes())[0]
        ipc = raw[len(raw) - 12 - size : len(raw) - 12].tobytes()
        reader = pa.ipc.open_file if ipc[:6] == b"ARROW1" else pa.ipc.open_stream
        return reader(pa.py_buffer(ipc)).read_all()

    def item_reader(self, verify: bool = True) -> ForeignItemReader:
        if self.manifest.kind != "items":
            return super().item_reader(verify)
        for f in self.formats:  # a format we cannot decode is refused now, not at step 10,000
            leaf_decoder(f)
        return ForeignItemReader(self.shard_files(verify), self.decode_item)

    def item_sizes(self, shard: int) -> np.ndarray:
        raw = self.shard_files(False).raw(shard)
        _, offsets = _header(raw)
        sizes = np.diff(offsets.astype(np.int64))
        return sizes // self.dtype.itemsize if self.manifest.kind == "tokens" else sizes


def open_litdata(folder: Path, data: dict | None = None) -> LitDataSource:
    """Open a LitData folder read-only (its index.json already parsed, or read here)."""
    if data is None:
        data = json.loads((folder / "index.json").read_text())
    return LitDataSource(folder, data)
