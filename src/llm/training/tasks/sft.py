"""The `sft` task: instruction / chat / completion records streamed, masked and collated, resumable exactly."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import torch

from llm.data.inputs.entries import SourceEntry
from llm.data.inputs.source import TextSource
from llm.data.sft.holdout import HeldOutSplit
from llm.data.sft.stream import record_source
from llm.data.tokenize.protocol import Tokenizer
from llm.training.core.axolotl import VAL_STREAMING
from llm.training.core.loading import ConfigError
from llm.training.tasks.stream_lm import StreamTextData

IGNORE = -100

log = logging.getLogger(__name__)


def shift_labels(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Collator batches (labels aligned with inputs) -> our model's (label t is the target of position t)."""
    labels = batch["labels"]
    shifted = torch.full_like(labels, IGNORE)
    shifted[:, :-1] = labels[:, 1:]
    out = {"input_ids": batch["input_ids"], "labels": shifted}
    if "position_ids" in batch:  # packed rows: the model keeps each sample to itself
        out["position_ids"] = batch["position_ids"]
    return out


def has_targets(batch: dict[str, torch.Tensor]) -> bool:
    """Whether a (shifted) batch has a token to learn: one without any would give a NaN loss."""
    return bool((batch["labels"] != IGNORE).any())


class SftData(StreamTextData):
    """Batches of the `datasets:` entries (mixed by `streaming_dataset_mixing_strategy`), `micro_batch_size` records each.

    The state methods are `StreamTextData`'s: an SFT stream is a text stream with another batch format.
    """

    def __init__(self, config: Any, rank: int, world_size: int):
        data = config.data
        if not data.datasets:
            raise ConfigError("--task sft needs datasets: [{path, type}] (Axolotl's key, or data.datasets)")
        for i, entry in enumerate(data.datasets):
            if isinstance(entry, SourceEntry):
                raise ConfigError(f"datasets[{i}] is a text source (data_source ...); --task sft takes {{path, type}} entries")
        if data.streaming and not config.training.max_steps:
            raise ConfigError("max_steps must be set when using streaming datasets")
        self.config, self.rank = config, rank
        self.split = self._split()
        train_source = None
        if self.split is not None:
            train_source = self._combine(self.split.side(self._sources, validation=False))
        steps = data.steps_per_epoch or (config.training.max_steps if data.streaming else None)
        if steps is None:  # streaming: false, Axolotl's default: an epoch is one pass over the records
            steps = self._one_pass(world_size)
        # training.seed is the one root seed: a random mixture's draws derive from it
        self.module = data.sft_stream(seed=config.training.seed).build(
            config.training.batch_size, steps_per_epoch=steps, skip_documents=data.skip_documents,
            **({"source": train_source} if train_source is not None else {}))
        self.tokenizer = self.module.tokenizer
        self.steps_per_pass: int | None = steps
        self.writes_ledger = True

    def _split(self) -> HeldOutSplit | None:
        """`val_set_size`'s held-out split of the records (one read pass), or None without one."""
        data = self.config.data
        if not data.val_set_size:
            return None
        if data.streaming:
            log.warning(VAL_STREAMING)  # as Axolotl: a stream has no held-out split
            return None
        if data.test_datasets:
            raise ConfigError("non-zero val_set_size should not be used with test_datasets configuration")
        self._sources = [record_source(e, f"datasets[{i}]") for i, e in enumerate(data.datasets)]
        paths = ", ".join(e.path for e in data.datasets)
        return HeldOutSplit.draw(self._sources, data.val_set_size, self.config.training.seed, f"datasets {paths}")

    def _combine(self, sources: list[TextSource]) -> TextSource:
        """One entry's source as it is, several as the configured mixture."""
        return sources[0] if len(sources) == 1 else self.config.data.mixture().build(sources)

    def _one_pass(self, world_size: int) -> int:
        """Steps that read every training record once: the records counted (read, not tokenized) before training."""
        if self.split is not None:  # the split's pass counted them already
            records = self.split.training_records
        else:
            entries = enumerate(self.config.data.datasets)
            records = sum(1 for i, e in entries for _ in record_source(e, f"datasets[{i}]").iter_texts())
        if not records:
            paths = ", ".join(e.path for e in self.config.data.datasets)
            raise ConfigError(f"datasets {paths} hold no record")
        return math.ceil(records / (self.config.training.batch_size * world_size))

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        trained = False
        while True:
            empty = True
            for batch in self.module.train_dataloader():
                empty = False
                shifted = shift_labels(batch)
                if has_targets(shifted):  # else its loss is NaN: skipped (the collator warned)
                    trained = True
                    yield shifted
                elif self.writes_ledger:
                    self.ledger_skip()  # read, not trained: the ledger counts its records as skipped
            paths = ", ".join(e.path for e in self.config.data.datasets)
            if empty:
                raise ValueError(f"datasets {paths} yielded no record for this rank")
            if not trained:  # a whole pass and not one token to learn: it would loop for ever
                raise ValueError(f"no record of datasets {paths} has a token to train on within "
                                 f"sequence_len={self.config.data.max_seq_len} (every prompt fills it); raise "
                                 "sequence_len, shorten the prompts, or set train_on_inputs: true")

    def batches_left_in_pass(self) -> int | None:
        return None  # epochs are data.steps_per_epoch steps (a batch change only changes samples per step)

    def validation(self) -> SftValidation | None:
        """The held-out split of `val_set_size`, else `test_datasets[0]`: its first records, collated the same way."""
        if self.split is not None:
            source = self._combine(self.split.side(self._sources, validation=True))
            return SftValidation(self.config, self.tokenizer, source=source, what="the val_set_size split")
        tests = self.config.data.test_datasets
        if not tests:
            return None
        return SftValidation(self.config, self.tokenizer, entry=tests[0], what=f"test dataset {tests[0].path}")


class SftValidation:
    """The first `val_batches` batches of the validation records, read once and kept: the same every evaluation."""

    def __init__(self, config: Any, tokenizer: Tokenizer, entry: Any = None, source: TextSource | None = None,
                 what: str = "the validation set"):
        tc = config.training
        module = config.data.sft_stream(seed=tc.seed).build(
            tc.batch_size, entry=entry, rank=0, world_size=1, loop=False, tokenizer=tokenizer,
            **({"source": source} if source is not None else {}))
        module.num_workers = 0
        self.batches: list[dict[str, torch.Tensor]] = []
        for batch in module.train_dataloader():
            shifted = shift_labels(batch)
            if has_targets(shifted):
                self.batches.append(shifted)
            if len(self.batches) == tc.val_batches:
                break
        if not self.batches and any(c.skipped for c in module.collators):  # every prompt filled sequence_len
            raise ValueError(f"{what} has no record with a token to train on within sequence_len="
                             f"{config.data.max_seq_len}; raise sequence_len or shorten the prompts")
        if not self.batches:
            raise ValueError(f"{what} holds no record")
        self.rows = sum(len(b["input_ids"]) for b in self.batches)
        self.batch_size = tc.batch_size

    def __len__(self) -> int:
        return self.rows

    def batch(self, index: int, batch_size: int) -> dict[str, torch.Tensor]:
        return self.batches[index]
