"""Text records to token arrays: batched encoding with EOS after every document."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llm.data.tokenizers import SimpleTokenizer, Tokenizer, encode_documents


def tokenize_documents(tokenizer: Tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(flat int64 ids with EOS after each document, int64 lengths incl. EOS), vectorised."""
    flat, lengths = encode_documents(tokenizer, texts)
    lengths_arr = np.asarray(lengths, dtype=np.int64)
    if isinstance(tokenizer, SimpleTokenizer):
        body = np.frombuffer(flat, dtype=np.uint8).astype(np.int64)  # type: ignore[arg-type]
    else:
        body = np.fromiter(flat, dtype=np.int64, count=len(flat))
    # Insert EOS at each document's end: positions in `body` are the cumulative lengths without EOS.
    ends = np.cumsum(lengths_arr - 1)
    return np.insert(body, ends, tokenizer.eos_id), lengths_arr
