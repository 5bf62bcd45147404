"""`logging.prometheus_port`: what `llm-train` serves for Prometheus, for every task (shards, stream_lm, sft).

The trainer times each `next(batches)` whatever the task, so these figures are the trainer's
own, kept since the run started (not reset at each log interval, as metrics.jsonl's are): the
same keys and series as `StreamingDataLoader(metrics_port=)` (llm.data.metrics_export), with
remote counts from this process's shard caches (`PROCESS_REMOTE`, worker processes' included).
A mixture's per-source tokens and samples are the whole job's of the last logged step, since
counting them is collective under DDP (a scrape must never join a collective). Under torchrun
each process serves on `prometheus_port + LOCAL_RANK`, labelled with its global `rank`.
"""

from __future__ import annotations

from typing import Any

from llm.data.ingest_stats import PROCESS_REMOTE, IngestWindow, figures
from llm.data.metrics_export import MetricsServer, port_for_process
from llm.training.core.errors import ConfigError
from llm.training.source_metrics import KEY as TOKENS_KEY

KEY = "logging.prometheus_port"


class TrainingMetrics:
    """This rank's figures since the trainer started, served on `logging.prometheus_port` (+ LOCAL_RANK)."""

    def __init__(self, port: int, host: str, rank: int):
        self._window = IngestWindow()
        self._window.reset(PROCESS_REMOTE.snapshot())  # earlier work in this process is not this run's
        self._sources: dict[str, dict[str, int]] = {}
        port, what = port_for_process(port, KEY)
        try:
            self.server = MetricsServer(self, port, host, what, labels={"rank": str(rank)})
        except ImportError:
            raise ConfigError(f"{KEY} needs the prometheus_client library: pip install 'llm-stream-data[metrics]' "
                              f"(or pip install prometheus_client), or remove {KEY}") from None

    @property
    def url(self) -> str:
        return self.server.url

    def batch(self, wait_s: float, tokens: int) -> None:
        """One batch taken after waiting `wait_s` seconds for it (an append; binned at scrape time)."""
        self._window.record(int(wait_s * 1e9), tokens)

    def logged(self, by_source: dict[str, Any]) -> None:
        """A logged step's `tokens_by_source` entry (source_metrics.py; {} for one source)."""
        tokens, samples = by_source.get(TOKENS_KEY, {}), by_source.get("samples_by_source", {})
        self._sources = {name: {"tokens": int(n), "samples": int(samples.get(name, 0))} for name, n in tokens.items()}

    def close(self) -> None:
        self.server.close()

    def _metrics_figures(self) -> dict[str, Any]:
        return figures([self._window.summary(PROCESS_REMOTE.snapshot())])

    def _metrics_sources(self) -> dict[str, dict[str, int]]:
        return self._sources


def serve_training_metrics(logging: Any, rank: int) -> TrainingMetrics | None:
    """The `logging:` section's endpoint, or None when `prometheus_port` is not set."""
    if logging.prometheus_port is None:
        return None
    return TrainingMetrics(logging.prometheus_port, logging.prometheus_host, rank)
