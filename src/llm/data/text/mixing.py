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

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from itertools import islice
from typing import Any

from llm.data.mix_schedule import MixSchedule, parse_schedule
from llm.data.text.dedup import DedupTextSource
from llm.data.text.source import Partition, Record, RecordFilter, TextSource

STRATEGIES = ("round_robin", "weighted", "random")
UNITS = ("records", "tokens")
_PREFIX = "d{}:"


def check_weights(weights: list[float] | None, n: int, strategy: str) -> list[float]:
    """Weights for `n` sources: the given ones (same length, >= 0, summing to 1) or equal ones."""
    if strategy not in STRATEGIES:
        raise ValueError(f"streaming_dataset_mixing_strategy {strategy!r} is not known; use one of: {', '.join(STRATEGIES)}")
    if weights is None:
        if strategy == "weighted":
            raise ValueError("streaming_mixing_weights is required when streaming_dataset_mixing_strategy is weighted")
        return [1.0 / n] * n
    if len(weights) != n:
        raise ValueError(f"streaming_mixing_weights has {len(weights)} weights but datasets lists {n} datasets")
    for i, w in enumerate(weights):
        # NaN compares False with everything: `w < 0` let it through and `random` drew entry 0 only
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not math.isfinite(w) or w < 0:
            raise ValueError(
                f"streaming_mixing_weights[{i}] (datasets[{i}]) is {w!r}, but weights must be non-negative numbers "
                "(finite, summing to 1); fix that weight"
            )
    if not any(weights):
        raise ValueError("streaming_mixing_weights are all zero; give at least one dataset a positive weight")
    total = float(sum(weights))
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"streaming_mixing_weights must sum to 1 (within 1e-6), but they sum to {total:.9g}")
    return [float(w) for w in weights]


def check_unit(unit: str) -> str:
    """`streaming_mixing_unit`: what a weight is a share of."""
    if unit not in UNITS:
        raise ValueError(f"streaming_mixing_unit {unit!r} is not known; use records (shares of records) "
                         "or tokens (shares of the trained tokens)")
    return unit


def check_schedule(schedule: Any, n: int, strategy: str, weights: list[float] | None) -> MixSchedule | None:
    """`streaming_mixing_schedule` checked for `n` sources (None when not given)."""
    if schedule is None:
        return None
    if weights is not None:
        raise ValueError("give streaming_mixing_weights or streaming_mixing_schedule, not both "
                         "(a schedule's first point holds the weights from step 0)")
    if strategy == "round_robin":
        raise ValueError("streaming_mixing_schedule needs streaming_dataset_mixing_strategy weighted or random "
                         "(round_robin ignores weights)")
    return parse_schedule(schedule, n)


def unique_names(names: Sequence[str]) -> list[str]:
    """Source names for the accounting; a repeated name gets its index (`wiki`, `wiki#2`)."""
    out: list[str] = []
    for i, name in enumerate(names):
        out.append(name if name not in out else f"{name}#{i}")
    return out


def choose(strategy: str, live: list[int], counts: list[int], weights: list[float], seed: int, consumer: int,
           tokens: list[int] | None = None, drawn: int | None = None) -> int:
    """The source of the next draw, from the draws so far (`counts`, per source) and the live sources.

    `tokens` (per source) makes the weights shares of tokens (`choose_by_tokens`); `drawn` keys
    a random draw (default: the draws counted).
    """
    if tokens is not None:
        return choose_by_tokens(strategy, live, counts, tokens, weights, seed, consumer, drawn)
    if strategy == "round_robin":
        return min(live, key=lambda i: (counts[i], i))
    total_w = sum(weights[i] for i in live)
    if total_w <= 0:  # only zero-weight sources left: they are drawn in turn
        return min(live, key=lambda i: (counts[i], i))
    if strategy == "weighted":
        drawn = sum(counts[i] for i in live) + 1
        return max(live, key=lambda i: (weights[i] / total_w * drawn - counts[i], -i))
    return _draw(live, weights, total_w, seed, consumer, sum(counts) if drawn is None else drawn)


def choose_by_tokens(strategy: str, live: list[int], counts: list[int], tokens: list[int], weights: list[float],
                     seed: int, consumer: int, drawn: int | None = None) -> int:
    """The next source when weights are token shares: the live source furthest behind its share of tokens.

    Each source's tokens stay within one record of its share at every point (a low-discrepancy
    rule on tokens); `random` draws by weight / mean record length, so the expected token
    shares are the weights.
    """
    if strategy == "round_robin":
        weights = [1.0] * len(weights)
    total_w = sum(weights[i] for i in live)
    if total_w <= 0:  # only zero-weight sources left: the one with the fewest tokens
        return min(live, key=lambda i: (tokens[i], i))
    if strategy != "random":
        total = sum(tokens[i] for i in live)
        return max(live, key=lambda i: (weights[i] / total_w * total - tokens[i], weights[i], -i))
    seen = [tokens[i] / counts[i] for i in live if counts[i]]
    default = sum(seen) / len(seen) if seen else 1.0  # a source not drawn yet: the others' mean length
    rates = [0.0] * len(weights)
    for i in live:
        rates[i] = weights[i] / max(tokens[i] / counts[i] if counts[i] else default, 1e-9)
    return _draw(live, rates, sum(rates), seed, consumer, sum(counts) if drawn is None else drawn)


def _draw(live: list[int], weights: list[float], total_w: float, seed: int, consumer: int, k: int) -> int:
    """A seeded draw among the live sources by weight, keyed by (seed, consumer, draw number)."""
    digest = hashlib.blake2b(f"{seed}:{consumer}:{k}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "little") / 2**64 * total_w
    for i in live:
        u -= weights[i]
        if u < 0:
            return i
    return live[-1]


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
        self.names = unique_names(names or [f"datasets[{i}]" for i in range(len(sources))])
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
