"""Best-fit packing: whole documents into the open block they fill best, from a bounded buffer of open blocks.

Greedy packing (`packing.WindowCutter`) concatenates documents and cuts every
`max_seq_len` tokens, so nearly every block boundary cuts a document in two.
Best fit keeps up to `packing_buffer` blocks open: a document goes into the open
block whose free room it fills best; when none has room, a new block opens (the
fullest open block goes out first when the buffer is full); a block that is
exactly full goes out at once. Only a document longer than a block is split:
its full blocks go out as they are, its tail is packed like a document. At the
end of a partition the open blocks' pieces are repacked first-fit decreasing,
so few half-empty blocks go out.

Each piece keeps its own positions: a block's `position_ids` restart at 0 where
a piece starts, and `cu_seqlens` lists the pieces' starts (flash-attention's
varlen layout), so no token attends across documents.

The cursor is exact: the open blocks (their tokens) are part of it, next to the
offset of the last record fed. While a long document's full blocks go out, the
cursor stays before it and `skip` counts its tokens already emitted, as in
greedy packing. The buffer bounds the cursor: at most `packing_buffer *
max_seq_len` tokens per partition being read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from llm.data.stage import StateError

PACKING_MODES = ("greedy", "best_fit")


def check_packing(packing: Any, packing_buffer: Any) -> None:
    """Raise ValueError naming the key and value for an unknown packing mode or a buffer below 1."""
    if packing not in PACKING_MODES:
        raise ValueError(f"packing {packing!r} is not a packing mode; use one of: {', '.join(PACKING_MODES)}")
    if isinstance(packing_buffer, bool) or not isinstance(packing_buffer, int) or packing_buffer < 1:
        raise ValueError(f"packing_buffer {packing_buffer!r} must be a whole number >= 1 (the open blocks kept)")


class OpenBlocks:
    """At most `limit` open blocks of `capacity` slots; `add` places one piece and returns the blocks that go out."""

    def __init__(self, capacity: int, limit: int, size: Callable[[Any], int], blocks: list[list[Any]] | None = None):
        self.capacity, self.limit, self.size = capacity, limit, size
        self.blocks: list[list[Any]] = [list(b) for b in blocks or []]
        self.rooms = [capacity - sum(size(p) for p in b) for b in self.blocks]

    def add(self, piece: Any) -> list[list[Any]]:
        need = self.size(piece)
        best, best_room = -1, self.capacity + 1
        for i, room in enumerate(self.rooms):  # the tightest fit; the oldest block on a tie
            if need <= room < best_room:
                best, best_room = i, room
        out = []
        if best < 0:
            if len(self.blocks) >= self.limit:  # the fullest block goes out: it wastes the least
                fullest = min(range(len(self.rooms)), key=self.rooms.__getitem__)
                out.append(self._pop(fullest))
            self.blocks.append([])
            self.rooms.append(self.capacity)
            best = len(self.blocks) - 1
        self.blocks[best].append(piece)
        self.rooms[best] -= need
        if self.rooms[best] == 0:
            out.append(self._pop(best))
        return out

    def _pop(self, i: int) -> list[Any]:
        self.rooms.pop(i)
        return self.blocks.pop(i)

    def repack(self) -> list[list[Any]]:
        """The open pieces repacked first-fit decreasing (stable: equal sizes keep their order); the buffer empties."""
        pieces = sorted((p for b in self.blocks for p in b), key=self.size, reverse=True)
        blocks: list[list[Any]] = []
        rooms: list[int] = []
        for piece in pieces:
            need = self.size(piece)
            at = next((i for i, room in enumerate(rooms) if room >= need), -1)
            if at < 0:
                blocks.append([])
                rooms.append(self.capacity)
            blocks[at].append(piece)
            rooms[at] -= need
        self.blocks, self.rooms = [], []
        return blocks


def check_open_blocks(partitions: dict, capacity: int, limit: int, size: Callable[[Any], int]) -> None:
    """Every cursor's open blocks: at most `limit`, each within `capacity` slots; StateError naming the partition."""
    for key, cursor in partitions.items():
        _check_blocks(key, cursor.get("open_blocks", []), capacity, limit, size)


def _check_blocks(key: str, blocks: Any, capacity: int, limit: int, size: Callable[[Any], int]) -> None:
    if not isinstance(blocks, list) or len(blocks) > limit:
        raise StateError(f"data state partition {key!r} has open_blocks that are not a list of at most {limit} blocks")
    for block in blocks:
        try:
            used = sum(size(p) for p in block) if isinstance(block, list) and block else -1
        except (TypeError, ValueError):
            used = -1
        if not 0 < used <= capacity:
            raise StateError(f"data state partition {key!r} has an open block that does not fit {capacity} "
                             "tokens; resume with the packing settings the state was saved with")


def window_slots(window: Any) -> int:
    """A token window of n + 1 tokens fills n slots: inputs `window[:-1]`, labels `window[1:]`."""
    if not isinstance(window, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in window):
        raise TypeError("a window holds token ids")
    return len(window) - 1


def sample_slots(sample: Any) -> int:
    """A fine-tuning sample `[input_ids, labels]` fills one slot per token; both lists hold ids, equally many."""
    if not (isinstance(sample, list) and len(sample) == 2 and len(sample[0]) == len(sample[1])):
        raise TypeError("a sample is [input_ids, labels]")
    window_slots([0, *sample[0]])
    window_slots([0, *sample[1]])
    return len(sample[0])


class BestFitPacker:
    """The packer's cursor, its anchor and the end of a partition; subclasses say how an item becomes pieces."""

    def __init__(self, capacity: int, buffer: int, cursor: dict | None = None):
        cursor = cursor or {}
        self.offset = int(cursor.get("offset", 0))
        self.records = int(cursor.get("records", 0))
        self.skip = int(cursor.get("skip", 0))
        self.done = bool(cursor.get("done", False))
        self.draining = bool(cursor.get("draining", False))  # the open blocks are final: the partition ended
        # open blocks hold (piece, its cursor form): a piece is written out for the cursor once, not per batch
        blocks = [[(self.load_piece(raw), raw) for raw in b] for b in cursor.get("open_blocks", [])]
        self.open = OpenBlocks(capacity, buffer, lambda entry: self.slots(entry[0]), blocks)
        self._anchor = (self.offset, self.records)

    def slots(self, piece: Any) -> int:
        raise NotImplementedError

    def load_piece(self, raw: Any) -> Any:
        return raw

    def dump_piece(self, piece: Any) -> Any:
        return piece

    def cursor(self) -> dict:
        offset, records = self._anchor
        return {
            "offset": offset, "records": records, "token_buffer": [], "skip": self.skip, "done": self.done,
            "draining": self.draining, "open_blocks": [[raw for _, raw in b] for b in self.open.blocks],
        }

    def _add(self, piece: Any) -> Iterator[list[Any]]:
        """Place one piece; yield the blocks that go out (lists of pieces)."""
        for block in self.open.add((piece, self.dump_piece(piece))):
            yield [p for p, _ in block]

    def _consumed(self, offset_after: int) -> None:
        """The record is fed whole: the cursor moves after it."""
        self.offset, self.records = offset_after, self.records + 1
        self._anchor, self.skip = (self.offset, self.records), 0

    def finish(self) -> Iterator[list[Any]]:
        """The partition ended: its open blocks, repacked, go out; the cursor carries those not yet out."""
        if not self.draining:
            self.open.blocks = self.open.repack()
            self.open.rooms = [0] * len(self.open.blocks)  # final: nothing more goes in
            self.draining = True
        self._anchor, self.skip = (self.offset, self.records), 0
        self.done = not self.open.blocks
        while self.open.blocks:
            block = self.open.blocks.pop(0)
            self.open.rooms.pop(0)
            self.done = not self.open.blocks
            yield [p for p, _ in block]


class BestFitCutter(BestFitPacker):
    """`WindowCutter`'s interface for best fit: `feed` yields blocks (lists of token windows)."""

    def __init__(self, max_seq_len: int, eos_id: int, buffer: int, cursor: dict | None = None):
        self.L, self.eos = max_seq_len, eos_id
        super().__init__(max_seq_len, buffer, cursor)

    def slots(self, window: np.ndarray) -> int:
        return len(window) - 1  # n + 1 tokens: inputs window[:-1], labels window[1:]

    def load_piece(self, raw: list[int]) -> np.ndarray:
        return np.asarray(raw, dtype=np.int32)

    def dump_piece(self, window: np.ndarray) -> list[int]:
        return window.tolist()

    def feed(self, ids: np.ndarray, offset_after: int) -> Iterator[list[np.ndarray]]:
        """Place one document (+EOS); yield every block that goes out."""
        data = np.concatenate([np.asarray(ids, dtype=np.int32), np.array([self.eos], dtype=np.int32)])
        L, n = self.L, len(data) - 1  # n slots: an empty document fills none and teaches nothing
        n_full, tail = n // L, n % L
        first = self.skip // L  # resuming inside this document: these blocks went out already
        for k in range(first, n_full):
            if k == n_full - 1 and not tail:
                self._consumed(offset_after)
            else:
                self.skip = (k + 1) * L  # the anchor stays before this document
            yield [data[k * L : k * L + L + 1]]
        if n_full == 0 or tail:
            self._consumed(offset_after)
        if tail:
            yield from self._add(data[n_full * L :])


def block_example(block: list[np.ndarray], max_seq_len: int, eos_id: int, ignore: int) -> tuple[np.ndarray, ...]:
    """A block of windows to (input_ids, labels, position_ids), each `max_seq_len` long.

    Each window's positions count from 0; the padding after the last window is one more
    run of positions (its labels are `ignore`), so position 0 marks every piece's start.
    """
    input_ids = np.full(max_seq_len, eos_id, dtype=np.int64)
    labels = np.full(max_seq_len, ignore, dtype=np.int64)
    positions = np.empty(max_seq_len, dtype=np.int64)
    at = 0
    for w in block:
        n = len(w) - 1
        input_ids[at : at + n] = w[:-1]
        labels[at : at + n] = w[1:]
        positions[at : at + n] = np.arange(n)
        at += n
    positions[at:] = np.arange(max_seq_len - at)
    return input_ids, labels, positions


def cu_seqlens(position_ids: Any) -> Any:
    """flash-attention's varlen boundaries of a (batch, seq) position tensor: int32 starts of every run, then the total."""
    import torch

    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    return torch.cat([starts, torch.tensor([flat.numel()], device=flat.device)]).to(torch.int32)
