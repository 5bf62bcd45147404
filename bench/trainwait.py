"""`python -m bench.trainwait`: where `llm-train` waits. The share of step time spent waiting for data.

A small model (d_model 128, 2 layers, block 256, batch 8) trains on CPU with each data
path: optimized shards (`data_source: optimized`, 0 and 2 workers) and on-the-fly text
(`stream_lm`, a real corpus tokenized by the byte-level `simple` tokenizer and by a trained
BPE, 2 workers). Each run is `llm-train` in its own process; `data_wait` and tokens/s are
read from the run's `metrics.jsonl` (the trainer logs them every interval), the first
interval (start-up) excluded. Goals (issue 12): < 2% on optimized shards, < 10% on the fly
with 2 workers, on a 2-core machine. Results: bench/results/trainwait-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.corpus import build_corpus, corpus_paths

REPO = Path(__file__).resolve().parents[1]
STEPS, LOG_EVERY = 120, 20


def _config(data: dict, ckpt: str, steps: int) -> dict:
    return {
        "data": {"max_seq_len": 256, **data},
        "model": {"d_model": 128, "n_layers": 2, "n_heads": 4},
        "training": {"batch_size": 8, "max_steps": steps, "log_interval_steps": LOG_EVERY, "lr": 1e-3,
                     "warmup_steps": 2, "seed": 0, "device": "cpu"},
        "checkpoint": {"checkpoint_dir": ckpt, "save_interval_steps": 0, "keep_last_n": 1},
    }


def _run(task: str, data: dict, root: Path, name: str, steps: int) -> dict:
    ckpt = root / f"ckpt-{name}"
    cfg = root / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(_config(data, str(ckpt), steps)))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "2"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "from llm.cli.train import main; main()", "--task", task, "--config-path", str(cfg)],
                          capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        return {"case": name, "error": done.stderr.strip().splitlines()[-1:]}
    rows = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "data_wait" in r and r["step"] > LOG_EVERY]  # start-up excluded
    return {
        "case": name,
        "data_wait": statistics.mean(r["data_wait"] for r in steps),
        "tokens_per_s": statistics.mean(r.get("tokens_per_s_window", r.get("tokens_per_s", 0)) for r in steps),
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.trainwait")
    parser.add_argument("--corpus-mb", type=float, default=8)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llm-trainwait-"))
    meta = build_corpus(REPO / ".bench_cache", args.corpus_mb)
    files = corpus_paths(meta)
    optimized = root / "optimized"
    subprocess.run([sys.executable, "-c", "from llm.cli.data import main; main()", "optimize", *files, "--output", str(optimized),
                    "--tokenizer", "simple", "--num-workers", "2"], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    glob = str(Path(files[0]).parent / "*.jsonl")
    cases = [
        ("lm", {"data_source": "optimized", "dataset_path": str(optimized), "num_workers": 0}, "optimized, 0 workers"),
        ("lm", {"data_source": "optimized", "dataset_path": str(optimized), "num_workers": 2}, "optimized, 2 workers"),
        ("stream_lm", {"data_source": "local", "dataset_path": glob, "num_workers": 2, "steps_per_epoch": args.steps},
         "on the fly, 2 workers"),
    ]
    rows = [_run(task, data, root, name.replace(" ", "_").replace(",", ""), args.steps) | {"case": name}
            for task, data, name in cases]
    goals = {"optimized, 0 workers": 0.02, "optimized, 2 workers": 0.02, "on the fly, 2 workers": 0.10}
    print("| data path | data wait | goal | tokens/s |\n|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | error: {r['error']} | | |")
            continue
        verdict = "pass" if r["data_wait"] < goals[r["case"]] else "**short**"
        print(f"| {r['case']} | {r['data_wait']:.1%} ({verdict}) | < {goals[r['case']]:.0%} | {r['tokens_per_s']:,.0f} |")
    path = Path(args.results or f"bench/results/trainwait-{time.strftime('%Y%m%d')}.json")
    path.write_text(json.dumps({"steps": args.steps, "rows": rows, "goals": goals}, indent=1))


if __name__ == "__main__":
    main()
