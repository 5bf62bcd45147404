"""Flat token files read in place (Megatron `.bin`, OLMo-core numpy): one file is one shard, tokens from byte 0.

Both formats keep a file of bare token ids and say elsewhere where documents end (Megatron: its
`.idx`; OLMo: the EOS token). The format modules check their files and hand over `FlatFile`s; this
module turns them into our manifest view and a token reader, so order, resume and mixtures are ours.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llm.data.shards.format.manifest import ShardInfo
from llm.data.shards.format.reader import _ShardBytes
from llm.data.shards.interop.base import (
    ForeignManifest,
    ForeignShardBytes,
    ForeignSource,
    ForeignTokenReader,
)


@dataclass
class FlatFile:
    """One checked token file: its name under the source's folder, dtype, and document ends (tokens, uint64)."""

    file: str
    dtype: np.dtype
    ends: np.ndarray
    nbytes: int

    @property
    def tokens(self) -> int:
        return self.nbytes // self.dtype.itemsize


def document_ends(ends: np.ndarray, tokens: int) -> np.ndarray:
    """Strictly increasing ends (empty documents dropped), the last one at `tokens` (a tail is a document too)."""
    ends = np.unique(np.asarray(ends, dtype=np.int64))
    ends = ends[(ends > 0) & (ends <= tokens)]
    if tokens and (len(ends) == 0 or int(ends[-1]) != tokens):
        ends = np.append(ends, tokens)
    return ends.astype(np.uint64)


class FlatShardBytes(ForeignShardBytes):
    """A peer's token files whose tokens start at byte 0: rows are read with our pread path, as our shards' are."""

    pinned_descriptors = _ShardBytes.pinned_descriptors


class FlatTokenSource(ForeignSource):
    """Token files as shards; `per_file_blocks`: each file's tail shorter than a block is not served
    (OLMo-core's fixed-length instances never cross files), else blocks run across files (Megatron)."""

    def __init__(self, folder: Path, files: list[FlatFile], foreign_format: str, digest: str, details: dict,
                 per_file_blocks: bool = False, eos_id: int | None = None):
        self.files = files
        self.per_file_blocks = per_file_blocks
        shards = [ShardInfo(file=f.file, bytes=f.nbytes, checksum="", documents=len(f.ends), tokens=f.tokens, items=0,
                            dtype=f.dtype.name, compression=None, raw_bytes=f.nbytes) for f in files]
        widest = max((f.dtype for f in files), key=lambda d: d.itemsize, default=np.dtype(np.uint16))
        manifest = ForeignManifest(kind="tokens", shards=shards, dtype=widest.name, eos_id=eos_id,
                                   foreign_format=foreign_format, index_digest=digest, details=details)
        super().__init__(manifest, folder)

    def shard_files(self, verify: bool) -> ForeignShardBytes:
        return FlatShardBytes(self.folder, self.manifest, verify)

    def token_layout(self, raw: np.ndarray, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, document ends) of one file: the whole file is tokens, little-endian."""
        f = self.files[shard]
        return raw[: f.tokens * f.dtype.itemsize].view(f.dtype.newbyteorder("<")), f.ends

    def token_reader(self, block_size: int, verify: bool = True) -> ForeignTokenReader:
        counts = [f.tokens // block_size * block_size if self.per_file_blocks else f.tokens for f in self.files]
        return ForeignTokenReader(self.manifest, self.shard_files(verify), self.token_layout, counts)

    def item_sizes(self, shard: int) -> np.ndarray:
        return np.diff(np.concatenate([[0], self.files[shard].ends.astype(np.int64)]))


def digest_of(parts: list[bytes]) -> str:
    """sha256 over the byte strings that identify a source (index bytes, names, sizes)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def common_folder(paths: list[Path]) -> tuple[Path, list[str]]:
    """The deepest folder holding every path, and each path's name relative to it."""
    resolved = [p.absolute() for p in paths]
    parents = [p.parent for p in resolved]
    base = parents[0]
    while not all(p == base or base in p.parents for p in parents):
        base = base.parent
    return base, [str(p.relative_to(base)) for p in resolved]
