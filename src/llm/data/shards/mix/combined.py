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

`schedule=` gives weights by step (`mix_schedule.py`; one step is one global batch, as the
loader sets it): each change point starts a segment anchored at the counts there
(segments.py), positions still a pure function of the position. `unit="tokens"` makes the
weights shares of tokens for item datasets whose samples differ in length (`tokens_of`
counts an item's tokens; each source's lengths are read once); token-block datasets have
equal samples, so there it is the same mixture. `source_counts()` gives the samples and
tokens each source has handed out, from the position alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from llm.data.ingest_stats import remote_sum
from llm.data.mix.schedule import MixSchedule, parse_schedule
from llm.data.mix.segments import MixPlan, PeriodicPicker, TokenPicker
from llm.data.mix.weights import PERIOD, check_weights, quotas, slot_table
from llm.data.seeds import check_seed
from llm.data.shards.arrays import distinct
from llm.data.shards.mix.sources import check_sources, count_tokens, source_names
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.shards.read.source import Order, Resume, SampleSource
from llm.data.shards.read.state import StateError

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


class CombinedStreamingDataset(SampleSource):
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
        self.unit, self.tokens_of = check_unit(unit, batching), tokens_of
        self._lengths: list[np.ndarray] | None = None  # each item's tokens, per source (read when needed)
        self.samples_per_step = 1  # a schedule's step in positions: the global batch, set by the loader
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

    def _shares(self, weights: Any, key: str) -> list[float]:
        return check_weights(weights, len(self.datasets), key, sizes=self.sizes.tolist(), names=self.names)

    def reanchor(self, weights: Sequence[float], counts: np.ndarray) -> None:
        """Start the schedule of these (checked) weights at a point where source s had given counts[s]."""
        self.weights = list(weights)
        self.anchor = np.asarray(counts, dtype=np.int64)
        self._orders = {}
        starts, by_step = [0], [self.weights]
        if self.schedule is not None:
            steps = self.schedule.change_points()
            starts = [step * self.samples_per_step for step in steps]
            by_step = [self._shares(self.schedule.weights_at(step), "schedule") for step in steps]
            by_step[0] = self.weights
        self.plan = MixPlan(starts, by_step, self.anchor, self._picker)
        first = self.plan.first()
        self.num_samples = first.epoch_end(self.sizes, self.iterate_over_all)
        if isinstance(first, PeriodicPicker):  # the first segment's table, as before schedules
            self.period, self.quota, self.slots = first.period, first.quota, first.slots

    def _picker(self, weights: list[float], anchor: np.ndarray) -> PeriodicPicker | TokenPicker:
        if self.unit == "tokens" and self.manifest.kind == "items":
            return TokenPicker(weights, anchor, self._lengths_at)
        return PeriodicPicker(weights, self.seed, self.legacy_seeds, self.samples_per_slot)

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

        Tokens are block_size per sample of a token dataset, `tokens_of` per item of an item one.
        """
        absolute = np.array([(self.epoch if epoch is None else epoch) * self.num_samples + consumed], dtype=np.int64)
        counts = self.plan.counts(absolute)[:, 0]
        out = {}
        for s, name in enumerate(self.names):
            n = int(counts[s])
            if self.manifest.kind == "tokens":
                tokens = n * int(self.block_size or 0)
            else:
                full, rest = divmod(n, int(self.sizes[s]))
                lengths = self.item_lengths()[s]
                tokens = full * int(lengths.sum()) + int(self._lengths_at(s, full * int(self.sizes[s]), rest).sum())
            out[name] = {"tokens": tokens, "samples": n}
        return out

    def set_global_batch(self, global_batch: int) -> None:
        """Called by StreamingDataLoader: with per_batch, one slot of the schedule is one global batch;
        with a weight schedule, one step is one global batch."""
        changed = False
        if self.batching == "per_batch" and global_batch != self.samples_per_slot:
            self.samples_per_slot, changed = int(global_batch), True
        if self.schedule is not None and global_batch != self.samples_per_step:
            self.samples_per_step, changed = int(global_batch), True
        if changed:
            self.reanchor(self.weights, self.anchor)

    def _counts(self, positions: np.ndarray) -> np.ndarray:
        """Samples each source gave before each position: shape (sources, len(positions))."""
        return self.plan.counts(np.asarray(positions, dtype=np.int64))

    # ---- the source contract (read/source.py) --------------------------------------------------

    def extra_state(self, epoch: int, consumed: int) -> dict[str, Any]:
        """Weights, anchor and per-source counts at the loader's position (a few numbers per source)."""
        absolute = np.array([epoch * self.num_samples + consumed], dtype=np.int64)
        mixture = {"weights": self.weights, "anchor": self.anchor.tolist(),
                   "counts": self._counts(absolute)[:, 0].tolist(), "batching": self.batching,
                   "unit": self.samples_per_slot}
        if self.schedule is not None:  # what the past was, for a resume that changes the schedule
            mixture["schedule"], mixture["step_samples"] = self.schedule.as_list(), self.samples_per_step
        if self.unit == "tokens":
            mixture["shares_of"] = "tokens"
        return {"mixture": mixture}

    def resume_anchor(self, state: dict[str, Any]) -> tuple[np.ndarray | None, bool]:
        """As saved; re-anchored where it was saved after a weight change; or, with other weights now,
        re-anchored at the saved per-source counts (epoch 0, position 0 of the new mixture)."""
        mixture = state.get("mixture")
        if not mixture:
            return None, False
        n = len(self.datasets)
        try:
            weights = [float(w) for w in mixture["weights"]]
            anchor = np.asarray(mixture["anchor"], dtype=np.int64)
            counts = np.asarray(mixture["counts"], dtype=np.int64)
        except (KeyError, TypeError, ValueError):
            raise StateError("loader state key 'mixture' must hold weights, anchor and counts lists") from None
        if len(weights) != n or anchor.shape != (n,) or counts.shape != (n,) or (counts < 0).any():
            raise StateError(f"loader state key 'mixture' does not describe {n} datasets: {mixture!r}")
        saved = (mixture.get("batching", "stratified"), mixture.get("unit", 1))
        if saved != (self.batching, self.samples_per_slot):
            raise StateError(
                f"loader state key 'mixture' was saved with batching={saved[0]!r} and {saved[1]} samples per "
                f"schedule slot, but this mixture has batching={self.batching!r} and {self.samples_per_slot}; a "
                "per_batch mixture resumes with the same batching and global batch (batch_size x world size)"
            )
        if self.schedule is not None:
            self._check_past(mixture, weights, anchor, counts)
            return (None if (anchor == self.anchor).all() else anchor), False
        if np.allclose(weights, self.weights):
            return (None if (anchor == self.anchor).all() else anchor), False
        return counts, True

    def _check_past(self, mixture: dict, weights: list[float], anchor: np.ndarray, counts: np.ndarray) -> None:
        """A schedule may change only what has not been read: the saved one must agree up to the saved step."""
        try:
            saved = parse_schedule(mixture.get("schedule") or [{"step": 0, "weights": weights}], len(weights),
                                   "loader state key 'mixture'", sum_to_one=False)
        except ValueError as e:
            raise StateError(str(e)) from None
        per_step = int(mixture.get("step_samples", self.samples_per_step)) or 1
        step = -(-int((counts - anchor).sum()) // per_step)  # positions read since the anchor, in steps
        changed = self.schedule.past_differs(saved, step) if self.schedule else None
        if changed is not None:
            raise StateError(f"schedule gives other weights at step {changed} than the run that saved this state, "
                             f"which has read to step {step}; change the schedule only from step {step} on")

    def apply(self, resume: Resume) -> None:
        super().apply(resume)
        self.reanchor(self.weights, self.anchor if resume.anchor is None else resume.anchor)

    def reads_remote(self) -> bool:
        return any(d.reads_remote() for d in self.datasets)

    def remote_counters(self, wait: bool = False) -> dict[str, int]:
        return remote_sum(d.remote_counters(wait) for d in self.datasets)

    def release(self) -> None:
        for d in self.datasets:  # a remote source's pin must not outlive the chunk that read it
            d.release()

    def hint_samples(self, sample_ids: np.ndarray) -> None:
        """Each source's cache gets the shards its samples among these read, in order of first use."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        src = self.sources_of(ids)
        for s, d in enumerate(self.datasets):
            if d.reads_remote():
                d.hint_samples(ids[src == s] - self.offsets[s])

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

    def sources_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, ids, side="right") - 1

    # ---- reading ---------------------------------------------------------------------------

    def read_blocks(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = np.asarray(sample_ids, dtype=np.int64)
        src = self.sources_of(ids)
        out = {"input_ids": np.empty((len(ids), self.block_size), dtype=self.token_dtype)}
        if self.item_loader.document_boundaries:
            out["position_ids"] = np.empty_like(out["input_ids"])
        for s in distinct(src):
            at = np.flatnonzero(src == s)  # each source gathers straight into its rows of the batch
            self.datasets[s].fill_blocks(ids[at] - self.offsets[s], out, at)
        return out

    def reads_per_sample(self) -> bool:
        # items come from several readers: gathered sample by sample through each source's own path
        return self.manifest.kind == "items" or any(d.reads_per_sample() for d in self.datasets)

    def sample_list(self, ids: np.ndarray) -> list[Any]:
        """Each source's samples as its own `ds[i]` gives them (its transform, subsample, __getitem__)."""
        ids = np.asarray(ids, dtype=np.int64)
        src, out = self.sources_of(ids), [None] * len(ids)
        for s in distinct(src):
            at = np.flatnonzero(src == s)
            for row, sample in zip(at.tolist(), self.datasets[s].sample_list(ids[at] - self.offsets[s])):
                out[row] = sample
        return out

    def __getitem__(self, index: int | slice) -> Any:
        """Position `index` of the current epoch's mixture (a list for a slice)."""
        if isinstance(index, slice):
            return self.sample_list(self.global_ids(self.epoch, np.arange(*index.indices(self.num_samples))))
        return self.sample_list(self.global_ids(self.epoch, np.array([self._check_index(index)])))[0]

    __getitem__.handles_slices = True  # type: ignore[attr-defined]  # (access.py)

    def verify(self) -> None:
        for d in self.datasets:
            d.verify()
