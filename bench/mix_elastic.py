"""Scenario `mixelastic`: the shard mixture before and after issue 35, and its shares over a batch ramp.

Two measures, on three token sources written once (blocks of 256 tokens, each block's
tokens say its source):

- throughput: `CombinedStreamingDataset` with a step schedule, stratified and per_batch,
  0 workers, global batch 32, 1,000 batches, in a fresh process per run (tokens per CPU second
  of the loop, so that other work on a shared machine does not decide it); the same child code
  runs on this checkout and on a baseline (`--baseline main`: `git archive` of its `src/`
  into a temporary folder, put first on the child's PYTHONPATH), alternating per repeat;
- shares: each source's share of the samples over 10^4 batches across a ramp of 8, 16 and
  32 a global batch (a third each, resumed from the state between), stratified and
  per_batch: the largest |share - weight| (goal: within 1%).

`python -m bench.mix_elastic [--repeat 3] [--baseline main]`; results in
bench/results/mixelastic-*.json, its section of docs/benchmarks.md kept from the latest.
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
from pathlib import Path
from typing import Any

import numpy as np

from bench.results import newest, save, spread

REPO_ROOT = Path(__file__).resolve().parent.parent
BLOCK, SIZES, WEIGHTS = 256, (3000, 2000, 1000), (0.5, 0.3, 0.2)
SCHEDULE = [{"step": 0, "weights": [0.5, 0.3, 0.2]}, {"step": 300, "weights": [0.2, 0.3, 0.5]}]
BATCH, BATCHES = 32, 1000
RAMP, RAMP_BATCHES = (8, 16, 32), 10_000

_CHILD = """
import json, sys, time
import numpy as np
from llm.data import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader
dirs, batching, schedule, batch, batches, BLOCK = json.loads(sys.argv[1])
t0, c0 = time.perf_counter(), time.process_time()
sources = [StreamingDataset(d, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=i) for i, d in enumerate(dirs)]
mix = CombinedStreamingDataset(sources, schedule=schedule, seed=42, batching=batching, iterate_over_all=True)
loader = StreamingDataLoader(mix, batch_size=batch)
n, taken = 0, 0
while taken < batches:
    for b in loader:
        n += b.shape[0] * b.shape[1]
        taken += 1
        if taken == batches:
            break
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "tokens": n}))
"""


def _block(arg: tuple[int, int]) -> np.ndarray:
    source, i = arg
    return np.full(BLOCK, source * 100_000 + i, dtype=np.int64)


def prepare(root: Path) -> list[str]:
    from llm.data import TokensLoader, optimize

    dirs = []
    for s, n in enumerate(SIZES):
        out = root / f"source{s}"
        optimize(_block, [(s, i) for i in range(n)], str(out), chunk_bytes="1MB", num_workers=0, progress=False,
                 item_loader=TokensLoader())
        dirs.append(str(out))
    return dirs


def baseline_src(ref: str, root: Path) -> Path:
    """`src/` of git `ref`, unpacked into `root` (the checkout itself is not touched)."""
    out = root / "baseline"
    out.mkdir()
    archive = subprocess.run(["git", "archive", ref, "src"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out / "src"


def run_child(src: Path, dirs: list[str], batching: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = json.dumps([dirs, batching, SCHEDULE, BATCH, BATCHES, BLOCK])
    proc = subprocess.run([sys.executable, "-c", _CHILD, args], env=env, capture_output=True, text=True, check=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    # per CPU second: other work on a shared machine does not decide the ratio (wall time is kept too)
    return {"tokens_per_s": res["tokens"] / res["cpu_s"], "wall_tokens_per_s": res["tokens"] / res["seconds"]}


def throughput(dirs: list[str], builds: dict[str, Path], repeat: int, say: Any = print) -> list[dict]:
    rows = []
    for batching in ("stratified", "per_batch"):
        runs: dict[str, list[dict]] = {name: [] for name in builds}
        for r in range(repeat):
            for name in builds if r % 2 == 0 else reversed(list(builds)):
                runs[name].append(run_child(builds[name], dirs, batching))
                say(f"mixelastic {batching} {name} repeat {r}: {runs[name][-1]['tokens_per_s'] / 1e6:.1f} M tokens/CPU s")
        for name, rs in runs.items():
            rows.append({"case": f"{batching}, {name}", "tokens_per_s": _stat([x["tokens_per_s"] for x in rs]),
                         "wall_tokens_per_s": _stat([x["wall_tokens_per_s"] for x in rs])})
        if len(builds) == 2:
            base, new = list(builds)
            rows.append({"case": f"{batching}: {new} / {base}", "ratio": _stat(
                [y["tokens_per_s"] / x["tokens_per_s"] for x, y in zip(runs[base], runs[new])])})
    return rows


def ramp_shares(dirs: list[str], batching: str) -> dict[str, Any]:
    """Shares of each source's samples over RAMP_BATCHES batches, a third at each batch of RAMP."""
    from llm.data import (
        CombinedStreamingDataset,
        StreamingDataLoader,
        StreamingDataset,
        TokensLoader,
    )

    counts, state, per_stage = np.zeros(len(dirs)), None, RAMP_BATCHES // len(RAMP)
    for k, batch in enumerate(RAMP):
        sources = [StreamingDataset(d, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=i)
                   for i, d in enumerate(dirs)]
        mix = CombinedStreamingDataset(sources, weights=list(WEIGHTS), seed=42, batching=batching, iterate_over_all=True)
        loader = StreamingDataLoader(mix, batch_size=batch)
        if state is not None:
            loader.load_state_dict(state)
        want = per_stage + (RAMP_BATCHES - per_stage * len(RAMP) if k == len(RAMP) - 1 else 0)
        taken = 0
        while taken < want:
            # the plan says which source each position read: ids from the positions, no token copies
            for b in loader:
                counts += np.bincount(b[:, 0].numpy() // 100_000, minlength=len(dirs))
                taken += 1
                if taken == want:
                    break
        state = loader.state_dict()
    shares = counts / counts.sum()
    return {"batching": batching, "batches": RAMP_BATCHES, "samples": int(counts.sum()),
            "shares": shares.round(5).tolist(), "max_error": float(np.abs(shares - WEIGHTS).max())}


def _stat(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def run(repeat: int, baseline: str | None, say: Any = print) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-mixelastic-"))
    try:
        dirs = prepare(root)
        builds = {"this checkout": REPO_ROOT / "src"}
        if baseline:
            builds = {baseline: baseline_src(baseline, root), **builds}
        return {"repeat": repeat, "block": BLOCK, "sizes": SIZES, "weights": WEIGHTS, "batch": BATCH,
                "batches": BATCHES, "baseline": baseline, "throughput": throughput(dirs, builds, repeat, say),
                "ramp": [ramp_shares(dirs, b) for b in ("stratified", "per_batch")]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def markdown(res: dict[str, Any]) -> list[str]:
    """The section of docs/benchmarks.md."""
    md = ["", "## Mixtures: before and after issue 35, and shares over a batch ramp", "",
          f"`python -m bench.mix_elastic`: three token sources ({', '.join(map(str, res['sizes']))} blocks of "
          f"{res['block']} tokens), a step schedule, global batch {res['batch']}, {res['batches']} batches, 0 "
          f"workers, a fresh process per run, builds alternating; medians of {res['repeat']} [min-max].", "",
          "| case | M tokens / CPU s | ratio |", "|---|---|---|"]
    for r in res["throughput"]:
        if "ratio" in r:
            md.append(f"| {r['case']} | | {_spread(r['ratio'])} |")
        else:
            md.append(f"| {r['case']} | {_spread(r['tokens_per_s'], 1e6)} | |")
    md += ["", f"Shares of the samples over {RAMP_BATCHES:,} batches, a third each at a global batch of "
           f"{', '.join(map(str, RAMP))} (resumed from the state between; weights {list(res['weights'])}, goal: "
           "within 1%):", "", "| batching | samples | shares | largest error |", "|---|---|---|---|"]
    for r in res["ramp"]:
        md.append(f"| {r['batching']} | {r['samples']:,} | {r['shares']} | {100 * r['max_error']:.3f}% |")
    return md


_spread = spread


def latest() -> dict | None:
    return newest("mixelastic")


def scenario_mixelastic(ctx: Any) -> dict:
    return run(ctx.repeat, "main", say=ctx.say)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mix_elastic")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", default="main", help="a git ref to compare with ('' for none)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    res = run(args.repeat, args.baseline or None)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    save("mixelastic", res, markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
