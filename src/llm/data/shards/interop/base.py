"""What a foreign (LitData, MosaicML MDS) folder becomes here: a Manifest view, shard bytes and readers."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.format import verified
from llm.data.shards.format.manifest import Manifest, ShardInfo
from llm.data.shards.format.reader import ShardError, TokenReader, _ShardBytes
from llm.data.shards.format.validate import ManifestError


@dataclass
class ForeignManifest(Manifest):
    """A peer's index seen as ours: same totals and shard list, read-only, its own fingerprint.

    `fingerprint()` is a digest of the foreign index file's bytes (and its format name), so a
    loader state is bound to exactly that index: a re-prepared or appended folder is refused.
    """

    foreign_format: str = ""  # "litdata" or "mds"
    index_digest: str = ""  # sha256 of the foreign index.json as stored
    details: dict = field(default_factory=dict)  # format-specific facts for `llm-data inspect`

    def fingerprint(self) -> str:
        return hashlib.sha256(f"{self.foreign_format}:{self.index_digest}".encode()).hexdigest()[:32]


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes (the foreign index: small)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Optional per-shard check of a file's stored bytes (the peer's own hashes): raise ShardError.
Checker = Callable[[ShardInfo, bytes], None]


class ForeignShardBytes(_ShardBytes):
    """A peer's shard files by index: our `_ShardBytes` (maps, LRU, descriptors), with the peer's checks.

    Stored raw: a memory map. Compressed (zstd, possibly several frames): decompressed whole.
    Sizes and offsets tables were checked against the peer's index when the folder was opened
    (trust.py), sizes again on first touch; `check` (the peer's own hashes, when its index has
    them) runs the first time a process opens a shard when `verify` is on.
    """

    # A peer's tokens start after its offsets table, not at byte 0: TokenReader's pread path (which
    # looks this attribute up) would read the header as tokens, so reads go through the maps.
    pinned_descriptors = None

    def __init__(self, folder: Path, manifest: ForeignManifest, verify: bool = True, check: Checker | None = None):
        self.check = check
        super().__init__(folder, manifest, verify)

    def _verify(self, info: ShardInfo, data: np.ndarray | None = None, force: bool = False) -> None:
        """The peer's hashes, skipped (like our checksums) when this very file passed them here before.

        `info.checksum` names the hashes the index states (MDS: `sha1:...,xxh64:...`); files
        without one (LitData) have nothing to check or remember.
        """
        if self.check is None:
            return
        path = self.folder / info.file
        key = info.checksum
        if key and not force and self.verify != "always" and verified.is_verified(path, key):
            return
        before = verified.identity(path)
        self.check(info, data.tobytes() if data is not None else path.read_bytes())
        if key:
            verified.remember(path, key, before)

    def _check_layout(self, info: ShardInfo, data: np.ndarray, deep: bool = False) -> None:
        if len(data) != info.raw_bytes:
            raise ShardError(f"shard {self.folder / info.file} holds {len(data)} bytes uncompressed but its index "
                             f"says {info.raw_bytes}: the file is corrupt or the index does not describe it")

    def _decompress(self, info: ShardInfo, stored: bytes) -> np.ndarray:
        """A zstd file as the peers write it (one or more frames, content size not always recorded)."""
        try:
            import zstandard

            out = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stored), read_across_frames=True).read()
        except Exception as e:  # zstandard.ZstdError and friends: a corrupt file
            raise ShardError(f"shard {self.folder / info.file} does not decompress ({e})") from None
        if len(out) != info.raw_bytes:
            raise ShardError(f"shard {self.folder / info.file}: a zstd shard decompressed to {len(out)} bytes, "
                             f"its index says {info.raw_bytes}")
        return np.frombuffer(out, np.uint8)

    def release(self) -> None:
        """The remote-cache pin of our own shards; foreign folders are local."""


# (raw shard bytes, shard index) -> (tokens view, document ends in tokens, uint64)
TokenLayout = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


class ForeignTokenReader(TokenReader):
    """Our TokenReader over a peer's token chunks: only where a shard's tokens and documents are changes.

    `counts[i]` tokens of shard i are used (a peer may drop each chunk's tail, as LitData's
    TokensLoader does); block i is then the same tokens the peer's own `ds[i]` returns.
    """

    def __init__(self, manifest: ForeignManifest, files: ForeignShardBytes, layout: TokenLayout, counts: list[int]):
        super().__init__(files.folder, manifest, files=files)
        self.layout = layout
        self.counts = counts
        self.starts = np.concatenate([[0], np.cumsum(np.array(counts, dtype=np.int64))]).astype(np.int64)
        self.total = int(self.starts[-1])

    def _shard(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        views = self._views.get(i)
        if views is None:
            tokens, ends = self.layout(self.files.raw(i), i)
            keep = self.counts[i]
            tokens = tokens[:keep]
            if len(ends) and int(ends[-1]) > keep:  # the dropped tail: the last kept document ends at `keep`
                ends = np.append(ends[ends < keep], np.uint64(keep)).astype(np.uint64)
            views = (tokens, ends)
            if self.files.shards[i].compression is None:
                self._views[i] = views
        return views


class ForeignItemReader:
    """Item i of a peer's folder: `decode(raw shard bytes, local index, shard index)` does the format."""

    def __init__(self, files: ForeignShardBytes, decode: Callable[[np.ndarray, int, int], Any]):
        self.files, self.decode = files, decode
        counts = np.array([s.items for s in files.shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.total = int(self.starts[-1])

    def get(self, index: int) -> Any:
        i = int(np.searchsorted(self.starts, index, side="right")) - 1
        return self.decode(self.files.raw(i), index - int(self.starts[i]), i)

    def get_many(self, indices: np.ndarray) -> list:
        """Items at these indices, in order (the batched path of StreamingDataset)."""
        return [self.get(int(i)) for i in indices]

    def verify(self) -> None:
        self.files.verify_all()


class ForeignSource:
    """One opened foreign folder: its manifest view and how to build readers for StreamingDataset."""

    def __init__(self, manifest: ForeignManifest, folder: Path):
        self.manifest, self.folder = manifest, folder

    def token_reader(self, block_size: int, verify: bool = True) -> TokenReader:  # pragma: no cover - abstract
        raise ValueError(f"{self.folder} ({self.manifest.foreign_format}) holds items, not tokens")

    def item_reader(self, verify: bool = True) -> ForeignItemReader:  # pragma: no cover - abstract
        raise ValueError(f"{self.folder} ({self.manifest.foreign_format}) holds tokens, not items")

    def item_sizes(self, shard: int) -> np.ndarray:
        """Stored size of each item / document of one shard (bytes, or tokens for token data)."""
        raise NotImplementedError

    def shard_files(self, verify: bool) -> ForeignShardBytes:  # pragma: no cover - abstract
        """The folder's shard files by index (`verify`: the peer's hashes on first use)."""
        raise NotImplementedError

    def verify(self) -> None:
        """`llm-data verify`: every shard's size, header and (where the peer has them) hashes; every item decodes.

        Sizes, counts and offsets tables were checked when the folder was opened; this reads every
        file, checks its hashes and decompressed size, and decodes each item (raises ShardError).
        """
        files = self.shard_files(True)
        files.verify_all()
        if self.manifest.kind == "tokens":
            return
        try:
            reader = self.item_reader(verify=False)  # the files were verified just above
        except (ManifestError, ShardError):
            raise
        except ValueError:
            return  # leaves only litdata itself decodes: the files and their layout are all we can check
        for i in range(reader.total):
            reader.get(i)
