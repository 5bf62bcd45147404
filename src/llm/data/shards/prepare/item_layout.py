"""Item layouts across a run: each task's first item against the run's first (appends: output.py's one check)."""

from __future__ import annotations

from typing import Any

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
