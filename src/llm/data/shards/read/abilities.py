"""The optional abilities of a `SampleSource`, each declared with the default a plain local dataset has.

`SampleSource` (source.py) is the core contract: the order, the reads, the identity, the state.
What only some sources do lives here, one class per concern, so a source says what it adds by
overriding a declared method, and the loader calls methods rather than probing for them:

* `RemoteReads`: object-store sources (a shard cache to hint, pins to release, remote counters);
* `MixtureHooks`: what a mixture adds to the plan and the state (the global batch, its counts,
  how a state re-anchors it, its per-source accounting);
* `LedgerRows`: what the run ledger records of a row (read/ledger.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from llm.data.ingest_stats import zero_remote
from llm.data.ledger.checksums import checksummed_widened


def folder_name(input_dir: Any) -> str:
    """A dataset's name in accounts and ledgers: its folder's name."""
    return PurePosixPath(str(input_dir).rstrip("/")).name or "data"


class RemoteReads:
    """Object storage: a local dataset reads no remote bytes, hints nothing and pins nothing."""

    input_dir: Any

    def reads_remote(self) -> bool:
        """Whether samples come from object storage (its client does not survive fork())."""
        return False

    def hint_samples(self, sample_ids: np.ndarray) -> None:
        """Tell the shard cache, if any, that these samples are read next, in this order."""

    def release(self) -> None:
        """Drop this thread's pin on a cached shard, so that an idle reader holds no cache room."""

    def remote_counters(self, wait: bool = False) -> dict[str, int]:
        """This process's remote counts for this source's shard caches (`ingest_stats.REMOTE_KEYS`);
        `wait`: let prefetches in flight finish first, so their downloads are counted."""
        return zero_remote()

    def remote_counters_by_source(self) -> dict[str, dict[str, int]]:
        """`remote_counters()` per source name (as `source_counts` names them) of the sources that read remotely."""
        return {folder_name(self.input_dir): self.remote_counters()} if self.reads_remote() else {}


class MixtureHooks:
    """The plan and state hooks a mixture overrides; a single dataset has one source and no extra state."""

    epoch: int
    num_samples: int
    input_dir: Any
    block_size: int | None

    def identity(self) -> dict[str, Any]:
        raise NotImplementedError  # SampleSource's

    def set_global_batch(self, global_batch: int) -> None:
        """The loader's batch_size x world size; only a mixture uses it (per_batch slots, step points)."""

    def extra_state(self, epoch: int, consumed: int) -> dict[str, Any]:
        """Keys of this source's state beyond its identity and position (a mixture's counts)."""
        return {}

    def source_counts(self, epoch: int | None = None, consumed: int = 0) -> dict[str, dict[str, int]]:
        """Samples (and tokens of token blocks) handed out before a position, per source; a mixture's per source."""
        samples = (self.epoch if epoch is None else epoch) * self.num_samples + consumed
        name = folder_name(self.input_dir)
        return {name: {"tokens": samples * (self.block_size or 0), "samples": samples}}  # items: 0 tokens

    def resume_anchor(self, state: dict[str, Any]) -> tuple[np.ndarray | None, bool]:
        """(anchor to set or None, whether the schedule restarts at position 0); checks, changes nothing."""
        return None, False

    def resume_identity(self, state: dict[str, Any]) -> dict[str, Any]:
        """The identity `state` must match (a mixture's may depend on what the state says of its past)."""
        return self.identity()


_SAME: dict[int, np.ndarray] = {}


def _same(value: int) -> np.ndarray:
    """A read-only view of `value` repeated (2**40 times, in 8 bytes of memory): sliced per chunk, for the price of a
    slice, where a fresh broadcast view costs ten times that."""
    view = _SAME.get(value)
    if view is None:
        view = _SAME[value] = np.broadcast_to(np.int64(value), (1 << 40,))
    return view


class LedgerRows:
    """What the run ledger records of each row: one source, the loader's epoch, the sample id."""

    input_dir: Any
    block_size: int | None
    drop_partial_block: bool
    token_dtype: Any
    pad_id: int
    item_loader: Any

    def identity(self) -> dict[str, Any]:
        raise NotImplementedError  # SampleSource's

    def ledger_sources(self) -> list[dict[str, Any]]:
        """What the ledger header says of each source: enough for `audit` to rebuild it and know its size, and the
        dtype its rows' checksums are taken in (ledger/format.py `row_checksums`)."""
        name = folder_name(self.input_dir)
        dtype = self.checksum_dtype()
        return [{"name": name, "path": str(self.input_dir), "block_size": self.block_size,
                 "drop_partial_block": self.drop_partial_block, **self.identity(),
                 **({"checksum_dtype": dtype.name} if dtype is not None else {})}]

    def checksum_dtype(self) -> np.dtype | None:
        """The dtype the ledger checksums this source's rows in: the widest dtype its shards store (None: items)."""
        manifest = getattr(self, "manifest", None)
        if manifest is None or manifest.kind != "tokens":
            return None
        return max((np.dtype(d or manifest.dtype) for d in manifest.distinct("dtype")),
                   key=lambda d: d.itemsize, default=np.dtype(manifest.dtype))

    def read_checksummed(self, sample_ids: np.ndarray, rule: Callable[..., np.ndarray],
                         widen: bool = True) -> dict[str, np.ndarray]:
        """`read_blocks` plus `ledger_crc`, each row's checksum by `rule` taken on the rows as stored, before they
        are widened to the loader's dtype (one copy, which a read into wider rows makes anyway; `widen=False`: left
        as stored, for a caller that copies them into its own rows)."""
        stored, wanted = self.checksum_dtype(), np.dtype(self.token_dtype)
        fits = stored is not None and np.can_cast(np.min_scalar_type(self.pad_id), stored)
        if not fits or stored == wanted:  # a pad id the stored dtype cannot hold: the rows as the loader has them
            out = self.read_blocks(sample_ids)
            return {**out, "ledger_crc": rule(out["input_ids"], stored)}
        n = len(sample_ids)
        out = {"input_ids": np.empty((n, self.block_size), dtype=stored)}
        if self.item_loader.document_boundaries:
            out["position_ids"] = np.empty((n, self.block_size), dtype=np.int64)
        self.fill_blocks(sample_ids, out, np.arange(n))
        both = checksummed_widened(rule, out["input_ids"]) if widen and wanted == np.int64 else None
        if both is not None:  # the C kernel: checksummed and widened in one pass (ledger/checksums.py)
            return {**out, "input_ids": both[1], "ledger_crc": both[0]}
        crcs = rule(out["input_ids"], stored)
        return {**out, "input_ids": out["input_ids"].astype(wanted) if widen else out["input_ids"], "ledger_crc": crcs}

    def ledger_mixture(self) -> dict[str, Any] | None:
        """A mixture's weights and schedule for the ledger (None: one dataset, nothing mixed)."""
        return None

    def ledger_rows(self, epoch: int, positions: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, the source's epoch, its sample) of the samples a chunk read at these positions of `epoch`; one
        dataset's source and epoch are one value for every row: read-only views of it, not arrays of copies (the
        ledger stores such a column as its one value)."""
        n = len(ids)
        return _same(0)[:n], _same(epoch)[:n], np.asarray(ids, np.int64)
