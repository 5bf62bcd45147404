"""Corpus deduplication before tokenizing: exact and MinHash-LSH near duplicates, local or on Ray (docs/dedup.md)."""

from llm.data.corpus_dedup.params import DedupParams
from llm.data.corpus_dedup.pipeline import dedup_corpus

__all__ = ["DedupParams", "dedup_corpus"]
