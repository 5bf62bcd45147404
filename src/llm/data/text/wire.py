"""How a text worker's batches cross the DataLoader pipe: windows or int32 planes as bytes, rebuilt as tensors,
several batches to a message.

Why: the pipe, not the encoder, limited the main process with workers; bytes pickle faster than tensors,
and each message costs the DataLoader (its queues, its feeder thread, a pickle, a send and a receive)
about as much as encoding a batch of short documents, so a worker sends `group` batches at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch

from llm.data.pack.best_fit import cu_seqlens
from llm.data.pack.window import IGNORE_INDEX
from llm.data.text.ring import MessageRing, SlotWriter


def packed_windows(rows: list[np.ndarray], max_seq_len: int, vocab_size: int | None) -> bytes:
    """Windows of <= max_seq_len + 1 tokens as they are, for the worker pipe: (rows, bytes per token) as
    int32, each row's length as int32, then the rows zero-padded, in uint16 when the vocabulary fits.

    Why: the pipe, not the encoder, limited the main process with workers; this is a quarter of
    the (input_ids, labels) int32 planes, which `unpack_windows` rebuilds in the main process."""
    return _as_bytes(*_window_rows(rows, max_seq_len, vocab_size))


def _as_bytes(lengths: np.ndarray, tokens: np.ndarray, itemsize: int) -> bytes:
    out = bytearray(_windows_size(len(lengths), tokens.size, itemsize))
    _write_windows(out, lengths, tokens, itemsize)
    return bytes(out)  # bytes pickle (and unpickle) in one copy; a bytearray takes two under protocol 4


def windows_bytes(rows: int, max_seq_len: int, vocab_size: int | None) -> int:
    """The most bytes `packed_windows` makes of `rows` windows (a message ring's slot, text/ring.py)."""
    itemsize = 2 if vocab_size is not None and vocab_size <= 1 << 16 else 4
    return _windows_size(rows, rows * (max_seq_len + 1), itemsize)


def _windows_size(rows: int, tokens: int, itemsize: int) -> int:
    return 8 + 4 * rows + tokens * itemsize


def _window_rows(rows: list[np.ndarray], max_seq_len: int, vocab_size: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    """(each row's length, the rows zero-padded to max_seq_len + 1, bytes per token on the wire)."""
    width = max_seq_len + 1
    lengths = np.fromiter(map(len, rows), dtype=np.int32, count=len(rows))
    if lengths.min() == width:  # every window full: no padding
        tokens = np.stack(rows)
    else:
        tokens = np.zeros((len(rows), width), dtype=np.int32)
        for i, w in enumerate(rows):
            tokens[i, : len(w)] = w
    narrow = vocab_size is not None and vocab_size <= 1 << 16 and int(tokens.max(initial=0)) < 1 << 16
    return lengths, tokens, 2 if narrow else 4


def _write_windows(out: bytearray | memoryview, lengths: np.ndarray, tokens: np.ndarray, itemsize: int) -> None:
    """`packed_windows`' layout written into `out`: the narrowing cast is the only copy of the tokens."""
    rows = len(lengths)
    np.frombuffer(out, dtype=np.int32, count=2)[:] = (rows, itemsize)
    np.frombuffer(out, dtype=np.int32, count=rows, offset=8)[:] = lengths
    np.frombuffer(out, dtype=np.uint16 if itemsize == 2 else np.int32, count=tokens.size, offset=8 + 4 * rows)[:] = tokens.ravel()


def windows_planes(packed: bytes | memoryview, max_seq_len: int, eos_id: int) -> torch.Tensor:
    """`packed_windows`' bytes to one (2, rows, max_seq_len) int64 tensor: `to_example`'s input_ids
    (padded with EOS) and labels (padded with -100) of every window."""
    rows, itemsize = (int(v) for v in np.frombuffer(packed, dtype=np.int32, count=2))
    lengths = np.frombuffer(packed, dtype=np.int32, count=rows, offset=8)
    tokens = np.frombuffer(packed, dtype=np.uint16 if itemsize == 2 else np.int32, count=rows * (max_seq_len + 1),
                           offset=8 + 4 * rows).reshape(rows, max_seq_len + 1)
    planes = np.empty((2, rows, max_seq_len), dtype=np.int64)
    planes[0], planes[1] = tokens[:, :-1], tokens[:, 1:]
    for i in np.flatnonzero(lengths <= max_seq_len):  # a partition's last, short windows
        n = int(lengths[i]) - 1
        planes[0, i, n:], planes[1, i, n:] = eos_id, IGNORE_INDEX
    return torch.from_numpy(planes)


def unpack_windows(packed: bytes, max_seq_len: int, eos_id: int) -> dict[str, Any]:
    """`packed_windows`' bytes to `to_example`'s tensors: input_ids padded with EOS, labels with -100."""
    planes = windows_planes(packed, max_seq_len, eos_id)
    return as_tensors([planes[0], planes[1]])


def unpack(item: dict[str, Any], max_seq_len: int, best_fit: int | None, eos_id: int) -> dict[str, Any]:
    """A batch that crossed the worker pipe as bytes (`_windows`, or int32 planes `_packed`) to its tensors."""
    if "_windows" in item:
        return unpack_windows(item.pop("_windows"), max_seq_len, eos_id)
    planes = 3 if best_fit else 2  # best fit: position_ids too
    both = np.frombuffer(item.pop("_packed"), dtype=np.int32).reshape(-1, planes, max_seq_len)
    # one pass per plane: the strided int32 view cast into a new contiguous int64 array
    return as_tensors([torch.from_numpy(both[:, i].astype(np.int64)) for i in range(planes)])


def as_tensors(arrays: list[Any]) -> dict[str, Any]:
    """(input_ids, labels[, position_ids]) to the batch's tensors; positions also as flash-attention's cu_seqlens."""
    batch = {"input_ids": torch.as_tensor(arrays[0]), "labels": torch.as_tensor(arrays[1])}
    if len(arrays) > 2:
        batch["position_ids"] = torch.as_tensor(arrays[2])
        batch["cu_seqlens"] = cu_seqlens(batch["position_ids"])
    return batch


def group_size(batch_tokens: int, target: int = 1 << 18, most: int = 32) -> int:
    """Batches per worker message: about `target` tokens (~256k), at least one batch and at most `most`
    (tiny batches: a worker need not read far ahead before its first message).

    Why 256k: each message wakes the main process and a feeder thread on each side; on 2 cores, halving
    the messages from ~128k tokens each made the steady on-the-fly stream ~5% faster (bench onthefly)."""
    return max(1, min(most, target // max(1, batch_tokens)))


def grouped(items: Iterator[dict], group: int, seal: Callable[[list[dict]], dict] | None = None) -> Iterator[dict]:
    """A worker's items `group` at a time, one `{"_group": [...]}` message each (the last may be shorter);
    `seal` makes the message (the batch format's: its windows in one buffer).

    Every group of a worker but its last is full, which `ungrouped` relies on: a worker's items never
    end before the loader stops it (its "done" markers), so only a dataset iterated by hand ends."""
    while True:
        chunk = list(islice(items, group))
        if not chunk:
            return
        yield seal(chunk) if seal is not None else {"_group": chunk}


def seal_windows(items: list[dict], max_seq_len: int, vocab_size: int | None, ring: SlotWriter | None = None) -> dict:
    """`items` as one message: the windows of every batch (`_rows`) in one `packed_windows` buffer,
    each batch left with its count of rows; `open_group` gives each its tensors back.

    `ring`: this worker's shared slots (text/ring.py): the buffer is written into a slot and the message
    carries its reference (`_slot`) instead of the bytes (`_windows`), unless it does not fit one."""
    rows = [w for item in items if "_rows" in item for w in item["_rows"]]
    for item in items:
        if "_rows" in item:
            item["_rows"] = len(item["_rows"])
    out: dict[str, Any] = {"_group": items}
    if rows:
        lengths, tokens, itemsize = _window_rows(rows, max_seq_len, vocab_size)
        size = _windows_size(len(rows), tokens.size, itemsize)
        slot = ring.take(size) if ring is not None else None
        if slot is None:
            out["_windows"] = _as_bytes(lengths, tokens, itemsize)
        else:
            _write_windows(slot[0], lengths, tokens, itemsize)
            out["_slot"] = slot[1]
    return out


def one_message(seal: Callable[[list[dict]], dict], item: dict) -> dict:
    """An item that travels alone (no groups): its windows as its own bytes (`_windows`, `unpack`'s input)."""
    message = seal([item])
    if "_windows" in message:
        del item["_rows"]
        item["_windows"] = message["_windows"]
    return item


def open_group(message: dict, max_seq_len: int, eos_id: int, ring: MessageRing | None = None) -> list[dict]:
    """A message's items, each batch with its tensors: views into one (2, rows, max_seq_len) int64
    array converted from the message's windows at once (two NumPy calls for the whole message).

    `ring`: the workers' shared slots, for a message whose windows are in one (`_slot`); the slot is
    given back once the windows are copied out."""
    items = message["_group"]
    if "_slot" in message:
        if ring is None:
            raise RuntimeError("a text worker wrote its windows into shared slots that this loader did not make")
        ref = message["_slot"]
        planes = windows_planes(ring.read(ref), max_seq_len, eos_id)
        ring.release(ref)
    elif "_windows" in message:
        planes = windows_planes(message["_windows"], max_seq_len, eos_id)
    else:
        return items
    batches = [item for item in items if "_rows" in item]
    sizes = [item.pop("_rows") for item in batches]
    # contiguous: whole rows of each plane, cut by one split per plane (not two slices per batch)
    for item, ids, labels in zip(batches, planes[0].split(sizes), planes[1].split(sizes)):
        item["input_ids"], item["labels"] = ids, labels
    return items


def ungrouped(messages: Iterator[dict], workers: int, open_: Callable[[dict], list[dict]] | None = None
              ) -> Iterator[dict]:
    """`grouped` messages from `workers` DataLoader workers (served in turn) to items in the order they
    would have come one at a time: one group from each worker, then their items in turn; `open_`
    takes a message's items out of it (default: as they are).

    The DataLoader serves workers strictly in turn and every group is full, so item j of worker w's
    k-th group is its (k * group + j)-th item either way; the stream is the same batch for batch."""
    while True:
        groups = [open_(m) if open_ is not None else m["_group"] for m in islice(messages, workers)]
        if not groups:
            return
        for j in range(max(map(len, groups))):
            for g in groups:
                if j < len(g):
                    yield g[j]
