"""Issue 28's question: could torch.profiler + record_function replace profiling.py's hand-built Chrome trace?

`python -m bench.torch_profiler` measures, side by side in one run on a small dataset:
which rows torch.profiler records (the training thread, a reader thread, DataLoader worker
processes), whether a second session can run in a reader thread while one runs, and the cost
of an epoch with no trace, with ours (`profile_batches`) and with torch.profiler around the
loop (the loader's spans as `record_function`), in the one place torch sees them: num_workers=0.
Writes bench/results/torch-profiler-<date>.json.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
from torch.profiler import ProfilerActivity, profile, record_function

import llm.data.shards.read.access as access
from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize

CAPTURE = """
import json, sys, threading, torch
from torch.profiler import profile, record_function, ProfilerActivity
from torch.utils.data import DataLoader, IterableDataset
class DS(IterableDataset):
    def __iter__(self):
        for i in range(4):
            with record_function("read"):
                yield torch.arange(100).sum()
def in_thread():
    with record_function("thread_read"):
        torch.arange(100).sum()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    t = threading.Thread(target=in_thread); t.start(); t.join()
    list(DataLoader(DS(), batch_size=None, num_workers=2, multiprocessing_context="fork"))
    list(DataLoader(DS(), batch_size=None, num_workers=0))
prof.export_chrome_trace(sys.argv[1])
events = json.load(open(sys.argv[1]))["traceEvents"]
print(json.dumps({"reads (4 in-process + 8 in 2 workers)": sum(e.get("name") == "read" for e in events),
                  "thread_read (1 in a reader thread)": sum(e.get("name") == "thread_read" for e in events)}))
"""
SECOND_SESSION = """
import threading, torch
from torch.profiler import profile, record_function, ProfilerActivity
def reader():
    with profile(activities=[ProfilerActivity.CPU]):
        with record_function("read"):
            torch.arange(100).sum()
with profile(activities=[ProfilerActivity.CPU]):
    t = threading.Thread(target=reader); t.start(); t.join()
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True)


def _epoch(folder: Path, kind: str, how: str, out: Path) -> float:
    tokens = kind == "tokens"
    ds = StreamingDataset(str(folder / kind), item_loader=TokensLoader(block_size=16) if tokens else None, shuffle=True)
    extra = {"profile_batches": 10**6, "profile_dir": str(out)} if how == "ours" else {}
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=0, **extra)
    started = time.perf_counter()
    if how != "torch":
        for _ in loader:
            pass
        return time.perf_counter() - started
    saved = (access.span, access.current, vars(access.SampleAccess)["_timed"])

    def timed(fn, values, span="transform"):
        out_ = []
        for v in values:
            with record_function(span):
                out_.append(fn(v))
        return out_

    # the same stages as ours, as record_function; items take the per-item path, as ours does when profiling
    access.span, access.current = (lambda name, **_: record_function(name)), (lambda: True)
    access.SampleAccess._timed = staticmethod(timed)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            it = iter(loader)
            while True:
                with record_function("wait"):
                    if next(it, None) is None:
                        break
        prof.export_chrome_trace(str(out / "torch.json"))
    finally:
        access.span, access.current, access.SampleAccess._timed = saved
    return time.perf_counter() - started


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="bench-torch-profiler-"))
    optimize(lambda i: np.arange(50) + i, list(range(2000)), str(root / "tokens"), item_loader=TokensLoader(),
             chunk_bytes="16KB", num_workers=0, progress=False)
    optimize(lambda i: {"i": i, "v": np.full(4, i)}, list(range(2000)), str(root / "items"), chunk_bytes="16KB",
             num_workers=0, progress=False)
    result: dict = {"capture": json.loads(_python(CAPTURE, str(root / "capture.json")).stdout.splitlines()[-1])}
    result["second session in a reader thread: exit code (-11: SIGSEGV)"] = _python(SECOND_SESSION).returncode
    for kind in ("tokens", "items"):
        runs: dict[str, list[float]] = {"none": [], "ours": [], "torch": []}
        for _ in range(5):  # interleaved, medians
            for how in runs:
                runs[how].append(_epoch(root, kind, how, root / "trace"))
        med = {how: statistics.median(v) for how, v in runs.items()}
        result[kind] = {"seconds": {h: round(v, 4) for h, v in med.items()},
                        "ours / none": round(med["ours"] / med["none"], 2),
                        "torch / none": round(med["torch"] / med["none"], 2),
                        "torch / ours": round(med["torch"] / med["ours"], 2)}
    result["trace events (items epoch): ours, torch"] = [
        len(json.loads((root / "trace" / name).read_text())["traceEvents"]) for name in ("result.json", "torch.json")]
    out = Path(__file__).parent / "results" / f"torch-profiler-{time.strftime('%Y%m%d')}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
