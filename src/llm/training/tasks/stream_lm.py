"""The `stream_lm` task: text streamed, tokenized and packed on the fly, or optimized token shards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import torch

from llm.data.tokenizers import load_tokenizer
from llm.training.core.loading import OPTIMIZED, ConfigError


def _as_batch(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    tokens = tokens.long()
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}


class OptimizedData:
    """Blocks of a dataset made by `llm-data optimize`, via `StreamingDataLoader`.

    Blocks are `max_seq_len + 1` tokens (labels are the block shifted by one), shuffled
    by `(training.seed, epoch)`. The loader's state is topology-free, so rank 0's state is
    the whole job's; a resume on another world size keeps the global sample position.
    """

    def __init__(self, config: Any, rank: int, world_size: int):
        from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

        data = config.data
        self.tokenizer = load_tokenizer(data.tokenizer_spec())
        self.dataset = StreamingDataset(
            data.dataset_path,
            item_loader=TokensLoader(block_size=data.max_seq_len + 1),
            shuffle=True,
            drop_last=True,  # no padded tail block: every position is a real next-token target
            seed=config.training.seed,
        )
        made_with = self.dataset.manifest.tokenizer
        if made_with and json.dumps(made_with, sort_keys=True) != json.dumps(self.tokenizer.fingerprint(), sort_keys=True):
            raise ValueError(
                f"dataset {data.dataset_path} was tokenized with {made_with}, but data.tokenizer_type/"
                f"tokenizer_path give {self.tokenizer.fingerprint()}; train with the tokenizer used by llm-data optimize"
            )
        self.loader = StreamingDataLoader(
            self.dataset, batch_size=config.training.batch_size, num_workers=data.num_workers
        )
        per_rank = len(self.dataset) // (config.training.batch_size * world_size)
        if per_rank == 0:
            raise ValueError(
                f"dataset {data.dataset_path} holds {len(self.dataset)} blocks of {data.max_seq_len + 1} tokens, "
                f"fewer than one global batch of {config.training.batch_size * world_size}; lower training.batch_size"
            )
        self.steps_per_pass: int | None = per_rank

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Endless: iterating the loader again starts its next (reshuffled) epoch."""
        while True:
            for batch in self.loader:
                yield _as_batch(batch["input_ids"] if isinstance(batch, dict) else batch)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def checkpoint_state(self) -> dict[str, Any]:
        return self.loader.state_dict()  # topology-free: rank 0's state is the whole job's

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def fingerprint(self) -> dict[str, Any]:
        return {
            "type": OPTIMIZED,
            "fingerprint": self.dataset.fingerprint,
            "block_size": self.dataset.block_size,
            "tokenizer": self.tokenizer.fingerprint(),
        }


class StreamTextData:
    """Batches of `StreamingTextDataModule` (local files, HF streams, dedup, custom sources).

    Each rank streams the partitions it owns; the module's `checkpoint_state()` is
    collective under torch.distributed, returns every rank's cursor (`line_index` per
    rank) and commits the dedup seen-set, so it is called exactly when a checkpoint is
    written; `state_dict()` is this rank's pure view.
    The module starts a new pass over the source by itself when the stream ends.
    """

    def __init__(self, config: Any, rank: int, world_size: int):
        from llm.data import StreamingTextDataModule

        self.config = config
        self.rank = rank
        self.module = StreamingTextDataModule(config.data, config.training.batch_size)
        self.tokenizer = self.module.tokenizer
        self.steps_per_pass: int | None = None

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Endless: each `train_dataloader()` epoch continues the stream where the last stopped."""
        while True:
            empty = True
            for batch in self.module.train_dataloader():
                empty = False
                yield {"input_ids": batch["input_ids"], "labels": batch["labels"]}
            if empty:
                raise ValueError(
                    f"data source {self.config.data.data_source!r} yielded no batch for rank {self.rank}; "
                    "add data or lower training.batch_size / data.max_seq_len"
                )

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def checkpoint_state(self) -> dict[str, Any]:
        return self.module.checkpoint_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)

    def fingerprint(self) -> dict[str, Any]:
        return self.module.source_fingerprint()


def build_stream_lm_data(config: Any, rank: int, world_size: int) -> Any:
    """TrainData for `--task stream_lm`: optimized shards or a streamed text source."""
    if config.data.data_source == OPTIMIZED:
        return OptimizedData(config, rank, world_size)
    if not config.data.steps_per_epoch:
        raise ConfigError(
            "data.steps_per_epoch is required for --task stream_lm with data_source "
            f"{config.data.data_source!r}; set it in the YAML or pass --steps-per-epoch"
        )
    return StreamTextData(config, rank, world_size)
