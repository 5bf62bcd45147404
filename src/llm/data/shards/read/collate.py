"""collate_items: PyTorch's default_collate for item batches, plus PIL images and None, and faster on arrays."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate


def collate_items(batch: list[Any]) -> Any:
    """Batch items as `default_collate` does (dicts of stacked tensors, ints -> int64, strings -> lists...).

    Numeric numpy arrays of one shape are stacked by numpy then wrapped (one tensor, the same
    values and dtype default_collate gives, without a tensor per item); PIL images and None,
    which default_collate refuses, stay lists.
    """
    elem = batch[0]
    kind = type(elem)
    if kind is dict:
        return {key: collate_items([item[key] for item in batch]) for key in elem}
    if kind is np.ndarray and elem.dtype.kind in "biufc" and all(
        type(x) is np.ndarray and x.shape == elem.shape and x.dtype == elem.dtype for x in batch
    ):
        return torch.from_numpy(np.stack(batch))
    if elem is None or _is_image(elem):
        return list(batch)
    if kind in (list, tuple) and all(type(x) is kind and len(x) == len(elem) for x in batch):
        return [collate_items(list(column)) for column in zip(*batch)]
    return default_collate(batch)


def _is_image(value: Any) -> bool:
    image = sys.modules.get("PIL.Image")
    return image is not None and isinstance(value, image.Image)


class Batches:
    """A worker's collated batches, as one object: DataLoader's default_convert walks lists and
    dicts item by item, but passes anything else through untouched.

    Sent from a worker process, its tensors travel as numpy arrays inside the one pickle and
    become tensors again (without a copy) on arrival: a tensor sent as itself costs a shared
    memory segment and a file descriptor each, which made small batches IPC-bound.
    """

    __slots__ = ("batches",)

    def __init__(self, batches: list[Any]):
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def __reduce__(self) -> tuple:
        return _rebuild, (_pack(self.batches),)


class _Tensor:
    """A tensor in transit, as the numpy array holding its values."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array

    def __reduce__(self) -> tuple:
        return _Tensor, (self.array,)


def _pack(value: Any) -> Any:
    kind = type(value)
    if kind is torch.Tensor and not value.requires_grad and value.device.type == "cpu":
        try:
            return _Tensor(value.numpy())
        except TypeError:  # a dtype numpy lacks (bfloat16): sent as a tensor
            return value
    if kind is dict:
        return {k: _pack(v) for k, v in value.items()}
    if kind in (list, tuple):
        return kind(_pack(v) for v in value)
    return value


def _unpack(value: Any) -> Any:
    kind = type(value)
    if kind is _Tensor:
        return torch.from_numpy(value.array)
    if kind is dict:
        return {k: _unpack(v) for k, v in value.items()}
    if kind in (list, tuple):
        return kind(_unpack(v) for v in value)
    return value


def _rebuild(batches: list[Any]) -> Batches:
    return Batches(_unpack(batches))


def item_chunk(reader: Any, samples: np.ndarray, sizes: np.ndarray, collate: Any) -> dict[str, Any]:
    """Several consecutive batches of an item dataset, read with one offsets lookup and collated."""
    collate = collate or collate_items
    items = reader.get_many(samples)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return {"sizes": sizes, "batches": Batches([collate(items[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])}
