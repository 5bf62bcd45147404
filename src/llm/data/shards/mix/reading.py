"""How a mixture reads: each id goes to the source that owns it, through that source's own reader.

`MixReads` is the base `CombinedStreamingDataset` reads through: combined ids are a source's
offset plus its own sample id, so one batch gathers each source's rows straight into place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llm.data.ingest_stats import remote_sum
from llm.data.shards.arrays import distinct
from llm.data.shards.read.dataset import StreamingDataset


class MixReads:
    """Reading, remote counters and cache hints of a mixture, routed to its sources."""

    datasets: list[StreamingDataset]
    offsets: np.ndarray
    block_size: int | None
    token_dtype: Any
    item_loader: Any
    manifest: Any
    num_samples: int
    epoch: int
    names: list[str]
    sizes: np.ndarray
    weights: list[float]
    schedule: Any
    batching: str

    def _counts(self, positions: np.ndarray) -> np.ndarray:
        """Samples each source gave before each absolute position (the mixture's plan)."""
        raise NotImplementedError

    # ---- the run ledger (read/ledger.py) ------------------------------------------------------

    def ledger_sources(self) -> list[dict[str, Any]]:
        """Each source as the ledger names it, with the component its order is keyed by in this mixture, its
        weight and the mixture's weights and schedule (audit compares each phase's shares with them)."""
        mixture = self.ledger_mixture()
        return [{**d.ledger_sources()[0], "name": self.names[s], "order": f"mixture/source{s}",
                 "weight": self.weights[s], "mixture": mixture} for s, d in enumerate(self.datasets)]

    def ledger_mixture(self) -> dict[str, Any] | None:
        """What the mixture's shares follow (ledger/shares.py): its weights now, schedule, batching, tokens a sample."""
        return {"weights": list(self.weights), "schedule": self.schedule.as_list() if self.schedule else None,
                "batching": self.batching, "tokens_per_sample": self.block_size, "shares_of": self.unit}

    def ledger_rows(self, epoch: int, positions: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, the source's own epoch, its sample): a source's epoch is how many passes it gave before."""
        ids = np.asarray(ids, dtype=np.int64)
        src = self.sources_of(ids)
        absolute = epoch * self.num_samples + np.asarray(positions, dtype=np.int64)
        before = self._counts(absolute)[src, np.arange(len(ids))]
        return src, before // self.sizes[src], ids - self.offsets[src]

    def reads_remote(self) -> bool:
        return any(d.reads_remote() for d in self.datasets)

    def remote_counters(self, wait: bool = False) -> dict[str, int]:
        return remote_sum(d.remote_counters(wait) for d in self.datasets)

    def remote_counters_by_source(self) -> dict[str, dict[str, int]]:
        return {name: d.remote_counters() for name, d in zip(self.names, self.datasets) if d.reads_remote()}

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

    def read_checksummed(self, sample_ids: np.ndarray, rule: Any) -> dict[str, np.ndarray]:
        """`read_blocks` plus each row's ledger checksum, taken by each source on its rows as it stores them (its own
        `checksum_dtype`, which the ledger header names per source), before they are widened into the batch."""
        ids = np.asarray(sample_ids, dtype=np.int64)
        src = self.sources_of(ids)
        sources = distinct(src)
        if len(sources) == 1 and not self.item_loader.document_boundaries:  # one source's chunk: its rows as read
            return self.datasets[sources[0]].read_checksummed(ids - self.offsets[sources[0]], rule)
        out = {"input_ids": np.empty((len(ids), self.block_size), dtype=self.token_dtype)}
        if self.item_loader.document_boundaries:
            out["position_ids"] = np.empty_like(out["input_ids"])
        crcs = np.empty(len(ids), np.uint32)
        for s in sources:
            at = np.flatnonzero(src == s)  # the stored rows, widened as they are copied into the batch's
            part = self.datasets[s].read_checksummed(ids[at] - self.offsets[s], rule, widen=False)
            crcs[at] = part.pop("ledger_crc")
            for key, rows in part.items():
                out[key][at] = rows
        return {**out, "ledger_crc": crcs}

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

    def verify(self) -> None:
        for d in self.datasets:
            d.verify()
