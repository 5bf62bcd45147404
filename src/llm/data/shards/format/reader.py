"""Shard bytes (verified on first use, pinned descriptors) and token ranges joined across shards; items: items_reader.py."""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from llm.data.shards.arrays import add_document_starts, group_rows, positions_from_starts
from llm.data.shards.format import verified
from llm.data.shards.format.checksum import checksum_bytes, checksum_file
from llm.data.shards.format.encryption import Encryption, unlock
from llm.data.shards.format.manifest import Manifest, ShardInfo
from llm.data.shards.format.pread import DatasetChanged, DescriptorPool, ShardError, read_rows


class _ShardBytes:
    """Opens shard files by index: a memory map when stored raw, decompressed bytes otherwise.

    Nothing is checked at open, so opening costs the same at 50 or 10^5 shards: the first time this
    process touches a shard, its size (a missing file is named), checksum and layout tail are checked,
    so corruption never reaches a training step. Decompressed shards sit in a small, bounded LRU.
    """

    keep_views = True  # token views may be cached for the reader's lifetime (not for cached remote shards)
    _cache_shards = 4  # decompressed shards kept (LRU)

    def __init__(self, folder: Path, manifest: Manifest, verify: bool = True, encryption: Encryption | None = None):
        self.folder, self.shards, self.verify = folder, manifest.entries, verify
        self.encryption, self.encrypted = encryption, manifest.encryption is not None  # decrypted whole when read
        self.kind, self.dtype = manifest.kind, manifest.dtype
        self._maps: dict[int, np.ndarray] = {}
        self._decompressed: OrderedDict[int, np.ndarray] = OrderedDict()
        self._identity: dict[int, tuple[int, int]] = {}  # (dev, inode) of each verified plain shard
        self._fds = DescriptorPool()
        self._lock = threading.Lock()  # reader threads share one instance

    def _check_size(self, info: ShardInfo, size: int | None = None) -> None:
        """The file's size (`size`, or a stat) against the manifest's `bytes`: a truncated or grown shard is named."""
        if size is None:
            try:
                size = os.stat(os.path.join(self.folder, info.file)).st_size
            except FileNotFoundError:
                raise ShardError(f"shard {self.folder / info.file} is missing (listed in {self.folder / 'index.json'})") from None
        if size != info.bytes:
            raise ShardError(f"shard {self.folder / info.file} has {size} bytes, the manifest says {info.bytes}: the file is corrupt")

    def _verify(self, info: ShardInfo, data: np.ndarray | None = None, force: bool = False) -> None:
        """The shard's checksum, unless this machine verified this very file before (verified.py)."""
        path = self.folder / info.file
        if not force and self.verify != "always" and verified.is_verified(path, info.checksum):
            return
        before = verified.identity(path)
        actual = checksum_bytes(data) if data is not None else checksum_file(path)
        if actual != info.checksum:
            raise ShardError(f"shard {path} fails its checksum ({actual} != {info.checksum}): the file is corrupt")
        verified.remember(path, actual, before)

    def plain(self, info: ShardInfo) -> bool:
        """Whether the stored bytes are the shard's bytes (mapped and read in place), not compressed or encrypted."""
        return info.compression is None and not self.encrypted

    def _check_layout(self, info: ShardInfo, data: np.ndarray, deep: bool = False) -> None:
        """The counts in the manifest against the shard's own offsets (the tail; all of it when deep).

        The manifest's sizes were checked on load; this catches a manifest whose counts add up
        to the right size but do not describe this file (e.g. tokens and documents both edited).
        """
        path = self.folder / info.file
        if len(data) != (info.bytes if self.plain(info) else info.raw_bytes):
            raise ShardError(f"shard {path} holds {len(data)} bytes uncompressed, the manifest says {info.raw_bytes}")
        if self.kind == "tokens":
            if not info.documents:
                return
            start = info.tokens * np.dtype(info.dtype or self.dtype).itemsize
            ends = data[start : start + 8 * info.documents].view("<u8")
            bad = int(ends[-1]) != info.tokens
            if deep and not bad:
                bad = bool(np.any(np.diff(ends.astype(np.int64)) < 0))
            if bad:
                raise ShardError(f"shard {path}: its document ends do not match 'tokens' {info.tokens} and 'documents' {info.documents} in the manifest")
            return
        offsets = data[len(data) - 8 * (info.items + 1) :].view("<u8")
        bad = int(offsets[0]) != 0 or int(offsets[-1]) != len(data) - 8 * (info.items + 1)
        if deep and not bad:
            bad = bool(np.any(np.diff(offsets.astype(np.int64)) < 0))
        if bad:
            raise ShardError(f"shard {path}: its item offsets do not match 'items' {info.items} in the manifest")

    def raw(self, i: int) -> np.ndarray:
        """The shard's uncompressed bytes as a uint8 array (a memory map when possible)."""
        data = self._maps.get(i)
        if data is not None:
            return data
        with self._lock:
            return self._open(i)

    def _open(self, i: int, verify: bool = False) -> np.ndarray:
        if i in self._maps:
            return self._maps[i]
        if i in self._decompressed:
            self._decompressed.move_to_end(i)
            return self._decompressed[i]
        info = self.shards[i]
        path = self.folder / info.file
        try:
            return self._load(i, info, path, verify)
        except FileNotFoundError:
            raise self._gone(info) from None

    def _gone(self, info: ShardInfo) -> ShardError:
        """A shard that existed at open is gone: the dataset changed under us, or a file was deleted."""
        try:
            listed = any(s.file == info.file for s in Manifest.load(self.folder).entries)
        except (OSError, ValueError):
            listed = False  # no readable manifest: a rewrite in progress, or a removed dataset
        if listed:  # the folder's manifest still wants it: a lost file, not a new dataset
            return ShardError(f"shard {self.folder / info.file} is missing (listed in {self.folder / 'index.json'})")
        return DatasetChanged(f"dataset {self.folder} changed under this reader (shard {info.file} is gone: the "
                              "folder was re-optimized or removed while it was read); recreate the dataset to read the new one")

    def _load(self, i: int, info: ShardInfo, path: Path, verify: bool) -> np.ndarray:
        if self.plain(info):
            st = os.stat(path)  # the file verified is the file read (pread.py checks its descriptors)
            self._check_size(info, st.st_size)
            self._identity[i] = (st.st_dev, st.st_ino)
            if self.verify or verify:
                self._verify(info, force=verify)
            data = np.memmap(path, dtype=np.uint8, mode="r") if info.bytes else np.zeros(0, np.uint8)
            self._check_layout(info, data)
            _unmap_pages(data)  # the check touched the tail (~64 KB mapped with fault-around): not kept per shard
            self._maps[i] = data
            return data
        stored = path.read_bytes()
        self._check_size(info, len(stored))
        if self.verify or verify:
            self._verify(info, np.frombuffer(stored, np.uint8), force=verify)
        stored = unlock(self.encrypted, self.encryption, stored, str(path))  # encryption.py: decrypted whole
        data = np.frombuffer(stored, np.uint8) if info.compression is None else self._decompress(info, stored)
        self._check_layout(info, data)
        self._decompressed[i] = data
        while len(self._decompressed) > self._cache_shards:
            self._decompressed.popitem(last=False)
        return data

    def _decompress(self, info: ShardInfo, stored: bytes) -> np.ndarray:
        """A compressed shard's raw bytes (one zstd frame of `raw_bytes`; peers' folders override it)."""
        import zstandard

        try:
            return np.frombuffer(zstandard.ZstdDecompressor().decompress(stored, max_output_size=info.raw_bytes), np.uint8)
        except zstandard.ZstdError as e:
            raise ShardError(f"shard {self.folder / info.file} does not decompress to its raw_bytes {info.raw_bytes} ({e})") from None

    @contextmanager
    def pinned_descriptors(self, shards: list[int]) -> Iterator[list[int]]:
        """Pinned read-only descriptors of these plain shards (each verified first)."""
        for i in shards:
            self.raw(i)  # verified and layout-checked before any byte is served
        with self._fds.use(shards, self.path_of, [self._identity.get(i) for i in shards]) as fds:
            yield fds

    def path_of(self, i: int) -> str:
        return os.path.join(self.folder, self.shards[i].file)  # a plain string: built for every file opened

    def release_pages(self, shards: set[int]) -> None:
        """Drop this process's mapping of these shards' pages it has read (they stay in the page cache).

        Without it, resident memory grows with every shard page ever touched, which looks
        like a leak to schedulers that watch RSS; the next read just maps the page again.
        """
        for i in shards:
            data = self._maps.get(i)
            if data is not None:
                _unmap_pages(data)

    def verify_all(self) -> None:
        """Size, checksum and layout of every shard: what `llm-data verify` reports."""
        keyless = self.encrypted and self.encryption is None  # no key: sizes and checksums (of the ciphertext) only
        for i, info in enumerate(self.shards):
            self._check_size(info)
            if keyless:
                self._verify(info, force=True)
                continue
            with self._lock:  # reopen: the checksum is checked again even if this shard was read before
                self._maps.pop(i, None)
                self._decompressed.pop(i, None)
                data = self._open(i, verify=True)
            self._check_layout(info, data, deep=True)

    def _per_process(self) -> dict:
        """The attributes each process makes anew (a lock, open descriptors): never pickled."""
        return {"_lock": threading.Lock(), "_fds": DescriptorPool()}

    def __getstate__(self) -> dict:
        # Workers reopen their own maps: memory maps and caches do not cross process boundaries.
        state = self.__dict__.copy()
        state["_maps"], state["_decompressed"] = {}, OrderedDict()
        for name in self._per_process():
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, **self._per_process())


def _unmap_pages(data: np.ndarray) -> None:
    raw = getattr(data, "_mmap", None)
    if raw is not None and hasattr(raw, "madvise"):
        raw.madvise(mmap.MADV_DONTNEED)


class PageReleaser:
    """When to hand back the pages a reader read through shard maps: each read adds its amount
    (tokens or bytes) plus `per_shard` for each shard it touched (the kernel maps ~64 KB around
    every faulted page); past `every`, `add` returns the shards touched since, to release."""

    def __init__(self, every: int, per_shard: int = 0):
        self.every, self.per_shard = every, per_shard
        self.amount, self.touched = 0, set()

    def add(self, amount: int, shards: set[int]) -> set[int]:
        self.touched |= shards
        self.amount += amount + self.per_shard * len(shards)
        if self.amount < self.every:
            return set()
        due, self.touched, self.amount = self.touched, set(), 0
        return due


_RELEASE_EVERY_TOKENS = 4 << 20
_FAULT_AROUND_TOKENS = 32 << 10  # a read through a map maps ~64 KB around it: counted as this many tokens

_PIN_AT_ONCE = 64  # shards whose descriptors one gather holds at a time (threads share the process's fds)


class TokenReader:
    """Reads any token range [start, stop) of the concatenation of all shards."""

    def __init__(self, folder: Path, manifest: Manifest, verify: bool = True, files: _ShardBytes | None = None):
        self.manifest = manifest
        self.files = files if files is not None else _ShardBytes(folder, manifest, verify)
        counts = manifest.column("tokens")
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.total = int(self.starts[-1])
        self._views: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._pages = PageReleaser(_RELEASE_EVERY_TOKENS, _FAULT_AROUND_TOKENS)

    def _shard(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, doc_ends) views of shard i."""
        views = self._views.get(i)
        if views is None:
            info = self.files.shards[i]
            raw = self.files.raw(i)
            n_bytes = info.tokens * np.dtype(info.dtype or self.manifest.dtype).itemsize
            tokens = raw[:n_bytes].view(f"<{np.dtype(info.dtype or self.manifest.dtype).str[1:]}")
            doc_ends = raw[n_bytes : n_bytes + 8 * info.documents].view("<u8")
            views = (tokens, doc_ends)
            if self.files.plain(info) and self.files.keep_views:
                self._views[i] = views
        return views

    def windows(self, i: int, width: int) -> np.ndarray:
        """Shard i as a zero-copy (tokens - width + 1, width) view: row r is tokens [r, r + width)."""
        tokens = self._shard(i)[0]
        if tokens.size < width:
            return tokens[:0].reshape(0, width)
        return np.lib.stride_tricks.sliding_window_view(tokens, width)

    def gather_blocks(self, starts: np.ndarray, width: int, out: np.ndarray, dest: np.ndarray | None = None) -> np.ndarray:
        """Fill out[dest[k]] (dest: k itself by default) with tokens [starts[k], starts[k] + width)
        where that range lies in one shard.

        Rows of plain shards are read in one loop of `preadv` calls, in file order (sorted by
        start: shard by shard, forward within each), whatever the number of shards they touch;
        others through their mapped or decompressed bytes, one fancy-indexing gather per shard.
        Straight into the caller's rows (a mixture fills one batch from several readers without
        a temporary); returns the k it could not serve (ranges crossing a shard boundary or the end).
        """
        shard = np.searchsorted(self.starts, starts, side="right") - 1
        fits = starts + width <= self.starts[np.minimum(shard + 1, len(self.starts) - 1)]
        groups = group_rows(np.flatnonzero(fits), shard, order=starts)  # file order: by shard, then by offset
        pinned = self.files.pinned_descriptors  # None where shards are not read by path
        plain = [(i, rows) for i, rows in groups if pinned is not None and self.files.plain(self.files.shards[i])]
        mapped = [(i, rows) for i, rows in groups if pinned is None or not self.files.plain(self.files.shards[i])]
        for i, rows in mapped:  # compressed or cached remote shards: through their bytes
            out[rows if dest is None else dest[rows]] = self.windows(i, width)[starts[rows] - self.starts[i]]
        for at in range(0, len(plain), _PIN_AT_ONCE):  # bounded: each pinned shard holds a descriptor
            self._read_plain(plain[at : at + _PIN_AT_ONCE], starts, width, out, dest)
        if mapped:
            self._count_read(sum(len(rows) for _, rows in mapped) * width, {i for i, _ in mapped})
        return np.flatnonzero(~fits)

    def _read_plain(self, groups: list[tuple[int, np.ndarray]], starts: np.ndarray, width: int, out: np.ndarray,
                    dest: np.ndarray | None) -> None:
        """The rows of each group (one plain shard each), pinned together and read in one loop."""
        shards = [i for i, _ in groups]
        dtypes = [np.dtype(self.files.shards[i].dtype or self.manifest.dtype) for i in shards]
        with self.files.pinned_descriptors(shards) as fds:
            for stored in dict.fromkeys(dtypes):  # one dtype in practice (a widened shard is uint32)
                chosen = [g for g, d in enumerate(dtypes) if d == stored]
                rows = np.concatenate([groups[g][1] for g in chosen])
                sizes = [len(groups[g][1]) for g in chosen]
                row_shard = np.repeat([shards[g] for g in chosen], sizes)
                row_fds = np.repeat([fds[g] for g in chosen], sizes).tolist()
                read_rows(row_fds, starts[rows] - self.starts[row_shard], width, stored, out,
                          rows if dest is None else dest[rows], lambda k, of=row_shard: self.files.path_of(int(of[k])))

    def gather_positions(
        self, starts: np.ndarray, width: int, out: np.ndarray, skip: np.ndarray, dest: np.ndarray | None = None
    ) -> None:
        """Fill out[dest[k]] with the position ids of block k (k in `skip` are left to `read`).

        Same values as `read`: 0 at the block start and at every document start inside the
        block. Per shard: the document ends inside each block are found with two searchsorted
        calls for all rows, marked, and turned into positions with one running maximum.
        """
        fits = np.ones(len(starts), dtype=bool)
        fits[skip] = False
        shard = np.searchsorted(self.starts, starts, side="right") - 1
        cols = np.arange(width, dtype=np.int64)
        groups = group_rows(np.flatnonzero(fits), shard)
        for i, rows in groups:
            doc_ends = self._shard(i)[1]
            local = starts[rows] - self.starts[i]
            lo = np.searchsorted(doc_ends, local.astype(np.uint64), side="right")
            hi = np.searchsorted(doc_ends, (local + width).astype(np.uint64), side="left")
            counts = (hi - lo).astype(np.int64)
            marks = np.zeros((len(rows), width), dtype=np.int64)
            total = int(counts.sum())
            if total:
                row_of = np.repeat(np.arange(len(rows)), counts)
                first = np.repeat(np.cumsum(counts) - counts, counts)
                ends = doc_ends[np.arange(total) - first + np.repeat(lo, counts)].astype(np.int64)
                offsets = ends - local[row_of]
                marks[row_of, offsets] = offsets
            np.maximum.accumulate(marks, axis=1, out=marks)
            out[rows if dest is None else dest[rows]] = cols - marks
        self._count_read(0, {i for i, _ in groups})  # the document ends were read through the maps

    def _count_read(self, tokens: int, shards: set[int]) -> None:
        # Reads through maps keep the pages they touched: hand back those of the shards read, now
        # and then (PageReleaser), so that RSS stays flat with data size and shard count.
        due = self._pages.add(tokens, shards)
        if due:
            self.files.release_pages(due)

    def read(self, start: int, stop: int, out: np.ndarray, positions: np.ndarray | None = None) -> None:
        """Fill out[:stop-start] with tokens; positions (if given) restart at 0 at each document start.

        Positions are block-relative: the first token of the range is position 0 even
        mid-document, since attention never reaches across a block boundary.
        """
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        pos = 0
        resets = [0] if positions is not None else None
        touched = set()
        while start < stop:
            touched.add(i)
            tokens, doc_ends = self._shard(i)
            a, b = start - int(self.starts[i]), min(stop, int(self.starts[i + 1])) - int(self.starts[i])
            out[pos : pos + b - a] = tokens[a:b]
            if resets is not None:
                add_document_starts(resets, doc_ends, a, b, pos)
            pos += b - a
            start += b - a
            i += 1
        self._count_read(pos, touched)
        if positions is not None:
            positions_from_starts(resets, pos, positions)

    def verify(self) -> None:
        self.files.verify_all()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_views"] = {}
        return state


def verify_dataset(folder: Path | str) -> Manifest:
    """Check every shard of a dataset folder against its manifest (raises ShardError / ManifestError)."""
    manifest = Manifest.load(folder)
    _ShardBytes(Path(folder), manifest).verify_all()
    return manifest
