"""Axolotl's `pretraining_dataset:` (path, name, split, type: pretrain, text_column, data_files) as our stream_lm keys."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from llm.training.core.errors import ConfigError

ENTRY_KEYS = ("path", "name", "split", "type", "text_column", "data_files", "ds_type")
# `path: json` + `data_files: [...]`: Hugging Face's builder names for local files
BUILDERS = ("json", "text", "parquet", "csv", "arrow")
_FILE_SUFFIXES = (".txt", ".text", ".jsonl", ".json", ".ndjson", ".parquet", ".gz", ".zst", ".bz2", ".xz")
_URL = ("s3://", "gs://", "az://", "abfs://", "http://", "https://", "local:")
MAX_STEPS = "max_steps must be set when using streaming datasets"
# A stream has no end to count epochs by: max_steps alone ends the run. Not max_steps itself, which
# may be raised on resume while steps_per_epoch must stay as the checkpoint saved it.
STREAM_EPOCH_STEPS = 10**12


def _entries(value: Any, source: str) -> list[dict[str, Any]]:
    entries = value if isinstance(value, list) else [value]
    for i, entry in enumerate(entries):
        if isinstance(entry, str):  # Axolotl's oldest form: `pretraining_dataset: c4`
            entries[i] = entry = {"path": entry}
        if not isinstance(entry, dict) or not entry.get("path"):
            raise ConfigError(f"{source}: pretraining_dataset entry {i} needs a path (a local file or a hub id)")
        unknown = [k for k in entry if k not in ENTRY_KEYS]
        if unknown:
            close = difflib.get_close_matches(unknown[0], ENTRY_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{source}: pretraining_dataset entry {i} has unknown key {unknown[0]!r}{hint}; "
                              f"valid keys are: {', '.join(ENTRY_KEYS)}")
        if entry.get("type") not in (None, "pretrain"):
            raise ConfigError(f"{source}: pretraining_dataset entry {i} has type {entry['type']!r}; llm-train "
                              "pretrains on raw text (type: pretrain); put prompt formats under datasets:")
    return entries


def _looks_local(path: str) -> bool:
    p = Path(path).expanduser()
    return path.startswith(("/", "./", "../", "~")) or p.suffix.lower() in _FILE_SUFFIXES or p.exists()


def _local_files(entry: dict[str, Any], i: int, source: str) -> list[str] | None:
    """The local files an entry names (None: a hub dataset); a missing file is an error at once, never a hub lookup."""
    path, files = str(entry["path"]), entry.get("data_files")
    files = [files] if isinstance(files, str) else list(files or [])
    if path in BUILDERS and files:
        found = files
    elif files and Path(path).expanduser().is_dir():
        found = [str(Path(path) / f) for f in files]
    elif files:
        raise ConfigError(f"{source}: pretraining_dataset entry {i} gives data_files for {path!r}, which is not a "
                          "local folder; llm-train reads a hub dataset's own files (leave data_files out) or "
                          "local files (path: json, data_files: [FILE, ...])")
    elif path.startswith(_URL) or _looks_local(path):
        found = [path]
    else:
        return None
    for f in found:
        if not f.startswith(_URL) and not any(c in f for c in "*?[") and not Path(f).expanduser().exists():
            raise ConfigError(f"{source}: pretraining_dataset entry {i}: {f} does not exist; give an existing "
                              "local file or folder, or a Hugging Face dataset id such as allenai/c4")
    return found


def _source(entry: dict[str, Any], path: str | None) -> dict[str, Any]:
    text = {"text_column": entry.get("text_column") or "text"}
    if path is not None:
        return {"data_source": "local", "dataset_path": path, **text}
    hub = {"data_source": "hf", "dataset_name": str(entry["path"]), "dataset_split": entry.get("split") or "train"}
    return {**hub, **({"dataset_config": entry["name"]} if entry.get("name") else {}), **text}


def pretraining_keys(value: Any, max_steps: Any, source: str) -> dict[str, Any]:
    """Our dotted data keys for `pretraining_dataset` (several files or entries: a data.datasets mixture)."""
    if not max_steps:
        raise ConfigError(f"{source}: {MAX_STEPS} (pretraining_dataset streams); add max_steps: N, the total steps")
    sources = []
    for i, entry in enumerate(_entries(value, source)):
        files = _local_files(entry, i, source)
        sources += [_source(entry, f) for f in files] if files is not None else [_source(entry, None)]
    keys: dict[str, Any] = {"data.steps_per_epoch": STREAM_EPOCH_STEPS}
    if len(sources) == 1:
        keys.update({f"data.{k}": v for k, v in sources[0].items()})
    else:
        keys["data.datasets"] = sources
    return keys
