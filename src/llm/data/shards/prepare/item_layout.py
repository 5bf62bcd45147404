"""Item layouts across a run: each task's first item against the run's first, appends against the dataset."""

from __future__ import annotations

from typing import Any

from llm.data.shards.format.manifest import Manifest
from llm.data.shards.format.serializers import StructureError, first_difference


def common_layout(tasks: int, results: dict[int, Any]) -> Any:
    """Every task's items must have the first item's layout (each task checked its own against its first)."""
    reference, seen = None, 0
    for task_id in range(tasks):
        result = results[task_id]
        if result.layout is not None:
            if reference is None:
                reference = result.layout
            elif (diff := first_difference(reference, result.layout)) is not None:
                path, got, want = diff
                field = f"field '{path}'" if path else "the item"
                raise StructureError(f"optimize: item {seen} (the first of task {task_id}): {field} is {got}, "
                                     f"the first item's is {want}")
        seen += result.items
    return reference


def check_append_layout(output: Any, manifest: Manifest) -> None:
    """Appended items must be laid out as the dataset's (checked under the output's lock)."""
    previous = output._current()
    if previous is None or previous.kind != "items" or manifest.kind != "items":
        return
    where = getattr(output, "display", None) or output.folder
    if previous.item_layout is None and previous.total_items:
        raise ValueError(f"cannot append to {where}: its items are format v{previous.format_version} pickles; "
                         "rebuild it with mode='overwrite' to use the item layout of format v2")
    if manifest.item_layout is not None and previous.item_layout is not None:
        diff = first_difference(previous.item_layout, manifest.item_layout)
        if diff is not None:
            path, got, want = diff
            field = f"field '{path}'" if path else "the item"
            raise ValueError(f"cannot append to {where}: this run's {field} is {got}, the dataset's is {want}")
