"""MosaicML Streaming: `MDSWriter` (one per process, then `merge_index`) and `StreamingDataset` + DataLoader."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import time
import types

import numpy as np

from bench.runners.common import BATCH, BLOCK, time_epochs
from bench.tok import TokenizeFile


def _import_streaming():
    # `import streaming` imports streaming.vision, which needs a torchvision whose C ops load;
    # none exists for CPU torch 2.13 here. The MDS text path never touches vision, so we skip it.
    if "streaming.vision" not in sys.modules:
        try:
            import torchvision  # noqa: F401
        except Exception:
            sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
    import streaming

    return streaming


def _write_part(args: tuple[str, list[str], str, str]) -> int:
    spec, inputs, out, compression = args
    from streaming import MDSWriter

    fn = TokenizeFile(spec)
    buf: list[np.ndarray] = []
    held = 0
    samples = 0
    # Standard MDS recipe for LM pretraining (llm-foundry's ConcatTokensDataset): concatenate the
    # documents and write one fixed-length sample per block; the process's last partial block is dropped.
    with MDSWriter(out=out, columns={"tokens": "ndarray:uint16"}, compression=compression or None,
                   size_limit="64mb") as w:
        for path in inputs:
            for arr in fn(path):
                buf.append(arr)
                held += len(arr)
                if held >= BLOCK:
                    flat = np.concatenate(buf)
                    n = len(flat) // BLOCK
                    for i in range(n):
                        w.write({"tokens": flat[i * BLOCK:(i + 1) * BLOCK]})
                    samples += n
                    rest = flat[n * BLOCK:]
                    buf, held = [rest], len(rest)
    return samples


def prepare(spec: dict) -> dict:
    _import_streaming()
    from streaming.base.util import merge_index

    out = spec["output_dir"]
    shutil.rmtree(out, ignore_errors=True)
    n = spec["num_workers"]
    t0 = time.perf_counter()
    parts = [(spec["tokenizer"], spec["inputs"][i::n], os.path.join(out, str(i)), spec.get("compression"))
             for i in range(n)]
    with mp.get_context("fork").Pool(n) as pool:
        samples = sum(pool.map(_write_part, parts, chunksize=1))
    merge_index(out, keep_local=True)
    return {"seconds": time.perf_counter() - t0, "samples": samples}


def _collate(samples: list[dict]):
    import torch

    return torch.from_numpy(np.stack([s["tokens"] for s in samples]).astype(np.int64))


def _loader(spec: dict, num_workers: int):
    streaming = _import_streaming()
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    ds = streaming.StreamingDataset(local=spec["data_dir"], shuffle=True,
                                    shuffle_seed=spec.get("seed", 42), batch_size=BATCH)
    return DataLoader(ds, batch_size=BATCH, num_workers=num_workers, collate_fn=_collate)


def stream(spec: dict) -> dict:
    _import_streaming()  # imports before t0, as for every contestant
    from torch.utils.data import DataLoader  # noqa: F401

    t0 = time.perf_counter()
    loader = _loader(spec, spec["num_workers"])
    res = time_epochs(loader, spec, t0)
    return res
