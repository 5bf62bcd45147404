"""Axolotl's `val_set_size` without streaming: a seeded held-out split of the `datasets:` records, never trained on.

A record is named by where it lives, `(entry, partition key, offset after it)`: both are
fixed by the files (partitions do not depend on the topology), so the split is the same
in every process, on every rank and worker, and in a resumed run. One pass reads every
record once (the pass that counts an epoch's steps anyway), draws the held-out records
with the config's seed, and each entry's source is wrapped twice: the training side
drops them, the validation side keeps only them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np

from llm.data.inputs.errors import InputError
from llm.data.inputs.source import Partition, Record, RecordFilter, TextSource

RecordId = tuple[str, int]  # (partition key, offset after the record) within one entry's source


def held_out_count(val_set_size: float, records: int, what: str) -> int:
    """How many of `records` to hold out: a fraction below 1 (rounded up, as HF's train_test_split), else a count."""
    if val_set_size < 0 or not math.isfinite(val_set_size):
        raise InputError(f"val_set_size is {val_set_size!r}; give a fraction in [0, 1) or a record count")
    if val_set_size >= 1 and val_set_size != int(val_set_size):
        raise InputError(f"val_set_size={val_set_size} is a count (>= 1) but not a whole number; give a fraction "
                         "below 1 or a whole number of records")
    count = math.ceil(val_set_size * records) if val_set_size < 1 else int(val_set_size)
    if count >= records:
        raise InputError(f"val_set_size={val_set_size} holds out {count} of the {records} records of {what}, "
                         "leaving none to train on; lower val_set_size")
    return count


def record_ids(source: TextSource) -> list[RecordId]:
    """Every record of a source, in partition order, by (partition key, offset after it)."""
    return [(part.key, offset) for part in source.partitions() for _, offset, _ in source.iter_partition(part)]


@dataclass(frozen=True)
class HeldOutSplit:
    """The records held out of each entry's source, drawn with `seed` from all the entries' records together."""

    val_set_size: float
    seed: int
    held: tuple[frozenset[RecordId], ...]  # per entry
    records: int  # all records of all entries

    @classmethod
    def draw(cls, sources: Sequence[TextSource], val_set_size: float, seed: int, what: str) -> HeldOutSplit:
        ids = [(i, rid) for i, source in enumerate(sources) for rid in record_ids(source)]
        if not ids:
            raise InputError(f"{what} hold no record")
        count = held_out_count(val_set_size, len(ids), what)
        # a permutation by the config's seed: the first `count` records of it are the validation records
        picked = np.random.default_rng(seed).permutation(len(ids))[:count]
        held: list[set[RecordId]] = [set() for _ in sources]
        for k in picked.tolist():
            i, rid = ids[k]
            held[i].add(rid)
        return cls(val_set_size, seed, tuple(frozenset(h) for h in held), len(ids))

    @property
    def validation_records(self) -> int:
        return sum(len(h) for h in self.held)

    @property
    def training_records(self) -> int:
        return self.records - self.validation_records

    def digest(self) -> str:
        """A hash of the held-out record ids: a resume whose split would differ is refused by the fingerprint."""
        h = hashlib.blake2b(digest_size=8)
        for i, held in enumerate(self.held):
            for key, offset in sorted(held):
                h.update(f"{i}\0{key}\0{offset}\n".encode())
        return h.hexdigest()

    def side(self, sources: Sequence[TextSource], validation: bool) -> list[TextSource]:
        """Each entry's source with only its training records (or only its validation records)."""
        return [HeldOutSource(s, held, validation, self) for s, held in zip(sources, self.held)]


class HeldOutSource(TextSource):
    """One side of the split over one entry's source: its records minus (or only) the held-out ones."""

    def __init__(self, inner: TextSource, held: frozenset[RecordId], validation: bool, split: HeldOutSplit):
        self.inner = inner
        self.held = held
        self.validation = validation
        self.split = split

    def partitions(self) -> list[Partition]:
        return self.inner.partitions()

    def source_fingerprint(self) -> dict:
        split = self.split
        return {
            **self.inner.source_fingerprint(),
            "held_out": {"side": "validation" if self.validation else "training", "val_set_size": split.val_set_size,
                         "seed": split.seed, "records": split.records, "held": split.validation_records,
                         "ids": split.digest()},
        }

    def iter_partition(self, part: Partition, offset: int = 0, want: RecordFilter = None) -> Iterator[Record]:
        # the dataset reads base partitions (stripes share one pass), so `part.key` is the id's key
        for record in self.inner.iter_partition(part, offset, want):
            if ((part.key, record[1]) in self.held) == self.validation:
                yield record

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        kept = (text for part in self.partitions() for text, _, _ in self.iter_partition(part))
        yield from islice(kept, skip, None)


def redraw_held_out(sources: Sequence[TextSource], spec: dict) -> tuple[frozenset[RecordId], ...] | None:
    """The held-out records of each entry drawn again for the audit from the sources as stored now and the split a
    source's fingerprint records (`held_out`); None when the draw no longer gives the run's split (its ids differ)."""
    split = HeldOutSplit.draw(sources, float(spec["val_set_size"]), int(spec["seed"]), "the ledger's sources")
    return split.held if split.digest() == spec.get("ids") else None
