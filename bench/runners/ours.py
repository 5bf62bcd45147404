"""Ours: `llm.data.shards.prepare.optimize`, `StreamingDataset` + `StreamingDataLoader`, and the stream_lm on-the-fly path."""

from __future__ import annotations

import json
import os
import shutil
import time

from bench.runners.common import (
    BATCH,
    BLOCK,
    consume,
    epochs,
    prepare_fn_and_inputs,
    save_hashes,
    time_epochs,
)


def prepare(spec: dict) -> dict:
    from llm.data import TokensLoader, optimize

    fn, inputs = prepare_fn_and_inputs(spec, engine="ours")
    out = spec["output_dir"]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    optimize(fn, inputs, out, num_workers=spec["num_workers"], chunk_bytes=spec.get("chunk_bytes", "64MB"),
             item_loader=TokensLoader(), mode="overwrite", progress=False)
    return {"seconds": time.perf_counter() - t0, "encoder": _encoder_name(spec)}


def _encoder_name(spec: dict) -> str | None:
    if "tokenizer" not in spec:
        return None
    from bench.tok import encoder

    return getattr(encoder(spec["tokenizer"], "ours"), "backend", None)


def _import() -> None:
    # Imports (torch alone is ~1 s here) happen before t0 for every contestant: a trainer has paid
    # them long before it asks for its first batch.
    import llm.data.shards.read.dataset  # noqa: F401
    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader  # noqa: F401


def _loader(spec: dict, num_workers: int, batch_size: int = BATCH):
    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(spec["data_dir"], item_loader=TokensLoader(block_size=BLOCK), shuffle=True,
                          seed=spec.get("seed", 42), drop_last=spec.get("drop_last", False))
    kwargs = {"worker_backend": spec["worker_backend"]} if spec.get("worker_backend") else {}
    return StreamingDataLoader(ds, batch_size=batch_size, num_workers=num_workers, **kwargs)


def _topology(spec: dict) -> int:
    # Ranks come from RANK / WORLD_SIZE when torch.distributed is not initialised (read at iteration).
    world = spec.get("world_size", 1)
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(spec.get("rank", 0)), str(world)
    return BATCH // world  # same global batch whatever the world size


def stream(spec: dict) -> dict:
    _import()
    t0 = time.perf_counter()
    loader = _loader(spec, spec["num_workers"])
    res = time_epochs(loader, spec, t0)
    res["worker_backend"] = getattr(loader, "worker_backend", "processes")
    return res


def resume_save(spec: dict) -> dict:
    batch = _topology(spec)
    _import()
    loader = _loader(spec, spec["num_workers"], batch)
    res = consume(loader, time.perf_counter(), hash_blocks=True, max_batches=spec["stop_batches"])
    with open(spec["state_path"], "w") as f:
        json.dump(loader.state_dict(), f)
    res["state_bytes"] = os.path.getsize(spec["state_path"])
    save_hashes(res, spec["hashes_out"])
    return res


def resume_load(spec: dict) -> dict:
    batch = _topology(spec)
    _import()
    t0 = time.perf_counter()
    loader = _loader(spec, spec["num_workers"], batch)
    with open(spec["state_path"]) as f:
        loader.load_state_dict(json.load(f))
    res = consume(loader, t0, hash_blocks=True)
    save_hashes(res, spec["hashes_out"])
    return res


def paths(spec: dict) -> dict:
    """One read path of ours, `old` (per row / per sample, as before issue 16) or `new`."""
    _import()
    import numpy as np
    import torch

    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

    t0 = time.perf_counter()
    docb = spec["path"] == "docb"
    ds = StreamingDataset(spec["data_dir"], item_loader=TokensLoader(block_size=BLOCK, document_boundaries=docb),
                          shuffle=True, seed=42)
    if spec["variant"] == "old" and docb:
        def read_blocks(ids):  # the former loop: TokenReader.read for every block
            tokens = np.empty((len(ids), BLOCK), dtype=np.int64)
            positions = np.empty_like(tokens)
            for row in range(len(ids)):
                ds._read_block(int(ids[row]), tokens[row], positions[row])
            return {"input_ids": tokens, "position_ids": positions}

        ds.read_blocks = read_blocks
    elif spec["variant"] == "old":
        ds._samples = lambda samples: (ds[int(s)] for s in samples)  # the former one-sample-at-a-time path
    if docb:
        loader = StreamingDataLoader(ds, batch_size=BATCH)
    else:
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH)
    return consume(epochs(loader, spec.get("epochs", 1)), t0)


def onthefly(spec: dict) -> dict:
    """stream_lm: JSONL text in, tokenized and packed while iterating, N loader workers, one pass."""
    import llm.data.text.stream  # noqa: F401
    from llm.data import StreamingTextDataModule
    from llm.training.core.config import DataConfig

    t0 = time.perf_counter()
    kind = "tiktoken" if spec["tokenizer"].endswith(".tiktoken") else "hf"
    # Windows of max_seq_len + 1 = 2049 tokens with a stride of 2048 (labels are pre-shifted): each
    # block carries 2048 new corpus tokens, which is what we count (labels that are not padding).
    cfg = DataConfig(data_source="local", dataset_path=spec["corpus_dir"], text_column="text",
                     max_seq_len=BLOCK - 1, tokenizer_type=kind, tokenizer_path=spec["tokenizer"],
                     num_workers=spec["num_workers"])
    dm = StreamingTextDataModule(cfg, batch_size=BATCH, loop=False)
    return consume(dm.train_dataloader(), t0, count=_trained_tokens)


def _trained_tokens(batch: dict) -> int:
    """Labels that are not padding (-100), counted by NumPy: the count is the bench's, not the loader's
    work, and torch's two calls (`!=`, `.sum()`) cost ~17 us a batch against NumPy's ~5 us."""
    import numpy as np

    return int(np.count_nonzero(batch["labels"].numpy() != -100))
