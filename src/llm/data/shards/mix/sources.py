"""What a mixture's sources must share (kind, block size, dtype, boundaries, tokenizer), their names, their tokens."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from llm.data.shards.read.dataset import StreamingDataset


def check_sources(datasets: Sequence[StreamingDataset]) -> list[StreamingDataset]:
    """The sources as a list, or one error naming the source that does not fit datasets[0]."""
    if isinstance(datasets, (str, bytes)) or not isinstance(datasets, Sequence) or not datasets:
        raise ValueError(f"CombinedStreamingDataset needs a non-empty list of StreamingDatasets, got {datasets!r}")
    sources = list(datasets)
    first = sources[0]
    for i, d in enumerate(sources):
        if not isinstance(d, StreamingDataset):
            raise TypeError(f"datasets[{i}] is a {type(d).__name__}, expected a StreamingDataset")
        _check_same(i, d, first)
    return sources


def _check_same(i: int, d: StreamingDataset, first: StreamingDataset) -> None:
    if d.manifest.kind != first.manifest.kind:
        raise ValueError(f"datasets[{i}] holds {d.manifest.kind} but datasets[0] holds {first.manifest.kind}; mix datasets of one kind")
    if d.manifest.tokenizer and first.manifest.tokenizer and d.manifest.tokenizer != first.manifest.tokenizer:
        raise ValueError(
            f"datasets[{i}] ({d.input_dir}) was tokenized with {d.manifest.tokenizer} but datasets[0] "
            f"({first.input_dir}) with {first.manifest.tokenizer}; mix datasets made with one tokenizer"
        )
    if d.manifest.kind != "tokens":
        return
    if d.block_size != first.block_size:
        raise ValueError(f"datasets[{i}] has block_size {d.block_size} but datasets[0] has {first.block_size}; use one TokensLoader block size")
    if d.token_dtype != first.token_dtype:
        raise ValueError(f"datasets[{i}] gives {d.token_dtype} tokens but datasets[0] gives {first.token_dtype}; pass one TokensLoader dtype")
    bounds = d.item_loader.document_boundaries
    if bounds != first.item_loader.document_boundaries:
        raise ValueError(f"datasets[{i}] has document_boundaries={bounds} but datasets[0] does not; use one TokensLoader setting")


def source_names(dirs: Sequence[str], numbered: bool = True) -> list[str]:
    """Each source's name in the accounting: its folder's name (`wiki` for `s3://b/wiki/`), repeats numbered
    (`numbered=False`: the folder names as they are)."""
    out: list[str] = []
    for i, d in enumerate(dirs):
        name = PurePosixPath(d.rstrip("/").replace("\\", "/")).name or d
        out.append(name if name not in out or not numbered else f"{name}#{i}")
    return out


def item_tokens(item: Any) -> int:
    """The default `tokens_of`: the length of an item's `input_ids` (or of the item, an array or list)."""
    if isinstance(item, dict):
        if "input_ids" not in item:
            raise ValueError(f"an item with keys {sorted(item)} has no input_ids; pass tokens_of= to count its tokens")
        item = item["input_ids"]
    return int(np.size(item))


def count_tokens(dataset: StreamingDataset, tokens_of: Callable[[Any], int] | None, name: str) -> np.ndarray:
    """Every item's token count, in sample order (read in blocks through the dataset's own path)."""
    count = tokens_of or item_tokens
    out = np.empty(dataset.num_samples, dtype=np.int64)
    for start in range(0, dataset.num_samples, 4096):
        ids = np.arange(start, min(start + 4096, dataset.num_samples), dtype=np.int64)
        for i, item in zip(ids.tolist(), dataset.sample_list(ids)):
            n = count(item)
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
                raise ValueError(f"tokens_of gave {n!r} for item {i} of {name}; it must return a whole number >= 0")
            out[i] = n
    return out
