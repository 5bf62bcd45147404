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
