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


def config_kind(data: Any) -> tuple[str, str]:
    """(kind, the keys that say so) of a `DataConfig`: SFT, STREAM or SHARDS."""
    entries = list(data.datasets or ())
    if entries and not all(isinstance(e, SourceEntry) for e in entries):
        types = sorted({str(getattr(e, "type", "")) for e in entries if not isinstance(e, SourceEntry)})
        return SFT, f"datasets: entries of type {', '.join(types)}"
    if entries:
        return STREAM, "datasets: entries with data_source (a text mixture)"
    if data.data_source == "optimized":
        return SHARDS, "data.data_source: optimized"
    return STREAM, f"data.data_source: {data.data_source}"


def check_task(config: Any, task: str, source: str = "config") -> None:
    """A ConfigError naming the task that fits, when `task` does not fit the config's kind; then the task's keys."""
    data = config.data
    kind, why = config_kind(data)
    if task == "sft" and kind != SFT:
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
