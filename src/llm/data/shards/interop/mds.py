"""MosaicML Streaming MDS folders (`index.json` with `shards`, format `mds`), read in place.

An MDS shard is `num_samples: uint32`, `offsets: uint32[num_samples + 1]` (absolute byte
offsets), then the samples; a sample is one `uint32` size per column without a fixed size,
then each column's bytes, decoded by its encoding (streaming/base/format/mds/encodings.py).
With `compression: zstd` only the `zip_data` file may be on disk: it is decompressed whole.
Their `hashes` (sha1, xxh64, ...) are checked the first time a shard is opened.
"""

from __future__ import annotations

import decimal
import hashlib
import io
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.format.manifest import ShardInfo
from llm.data.shards.format.pread import ShardError
from llm.data.shards.format.validate import ManifestError
from llm.data.shards.interop import base, trust

_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}
_VALUE_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32",
                 33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_SCALARS = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32", "float64")


def is_mds_index(data: Any) -> bool:
    """An MDS index: `version: 2` and `shards` entries with `raw_data` (ours has `format_version`)."""
    shards = data.get("shards") if isinstance(data, dict) else None
    return (isinstance(shards, list) and "format_version" not in data and data.get("version") == 2
            and all(isinstance(s, dict) and "raw_data" in s for s in shards))


def _ndarray(config: str) -> Callable[[bytes], np.ndarray]:
    args = config.split(":") if config else []
    dtype = args[0] if args else None
    shape = tuple(int(x) for x in args[1].split(",")) if len(args) > 1 else None

    def decode(data: bytes) -> np.ndarray:
        i = 0
        value_dtype = dtype
        if value_dtype is None:
            value_dtype, i = _VALUE_DTYPES[data[0]], 1
        dims = shape
        if dims is None:
            ndim, width = data[i] >> 2, data[i] % 4
            size = ndim * 2**width
            dims = tuple(np.frombuffer(data[i + 1 : i + 1 + size], _SHAPE_DTYPES[width]).tolist())
            i += 1 + size
        return np.frombuffer(data[i:], value_dtype).reshape(dims)

    return decode


def _image(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data))


def _pil(data: bytes) -> Any:
    from PIL import Image

    width, height, mode_size = np.frombuffer(data[:12], np.uint32)
    mode = data[12 : 12 + mode_size].decode("utf-8")
    return Image.frombytes(mode, (int(width), int(height)), data[12 + mode_size :])


def _sized_parts(data: bytes, count_at: int) -> list[bytes]:
    """MDS's list layout: a uint32 count at `count_at`, that many uint32 sizes, then the parts back to back."""
    n = int(np.frombuffer(data[count_at : count_at + 4], np.uint32)[0])
    sizes = np.frombuffer(data[count_at + 4 : count_at + 4 + 4 * n], np.uint32).tolist()
    ends = np.cumsum([count_at + 4 + 4 * n, *sizes]).tolist()
    return [data[start:stop] for start, stop in zip(ends[:-1], ends[1:])]


def _list_of(decode: Callable[[bytes], Any]) -> Callable[[bytes], list]:
    def decode_list(data: bytes) -> list:
        return [decode(part) for part in _sized_parts(data, 4)]

    return decode_list


def _jpeg_array(data: bytes) -> list:
    return [_image(part) for part in _sized_parts(data, 0)]


_PLAIN: dict[str, Callable[[bytes], Any]] = {
    "bytes": bytes,
    "str": lambda d: d.decode("utf-8"),
    "int": lambda d: int(np.frombuffer(d, np.int64)[0]),
    "str_int": lambda d: int(d.decode("utf-8")),
    "str_float": lambda d: float(d.decode("utf-8")),
    "str_decimal": lambda d: decimal.Decimal(d.decode("utf-8")),
    "pil": _pil,
    "jpeg": _image,
    "png": _image,
    "list[pil]": _list_of(_pil),
    "list[jpeg]": _list_of(_image),
    "list[png]": _list_of(_image),
    "jpeg_array": _jpeg_array,
    "jpegarray": _jpeg_array,
    "pkl": pickle.loads,
    "json": lambda d: json.loads(d.decode("utf-8")),
    **{name: (lambda t: lambda d: np.frombuffer(d, t)[0])(np.dtype(name)) for name in _SCALARS},
}


def column_decoder(encoding: str) -> Callable[[bytes], Any]:
    """The decoder of one MDS column encoding (`ndarray:int32:2048` and friends)."""
    name, _, config = encoding.partition(":")
    if name == "ndarray":
        return _ndarray(config)
    if name in _PLAIN and not config:
        return _PLAIN[name]
    raise ValueError(f"MDS column encoding {encoding!r} is not one MosaicML Streaming defines")


def _hash(algo: str, data: bytes) -> str:
    if algo.startswith("xxh"):
        import xxhash

        return getattr(xxhash, algo)(data).hexdigest()
    return hashlib.new(algo, data).hexdigest()


def _fixed_size(encoding: str) -> int | None:
    """Bytes of every value of a fixed-size encoding (None: sized per sample), as MosaicML's `size`."""
    name, _, config = encoding.partition(":")
    if name == "int":
        return 8
    if name in _SCALARS and not config:
        return np.dtype(name).itemsize
    args = config.split(":")
    if name == "ndarray" and len(args) == 2:
        return int(np.prod([int(x) for x in args[1].split(",")])) * np.dtype(args[0]).itemsize
    return None


def _check_columns(where: Path, i: int, entry: dict) -> None:
    """Names, encodings and sizes line up, and each fixed size is its encoding's (a changed encoding is caught)."""
    names, encodings, sizes = entry.get("column_names"), entry.get("column_encodings"), entry.get("column_sizes")
    if not all(isinstance(x, list) for x in (names, encodings, sizes)) or not len(names) == len(encodings) == len(sizes):
        raise ManifestError(f"{where}: shard {i} needs column_names, column_encodings and column_sizes lists of one "
                            f"length; {trust.FIX}")
    for name, encoding, size in zip(names, encodings, sizes):
        try:
            column_decoder(encoding)
            expected = _fixed_size(encoding)
        except (ValueError, TypeError, AttributeError):
            raise ManifestError(f"{where}: shard {i} column {name!r} has encoding {encoding!r}, not one MosaicML "
                                f"Streaming defines; {trust.FIX}") from None
        if size != expected:
            raise ManifestError(f"{where}: shard {i} column {name!r} has encoding {encoding!r} (values of "
                                f"{expected or 'any'} bytes) but column_sizes says {size}; {trust.FIX}")


def _shard_info(folder: Path, i: int, entry: Any) -> tuple[dict, ShardInfo]:
    """(the file entry read: raw_data or zip_data, the ShardInfo) of shard i, its fields checked."""
    where = folder / "index.json"
    if not isinstance(entry, dict) or entry.get("format") != "mds":
        got = entry.get("format") if isinstance(entry, dict) else entry
        raise ManifestError(f"{where}: shard {i} has format {got!r}; only 'mds' is read (xsv/json: convert with MosaicML first)")
    compression = entry.get("compression")
    if compression and not str(compression).startswith("zstd"):
        raise ManifestError(f"{where}: shard {i} is compressed with {compression!r}; only zstd is read")
    raw, zipped = entry["raw_data"], entry.get("zip_data")
    for name in (raw["basename"], *([zipped["basename"]] if zipped else [])):
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            raise ManifestError(f"{where}: shard {i} names the file {name!r}; only files of this folder are read")
    _check_columns(where, i, entry)
    # Prefer the raw file when it is there (memory-mapped); else the compressed one.
    use_zip = bool(zipped) and not (folder / raw["basename"]).exists()
    info = zipped if use_zip else raw
    label = f"shard {i} ({raw['basename']})"
    samples = trust.count_field(where, label, "samples", entry.get("samples"))
    raw_bytes = trust.count_field(where, label, "raw_data.bytes", raw.get("bytes"))
    stored = trust.count_field(where, label, "zip_data.bytes", info.get("bytes")) if use_zip else raw_bytes
    trust.check_size(folder / info["basename"], stored, "zip_data.bytes" if use_zip else "raw_data.bytes", where)
    hashes = info.get("hashes") or {}  # the checksum key our verified-files memo remembers
    checksum = ",".join(f"{algo}:{value}" for algo, value in sorted(hashes.items()) if isinstance(value, str))
    return info, ShardInfo(file=info["basename"], bytes=stored, checksum=checksum, items=samples,
                           compression="zstd" if use_zip else None, raw_bytes=raw_bytes)


class MDSSource(base.ForeignSource):
    """An MDS folder: every shard an item shard, a sample a dict of columns, as their `ds[i]`."""

    def __init__(self, folder: Path, data: dict):
        where = folder / "index.json"
        self.entries, shards, self.files_info = [], [], []
        for i, entry in enumerate(data["shards"]):
            info, shard = _shard_info(folder, i, entry)
            self.entries.append(entry)
            self.files_info.append(info)
            shards.append(shard)
        trust.unique_files(where, [e["raw_data"]["basename"] for e in self.entries], "shard")
        for shard in shards:  # before anything is served: each header against its index entry
            offsets = trust.read_header(folder / shard.file, shard.compression is not None, shard.raw_bytes)
            trust.check_offsets(folder / shard.file, offsets, shard.items, "samples", shard.raw_bytes, "raw_data.bytes", where,
                          header_extra=True)
        columns = {(tuple(e["column_names"]), tuple(e["column_encodings"])) for e in self.entries}
        first = self.entries[0] if self.entries else {"column_names": [], "column_encodings": []}
        manifest = base.ForeignManifest(
            kind="items", shards=shards, foreign_format="mds", index_digest=base.file_digest(where),
            details={"columns": dict(zip(first["column_names"], first["column_encodings"])),
                     "column_sets": len(columns)},
        )
        super().__init__(manifest, folder)
        self._by_file = {info["basename"]: info for info in self.files_info}
        self._decoders: dict[int, list] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_decoders": {}}  # closures: worker processes rebuild them on first use

    def _check(self, info: ShardInfo, stored: bytes) -> None:
        """The peer's own hashes (sha1, xxh64, ...) of the file read, where its index has them."""
        entry = self._by_file[info.file]
        for algo, expected in (entry.get("hashes") or {}).items():
            actual = _hash(algo, stored)
            if actual != expected:
                raise ShardError(f"shard {self.folder / info.file} fails its {algo} hash "
                                 f"({actual} != {expected}): the file is corrupt")

    def shard_files(self, verify: bool) -> base.ForeignShardBytes:
        return base.ForeignShardBytes(self.folder, self.manifest, verify, check=self._check)

    def decode_item(self, raw: np.ndarray, local: int, shard: int) -> dict[str, Any]:
        """Sample `local` of shard `shard`: a dict of its columns."""
        entry = self.entries[shard]
        path = self.folder / self.manifest.shards[shard].file
        decoders = self._decoders.get(shard)
        if decoders is None:
            decoders = self._decoders[shard] = [column_decoder(e) for e in entry["column_encodings"]]
        begin, end = raw[4 * (1 + local) : 4 * (3 + local)].view("<u4").tolist()
        data = raw[begin:end].tobytes()
        sizes, i = [], 0
        for size in entry["column_sizes"]:
            if size:
                sizes.append(size)
            else:
                sizes.append(int.from_bytes(data[i : i + 4], "little"))
                i += 4
        trust.check_item_span(path, local, i + sum(sizes), len(data))
        sample = {}
        for name, encoding, decode, size in zip(entry["column_names"], entry["column_encodings"], decoders, sizes):
            try:
                sample[name] = decode(data[i : i + size])
            except trust.DECODE_ERRORS as e:  # the bytes are not what the column's encoding says
                raise trust.decode_error(path, local, f"column {name!r} ({encoding})", e) from None
            i += size
        return sample

    def item_reader(self, verify: bool = True) -> base.ForeignItemReader:
        for entry in self.entries:  # an unknown encoding is refused now, not at step 10,000
            for encoding in entry["column_encodings"]:
                column_decoder(encoding)
        return base.ForeignItemReader(self.shard_files(verify), self.decode_item)

    def item_sizes(self, shard: int) -> np.ndarray:
        raw = self.shard_files(False).raw(shard)
        n = int(raw[:4].view("<u4")[0])
        return np.diff(raw[4 : 4 * (n + 2)].view("<u4").astype(np.int64))


def open_mds(folder: Path, data: dict | None = None) -> MDSSource:
    """Open an MDS folder read-only (its index.json already parsed, or read here)."""
    if data is None:
        data = json.loads((folder / "index.json").read_text())
    return MDSSource(folder, data)
