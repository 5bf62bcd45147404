"""How a worker's chunk reaches the loader: split back into batches, or an error sent in its place."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from llm.data.shards.read.source import SampleSource
from llm.data.worker_errors import send


def split_chunk(chunk: dict[str, Any], sizes: list[int], document_boundaries: bool) -> Iterator[Any]:
    """The batches of one chunk, `sizes` samples each (a worker's last chunk may hold counts only, no batch)."""
    if "batches" in chunk:
        yield from chunk["batches"]
        return
    row = 0
    for size in sizes:
        if document_boundaries:
            yield {"input_ids": chunk["input_ids"][row : row + size], "position_ids": chunk["position_ids"][row : row + size]}
        else:
            yield chunk["input_ids"][row : row + size]
        row += size


class SendsErrors(IterableDataset):
    """The dataset as DataLoader worker processes iterate it: an error travels to the loader as
    itself, in the place of the worker's next chunk (worker_errors.py), not in torch's wrapper."""

    def __init__(self, source: SampleSource):
        self.source = source

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self.source
        except Exception as e:
            info = get_worker_info()
            sent = send(e, f"DataLoader worker process {info.id if info else 0}")
            if sent is None:
                raise
            yield {"error": sent}
