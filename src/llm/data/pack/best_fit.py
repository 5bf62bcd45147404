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

The cursor is exact: the open blocks (their tokens, each window as int32
little-endian bytes) are part of it, next to the offset of the last record fed. While a long document's full blocks go out, the
cursor stays before it and `skip` counts its tokens already emitted, as in
greedy packing. The buffer bounds the cursor: at most `packing_buffer *
max_seq_len` tokens per partition being read.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from llm.data.pack.window import IGNORE_INDEX, to_example
from llm.data.stage import StateError

PACKING_MODES = ("greedy", "best_fit")


def check_packing(packing: Any, packing_buffer: Any) -> None:
    """Raise ValueError naming the key and value for an unknown packing mode or a buffer below 1."""
    if packing not in PACKING_MODES:
        raise ValueError(f"packing {packing!r} is not a packing mode; use one of: {', '.join(PACKING_MODES)}")
    if isinstance(packing_buffer, bool) or not isinstance(packing_buffer, int) or packing_buffer < 1:
        raise ValueError(f"packing_buffer {packing_buffer!r} must be a whole number >= 1 (the open blocks kept)")


class OpenBlocks:
    """At most `limit` open blocks of `capacity` slots; `add` places one piece and returns the blocks that go out.

    A block is (pieces, their cursor forms): the cursor copies the second list, made once per
    piece, instead of writing every open piece out again for every batch. `order` keeps
    (free room, age) sorted, so the tightest fit (the oldest on a tie) and the fullest block
    are found by bisection, not by a scan of every open block per document.
    """

    def __init__(self, capacity: int, limit: int, blocks: list[tuple[list, list, int]] = ()):
        self.capacity, self.limit = capacity, limit
        self.blocks: dict[int, tuple[list, list]] = {}  # age -> (pieces, raws), oldest first
        self.order: list[tuple[int, int]] = []
        self._age = 0
        for pieces, raws, used in blocks:
            self._open(pieces, raws, capacity - used)

    def _open(self, pieces: list, raws: list, room: int) -> None:
        self.blocks[self._age] = (pieces, raws)
        insort(self.order, (room, self._age))
        self._age += 1

    def add(self, piece: Any, raw: Any, need: int) -> list[list[Any]]:
        """Place a piece of `need` slots; the pieces of every block that goes out."""
        at = bisect_left(self.order, (need, -1))
        if at < len(self.order):  # the tightest room that takes it
            room, age = self.order.pop(at)
            pieces, raws = self.blocks[age]
            pieces.append(piece)
            raws.append(raw)
            if room == need:  # exactly full: out at once
                return [self.blocks.pop(age)[0]]
            insort(self.order, (room - need, age))
            return []
        out = []
        if len(self.blocks) >= self.limit:  # no room anywhere: the fullest block goes out, it wastes the least
            out.append(self.blocks.pop(self.order.pop(0)[1])[0])
        if need == self.capacity:
            out.append([piece])
        else:
            self._open([piece], [raw], self.capacity - need)
        return out

    def raw_blocks(self) -> list[list[Any]]:
        return [list(raws) for _, raws in self.blocks.values()]

    def repack(self, size: Callable[[Any], int]) -> list[tuple[list, list]]:
        """The open pieces repacked first-fit decreasing (stable: equal sizes keep their order); the buffer empties."""
        entries = sorted((e for pieces, raws in self.blocks.values() for e in zip(pieces, raws)),
                         key=lambda e: size(e[0]), reverse=True)
        blocks: list[tuple[list, list]] = []
        rooms: list[int] = []
        for piece, raw in entries:
            need = size(piece)
            at = next((i for i, room in enumerate(rooms) if room >= need), -1)
            if at < 0:
                blocks.append(([], []))
                rooms.append(self.capacity)
            blocks[at][0].append(piece)
            blocks[at][1].append(raw)
            rooms[at] -= need
        self.blocks, self.order = {}, []
        return blocks


def check_open_blocks(partitions: dict, capacity: int, limit: int | None, size: Callable[[Any], int]) -> None:
    """Every cursor's open blocks: at most `limit`, each within `capacity` slots; StateError naming the partition.

    `limit` None: greedy packing, whose cursors hold no open blocks (nothing to check).
    """
    if limit is None:
        return
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


def window_slots(raw: Any) -> int:
    """A token window in a cursor: int32 little-endian bytes of n + 1 tokens, which fill n slots."""
    if not isinstance(raw, bytes) or len(raw) % 4 or len(raw) < 8:
        raise TypeError("a window is the bytes of at least two int32 token ids")
    return len(raw) // 4 - 1


def sample_slots(sample: Any) -> int:
    """A fine-tuning sample `[input_ids, labels]` fills one slot per token; both lists hold ids, equally many."""
    if not (isinstance(sample, list) and len(sample) == 2 and len(sample[0]) == len(sample[1])):
        raise TypeError("a sample is [input_ids, labels]")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in (*sample[0], *sample[1])):
        raise TypeError("a sample holds token ids")
    return len(sample[0])


class BestFitPacker:
    """The packer's cursor, its anchor and the end of a partition; subclasses say how an item becomes pieces."""

    def __init__(self, capacity: int, buffer: int, cursor: dict | None = None):
        cursor = cursor or {}
        self.offset = int(cursor.get("offset", 0))
        self.records = int(cursor.get("records", 0))
        self.tokens = int(cursor.get("tokens", 0))  # the records' tokens, for a mixture of token shares
        self.skip = int(cursor.get("skip", 0))
        self.done = bool(cursor.get("done", False))
        self.draining = bool(cursor.get("draining", False))  # the open blocks are final: the partition ended
        blocks = [([self.load_piece(raw) for raw in b], list(b)) for b in cursor.get("open_blocks", [])]
        self.final = blocks if self.draining else []  # the partition's last blocks, repacked, not out yet
        self.open = OpenBlocks(capacity, buffer, [] if self.draining else
                               [(p, r, sum(map(self.slots, p))) for p, r in blocks])
        self._anchor = (self.offset, self.records, self.tokens)
        # the run ledger's (text/provenance.py): when set, each window made is tagged with the document
        # being fed (`tag`) and its token range, so a block that goes out names what it holds
        self.tags: dict[int, tuple] | None = None
        self.tag: Any = None

    def slots(self, piece: Any) -> int:
        raise NotImplementedError

    def load_piece(self, raw: Any) -> Any:
        return raw

    def dump_piece(self, piece: Any) -> Any:
        return piece

    def cursor(self) -> dict:
        offset, records, tokens = self._anchor
        blocks = [list(raws) for _, raws in self.final] if self.draining else self.open.raw_blocks()
        return {"offset": offset, "records": records, "tokens": tokens, "token_buffer": [], "skip": self.skip, "done": self.done,
                "draining": self.draining, "open_blocks": blocks}

    def _add(self, piece: Any) -> list[list[Any]]:
        """Place one piece; the blocks that go out (lists of pieces)."""
        return self.open.add(piece, self.dump_piece(piece), self.slots(piece))

    def _consumed(self, offset_after: int, tokens: int) -> None:
        """The record (of `tokens` tokens) is fed whole: the cursor moves after it."""
        self.offset, self.records, self.tokens = offset_after, self.records + 1, self.tokens + tokens
        self._anchor, self.skip = (self.offset, self.records, self.tokens), 0

    def finish(self) -> Iterator[list[Any]]:
        """The partition ended: its open blocks, repacked, go out; the cursor carries those not yet out."""
        if not self.draining:
            self.final = self.open.repack(self.slots)
            self.draining = True
        self._anchor, self.skip = (self.offset, self.records, self.tokens), 0
        self.done = not self.final
        while self.final:
            pieces, _ = self.final.pop(0)
            self.done = not self.final
            yield pieces


class BestFitCutter(BestFitPacker):
    """`WindowCutter`'s interface for best fit: `feed` yields blocks (lists of token windows)."""

    def __init__(self, max_seq_len: int, eos_id: int, buffer: int, cursor: dict | None = None):
        self.L, self.eos = max_seq_len, eos_id
        super().__init__(max_seq_len, buffer, cursor)

    def slots(self, window: np.ndarray) -> int:
        return len(window) - 1  # n + 1 tokens: inputs window[:-1], labels window[1:]

    def load_piece(self, raw: bytes) -> np.ndarray:
        return np.frombuffer(raw, dtype="<i4").astype(np.int32)

    def dump_piece(self, window: np.ndarray) -> bytes:
        return window.astype("<i4", copy=False).tobytes()  # bytes, not a list: a memory copy per piece

    def feed(self, ids: np.ndarray, offset_after: int) -> Iterator[list[np.ndarray]]:
        """Place one document (+EOS); yield every block that goes out."""
        L, n = self.L, len(ids)  # n + 1 tokens with EOS fill n slots: an empty document fills none
        data = np.empty(n + 1, dtype=np.int32)
        data[:n] = ids
        data[n] = self.eos
        if n < L and not self.skip:  # the common case: a whole document, packed
            self._consumed(offset_after, n + 1)
            if n:
                yield from self._add(self._window(data, 0, n + 1))
            return
        n_full, tail = n // L, n % L
        first = self.skip // L  # resuming inside this document: these blocks went out already
        for k in range(first, n_full):
            if k == n_full - 1 and not tail:
                self._consumed(offset_after, n + 1)
            else:
                self.skip = (k + 1) * L  # the anchor stays before this document
            yield [self._window(data, k * L, k * L + L + 1)]
        if tail:
            self._consumed(offset_after, n + 1)
            yield from self._add(self._window(data, n_full * L, n + 1))

    def _window(self, data: np.ndarray, start: int, stop: int) -> np.ndarray:
        """data[start:stop]; tagged for the ledger (its inputs are the document's tokens start..stop-1)."""
        window = data[start:stop]
        if self.tags is not None:
            self.tags[id(window)] = (self.tag, start, stop - 1)
        return window


def block_example(block: list[np.ndarray], max_seq_len: int, eos_id: int) -> tuple[np.ndarray, ...]:
    """A block of windows to (input_ids, labels, position_ids), each `max_seq_len` long.

    Each window's positions count from 0; the padding after the last window is one more
    run of positions (its labels are -100), so position 0 marks every piece's start.
    """
    if len(block) == 1:  # one window (a long document's full block, or a lone piece): positions count up
        input_ids, labels = to_example(block[0], max_seq_len, eos_id)
        positions = np.arange(max_seq_len, dtype=np.int64)
        n = len(block[0]) - 1
        positions[n:] -= n
        return input_ids, labels, positions
    lengths = np.array([len(w) - 1 for w in block])
    used = int(lengths.sum())
    input_ids = np.full(max_seq_len, eos_id, dtype=np.int64)
    labels = np.full(max_seq_len, IGNORE_INDEX, dtype=np.int64)
    input_ids[:used] = np.concatenate([w[:-1] for w in block])
    labels[:used] = np.concatenate([w[1:] for w in block])
    # positions count from each piece's start: the offset of every slot minus its piece's start
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    positions = np.arange(max_seq_len, dtype=np.int64)
    positions[:used] -= starts
    positions[used:] -= used
    return input_ids, labels, positions


def cu_seqlens(position_ids: Any) -> Any:
    """flash-attention's varlen boundaries of a (batch, seq) position tensor: int32 starts of every run, then the total."""
    import torch

    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    return torch.cat([starts, torch.tensor([flat.numel()], device=flat.device)]).to(torch.int32)
