"""`CombinedStreamingDataset`: several optimized datasets mixed by a schedule that is a pure function of position.

The mixture holds its sources (composition): it plans, they read. Which source global
position P comes from is a periodic, low-discrepancy pattern: each block of `period`
slots holds exactly `quota[s]` slots of source s (weights.py), interleaved smoothly and
rotated by a seed derived from the mixture's. So any window of `period` consecutive slots
holds each source's quota exactly, and the number of samples source s gave before P is a
closed form: `(P // period) * quota[s] + prefix[s][P % period]`. Source s's q-th sample
is sample `q % n_s` of its own epoch `q // n_s`, in an order keyed by
`derive_seed(its seed, "mixture/source{s}", that epoch)`, so a source that runs out
starts its next epoch while the others go on, and two same-size sources with the same
seed still get different orders. Nothing depends on what was read: the loader's
position is the whole state, resume is O(1) and exact on any topology.

With `batching="per_batch"` a slot is one global batch (`samples_per_slot` = batch_size x
world size, set by the loader) instead of one sample: every global batch comes from one
source, and the counts are the same closed form times `samples_per_slot` plus the
position inside the current slot.

A combined epoch is `num_samples` positions: until the first source has given all
its samples (`iterate_over_all=False`) or until every source has (`True`), at the first
weights. Changing the weights on resume re-anchors the schedule at the saved per-source
counts: nothing consumed is repeated, the new mixture applies from there.

`schedule=` gives weights by step, samples or tokens (`mix/schedule.py`; one step is one
global batch, as the loader sets it): each change point starts a segment anchored at the
counts there (`mix/segments.py`, `plan.py`), positions still a pure function of the
position. A resume may change the global batch: the state keeps each step point reached
as the position where it took effect and per_batch's slot sizes (`resume.py`), so the past
is rebuilt as it was served. `allow_source_changes=True` lets a resume add or remove
sources (matched by name and fingerprint): kept ones continue their own counts, new ones
start at their beginning, removed ones' counts stay in `source_counts()`. `unit="tokens"` makes the
weights shares of tokens for item datasets whose samples differ in length (`tokens_of`
counts an item's tokens; each source's lengths are read once); token-block datasets have
equal samples, so there it is the same mixture. `source_counts()` gives the samples and
tokens each source has handed out, from the position alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from llm.data.mix.schedule import MixSchedule, parse_schedule
from llm.data.mix.segments import MixPlan, PeriodicPicker, TokenPicker
from llm.data.mix.weights import PERIOD, check_weights, quotas, slot_table
from llm.data.seeds import check_seed
from llm.data.shards.arrays import distinct
from llm.data.shards.mix.plan import Segments, segments
from llm.data.shards.mix.reading import MixReads
from llm.data.shards.mix.resume import (
    MIX_STATE_VERSION,
    MixHistory,
    SavedMix,
    check_batching,
    check_past,
    match_sources,
    read_saved,
    restart_history,
    served_units,
)
from llm.data.shards.mix.sources import check_sources, count_tokens, source_names
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.shards.read.source import Order, Resume, SampleSource

__all__ = ["CombinedStreamingDataset", "PERIOD", "quotas", "slot_table"]
BATCHING = ("stratified", "per_batch")
_MATERIALISE = 1 << 20  # samples: sources up to this size keep their epoch order as an array


UNITS = ("records", "tokens")


def check_unit(unit: str, batching: str) -> str:
    """What the weights are shares of: samples (`records`) or tokens; one sentence naming a bad value."""
    if unit not in UNITS:
        raise ValueError(f"unit={unit!r} is not known; use 'records' (shares of samples) or 'tokens' (shares of tokens)")
    if unit == "tokens" and batching == "per_batch":
        raise ValueError("unit='tokens' needs batching='stratified': per_batch gives whole global batches to one source")
    return unit


class CombinedStreamingDataset(MixReads, SampleSource):
    """Mix several `StreamingDataset`s (same kind, block size and tokenizer) by weight, with an exact resume."""

    def __init__(
        self,
        datasets: Sequence[StreamingDataset],
        weights: Sequence[float] | None = None,
        seed: int = 42,
        iterate_over_all: bool = True,
        batching: str = "stratified",
        schedule: Any = None,
        unit: str = "records",
        tokens_of: Callable[[Any], int] | None = None,
        allow_source_changes: bool = False,
    ):
        self.datasets: list[StreamingDataset] = check_sources(datasets)
        if batching not in BATCHING:
            raise ValueError(
                f"batching={batching!r} is not known; use 'stratified' (sources mixed within each batch by "
                "the weights) or 'per_batch' (each global batch from one source, sources by the weights)"
            )
        self.batching = batching
        self.samples_per_slot = 1  # 1, or the global batch with per_batch
        self.seed, self.iterate_over_all = check_seed(seed), iterate_over_all
        first = self.datasets[0]
        self.manifest, self.item_loader = first.manifest, first.item_loader
        tokens = first.manifest.kind == "tokens"
        self.block_size = first.block_size if tokens else None
        self.pad_id = first.pad_id if tokens else None
        self.token_dtype = first.token_dtype if tokens else None
        self.shuffle, self.epoch = True, 0
        self.input_dir = "CombinedStreamingDataset(" + ", ".join(str(d.input_dir) for d in self.datasets) + ")"
        self._orders: dict[tuple[int, int], Order] = {}
        windows = [d.shuffle_window for d in self.datasets]  # each source's own order; in the state
        self.shuffle_window = windows if any(w is not None for w in windows) else None
        subsamples, splits = [d.subsample for d in self.datasets], [d.split for d in self.datasets]
        self.subsample = subsamples if any(f != 1 for f in subsamples) else 1.0  # the sources' subsets, in the state
        self.split = splits if any(splits) else None
        self.sizes = np.array([d.num_samples for d in self.datasets], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self.fingerprint = hashlib.sha256(
            json.dumps([d.fingerprint for d in self.datasets] + [seed]).encode()
        ).hexdigest()
        self.names = source_names([str(d.input_dir) for d in self.datasets])
        self.folders = source_names([str(d.input_dir) for d in self.datasets], numbered=False)
        if not isinstance(allow_source_changes, bool):
            raise ValueError(f"allow_source_changes must be True or False, got {allow_source_changes!r}")
        self.allow_source_changes = allow_source_changes
        self.history = MixHistory()  # the past a resume rebuilds (resume.py); empty in a fresh run
        self.global_batch = 1  # batch_size x world size, set by the loader
        self.unit, self.tokens_of = check_unit(unit, batching), tokens_of
        self._lengths: list[np.ndarray] | None = None  # each item's tokens, per source (read when needed)
        if schedule is not None:
            if weights is not None:
                raise ValueError("give weights or schedule, not both (a schedule's first point holds the weights "
                                 "from step 0)")
            self.schedule: MixSchedule | None = parse_schedule(schedule, len(self.datasets), "schedule", sum_to_one=False)
            shares = self._shares(self.schedule.weights_at(0), "schedule[0].weights")
        else:
            self.schedule = None
            shares = self._shares(weights, "weights")
        self.reanchor(shares, np.zeros(len(self.datasets), dtype=np.int64))

    def __repr__(self) -> str:
        """Each source's location with its current weight, the samples of an epoch, and the block size."""
        sources = ", ".join(f"({str(d.input_dir)!r}, {w:.4g})" for d, w in zip(self.datasets, self.weights))
        size = f"block_size={self.block_size}" if self.block_size is not None else "kind='items'"
        return f"CombinedStreamingDataset(sources=[{sources}], samples={self.num_samples}, {size}, seed={self.seed})"

    def _shares(self, weights: Any, key: str) -> list[float]:
        return check_weights(weights, len(self.datasets), key, sizes=self.sizes.tolist(), names=self.names)

    def reanchor(self, weights: Sequence[float], counts: np.ndarray) -> None:
        """Start the plan of these (checked) weights at a point where source s had given counts[s]."""
        self.weights = list(weights)
        self.anchor = np.asarray(counts, dtype=np.int64)
        self._orders = {}
        starts, by_segment, per_slot = segments(
            self.schedule, self.weights, lambda w, at: self._shares(w, f"schedule at {self.schedule.unit} {at}"),
            self.history, self.global_batch, self.batching == "per_batch", self._tokens_position)
        self.plan = MixPlan(starts, by_segment, self.anchor, self._picker, per_slot)
        self.samples_per_slot = per_slot[0]
        first = self.plan.first()
        self.num_samples = first.epoch_end(self.sizes, self.iterate_over_all)
        if isinstance(first, PeriodicPicker):  # the first segment's table, as before schedules
            self.period, self.quota, self.slots = first.period, first.quota, first.slots

    def _tokens_position(self, tokens: int, so_far: Segments) -> int:
        """The first plan position at which the mixture has served `tokens` tokens (a tokens point)."""
        if tokens <= 0:
            return 0
        if self.manifest.kind == "tokens":
            return -(-tokens // int(self.block_size or 1))
        plan = MixPlan(*so_far[:2], self.anchor, self._picker, so_far[2])
        lo, hi = 0, 1
        while self._tokens_before(plan, hi) < tokens:
            lo, hi = hi, 2 * hi
        while lo < hi:  # the smallest position with at least `tokens` served before it
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if self._tokens_before(plan, mid) < tokens else (lo, mid)
        return lo

    def _tokens_before(self, plan: MixPlan, position: int) -> int:
        counts = plan.counts(np.array([position], dtype=np.int64))[:, 0]
        return sum(self._source_tokens(s, int(c) ) - self._source_tokens(s, int(a))
                   for s, (c, a) in enumerate(zip(counts, self.anchor)))

    def _source_tokens(self, s: int, n: int) -> int:
        """Tokens in source s's first n samples (over its own epochs)."""
        if self.manifest.kind == "tokens":
            return n * int(self.block_size or 0)
        full, rest = divmod(n, int(self.sizes[s]))
        return full * int(self.item_lengths()[s].sum()) + int(self._lengths_at(s, full * int(self.sizes[s]), rest).sum())

    def _picker(self, weights: list[float], anchor: np.ndarray, per_slot: int) -> PeriodicPicker | TokenPicker:
        if self.unit == "tokens" and self.manifest.kind == "items":
            return TokenPicker(weights, anchor, self._lengths_at)
        return PeriodicPicker(weights, self.seed, self.legacy_seeds, per_slot)

    def _lengths_at(self, s: int, first: int, n: int) -> np.ndarray:
        """Tokens of source s's samples number first .. first + n - 1 (in its own epochs' orders)."""
        lengths = self.item_lengths()[s]
        q = np.arange(first, first + n, dtype=np.int64)
        own_epoch, index = np.divmod(q, self.sizes[s])
        out = np.empty(n, dtype=np.int64)
        for e in distinct(own_epoch):
            at = own_epoch == e
            out[at] = lengths[self._source_order(s, int(e))(index[at])]
        return out

    def item_lengths(self) -> list[np.ndarray]:
        """Each source's items' token counts (`tokens_of`), read once."""
        if self._lengths is None:
            self._lengths = [count_tokens(d, self.tokens_of, name) for d, name in zip(self.datasets, self.names)]
            for s, lengths in enumerate(self._lengths):
                if self.unit == "tokens" and self.weights[s] > 0 and not lengths.any():
                    raise ValueError(f"datasets[{s}] ({self.names[s]}) has no tokens (tokens_of gives 0 for every "
                                     "item) but a positive weight; give it weight 0 or fix tokens_of")
        return self._lengths

    def source_counts(self, epoch: int | None = None, consumed: int = 0) -> dict[str, dict[str, int]]:
        """Samples and tokens each source has handed out before a position (the loader's: all ranks together).

        Tokens are block_size per sample of a token dataset, `tokens_of` per item of an item one. Sources
        removed on a resume (allow_source_changes) keep their counts here.
        """
        absolute = np.array([(self.epoch if epoch is None else epoch) * self.num_samples + consumed], dtype=np.int64)
        counts = self.plan.counts(absolute)[:, 0]
        out = {name: dict(c) for name, c in self.history.retired.items()}
        for s, name in enumerate(self.names):
            out[name] = {"tokens": self._source_tokens(s, int(counts[s])), "samples": int(counts[s])}
        return out

    def set_global_batch(self, global_batch: int) -> None:
        """Called by StreamingDataLoader: a schedule's step and a per_batch slot are one global batch from the
        resume position on (the past keeps the batches it was served at: resume.py)."""
        if global_batch != self.global_batch:
            self.global_batch = int(global_batch)
            if self.batching == "per_batch" or self.schedule is not None:
                self.reanchor(self.weights, self.anchor)

    def _counts(self, positions: np.ndarray) -> np.ndarray:
        """Samples each source gave before each position: shape (sources, len(positions))."""
        return self.plan.counts(np.asarray(positions, dtype=np.int64))

    # ---- the source contract (read/source.py) --------------------------------------------------

    def _tokens_since(self, counts: np.ndarray, anchor: np.ndarray) -> int:
        return sum(self._source_tokens(s, int(c)) - self._source_tokens(s, int(a))
                   for s, (c, a) in enumerate(zip(counts, anchor)))

    def _counts_tokens(self) -> bool:
        """Whether a state counts tokens: free for token blocks, and for items once their lengths are read."""
        return self.manifest.kind == "tokens" or self._lengths is not None or self.unit == "tokens" or (
            self.schedule is not None and self.schedule.unit == "tokens")

    def extra_state(self, epoch: int, consumed: int) -> dict[str, Any]:
        """Weights, anchor, per-source counts, the step clock and slot sizes at the loader's position (resume.py)."""
        absolute = epoch * self.num_samples + consumed
        counts = self._counts(np.array([absolute]))[:, 0]
        points = self.schedule.change_points() if self.schedule is not None and self.schedule.unit == "step" else []
        clock = self.history.clock.advance(points, self.global_batch, absolute)
        tokens = [self._source_tokens(s, int(c)) for s, c in enumerate(counts)] if self._counts_tokens() else None
        served = self.history.base[1] + (self._tokens_since(counts, self.anchor) if tokens is not None else 0)
        mixture = {"version": MIX_STATE_VERSION, "weights": self.weights, "anchor": self.anchor.tolist(),
                   "counts": counts.tolist(), "batching": self.batching, "unit": self.samples_per_slot,
                   "clock": clock.as_dict(), "sources": [[n, d.fingerprint] for n, d in zip(self.names, self.datasets)],
                   "served": [self.history.base[0] + absolute, served], "base": list(self.history.base),
                   "retired": self.history.retired, "tokens": tokens or [None] * len(self.datasets)}
        if self.batching == "per_batch":
            runs = [[p, g] for p, g in zip(self.plan.starts, self.plan.per_slot)]
            mixture["slots"] = [r for k, r in enumerate(runs) if k == 0 or r[1] != runs[k - 1][1]]  # where G changed
        if self.schedule is not None:  # what the past was, for a resume that changes the schedule
            mixture["schedule"], mixture["step_samples"] = self.schedule.as_list(), self.global_batch
        if self.unit == "tokens":
            mixture["shares_of"] = "tokens"
        return {"mixture": mixture}

    def resume_identity(self, state: dict[str, Any]) -> dict[str, Any]:
        """This mixture's identity for `state`: its epoch length under the slot size the state began with, and
        with allowed source changes no fingerprint (the sources are matched one by one: resume.py)."""
        expected = self.identity()
        saved = read_saved(state)
        if saved is None:
            return expected
        if self._matched(saved) is not None:  # per-source lists of another length: matched source by source
            for key in ("fingerprint", "shuffle_window", "subsample", "split"):
                expected.pop(key)
        elif self.batching == "per_batch" and saved.history.slots and saved.history.slots[0][1] != self.samples_per_slot:
            first = PeriodicPicker(self.plan.weights[0], self.seed, state.get("version") == 1, saved.history.slots[0][1])
            expected["num_samples"] = first.epoch_end(self.sizes, self.iterate_over_all)
        return expected

    def _matched(self, saved: SavedMix) -> list[int | None] | None:
        return match_sources(saved, self.names, [d.fingerprint for d in self.datasets], self.folders,
                             self.allow_source_changes)

    def resume_anchor(self, state: dict[str, Any]) -> tuple[np.ndarray | None, bool]:
        """As saved; or, with other weights (or sources) now, re-anchored at the saved per-source counts
        (position 0 of the new mixture). Checks everything, changes nothing."""
        saved = read_saved(state)
        if saved is None:
            return None, False
        check_batching(saved, self.batching)
        matched = self._matched(saved)
        if matched is not None:  # sources added or removed: each kept one resumes its own count
            return np.array([0 if i is None else saved.counts[i] for i in matched], dtype=np.int64), True
        if self.schedule is not None:
            check_past(saved, self.schedule, served_units(saved, self._saved_tokens(saved)))
            return (None if (saved.anchor == self.anchor).all() else saved.anchor), False
        if np.allclose(saved.weights, self.weights):
            return (None if (saved.anchor == self.anchor).all() else saved.anchor), False
        return saved.counts, True

    def _saved_tokens(self, saved: SavedMix) -> int | None:
        """Tokens served since the saved anchor, where a version-1 state did not record them (same sources)."""
        if saved.served is not None or self.schedule is None or self.schedule.unit != "tokens":
            return None
        return self._tokens_since(saved.counts, saved.anchor)

    def resolve(self, state: Any, keys: tuple[str, ...] | None = None) -> Resume:
        """Where `state` resumes, with the past its plan is rebuilt from (resume.py); changes nothing."""
        resume = super().resolve(state) if keys is None else super().resolve(state, keys)
        saved = read_saved(state)
        if saved is None:
            return resume
        if resume.restart:
            return replace(resume, history=restart_history(saved, self.names, self._saved_tokens(saved)))
        return replace(resume, history=saved.history)

    def apply(self, resume: Resume) -> None:
        super().apply(resume)
        self.history = resume.history if isinstance(resume.history, MixHistory) else MixHistory()
        self.reanchor(self.weights, self.anchor if resume.anchor is None else resume.anchor)

    # ---- the plan --------------------------------------------------------------------------

    def order(self, epoch: int) -> Order:
        return lambda positions: self.global_ids(epoch, positions)

    def global_ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Combined sample ids (source offset + its own sample) of epoch positions."""
        absolute = epoch * self.num_samples + np.asarray(positions, dtype=np.int64)
        src = self.plan.sources(absolute)
        q = self._counts(absolute)[src, np.arange(len(absolute))]
        out = np.empty(len(absolute), dtype=np.int64)
        for s in distinct(src):
            rows = np.flatnonzero(src == s)  # the positions source s serves
            own_epoch, index = np.divmod(q[rows], self.sizes[s])
            for e in distinct(own_epoch):
                at = own_epoch == e
                out[rows[at]] = self.offsets[s] + self._source_order(s, int(e))(index[at])
        return out

    def _source_order(self, s: int, epoch: int) -> Callable[[np.ndarray], np.ndarray]:
        """Source s's position -> sample map for its own epoch; small sources' maps are kept as arrays.

        A chunk asks each source for a few dozen samples, where the keyed permutation's fixed
        cost per call dominates; for a source of up to 2^20 samples (8 MB) the whole epoch's
        map is computed once and indexed (the same values: a cache, not another order).
        """
        key = (s, epoch)
        cached = self._orders.get(key)
        if cached is None:
            order = self.datasets[s].epoch_permutation(epoch, f"mixture/source{s}", self.legacy_seeds, self.legacy_window)
            if self.sizes[s] <= _MATERIALISE:
                table = order(np.arange(self.sizes[s], dtype=np.int64))
                order = table.__getitem__
            if len(self._orders) >= 2 * len(self.datasets):
                self._orders.pop(next(iter(self._orders)), None)  # threads share this dict
            self._orders[key] = cached = order
        return cached

    # ---- access ----------------------------------------------------------------------------

    def __getitem__(self, index: int | slice) -> Any:
        """Position `index` of the current epoch's mixture (a list for a slice)."""
        if isinstance(index, slice):
            return self.sample_list(self.global_ids(self.epoch, np.arange(*index.indices(self.num_samples))))
        return self.sample_list(self.global_ids(self.epoch, np.array([self._check_index(index)])))[0]

    __getitem__.handles_slices = True  # type: ignore[attr-defined]  # (access.py)
