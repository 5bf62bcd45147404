"""Exact deduplication of text records: normalise, hash to a 16-byte digest, drop repeats.

Records are hashed a chunk at a time and probed against `seen_set.py`'s table.

Two ways to persist (the file layouts are `seen_file.py`'s):

* under `StreamingTextDataModule` / `llm-train` (crash-consistent): a digest counts
  once the checkpoint that carries it exists. The module's `checkpoint_state()`
  puts the digests consumed since the file's last commit into the state
  (`stage_commit()`); `save_checkpoint` appends them to the file
  (`publish_seen_hashes()`) only after the checkpoint is renamed into place. A
  crash before that leaves the file as it was (a restart from scratch trains those
  records again); a crash after it is finished by the resume, which appends the
  checkpoint's digests the file lacks and cuts off those of later, lost commits.
* on its own (`for text in source.iter_texts()`): each pass starts from the
  persisted baseline (the seen file as it was when the source was made) and
  deduplicates within the pass; with `write_seen_hashes` the digests of the
  records it yields are appended as it goes (rank 0 only), so a later process
  over the same data skips them.

Either way a digest is written once, as the guide's framework writes it: a writer keeps
the set of digests its file holds (or will, once staged), so a second pass, records read
again after `reset_cross_run_seen()`, or two copies read at once by two workers add
nothing twice (about 32 more bytes a record, for writers only).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.inputs.seen_file import (
    DIGEST_BYTES,
    NEW_LAYOUT,
    SeenFileError,
    append_digests,
    cut_to,
    encode,
    read_seen_file,
    truncate_to,
)
from llm.data.inputs.seen_set import SeenSet, _pairs, first_occurrences
from llm.data.inputs.source import Partition, Record, RecordFilter, TextSource
from llm.data.topology import current_topology

IN_MEMORY_WARNING = (
    "DedupTextSource is running with in-memory only state: records seen in this run are "
    "forgotten when it ends; set seen_hashes_path and write_seen_hashes to persist them"
)
FAST_HASHES = ("xxh3_128",)
_CHUNK = 1024  # records hashed and probed together: enough to amortise numpy's per-call cost
_APPEND_EVERY = 1024  # standalone passes append this many digests at a time


def collapse_whitespace(text: str) -> str:
    """The default normalisation (`llm.data.dedup.normalize`): whitespace runs to one space, ends stripped, case kept.

    The same string as the guide's framework's `re.sub(r"\\s+", " ", text.strip())` for every
    input (both use Python's whitespace; tests/data/text/test_normalize.py), so their digests match.
    """
    return " ".join(text.split())


def valid_hash_algos() -> list[str]:
    return sorted({*FAST_HASHES, *hashlib.algorithms_guaranteed})


def digest_size(algo: str) -> int:
    """The bytes of `algo`'s full digest, as the guide's seen-hashes file writes it (hex: twice that)."""
    if algo == "xxh3_128" or algo.startswith("shake_"):
        return 2 * DIGEST_BYTES if algo.startswith("shake_") else DIGEST_BYTES
    check_hash_algo(algo)
    return hashlib.new(algo).digest_size


def check_hash_algo(algo: str) -> str:
    """`algo` itself when it is `xxh3_128` or a hashlib name, else one sentence listing the valid names."""
    if algo in FAST_HASHES:
        return algo
    try:
        hashlib.new(algo)
    except (ValueError, TypeError):
        raise ValueError(
            f"hash_algo {algo!r} is unsupported (not a hashlib algorithm nor xxh3_128); use one of: "
            f"{', '.join(valid_hash_algos())}"
        ) from None
    return algo


def hasher(algo: str, full: bool = False) -> Callable[[bytes], bytes]:
    """A function bytes -> digest for `algo` (`xxh3_128` or any hashlib name): its first 16 bytes, or all of it.

    16 bytes of any cryptographic hash are plenty for exact-duplicate detection: that is
    the in-memory key; `full` digests are what the guide's seen-hashes file holds.
    """
    check_hash_algo(algo)
    if algo == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128_digest
    size = digest_size(algo)
    if algo.startswith("shake_"):
        length = size if full else DIGEST_BYTES
        return lambda data: hashlib.new(algo, data).digest(length)  # type: ignore[call-arg]
    if full:
        return lambda data: hashlib.new(algo, data).digest()
    return lambda data: hashlib.new(algo, data).digest()[:DIGEST_BYTES].ljust(DIGEST_BYTES, b"\0")


def text_digest(text: str, algo: str = "sha256") -> bytes:
    """The 16-byte digest of a record after the default normalisation."""
    return hasher(algo)(collapse_whitespace(text).encode("utf-8"))


def _named(fn: Callable[[str], str]) -> str:
    if fn is collapse_whitespace:
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
        self._hash = hasher(hash_algo, full=True)  # an unknown algorithm fails here, naming the valid ones
        self.digest_bytes = digest_size(hash_algo)  # records carry full digests: the guide's file holds them
        self.normalize = normalize or collapse_whitespace
        self.seen_hashes_path = Path(seen_hashes_path) if seen_hashes_path else None
        self.write_seen_hashes = bool(write_seen_hashes)
        if self.write_seen_hashes and not self.seen_hashes_path:
            raise ValueError("seen_hashes_path is required when write_seen_hashes is true")
        if not (self.seen_hashes_path and self.write_seen_hashes):
            warnings.warn(IN_MEMORY_WARNING, stacklevel=2)
        # committed: seen by training (persisted + handed to the caller); local: read by this reader
        self.committed = SeenSet()
        self.committed_count = 0  # digests the seen-hashes file holds (committed)
        self._layout: str | None = None  # the file's layout (None: no file yet)
        self._size = 0  # the file's bytes holding exactly those digests
        self._staged = b""  # digests in checkpoint states, not yet known to be in the file
        self._baseline = b""  # 16-byte digests persisted when this source was made (or a state loaded)
        self._local = SeenSet()
        self._written = SeenSet()  # writers: the digests the file holds or will (staged): never written twice
        self.stats = {"read": 0, "seen_before": 0, "repeated": 0}
        # a stream with a run ledger sets this in its reader: dropped records come out with an empty
        # digest (b""), so the ledger counts them as accounted for instead of missing
        self.report_drops = False
        if self.seen_hashes_path:
            self.load_committed()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_hash"] = None  # some hashers do not pickle; rebuilt from hash_algo
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._hash = hasher(self.hash_algo, full=True)

    @property
    def writes(self) -> bool:
        return bool(self.seen_hashes_path and self.write_seen_hashes)

    # -- persistence ---------------------------------------------------------------------------
    def load_committed(self, count: int | None = None, base: int | None = None, staged: bytes = b"") -> None:
        """Load the first `count` digests (all when None) of the seen-hashes file as committed.

        `base` and `staged`: the checkpoint being loaded continues a file of `base` digests
        with `staged` ones; a file that lacks them (the checkpoint landed, the crash came
        before they were appended) gets them now. With writing on (rank 0), digests after
        the state's (committed by a run that crashed before its checkpoint landed) are cut
        off the file; a file that is only read is never modified.
        """
        self.committed, self._local, self._written = SeenSet(), SeenSet(), SeenSet()
        self.committed_count, self._baseline, self._staged = 0, b"", b""
        self._layout, self._size = None, 0
        if not self.seen_hashes_path:
            return
        seen = read_seen_file(self.seen_hashes_path, self.hash_algo, self.digest_bytes)
        held = seen.count if seen else 0
        count = held if count is None else count
        if held < count and (base is None or held < base):
            what = "is missing" if seen is None else f"holds {held} digests"
            raise SeenFileError(f"seen-hashes file {self.seen_hashes_path} {what} but the data state expects {count} digests in it")
        committed, staged = (count, b"") if held >= count else (base or 0, staged)
        writer = self.writes and current_topology()[0] == 0
        if seen is not None:
            if writer:
                truncate_to(seen, committed)  # forget digests committed after this state was saved
            self._layout, self._size = seen.layout, cut_to(seen, committed)
        self._baseline = (seen.digests if seen else b"")[: committed * DIGEST_BYTES]
        self.committed.update(self._baseline)
        self.committed_count = committed
        if staged:
            self.mark_consumed(staged)
            self._baseline += _pairs(staged, self.digest_bytes).astype("<u8").tobytes()
            self._staged = staged
            if writer:
                self._publish_staged()
        if self.writes:
            self._written.update(self._baseline)

    def restore_committed(self, seen: dict | None) -> None:
        """Continue from a data state's `seen_hashes` entry (None or one without a path: the file whole)."""
        if not seen or not seen.get("path"):
            self.load_committed()  # a state saved without a seen-hashes file says nothing about this one
            return
        self.load_committed(seen["count"], seen.get("base"), seen.get("digests", b""))

    def reset_cross_run_seen(self) -> None:
        """Forget what earlier runs saw (the seen-hashes baseline): their records are read again.

        Deduplication within a pass stays (a pass in progress keeps its own set), and the
        file is not touched: digests appended later still go after the ones it holds.
        """
        self._baseline = b""
        self.committed = SeenSet()

    def mark_consumed(self, digests: bytes) -> None:
        """Records handed to training: they count as seen from now on."""
        self.committed.update(_pairs(digests, self.digest_bytes))

    def commit(self, digests: bytes) -> int:
        """Append newly consumed digests to the file now (when writing is on); returns the committed count.

        For standalone passes; under a checkpoint use `stage_commit()` and `publish_seen_hashes()`.
        """
        digests = self._unwritten(digests) if self.writes else b""
        if digests:
            self.committed_count, self._size = append_digests(
                self.seen_hashes_path, digests, self.hash_algo, self.digest_bytes  # type: ignore[arg-type]
            )
            self._layout = self._layout or NEW_LAYOUT
        return self.committed_count

    def stage_commit(self, digests: bytes) -> dict[str, Any]:
        """The `seen_hashes` entry of a checkpoint's data state: `digests` join it, not the file (yet).

        The entry carries every digest the file is not known to hold (`base` digests are);
        `publish_seen_hashes()` appends them once the checkpoint is on disk. Whether the
        previous entry was published is read off the file's size, so a state taken for a
        checkpoint that never landed only makes the next entry longer.
        """
        entry: dict[str, Any] = {"path": str(self.seen_hashes_path or ""), "count": self.committed_count, "pending": 0}
        if not self.writes:
            return entry
        if self._staged and self._published_size() == self._file_size():
            self.committed_count += len(self._staged) // self.digest_bytes
            self._size, self._layout, self._staged = self._published_size(), self._layout or NEW_LAYOUT, b""
        self._staged += self._unwritten(digests)
        return {**entry, "count": self.committed_count + len(self._staged) // self.digest_bytes,
                "base": self.committed_count, "digests": self._staged, "hash_algo": self.hash_algo}

    def _unwritten(self, digests: bytes) -> bytes:
        """The digests (full width) not in the file nor staged for it, each once; from now on they count as written."""
        if not digests:
            return b""
        pairs = _pairs(digests, self.digest_bytes)
        new = first_occurrences(pairs) & ~self._written.contains_many(pairs)
        self._written.insert_new(pairs[new])
        return np.frombuffer(digests, dtype=np.uint8).reshape(-1, self.digest_bytes)[new].tobytes()

    def _file_size(self) -> int:
        try:
            return self.seen_hashes_path.stat().st_size  # type: ignore[union-attr]
        except FileNotFoundError:
            return 0

    def _published_size(self) -> int:
        """The file's size once the staged digests are appended to it."""
        return self._size + len(encode(self._layout or NEW_LAYOUT, self._staged, self.digest_bytes))

    def _publish_staged(self) -> None:
        self.committed_count, self._size = append_digests(
            self.seen_hashes_path, self._staged, self.hash_algo, self.digest_bytes, base=self.committed_count  # type: ignore[arg-type]
        )
        self._layout, self._staged = self._layout or NEW_LAYOUT, b""

    def begin(self) -> None:
        """A new reader starts: forget what the previous reader read but did not hand over."""
        self._local = SeenSet()
        self.stats = {"read": 0, "seen_before": 0, "repeated": 0}

    # -- reading -------------------------------------------------------------------------------
    def digest(self, text: str) -> bytes:
        return self._hash(self.normalize(text).encode("utf-8", errors="replace"))

    def _new_mask(self, digests: bytes, seen: SeenSet, local: SeenSet) -> np.ndarray:
        """Which of a chunk's records are new: not in `seen`, not read before, first in the chunk."""
        pairs = _pairs(digests, self.digest_bytes)
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

    def iter_partition(self, part: Partition, offset: int = 0, want: RecordFilter = None) -> Iterator[Record]:
        # another stripe's records are dropped before hashing: their own reader dedups them
        records = (r for r in self.inner.iter_partition(part, offset, want) if want is None or want(r[1]))
        for chunk in _chunked(records):
            digests = b"".join(self.digest(text) for text, _, _ in chunk)
            width = self.digest_bytes
            new = self._new_mask(digests, self.committed, self._local)
            for i in range(len(chunk)) if self.report_drops else np.flatnonzero(new).tolist():
                text, after, _ = chunk[i]
                yield text, after, digests[i * width : (i + 1) * width] if new[i] else b""

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
                width = self.digest_bytes
                digest_of = {i: digests[k * width : (k + 1) * width] for k, i in enumerate(checked)}
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
    while chunk := list(islice(records, _CHUNK)):
        yield chunk


def publish_seen_hashes(state: Any) -> None:
    """Append the dedup digests a data state carries to its seen-hashes file: call once its checkpoint is on disk.

    `save_checkpoint` does so after its rename; a state without digests (no dedup, or
    nothing to write) changes nothing, and a file that holds them already is left alone.
    """
    entry = state.get("seen_hashes") if isinstance(state, dict) else None
    if not entry or not entry.get("digests"):
        return
    width = len(entry["digests"]) // (entry["count"] - entry["base"])
    append_digests(entry["path"], entry["digests"], entry["hash_algo"], width, base=entry["base"])
