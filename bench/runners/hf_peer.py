"""Hugging Face `datasets`: streaming JSON + batched `map(tokenize)` + packing into 2049-token blocks."""

from __future__ import annotations

import time

import numpy as np

from bench.runners.common import BATCH, BLOCK, consume
from bench.tok import encoder


def _packed(spec: dict):
    import torch
    from datasets import load_dataset

    enc_spec = spec["tokenizer"]

    def tokenize(batch: dict) -> dict:
        enc = encoder(enc_spec)
        ids = enc.encode_batch(batch["text"])
        return {"input_ids": [x + [enc.eos_id] for x in ids]}

    # One shard per JSONL file, so DataLoader workers split the files between them.
    hf = load_dataset("json", data_files=spec["inputs"], split="train", streaming=True)
    hf = hf.map(tokenize, batched=True, batch_size=64, remove_columns=["text"])

    class Packed(torch.utils.data.IterableDataset):
        """The usual packing loop: concatenate documents, cut full blocks, carry the remainder."""

        def __iter__(self):
            buf = np.empty(0, dtype=np.int64)
            for ex in hf:  # HF splits shards over DataLoader workers inside its own __iter__
                buf = np.concatenate([buf, np.asarray(ex["input_ids"], dtype=np.int64)])
                n = len(buf) // BLOCK
                if n:
                    yield from torch.from_numpy(buf[: n * BLOCK].reshape(n, BLOCK))
                    buf = buf[n * BLOCK:]

    return Packed()


def onthefly(spec: dict) -> dict:
    import datasets  # noqa: F401  (imports before t0, as for every contestant)
    from torch.utils.data import DataLoader

    t0 = time.perf_counter()
    nw = spec["num_workers"]
    kwargs = {}
    if spec.get("tuned") and nw > 0:
        # The tuning that helps most here: don't make workers wait their turn, and prefetch deeper.
        kwargs = {"in_order": False, "prefetch_factor": 8}
    loader = DataLoader(_packed(spec), batch_size=BATCH, num_workers=nw, **kwargs)
    return consume(loader, t0)
