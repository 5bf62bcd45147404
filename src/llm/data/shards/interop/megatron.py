"""Megatron-LM / NeMo indexed datasets (`PREFIX.bin` + `PREFIX.idx`, "MMIDIDX"), read in place and written.

The `.idx` (megatron/core/datasets/indexed_dataset.py, `_IndexWriter`): the magic `MMIDIDX\\0\\0`,
version `<Q` = 1, a dtype code `<B`, the sequence count `<Q`, the document count `<Q`, then
int32 sequence lengths, int64 sequence pointers (byte offsets into the `.bin`), int64 document
indices (sequence index where each document starts, from 0 to the sequence count) and, for
multimodal datasets only, one int8 mode per sequence. The `.bin` is the sequences' tokens back to
back. Every field is checked against the `.bin` before anything is served.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm.data.shards.format.pread import ShardError
from llm.data.shards.format.validate import ManifestError
from llm.data.shards.interop.flat import FlatFile, FlatTokenSource, digest_of, document_ends

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = len(MAGIC) + 8 + 1 + 8 + 8  # magic, version, dtype code, sequence count, document count
# Megatron's DType enum: the code stored in the .idx for each element type of the .bin.
CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
TOKEN_CODES = {np.dtype(t).name: c for c, t in CODES.items() if np.dtype(t).kind in "iu"}


@dataclass
class MegatronIndex:
    """A parsed `.idx` (arrays are views of its bytes)."""

    dtype: np.dtype
    lengths: np.ndarray  # int32 [sequences]
    pointers: np.ndarray  # int64 [sequences]
    documents: np.ndarray  # int64 [documents + 1]
    modes: np.ndarray | None  # int8 [sequences], multimodal only


def read_index(idx: Path) -> MegatronIndex:
    """Parse and check one `.idx` by itself (its counts against its own size); ManifestError naming the field."""
    try:
        size = os.stat(idx).st_size
        data = np.memmap(idx, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)  # indexes reach GBs
    except FileNotFoundError:
        raise ManifestError(f"{idx} is missing: a Megatron dataset is PREFIX.bin with PREFIX.idx") from None
    if len(data) < HEADER or bytes(data[: len(MAGIC)]) != MAGIC:
        raise ManifestError(f"{idx} is not a Megatron index: it does not start with the MMIDIDX header "
                            f"({len(data)} bytes)")
    version, code, sequences, documents = struct.unpack_from("<QBQQ", bytes(data[len(MAGIC) : HEADER]))
    if version != VERSION:
        raise ManifestError(f"{idx} is MMIDIDX version {version}; only version {VERSION} (Megatron-LM, NeMo) is read")
    if code not in CODES:
        raise ManifestError(f"{idx} has dtype code {code}, which Megatron does not define (1-8: "
                            f"{', '.join(f'{c} {np.dtype(t).name}' for c, t in CODES.items())})")
    dtype = np.dtype(CODES[code])
    if dtype.kind == "f":
        raise ManifestError(f"{idx} has dtype code {code} ({dtype.name}): its .bin holds floats, not token ids")
    arrays = HEADER + 12 * sequences + 8 * documents
    if len(data) not in (arrays, arrays + sequences):
        raise ManifestError(f"{idx} has {len(data)} bytes, but its sequence count {sequences} and document count "
                            f"{documents} need {arrays} (or {arrays + sequences} with sequence modes): the index is "
                            "truncated or its counts are wrong")
    if documents < 1:
        raise ManifestError(f"{idx}: document count is 0, but document_indices always holds at least the 0 it starts with")
    at = HEADER
    lengths = np.frombuffer(data, "<i4", sequences, at)
    pointers = np.frombuffer(data, "<i8", sequences, at + 4 * sequences)
    docs = np.frombuffer(data, "<i8", documents, at + 12 * sequences)
    modes = np.frombuffer(data, "<i1", sequences, arrays) if len(data) > arrays else None
    return MegatronIndex(dtype, lengths, pointers, docs, modes)


def check_against_bin(idx: Path, bin_path: Path, index: MegatronIndex) -> np.ndarray:
    """Every field of the index against the `.bin`; returns the document ends in tokens."""
    lengths, size = index.lengths.astype(np.int64), index.dtype.itemsize
    if len(lengths) and int(lengths.min()) < 0:
        i = int(np.argmax(lengths < 0))
        raise ManifestError(f"{idx}: sequence_lengths[{i}] is {int(lengths[i])}, a negative length")
    starts = np.concatenate([[0], np.cumsum(lengths)])
    wrong = np.flatnonzero(index.pointers != starts[:-1] * size)
    if len(wrong):
        i = int(wrong[0])
        raise ManifestError(f"{idx}: sequence_pointers[{i}] is {int(index.pointers[i])}, but the sequence lengths before "
                            f"it put sequence {i} at byte {int(starts[i]) * size} of {bin_path.name}")
    docs = index.documents
    if int(docs[0]) != 0 or int(docs[-1]) != len(lengths) or (len(docs) > 1 and bool(np.any(np.diff(docs) < 0))):
        raise ManifestError(f"{idx}: document_indices must rise from 0 to the sequence count {len(lengths)}, "
                            f"but they run {int(docs[0])} .. {int(docs[-1])}"
                            f"{'' if len(docs) < 2 or np.all(np.diff(docs) >= 0) else ' and fall somewhere'}")
    if index.modes is not None and np.any(index.modes != 0):
        i = int(np.argmax(index.modes != 0))
        raise ManifestError(f"{idx}: sequence_modes[{i}] is {int(index.modes[i])}: a multimodal dataset, whose "
                            "non-text sequences are not token ids")
    try:
        on_disk = os.stat(bin_path).st_size
    except FileNotFoundError:
        raise ShardError(f"{bin_path} is missing (its index {idx.name} is there)") from None
    tokens = int(starts[-1])
    if on_disk != tokens * size:
        raise ShardError(f"{bin_path} has {on_disk} bytes, but sequence_lengths in {idx.name} add up to {tokens} tokens "
                         f"of {index.dtype.name} = {tokens * size} bytes: the .bin is "
                         f"{'truncated' if on_disk < tokens * size else 'longer than its index says'}")
    return document_ends(starts[docs[1:]], tokens)


def prefixes(path: Path) -> list[Path]:
    """The Megatron prefixes `path` names: itself (PREFIX.idx exists) or every `*.idx` in the folder."""
    if Path(f"{path}.idx").is_file():
        return [path]
    if path.is_dir() and not (path / "index.json").exists():
        return sorted(p.with_suffix("") for p in path.glob("*.idx"))
    return []


def is_megatron(path: str | Path) -> bool:
    """A prefix with a `.idx`, or a folder of them (and no index.json of ours or a peer's)."""
    return bool(prefixes(Path(path)))


def open_megatron(path: str | Path) -> FlatTokenSource:
    """One prefix or a folder of prefixes (in name order), every index checked against its `.bin`."""
    path = Path(path)
    found = prefixes(path)
    if not found:
        raise ManifestError(f"{path} is neither a Megatron prefix (no {path}.idx) nor a folder of .bin/.idx pairs")
    folder = found[0].parent
    files, parts, codes, sequences = [], [], [], 0
    for prefix in found:
        idx, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        index = read_index(idx)
        ends = check_against_bin(idx, bin_path, index)
        files.append(FlatFile(bin_path.name, index.dtype, ends, int(index.lengths.astype(np.int64).sum()) * index.dtype.itemsize))
        parts += [idx.name.encode(), _sha256(idx)]
        codes.append(index.dtype.name)
        sequences += len(index.lengths)
    details = {"prefixes": [p.name for p in found], "dtypes": sorted(set(codes)), "sequences": sequences}
    return FlatTokenSource(folder, files, "megatron", digest_of(parts), details)


def _sha256(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.digest()


def megatron_code(dtype: np.dtype, largest: int) -> tuple[int, np.dtype]:
    """The Megatron dtype code (and dtype) to store ids up to `largest` given as `dtype` (uint32 has none)."""
    dtype = np.dtype(dtype)
    if dtype.name in TOKEN_CODES:
        return TOKEN_CODES[dtype.name], dtype
    for name in ("uint16", "int32", "int64"):
        if largest <= np.iinfo(name).max:
            return TOKEN_CODES[name], np.dtype(name)
    raise ValueError(f"token ids up to {largest} do not fit any Megatron dtype")


def index_bytes(code: int, lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """The `.idx` of one sequence per document: these lengths, their pointers, documents 0..n."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and int(lengths.max()) > np.iinfo(np.int32).max:
        raise ValueError(f"a document of {int(lengths.max())} tokens is longer than Megatron's int32 sequence length")
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype("<i8") * dtype.itemsize if len(lengths) else np.zeros(0, "<i8")
    header = MAGIC + struct.pack("<QBQQ", VERSION, code, len(lengths), len(lengths) + 1)
    docs = np.arange(len(lengths) + 1, dtype="<i8")
    return header + lengths.astype("<i4").tobytes() + pointers.astype("<i8").tobytes() + docs.tobytes()
