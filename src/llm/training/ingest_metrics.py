"""`llm-train`'s ingest figures per logging interval (data-wait percentiles, batches/s, tokens/s, remote I/O) and their plot panels.

The trainer times each `next(batches)`: how long a step waited for its batch, whatever the
task (optimized shards, stream_lm, sft). At each log step `IngestMeter.window()` turns the
interval into the metrics.jsonl keys below; under DDP every rank's interval is gathered
(at log steps only) and merged: percentiles over the waits of all ranks, counts and rates
summed over ranks, and `data_wait_p99_ms_slowest_rank`, the highest p99 of any one rank (a
step under DDP waits for the slowest rank's batch), with `data_wait_slowest_rank`, which rank that is
(the step line names it; `peer_watch.py` names a rank that is stuck, not only slow). Remote counts are this process's shard-cache counts
(`llm.data.ingest_stats.PROCESS_REMOTE`, worker processes' included); their keys appear
once this meter (one `fit()` call) has seen remote reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llm.data.ingest_stats import (
    PERCENTILES,
    PROCESS_REMOTE,
    REMOTE_KEYS,
    IngestWindow,
    WaitHistogram,
    figures,
)

WAIT_KEYS = tuple(f"data_wait_p{q}_ms" for q in PERCENTILES)
RATE_KEYS = ("data_batches_per_s", "data_tokens_per_s")
SLOWEST_RANK_KEY = "data_wait_p99_ms_slowest_rank"  # under DDP only
SLOWEST_RANK_ID_KEY = "data_wait_slowest_rank"  # which rank that is (under DDP only): the log line names it

Gather = Callable[[dict], list[dict]]


class IngestMeter:
    """Waits and tokens of the batches one rank took, window by window."""

    def __init__(self, gather: Gather | None = None):
        self._gather = gather or (lambda summary: [summary])
        self._window = IngestWindow()
        self._started_at = PROCESS_REMOTE.snapshot()  # counts of earlier work in this process are not this run's
        self._window.reset(self._started_at)

    def batch(self, wait_s: float, tokens: int) -> None:
        """One batch taken after waiting `wait_s` seconds for it."""
        self._window.record(int(wait_s * 1e9), tokens)

    def window(self) -> dict[str, float | int]:
        """This interval's figures (collective under DDP: every rank calls it); starts the next interval."""
        now = PROCESS_REMOTE.snapshot()
        summary = {**self._window.summary(now), "remote_seen": now != self._started_at}
        self._window.reset(now)
        summaries = self._gather(summary)
        merged = figures(summaries)
        out: dict[str, float | int] = {}
        for q, key in zip(PERCENTILES, WAIT_KEYS):
            value = merged[f"wait_p{q}_ms"]
            if value is not None:
                out[key] = value
        if len(summaries) > 1:
            per_rank = [WaitHistogram.from_dict(s["waits"]).percentile_ms(99) for s in summaries]
            out[SLOWEST_RANK_KEY] = max((p for p in per_rank if p is not None), default=0.0)
            # summaries come in rank order (all_gather); a rank that waited longest in all is the tie-breaker
            out[SLOWEST_RANK_ID_KEY] = max(range(len(summaries)), key=lambda r: (per_rank[r] or 0.0,
                                                                                 summaries[r]["waits"]["total_ns"]))
        out["data_batches_per_s"] = merged["batches_per_s"]  # type: ignore[assignment]
        out["data_tokens_per_s"] = merged["tokens_per_s"]  # type: ignore[assignment]
        if any(s["remote_seen"] for s in summaries):
            out.update({key: merged[key] for key in REMOTE_KEYS})  # type: ignore[misc]
        return out


def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Step -> value for `key`, the last record of a step winning (a resumed run rewrites its steps)."""
    by_step = {r["step"]: r[key] for r in records if isinstance(r.get(key), (int, float))}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def draw_wait_panel(ax: Any, records: list[dict[str, Any]]) -> None:
    """Data-wait percentiles (ms, log scale) against step."""
    for q, key, style in zip(PERCENTILES, WAIT_KEYS, ("-", "--", ":")):
        steps, values = series(records, key)
        if steps:
            ax.plot(steps, [max(v, 1e-4) for v in values], style, label=f"p{q}")
    if ax.lines:
        ax.set_yscale("log")
    ax.set_ylabel("data wait (ms)")


def draw_remote_panel(ax: Any, records: list[dict[str, Any]]) -> None:
    """MB downloaded per interval and the cache hit rate (right axis) against step."""
    steps, downloaded = series(records, "remote_bytes")
    if steps:
        ax.plot(steps, [b / 1e6 for b in downloaded], label="MB downloaded")
        hits, misses = dict(zip(*series(records, "cache_hits"))), dict(zip(*series(records, "cache_misses")))
        rate = [(s, hits[s] / (hits[s] + misses[s])) for s in steps if hits.get(s, 0) + misses.get(s, 0) > 0]
        if rate:
            right = ax.twinx()
            right.plot([s for s, _ in rate], [100 * r for _, r in rate], "g--", label="cache hit rate")
            right.set_ylabel("cache hits (%)")
            right.set_ylim(0, 105)
            right.legend(loc="lower right")
    ax.set_ylabel("remote (MB / interval)")
