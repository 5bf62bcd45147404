"""Exact deduplication of text records: normalise, hash to a 16-byte digest, drop repeats.

Memory per seen record is a fixed 16-byte digest in a numpy open-addressing
table (about 32 bytes a record at the maximum load factor of 1/2), so tens of
millions of records fit in a few hundred MB. Records are hashed and probed a
chunk at a time (vectorised), not one Python lookup per record.

Two ways to persist (the file layouts are `seen_file.py`'s):

* under `StreamingTextDataModule` / `llm-train` (crash-consistent): digests are
  appended only by `commit()`, called by the module's `checkpoint_state()` when a
  checkpoint is written, and the state stores how many digests it covers; loading
  it forgets digests committed later by a run that then crashed.
* on its own (`for text in source.iter_texts()`): each pass starts from the
  persisted baseline (the seen file as it was when the source was made) and
  deduplicates within the pass; with `write_seen_hashes` the digests of the
  records it yields are appended as it goes (rank 0 only), so a later process
  over the same data skips them.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from llm.data.text.seen_file import (
    DIGEST_BYTES,
    SeenFileError,
    append_digests,
    read_seen_file,
    truncate_to,
)
from llm.data.text.seen_set import SeenSet, _pairs, first_occurrences
from llm.data.text.source import Partition, Record, TextSource, Want
from llm.data.topology import current_topology

IN_MEMORY_WARNING = (
    "DedupTextSource is running with in-memory only state: records seen in this run are "
    "forgotten when it ends; set seen_hashes_path and write_seen_hashes to persist them"
)
FAST_HASHES = ("xxh3_128",)
_CHUNK = 1024  # records hashed and probed together: enough to amortise numpy's per-call cost
_APPEND_EVERY = 1024  # standalone passes append this many digests at a time


def normalize(text: str) -> str:
    """The documented normalisation: collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


default_normalize = normalize  # the parameter `normalize` of DedupTextSource shadows the name


def valid_hash_algos() -> list[str]:
    return sorted({*FAST_HASHES, *hashlib.algorithms_guaranteed})


def hasher(algo: str) -> Callable[[bytes], bytes]:
    """A function bytes -> 16-byte digest for `algo` (`xxh3_128` or any hashlib name)."""
    if algo == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128_digest
    try:
        hashlib.new(algo)
    except (ValueError, TypeError):
        raise ValueError(
            f"hash_algo {algo!r} is not a hashlib algorithm or xxh3_128; use one of: {', '.join(valid_hash_algos())}"
        ) from None
    if algo.startswith("shake_"):
        return lambda data: hashlib.new(algo, data).digest(DIGEST_BYTES)  # type: ignore[call-arg]
    # 128 bits of any cryptographic hash are plenty for exact-duplicate detection
    return lambda data: hashlib.new(algo, data).digest()[:DIGEST_BYTES].ljust(DIGEST_BYTES, b"\0")


def text_digest(text: str, algo: str = "sha256") -> bytes:
    """The 16-byte digest of a record after the default normalisation."""
    return hasher(algo)(normalize(text).encode("utf-8"))


def _named(fn: Callable[[str], str]) -> str:
    if fn is default_normalize:
        return "collapse-whitespace"
    owner = getattr(fn, "__objclass__", None)  # methods of built-in types (str.lower) have no __module__
    module = getattr(fn, "__module__", None) or getattr(owner, "__module__", "?")
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"


class DedupTextSource(TextSource):
    """Drops records whose normalised text was seen before (in this pass, or persisted / committed)."""

    def __init__(
        self,
        inner: TextSource,
        hash_algo: str = "sha256",
        seen_hashes_path: str | Path | None = None,
        write_seen_hashes: bool = False,
        normalize: Callable[[str], str] | None = None,
    ):
        self.inner = inner
        self.hash_algo = hash_algo
        self._hash = hasher(hash_algo)  # an unknown algorithm fails here, naming the valid ones
        self.normalize = normalize or default_normalize
        self.seen_hashes_path = Path(seen_hashes_path) if seen_hashes_path else None
        self.write_seen_hashes = bool(write_seen_hashes)
        if self.write_seen_hashes and not self.seen_hashes_path:
            raise ValueError("seen_hashes_path is required when write_seen_hashes is true")
        if not (self.seen_hashes_path and self.write_seen_hashes):
            warnings.warn(IN_MEMORY_WARNING, stacklevel=2)
        # committed: seen by training (persisted + handed to the caller); local: read by this reader
        self.committed = SeenSet()
        self.committed_count = 0
        self._baseline = b""  # digests persisted when this source was made (or a state loaded)
        self._local = SeenSet()
        self.stats = {"read": 0, "seen_before": 0, "repeated": 0}
        if self.seen_hashes_path:
            self.load_committed()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_hash"] = None  # some hashers do not pickle; rebuilt from hash_algo
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._hash = hasher(self.hash_algo)

    @property
    def writes(self) -> bool:
        return bool(self.seen_hashes_path and self.write_seen_hashes)

    # -- persistence ---------------------------------------------------------------------------
    def load_committed(self, count: int | None = None) -> None:
        """Load the first `count` digests (all when None) of the seen-hashes file as committed.

        With writing on, digests after `count` (committed by a run that crashed before
        its checkpoint) are cut off the file; a file that is only read is never modified.
        """
        self.committed, self._local = SeenSet(), SeenSet()
        self.committed_count, self._baseline = 0, b""
        if not self.seen_hashes_path:
            return
        seen = read_seen_file(self.seen_hashes_path, self.hash_algo)
        if seen is None:
            if count:
                raise SeenFileError(
                    f"seen-hashes file {self.seen_hashes_path} is missing but the data state expects {count} digests in it"
                )
            return
        if count is None:
            count = seen.count
        if count > seen.count:
            raise SeenFileError(
                f"seen-hashes file {self.seen_hashes_path} holds {seen.count} digests but the data state expects {count}"
            )
        if self.writes:
            truncate_to(seen, count)  # forget digests committed after this state was saved
        self._baseline = seen.digests[: count * DIGEST_BYTES]
        self.committed.update(self._baseline)
        self.committed_count = count

    def mark_consumed(self, digests: bytes) -> None:
        """Records handed to training: they count as seen from now on."""
        self.committed.update(digests)

    def commit(self, digests: bytes) -> int:
        """Persist newly consumed digests (when writing is on); returns the committed count."""
        if self.writes and digests:
            self.committed_count = append_digests(self.seen_hashes_path, digests, self.hash_algo)  # type: ignore[arg-type]
        return self.committed_count

    def begin(self) -> None:
        """A new reader starts: forget what the previous reader read but did not hand over."""
        self._local = SeenSet()
        self.stats = {"read": 0, "seen_before": 0, "repeated": 0}

    # -- reading -------------------------------------------------------------------------------
    def digest(self, text: str) -> bytes:
        return self._hash(self.normalize(text).encode("utf-8", errors="replace"))

    def _new_mask(self, digests: bytes, seen: SeenSet, local: SeenSet) -> np.ndarray:
        """Which of a chunk's records are new: not in `seen`, not read before, first in the chunk."""
        pairs = _pairs(digests)
        before = seen.contains_many(pairs)
        repeated = local.contains_many(pairs)
        new = ~before & ~repeated & first_occurrences(pairs)
        local.insert_new(pairs[new])
        self.stats["read"] += len(pairs)
        self.stats["seen_before"] += int(before.sum())
        self.stats["repeated"] += int((~before & ~new).sum())
        return new

    def source_fingerprint(self) -> dict:
        return {
            "type": "dedup",
            "inner": self.inner.source_fingerprint(),
            "hash_algo": self.hash_algo,
            "normalize": _named(self.normalize),
        }

    def partitions(self) -> list[Partition]:
        return self.inner.partitions()

    def iter_partition(self, part: Partition, offset: int = 0, want: Want = None) -> Iterator[Record]:
        # another stripe's records are dropped before hashing: their own reader dedups them
        records = (r for r in self.inner.iter_partition(part, offset, want) if want is None or want(r[1]))
        for chunk in _chunked(records):
            digests = b"".join(self.digest(text) for text, _, _ in chunk)
            for i in np.flatnonzero(self._new_mask(digests, self.committed, self._local)).tolist():
                text, after, _ = chunk[i]
                yield text, after, digests[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES]

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        """One standalone pass: new records only, against the persisted baseline and this pass.

        With `write_seen_hashes`, the digests of the records yielded are appended to the
        seen-hashes file as the pass goes (rank 0 only), the last ones when it ends or stops.
        """
        return self._standalone_pass(((text, True) for text in self.inner.iter_texts()), skip)

    def _standalone_pass(self, texts: Iterator[tuple[str, bool]], skip: int) -> Iterator[str]:
        """(text, deduplicate?) pairs to the texts kept; the others pass through untouched."""
        baseline, local = SeenSet(), SeenSet()
        baseline.update(self._baseline)
        writer = self.writes and current_topology()[0] == 0
        pending: list[bytes] = []
        try:
            for chunk in _chunked((text, 0, flag) for text, flag in texts):
                checked = [i for i, (_, _, flag) in enumerate(chunk) if flag]
                digests = b"".join(self.digest(chunk[i][0]) for i in checked)
                keep = np.ones(len(chunk), dtype=bool)
                new = self._new_mask(digests, baseline, local) if checked else np.zeros(0, dtype=bool)
                keep[checked] = new
                digest_of = {i: digests[k * DIGEST_BYTES : (k + 1) * DIGEST_BYTES] for k, i in enumerate(checked)}
                for i in np.flatnonzero(keep).tolist():
                    if skip:
                        skip -= 1
                        continue
                    if writer and i in digest_of:
                        pending.append(digest_of[i])
                        if len(pending) >= _APPEND_EVERY:
                            self.commit(b"".join(pending))
                            pending = []
                    yield chunk[i][0]
        finally:
            if pending:
                self.commit(b"".join(pending))

    def __iter__(self) -> Iterator[str]:
        return self.iter_texts()


def _chunked(records: Iterator[Record]) -> Iterator[list[Record]]:
    chunk: list[Record] = []
    for record in records:
        chunk.append(record)
        if len(chunk) == _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
