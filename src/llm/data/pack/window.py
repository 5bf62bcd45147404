"""One partition's token buffer to fixed-length blocks, with EOS after every document.

Blocks are windows of `max_seq_len + 1` tokens: `input_ids = window[:-1]`,
`labels = window[1:]` (labels are already shifted: the trainer must NOT shift
them again). Consecutive windows overlap by one token, so every token of the
stream is predicted exactly once. The last window of a partition may be short:
it is padded with EOS in `input_ids` and `IGNORE_INDEX` in `labels`.

The cursor is exact and bounded: `offset`/`records` point after the last record
whose tokens are all in the past or in `token_buffer` (at most `max_seq_len`
tokens); while a long record is being cut, the cursor stays before it and
`skip` counts the tokens of `token_buffer + record` already emitted. `tokens` counts the
tokens (ids + EOS) of the `records` counted, for a mixture whose weights are token shares.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

IGNORE_INDEX = -100


def new_cursor() -> dict:
    """The cursor of a partition nobody has read yet."""
    return {"offset": 0, "records": 0, "tokens": 0, "token_buffer": [], "skip": 0, "done": False}


class WindowCutter:
    """Cuts one partition's tokens into windows; `cursor()` is the exact position after the last one.

    The buffer (tokens fed but not yet in a full window) is kept as a list of pieces and joined
    only when a window completes: most short documents complete none, and then `feed` copies
    the document alone (not the buffer with it) and makes no generator.
    """

    def __init__(self, max_seq_len: int, eos_id: int, cursor: dict | None = None):
        cursor = cursor or new_cursor()
        self.L = max_seq_len
        self.eos = eos_id
        self._eos = np.array([eos_id], dtype=np.int32)
        self.offset = int(cursor["offset"])
        self.records = int(cursor["records"])
        self.tokens = int(cursor.get("tokens", 0))
        buffer = np.asarray(cursor["token_buffer"], dtype=np.int32)
        self._parts: list[np.ndarray] = [buffer] if len(buffer) else []
        self._size = len(buffer)  # tokens in the buffer
        self.skip = int(cursor.get("skip", 0))
        self.done = bool(cursor.get("done", False))
        # while cutting a long record, the cursor stays at the state before it; a buffer in an
        # anchor is (pieces, how many of them): `_parts` only grows until a cut replaces it
        self._anchor = (self.offset, self.records, self._snapshot(), self.tokens)

    @property
    def buffer(self) -> np.ndarray:
        """The tokens fed but not yet in a full window (int32)."""
        return _join(self._snapshot())

    def _snapshot(self) -> tuple[list[np.ndarray], int]:
        return self._parts, len(self._parts)

    def cursor(self) -> dict:
        return listed(self.wire_cursor())

    def wire_cursor(self) -> dict:
        """`cursor()` with its token buffer as an int32 array of its own, not a list: what a worker sends with
        every batch. Why: up to max_seq_len Python ints a batch, made, pickled and unpickled, cost the
        stream about a tenth of its CPU; the main process lists a buffer only when a state is taken (`listed`)."""
        offset, records, buffer, tokens = self._anchor
        return {
            "offset": offset,
            "records": records,
            "tokens": tokens,
            "token_buffer": _join(buffer).copy(),  # a copy: a view would keep the whole cut chunk alive
            "skip": self.skip,
            "done": self.done,
        }

    def feed(self, ids: np.ndarray, offset_after: int) -> Iterator[np.ndarray]:
        """Append one document (+EOS); yield every full window it completes.

        Iterate the result at once (as a for loop does): the cursor moves as windows are taken.
        """
        n = len(ids)
        if self._size + n < self.L:  # no window completes (fewer than L + 1 tokens): no join
            # the document's own copy: a view would keep its whole encoded chunk alive in the buffer
            self._parts.append(np.array(ids, dtype=np.int32))
            self._parts.append(self._eos)
            self._size += n + 1
            self.offset, self.records, self.tokens = offset_after, self.records + 1, self.tokens + n + 1
            self._anchor, self.skip = (self.offset, self.records, self._snapshot(), self.tokens), 0
            return iter(())
        return self._cut(ids, offset_after)

    def _cut(self, ids: np.ndarray, offset_after: int) -> Iterator[np.ndarray]:
        data = np.concatenate([*self._parts, ids, self._eos], dtype=np.int32, casting="unsafe")
        L = self.L
        n_full = max(0, (len(data) - 1) // L)  # windows k with k*L + L + 1 <= len(data)
        first = self.skip // L  # resuming inside this record: these windows were emitted
        before = (self.offset, self.records, self._snapshot(), self.tokens)
        rest = data[n_full * L :]
        self._parts, self._size = [rest], len(rest)  # a new list: `before` keeps the old pieces
        self.offset, self.records = offset_after, self.records + 1
        self.tokens += len(ids) + 1
        after = (self.offset, self.records, self._snapshot(), self.tokens)
        for k in range(first, n_full):
            if k == n_full - 1:
                self._anchor, self.skip = after, 0
            else:
                self._anchor, self.skip = before, (k + 1) * L
            yield data[k * L : k * L + L + 1]
        if n_full <= first:
            self._anchor, self.skip = after, 0

    def cut_chunk(self, items: list[np.ndarray], offsets_after: list[int]) -> np.ndarray:
        """Feed several documents at once: every window they complete, as rows of one (windows, L + 1) view.

        The same windows and final cursor as `feed` on each in turn, with NumPy over the whole chunk
        instead of Python per document and per window (short documents cost their Python, not their
        tokens). The cursor is left after the last document; `taken(k)` puts it where `feed` would have
        it once window k (and none after it) was taken, for a batch that ends inside the chunk.
        Not while resuming inside a record (`skip`): `feed` the first record then.
        """
        assert self.skip == 0, "cut_chunk while resuming inside a record: feed it first"
        lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items)) + 1  # each with its EOS
        pieces = [*self._parts]
        for ids in items:
            pieces += (ids, self._eos)
        data = np.concatenate(pieces, dtype=np.int32, casting="unsafe")
        L, size = self.L, len(data)
        ends = np.cumsum(lengths) + self._size  # each document's end in `data`
        n = max(0, (size - 1) // L)  # windows k with k*L + L + 1 <= size
        # what `taken` needs: the state before the chunk and each document's end, offset and token count
        self._chunk = (data, ends, offsets_after, self.offset, self.records, self.tokens, self._size)
        rest = data[n * L:].copy()  # a copy: a view would keep the whole chunk alive in the buffer
        self._parts, self._size = [rest], len(rest)
        self.offset, self.records = offsets_after[-1], self.records + len(items)
        self.tokens += int(ends[-1]) - self._chunk[6]
        self._anchor, self.skip = (self.offset, self.records, self._snapshot(), self.tokens), 0
        self._chunk_end = self._anchor
        return np.lib.stride_tricks.as_strided(data, (n, L + 1), (data.strides[0] * L, data.strides[0]), writeable=False)

    def taken(self, k: int) -> None:
        """The cursor as `feed` leaves it once window k of the last `cut_chunk` is taken and no later one."""
        data, ends, offsets, offset0, records0, tokens0, size0 = self._chunk
        L = self.L
        d = int(np.searchsorted(ends, k * L + L + 1))  # the document that completes window k
        start = int(ends[d - 1]) if d else size0  # where that document starts in `data`
        if (k + 1) * L + L + 1 <= ends[d]:  # its next window is cut from it too: the cursor stays before it
            j = max(0, (start - 1) // L)  # windows completed before it: its buffer starts at the last one's end
            before = (offsets[d - 1] if d else offset0, records0 + d, [data[j * L:start].copy()],
                      tokens0 + start - size0)
            self._anchor, self.skip = (before[0], before[1], (before[2], 1), before[3]), (k + 1 - j) * L
        else:
            after = [data[(k + 1) * L:int(ends[d])].copy()]
            self._anchor = (offsets[d], records0 + d + 1, (after, 1), tokens0 + int(ends[d]) - size0)
            self.skip = 0

    def settle(self) -> None:
        """The cursor after the whole last `cut_chunk` again (after `taken`)."""
        self._anchor, self.skip = self._chunk_end, 0

    def finish(self) -> Iterator[np.ndarray]:
        """The partition ended: yield its last, short window (if it has one) and mark it done."""
        rest = self.buffer
        self._parts, self._size = [], 0
        self.done = True
        self._anchor, self.skip = (self.offset, self.records, self._snapshot(), self.tokens), 0
        if len(rest) >= 2:
            yield rest


def listed(cursor: dict) -> dict:
    """A cursor as a state holds it: its token buffer a list of ints (`wire_cursor` sends an array)."""
    buffer = cursor.get("token_buffer")
    if isinstance(buffer, np.ndarray):
        return {**cursor, "token_buffer": buffer.tolist()}
    return cursor


def _join(snapshot: tuple[list[np.ndarray], int]) -> np.ndarray:
    parts, count = snapshot
    if count == 1 and parts[0].dtype == np.int32:
        return parts[0]
    return np.concatenate(parts[:count], dtype=np.int32, casting="unsafe") if count else np.zeros(0, np.int32)


def to_example(window: np.ndarray, max_seq_len: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """A window of <= max_seq_len + 1 tokens to (input_ids, labels) of max_seq_len each."""
    n = len(window) - 1
    input_ids = np.full(max_seq_len, eos_id, dtype=np.int64)
    labels = np.full(max_seq_len, IGNORE_INDEX, dtype=np.int64)
    input_ids[:n] = window[:-1]
    labels[:n] = window[1:]
    return input_ids, labels
