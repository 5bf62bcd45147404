"""The `lm` task: a map-style `TextDataset` over local files, served in a seeded, resumable order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from llm.data.text.readers import InputError, expand_inputs, iter_texts
from llm.data.tokenizers import Tokenizer, load_tokenizer

_ENCODE_BATCH = 1024  # records per encode_batch call: amortises the fast tokenizers' overhead


class TextDataset(torch.utils.data.Dataset):
    """Local .txt/.jsonl/.parquet records tokenized once, EOS after each, cut into blocks.

    Item `i` holds `input_ids = tokens[i*L : i*L+L]` and `labels = tokens[i*L+1 : i*L+L+1]`
    (labels already shifted), `L = max_seq_len`; the tail shorter than a block is dropped.
    """

    def __init__(self, path: str | Path, tokenizer: Tokenizer, max_seq_len: int, text_column: str = "text"):
        self.files = expand_inputs([str(path)])
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.text_column = text_column
        pieces: list[np.ndarray] = []
        digest = xxhash.xxh3_128()
        for file in self.files:
            pending: list[str] = []
            for text, _ in iter_texts(file, text_column):
                digest.update(text.encode("utf-8", errors="replace") + b"\n")
                pending.append(text)
                if len(pending) == _ENCODE_BATCH:
                    pieces.append(self._encode(pending))
                    pending = []
            if pending:
                pieces.append(self._encode(pending))
        self.tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        self.content_digest = digest.hexdigest()
        self.num_blocks = max(0, (len(self.tokens) - 1) // max_seq_len)
        if self.num_blocks == 0:
            raise InputError(
                f"{path}: holds {len(self.tokens)} tokens, fewer than one block of "
                f"max_seq_len + 1 = {max_seq_len + 1}; add text or lower data.max_seq_len"
            )

    def _encode(self, texts: list[str]) -> np.ndarray:
        eos = self.tokenizer.eos_id
        return np.fromiter(
            (t for ids in self.tokenizer.encode_batch(texts) for t in (*ids, eos)), dtype=np.int64
        )

    def __len__(self) -> int:
        return self.num_blocks

    def block(self, indices: np.ndarray) -> np.ndarray:
        """Blocks of `max_seq_len + 1` tokens for several indices at once, shape (n, L+1)."""
        starts = np.asarray(indices, dtype=np.int64)[:, None] * self.max_seq_len
        return self.tokens[starts + np.arange(self.max_seq_len + 1)]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.num_blocks:
            raise IndexError(f"block {index} outside 0..{self.num_blocks - 1}")
        block = torch.from_numpy(self.block(np.array([index]))[0])
        return {"input_ids": block[:-1], "labels": block[1:]}

    def fingerprint(self) -> dict[str, Any]:
        """Changes whenever the token stream would: content, column, block length, tokenizer."""
        return {
            "type": "text_file",
            "content_xxh3_128": self.content_digest,
            "text_column": self.text_column,
            "max_seq_len": self.max_seq_len,
            "tokenizer": self.tokenizer.fingerprint(),
        }


class MapStyleData:
    """Batches of a map-style dataset in a seeded per-epoch permutation, split over ranks.

    Global batch `b` of an epoch is permutation entries `[b*G, (b+1)*G)` with
    `G = batch_size * world_size`; rank `r` takes its `batch_size` slice. The state is
    `{epoch, samples_consumed}`: topology-free, so a resume on another world size
    continues at the same global sample with nothing lost or repeated. An incomplete
    last global batch of an epoch is dropped (every rank must get the same number).
    """

    def __init__(self, dataset: TextDataset, batch_size: int, rank: int, world_size: int, seed: int, shuffle: bool = True):
        self.dataset = dataset
        self.tokenizer = dataset.tokenizer
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.shuffle = shuffle
        self.global_batch = batch_size * world_size
        if len(dataset) < self.global_batch:
            raise InputError(
                f"{dataset.files[0]}: holds {len(dataset)} blocks of {dataset.max_seq_len + 1} tokens, "
                f"fewer than one global batch of {self.global_batch}; lower training.batch_size or add text"
            )
        self.steps_per_pass: int | None = len(dataset) // self.global_batch
        self.epoch = 0
        self.samples_consumed = 0

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.dataset))
        rng = np.random.default_rng([self.seed, epoch])  # a pure function of (seed, epoch)
        return rng.permutation(len(self.dataset))

    def batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Endless: after the last full global batch of an epoch the next epoch starts, reshuffled."""
        while True:
            order = self._order(self.epoch)
            while self.samples_consumed + self.global_batch <= len(order):
                start = self.samples_consumed + self.rank * self.batch_size
                blocks = torch.from_numpy(self.dataset.block(order[start : start + self.batch_size]))
                self.samples_consumed += self.global_batch  # counted when handed over, not prefetched
                yield {"input_ids": blocks[:, :-1], "labels": blocks[:, 1:]}
            self.epoch += 1
            self.samples_consumed = 0

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "epoch": self.epoch, "samples_consumed": self.samples_consumed, "seed": self.seed}

    def checkpoint_state(self) -> dict[str, Any]:
        return self.state_dict()  # topology-free: every rank holds the same numbers

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(
                f"the checkpoint's data order was made with training.seed {state['seed']}, "
                f"not {self.seed}; resume with the same seed"
            )
        self.epoch = int(state["epoch"])
        self.samples_consumed = int(state["samples_consumed"])

    def fingerprint(self) -> dict[str, Any]:
        return self.dataset.fingerprint()


def build_lm_data(config: Any, rank: int, world_size: int) -> Any:
    """TrainData for `--task lm`: `data_source: local` (a TextDataset) or `optimized` shards."""
    data = config.data
    if data.data_source == "optimized":
        from llm.training.tasks.stream_lm import OptimizedData

        return OptimizedData(config, rank, world_size)
    if data.data_source != "local":
        raise ValueError(
            f"--task lm reads local files (data.data_source: local) or optimized shards, not "
            f"data_source {data.data_source!r}; use --task stream_lm for streamed sources"
        )
    tokenizer = load_tokenizer(data.tokenizer_spec())
    dataset = TextDataset(data.dataset_path, tokenizer, data.max_seq_len, data.text_column)
    return MapStyleData(dataset, config.training.batch_size, rank, world_size, config.training.seed)


def build_val_dataset(config: Any, tokenizer: Tokenizer) -> TextDataset | None:
    """The validation TextDataset from `data.val_dataset_path`, or None when unset."""
    path = config.data.val_dataset_path
    if not path:
        return None
    return TextDataset(path, tokenizer, config.data.max_seq_len, config.data.text_column)
