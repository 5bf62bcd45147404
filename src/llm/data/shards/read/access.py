"""Random access (`ds[i]`, `ds[a:b:s]`) and the per-sample path that applies `transform` and an overridden `__getitem__`.

The loader's fast path reads a chunk of token blocks with vectorised copies and never
calls `__getitem__`. A dataset with a `transform`, or a subclass that overrides
`__getitem__`, must see every sample go through that code, so its chunks take the
per-sample path: sample by sample (`ds[i]` for an overridden `__getitem__`; otherwise
a vectorised read, then `transform` on each sample), then `collate_fn` (default:
`default_collate`) per batch. The cost is one Python call (or more) per sample instead
of one copy per chunk: fine for item datasets, a real slowdown for plain token blocks.

A slice is always `[ds[i] for i in range(...)]`: a subclass's `__getitem__` is wrapped so
that it only ever sees integers (unless it sets `__getitem__.handles_slices = True`).
"""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils.collate import default_collate

from llm.data.shards.read.collate import collate_items, item_chunk
from llm.data.shards.read.profiling import current, span


class Compose:
    """Several transforms applied in order (picklable, so it travels to worker processes)."""

    def __init__(self, transforms: list[Callable[[Any], Any]]):
        self.transforms = transforms

    def __call__(self, sample: Any) -> Any:
        for t in self.transforms:
            sample = t(sample)
        return sample


def as_transform(value: Any) -> Callable[[Any], Any] | None:
    """`transform=`: None, a callable, or a list of callables applied in order (as LitData takes it)."""
    if value is None or (callable(value) and not isinstance(value, (list, tuple))):
        return value
    steps = list(value) if isinstance(value, (list, tuple)) else [value]
    for t in steps:
        if not callable(t):
            raise TypeError(f"transform must be a callable taking one sample, or a list of them, got {t!r}")
    return Compose(steps) if steps else None


class SampleAccess:
    """Mixed into StreamingDataset: samples as `ds[i]` gives them, one at a time or as lists."""

    transform: Callable[[Any], Any] | None = None
    num_samples: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Why rewrite a subclass's __getitem__: LitData users subclass the dataset and override
        # `__getitem__(self, index: int)`; `ds[a:b]` must still be a list of their samples, and
        # their code must never receive a slice it was not written for. A base method cannot do
        # it (the override replaces it), so the override is wrapped once, when the class is made
        # (tests/data/shards/test_transforms.py covers both subclass cases).
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__getitem__")
        if own is None or getattr(own, "handles_slices", False):
            return

        @functools.wraps(own)
        def getitem(self: SampleAccess, index: Any) -> Any:
            if isinstance(index, slice):
                return [own(self, i) for i in range(*index.indices(self.num_samples))]
            return own(self, index)

        getitem.handles_slices = True  # type: ignore[attr-defined]
        cls.__getitem__ = getitem  # type: ignore[method-assign]

    def __getitem__(self, index: int | slice) -> Any:
        """Sample `index` (negative counts from the end), or a list of samples for a slice."""
        if isinstance(index, slice):
            return self.sample_list(np.arange(*index.indices(self.num_samples), dtype=np.int64))
        sample = self._raw_list(np.array([self._check_index(index)], dtype=np.int64))[0]
        return sample if self.transform is None else self.transform(sample)

    def _check_index(self, index: Any) -> int:
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"{type(self).__name__} indices must be integers or slices, not {type(index).__name__}") from None
        if i < 0:
            i += self.num_samples
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {index} out of range for {self.num_samples} samples in {self.input_dir}")
        return i

    def custom_getitem(self) -> bool:
        """A subclass overrides `__getitem__`: every sample must go through it."""
        return type(self).__getitem__ is not SampleAccess.__getitem__

    def reads_per_sample(self) -> bool:
        """Whether batches must be built sample by sample (transform or overridden `__getitem__`)."""
        return self.transform is not None or self.custom_getitem()

    def sample_list(self, ids: np.ndarray) -> list[Any]:
        """The samples `ds[i]` gives for these sample ids (transform and overridden __getitem__ applied)."""
        if self.custom_getitem():
            return self._timed((lambda i: self[i]), np.asarray(ids).tolist())
        samples = self._raw_list(np.asarray(ids, dtype=np.int64))
        return samples if self.transform is None else self._timed(self.transform, samples)

    @staticmethod
    def _timed(fn: Callable[[Any], Any], values: list, span: str = "transform") -> list:
        """[fn(v) for v in values], each call a `span` of the profile trace when one is recording."""
        rec = current()
        if rec is None:
            return [fn(v) for v in values]
        out = []
        for v in values:
            start = time.perf_counter_ns()
            out.append(fn(v))
            rec.add(span, start, time.perf_counter_ns())
        return out

    def _raw_list(self, ids: np.ndarray) -> list[Any]:
        """Samples as stored: items unpickled, token blocks as tensors (dicts with document_boundaries)."""
        if self.manifest.kind == "items":
            if current() is None:
                return list(self.reader.get_many(self.to_base(ids)))  # one offsets lookup for all
            return self._timed(self.reader.get, self.to_base(ids).tolist(), "decode")
        blocks = {k: torch.from_numpy(v) for k, v in self.read_blocks(ids).items()}
        if not self.item_loader.document_boundaries:
            return list(blocks["input_ids"])
        return [{k: v[row] for k, v in blocks.items()} for row in range(len(ids))]

    def to_base(self, ids: np.ndarray) -> np.ndarray:
        """Sample ids of this dataset (a subsample or split of the stored samples) -> stored sample ids."""
        return np.asarray(ids, dtype=np.int64)

    def _samples(self, samples: np.ndarray) -> Iterator[Any]:
        """Single samples, as `ds[i]` gives them, but read a chunk at a time (a plain DataLoader's path)."""
        yield from self.sample_list(samples)

    def _chunk(self, samples: np.ndarray, sizes: np.ndarray, collate: Callable | None,
               checksum: Callable[..., np.ndarray] | None = None) -> dict[str, Any]:
        """Several consecutive batches at once: one hand-off from a worker instead of one per batch. `checksum`: the
        ledger's rule; token rows then carry `ledger_crc`, taken as they are read (read/ledger.py)."""
        if self.manifest.kind == "tokens" and not self.reads_per_sample():
            with span("read", samples=len(samples)):
                if checksum is not None:
                    return {"sizes": sizes, **self.read_checksummed(samples, checksum)}
                return {"sizes": sizes, **self.read_blocks(samples)}
        if not self.reads_per_sample() and current() is None:
            # items: decoded together, batches packed for the hand-off (profiled chunks take the
            # per-item path below, so that every decode and collate is a span of its own)
            with span("read", samples=len(samples)):
                return item_chunk(self.reader, self.to_base(samples), sizes, collate)
        with span("read", samples=len(samples)):
            items = self.sample_list(samples)
        collate = collate or (collate_items if self.manifest.kind == "items" else default_collate)
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        batches = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            with span("collate", samples=b - a):
                batches.append(collate(items[a:b]))
        return {"sizes": sizes, "batches": batches}
