"""Item loaders: how a dataset's shards turn into samples (LitData-compatible names)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokensLoader:
    """Samples are fixed-length token blocks cut from the concatenation of all documents.

    Block i is tokens [i*block_size, (i+1)*block_size); blocks cross shard boundaries,
    so only the very last block can be short. With `document_boundaries=True` a
    sample is a dict with `input_ids` and `position_ids` restarting at 0 at each
    document start. `pad_id` fills a short last block (default: the dataset's EOS id,
    else 0); pass `drop_last=True` to the dataset to drop it instead.
    `block_size` is only needed when reading; `optimize` ignores it.
    """

    block_size: int | None = None
    document_boundaries: bool = False
    pad_id: int | None = None

    kind = "tokens"


@dataclass(frozen=True)
class ItemsLoader:
    """Samples are the Python objects `optimize`'s function returned, one per item."""

    kind = "items"
