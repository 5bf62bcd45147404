"""Token-shard datasets as training batches: `StreamingDataset` + `StreamingDataLoader`, the one order and resume."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from llm.data.tokenize.tokenizers import Tokenizer, load_tokenizer
from llm.training.core.loading import OPTIMIZED


def as_batch(tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Blocks of `max_seq_len + 1` tokens to inputs and labels shifted by one."""
    tokens = tokens.long()
    return {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}


def open_blocks(path: str | Path, tokenizer: Tokenizer, max_seq_len: int, shuffle: bool, seed: int, what: str) -> Any:
    """The dataset at `path` as blocks of `max_seq_len + 1` tokens, its tokenizer checked against ours."""
    from llm.data import StreamingDataset, TokensLoader

    dataset = StreamingDataset(
        path,
        item_loader=TokensLoader(block_size=max_seq_len + 1),
        shuffle=shuffle,
        drop_last=True,  # no padded tail block: every position is a real next-token target
        seed=seed,
    )
    made_with = dataset.manifest.tokenizer
    if made_with and json.dumps(made_with, sort_keys=True) != json.dumps(tokenizer.fingerprint(), sort_keys=True):
        raise ValueError(
            f"{what} was tokenized with {made_with}, but data.tokenizer_type/tokenizer_path give "
            f"{tokenizer.fingerprint()}; train with the tokenizer used by llm-data optimize"
        )
    return dataset


class OptimizedData:
    """Blocks of a token-shard dataset via `StreamingDataLoader`, full global batches only.

    Blocks are `max_seq_len + 1` tokens (labels are the block shifted by one), shuffled
    by `(training.seed, epoch)`. A pass is exactly `steps_per_pass` full batches: the
    loader drops a short last global batch, as the trainer's epoch count assumes. The
    loader's state is topology-free, so rank 0's state is the whole job's; a resume on
    another world size keeps the global sample position.
    """

    def __init__(self, config: Any, rank: int, world_size: int, path: str | Path | None = None, what: str | None = None):
        from llm.data import StreamingDataLoader

        data = config.data
        path = path if path is not None else data.dataset_path
        self.what = what or f"dataset {path}"
        self.tokenizer = load_tokenizer(data.tokenizer_spec())
        self.dataset = open_blocks(path, self.tokenizer, data.max_seq_len, True, config.training.seed, self.what)
        batch_size = config.training.batch_size
        self.loader = StreamingDataLoader(self.dataset, batch_size=batch_size, num_workers=data.num_workers, drop_last=True,
                                          skip_documents=data.skip_documents, watchdog_s=data.watchdog_s,
                                          watchdog=data.watchdog)
        per_pass = len(self.dataset) // (batch_size * world_size)
        if per_pass == 0:
            raise ValueError(
                f"{self.what} holds {len(self.dataset)} blocks of {data.max_seq_len + 1} tokens, fewer than one "
                f"global batch of {batch_size * world_size}; lower training.batch_size or data.max_seq_len, or add data"
            )
        self.steps_per_pass: int | None = per_pass
        self.writes_ledger = True

    def attach_ledger(self, folder: str, run: str) -> None:
        self.loader.attach_ledger(folder, run)

    def ledger_loss(self, losses: Any) -> None:
        self.loader.ledger_set_loss(losses)

    def ledger_skip(self) -> None:
        self.loader.ledger_skip()

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Endless: iterating the loader again starts its next (reshuffled) epoch."""
        while True:
            for batch in self.loader:
                yield as_batch(batch["input_ids"] if isinstance(batch, dict) else batch)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def source_counts(self) -> dict[str, dict[str, int]]:
        """Tokens and samples handed out per source, the whole job's (the loader's position is global)."""
        return self.loader.source_counts()

    def checkpoint_state(self) -> dict[str, Any]:
        return self.state_dict()  # topology-free: rank 0's state is the whole job's

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def batches_left_in_pass(self) -> int | None:
        return self.loader.batches_left()

    def validation(self) -> None:
        """No evaluation data of its own: the trainer reads data.val_dataset_path."""
        return None

    def fingerprint(self) -> dict[str, Any]:
        return {
            "type": OPTIMIZED,
            "fingerprint": self.dataset.fingerprint,
            "block_size": self.dataset.block_size,
            "tokenizer": self.tokenizer.fingerprint(),
        }
