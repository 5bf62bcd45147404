"""The `stream_lm` task: text streamed, tokenized and packed on the fly, or optimized token shards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from llm.training.core.loading import OPTIMIZED, ConfigError
from llm.training.source_metrics import sum_over_ranks
from llm.training.tasks.optimized import OptimizedData


class StreamTextData:
    """Batches of `StreamingTextDataModule` (local files, HF streams, dedup, custom sources).

    Each rank streams the partitions it owns; the module's `checkpoint_state()` is
    collective under torch.distributed, returns every rank's cursor (`line_index`: the
    records each rank consumed, a count, not a line number) and commits the dedup
    seen-set, so it is called exactly when a checkpoint is written; `state_dict()` is
    this rank's pure view.
    The module starts a new pass over the source by itself when the stream ends.
    """

    def __init__(self, config: Any, rank: int, world_size: int):
        self.config = config
        self.rank = rank
        # training.seed is the one root seed: a random mixture's draws derive from it
        self.module = config.data.text_stream(seed=config.training.seed).build(config.training.batch_size,
                                                                              skip_documents=config.data.skip_documents)
        self.tokenizer = self.module.tokenizer
        self.steps_per_pass: int | None = None
        self.writes_ledger = True

    def attach_ledger(self, folder: str, run: str) -> None:
        self.module.attach_ledger(folder, run)

    def ledger_loss(self, losses: Any) -> None:
        self.module.ledger_set_loss(losses)

    def ledger_skip(self) -> None:
        self.module.ledger_skip()

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Endless: each `train_dataloader()` epoch continues the stream where the last stopped."""
        while True:
            empty = True
            for batch in self.module.train_dataloader():
                empty = False
                # best fit's document boundaries: the model keeps each document to itself
                yield {k: batch[k] for k in ("input_ids", "labels", "position_ids") if k in batch}
            if empty:
                raise ValueError(
                    f"data source {self.config.data.data_source!r} yielded no batch for rank {self.rank}; "
                    "add data or lower training.batch_size / data.max_seq_len"
                )

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def checkpoint_state(self) -> dict[str, Any]:
        return self.module.checkpoint_state()

    def source_counts(self) -> dict[str, dict[str, int]]:
        """Tokens and samples per source, summed over ranks (collective under torch.distributed)."""
        return sum_over_ranks(self.module.source_counts())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)

    def fingerprint(self) -> dict[str, Any]:
        return self.module.source_fingerprint()

    def batches_left_in_pass(self) -> int | None:
        return None  # epochs are data.steps_per_epoch steps (a batch change only changes samples per step)

    def validation(self) -> Any:
        """No evaluation data of its own: the trainer reads data.val_dataset_path."""
        return None


def refuse_packing(data: Any, what: str) -> None:
    """`packing: best_fit` packs text read on the fly; blocks cut elsewhere would ignore it, so it is refused."""
    if data.packing == "best_fit":
        raise ConfigError(f"data.packing 'best_fit' packs text streamed on the fly, not {what} (cut into blocks "
                          "when read); leave packing out, or stream the text (data_source: local or hf)")


def build_stream_lm_data(config: Any, rank: int, world_size: int) -> Any:
    """TrainData for `--task stream_lm`: optimized shards or a streamed text source."""
    if config.data.data_source == OPTIMIZED:
        refuse_packing(config.data, "optimized shards")
        return OptimizedData(config, rank, world_size)
    if not config.data.steps_per_epoch:
        raise ConfigError(
            "data.steps_per_epoch is required for --task stream_lm with data_source "
            f"{config.data.data_source!r}; set it in the YAML or pass --steps-per-epoch"
        )
    return StreamTextData(config, rank, world_size)
