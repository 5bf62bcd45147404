"""What a text module's loaders return: the training epoch's iterable, the validation batches, the collate of whole batches."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from llm.data.text.dataset import StreamingTextDataset


def batches_as_they_are(item: dict) -> dict:
    """The DataLoader's collate for whole batches: they are tensors (or packed bytes) already.

    Its default (`default_convert`) walks every list of each batch's state (the packers' token
    buffers), a Python call per list, in the main process.
    """
    return item


class StreamingTextLoader:
    """What `train_dataloader()` returns: one epoch of batches; the module holds the exact state."""

    def __init__(self, module: Any):  # a StreamingTextDataModule (text/stream.py, which imports this module)
        self.module = module

    def __len__(self) -> int:
        return self.module.steps_per_epoch or 0

    def __iter__(self) -> Iterator[dict]:
        return self.module._iterate()


class ValLoader:
    """Re-iterable validation batches (the whole validation set, every rank alike)."""

    def __init__(self, ds: Iterable[dict]):
        self.ds = ds

    def __iter__(self) -> Iterator[dict]:
        for item in self.ds:
            if "input_ids" in item:
                yield {"input_ids": item["input_ids"], "labels": item["labels"]}


def val_loader(module: Any) -> ValLoader:
    """One pass over a text module's `val_dataset_path` (local files, same tokenizer and blocks)."""
    from llm.data.inputs.local import LocalLineTextSource

    settings = module.settings
    val = LocalLineTextSource(settings.val_dataset_path, settings.text_column, storage_options=settings.storage_options)
    ds = StreamingTextDataset(val, module.tokenizer, module.max_seq_len, module.batch_size, rank=0, world_size=1)
    return ValLoader(ds)
