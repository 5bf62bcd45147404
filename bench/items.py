"""`python -m bench.items`: items of any type, ours vs LitData, and our Ray engine vs our local one.

20,000 items of {32x32x3 uint8 array, int label, str name}, in one run, side by side:
prepare (2 processes each), stream one epoch (batch 64, 0 and 2 workers), and optimize
with engine='ray' (a local 2-CPU cluster, started and warmed up before the clock) vs
engine='local'. Every measurement runs in a fresh process, the contestants alternate
(A B A B ...) and the median is kept; ratios are ours / theirs in items per second.
Results: bench/results/items-20261201.json (or --results).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "items-20261201.json"
BATCH = 64
GOALS = {"prepare": 1.5, "stream 0 workers": 2.0, "stream 2 workers": 2.0, "ray vs local": 0.8}


def make_item(i: int) -> dict:
    rng = np.random.default_rng(i)
    return {"image": rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), "label": i % 10, "name": f"item-{i:06d}"}


def _prepare(who: str, n: int, out: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    if who == "litdata":
        import litdata

        litdata.optimize(fn=make_item, inputs=list(range(n)), output_dir=out, num_workers=2, chunk_bytes="64MB",
                         mode="overwrite", verbose=False)
    else:
        from llm.data import optimize

        optimize(make_item, list(range(n)), out, num_workers=2, chunk_bytes="64MB", progress=False,
                 engine="local")
    return time.perf_counter() - start


def _prepare_ray(n: int, out: str, repeat: int) -> dict:
    """In one process: start a 2-CPU cluster, warm its workers up, then time engine='ray' runs."""
    from bench.items import (
        make_item as item,  # by module name: Ray workers cannot import a spawned __main__
    )
    from llm.data import optimize
    from llm.data.jobs.ray import start_local

    t0 = time.perf_counter()
    start_local(num_cpus=2)
    started = time.perf_counter() - t0
    optimize(item, list(range(200)), out, num_workers=2, mode="overwrite", progress=False, engine="ray")  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        optimize(item, list(range(n)), out, num_workers=2, chunk_bytes="64MB", mode="overwrite", progress=False,
                 engine="ray")
        times.append(time.perf_counter() - t)
    return {"cluster_start_s": started, "times": times}


def _stream(who: str, folder: str, workers: int, cache: str, epochs: int = 1) -> dict:
    import multiprocessing

    # A spawned process inherits "spawn" as its default start method; a training script forks
    # its DataLoader workers, so both contestants do here too.
    multiprocessing.set_start_method("fork", force=True)
    if who == "litdata":
        os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = cache
        import litdata

        loader = litdata.StreamingDataLoader(litdata.StreamingDataset(folder), batch_size=BATCH, num_workers=workers)
    else:
        from llm.data import StreamingDataLoader, StreamingDataset

        loader = StreamingDataLoader(StreamingDataset(folder), batch_size=BATCH, num_workers=workers)
    start = time.perf_counter()
    items = 0
    first = None
    checksum = 0
    for _ in range(epochs):
        for batch in loader:
            first = first if first is not None else time.perf_counter() - start
            items += len(batch["label"])
            checksum += int(batch["label"].sum())
    return {"seconds": time.perf_counter() - start, "items": items, "first_batch_s": first, "label_sum": checksum}


def _fresh(fn, *args):
    """fn(*args) in a new interpreter: no state (imports, start methods, caches) shared between runs."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _row(name: str, ours: list[float], theirs: list[float], n: int, labels: tuple[str, str]) -> dict:
    a, b = statistics.median(ours), statistics.median(theirs)
    ratio = b / a  # items/s ours over theirs
    goal = GOALS.get(name)
    return {"case": name, labels[0]: {"median_s": a, "items_per_s": n / a, "runs_s": ours},
            labels[1]: {"median_s": b, "items_per_s": n / b, "runs_s": theirs}, "ratio": ratio,
            "goal": goal, "met": None if goal is None else ratio >= goal}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.items", description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--epochs", type=int, default=5,
                        help="epochs per stream run (one epoch of ours takes ~0.2 s: too short to time alone)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray engine comparison")
    args = parser.parse_args(argv)
    n, repeat = args.items, args.repeat
    root = Path(tempfile.mkdtemp(prefix="bench-items-"))
    rows = []
    try:
        times: dict[str, list[float]] = {"ours": [], "litdata": []}
        for _ in range(repeat):
            for who in ("ours", "litdata"):
                times[who].append(_fresh(_prepare, who, n, str(root / who)))
        rows.append(_row("prepare", times["ours"], times["litdata"], n, ("ours", "litdata")))
        for workers in (0, 2):
            runs: dict[str, list[dict]] = {"ours": [], "litdata": []}
            for _ in range(repeat):
                for who in ("ours", "litdata"):
                    cache = str(root / f"cache-{len(runs[who])}-{workers}")
                    runs[who].append(_fresh(_stream, who, str(root / who), workers, cache, args.epochs))
            want = (n * args.epochs, args.epochs * sum(i % 10 for i in range(n)))
            for who, result in runs.items():
                if any((r["items"], r["label_sum"]) != want for r in result):
                    raise AssertionError(f"{who} streamed {result[0]['items']} items, not {args.epochs} x the {n} prepared")
            row = _row(f"stream {workers} workers", [r["seconds"] for r in runs["ours"]],
                       [r["seconds"] for r in runs["litdata"]], n * args.epochs, ("ours", "litdata"))
            row["first_batch_s"] = {who: statistics.median(r["first_batch_s"] for r in result) for who, result in runs.items()}
            rows.append(row)
        if not args.no_ray:
            ray = _fresh(_prepare_ray, n, str(root / "ray"), repeat)
            row = _row("ray vs local", ray["times"], times["ours"], n, ("ray", "local"))
            row["ray_cluster_start_s"] = ray["cluster_start_s"]
            rows.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"items": n, "stream_epochs": args.epochs, "item": "{image: 32x32x3 uint8, label: int, name: str}", "batch": BATCH, "repeat": repeat,
              "cpus": os.cpu_count(), "load_average": os.getloadavg(), "rows": rows}
    Path(args.results).parent.mkdir(parents=True, exist_ok=True)
    Path(args.results).write_text(json.dumps(result, indent=1))
    print("| case | ours items/s | other items/s | ratio | goal |\n|---|---|---|---|---|")
    for r in rows:
        a, b = list(r)[1:3]
        print(f"| {r['case']} ({a} vs {b}) | {r[a]['items_per_s']:,.0f} | {r[b]['items_per_s']:,.0f} | "
              f"{r['ratio']:.2f}x | {'>= ' + str(r['goal']) + 'x ' + ('met' if r['met'] else 'NOT met') if r['goal'] else ''} |")
    print(f"-> {args.results}")
    return result


if __name__ == "__main__":
    main()
