"""Item loaders: how a dataset's shards turn into samples (LitData-compatible names)."""

from __future__ import annotations

import numbers
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
    `dtype` of the token batches: `torch.int64` (the default, what embedding layers take),
    `torch.int32` (half the bytes to copy and to move to the GPU), or None for the stored
    dtype (uint16 or uint32: no conversion at all; cast on the device).
    """

    block_size: int | None = None
    document_boundaries: bool = False
    pad_id: int | None = None
    dtype: object = "int64"

    kind = "tokens"

    def __post_init__(self) -> None:
        # bool is an int to Python: block_size=True would silently read blocks of one token.
        for key, lo in (("block_size", 1), ("pad_id", 0)):
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
                raise ValueError(f"TokensLoader.{key} must be an integer >= {lo}, got {value!r}")
            object.__setattr__(self, key, int(value))
        if not isinstance(self.document_boundaries, bool):
            raise ValueError(f"TokensLoader.document_boundaries must be True or False, got {self.document_boundaries!r}")
        object.__setattr__(self, "dtype", token_dtype_name(self.dtype))


def token_dtype_name(value: object) -> str | None:
    """'int64', 'int32' or None (the stored dtype) from a torch or numpy dtype, a name, or None."""
    if value is None:
        return None
    name = str(value).removeprefix("torch.")
    name = {"long": "int64", "int": "int32"}.get(name, name)
    if name not in ("int64", "int32"):
        raise ValueError(f"TokensLoader.dtype must be torch.int64, torch.int32 or None (the stored dtype), got {value!r}")
    return name


@dataclass(frozen=True)
class ItemsLoader:
    """Samples are the Python objects `optimize`'s function returned, one per item."""

    kind = "items"
