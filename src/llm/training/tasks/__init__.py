"""Training tasks: where a task's batches come from, chosen by name (`lm`, `stream_lm`)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from llm.data.tokenize.tokenizers import Tokenizer


class TrainData(Protocol):
    """What the trainer needs from a task: endless rank-local batches and a resumable cursor.

    Batches are dicts with int64 `input_ids` and `labels` of shape (batch_size, max_seq_len),
    label `t` being the target for position `t`. `state_dict()` is this rank's state, a pure
    getter; `checkpoint_state()` is what a checkpoint stores: collective under
    torch.distributed (every rank calls it), the state of *all* ranks, side effects that
    must go with a checkpoint (the dedup seen-set) committed.
    """

    tokenizer: Tokenizer
    steps_per_pass: int | None
    # whether attach_ledger records the run (checkpoint.ledger): the shard loader does; the text and SFT
    # streams do once the text module's ledger (branch ledger-text) is merged
    writes_ledger: bool

    def batches(self) -> Iterator[dict[str, torch.Tensor]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def checkpoint_state(self) -> dict[str, Any]: ...

    def source_counts(self) -> dict[str, dict[str, int]]:
        """{source name: {tokens, samples}} handed out so far, the whole job's (collective, like checkpoint_state)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def batches_left_in_pass(self) -> int | None:
        """Full batches this pass over the data still holds at the current batch size, from the loaded
        state (None: the task's epochs are a number of steps, `data.steps_per_epoch`)."""
        ...

    def fingerprint(self) -> dict[str, Any]: ...

    def attach_ledger(self, folder: str, run: str) -> None:
        """Record what each batch held in the run ledger `folder` (run id `run`, the same on every rank);
        called before `load_state_dict` and the first batch, only when `writes_ledger`."""
        ...

    def ledger_loss(self, losses: Any) -> None:
        """Per-row mean token losses of the batch just trained (this rank's rows)."""
        ...

    def ledger_skip(self) -> None:
        """The batch just drawn was read and dropped, not trained (data.skip_batches)."""
        ...

    def validation(self) -> Any:
        """The task's own evaluation data (sft's test_datasets), or None: data.val_dataset_path applies."""
        ...


# name -> "module:callable"; it takes (config, rank, world_size) and returns TrainData.
TASKS = {
    "lm": "llm.training.tasks.lm:build_lm_data",
    "stream_lm": "llm.training.tasks.stream_lm:build_stream_lm_data",
    "sft": "llm.training.tasks.sft:SftData",
}


def build_task_data(task: str, config: Any, rank: int, world_size: int) -> TrainData:
    """The TrainData of `task` for this rank; an unknown task names the valid ones."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; use one of: {', '.join(TASKS)}")
    from llm.training.core.task_check import check_task

    check_task(config, task)  # the kind of data before the task's details (llm-train checked it already)
    module, func = TASKS[task].split(":")
    return getattr(importlib.import_module(module), func)(config, rank, world_size)
