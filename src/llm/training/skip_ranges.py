"""`data.skip_batches`: global batch ranges a run never trains on, kept in every checkpoint after it.

The use case: a loss spike at batches 1200-1299; resume from a checkpoint before it with
`skip_batches: [[1200, 1300]]`. Ranges are half-open, `[start, end)` in global batch
indices (batch `i` is the `i`-th global batch the data stream hands over, counted from
the run's start, skipped ones included). A skipped batch is read and dropped, so the
data stream's own state moves past it: this works for every task's data (optimized
shards, text streams, mixtures, SFT) without knowing how it is made.

The ranges and the count of batches drawn ride in the checkpoint. A resume keeps the
checkpoint's ranges and adds the config's (their union); a config without the key keeps
them. A range that reaches below the batches already drawn is refused, unless the
checkpoint skipped that part already (the same key given again).

Since skipped batches are read, a range costs reading all of its batches: a range the run
reaches that would make it read and drop more batches than it trains steps is refused
before the first batch (`[[5, 10**18]]` would otherwise run for ever, silently). This is
worked out from the ranges' ends, never by walking their batches; a range the run ends
before is never read and is kept (a later, longer run checks it again).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any

KEY = "data.skip_batches"


def skip_documents_lines(data_state: Any, configured: Any) -> list[str]:
    """What a resume says of `data.skip_documents`: the union kept, and the ids the config no longer lists."""
    from llm.data.skip_documents import read_ids, state_ids, union

    saved, given = state_ids(data_state, "checkpoint data state"), read_ids(configured)
    ids = union(saved, given)
    if not ids:
        return []
    kept = [i for i in saved if i not in given]
    return [f"data.skip_documents: {len(ids)} document(s) dropped wherever read, the union of the checkpoint's "
            f"{len(saved)} and the config's {len(given)}"
            + (f"; {len(kept)} the config no longer lists stay dropped (first: {kept[0]})" if kept else "")]


def parse_ranges(value: Any, key: str = KEY) -> list[tuple[int, int]]:
    """`[[start, end], ...]` (half-open) to sorted, merged pairs; ValueError naming the key and the value."""
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise ValueError(f"{key} is {value!r}; give a list of [start, end] global batch ranges, end exclusive")
    ranges = []
    for i, pair in enumerate(value):
        ok = isinstance(pair, list | tuple) and len(pair) == 2
        if not ok or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in pair):
            raise ValueError(f"{key}[{i}] is {pair!r}; a range is [start, end] with whole numbers >= 0, end exclusive")
        start, end = pair
        if end < start:
            raise ValueError(f"{key}[{i}] {list(pair)} is reversed; a range is [start, end] with start < end "
                             "(end exclusive)")
        if end == start:
            raise ValueError(f"{key}[{i}] {list(pair)} is empty (end is exclusive); to skip batch {start} alone "
                             f"write [{start}, {start + 1}]")
        ranges.append((start, end))
    return merge(ranges)


def merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, with overlapping or touching ranges joined."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def uncovered(span: tuple[int, int], ranges: list[tuple[int, int]]) -> int | None:
    """The first batch of `span` that no range covers, or None."""
    at, end = span
    for start, stop in ranges:
        if start > at:
            break
        at = max(at, stop)
    return at if at < end else None


def _no_rows(batch: Any) -> bool:
    """A batch left without rows (a shard batch whose every block belonged to a document skipped by id)."""
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    return ids is not None and len(ids) == 0


def _empty_on_any_rank(empty: bool) -> bool:
    """Whether any rank's share of this global batch has no rows (a collective: every rank calls it per batch).

    Under DDP every rank must drop the same global batches: a rank reading past its empty share alone while
    the others train theirs would leave the ranks' data positions one batch apart from then on."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return empty
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([1 if empty else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


class SkipRanges:
    """Which global batches to drop, how many were drawn and skipped; `filter` wraps a task's batches.

    `skip_documents`: the run drops documents by id, so a rank's share of a batch may come with no rows;
    then every rank drops that global batch (one small all-reduce a batch, only in such runs)."""

    def __init__(self, value: Any = None, skip_documents: bool = False):
        self.configured = parse_ranges(value)
        self.ranges = list(self.configured)
        self.next_batch = 0  # the global index of the next batch the data stream hands over
        self.skipped = 0
        self.skip_documents = skip_documents

    def filter(self, batches: Iterator[Any], on_skip: Callable[[], None] | None = None) -> Iterator[Any]:
        """`batches` without those in a range (read, then dropped: the data's own cursor moves past them).

        `on_skip` is told of each batch dropped, before the next is drawn (the run ledger marks it skipped)."""
        try:
            for batch in batches:
                index = self.next_batch
                self.next_batch += 1
                empty = self.skip_documents and _empty_on_any_rank(_no_rows(batch))  # data.skip_documents took them
                if self.covers(index) or empty:
                    self.skipped += 1
                    if on_skip is not None:
                        on_skip()
                    continue
                yield batch
        finally:
            if isinstance(batches, Generator):  # the trainer closes us: stop the data's workers now
                batches.close()  # (the tasks' batches are generators; a plain iterator has nothing to stop)

    def resume_documents(self, data_state: Any, configured: Any) -> list[str]:
        """A resume's `data.skip_documents` lines; with any id kept (the checkpoint's union), empty shares are
        dropped by every rank together (`filter`)."""
        lines = skip_documents_lines(data_state, configured)
        self.skip_documents = self.skip_documents or bool(lines)
        return lines

    def covers(self, index: int) -> bool:
        return any(start <= index < end for start, end in self.ranges)

    def dropped(self, step: int, total_steps: int) -> int:
        """The batches the run still reads and drops to train from `step` to `total_steps`; ValueError when more than it trains.

        Per range, not per batch: from the next batch drawn, the trained batches before each
        range are subtracted from the steps left; a range reached before they run out is
        read whole.
        """
        at, left, dropped = self.next_batch, total_steps - step, 0
        for start, end in self.ranges:
            if end <= at:
                continue
            first = max(start, at)
            left -= first - at  # the steps trained before this range
            if left <= 0:
                break  # the run ends before it: never read
            dropped += end - first
            if dropped > total_steps:
                raise ValueError(f"{KEY} range [{start}, {end}] would make this run read and drop {dropped:,} batches, "
                                 f"more than the {total_steps:,} steps it trains (a skipped batch is read, then "
                                 "dropped); end the range sooner, or stop the run before it with training.max_steps")
            at = end
        return dropped

    def state(self) -> dict[str, Any]:
        """What a checkpoint stores."""
        return {"ranges": [list(r) for r in self.ranges], "next_batch": self.next_batch, "skipped": self.skipped}

    def metrics(self) -> dict[str, int]:
        """`skipped_batches` for metrics.jsonl once the run has any range (nothing otherwise)."""
        return {"skipped_batches": self.skipped} if self.ranges else {}

    def check(self, saved: Any, where: str, step: int) -> tuple[list[tuple[int, int]], int, int]:
        """The union of a checkpoint's ranges and the config's, its batches drawn and skipped; changes nothing.

        ValueError (one sentence) when a configured range reaches below the batches the checkpoint
        has drawn, over batches it did not skip.
        """
        if saved is None:  # a checkpoint from before skip ranges: one batch per step, none skipped
            saved = {"ranges": [], "next_batch": step, "skipped": 0}
        if not isinstance(saved, dict):
            raise ValueError(f"checkpoint {where} holds skip_batches {saved!r}, not {{ranges, next_batch, skipped}}")
        old = parse_ranges(saved.get("ranges"), f"checkpoint {where} skip_batches.ranges")
        drawn, skipped = saved.get("next_batch"), saved.get("skipped")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (drawn, skipped)):
            raise ValueError(f"checkpoint {where} holds skip_batches {saved!r}; next_batch and skipped must be "
                             "whole numbers >= 0")
        for start, end in self.configured:
            first = uncovered((start, min(end, drawn)), old)
            if first is not None:
                raise ValueError(f"{KEY} range [{start}, {end}] overlaps batches already trained: checkpoint {where} "
                                 f"has trained batch {first} (it has drawn batches 0 to {drawn - 1}); skip only "
                                 f"batches from {drawn} on, or resume from an earlier checkpoint")
        return merge([*old, *self.configured]), drawn, skipped

    def restore(self, checked: tuple[list[tuple[int, int]], int, int]) -> None:
        self.ranges, self.next_batch, self.skipped = checked
