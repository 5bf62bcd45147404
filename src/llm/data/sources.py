"""`llm.data.sources`: the guide's import path for text sources (the code lives in `llm.data.text`)."""

from llm.data.inputs.dedup import DedupTextSource
from llm.data.inputs.hf import HFStreamTextSource
from llm.data.inputs.local import LocalLineTextSource
from llm.data.inputs.partitions import STRIPES, assign_partitions, stripe_partitions
from llm.data.inputs.registry import SOURCE_REGISTRY, SourceRegistry, build_text_source
from llm.data.inputs.source import (
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
