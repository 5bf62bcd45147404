"""`llm.data.sources`: the guide's import path for text sources (the code lives in `llm.data.text`)."""

from llm.data.text.dedup import DedupTextSource
from llm.data.text.hf import HFStreamTextSource
from llm.data.text.local import LocalLineTextSource
from llm.data.text.partitions import STRIPES, assign_partitions, stripe_partitions
from llm.data.text.registry import SOURCE_REGISTRY, SourceRegistry, build_text_source
from llm.data.text.source import (
    FINGERPRINT_MISMATCH,
    Partition,
    Record,
    TextSource,
    validate_source_fingerprint,
)

__all__ = [
    "FINGERPRINT_MISMATCH",
    "SOURCE_REGISTRY",
    "STRIPES",
    "DedupTextSource",
    "HFStreamTextSource",
    "LocalLineTextSource",
    "Partition",
    "Record",
    "SourceRegistry",
    "TextSource",
    "assign_partitions",
    "build_text_source",
    "stripe_partitions",
    "validate_source_fingerprint",
]
