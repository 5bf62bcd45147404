"""OLMo-core numpy token files (raw `np.memmap` arrays, no .npy header) named by an `olmo:` spec, read in place.

OLMo-core pre-tokenizes into flat 1-D arrays of token ids (uint8/16/32/64; `data_loading.rst`),
documents separated by EOS, given to `NumpyFSLDatasetConfig(paths=[...], dtype=...)`. Its
fixed-length instances never cross a file: each file's tail shorter than one sequence is not
used. Here the same files are one spec string (so a loader state, the ledger and the CLI can
name them):

    olmo:uint32:eos=50279:/data/part-000.npy,/data/part-001.npy
    olmo:uint16:/data/tokens/            (a folder: its *.npy files in name order)

Without `eos=` each file is one document.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm.data.shards.format.pread import ShardError
from llm.data.shards.format.validate import ManifestError
from llm.data.shards.interop.flat import (
    FlatFile,
    FlatTokenSource,
    common_folder,
    digest_of,
    document_ends,
)

PREFIX = "olmo:"
DTYPES = ("uint8", "uint16", "uint32", "uint64")  # OLMo-core's NumpyDatasetDType (uint64 is refused at open)
_NPY_MAGIC = b"\x93NUMPY"
_SAMPLE = 1 << 16  # bytes of each file's head and tail in the fingerprint (its name and size are in too)
_HELP = "expected olmo:DTYPE[:eos=ID]:PATH[,PATH...] with DTYPE one of " + ", ".join(DTYPES)


@dataclass(frozen=True)
class OlmoSpec:
    """What an `olmo:` string names: the files' dtype, the EOS id (or None) and the paths or URLs."""

    dtype: str
    eos_id: int | None
    paths: tuple[str, ...]

    def __str__(self) -> str:
        eos = f"eos={self.eos_id}:" if self.eos_id is not None else ""
        return f"{PREFIX}{self.dtype}:{eos}{','.join(self.paths)}"


def is_olmo_spec(value: object) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def parse_spec(value: str) -> OlmoSpec:
    """An `olmo:` string as an OlmoSpec; a malformed one is a ValueError saying what is expected."""
    dtype, sep, rest = value[len(PREFIX) :].partition(":")
    if dtype not in DTYPES or not sep:
        raise ValueError(f"{value!r}: dtype {dtype!r} is not an OLMo token dtype; {_HELP}")
    eos = None
    if rest.startswith("eos="):
        text, _, rest = rest[4:].partition(":")
        if not text.isdigit() or int(text) > np.iinfo(dtype).max:
            raise ValueError(f"{value!r}: eos={text!r} is not a token id of {dtype}; {_HELP}")
        eos = int(text)
    paths = tuple(p for p in rest.split(",") if p)
    if not paths:
        raise ValueError(f"{value!r} names no files; {_HELP}")
    return OlmoSpec(dtype, eos, paths)


def spec(paths: list[str | Path], dtype: str = "uint32", eos_id: int | None = None) -> str:
    """The `olmo:` string for these files (what StreamingDataset, mixtures and `llm-data convert` take)."""
    return str(OlmoSpec(np.dtype(dtype).name, eos_id, tuple(str(p) for p in paths)))


def _files(spec: OlmoSpec) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, spec.paths):
        if p.is_dir():
            found = sorted(p.glob("*.npy"))
            if not found:
                raise ManifestError(f"{p} holds no *.npy token files ({spec})")
            out += found
        elif not p.is_file():
            raise ShardError(f"OLMo token file {p} is missing ({spec})")
        else:
            out.append(p)
    if len(set(out)) != len(out):
        raise ManifestError(f"{spec} names a file twice, so its tokens would be served twice")
    return out


def _check(path: Path, dtype: np.dtype) -> int:
    size = os.stat(path).st_size
    if size % dtype.itemsize:
        raise ShardError(f"OLMo token file {path} has {size} bytes, not a multiple of {dtype.name}'s {dtype.itemsize}: "
                         "it is truncated or holds another dtype")
    with open(path, "rb") as f:
        if f.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
            raise ShardError(f"{path} is a NumPy .npy file with a header; OLMo token files are raw arrays "
                             "(np.memmap): write the array with tofile() or strip the header")
    return size


def _sample(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        head = f.read(_SAMPLE)
        f.seek(max(0, size - _SAMPLE))
        return head + f.read(_SAMPLE)


def _ends_cache(path: Path, dtype: np.dtype, eos: int, sample: bytes) -> Path:
    """Where this file's document ends are kept: keyed by its path, size, mtime, head and tail, dtype and EOS id."""
    from llm.data.storage.cache import default_cache_root

    st = os.stat(path)
    key = f"{path.absolute()}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{dtype.name}:{eos}:{hashlib.sha256(sample).hexdigest()}"
    return default_cache_root() / "olmo-ends" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npy"


def _ends(path: Path, dtype: np.dtype, eos: int | None, tokens: int, sample: bytes) -> np.ndarray:
    """Document ends (after each EOS): a scan of the whole file, so kept in the user cache dir, as
    OLMo-core keeps its document indices; a file changed in place gets a new key (size, mtime, inode)."""
    if eos is None or tokens == 0:
        return document_ends(np.zeros(0, np.int64), tokens)
    cache = _ends_cache(path, dtype, eos, sample)
    try:
        ends = np.load(cache)
        if len(ends) and int(ends[-1]) == tokens:
            return ends.astype(np.uint64)
    except (OSError, ValueError):
        pass  # not cached yet, or a torn file: scan again
    arr = np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r")
    parts = []
    for at in range(0, tokens, 1 << 24):  # bounded memory for multi-GB files
        parts.append(np.flatnonzero(arr[at : at + (1 << 24)] == eos) + at + 1)
    del arr
    ends = document_ends(np.concatenate(parts), tokens)
    try:
        from llm.data.storage.local import atomic_write

        cache.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.save(buffer, ends)
        atomic_write(cache, buffer.getvalue())
    except OSError:
        pass  # a read-only cache dir costs a scan next time, nothing else
    return ends


def open_olmo(value: str | OlmoSpec, local: list[Path] | None = None) -> FlatTokenSource:
    """The files of an `olmo:` spec, each checked (`local`: where a remote spec's files were copied)."""
    parsed = parse_spec(value) if isinstance(value, str) else value
    dtype = np.dtype(parsed.dtype)
    if dtype == np.uint64:  # batches are torch int64, which cannot hold every uint64 id
        raise ValueError(f"{parsed}: uint64 token files are not read (batches are int64); rewrite them as uint32")
    paths = local if local is not None else _files(parsed)
    if not paths:
        raise ManifestError(f"{parsed} names no files")
    folder, names = common_folder(paths)
    files, parts = [], [str(parsed.dtype).encode(), str(parsed.eos_id).encode()]
    for path, name in zip(paths, names):
        size = _check(path, dtype)
        sample = _sample(path, size)
        files.append(FlatFile(name, dtype, _ends(path, dtype, parsed.eos_id, size // dtype.itemsize, sample), size))
        parts += [path.name.encode(), str(size).encode(), sample]
    details = {"dtype": dtype.name, "eos_id": parsed.eos_id, "files": len(files)}
    return FlatTokenSource(folder, files, "olmo", digest_of(parts), details, per_file_blocks=True, eos_id=parsed.eos_id)
