"""LitData: `optimize(..., item_loader=TokensLoader())`, `StreamingDataset(TokensLoader)` + `StreamingDataLoader`."""

from __future__ import annotations

import os
import shutil
import time

import torch

from bench.runners.common import (
    BATCH,
    BLOCK,
    consume,
    prepare_fn_and_inputs,
    save_hashes,
    time_epochs,
)


def prepare(spec: dict) -> dict:
    from litdata import TokensLoader, optimize

    fn, inputs = prepare_fn_and_inputs(spec)
    out = spec["output_dir"]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    optimize(fn=fn, inputs=inputs, output_dir=out, num_workers=spec["num_workers"],
             chunk_bytes=spec.get("chunk_bytes", "64MB"), item_loader=TokensLoader(),
             mode="overwrite", verbose=False)
    return {"seconds": time.perf_counter() - t0}


def _loader(spec: dict, num_workers: int):
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    # A fresh cache dir per run: LitData keeps per-dataset state there between processes.
    os.environ.setdefault("DATA_OPTIMIZER_CACHE_FOLDER", spec.get("cache_dir", "/tmp/bench-litdata-cache"))
    ds = StreamingDataset(spec["data_dir"], item_loader=TokensLoader(block_size=BLOCK),
                          shuffle=True, seed=spec.get("seed", 42), drop_last=False)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=num_workers)


def _import() -> None:
    # Imports happen before t0 for every contestant (a trainer has paid them already).
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader  # noqa: F401


def stream(spec: dict) -> dict:
    _import()
    t0 = time.perf_counter()
    loader = _loader(spec, spec["num_workers"])
    res = time_epochs(loader, spec, t0)
    return res


def resume_save(spec: dict) -> dict:
    """Run to `stop_batches`, save the loader state, record what was seen."""
    _import()
    loader = _loader(spec, spec["num_workers"])
    res = consume(loader, time.perf_counter(), hash_blocks=True, max_batches=spec["stop_batches"])
    torch.save(loader.state_dict(), spec["state_path"])
    res["state_bytes"] = os.path.getsize(spec["state_path"])
    save_hashes(res, spec["hashes_out"])
    return res


def resume_load(spec: dict) -> dict:
    """New process: build, load the state, time to the first batch, then the rest of the epoch."""
    _import()
    t0 = time.perf_counter()
    loader = _loader(spec, spec["num_workers"])
    loader.load_state_dict(torch.load(spec["state_path"], weights_only=False))
    res = consume(loader, t0, hash_blocks=True)
    save_hashes(res, spec["hashes_out"])
    return res
