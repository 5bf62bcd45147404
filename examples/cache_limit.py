"""LitData's `max_cache_size`: shards of a remote dataset are cached locally and evicted to stay under it.

`local:/path` reads a folder through the same cache as `s3://bucket/prefix` (no credentials needed
for this example); with S3, pass the s3:// URL instead.

Run: python examples/cache_limit.py
"""

import os
import tempfile

import numpy as np

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize


def tokenize(index):
    return np.arange(index, index + 1000) % 30_000


def file_bytes(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:  # a download's temporary file, renamed into place while we walked
        return 0


def folder_bytes(path: str) -> int:
    return sum(file_bytes(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main(root: str) -> None:
    optimize(fn=tokenize, inputs=list(range(400)), output_dir=f"{root}/remote", item_loader=TokensLoader(),
             chunk_bytes="100KB", num_workers=2, progress=False)  # about 8 shards of 100 KB
    dataset = StreamingDataset(f"local:{root}/remote", item_loader=TokensLoader(block_size=257), shuffle=True,
                               cache_dir=f"{root}/cache", max_cache_size="300KB")
    peak = 0
    for i, _batch in enumerate(StreamingDataLoader(dataset, batch_size=16)):
        if i % 10 == 0:
            peak = max(peak, folder_bytes(f"{root}/cache"))
    assert 0 < peak <= 300_000 + 100_000, peak  # the limit, plus the one shard being read
    print(f"dataset {folder_bytes(f'{root}/remote'):,} bytes; cache peak {peak:,} bytes (max_cache_size 300KB)")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        main(root)
