"""Token shards' side of `skip_documents`: a document (`SOURCE@TOKEN`) to the blocks that hold it, and the rows to drop.

A document of token shards is the token range from its start (a shard's start, or a document end
the shard records) to the next document's start. Blocks are cut from the concatenation of all
documents, so a block holding any token of the document also holds tokens of its neighbours: the
whole block is dropped, since a block is the unit the order, the cursor and the ledger count
(cutting it would shift every later block). A sample whose stored block is dropped is left out of
its batch where the worker reads it: the order and the cursor stay what they were, the batch is
short of those rows (an empty batch when all of them are dropped), and with a ledger each block
left out is recorded (start == end == SKIPPED) on the batch, so `audit` counts it as skipped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llm.data.skip_documents import (
    STATE_KEY,
    SkipDocumentsError,
    not_found,
    parse_id,
    read_ids,
    state_ids,
    union,
)
from llm.data.stage import StateError

BlockSkips = dict[int, np.ndarray]  # source -> sorted stored block ids to drop


def document_span(ds: Any, start: int, raw: str) -> tuple[int, int]:
    """[start, end) of the document that starts at token `start` of the dataset, checked against its shards'
    document ends (SkipDocumentsError naming the id when no document starts there)."""
    reader = ds.reader
    total = int(reader.total)
    if not 0 <= start < total:
        raise not_found(raw, f"{ds.input_dir} holds tokens 0 to {total - 1}")
    starts = np.asarray(reader.starts, np.int64)
    i = int(np.searchsorted(starts, start, side="right")) - 1
    local, size = start - int(starts[i]), int(starts[i + 1] - starts[i])
    shard = getattr(reader, "_shard", None)
    if shard is None:  # a reader without document ends (a foreign format): the token count is all that is checked
        return start, min(start + 1, total)
    ends = np.asarray(shard(i)[1], np.int64)
    if local != 0 and not np.any(ends == local):
        raise SkipDocumentsError(f"data.skip_documents: document id {raw!r} names token {start} of {ds.input_dir}, "
                                 "where no document starts; copy the id from `llm-train why` of this run")
    after = ends[ends > local]
    return start, int(starts[i]) + (int(after[0]) if len(after) else size)


def shard_skips(ids: list[str], names: list[str], datasets: list[Any]) -> BlockSkips:
    """Each `SOURCE@TOKEN` id to the stored blocks of its source that hold any of the document's tokens."""
    out: dict[int, set[int]] = {}
    for raw in ids:
        doc = parse_id(raw)
        if doc.kind != "shard":
            raise SkipDocumentsError(f"data.skip_documents: document id {raw!r} names a text record "
                                     "(SOURCE:FILE:RECORD), but this run reads token shards; use SOURCE@TOKEN as "
                                     "`llm-train why` prints it for this run")
        if doc.head not in names:
            raise not_found(raw, f"its datasets: {', '.join(names)}")
        s = names.index(doc.head)
        ds = datasets[s]
        if getattr(ds, "block_size", None) is None:
            raise SkipDocumentsError(f"data.skip_documents: document id {raw!r} names {doc.head}, a dataset of items; "
                                     "only documents of token shards can be skipped by id")
        start, end = document_span(ds, doc.number, raw)
        block = ds.block_size
        out.setdefault(s, set()).update(range(start // block, (end - 1) // block + 1))
    return {s: np.array(sorted(blocks), np.int64) for s, blocks in out.items()}


def skipped_rows(source: Any, ids: np.ndarray) -> np.ndarray:
    """Per sample id of a chunk: whether its stored block is dropped (a mixture's ids through their source)."""
    blocks: BlockSkips = source.skip_blocks
    ids = np.asarray(ids, np.int64)
    datasets = getattr(source, "datasets", None)
    if datasets is None:
        return np.isin(source.to_base(ids), blocks[0]) if 0 in blocks else np.zeros(len(ids), bool)
    out = np.zeros(len(ids), bool)
    src = source.sources_of(ids)
    for s, dropped in blocks.items():
        mine = np.flatnonzero(src == s)
        if len(mine):
            out[mine] = np.isin(datasets[s].to_base(ids[mine] - source.offsets[s]), dropped)
    return out


def drop_rows(source: Any, positions: np.ndarray, samples: np.ndarray, sizes: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """A chunk's positions, samples and batch sizes less the dropped rows, and what was dropped (for the ledger):
    `ledger_skip_pos`, `ledger_skip_ids` and `ledger_skip_batch` (the batch of the chunk each was in)."""
    drop = skipped_rows(source, samples)
    if not drop.any():
        return positions, samples, sizes, {}
    batch_of = np.repeat(np.arange(len(sizes)), sizes)
    left_out = {"ledger_skip_pos": positions[drop], "ledger_skip_ids": samples[drop],
                "ledger_skip_batch": batch_of[drop]}
    keep = ~drop
    return positions[keep], samples[keep], np.bincount(batch_of[keep], minlength=len(sizes)).astype(np.int64), left_out


SKIP_KEYS = ("ledger_skip_pos", "ledger_skip_ids", "ledger_skip_batch")


class LoaderSkips:
    """The shard loader's `skip_documents`: the ids (its own and a loaded state's, a union) and the blocks they drop."""

    dataset: Any
    _skip_ids: list[str]

    def _set_skips(self, value: Any) -> None:
        self._skip_ids = read_ids(value)
        self._apply_skips()  # checked against the datasets now, before any batch

    def _apply_skips(self) -> None:
        names = [s["name"] for s in self.dataset.ledger_sources()]
        datasets = getattr(self.dataset, "datasets", None) or [self.dataset]
        self.dataset.skip_blocks = shard_skips(self._skip_ids, names, datasets) if self._skip_ids else {}

    @property
    def skip_documents(self) -> list[str]:
        """The document ids this loader drops (its own and those of the state it resumed from)."""
        return list(self._skip_ids)

    def _skip_state(self, state: dict) -> dict:
        if self._skip_ids:
            state[STATE_KEY] = list(self._skip_ids)
        return state

    def _check_skips(self, state: dict) -> None:
        try:
            ids = union(state_ids(state, "loader state"), self._skip_ids)
            names = [s["name"] for s in self.dataset.ledger_sources()]
            shard_skips(ids, names, getattr(self.dataset, "datasets", None) or [self.dataset])
        except SkipDocumentsError as e:
            raise StateError(str(e)) from None

    def _restore_skips(self, state: dict) -> None:
        self._skip_ids = union(state_ids(state, "loader state"), self._skip_ids)
        self._apply_skips()

    def _left_out(self, chunk: dict[str, Any]) -> tuple[np.ndarray, ...] | None:
        """The blocks a chunk's worker left out (positions, sample ids, batch of the chunk), or None."""
        got = [chunk.pop(k, None) for k in SKIP_KEYS]
        return None if got[0] is None else tuple(np.asarray(g) for g in got)


def document_start(ds: Any, token: int) -> int | None:
    """The dataset token where the document holding `token` starts (None: the reader has no document ends)."""
    reader = ds.reader
    shard = getattr(reader, "_shard", None)
    if shard is None or not 0 <= token < int(reader.total):  # no document ends, or the last block's padding
        return None
    starts = np.asarray(reader.starts, np.int64)
    i = int(np.searchsorted(starts, token, side="right")) - 1
    ends = np.asarray(shard(i)[1], np.int64)
    before = ends[ends <= token - int(starts[i])]
    return int(starts[i]) + (int(before[-1]) if len(before) else 0)
