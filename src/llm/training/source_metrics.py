"""`tokens_by_source`: each source's trained tokens, summed over ranks, for metrics.jsonl, TensorBoard and the plot.

The data layer counts tokens and samples per source exactly (`source_counts()` of the text
module and of the loader); this module sums a rank-local count over the job and draws the
shares for `llm-train plot`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

KEY = "tokens_by_source"


def sum_over_ranks(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Rank-local {name: {tokens, samples}} summed over the job (collective: every rank calls it)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return counts
    names = sorted(counts)  # every rank has the same sources (one config)
    values = torch.tensor([[counts[n]["tokens"], counts[n]["samples"]] for n in names], dtype=torch.float64)
    dist.all_reduce(values)
    return {n: {"tokens": int(t), "samples": int(s)} for n, (t, s) in zip(names, values.tolist())}


def tokens_by_source(data: Any) -> dict[str, dict[str, int]]:
    """The metrics record's entry: {tokens_by_source: {name: tokens}, samples_by_source: {...}} ({} for one source)."""
    counts = data.source_counts()
    if len(counts) < 2:  # one source: its tokens are the run's `tokens`
        return {}
    return {KEY: {n: c["tokens"] for n, c in counts.items()}, "samples_by_source": {n: c["samples"] for n, c in counts.items()}}


def draw_shares(ax: Any, records: list[dict[str, Any]]) -> bool:
    """Each source's share of the trained tokens against step (the plot's panel); False when none was logged."""
    logged = [r for r in records if isinstance(r.get(KEY), dict) and r[KEY]]
    if not logged:
        return False
    by_step = {r["step"]: r[KEY] for r in logged}  # a resumed run rewrites its steps: the last record wins
    steps = sorted(by_step)
    for name in sorted({n for counts in by_step.values() for n in counts}):
        shares = [100 * by_step[s].get(name, 0) / max(sum(by_step[s].values()), 1) for s in steps]
        ax.plot(steps, shares, label=name)
    ax.set_ylabel("% of tokens")
    ax.grid(alpha=0.3)
    ax.legend()
    return True
