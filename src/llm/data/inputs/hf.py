"""Hugging Face streaming datasets as a source: partitions are the dataset's shards."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from llm.data.inputs.hub_reach import check_hub_reachable
from llm.data.inputs.readers import InputError
from llm.data.inputs.source import Partition, Record, RecordFilter, TextSource


class HFStreamTextSource(TextSource):
    """`datasets.load_dataset(dataset_name, dataset_config, split=..., streaming=True)`, read lazily.

    A hub dataset whose hub cannot be reached is a `HubUnreachable` error at once, naming
    the local twin in the keys `twin` says the user wrote (`hub_reach.LOCAL_TWIN`).
    """

    def __init__(
        self,
        dataset_name: str,
        dataset_config: str | None = None,
        split: str = "train",
        text_column: str | None = "text",
        data_files: str | list[str] | None = None,
        twin: str = "local",
    ):
        self.dataset_name, self.dataset_config, self.split = dataset_name, dataset_config, split
        self.text_column = text_column
        self.data_files = data_files
        self.twin = twin
        self._ds: Any = None

    def _dataset(self) -> Any:
        if self._ds is None:
            import datasets

            check_hub_reachable(self.dataset_name, self.twin)  # before load_dataset's retry loop
            kwargs: dict[str, Any] = {"split": self.split, "streaming": True}
            if self.data_files:
                kwargs["data_files"] = self.data_files
            self._ds = datasets.load_dataset(self.dataset_name, self.dataset_config, **kwargs)
        return self._ds

    def source_fingerprint(self) -> dict:
        fp = {
            "type": "hf",
            "dataset_name": self.dataset_name,
            "dataset_config": self.dataset_config,
            "split": self.split,
            "text_column": self.text_column,
        }
        if self.data_files:
            fp["data_files"] = self.data_files
        return fp

    def partitions(self) -> list[Partition]:
        n = self._dataset().num_shards
        return [Partition(f"shard{i:05d}of{n}", shard=i) for i in range(n)]

    def _rows(self, ds: Any, offset: int, want: RecordFilter = None) -> Iterator[Record]:
        if offset:
            ds = ds.skip(offset)  # HF streams cannot seek: the skipped rows are re-read
        row = offset
        # .iter() rather than iter(ds): inside a DataLoader worker, iter(ds) would split the
        # shards over the workers a second time; our partitions already did that.
        for batch in _batches(ds):
            if self.text_column is None:  # whole records, as JSON (fine-tuning)
                for values in zip(*batch.values()):
                    row += 1
                    if want is None or want(row):
                        yield json.dumps(dict(zip(batch, values)), ensure_ascii=False, default=str), row, None
                continue
            if self.text_column not in batch:
                keys = ", ".join(sorted(batch))
                raise InputError(
                    f"{self.dataset_name}: missing text column {self.text_column!r} (columns: {keys}); set text_column"
                )
            for text in batch[self.text_column]:
                row += 1
                if want is not None and not want(row):
                    continue
                if isinstance(text, str) and text.strip():
                    yield text.strip(), row, None

    def iter_partition(self, part: Partition, offset: int = 0, want: RecordFilter = None) -> Iterator[Record]:
        ds = self._dataset()
        yield from self._rows(ds.shard(ds.num_shards, part.shard or 0, contiguous=True), offset, want)

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        yield from (text for text, _, _ in self._rows(self._dataset(), skip))


def _batches(ds: Any, size: int = 256) -> Iterator[dict[str, list]]:
    """Column batches: `.iter()` of a Hugging Face dataset; any other iterable of row dicts
    (the guide's users pass objects with only `skip` and `__iter__`) batched here."""
    import datasets

    if isinstance(ds, (datasets.IterableDataset, datasets.Dataset)):
        yield from ds.iter(batch_size=size)
        return
    rows = iter(ds)
    while chunk := list(itertools.islice(rows, size)):
        keys = dict.fromkeys(key for row in chunk for key in row)
        yield {key: [row.get(key) for row in chunk] for key in keys}
