"""Exact deduplication of text records: normalise, hash to a 16-byte digest, drop repeats.

Memory per seen record is a fixed 16-byte digest in a numpy open-addressing
table (about 32 bytes a record at the maximum load factor of 1/2), so tens of
millions of records fit in a few hundred MB.

Persistence is crash-safe: the seen-hashes file is an append-only log of
digests, appended only by `commit()` (called when the data state is saved for a
checkpoint); the state stores how many digests it covers. Loading that state
truncates the file to that count, so digests written after the last checkpoint
(by a run that then crashed) never mark records as seen that training did not
consume from that checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from llm.data.text.sources import Partition, Record, TextSource, Want

DIGEST_BYTES = 16
IN_MEMORY_WARNING = (
    "DedupTextSource is running with in-memory only state: records seen in this run are "
    "forgotten when it ends; set seen_hashes_path and write_seen_hashes to persist them"
)


def normalize(text: str) -> str:
    """Collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


def hasher(algo: str):
    """A function text -> 16-byte digest for `algo` (`xxh3_128` or any hashlib name)."""
    if algo == "xxh3_128":
        import xxhash

        return lambda data: xxhash.xxh3_128_digest(data)
    try:
        hashlib.new(algo)
    except (ValueError, TypeError):
        raise ValueError(f"hash_algo {algo!r} is not a hashlib algorithm or xxh3_128") from None
    if algo.startswith("shake_"):
        return lambda data: hashlib.new(algo, data).digest(DIGEST_BYTES)  # type: ignore[call-arg]
    # 128 bits of any cryptographic hash are plenty for exact-duplicate detection
    return lambda data: hashlib.new(algo, data).digest()[:DIGEST_BYTES].ljust(DIGEST_BYTES, b"\0")


def text_digest(text: str, algo: str = "sha256") -> bytes:
    """The 16-byte digest of a record after normalisation."""
    return hasher(algo)(normalize(text).encode("utf-8"))


def _pairs(digests: bytes | np.ndarray) -> np.ndarray:
    """Digests (concatenated bytes or an (n, 2) array) as an (n, 2) uint64 array."""
    if isinstance(digests, np.ndarray):
        return digests.reshape(-1, 2).astype(np.uint64, copy=False)
    return np.frombuffer(digests, dtype="<u8").reshape(-1, 2)


class SeenSet:
    """A set of 16-byte digests in two numpy uint64 arrays (open addressing, linear probing)."""

    def __init__(self, capacity: int = 1 << 12):
        size = 1 << max(4, (2 * capacity - 1).bit_length())
        self._hi = np.zeros(size, dtype=np.uint64)
        self._lo = np.zeros(size, dtype=np.uint64)
        self._zero_hi: set[int] = set()
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @staticmethod
    def _key(digest: bytes) -> tuple[int, int]:
        return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:16], "little")

    def _find(self, hi: int, lo: int) -> tuple[int, bool]:
        mask = len(self._hi) - 1
        i = lo & mask
        while True:
            h = int(self._hi[i])
            if h == 0:
                return i, False
            if h == hi and int(self._lo[i]) == lo:
                return i, True
            i = (i + 1) & mask

    def __contains__(self, digest: bytes) -> bool:
        hi, lo = self._key(digest)
        return lo in self._zero_hi if hi == 0 else self._find(hi, lo)[1]

    def add(self, digest: bytes) -> bool:
        """Add one digest; True when it was new."""
        hi, lo = self._key(digest)
        if hi == 0:
            return self._add_zero(lo)
        i, found = self._find(hi, lo)
        if found:
            return False
        self._hi[i], self._lo[i] = hi, lo
        self._n += 1
        if 2 * self._n > len(self._hi):
            self._grow()
        return True

    def update(self, digests: bytes | np.ndarray) -> None:
        """Add many digests at once (vectorised)."""
        pairs = _pairs(digests)
        zero = pairs[:, 0] == 0
        for lo in pairs[zero, 1].tolist():
            self._add_zero(lo)
        pairs = pairs[~zero]
        if not len(pairs):
            return
        keys = np.unique(pairs, axis=0)
        present = np.array([self._find(int(h), int(v))[1] for h, v in keys]) if self._n else None
        if present is not None:
            keys = keys[~present]
        while 2 * (self._n + len(keys)) > len(self._hi):
            self._resize(2 * len(self._hi))
        self._bulk_insert(keys[:, 0], keys[:, 1])

    def _add_zero(self, lo: int) -> bool:
        # hi == 0 marks an empty slot, so these (about 2**-64 of real digests) live aside
        if lo in self._zero_hi:
            return False
        self._zero_hi.add(lo)
        self._n += 1
        return True

    def _bulk_insert(self, hi: np.ndarray, lo: np.ndarray) -> None:
        mask = np.uint64(len(self._hi) - 1)
        pos = lo & mask
        pending = np.arange(len(hi))
        while len(pending):
            p = pos[pending]
            free = self._hi[p] == 0
            cand = pending[free]
            _, first = np.unique(pos[cand], return_index=True)
            winners = cand[first]
            self._hi[pos[winners]] = hi[winners]
            self._lo[pos[winners]] = lo[winners]
            self._n += len(winners)
            pending = np.setdiff1d(pending, winners, assume_unique=True)
            pos[pending] = (pos[pending] + np.uint64(1)) & mask

    def _grow(self) -> None:
        self._resize(2 * len(self._hi))

    def _resize(self, size: int) -> None:
        used = self._hi != 0
        hi, lo = self._hi[used], self._lo[used]
        self._hi = np.zeros(size, dtype=np.uint64)
        self._lo = np.zeros(size, dtype=np.uint64)
        self._n = len(self._zero_hi)
        self._bulk_insert(hi, lo)

    def nbytes(self) -> int:
        return self._hi.nbytes + self._lo.nbytes


def read_seen_file(path: str | Path, count: int | None = None) -> bytes:
    """The first `count` digests (all when None) of a seen-hashes file; the rest is cut off."""
    path = Path(path)
    if not path.exists():
        if count:
            raise ValueError(
                f"seen-hashes file {path} is missing but the data state expects {count} digests in it"
            )
        return b""
    size = path.stat().st_size
    if count is None:
        count = size // DIGEST_BYTES  # a torn last digest (crash mid-append) is dropped
    if count * DIGEST_BYTES > size:
        raise ValueError(
            f"seen-hashes file {path} holds {size // DIGEST_BYTES} digests but the data state expects {count}"
        )
    if size != count * DIGEST_BYTES:
        with open(path, "r+b") as f:  # forget digests committed after this state was saved
            f.truncate(count * DIGEST_BYTES)
    return path.read_bytes()


def append_seen_file(path: str | Path, digests: bytes) -> int:
    """Append digests durably; returns the number of digests now in the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(digests)
        f.flush()
        os.fsync(f.fileno())
        return f.tell() // DIGEST_BYTES


class DedupTextSource(TextSource):
    """Drops records whose normalised text was seen before (in this run or a committed one)."""

    def __init__(
        self,
        inner: TextSource,
        hash_algo: str = "sha256",
        seen_hashes_path: str | Path | None = None,
        write_seen_hashes: bool = False,
    ):
        self.inner = inner
        self.hash_algo = hash_algo
        self._hash = hasher(hash_algo)
        self.seen_hashes_path = Path(seen_hashes_path) if seen_hashes_path else None
        self.write_seen_hashes = write_seen_hashes
        if not (self.seen_hashes_path and write_seen_hashes):
            warnings.warn(IN_MEMORY_WARNING, stacklevel=2)
        # committed: seen by training (loaded + handed to the caller); local: read by this iterator
        self.committed = SeenSet()
        self.committed_count = 0
        self._local = SeenSet()
        if self.seen_hashes_path:
            self.load_committed()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_hash"] = None  # lambdas do not pickle; rebuilt from hash_algo
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._hash = hasher(self.hash_algo)

    def load_committed(self, count: int | None = None) -> None:
        """Load the first `count` committed digests from the seen-hashes file."""
        self.committed = SeenSet()
        if self.seen_hashes_path:
            data = read_seen_file(self.seen_hashes_path, count)
            self.committed.update(data)
            self.committed_count = len(data) // DIGEST_BYTES
        self._local = SeenSet()

    def mark_consumed(self, digests: bytes) -> None:
        """Records handed to training: they count as seen from now on."""
        self.committed.update(digests)

    def commit(self, digests: bytes) -> int:
        """Persist newly consumed digests (when writing is on); returns the committed count."""
        if self.seen_hashes_path and self.write_seen_hashes and digests:
            self.committed_count = append_seen_file(self.seen_hashes_path, digests)
        return self.committed_count

    def begin(self) -> None:
        """A new pass of reading starts: forget what the previous reader read but did not hand over."""
        self._local = SeenSet()

    def digest(self, text: str) -> bytes:
        return self._hash(normalize(text).encode("utf-8"))

    def _is_new(self, digest: bytes) -> bool:
        return digest not in self.committed and self._local.add(digest)

    def source_fingerprint(self) -> dict:
        return {
            "type": "dedup",
            "inner": self.inner.source_fingerprint(),
            "hash_algo": self.hash_algo,
            "normalize": "collapse-whitespace",
        }

    def partitions(self) -> list[Partition]:
        return self.inner.partitions()

    def iter_partition(self, part: Partition, offset: int = 0, want: Want = None) -> Iterator[Record]:
        for text, after, _ in self.inner.iter_partition(part, offset, want):
            if want is not None and not want(after):
                continue  # another stripe's record: its reader dedups it
            d = self.digest(text)
            if self._is_new(d):
                yield text, after, d

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        for text in self.inner.iter_texts():
            if self._is_new(self.digest(text)):
                if skip:
                    skip -= 1
                    continue
                yield text
