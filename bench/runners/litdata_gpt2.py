"""LitData + tiktoken prepare with GPT-2's vocabulary, as its users write it: one whole process, timed from outside.

    python bench/runners/litdata_gpt2.py OUTPUT_DIR NUM_WORKERS SHARD.jsonl [SHARD.jsonl ...]

`tiktoken.get_encoding("r50k_base")` is GPT-2's encoding (the same ranks file as whisper's
gpt2.tiktoken, the same ids as `get_encoding("gpt2")`); bench/prepare_gpt2.py puts the file in
TIKTOKEN_CACHE_DIR under the name tiktoken looks for, so nothing is downloaded. Only what a
LitData user imports is imported here (no bench modules): the time is the user's.
"""

import json
import sys

import numpy as np
import tiktoken
from litdata import TokensLoader, optimize

ENC = tiktoken.get_encoding("r50k_base")
EOS = ENC.eot_token
BATCH = 64  # documents per encode_ordinary_batch call, as bench.tok.Encoder


def tokenize(path: str):
    """One JSONL shard -> one uint16 token array per document, EOS appended."""
    batch = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            batch.append(json.loads(line)["text"])
            if len(batch) == BATCH:
                yield from _arrays(batch)
                batch = []
    if batch:
        yield from _arrays(batch)


def _arrays(texts):
    for ids in ENC.encode_ordinary_batch(texts, num_threads=1):
        ids.append(EOS)
        yield np.asarray(ids, dtype=np.uint16)


if __name__ == "__main__":
    out, workers, inputs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    optimize(fn=tokenize, inputs=inputs, output_dir=out, num_workers=workers, chunk_bytes="64MB",
             item_loader=TokensLoader(), mode="overwrite", verbose=False)
