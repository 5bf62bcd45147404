"""`stream_lm`'s batch format: how a text stream's records become packed token blocks and batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import repeat
from typing import Any

import numpy as np

from llm.data.pack.best_fit import BestFitCutter, block_example
from llm.data.pack.window import WindowCutter, to_example
from llm.data.text.ring import SlotWriter
from llm.data.text.wire import as_tensors, seal_windows
from llm.data.tokenize.documents import encode_each
from llm.data.tokenize.protocol import Tokenizer


class TokenBlocks:
    """`stream_lm`'s batch format: records -> ids -> windows of max_seq_len + 1 -> shifted (input_ids, labels).

    A format tells the dataset how to cut one partition (`packer`), how to turn a
    chunk of record texts into items (`encode`) and how to make a batch of rows
    (`batch`); fine-tuning plugs in its own (`llm.data.sft.stream.SftSamples`).
    """

    def __init__(self, tokenizer: Tokenizer, max_seq_len: int, packed: bool = False, packing_buffer: int | None = None):
        self.tokenizer, self.max_seq_len, self.packed = tokenizer, max_seq_len, packed
        self.packing_buffer = packing_buffer  # set: best fit (text/best_fit.py) from this many open blocks

    def packer(self, cursor: dict | None) -> WindowCutter | BestFitCutter:
        if self.packing_buffer:
            return BestFitCutter(self.max_seq_len, self.tokenizer.eos_id, self.packing_buffer, cursor)
        return WindowCutter(self.max_seq_len, self.tokenizer.eos_id, cursor)

    def encode(self, texts: list[str], sources: list[int]) -> list[np.ndarray]:
        return encode_each(self.tokenizer, texts)

    def tokens(self, ids: np.ndarray) -> int:
        """The tokens a record adds to the stream: its ids and the EOS after them."""
        return len(ids) + 1

    def row_tokens(self, row: Any) -> int:
        """A row's trained tokens (labels that are not padding): a window's length less one (best fit: per window)."""
        return sum(len(w) - 1 for w in row) if self.packing_buffer else len(row) - 1

    def rows_tokens(self, rows: list[Any]) -> int:
        """`row_tokens` summed over a batch's rows."""
        if self.packing_buffer:
            return sum(map(self.row_tokens, rows))
        return sum(map(len, rows)) - len(rows)

    def packed_rows(self, rows: list[Any]) -> list[int] | None:
        """Token rows are the batch's rows as they are (the SFT format may pack several samples in one)."""
        return None

    def seal(self, items: list[dict], ring: SlotWriter | None = None) -> dict:
        """A worker's message of `items`: their windows (`_rows`) in one buffer, uint16 where ids fit (wire.py),
        written into a shared slot of `ring` where the worker has one (text/ring.py)."""
        return seal_windows(items, self.max_seq_len, self.tokenizer.vocab_size, ring)

    def batch(self, rows: list[Any]) -> dict[str, Any]:
        if self.packed and not self.packing_buffer:  # the windows as they are: one buffer per worker message
            return {"_rows": list(rows)}
        if self.packing_buffer:  # rows are blocks of windows: their document boundaries go out too
            planes = [block_example(b, self.max_seq_len, self.tokenizer.eos_id) for b in rows]
        else:
            planes = [to_example(w, self.max_seq_len, self.tokenizer.eos_id) for w in rows]
        arrays = [np.stack([p[i] for p in planes]) for i in range(len(planes[0]))]
        if self.packed:  # int32 bytes: pickled through the worker pipe, cheaper than tensors in shm
            return {"_packed": np.stack(arrays, axis=1).astype(np.int32).tobytes()}
        return as_tensors(arrays)


def chunk_windows(packer: WindowCutter, queue: Any, chunk: list, items: list[np.ndarray], rows: list, row_sources: list,
                  size: int, batch: Callable[[], dict]) -> Iterator[dict]:
    """A chunk of records for one plain window cutter: its windows in whole slices, a batch each time `rows` fills.

    What the dataset's per-record loop does (`WindowCutter.feed` on each record, a row at a time), with
    the windows cut by NumPy (`cut_chunk`) and the cursor set only where a batch ends (`taken`)."""
    (_, _, source), first = chunk[0], packer.records + 1
    for i, ((_, _, digest), _, _) in enumerate(chunk):
        if digest is not None:  # the seen-set commits a record once the cursor is past it
            queue.append((first + i, digest))
    windows = packer.cut_chunk(items, [after for (_, after, _), _, _ in chunk])
    j, n = 0, len(windows)
    while j < n:
        take = min(n - j, size - len(rows))
        rows.extend(windows[j:j + take])
        row_sources.extend(repeat(source, take))
        j += take
        if len(rows) == size:
            packer.taken(j - 1)
            yield batch()
    packer.settle()
