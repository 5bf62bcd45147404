"""Local text files tokenized once into a token-shard dataset, cached under a key of inputs + tokenizer.

The `lm` task and every task's validation set read local .txt/.jsonl/.parquet files.
Rather than tokenizing them in memory on every rank, they are turned once into a
dataset by `optimize_text` (the same format `llm-data optimize` writes) and served
by `StreamingDataset`. The cache folder is named by a key of the inputs' resolved
paths, sizes and mtimes, the tokenizer's fingerprint and the text column, so a
changed file or tokenizer makes a new entry and an unchanged one is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import xxhash

from llm.data.inputs.readers import InputError, expand_inputs
from llm.data.shards.prepare.optimize_text import optimize_text
from llm.data.storage.local import pid_alive
from llm.data.tokenize.tokenizers import load_tokenizer

CACHE_VERSION = 1  # bump when the prepared format changes, so old entries are not reused
SOURCE_FILE = "text_source.json"  # written into each entry: what it was made from
INDEX_FILE = "index.json"  # the dataset's manifest, written last by optimize
_TMP_PREFIX = ".tmp-"
_PARALLEL_BYTES = 32 << 20  # below this, forking tokenizer processes costs more than it saves


@dataclass(frozen=True)
class PreparedText:
    """A cache entry: the token-shard dataset folder and the digest of the text it was made from."""

    path: Path
    content_xxh3_128: str
    files: tuple[str, ...]


def cache_root(config: Any) -> Path:
    """Where prepared datasets live: data.cache_dir, else <checkpoint_dir>/.data, else ~/.cache/llm/data."""
    if config.data.cache_dir:
        return Path(config.data.cache_dir)
    if config.checkpoint.checkpoint_dir:
        return Path(config.checkpoint.checkpoint_dir) / ".data"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "llm" / "data"


def is_optimized_dataset(path: str | Path) -> bool:
    """True when `path` is a folder made by `llm-data optimize` (it holds an index.json)."""
    return (Path(path) / INDEX_FILE).is_file()


def cache_key(files: list[Path], tokenizer_fingerprint: dict, text_column: str) -> str:
    """Cheap to recompute (stat calls only): the inputs' identity, the tokenizer and the column."""
    inputs = []
    for path in files:
        st = path.stat()
        inputs.append([str(path), st.st_size, st.st_mtime_ns])
    blob = json.dumps(
        {"version": CACHE_VERSION, "inputs": inputs, "tokenizer": tokenizer_fingerprint, "text_column": text_column},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def content_digest(files: list[Path]) -> str:
    """xxh3-128 of the inputs' bytes (each prefixed by its size): identifies the text, not where it lies."""
    digest = xxhash.xxh3_128()
    for path in files:
        digest.update(path.stat().st_size.to_bytes(8, "little"))
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def prepare_text(
    inputs: str,
    tokenizer_spec: str,
    text_column: str,
    root: Path,
    log: Callable[[str], None] = print,
) -> PreparedText:
    """The cached token dataset of the text files `inputs` names (a file, glob or folder).

    Under torch.distributed rank 0 prepares while the others wait; its outcome (success
    or the one-sentence error) is broadcast so that every rank fails alike.
    """
    files = expand_inputs([str(inputs)])  # a missing input fails on every rank, before any collective
    tokenizer = load_tokenizer(tokenizer_spec)
    folder = root / f"text-{cache_key(files, tokenizer.fingerprint(), text_column)}"
    _on_rank_zero(lambda: _build(folder, files, tokenizer_spec, tokenizer.fingerprint(), text_column, log))
    return _read_entry(folder)


def _on_rank_zero(build: Callable[[], None]) -> None:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        build()
        return
    outcome: list[Any] = [None]
    error: BaseException | None = None
    if dist.get_rank() == 0:
        try:
            build()
        except BaseException as exc:  # every rank must learn of it, or they wait forever
            error, outcome = exc, [str(exc)]
    dist.broadcast_object_list(outcome, src=0)
    if error is not None:
        raise error
    if outcome[0] is not None:
        raise InputError(outcome[0])


def _build(folder: Path, files: list[Path], spec: str, tok_fp: dict, column: str, log: Callable[[str], None]) -> None:
    if _complete(folder):
        return
    root = folder.parent
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root, folder.name)
    tmp = root / f"{_TMP_PREFIX}{folder.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        digest = content_digest(files)
        total = sum(p.stat().st_size for p in files)
        summary = optimize_text(
            [str(p) for p in files], tmp, spec, text_column=column,
            num_workers=0 if total < _PARALLEL_BYTES else None, progress=False,
        )
        if cache_key(files, tok_fp, column) != folder.name.removeprefix("text-"):
            raise InputError(f"{files[0].parent}: an input file changed while it was tokenized; run again")
        source = {"content_xxh3_128": digest, "files": [str(p) for p in files], "text_column": column, "tokenizer": tok_fp}
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=1))
        _commit(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"prepared {len(files)} file(s) once, cached in {folder}: {summary.documents:,} documents, {summary.tokens:,} tokens")


def _commit(tmp: Path, folder: Path) -> None:
    if folder.exists() and not _complete(folder):  # a hand-damaged entry: replace it
        shutil.rmtree(folder, ignore_errors=True)
    try:
        os.replace(tmp, folder)  # atomic: readers see no entry or a whole one
    except OSError:
        if not _complete(folder):  # not a concurrent job that finished first
            raise


def _complete(folder: Path) -> bool:
    return (folder / INDEX_FILE).is_file() and (folder / SOURCE_FILE).is_file()


def _remove_stale(root: Path, name: str) -> None:
    """Temporary folders of this entry left by killed preparations (on this machine)."""
    for tmp in root.glob(f"{_TMP_PREFIX}{name}-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _read_entry(folder: Path) -> PreparedText:
    if not _complete(folder):
        raise InputError(f"{folder}: the prepared dataset is missing; is the cache folder on a filesystem every rank sees?")
    source = json.loads((folder / SOURCE_FILE).read_text())
    return PreparedText(folder, source["content_xxh3_128"], tuple(source["files"]))
