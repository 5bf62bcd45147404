"""The text-source contract: a stream of records, split into fixed partitions with resumable offsets.

A source is split into partitions that do not depend on the topology (files,
byte ranges of a big uncompressed file aligned to line ends, parquet row groups,
HF shards). `iter_partition(part, offset, want)` yields `(text, offset_after, digest)`;
`offset` is a byte offset (uncompressed local files: a resume seeks) or a row
count (compressed files, parquet, HF, custom sources: a resume re-skips rows).
How partitions are cut into stripes and dealt to ranks and workers is
`partitions.py`'s business; building a source from a config is `registry.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from llm.data.stage import StateError

Record = tuple[str, int, "bytes | None"]

# which records of a partition to read (by record number), None: all of them; a reader skips the rest cheaply
RecordFilter = Callable[[int], bool] | None


@dataclass(frozen=True)
class Partition:
    """One topology-independent piece of a source; `key` names it in cursors."""

    key: str
    path: str | None = None
    start: int = 0
    end: int | None = None
    shard: int | None = None
    seekable: bool = False  # offsets are byte positions (else row counts)
    stripe: int | None = None  # rows r with (r - 1) % stripes == stripe of the base partition
    stripes: int = 1
    base: str | None = None  # key of the partition this stripe cuts
    source: int = 0  # which source of a mixture (`mixing.MixedTextSource`) it belongs to

    @property
    def group(self) -> str:
        """Stripes of one base partition share a group: one reader serves them together."""
        return self.base or self.key

    def owns_row(self, row: int) -> bool:
        return self.stripe is None or (row - 1) % self.stripes == self.stripe


class TextSource:
    """A stream of stripped, non-empty text records.

    Subclasses must implement `iter_texts` and `source_fingerprint`; the default
    partitioning is a single partition resumed by skipping `offset` records.
    `config_keys` names the extra `data:` keys a source reads from its config
    (e.g. `("dataset_bucket", "dataset_key")`), so a misspelt key is caught when the
    config is read.
    """

    config_keys: ClassVar[tuple[str, ...]] = ()
    # What a pass read and dropped ({"read", "seen_before", ...}); a dedup source counts, others
    # keep this empty mapping. Declared here so readers never probe a source for it.
    stats: Mapping[str, int] = MappingProxyType({})
    # The one source a wrapping source (dedup) reads through; None for a source of its own.
    inner: TextSource | None = None

    def wrapped(self) -> list[TextSource]:
        """The sources this one reads through: a dedup source's `inner`, a mixture's sources."""
        return [self.inner] if self.inner is not None else []

    @property
    def uses_object_store(self) -> bool:
        """Whether some input is in object storage (its client does not survive fork())."""
        return any(s.uses_object_store for s in self.wrapped())

    def local_files(self) -> list[Any]:
        """The files this source reads (local paths or objects), for naming an empty input."""
        return [f for s in self.wrapped() for f in s.local_files()]

    def require_records(self, hint: str = "check the input") -> None:
        """Raise InputError naming the input when it holds no record at all (reads up to the first one)."""
        for s in self.wrapped():
            s.require_records(hint)

    def begin(self) -> None:
        """A new reader starts a pass; sources that keep per-pass state (dedup) reset it here."""
        for s in self.wrapped():
            s.begin()

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        """Every record in order, after skipping the first `skip` records."""
        raise NotImplementedError

    def source_fingerprint(self) -> dict:
        """A JSON-able description of everything that changes the stream."""
        raise NotImplementedError

    def partitions(self) -> list[Partition]:
        """The fixed list of partitions of this source."""
        return [Partition(key="all")]

    def iter_partition(self, part: Partition, offset: int = 0, want: RecordFilter = None) -> Iterator[Record]:
        """Records of one partition from `offset` on, each with the offset after it.

        `want(row)` (row-offset partitions only) may skip rows before they are parsed;
        callers filter again, so honouring it is an optimisation.
        """
        for i, text in enumerate(self.iter_texts(skip=offset), start=offset + 1):
            yield text, i, None


FINGERPRINT_MISMATCH = "stream source fingerprint mismatch"


def fingerprint_diff(saved: object, current: object, prefix: str = "") -> list[str]:
    """The keys where two fingerprints differ, as `key: saved -> current` lines (nested keys dotted)."""
    if isinstance(saved, dict) and isinstance(current, dict):
        out: list[str] = []
        for key in sorted(set(saved) | set(current), key=str):
            name = f"{prefix}{key}"
            if key not in saved:
                out.append(f"{name}: (absent) -> {current[key]!r}")
            elif key not in current:
                out.append(f"{name}: {saved[key]!r} -> (absent)")
            else:
                out.extend(fingerprint_diff(saved[key], current[key], f"{name}."))
        return out
    return [] if saved == current else [f"{prefix.rstrip('.') or 'fingerprint'}: {saved!r} -> {current!r}"]


def validate_source_fingerprint(saved: dict | None, current: dict) -> None:
    """Raise `stream source fingerprint mismatch` naming what differs when a state was saved for other data."""
    if saved == current:
        return
    if not isinstance(saved, dict):
        raise StateError(
            f"{FINGERPRINT_MISMATCH}: the state holds no source fingerprint (saved {saved!r}, current "
            f"{current!r}); resume with a state saved by this library"
        )
    diff = "; ".join(fingerprint_diff(saved, current))
    raise StateError(
        f"{FINGERPRINT_MISMATCH}: {diff} (saved -> current); resume with the data settings the state "
        "was saved with, or start a fresh run"
    )
