"""What kind of data a config holds (fine-tuning records, a text stream, token shards), checked against --task first.

A config of the wrong kind fails on the task before any of the task's own required keys is
asked for: `--task stream_lm` on an SFT config says "use --task sft", not that
`data.steps_per_epoch` is missing. Runs on the validated config, before torch is imported.
"""

from __future__ import annotations

from typing import Any

from llm.data.inputs.entries import SourceEntry
from llm.training.core.errors import ConfigError

SFT, STREAM, SHARDS = "fine-tuning records", "a text stream", "token shards"


def _fine_tuning(entry: Any) -> bool:
    """An entry with fine-tuning keys; a bare `{path}` (and its accounting `name`) is text for stream_lm too."""
    return not isinstance(entry, SourceEntry) and not entry.model_fields_set <= {"path", "name"}


def config_kind(data: Any) -> tuple[str, str]:
    """(kind, the keys that say so) of a `DataConfig`: SFT, STREAM or SHARDS (bare `{path}` entries: STREAM)."""
    entries = list(data.datasets or ())
    tuned = [e for e in entries if _fine_tuning(e)]
    if tuned:
        return SFT, f"datasets: entries of type {', '.join(sorted({str(e.type) for e in tuned}))}"
    if entries:
        return STREAM, "datasets: text entries (a mixture)"
    if data.data_source == "optimized":
        return SHARDS, "data.data_source: optimized"
    return STREAM, f"data.data_source: {data.data_source}"


def check_task(config: Any, task: str, source: str = "config") -> None:
    """A ConfigError naming the task that fits, when `task` does not fit the config's kind; then the task's keys."""
    data = config.data
    kind, why = config_kind(data)
    # bare {path} entries are completion records to --task sft as much as text to stream_lm
    bare = bool(data.datasets) and not any(isinstance(e, SourceEntry) or _fine_tuning(e) for e in data.datasets)
    if task == "sft" and kind != SFT and not bare:
        fits = "--task stream_lm or lm" if kind == SHARDS else "--task stream_lm"
        raise ConfigError(f"{source} holds {kind} ({why}), not fine-tuning records: use {fits}, or give "
                          "--task sft datasets: [{path, type}] entries")
    if task in ("stream_lm", "lm") and kind == SFT:
        raise ConfigError(f"{source} holds {kind} ({why}): use --task sft")
    if task == "lm" and kind == STREAM and (data.datasets or data.data_source != "local"):
        raise ConfigError(f"{source} holds {kind} ({why}); --task lm reads local files (data_source: local) or "
                          "optimized shards: use --task stream_lm")
    if task == "stream_lm" and kind == STREAM and not data.steps_per_epoch:
        raise ConfigError(
            f"{source}: data.steps_per_epoch is required for --task stream_lm with data_source {data.data_source!r}; "
            "set it in the YAML or pass --steps-per-epoch"
        )
    if task == "sft" and data.streaming and not config.training.max_steps:
        raise ConfigError(f"{source}: max_steps must be set when using streaming datasets")


def check_hub_first(config: Any) -> None:
    """A `data_source: hf`/`dedup_hf` run whose hub dataset cannot be reached fails here, before torch is imported
    and the model built (HubUnreachable, naming the local twin); the stream checks again when it opens it."""
    data = config.data
    if data.data_source in ("hf", "dedup_hf") and data.dataset_name and not data.datasets:
        from llm.data.inputs.hub_reach import check_hub_reachable

        check_hub_reachable(data.dataset_name, "dedup_local" if data.data_source == "dedup_hf" else "local")
