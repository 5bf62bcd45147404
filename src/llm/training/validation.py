"""The validation set (`data.val_dataset_path`) as a deterministic token dataset, and the mean loss over it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from llm.data.inputs.readers import InputError
from llm.data.tokenize.tokenizers import Tokenizer
from llm.training.runtime import DistEnv
from llm.training.tasks.optimized import as_batch, open_blocks
from llm.training.text_cache import cache_root, is_optimized_dataset, prepare_text


class ValidationSet:
    """Blocks of `max_seq_len + 1` tokens of the validation data in file order: the same batches every time.

    Text files are prepared once into the same cache as the `lm` task's; a folder made by
    `llm-data optimize` is read as it is (its tokenizer must be the training one).
    """

    def __init__(self, config: Any, tokenizer: Tokenizer):
        data = config.data
        path = data.val_dataset_path
        what = f"data.val_dataset_path {path}"
        if not is_optimized_dataset(path):
            path = prepare_text(path, data.tokenizer_spec(), data.text_column, cache_root(config)).path
        self.dataset = open_blocks(path, tokenizer, data.max_seq_len, shuffle=False, seed=0, what=what)
        if len(self.dataset) == 0:
            raise InputError(
                f"{what} holds fewer than one block of max_seq_len + 1 = {data.max_seq_len + 1} tokens; "
                "add text or lower data.max_seq_len"
            )

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, index: int, batch_size: int) -> dict[str, torch.Tensor]:
        """Batch `index` of `batch_size` blocks in file order; the last one may be short."""
        lo, hi = index * batch_size, min((index + 1) * batch_size, len(self))
        return as_batch(torch.from_numpy(self.dataset.read_blocks(np.arange(lo, hi))["input_ids"]))


def build_validation(config: Any, tokenizer: Tokenizer) -> ValidationSet | None:
    """The ValidationSet of `data.val_dataset_path`, or None when it is unset."""
    return ValidationSet(config, tokenizer) if config.data.val_dataset_path else None


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    val: ValidationSet,
    batch_size: int,
    val_batches: int,
    env: DistEnv,
    device: torch.device,
    autocast: Callable[[], Any],
) -> float:
    """Mean loss over the first `val_batches` batches, batch `b` on rank `b % world_size`, reduced over ranks."""
    model.eval()
    n_batches = min(val_batches, max(1, len(val) // batch_size))
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for b in range(env.rank, n_batches, env.world_size):
        batch = val.batch(b, batch_size)
        rows = len(batch["input_ids"])
        with autocast():
            positions = batch.get("position_ids")
            _, loss = model(batch["input_ids"].to(device), batch["labels"].to(device),
                            None if positions is None else positions.to(device))
        total += torch.tensor([float(loss) * rows, rows], dtype=torch.float64, device=device)
    if env.world_size > 1:
        dist.all_reduce(total)
    return float(total[0] / total[1].clamp(min=1))
