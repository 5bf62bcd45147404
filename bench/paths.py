"""Scenario `paths`: our own read paths before and after vectorisation (issue 16), as ratios within one run.

`old` replays the pre-vectorisation code paths on the same build: with `document_boundaries`
every block read alone (`TokenReader.read` per row), and a plain `torch.utils.data.DataLoader`
over the dataset reading one sample at a time (`ds[i]`). `new` is the current code.
"""

from __future__ import annotations

import statistics

from bench.context import Context, ensure_dataset, interleave, result_rows, stream_epochs

CASES = [("document_boundaries, StreamingDataLoader", "docb"), ("plain DataLoader over the dataset", "plain")]


def scenario_paths(ctx: Context) -> list[dict]:
    if not ctx.active("ours") or not (d := ensure_dataset(ctx, "ours")):
        return []
    ep = max(1, stream_epochs(ctx) // 4)  # these are slow paths: a quarter of the stream scenario's tokens
    cases = [("ours", f"{label}, {variant}", "paths", {"data_dir": str(d), "path": path, "variant": variant,
                                                       "epochs": ep})
             for label, path in CASES for variant in ("old", "new")]
    runs = interleave(ctx, cases)
    rows = result_rows(runs, ["tokens_per_s", "cpu_s", "peak_rss_mb"])
    for label, _ in CASES:
        old, new = runs.get(("ours", f"{label}, old"), []), runs.get(("ours", f"{label}, new"), [])
        # Each repeat's old and new ran back to back: the ratio of a pair is robust to a busy machine.
        ratios = [n["tokens_per_s"] / o["tokens_per_s"] for o, n in zip(old, new)
                  if "error" not in o and "error" not in n and o["tokens_per_s"]]
        if ratios:
            rows.append({"who": "ours", "case": f"{label}: new / old", "ratio": {
                "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios)}})
    return rows
