"""`llm.data.dedup`: the guide's import path for deduplication (the code lives in `llm.data.text.dedup`)."""

from llm.data.text.dedup import (
    IN_MEMORY_WARNING,
    DedupTextSource,
    SeenSet,
    hasher,
    normalize,
    text_digest,
)
from llm.data.text.seen_file import DIGEST_BYTES, SeenFileError

__all__ = [
    "DIGEST_BYTES",
    "IN_MEMORY_WARNING",
    "DedupTextSource",
    "SeenFileError",
    "SeenSet",
    "hasher",
    "normalize",
    "text_digest",
]
