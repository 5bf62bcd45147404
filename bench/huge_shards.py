"""`python -m bench.huge_shards` (also run by `python -m bench.huge`): the same tokens in 50 to 10^5 shards.

Real corpora reach 10^4-10^5 shards. Here one token stream (51.2 M tokens, 102 MB) is written
by `optimize` as 50, 1,000, 5,000, 10,000 and 100,000 shards (at 10^5, 512 tokens each: a block
of 2,049 spans 5 shards), and each measure runs in a fresh process
with a warm page cache (each folder is read once first):

* first open: the very first open on this machine (the manifest is parsed and cross-checked
  once, then remembered as a shard table): open + first shuffled batch, median of 3 (the
  machine set back to what `optimize` left before each);
* start: a fresh process, open + first shuffled batch (block 2049, batch 8);
* resume: a fresh process, open + a state at 50% of the epoch + the first batch.

Start and resume run `--repeats` times, interleaved over the shard counts so that machine
noise falls on all of them alike; the medians of wall time and of CPU time (the process's
own work, steadier on a shared machine) are reported. Targets: 5,000 shards (issue 24) and
100,000 shards (issue 38) within 3x of 50 shards, for start and resume; the first open on a
machine at 100,000 shards at most 1 s. Results: bench/results/huge-shards-<date>.json, with the
load average around the measures and, per shard count, each run's ratio to the smallest count's
run of the same round (median, min, max). `--root DIR --reuse` keeps the folders in DIR and
reuses them next time (10^5 shards take minutes to write); each first open then starts from
what `optimize` leaves on a machine (no remembered table, store index or index.json identity).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

BLOCK, BATCH = 2049, 8
SHARD_COUNTS = (50, 1_000, 5_000, 10_000, 100_000)
TOKENS = 51_200_000  # 10^5 shards of 512 tokens (one document) each
DOC_TOKENS = 512
TARGET = 3.0  # a large shard count / the smallest, wall time of the first batch
FIRST_OPEN_MS = 1000.0  # the first open on a machine (issue 38), at the largest shard count
FIRST_OPENS = 3  # first opens measured per shard count (median)

_PROBE = """
import json, sys, time
import torch  # a training process has imported it (the collector then has far more to walk)
from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
out, what, block, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
wall, cpu = time.perf_counter(), time.process_time()
ds = StreamingDataset(out, item_loader=TokensLoader(block_size=block), shuffle=True)
loader = StreamingDataLoader(ds, batch_size=batch)
if what == "resume":
    loader.load_state_dict(dict(loader.state_dict(), samples_consumed=len(ds) // 2 // batch * batch))
first = next(iter(loader))
print(json.dumps({"wall_ms": (time.perf_counter() - wall) * 1e3, "cpu_ms": (time.process_time() - cpu) * 1e3,
                  "shards": ds.manifest.num_shards, "checksum": int(first.sum())}))
"""


def documents(i: int, per: int):
    """Input i: `per` random ids in documents of DOC_TOKENS (each input becomes one shard)."""
    from llm.data.shards.prepare.optimize import DocumentBatch

    tokens = np.random.default_rng(i).integers(0, 50_000, size=per, dtype=np.uint16)
    return DocumentBatch(tokens, np.full(per // DOC_TOKENS, DOC_TOKENS, dtype=np.int64))


def build(out: Path, shards: int) -> float:
    """The TOKENS in `shards` shards of equal size; returns the seconds `optimize` took."""
    from llm.data import TokensLoader, optimize

    per = TOKENS // shards // DOC_TOKENS * DOC_TOKENS
    shard_bytes = per * 2 + 8 * (per // DOC_TOKENS)
    t0 = time.perf_counter()
    optimize(partial(documents, per=per), list(range(shards)), str(out), item_loader=TokensLoader(),
             chunk_bytes=f"{shard_bytes}B", num_workers=2, progress=False)
    return time.perf_counter() - t0


def forget(out: Path) -> None:
    """This machine as `optimize` left it for `out`: no table remembered, its store neither indexed nor naming index.json."""
    import xxhash

    from llm.data.shards.format import verified
    from llm.data.shards.format.verified_index import index_path

    index = out / "index.json"
    (verified.manifests_folder() / f"{xxhash.xxh3_128_hexdigest(index.read_bytes())}.table").unlink(missing_ok=True)
    store = verified.store_path(out / "any.bin")
    for path in (index_path(store), store.with_name(f"{store.name}.unique")):
        path.unlink(missing_ok=True)
    if store.is_file():
        store.write_bytes(b"".join(line for line in store.read_bytes().splitlines(keepends=True) if b" xxh3_128:" not in line))


def probe(out: Path, what: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _PROBE, str(out), what, str(BLOCK), str(BATCH)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"probe {what} on {out} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def study(root: Path, counts: tuple[int, ...] = SHARD_COUNTS, repeats: int = 7, reuse: bool = False) -> dict:
    """Build each shard count (`reuse`: unless built before), measure it as the module docstring says; rows and checks."""
    folders, rows, load = {}, [], {"before": os.getloadavg()}
    for shards in counts:
        folders[shards] = root / f"s{shards}"
        if reuse and (folders[shards] / "index.json").is_file():
            seconds = None
            forget(folders[shards])
        else:
            shutil.rmtree(folders[shards], ignore_errors=True)
            seconds = build(folders[shards], shards)
        for path in folders[shards].iterdir():  # warm page cache: the question is our cost, not the disk's
            path.read_bytes()
        firsts = []
        for k in range(FIRST_OPENS):  # the machine as optimize left it each time (one sample is at the load's mercy)
            if k:
                forget(folders[shards])
            firsts.append(probe(folders[shards], "start"))
        walls = [f["wall_ms"] for f in firsts]
        rows.append({"shards": firsts[0]["shards"], "tokens": TOKENS, "build_s": seconds,
                     "first_open_ms": statistics.median(walls), "first_open_range_ms": [min(walls), max(walls)],
                     "first_open_cpu_ms": statistics.median(f["cpu_ms"] for f in firsts)})
        print(json.dumps(rows[-1]), flush=True)
    runs: dict[tuple[int, str], list[dict]] = {}
    for _ in range(repeats):
        for shards in counts:
            for what in ("start", "resume"):
                runs.setdefault((shards, what), []).append(probe(folders[shards], what))
    for row, shards in zip(rows, counts):
        for what in ("start", "resume"):
            got = runs[(shards, what)]
            assert len({r["checksum"] for r in got}) == 1, f"{shards} shards: the first {what} batch differs between runs"
            row[f"{what}_ms"] = statistics.median(r["wall_ms"] for r in got)
            row[f"{what}_cpu_ms"] = statistics.median(r["cpu_ms"] for r in got)
            ratios = [r["wall_ms"] / s["wall_ms"] for r, s in zip(got, runs[(counts[0], what)])]  # same round
            row[f"{what}_ratio_runs"] = {"median": round(statistics.median(ratios), 2), "min": round(min(ratios), 2),
                                         "max": round(max(ratios), 2)}
    load["after"] = os.getloadavg()
    checks = {}
    for key in ("start_ms", "resume_ms", "start_cpu_ms", "resume_cpu_ms", "first_open_ms"):
        checks[key] = {str(r["shards"]): round(r[key] / rows[0][key], 2) for r in rows}
    for key in ("start_ms", "resume_ms"):
        for shards in (5_000, 100_000):
            at = [r for r in rows if r["shards"] == shards]
            ratio = at[0][key] / rows[0][key] if at else None
            checks[f"{key} {shards}/{rows[0]['shards']}"] = {"ratio": ratio and round(ratio, 2),
                                                             "pass": None if ratio is None else ratio <= TARGET}
    largest = rows[-1]
    checks[f"first_open_ms at {largest['shards']}"] = {"ms": round(largest["first_open_ms"]),
                                                       "pass": largest["first_open_ms"] <= FIRST_OPEN_MS}
    return {"block": BLOCK, "batch": BATCH, "repeats": repeats, "load_average": load, "rows": rows, "checks": checks}


def table(result: dict) -> str:
    lines = ["| shards | build s | first open ms | start ms (cpu) | resume 50% ms (cpu) | start / resume ratio per run, "
             "median [min-max] |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        built = "reused" if r["build_s"] is None else f"{r['build_s']:.1f}"
        per_run = " / ".join(f"{q['median']} [{q['min']}-{q['max']}]" for q in (r["start_ratio_runs"], r["resume_ratio_runs"]))
        lines.append(f"| {r['shards']:,} | {built} | {r['first_open_ms']:.0f} | "
                     f"{r['start_ms']:.1f} ({r['start_cpu_ms']:.1f}) | {r['resume_ms']:.1f} ({r['resume_cpu_ms']:.1f}) | {per_run} |")
    load = result.get("load_average", {})
    lines += ["", "load average (1, 5, 15 min) before / after: " + " / ".join(
        ", ".join(f"{x:.2f}" for x in load[k]) for k in ("before", "after") if k in load), ""]
    for key, check in result["checks"].items():
        if "ms" in check:
            lines.append(f"- {key}: {check['ms']} ms ({'pass' if check['pass'] else '**short**'}, target <= {FIRST_OPEN_MS:.0f})")
        elif "pass" in check:
            verdict = "n/a" if check["pass"] is None else ("pass" if check["pass"] else "**short**")
            lines.append(f"- {key}: {check['ratio']} ({verdict}, target <= {TARGET})")
        else:
            lines.append(f"- {key} / smallest: " + ", ".join(f"{k}: {v}x" for k, v in check.items()))
    return "\n".join(lines)


def run(root: Path, counts: tuple[int, ...], repeats: int, results: Path, reuse: bool = False) -> dict:
    """The study in `root` (each folder deleted afterwards unless `reuse`), written to `results` and printed as a table."""
    try:
        result = study(root, counts, repeats, reuse)
    finally:
        for shards in counts if not reuse else ():
            shutil.rmtree(root / f"s{shards}", ignore_errors=True)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=1))
    print(table(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.huge_shards")
    parser.add_argument("--shard-counts", default=",".join(map(str, SHARD_COUNTS)), help="comma separated")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--root", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--results", default=None)
    parser.add_argument("--reuse", action="store_true", help="keep the folders in --root, and reuse those built before")
    args = parser.parse_args()
    if args.reuse and not args.root:
        parser.error("--reuse needs --root (the folder kept between runs)")
    root = Path(args.root or tempfile.mkdtemp(prefix="llm-huge-shards-"))
    root.mkdir(parents=True, exist_ok=True)
    counts = tuple(int(c) for c in args.shard_counts.split(","))
    run(root, counts, args.repeats, Path(args.results or f"bench/results/huge-shards-{time.strftime('%Y%m%d')}.json"),
        args.reuse)
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
