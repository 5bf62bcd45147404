"""`train_test_split`: disjoint, seeded splits of a StreamingDataset, each a dataset that streams, shuffles and resumes alone."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

from llm.data.shards.plan.subset import SUM_TOLERANCE, as_fraction, split_views
from llm.data.shards.read.dataset import StreamingDataset


def check_splits(splits: object) -> list[float]:
    """The fractions as floats, or one ValueError naming the bad value."""
    if isinstance(splits, (str, bytes)) or not isinstance(splits, Sequence) or not splits:
        raise ValueError(f"splits must be a non-empty list of fractions in [0, 1], e.g. [0.8, 0.1, 0.1], got {splits!r}")
    for f in splits:
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 <= f <= 1:
            raise ValueError(f"splits must be fractions in [0, 1], got {f!r} in {list(splits)!r}")
    total = sum((as_fraction(f) for f in splits), start=as_fraction(0))
    if total > 1 + SUM_TOLERANCE:
        raise ValueError(f"splits must sum to at most 1, got {list(splits)!r} (sum {float(total):g})")
    return [float(f) for f in splits]


def train_test_split(dataset: StreamingDataset, splits: Sequence[float], seed: int = 42) -> list[StreamingDataset]:
    """One dataset per fraction: disjoint subsets of `dataset`'s samples, chosen by `seed`.

    Split i holds floor(splits[i] * n) samples plus at most one of the remainder, which goes to the
    splits with the largest fractional parts (ties: the earlier split); when the fractions sum to 1
    every sample is in exactly one split, otherwise floor(sum * n) samples are. Each split keeps
    `dataset`'s settings (shuffle, seed, shuffle_window, transform, subsample) and is its own dataset:
    `len()`, `ds[i]`, its own epochs and loader state, which records the split (`split` key), so a
    state saved on one split is refused by another. Splits are taken shard by shard (subset.py), so a
    windowed shuffle and a remote cache keep their locality.
    """
    if not isinstance(dataset, StreamingDataset):
        raise TypeError(
            f"train_test_split needs a StreamingDataset, got {type(dataset).__name__}; "
            "to split a CombinedStreamingDataset, split each source and mix the splits"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    fractions = check_splits(splits)
    # An upsampled dataset repeats stored samples: splitting its copies would put one stored
    # sample in several splits. Split the stored samples, then upsample each split alone.
    upsampled = dataset.subsample > 1
    parent_view, parent_starts = dataset.unsampled if upsampled else (dataset.view, dataset.sample_starts)
    views = split_views(parent_starts, fractions, f"split:{seed}")
    out = []
    for index, view in enumerate(views):
        part = copy.copy(dataset)  # shares the reader and cache; its own plan, epoch and view
        part.view, part._plan, part.epoch, part._order = parent_view, None, 0, None
        part.set_view(view)
        if upsampled:
            part.apply_subsample()
        part.split = [*(dataset.split or []), [index, fractions, seed]]
        out.append(part)
    return out
