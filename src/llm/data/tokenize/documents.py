"""Texts to token ids: the one place that encodes documents (batched) and puts EOS after each."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llm.data.tokenize.protocol import Tokenizer


def encode_each(tokenizer: Tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """One id array per text (no EOS), from one batched tokenizer call.

    A tokenizer with a flat encoder (the byte-level one: its ids are the UTF-8 bytes themselves)
    gives one buffer for the batch: no per-token Python objects.
    """
    flat = tokenizer.encode_flat
    if flat is not None:
        ids, offsets = flat(list(texts))
        bounds = offsets.tolist()  # slices, not np.split: a few times cheaper per document
        return [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    return [np.asarray(ids, dtype=np.int64) for ids in tokenizer.encode_batch(list(texts))]


def tokenize_documents(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(flat int64 ids with EOS after each document, int64 lengths incl. EOS), vectorised."""
    flat_encoder = tokenizer.encode_flat
    if flat_encoder is not None:
        ids, offsets = flat_encoder(list(texts))
        lengths = np.diff(offsets) + 1
    else:
        docs = encode_each(tokenizer, texts)
        lengths = np.fromiter((len(d) + 1 for d in docs), dtype=np.int64, count=len(docs))
        ids = np.concatenate(docs) if docs else None
    flat = np.full(int(lengths.sum()), tokenizer.eos_id, dtype=np.int64)
    body = np.ones(len(flat), dtype=bool)
    body[np.cumsum(lengths) - 1] = False  # each document's last slot keeps its EOS
    if ids is not None:
        flat[body] = ids
    return flat, lengths
