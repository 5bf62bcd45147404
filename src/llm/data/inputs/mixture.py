"""Mixing several text sources (`data.datasets`): round_robin, weighted or random, resumable from counts alone.

Each consumer (rank x worker) draws its records from its own partitions of every
source. Which source the next record comes from is a pure function of how many
records (and tokens) this consumer has drawn from each source in the current pass (and,
for `random`, the seed and the consumer): those counts are the sums of the
partitions' cursors, so the mixture resumes exactly with no state of its own.
With `unit="tokens"` (`streaming_mixing_unit`) the weights are shares of tokens, not of
records: a record is encoded when drawn and the choice compares token counts.
A weight schedule (`mix_schedule.py`) counts from the cursors at its last change point
(the module's per-partition anchors), so each segment's shares follow its own weights.

* `round_robin` (the default): the live source with the fewest draws, lowest index first.
* `weighted`: the live source furthest behind its weight (a low-discrepancy schedule:
  the realised shares stay within one record of the weights at every point).
* `random`: a seeded draw by weight, from a hash of (seed, consumer, draw number); the seed is
  the stream's, derived from the one root seed per pass (`StreamingTextDataModule`).

A source whose partitions this consumer has read to the end drops out; the others go on.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import islice
from typing import Any

from llm.data.inputs.dedup import DedupTextSource
from llm.data.inputs.source import Partition, Record, RecordFilter, TextSource
from llm.data.mix.choosers import check_schedule, check_unit, check_weights, unique_names

_PREFIX = "d{}:"


class MixedTextSource(TextSource):
    """Several sources as one: partitions keyed `d<i>:<key>`, read by the dataset source by source and mixed."""

    def __init__(self, sources: list[TextSource], strategy: str = "round_robin",
                 weights: list[float] | None = None, buffer: int = 1000, unit: str = "records",
                 schedule: Any = None, names: Sequence[str] | None = None):
        if not sources:
            raise ValueError("datasets is empty; list at least one source to mix")
        self.sources = sources
        self.strategy = strategy
        self.schedule = check_schedule(schedule, len(sources), strategy, weights)
        self.weights = self.schedule.weights_at(0) if self.schedule else check_weights(weights, len(sources), strategy)
        self.unit = check_unit(unit)
        # the names as given (a resume that may change the sources refuses two alike) and as counted
        self.given_names = list(names or [f"datasets[{i}]" for i in range(len(sources))])
        self.names = unique_names(self.given_names)
        self.buffer = buffer  # records read ahead per source, at most

    def source_fingerprint(self) -> dict:
        # the strategy and weights may change on resume: the cursors stay valid, the new
        # mixture applies from the resume point
        return {"type": "mixture", "sources": [s.source_fingerprint() for s in self.sources]}

    def partitions(self) -> list[Partition]:
        out = []
        for i, source in enumerate(self.sources):
            prefix = _PREFIX.format(i)
            for p in source.partitions():
                out.append(replace(p, key=prefix + p.key, base=prefix + p.base if p.base else None, source=i))
        return out

    def _inner(self, part: Partition) -> Partition:
        prefix = _PREFIX.format(part.source)
        return replace(part, key=part.key[len(prefix):], base=part.base[len(prefix):] if part.base else None, source=0)

    def iter_partition(self, part: Partition, offset: int = 0, want: RecordFilter = None) -> Iterator[Record]:
        yield from self.sources[part.source].iter_partition(self._inner(part), offset, want)

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        """Every source's records one after another (the mixing happens per consumer, in the dataset)."""
        yield from islice((text for source in self.sources for text in source.iter_texts()), skip, None)

    def require_records(self, hint: str = "") -> None:
        """Every entry must hold a record: an empty one would silently leave its share to the others."""
        for i, source in enumerate(self.sources):
            source.require_records(f"fix or remove datasets[{i}] of the mixture")

    def wrapped(self) -> list[TextSource]:
        # begin() reaches every source through this: dedup sources inside a mixture keep their own seen-sets
        return list(self.sources)

    @property
    def stats(self) -> dict[str, int]:  # type: ignore[override]
        out: dict[str, int] = {}
        for s in self.sources:
            for k, v in s.stats.items():
                out[k] = out.get(k, 0) + v
        return out


class DedupMixture(DedupTextSource):
    """A mixture whose `dedup_local` / `dedup_hf` entries share one seen-set (the `data:` section's
    `seen_hashes_path`, `hash_algo`, `write_seen_hashes`); the other entries pass through.

    One seen-set for the whole mixture: a document in two deduplicated corpora is trained on
    once, and the checkpoint commits one seen-hashes file, as with a single dedup source.
    """

    def __init__(self, mixture: MixedTextSource, dedup_sources: set[int], **dedup: object):
        super().__init__(mixture, **dedup)  # type: ignore[arg-type]
        self.dedup_sources = frozenset(dedup_sources)

    def source_fingerprint(self) -> dict:
        return {**super().source_fingerprint(), "deduplicated": sorted(self.dedup_sources)}

    def iter_partition(self, part: Partition, offset: int = 0, want: RecordFilter = None) -> Iterator[Record]:
        if part.source in self.dedup_sources:
            yield from super().iter_partition(part, offset, want)
        else:
            yield from self.inner.iter_partition(part, offset, want)

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        tagged = ((text, i in self.dedup_sources) for i, s in enumerate(self.inner.sources) for text in s.iter_texts())
        return self._standalone_pass(tagged, skip)


def as_mixture(source: TextSource) -> MixedTextSource | None:
    """The mixture a source is (or a dedup layer over one); None for a single source."""
    if isinstance(source, MixedTextSource):
        return source
    if isinstance(source, DedupMixture):
        return source.inner  # type: ignore[return-value]
    return None
