"""Text files to token shards: the work behind `llm-data optimize`.

Big uncompressed .txt/.jsonl files are cut into byte ranges aligned to line
ends, so two workers share one large file; compressed files and parquet files
are whole tasks. Each worker tokenizes records in batches, with EOS after every
document.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm.data.inputs.listing import refuse_inputs_in_output
from llm.data.inputs.partitions import byte_ranges
from llm.data.inputs.readers import (
    FileStamp,
    InputError,
    expand_inputs,
    iter_line_range,
    iter_texts,
    require_records,
    splittable,
)
from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.prepare.optimize import DocumentBatch, OptimizeSummary, optimize
from llm.data.storage.paths import parse_location
from llm.data.tokenize.documents import tokenize_documents
from llm.data.tokenize.engines import BACKENDS
from llm.data.tokenize.foreign import as_tokenizer
from llm.data.tokenize.tokenizers import Tokenizer, load_tokenizer

_BATCH_DOCS = 1024
_BATCH_CHARS = 1 << 20


@dataclass(frozen=True)
class TextRange:
    """Records of `path` whose line starts in [start, end); end None means to the end of the file."""

    path: str
    start: int = 0
    end: int | None = None
    stamp: FileStamp | None = None  # the file as planned: checked after the range is read


def plan_ranges(paths: list[Path], pieces: int) -> list[TextRange]:
    """Cut inputs into about `pieces` ranges of similar size, in input order."""
    stamps = [FileStamp.of(p) for p in paths]
    target = max(1 << 20, sum(s.size for s in stamps) // max(pieces, 1))
    ranges: list[TextRange] = []
    for path, stamp in zip(paths, stamps):
        if not splittable(path) or stamp.size <= target:
            ranges.append(TextRange(str(path), stamp=stamp))
            continue
        ranges.extend(TextRange(str(path), a, b, stamp) for a, b in byte_ranges(stamp.size, target))
    return ranges


class TokenizeText:
    """fn for optimize(): a TextRange -> DocumentBatches; counts input bytes and invalid UTF-8."""

    def __init__(self, tokenizer_spec: str, text_column: str = "text", backend: str | None = None,
                 tokenizer: Tokenizer | None = None):
        self.tokenizer_spec, self.text_column, self.backend = tokenizer_spec, text_column, backend
        self._given = tokenizer  # the tokenizer optimize_text loaded: inherited by forked workers, else pickled
        # across (ours pickle as a path and backend, and are rebuilt)
        self._tokenizer: Tokenizer | None = None  # loaded in the worker, not pickled across
        self._stats = {"input_bytes": 0, "invalid_utf8_records": 0}

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = self._given or load_tokenizer(self.tokenizer_spec, self.backend)
        return self._tokenizer

    def _records(self, item: TextRange) -> Iterator[str]:
        if item.stamp is not None:
            item.stamp.check(item.path, "since optimize listed it")
        if item.start == 0 and item.end is None:  # a whole file of any kind
            records = iter_texts(item.path, self.text_column)
        else:
            records = ((text, replaced) for text, _, replaced in iter_line_range(item.path, self.text_column, item.start, item.end))
        try:
            for text, replaced in records:
                self._stats["invalid_utf8_records"] += replaced
                yield text
        except InputError:
            if item.stamp is not None:  # a line cut by a writer is a changed file, not a bad record
                item.stamp.check(item.path)
            raise
        if item.stamp is not None:  # every record of the range came from one version of the file
            item.stamp.check(item.path)

    def __call__(self, item: TextRange) -> Iterator[DocumentBatch]:
        batch: list[str] = []
        chars = 0
        for text in self._records(item):
            batch.append(text)
            chars += len(text)
            if len(batch) >= _BATCH_DOCS or chars >= _BATCH_CHARS:
                yield self._encode(batch)
                batch, chars = [], 0
        if batch:
            yield self._encode(batch)
        self._stats["input_bytes"] += _range_bytes(item)

    def _encode(self, texts: list[str]) -> DocumentBatch:
        tokens, lengths = tokenize_documents(self.tokenizer, texts)
        return DocumentBatch(tokens, lengths)

    def pop_stats(self) -> dict[str, int]:
        stats, self._stats = self._stats, {"input_bytes": 0, "invalid_utf8_records": 0}
        return stats

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_tokenizer"] = None
        return state


def _range_bytes(item: TextRange) -> int:
    end = item.end if item.end is not None else (item.stamp.size if item.stamp else os.path.getsize(item.path))
    return end - item.start


def optimize_text(
    inputs: list[str],
    output_dir: str | Path,
    tokenizer: Any = "simple",
    *,
    num_workers: int | None = None,
    text_column: str = "text",
    chunk_bytes: int | str | None = None,
    mode: str | None = None,
    compression: str | None = None,
    progress: bool = True,
    wait: bool = False,
    allow_empty: bool = False,
    storage_options: dict | None = None,
    tokenizer_backend: str | None = None,
    engine: str = "local",
    ray_address: str | None = None,
) -> OptimizeSummary:
    """Tokenize text files (.txt, .jsonl[.gz|.zst], .json arrays, .parquet) into a token dataset (a folder or s3://).

    Inputs that hold no record at all are an InputError naming them, unless `allow_empty`
    (then an empty dataset is written). `tokenizer_backend` picks the encoding engine
    (`load_tokenizer`); the dataset is the same whichever it is, and its manifest records it.
    `engine` / `ray_address`: as for `optimize`. `tokenizer`: a spec (`load_tokenizer`), or a tokenizer
    object, ours or a Hugging Face / `tokenizers` / tiktoken one (`as_tokenizer`).
    """
    tok = as_tokenizer(tokenizer, tokenizer_backend, "optimize_text: tokenizer=")  # fails fast, in the parent
    # Workers use the engine the parent chose (not `auto` again), so one run has one engine.
    backend = tok.backend if tok.backend in BACKENDS else None
    location = parse_location(output_dir)
    if not location.is_object_store:
        refuse_inputs_in_output(inputs, location.local_path())
    paths = expand_inputs(inputs)
    if not allow_empty:
        require_records(paths, text_column, "pass allow_empty=True (CLI: --allow-empty) to write an empty dataset")
    workers = (os.cpu_count() or 1) if num_workers is None else num_workers
    ranges = plan_ranges(paths, 4 * max(workers, 1))
    sources = [{"path": str(p), "bytes": p.stat().st_size, "text_column": text_column} for p in paths]
    # The tokenizer loaded here goes to the workers as it is: forked workers inherit it (building a
    # fast engine from a 50k vocabulary takes ~1 s, which each worker would pay again before its
    # first batch); spawned workers and Ray tasks get it pickled as what rebuilds it.
    return optimize(
        TokenizeText(tok.spec, text_column, backend, tok), ranges, output_dir,
        num_workers=num_workers, chunk_bytes=chunk_bytes, item_loader=TokensLoader(), mode=mode,
        compression=compression, tokenizer=tok, sources=sources, progress=progress, wait=wait,
        storage_options=storage_options, engine=engine, ray_address=ray_address,
    )
