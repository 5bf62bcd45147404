"""The `s3` scenario's runs, one contestant per process: an epoch read from the S3 server, every block hashed.

Every contestant reads `spec["url"]` with the endpoint and keys from the environment (AWS_* names;
MosaicML Streaming's S3_ENDPOINT_URL), into its own cache folder `spec["cache_dir"]`, with its
own cache limit option (`max_cache`, bytes, or None for none). `pace_s` sleeps after each batch
(a training step) so that a server restart lands inside the epoch. The MDS writer for MosaicML
lives here too: it runs in the peer venv.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from bench.runners.common import BATCH, BLOCK, consume, save_hashes


def _tokens(spec: dict) -> np.memmap:
    meta = json.loads(Path(spec["index"]).read_text())
    return np.memmap(meta["path"], dtype=np.dtype(meta["dtype"]), mode="r")


def stream_of_blocks(tokens: np.ndarray, copies: int, rows: int = 4096):
    """The token stream repeated `copies` times, cut every BLOCK tokens (the last partial block dropped)."""
    carry = np.empty(0, dtype=tokens.dtype)
    for _ in range(copies):
        for lo in range(0, len(tokens), rows * BLOCK):
            flat = np.concatenate([carry, tokens[lo:lo + rows * BLOCK]])
            n = len(flat) // BLOCK
            yield flat[: n * BLOCK].reshape(n, BLOCK)
            carry = flat[n * BLOCK:]


def prepare_mds(spec: dict) -> dict:
    """MDSWriter (one process, the standard LM recipe: one sample per block of the concatenated stream)."""
    from bench.runners.mosaic_peer import _import_streaming

    _import_streaming()
    from streaming import MDSWriter

    t0 = time.perf_counter()
    samples = 0
    with MDSWriter(out=spec["output_dir"], columns={"tokens": "ndarray:uint16"}, size_limit=spec["chunk_bytes"]) as w:
        for rows in stream_of_blocks(_tokens(spec), spec["copies"]):
            for row in rows:
                w.write({"tokens": np.ascontiguousarray(row, dtype=np.uint16)})
            samples += len(rows)
    return {"seconds": time.perf_counter() - t0, "samples": samples}


class _AllDocs:
    """optimize's `fn` for one input: every document of the token stream, `copies` times, in order."""

    def __init__(self, spec: dict):
        from bench.runners.common import PretokenizedDocs

        self.docs, self.shards, self.copies = PretokenizedDocs(spec["tokens"], spec["index"]), spec["shards"], spec["copies"]

    def __call__(self, _input: int):
        for _ in range(self.copies):
            for shard in range(self.shards):
                yield from self.docs(shard)


def prepare_ours(spec: dict) -> dict:
    """Ours' optimize() straight to s3://, in one task: optimize never lets a shard span two tasks (it cuts
    its inputs into 4 per worker), so only one task gives shards of `chunk_bytes` on a dataset this small."""
    from llm.data import TokensLoader, optimize

    t0 = time.perf_counter()
    optimize(_AllDocs(spec["pretokenized"]), [0], spec["output_dir"], num_workers=0, chunk_bytes=spec["chunk_bytes"],
             item_loader=TokensLoader(), mode="overwrite", progress=False)
    return {"seconds": time.perf_counter() - t0}


def reference_hashes(spec: dict) -> dict:
    """Hashes of every full block of the repeated stream: what ours and the MDS recipe must deliver."""
    import xxhash

    out = [xxhash.xxh3_64_intdigest(row.astype(np.int64).tobytes())
           for rows in stream_of_blocks(_tokens(spec), spec["copies"]) for row in rows]
    np.save(spec["hashes_out"], np.asarray(out, dtype=np.uint64))
    return {"blocks": len(out)}


# ---- one epoch ------------------------------------------------------------------------------


def _ours(spec: dict):
    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(spec["url"], item_loader=TokensLoader(block_size=BLOCK), shuffle=spec["shuffle"], seed=42,
                          drop_last=True, cache_dir=spec["cache_dir"], max_cache_size=spec["max_cache"])
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=spec["num_workers"])


def _litdata(spec: dict):
    import litdata.streaming.downloader as dl
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    if spec.get("allow_http", True):
        # LitData 0.2.76 fetches chunks with obstore, built without `allow_http`: against an
        # http:// endpoint every GET fails (BadScheme). Its boto3 client reads AWS_ENDPOINT_URL.
        dl._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = spec["cache_dir"]
    kw = {} if spec["max_cache"] is None else {"max_cache_size": spec["max_cache"]}
    ds = StreamingDataset(spec["url"], item_loader=TokensLoader(block_size=BLOCK), shuffle=spec["shuffle"], seed=42,
                          cache_dir=spec["cache_dir"], **kw)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=spec["num_workers"])


def _mosaic(spec: dict):
    from torch.utils.data import DataLoader

    from bench.runners.mosaic_peer import _collate, _import_streaming

    streaming = _import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = streaming.StreamingDataset(remote=spec["url"], local=spec["cache_dir"], shuffle=spec["shuffle"],
                                    shuffle_seed=42, batch_size=BATCH, cache_limit=spec["max_cache"])
    return DataLoader(ds, batch_size=BATCH, num_workers=spec["num_workers"], collate_fn=_collate)


_LOADERS = {"ours": _ours, "litdata": _litdata, "mosaic": _mosaic}


def _import(who: str) -> None:
    # Imports happen before t0 for every contestant (a trainer has paid them already).
    if who == "ours":
        import llm.data.shards.read.dataset  # noqa: F401
        from llm.data import StreamingDataLoader  # noqa: F401
    elif who == "litdata":
        import litdata  # noqa: F401
    else:
        from bench.runners.mosaic_peer import _import_streaming

        _import_streaming()
        import torch.utils.data  # noqa: F401


def _paced(batches, pace_s: float):
    for batch in batches:
        yield batch
        if pace_s:
            time.sleep(pace_s)


def stream(spec: dict) -> dict:
    """One epoch; `marker` is written when the clock starts (the harness times a restart from it)."""
    _import(spec["who"])
    Path(spec["cache_dir"]).mkdir(parents=True, exist_ok=True)
    if spec.get("marker"):
        Path(spec["marker"]).write_text(str(time.time()))
    t0 = time.perf_counter()
    loader = _LOADERS[spec["who"]](spec)
    res = consume(_paced(loader, spec.get("pace_s", 0.0)), t0, hash_blocks=True)
    save_hashes(res, spec["hashes_out"])
    return res
