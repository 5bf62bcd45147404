"""`llm.data.dedup`: the guide's import path for deduplication (the code lives in `llm.data.inputs.dedup`)."""

from llm.data.inputs.dedup import (
    IN_MEMORY_WARNING,
    DedupTextSource,
    SeenSet,
    check_hash_algo,
    hasher,
    publish_seen_hashes,
    text_digest,
)
from llm.data.inputs.dedup import collapse_whitespace as normalize  # the guide's name for it
from llm.data.inputs.seen_file import DIGEST_BYTES, SeenFileError

__all__ = [
    "DIGEST_BYTES",
    "IN_MEMORY_WARNING",
    "DedupTextSource",
    "SeenFileError",
    "SeenSet",
    "check_hash_algo",
    "hasher",
    "normalize",
    "publish_seen_hashes",
    "text_digest",
]
