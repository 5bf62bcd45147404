"""`python -m bench.mix`: a two-source weighted mixture, ours (`CombinedStreamingDataset`) vs LitData's, side by side.

Each source's blocks say where they come from (every token of block i of source s is
`s * 100_000 + i`), so every measure below is exact: throughput (tokens/s, 0 and 2
workers, A B A B in one run, each run in its own process), the realised share of each
source over every window of 1,000 consecutive samples, and a resume after a full epoch of
the smaller source (samples delivered once / twice / never against an uninterrupted run).
Results go to bench/results/mix-<time>.json and a table printed as markdown.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

BLOCK, BATCH = 2049, 8
SIZES = (2400, 600)  # blocks of the big and the small source
WEIGHTS = (0.5, 0.5)


def _block(arg: tuple[int, int]) -> np.ndarray:
    source, i = arg
    return np.full(BLOCK, source * 100_000 + i, dtype=np.int64)


def prepare(root: Path) -> dict[str, list[str]]:
    """The two sources, written by each library's own optimize."""
    from litdata import TokensLoader as LitTokens
    from litdata import optimize as lit_optimize

    from llm.data import TokensLoader, optimize

    out: dict[str, list[str]] = {"ours": [], "litdata": []}
    for s, n in enumerate(SIZES):
        inputs = [(s, i) for i in range(n)]
        ours, lit = root / f"ours-{s}", root / f"litdata-{s}"
        optimize(_block, inputs, str(ours), chunk_bytes="16MB", num_workers=2, progress=False, item_loader=TokensLoader())
        lit_optimize(fn=_block, inputs=inputs, output_dir=str(lit), num_workers=2, chunk_bytes="16MB",
                     item_loader=LitTokens(), mode="overwrite", verbose=False)
        out["ours"].append(str(ours))
        out["litdata"].append(str(lit))
    return out


def _loader(who: str, dirs: list[str], workers: int, cache: str):
    if who == "ours":
        from llm.data import (
            CombinedStreamingDataset,
            StreamingDataLoader,
            StreamingDataset,
            TokensLoader,
        )

        ds = [StreamingDataset(d, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=7 + i)
              for i, d in enumerate(dirs)]
        mix = CombinedStreamingDataset(ds, weights=list(WEIGHTS), seed=42, iterate_over_all=False)
        return StreamingDataLoader(mix, batch_size=BATCH, num_workers=workers)
    import os

    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = cache
    from litdata import (
        CombinedStreamingDataset,
        StreamingDataLoader,
        StreamingDataset,
        TokensLoader,
    )

    ds = [StreamingDataset(d, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=7 + i) for i, d in enumerate(dirs)]
    mix = CombinedStreamingDataset(ds, seed=42, weights=list(WEIGHTS), iterate_over_all=False)
    return StreamingDataLoader(mix, batch_size=BATCH, num_workers=workers)


def _ids(batch) -> list[int]:
    arr = batch.numpy() if hasattr(batch, "numpy") else np.asarray(batch)
    return arr[:, 0].astype(np.int64).tolist()


def _import(who: str) -> None:
    # Imports happen before t0 for every contestant (a trainer has paid them already).
    if who == "ours":
        import llm.data.shards.mix.combined  # noqa: F401
        import llm.data.shards.read.loader  # noqa: F401
    else:
        import litdata  # noqa: F401


def run_epoch(who: str, dirs: list[str], workers: int, cache: str, epochs: int = 1, queue=None) -> None:
    """`epochs` combined epochs, timed from before the loader is built; the sample ids in order."""
    _import(who)
    Path(cache).mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    loader = _loader(who, dirs, workers, cache)
    ids: list[int] = []
    for _ in range(epochs):
        for batch in loader:
            ids.extend(_ids(batch))
    queue.put({"seconds": time.perf_counter() - t0, "ids": ids})


def run_resume(who: str, dirs: list[str], workers: int, cache: str, stop: int, queue=None) -> None:
    """Two epochs with a stop after `stop` batches (state saved, a fresh loader resumes); the ids seen."""
    import torch

    _import(who)
    Path(cache).mkdir(parents=True, exist_ok=True)
    out: dict = {}
    try:
        loader = _loader(who, dirs, workers, cache)
        head: list[int] = []
        epochs_done = 0
        while len(head) < stop * BATCH:
            for batch in loader:
                head.extend(_ids(batch))
                if len(head) >= stop * BATCH:
                    break
            else:
                epochs_done += 1
        state = loader.state_dict()
        path = Path(cache) / "state.pt"
        torch.save(state, path)
        resumed = _loader(who, dirs, workers, cache + "-resumed")
        resumed.load_state_dict(torch.load(path, weights_only=False))
        tail: list[int] = []
        for batch in resumed:
            tail.extend(_ids(batch))
        out = {"head": head, "tail": tail, "epochs_before_stop": epochs_done}
    except Exception as e:  # a peer that cannot resume is a result, not a crash of the bench
        out = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    queue.put(out)


def _in_process(fn, *args) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=fn, args=args, kwargs={"queue": q})
    p.start()
    res = q.get(timeout=1800)
    p.join()
    return res


def window_error(ids: list[int], window: int = 1000) -> float:
    """Largest |share of the small source - its weight| over every window of `window` samples."""
    small = (np.asarray(ids) // 100_000 == 1).astype(np.int64)
    if len(small) < window:
        return float("nan")
    sums = np.convolve(small, np.ones(window, dtype=np.int64), "valid")
    return float(np.abs(sums / window - WEIGHTS[1]).max())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.mix")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--results", default=None)
    parser.add_argument("--epochs", type=int, default=16,
                        help="combined epochs per timed run (ours takes ~0.1 s per 4 at 0 workers: shorter runs measure noise)")
    parser.add_argument("--only", choices=("stream", "resume"), default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-mix-"))
    try:
        dirs = prepare(root)
        rows: dict = {}
        for workers in (0, 2) if args.only != "resume" else ():
            for rep in range(args.repeat):
                for who in ("ours", "litdata"):  # A B A B
                    res = _in_process(run_epoch, who, dirs[who], workers, str(root / f"cache-{who}-{workers}-{rep}"),
                                      args.epochs)
                    rows.setdefault((who, workers), []).append(res)
        table = []
        for (who, workers), runs in rows.items():
            ids = runs[0]["ids"][: len(runs[0]["ids"]) // args.epochs]  # the first combined epoch
            tps = [len(r["ids"]) * BLOCK / r["seconds"] for r in runs]
            table.append({"who": who, "workers": workers, "tokens_per_s": statistics.median(tps),
                          "seconds": [round(r["seconds"], 4) for r in runs],
                          "samples": len(ids), "small_share": float(np.mean(np.asarray(ids) // 100_000 == 1)),
                          "max_window_error": window_error(ids)})
        # resume after a full epoch of the small source: stop past its size in batches
        stop = SIZES[1] * 2 // BATCH + 5
        resume = {}
        for who in ("ours", "litdata") if args.only != "stream" else ():
            for workers in (0, 2):
                # the uninterrupted reference: the same two combined epochs in one run
                ref = _in_process(run_epoch, who, dirs[who], workers, str(root / f"ref-{who}-{workers}"), 2)
                res = _in_process(run_resume, who, dirs[who], workers, str(root / f"res-{who}-{workers}"), stop)
                if "error" in res:
                    resume[f"{who}, {workers} workers"] = {"error": res["error"]}
                    continue
                got, want = Counter(res["head"] + res["tail"]), Counter(ref["ids"])
                resume[f"{who}, {workers} workers"] = {
                    "stopped_after_samples": len(res["head"]),
                    "delivered": sum(got.values()), "uninterrupted": sum(want.values()),
                    "same_sequence": res["head"] + res["tail"] == ref["ids"],
                    "extra": sum((got - want).values()), "missing": sum((want - got).values()),
                }
        result = {"sizes": SIZES, "weights": WEIGHTS, "block": BLOCK, "batch": BATCH, "repeat": args.repeat,
                  "stream": table, "resume": resume}
        out = Path(args.results or f"bench/results/mix-{time.strftime('%Y%m%d-%H%M')}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
