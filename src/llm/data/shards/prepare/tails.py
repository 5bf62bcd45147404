"""Small last shards of tasks, joined in the driver: a small input cut into many tasks still gives full shards.

optimize cuts its inputs into ~4 tasks per worker for parallelism, without knowing how much
each input yields; each task cuts its own shards. A task whose last shard would be far below
the limit (`writer.is_small`) hands those records back unwritten, and the driver writes the
consecutive ones of neighbouring tasks together, in input order. The result depends only on
the tasks' outputs, so it is the same on every engine and output (local folder or s3://).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llm.data.shards.format.manifest import ShardInfo
from llm.data.shards.format.writer import ItemShardWriter, TokenShardWriter


def join_tails(parts: Sequence[tuple[list[ShardInfo], Any]], new_writer: Callable[[int], Any]) -> list[ShardInfo]:
    """Every shard in input order: each task's written shards (`parts[t][0]`) and its joined tails.

    `parts[t][1]` is task t's small tail or None; `new_writer(t)` makes the writer of tails
    joined from task t on (its shards are named after t, so names never collide).
    """
    shards: list[ShardInfo] = []
    writer: Any = None
    for task_id, (written, tail) in enumerate(parts):
        if written and writer is not None:  # the pending tails come before this task's shards
            writer.flush()
            shards += writer.shards
            writer = None
        shards += written
        if tail is not None:
            writer = writer if writer is not None else new_writer(task_id)
            _add(writer, tail)
    if writer is not None:
        writer.flush()
        shards += writer.shards
    return shards


def _add(writer: Any, tail: Any) -> None:
    if isinstance(writer, TokenShardWriter):
        writer.add_batch(*tail)
    else:
        for record in tail:
            writer.add_record(record)


def tail_writer(kind: str, folder: Path, prefix: str, dtype: str, chunk_bytes: int | None, chunk_size: int | None,
                compression: str | None, encryption: Any = None) -> TokenShardWriter | ItemShardWriter:
    """A writer for joined tails, cutting at the run's limits."""
    if kind == "tokens":
        return TokenShardWriter(folder, prefix, dtype, chunk_bytes, chunk_size, compression, encryption)
    return ItemShardWriter(folder, prefix, chunk_bytes, chunk_size, compression, encryption)
