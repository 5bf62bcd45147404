"""`python -m bench.huge`: internet scale, simulated: synthetic token shards up to past 2^32 tokens.

No tokenizer: `optimize` writes random token ids straight into shards (8 MB each, so the
largest size has over 1,000 of them) at 10^8, 10^9 and 5.2 * 10^9 tokens (the last is past
every 32-bit offset). For each size, each measure runs in a fresh process:

* construction: the `optimize` call, seconds;
* open + first batch: `StreamingDataset` + `StreamingDataLoader` (shuffled, block 2049, batch 8),
  cold (as the process finds the page cache) and warm (again, same blocks cached: our own cost);
* resume at 99%: load a state saved at 99% of the epoch, then the first batch (cold, warm);
* state size: bytes of the JSON state;
* plan cost: the epoch order and the positions of one chunk, milliseconds;
* memory: RSS and anonymous RSS after 300 batches.

The claim checked: first batch and resume (warm: without the disk's seek time), state size
and anonymous RSS do not grow with the data (largest / smallest <= 1.2, plus a 5 ms / 4 MiB floor for timer and allocator noise).
Every dataset is deleted after its size is measured; a disk with too little free room skips
the sizes that do not fit, saying so. Results: bench/results/huge-<date>.json and a table.

Then the shard-count study (bench/huge_shards.py): the same tokens in 50 to 10^5 shards, first
batch and resume in fresh processes; bench/results/huge-shards-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.huge_shards import SHARD_COUNTS
from bench.huge_shards import run as run_shard_study

BLOCK, BATCH = 2049, 8
SIZES = (10**8, 10**9, 5_200_000_000)
DOC_TOKENS = 4096
PER_INPUT = 1 << 24  # tokens one optimize input writes (16 Mi tokens)
_GROWTH, _FLOOR_S, _FLOOR_B = 1.2, 0.005, 4 << 20


def synthetic(i: int, total: int):
    """Input i: up to PER_INPUT random ids in documents of DOC_TOKENS (the last may be shorter)."""
    from llm.data.shards.prepare.optimize import DocumentBatch

    n = min(PER_INPUT, total - i * PER_INPUT)
    tokens = np.random.default_rng(i).integers(0, 50_000, size=n, dtype=np.uint16)
    lengths = np.full(n // DOC_TOKENS, DOC_TOKENS, dtype=np.int64)
    if n % DOC_TOKENS:
        lengths = np.append(lengths, n % DOC_TOKENS)
    return DocumentBatch(tokens, lengths)


def build(out: str, total: int) -> float:
    from functools import partial

    from llm.data import TokensLoader, optimize

    inputs = list(range(-(-total // PER_INPUT)))
    t0 = time.perf_counter()
    optimize(partial(synthetic, total=total), inputs, out, item_loader=TokensLoader(), chunk_bytes="8MB",
             num_workers=2, progress=False)
    return time.perf_counter() - t0


_PROBE = """
import json, os, sys, time
t0 = time.perf_counter()
import numpy as np
from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.plan.schedule import epoch_order
out, what, BLOCK, BATCH = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
ds = StreamingDataset(out, item_loader=TokensLoader(block_size=BLOCK), shuffle=True)
loader = StreamingDataLoader(ds, batch_size=BATCH)
res = {"samples": len(ds), "shards": len(ds.manifest.shards), "open_s": time.perf_counter() - t0}
if what == "resume":
    state = dict(loader.state_dict(), samples_consumed=int(len(ds) * 0.99) // BATCH * BATCH)
    t0 = time.perf_counter()
    loader.load_state_dict(state)
it = iter(loader)
next(it)
res["first_batch_s"] = time.perf_counter() - t0
# again in this process with a new dataset and loader: the same blocks, now in the page cache,
# so this is our own cost (plan, open, verification memory) without the disk's seek time
t0 = time.perf_counter()
again = StreamingDataLoader(StreamingDataset(out, item_loader=TokensLoader(block_size=BLOCK), shuffle=True), batch_size=BATCH)
if what == "resume":
    again.load_state_dict(state)
next(iter(again))
res["warm_first_batch_s"] = time.perf_counter() - t0
res["state_bytes"] = len(json.dumps(loader.state_dict()))
t1 = time.perf_counter()
order = epoch_order(len(ds), 42, 0, True)
order(np.arange(len(ds) // 2, len(ds) // 2 + 64 * BATCH))
res["plan_ms"] = (time.perf_counter() - t1) * 1e3
for _ in range(300):
    if next(it, None) is None:
        break
fields = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
res["rss_bytes"] = int(fields["VmRSS"].split()[0]) * 1024
res["anon_rss_bytes"] = int(fields["RssAnon"].split()[0]) * 1024
print(json.dumps(res))
"""


def probe(out: str, what: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, out, what, str(BLOCK), str(BATCH)], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"probe {what} on {out} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(root: Path, total: int) -> dict:
    need = total * 2 * 1.1
    free = shutil.disk_usage(root).free
    if free < need:
        return {"tokens": total, "skipped": f"needs {need / 1e9:.1f} GB free, {free / 1e9:.1f} GB here"}
    out = str(root / f"t{total}")
    try:
        row = {"tokens": total, "construction_s": build(out, total)}
        row["bytes_on_disk"] = sum(p.stat().st_size for p in Path(out).iterdir())
        start = probe(out, "start")
        resume = probe(out, "resume")
        row.update({k: start[k] for k in ("samples", "shards", "open_s", "first_batch_s", "state_bytes",
                                          "plan_ms", "rss_bytes", "anon_rss_bytes")})
        row["resume_first_batch_s"] = resume["first_batch_s"]
        row["warm_first_batch_s"] = start["warm_first_batch_s"]
        row["warm_resume_first_batch_s"] = resume["warm_first_batch_s"]
        return row
    finally:
        shutil.rmtree(out, ignore_errors=True)


def flat(rows: list[dict], key: str, floor: float) -> dict:
    done = [r for r in rows if key in r]
    if len(done) < 2:
        return {"ratio": None, "pass": None}
    lo, hi = done[0][key], done[-1][key]
    ratio = hi / max(lo, 1e-12)
    return {"ratio": round(ratio, 3), "pass": hi <= max(lo * _GROWTH, lo + floor)}


def table(rows: list[dict], checks: dict) -> str:
    head = ("| tokens | shards | build s | open s | first batch s (cold / warm) | resume 99% s (cold / warm) | "
            "state B | plan ms | RSS MiB | anon MiB |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['tokens']:.2e} | skipped: {r['skipped']} |" + " |" * 8)
            continue
        lines.append(
            f"| {r['tokens']:.2e} | {r['shards']} | {r['construction_s']:.1f} | {r['open_s']:.3f} | "
            f"{r['first_batch_s']:.3f} / {r['warm_first_batch_s']:.3f} | "
            f"{r['resume_first_batch_s']:.3f} / {r['warm_resume_first_batch_s']:.3f} | {r['state_bytes']} | {r['plan_ms']:.1f} | "
            f"{r['rss_bytes'] / 2**20:.0f} | {r['anon_rss_bytes'] / 2**20:.0f} |"
        )
    lines.append("")
    for key, check in checks.items():
        verdict = "n/a" if check["pass"] is None else ("pass" if check["pass"] else "**short**")
        lines.append(f"- {key}: largest / smallest = {check['ratio']} ({verdict}, target <= {_GROWTH})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.huge")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="token counts, comma separated ('' skips)")
    parser.add_argument("--shard-counts", default=",".join(str(s) for s in SHARD_COUNTS),
                        help="the shard-count study's shard counts, comma separated ('' skips; bench/huge_shards.py)")
    parser.add_argument("--root", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="llm-huge-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.shard_counts:
        counts = tuple(int(c) for c in args.shard_counts.split(","))
        run_shard_study(root, counts, 7, Path(f"bench/results/huge-shards-{time.strftime('%Y%m%d')}.json"))
    if args.sizes:
        run_sizes(root, [int(float(s)) for s in args.sizes.split(",")], args.results)
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)


def run_sizes(root: Path, sizes: list[int], results: str | None) -> None:
    """The data-size study: each size built, measured and deleted; results JSON and a table."""
    rows = []
    for total in sizes:
        rows.append(measure(root, total))
        print(json.dumps(rows[-1]), flush=True)
    checks = {  # warm: our own cost; cold (reported in the table) adds the disk's seeks
        "warm_first_batch_s": flat(rows, "warm_first_batch_s", _FLOOR_S),
        "warm_resume_first_batch_s": flat(rows, "warm_resume_first_batch_s", _FLOOR_S),
        "state_bytes": flat(rows, "state_bytes", 0),
        "anon_rss_bytes": flat(rows, "anon_rss_bytes", _FLOOR_B),
    }
    result = {"block": BLOCK, "batch": BATCH, "rows": rows, "checks": checks}
    path = Path(results or f"bench/results/huge-{time.strftime('%Y%m%d')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(table(rows, checks))

if __name__ == "__main__":
    main()
