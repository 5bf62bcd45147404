"""Edge tokens of remote token shards, kept beside the shard cache so that a block straddling two shards needs one of them only.

Why: a token block that lies in shards k and k+1 is read in one shuffle window, while
one of the two shards belongs to another window. Without its edge, the cache fetches
that shard whole (one more GET of the whole object) for a few hundred tokens, and it is
evicted again long before or after its own window. With a windowed order of version 2
(plan/shuffle/windowed.py) the block is read in the later window, so the other shard was
opened in an earlier one, and this store kept its first and last `block_size` tokens
then (with the document ends among them, for position ids): the block is read from the
window's own shard plus that edge, and every shard is fetched about once per epoch.

Trust: an edge is cut from a shard the cache has just verified (size and checksum
against the manifest), written to a temporary file and renamed into place; it records
the shard's checksum and token count, and the archive's CRCs catch a damaged file. An
edge that is missing, damaged or of another shard is ignored: the shard is read whole,
as without this store. Edges of encrypted datasets are never written (the cache holds
ciphertext only).

Cost: two `block_size` token slices per shard, in `.edges/` of the cache folder (not
counted in `max_cache_size`, never evicted; `llm-data cache clear` removes them with
the folder).
"""

from __future__ import annotations

import os
import threading
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.arrays import add_document_starts, positions_from_starts


class EdgeStore:
    """The kept edges of one remote token dataset's shards, for one block size."""

    def __init__(self, folder: Path, manifest: Any, block_size: int, starts: np.ndarray):
        self.folder = Path(folder) / ".edges" / f"block-{int(block_size)}"
        self.shards, self.dtype, self.block = manifest.shards, manifest.dtype, int(block_size)
        self.starts = np.asarray(starts, dtype=np.int64)
        self._setup()

    def _setup(self) -> None:
        self._edges: dict[int, dict[str, np.ndarray]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_edges", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._setup()

    def _path(self, i: int) -> Path:
        return self.folder / f"{self.shards[i].file}.npz"

    # ---- keeping -------------------------------------------------------------------------

    def keep(self, i: int, data: np.ndarray) -> None:
        """Shard i was just opened (downloaded and verified, `data` its uncompressed bytes): keep its edges."""
        if i in self._edges or self._path(i).exists():
            return
        info = self.shards[i]
        dtype = np.dtype(info.dtype or self.dtype)
        n_bytes = info.tokens * dtype.itemsize
        tokens = data[:n_bytes].view(f"<{dtype.str[1:]}")
        ends = data[n_bytes : n_bytes + 8 * info.documents].view("<u8")
        width = min(self.block, info.tokens)
        edges = {
            "head": np.array(tokens[:width]), "tail": np.array(tokens[info.tokens - width :]),
            "head_ends": np.array(ends[: np.searchsorted(ends, width, side="right")]),
            "tail_ends": np.array(ends[np.searchsorted(ends, info.tokens - width, side="left") :]),
            "tokens": np.array([info.tokens], dtype=np.int64), "checksum": np.array(info.checksum),
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        part = self.folder / f".{self.shards[i].file}.{os.getpid()}-{threading.get_ident()}.part"
        try:
            with open(part, "wb") as f:
                np.savez(f, **edges)
            os.replace(part, self._path(i))
        except OSError:  # a full or read-only disk: the shard is read whole when its edge is needed
            part.unlink(missing_ok=True)
            return
        with self._lock:
            self._edges[i] = edges

    # ---- reading -------------------------------------------------------------------------

    def _load(self, i: int) -> dict[str, np.ndarray] | None:
        edges = self._edges.get(i)
        if edges is not None:
            return edges
        try:
            with np.load(self._path(i), allow_pickle=False) as archive:
                edges = {k: archive[k] for k in archive.files}  # each member's CRC is checked as it is read
            good = int(edges["tokens"][0]) == self.shards[i].tokens and str(edges["checksum"]) == self.shards[i].checksum
        except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile):
            return None
        if not good:
            return None
        with self._lock:
            self._edges[i] = edges
        return edges

    def part(self, i: int, a: int, b: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(tokens [a, b) of shard i, its document ends covering them) from its edges, or None."""
        length = self.shards[i].tokens
        if b - a > min(self.block, length) or (a > 0 and b < length):
            return None  # only a shard's first or last `block` tokens are kept
        edges = self._load(i)
        if edges is None:
            return None
        if a == 0 and b <= len(edges["head"]):
            return edges["head"][a:b], edges["head_ends"]
        tail = len(edges["tail"])
        if b == length and a >= length - tail:
            offset = length - tail
            return edges["tail"][a - offset : b - offset], edges["tail_ends"]
        return None

    def covers(self, i: int, a: int, b: int) -> bool:
        """Whether tokens [a, b) of shard i can be read without the shard."""
        return self.part(i, a, b) is not None

    def read(self, reader: Any, start: int, stop: int, out: np.ndarray, positions: np.ndarray | None = None) -> None:
        """As `TokenReader.read` (same tokens and positions), each shard's part from its edges when kept."""
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        pos, resets = 0, [0]
        while start < stop:
            base = int(self.starts[i])
            a, b = start - base, min(stop, int(self.starts[i + 1])) - base
            if b > a:
                kept = self.part(i, a, b)
                tokens, doc_ends = kept if kept is not None else reader._shard(i)
                if kept is not None:  # the kept slice starts at shard token a (head: 0)
                    out[pos : pos + b - a] = tokens
                else:
                    out[pos : pos + b - a] = tokens[a:b]
                add_document_starts(resets, doc_ends, a, b, pos)
            pos += b - a
            start += b - a
            i += 1
        if positions is not None:
            positions_from_starts(resets, pos, positions)
