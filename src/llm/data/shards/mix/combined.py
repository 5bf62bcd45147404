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
its samples (`iterate_over_all=False`) or until every source has (`True`).
Changing the weights on resume re-anchors the schedule at the saved per-source
counts: nothing consumed is repeated, the new mixture applies from there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from llm.data.ingest_stats import remote_sum
from llm.data.seeds import check_seed, derive_seed
from llm.data.shards.arrays import distinct
from llm.data.shards.mix.sources import check_sources
from llm.data.shards.mix.weights import PERIOD, check_weights, period_for, quotas, slot_table
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.shards.read.source import Order, Resume, SampleSource
from llm.data.shards.read.state import StateError

__all__ = ["CombinedStreamingDataset", "PERIOD", "quotas", "slot_table"]
BATCHING = ("stratified", "per_batch")
_MATERIALISE = 1 << 20  # samples: sources up to this size keep their epoch order as an array


class CombinedStreamingDataset(SampleSource):
    """Mix several `StreamingDataset`s (same kind, block size and tokenizer) by weight, with an exact resume."""

    def __init__(
        self,
        datasets: Sequence[StreamingDataset],
        weights: Sequence[float] | None = None,
        seed: int = 42,
        iterate_over_all: bool = True,
        batching: str = "stratified",
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
        shares = check_weights(weights, self.sizes.tolist(), [str(d.input_dir) for d in self.datasets])
        self.reanchor(shares, np.zeros(len(self.datasets), dtype=np.int64))

    def reanchor(self, weights: Sequence[float], counts: np.ndarray) -> None:
        """Start the schedule of these (checked) weights at a point where source s had given counts[s]."""
        n = len(self.datasets)
        self.weights = list(weights)
        if self.legacy_seeds:  # a version-1 state: its period and rotation, zero quotas included
            self.period, rotation = PERIOD, self.seed
            self.quota = np.array(quotas(self.weights), dtype=np.int64)
        else:
            self.period, rotation = period_for(self.weights), derive_seed(self.seed, "mixture")
            self.quota = np.array(quotas(self.weights, self.period, floor=True), dtype=np.int64)
        self.slots = slot_table(self.quota.tolist(), rotation, self.period)
        # prefix[s, k]: slots of source s in [0, k)
        self.prefix = np.zeros((n, self.period + 1), dtype=np.int64)
        for s in range(n):
            self.prefix[s, 1:] = np.cumsum(self.slots == s)
        self.anchor = np.asarray(counts, dtype=np.int64)
        self.num_samples = self._epoch_length()
        self._orders = {}

    def set_global_batch(self, global_batch: int) -> None:
        """Called by StreamingDataLoader: with per_batch, one slot of the schedule is one global batch."""
        if self.batching == "per_batch" and global_batch != self.samples_per_slot:
            self.samples_per_slot = int(global_batch)
            self.reanchor(self.weights, self.anchor)

    def _counts(self, positions: np.ndarray) -> np.ndarray:
        """Samples each source gave before each position: shape (sources, len(positions))."""
        slot, within = np.divmod(positions, self.samples_per_slot)
        full, rest = np.divmod(slot, self.period)
        before = full[None, :] * self.quota[:, None] + self.prefix[:, rest]
        current = self.slots[rest][None, :] == np.arange(len(self.datasets))[:, None]
        return self.anchor[:, None] + before * self.samples_per_slot + current * within[None, :]

    def _epoch_length(self) -> int:
        """Positions until the first (or every) weighted source has given all its samples once."""
        ends = []
        for s in np.flatnonzero(self.quota):
            need = -(-int(self.sizes[s]) // self.samples_per_slot)  # slots
            periods = max(0, (need - 1) // int(self.quota[s]))
            within = int(np.searchsorted(self.prefix[s], need - periods * self.quota[s]))
            ends.append(periods * self.period + within)
        return int(max(ends) if self.iterate_over_all else min(ends)) * self.samples_per_slot

    # ---- the source contract (read/source.py) --------------------------------------------------

    def identity(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "seed": self.seed, "shuffle": self.shuffle,
                "shuffle_window": self.shuffle_window, "subsample": self.subsample, "split": self.split,
                "num_samples": self.num_samples}

    def extra_state(self, epoch: int, consumed: int) -> dict[str, Any]:
        """Weights, anchor and per-source counts at the loader's position (a few numbers per source)."""
        absolute = np.array([epoch * self.num_samples + consumed], dtype=np.int64)
        return {"mixture": {"weights": self.weights, "anchor": self.anchor.tolist(),
                            "counts": self._counts(absolute)[:, 0].tolist(), "batching": self.batching,
                            "unit": self.samples_per_slot}}

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
        if np.allclose(weights, self.weights):
            return (None if (anchor == self.anchor).all() else anchor), False
        return counts, True

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
        src = self.slots[(absolute // self.samples_per_slot) % self.period]
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
            order = self.datasets[s].epoch_permutation(epoch, f"mixture/source{s}", self.legacy_seeds)
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
