"""What every scenario shares: the run context, the contestants' datasets, A B A B repeats and their medians."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.corpus import corpus_paths
from bench.measure import run_worker

CONTESTANTS = ["ours", "litdata", "mosaic", "hf", "limit"]
_MODULE = {"ours": "ours", "litdata": "litdata_peer", "mosaic": "mosaic_peer", "hf": "hf_peer",
           "limit": "limits"}


@dataclass
class Context:
    """Everything a scenario needs: corpus, tokenizer, pythons, folders, and what earlier scenarios made."""

    cache_dir: Path
    corpus_mb: float
    tokenizer: str
    python: str
    peer_python: str
    repeat: int = 3
    workers: int = 2
    contestants: list[str] = field(default_factory=lambda: list(CONTESTANTS))
    log: bool = True
    corpus: dict = field(default_factory=dict)
    tokens: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    resume_at: list[int] = field(default_factory=lambda: [10, 50, 90])
    profile_dir: Path | None = None
    min_stream_tokens: int = 40_000_000
    onthefly_cuts: tuple[str, ...] = ("as-is", "short", "long")  # bench/doclength.py; "as-is": the corpus
    profiles: list = field(default_factory=list)
    references: dict = field(default_factory=dict)
    epoch_batches: dict = field(default_factory=dict)
    s3: dict = field(default_factory=dict)  # bench.s3.S3Options fields

    @property
    def work_dir(self) -> Path:
        tok = hashlib.sha256(self.tokenizer.encode()).hexdigest()[:8]
        return self.cache_dir / f"run-{self.corpus['sha256']}-{tok}"

    def say(self, msg: str) -> None:
        if self.log:
            print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def python_for(self, who: str) -> str:
        return self.peer_python if who == "mosaic" else self.python

    def run(self, who: str, scenario: str, wrap: list[str] | None = None, **spec) -> dict:
        spec.update(impl=_MODULE[who], scenario=scenario)
        res = run_worker(self.python_for(who), spec, wrap=wrap)
        if "error" in res:
            self.say(f"{who} {scenario} failed: {res['error'].splitlines()[-1][:300]}")
        return res

    def active(self, who: str) -> bool:
        return who in self.contestants and who not in self.skipped


def dataset_dir(ctx: Context, who: str, tag: str = "1x") -> Path:
    """Where the contestant's prepared dataset of this size lives."""
    return ctx.work_dir / f"data-{who}-{tag}"


def ensure_dataset(ctx: Context, who: str, tag: str = "1x", copies: int = 1) -> Path | None:
    """The contestant's prepared dataset (made by the prepare scenario, or here, untimed)."""
    out = dataset_dir(ctx, who, tag)
    if (out / "bench-done.json").exists():
        return out
    spec: dict = {"output_dir": str(out), "num_workers": ctx.workers, "tokenizer": ctx.tokenizer}
    if tag == "1x":
        spec["inputs"] = corpus_paths(ctx.corpus)
    else:
        spec["pretokenized"] = {"tokens": ctx.tokens["path"], "index": str(ctx.work_dir / "tokens.json"),
                                "shards": len(ctx.corpus["files"]), "copies": copies}
    ctx.say(f"preparing the {tag} dataset for {who} (untimed)")
    res = ctx.run(who, "prepare", **spec)
    if "error" in res:
        return None
    (out / "bench-done.json").write_text(json.dumps(res))
    return out


def interleave(ctx: Context, cases: list[tuple[str, str, str, dict]]) -> dict:
    """Run (who, case, scenario, spec) for each repeat, A B A B; return runs per (who, case)."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for rep in range(ctx.repeat):
        for who, case, scenario, spec in cases:
            ctx.say(f"rep {rep + 1}/{ctx.repeat}: {scenario} {who} {case}")
            runs.setdefault((who, case), []).append(ctx.run(who, scenario, **dict(spec)))
    if ctx.profile_dir:
        from bench.profiling import profile_cases

        profile_cases(ctx, cases)
    return runs


def summary(runs: list[dict], key: str) -> dict | None:
    """Median, min, max and count of `key` over the runs that have it (None when none has)."""
    vals = [r[key] for r in runs if "error" not in r and r.get(key) is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def result_rows(runs: dict, keys: list[str], derive: Callable[[dict], None] | None = None) -> list[dict]:
    """One row per (who, case): its runs, its first error, and the summary of each key (derive adds keys first)."""
    rows = []
    for (who, case), rs in runs.items():
        if derive:
            for r in rs:
                if "error" not in r:
                    derive(r)
        row = {"who": who, "case": case, "runs": rs}
        errors = [r["error"] for r in rs if "error" in r]
        if errors:
            row["error"] = errors[0]
        for k in keys:
            row[k] = summary(rs, k)
        rows.append(row)
    return rows


def stream_epochs(ctx: Context, copies: int = 1) -> int:
    """Enough epochs that a small corpus still streams min_stream_tokens (one at 200 MB)."""
    return max(1, math.ceil(ctx.min_stream_tokens / (ctx.tokens["tokens"] * copies)))


def multiset_diff(reference: np.ndarray, seen: np.ndarray) -> dict:
    """Compare block-content multisets: a corpus may hold identical blocks, so count, not set."""
    ref_h, ref_c = np.unique(reference, return_counts=True)
    seen_h, seen_c = np.unique(seen, return_counts=True)
    got = dict(zip(seen_h.tolist(), seen_c.tolist(), strict=True))
    s = np.array([got.pop(h, 0) for h in ref_h.tolist()], dtype=np.int64)
    return {"once": int(np.minimum(ref_c, s).sum()),  # delivered as often as the epoch holds them
            "twice_or_more": int(np.maximum(s - ref_c, 0).sum()),  # extra deliveries
            "never": int(np.maximum(ref_c - s, 0).sum()),  # missing deliveries
            "unknown": int(sum(got.values()))}  # blocks the epoch does not hold at all
