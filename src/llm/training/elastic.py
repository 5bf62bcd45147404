"""A resume at another global batch size: where the current epoch now ends, and where the run stops.

Every data state counts samples and tokens, never steps, so the data resumes exactly at any batch
size (docs/training.md). What moves is the step count: a pass over optimized shards holds another
number of steps, so the epoch in progress ends after the steps its data has left, and `epochs`
still counts passes over the data, not steps at the old size. Tasks whose epochs are a number of
steps (`data.steps_per_epoch`, streams) keep them: there a batch change only changes the samples
per step.
"""

from __future__ import annotations

from typing import Any


def after_batch_change(ckpt: dict[str, Any], global_batch: int, left: int | None, steps_per_epoch: int, step: int,
                       epochs_done: int, epochs: int, max_steps: int | None) -> tuple[int, int, str] | None:
    """(step_in_epoch, total steps, a log line) after a resume whose global batch changed; None: nothing moves.

    `left`: full batches the data's pass still holds at `global_batch` (None: epochs are counted in steps);
    `epochs_done`: epochs finished in this run's schedule cycle.
    """
    saved = ckpt.get("config", {}).get("training", {}).get("batch_size")
    saved_global = saved * int(ckpt.get("world_size") or 1) if isinstance(saved, int) else None
    if saved_global in (None, global_batch) or left is None:
        return None
    total = step + left + max(epochs - 1 - epochs_done, 0) * steps_per_epoch
    if max_steps is not None:
        total = min(total, max(max_steps, step))
    return (steps_per_epoch - left, total, f"global batch {saved_global} -> {global_batch}: {left} steps left in "
            f"this pass over the data, training to step {total}")
