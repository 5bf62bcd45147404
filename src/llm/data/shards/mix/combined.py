"""`CombinedStreamingDataset`: several optimized datasets mixed by a schedule that is a pure function of position.

Which source global position P comes from is a periodic, low-discrepancy pattern:
each block of `PERIOD` positions holds exactly `quota[s]` samples of source s
(largest-remainder rounding of its weight), interleaved smoothly and rotated by
the seed. So any window of `PERIOD` consecutive samples holds each source's
quota exactly (within 0.05% of its weight), and the number of samples source s
gave before P is a closed form: `(P // PERIOD) * quota[s] + prefix[s][P % PERIOD]`.
Source s's q-th sample is sample `q % n_s` of its own epoch `q // n_s`
(reshuffled by its own seed + epoch), so a source that runs out starts its next
epoch while the others go on. Nothing depends on what was read: the loader's
position is the whole state, resume is O(1) and exact on any topology.

With `batching="per_batch"` a slot is one global batch (`unit` = batch_size x world
size, set by the loader) instead of one sample: every global batch comes from one
source, and the counts are the same closed form times `unit` plus the position
inside the current slot.

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

from llm.data.shards.arrays import distinct
from llm.data.shards.read.dataset import StreamingDataset, _Iteration, chunk_bounds

PERIOD = 1000
BATCHING = ("stratified", "per_batch")
_MATERIALISE = 1 << 20  # samples: sources up to this size keep their epoch order as an array


def quotas(weights: Sequence[float], period: int = PERIOD) -> list[int]:
    """Integer samples per period for each weight (largest remainder), summing to `period`."""
    exact = [w * period for w in weights]
    base = [int(x) for x in exact]
    for i in sorted(range(len(exact)), key=lambda i: (base[i] - exact[i], i))[: period - sum(base)]:
        base[i] += 1
    return base


def slot_table(quota: list[int], seed: int, period: int = PERIOD) -> np.ndarray:
    """Source of each slot of a period: smooth weighted round robin, rotated by the seed."""
    slots = np.empty(period, dtype=np.int64)
    credit = [0] * len(quota)
    for k in range(period):
        for i, q in enumerate(quota):
            credit[i] += q
        pick = max(range(len(quota)), key=lambda i: (credit[i], -i))
        credit[pick] -= period
        slots[k] = pick
    return np.roll(slots, seed % period)


class CombinedStreamingDataset(StreamingDataset):
    """Mix several `StreamingDataset`s (same kind, same block size) by weight, with an exact resume."""

    def __init__(
        self,
        datasets: Sequence[StreamingDataset],
        weights: Sequence[float] | None = None,
        seed: int = 42,
        iterate_over_all: bool = True,
        batching: str = "stratified",
    ):
        self.datasets = list(datasets)
        self._check_sources()
        if batching not in BATCHING:
            raise ValueError(
                f"batching={batching!r} is not known; use 'stratified' (sources mixed within each batch by "
                "the weights) or 'per_batch' (each global batch from one source, sources by the weights)"
            )
        self.batching = batching
        self.unit = 1  # samples per schedule slot: 1, or the global batch with per_batch
        self.seed, self.iterate_over_all = seed, iterate_over_all
        first = self.datasets[0]
        self.manifest, self.item_loader = first.manifest, first.item_loader
        self.block_size = getattr(first, "block_size", None)
        self.pad_id = getattr(first, "pad_id", None)
        self.shuffle, self.drop_last, self.epoch = True, False, 0
        self.input_dir = "CombinedStreamingDataset(" + ", ".join(str(d.input_dir) for d in self.datasets) + ")"
        self._iteration: _Iteration | None = None
        self._orders: dict[tuple[int, int], Callable[[np.ndarray], np.ndarray]] = {}
        self.cache = None  # remote sources keep their own caches
        windows = [d.shuffle_window for d in self.datasets]  # each source's own order; in the state
        self.shuffle_window = windows if any(w is not None for w in windows) else None
        subsamples, splits = [d.subsample for d in self.datasets], [d.split for d in self.datasets]
        self.subsample = subsamples if any(f != 1 for f in subsamples) else 1.0  # the sources' subsets, in the state
        self.split, self.view, self.transform = (splits if any(splits) else None), None, None
        self.sizes = np.array([d.num_samples for d in self.datasets], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self.fingerprint = hashlib.sha256(
            json.dumps([d.fingerprint for d in self.datasets] + [seed]).encode()
        ).hexdigest()
        self.set_weights(weights, np.zeros(len(self.datasets), dtype=np.int64))

    def _check_sources(self) -> None:
        if not self.datasets:
            raise ValueError("CombinedStreamingDataset needs at least one dataset")
        for i, d in enumerate(self.datasets):
            if not isinstance(d, StreamingDataset) or isinstance(d, CombinedStreamingDataset):
                raise TypeError(f"datasets[{i}] is a {type(d).__name__}, expected a StreamingDataset")
            if d.manifest.kind != self.datasets[0].manifest.kind:
                raise ValueError(f"datasets[{i}] holds {d.manifest.kind} but datasets[0] holds {self.datasets[0].manifest.kind}; mix datasets of one kind")
            if getattr(d, "block_size", None) != getattr(self.datasets[0], "block_size", None):
                raise ValueError(f"datasets[{i}] has block_size {d.block_size} but datasets[0] has {self.datasets[0].block_size}; use one TokensLoader block size")
            if getattr(d, "token_dtype", None) != getattr(self.datasets[0], "token_dtype", None):
                raise ValueError(f"datasets[{i}] gives {d.token_dtype} tokens but datasets[0] gives {self.datasets[0].token_dtype}; pass one TokensLoader dtype")
            bounds = getattr(d.item_loader, "document_boundaries", False)
            if bounds != getattr(self.datasets[0].item_loader, "document_boundaries", False):
                raise ValueError(f"datasets[{i}] has document_boundaries={bounds} but datasets[0] does not; use one TokensLoader setting")

    def set_weights(self, weights: Sequence[float] | None, counts: np.ndarray) -> None:
        """Mixture weights (None: proportional to sizes) from an anchor where source s had given counts[s]."""
        n = len(self.datasets)
        if weights is None:
            weights = (self.sizes / self.sizes.sum()).tolist()
        weights = list(weights)
        if len(weights) != n:
            raise ValueError(f"weights has {len(weights)} entries but there are {n} datasets")
        if any(isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 or w != w for w in weights):
            raise ValueError(f"weights must be non-negative numbers, got {weights}")
        if sum(weights) <= 0:
            raise ValueError(f"weights are all zero ({weights}); give at least one dataset a positive weight")
        self.weights = [w / sum(weights) for w in weights]
        self.quota = np.array(quotas(self.weights), dtype=np.int64)
        self.slots = slot_table(self.quota.tolist(), self.seed)
        # prefix[s, k]: samples of source s in slots [0, k)
        self.prefix = np.zeros((n, PERIOD + 1), dtype=np.int64)
        for s in range(n):
            self.prefix[s, 1:] = np.cumsum(self.slots == s)
        self.anchor = np.asarray(counts, dtype=np.int64)
        self.num_samples = self._epoch_length()

    def set_global_batch(self, global_batch: int) -> None:
        """Called by StreamingDataLoader: with per_batch, one slot of the schedule is one global batch."""
        if self.batching == "per_batch" and global_batch != self.unit:
            self.unit = int(global_batch)
            self.set_weights(self.weights, self.anchor)

    def _counts(self, positions: np.ndarray) -> np.ndarray:
        """Samples each source gave before each position: shape (sources, len(positions))."""
        slot, within = np.divmod(positions, self.unit)
        full, rest = np.divmod(slot, PERIOD)
        before = full[None, :] * self.quota[:, None] + self.prefix[:, rest]
        current = self.slots[rest][None, :] == np.arange(len(self.datasets))[:, None]
        return self.anchor[:, None] + before * self.unit + current * within[None, :]

    def _epoch_length(self) -> int:
        """Positions until the first (or every) weighted source has given all its samples once."""
        ends = []
        for s in np.flatnonzero(self.quota):
            need = -(-int(self.sizes[s]) // self.unit)  # slots, each `unit` samples
            periods = max(0, (need - 1) // int(self.quota[s]))
            within = int(np.searchsorted(self.prefix[s], need - periods * self.quota[s]))
            ends.append(periods * PERIOD + within)
        return int(max(ends) if self.iterate_over_all else min(ends)) * self.unit

    def mixture_state(self, epoch: int, consumed: int) -> dict[str, Any]:
        """Weights, anchor and per-source counts at the loader's position (a few numbers per source)."""
        absolute = np.array([epoch * self.num_samples + consumed], dtype=np.int64)
        return {"weights": self.weights, "anchor": self.anchor.tolist(), "counts": self._counts(absolute)[:, 0].tolist(),
                "batching": self.batching, "unit": self.unit}

    def load_mixture_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """The loader state to resume from: as saved, or re-anchored when the mixture changed.

        With other weights (or a state saved after such a change) the schedule restarts at
        the saved per-source counts: epoch 0, position 0 of the new mixture, nothing repeated.
        """
        mixture = state.get("mixture") if isinstance(state, dict) else None
        if not mixture:
            return state
        n = len(self.datasets)
        try:
            weights = [float(w) for w in mixture["weights"]]
            anchor = np.asarray(mixture["anchor"], dtype=np.int64)
            counts = np.asarray(mixture["counts"], dtype=np.int64)
        except (KeyError, TypeError, ValueError):
            raise ValueError("loader state key 'mixture' must hold weights, anchor and counts lists") from None
        if len(weights) != n or anchor.shape != (n,) or counts.shape != (n,) or (counts < 0).any():
            raise ValueError(f"loader state key 'mixture' does not describe {n} datasets: {mixture!r}")
        saved = (mixture.get("batching", "stratified"), mixture.get("unit", 1))
        if saved != (self.batching, self.unit):
            raise ValueError(
                f"loader state key 'mixture' was saved with batching={saved[0]!r} and {saved[1]} samples per "
                f"schedule slot, but this mixture has batching={self.batching!r} and {self.unit}; a per_batch "
                "mixture resumes with the same batching and global batch (batch_size x world size)"
            )
        if np.allclose(weights, self.weights) and (anchor == self.anchor).all():
            return state
        if np.allclose(weights, self.weights) and not (anchor == 0).all():
            self.set_weights(self.weights, anchor)  # the same re-anchored mixture as when it was saved
            return {**state, "num_samples": self.num_samples}
        self.set_weights(self.weights, counts)
        return {**state, "epoch": 0, "samples_consumed": 0, "num_samples": self.num_samples}

    # ---- the plan --------------------------------------------------------------------------

    def global_ids(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Combined sample ids (source offset + its own sample) of epoch positions."""
        absolute = epoch * self.num_samples + np.asarray(positions, dtype=np.int64)
        src = self.slots[(absolute // self.unit) % PERIOD]
        q = self._counts(absolute)[src, np.arange(len(absolute))]
        out = np.empty(len(absolute), dtype=np.int64)
        for s in range(len(self.datasets)):
            mine = np.flatnonzero(src == s)
            if not len(mine):
                continue
            own_epoch, index = np.divmod(q[mine], self.sizes[s])
            for e in distinct(own_epoch):
                at = mine[own_epoch == e]
                out[at] = self.offsets[s] + self._source_order(s, int(e))(index[own_epoch == e])
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
            order = self.datasets[s].epoch_permutation(epoch)
            if self.sizes[s] <= _MATERIALISE:
                table = order(np.arange(self.sizes[s], dtype=np.int64))
                order = table.__getitem__
            if len(self._orders) >= 2 * len(self.datasets):
                self._orders.pop(next(iter(self._orders)), None)  # threads share this dict
            self._orders[key] = cached = order
        return cached

    def chunk_plan(self, it: _Iteration, workers: int) -> tuple[list[int], Callable[[np.ndarray], np.ndarray]]:
        return chunk_bounds(len(it.schedule), workers, it.chunk_batches), lambda p: self.global_ids(it.epoch, p)

    def read_chunk(self, it: _Iteration, order: Callable, lo: int, hi: int) -> dict[str, Any]:
        try:
            return super().read_chunk(it, order, lo, hi)
        finally:  # a remote source's pin must not outlive the chunk that read it
            for d in self.datasets:
                if d.cache is not None:
                    d.reader.files.release()

    def sources_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, ids, side="right") - 1

    # ---- reading ---------------------------------------------------------------------------

    def read_blocks(self, sample_ids: np.ndarray) -> dict[str, np.ndarray]:
        ids = np.asarray(sample_ids, dtype=np.int64)
        src = self.sources_of(ids)
        first = self.datasets[0]
        out = {"input_ids": np.empty((len(ids), self.block_size), dtype=first.token_dtype)}
        if first.item_loader.document_boundaries:
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
