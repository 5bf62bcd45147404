"""`python -m bench.ingest`: what `StreamingDataLoader.stats()` costs, side by side with its recording off.

The loader records each batch it hands over (the caller's wait, in a log-spaced histogram,
and the batch's tokens). This bench streams shuffled epochs of a token dataset made from
CPython's own sources (real text, the byte-level `simple` tokenizer), alternating a loader
that records (as shipped) with one whose recorder does nothing, in one run, and quotes
tokens per CPU second (of every thread of the process; steadier than wall time when other
processes share the cores) on / off, as the median ratio of neighbouring runs. It also times the recording alone (the per-batch work,
one million times, minus the same loop without it) against the time a batch takes: the
steadier figure, as a 1% difference of two throughputs drowns in a busy machine's noise. Results: bench/results/ingest-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path

CASES = [  # (block, batch, workers): the main bench's shape, and small batches (the worst case per token)
    (2049, 8, 0),
    (2049, 8, 2),
    (129, 4, 0),
]


class _Silent:
    """A window that keeps nothing: its pending arrays are deques of length 0 (a C append that drops)."""

    def __init__(self) -> None:
        self.pending_waits: deque = deque(maxlen=0)

    def resume_clock(self) -> None:
        pass

    def open_chunk(self, sizes: list[int], tokens_per_sample: int) -> None:
        pass

    def close_chunk(self) -> None:
        pass


def _corpus(folder: Path, megabytes: int) -> Path:
    """Real text: CPython's own .py files, as JSON lines, up to `megabytes`."""
    stdlib = Path(json.__file__).resolve().parent.parent
    out, size = folder / "corpus.jsonl", 0
    with open(out, "w") as f:
        for path in sorted(stdlib.rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            f.write(json.dumps({"text": text}) + "\n")
            size += len(text)
            if size >= megabytes << 20:
                break
    return out


def _epoch(dataset_dir: Path, block: int, batch: int, workers: int, silent: bool) -> float:
    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(dataset_dir, item_loader=TokensLoader(block_size=block), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=batch, num_workers=workers)
    if silent:
        loader._window = _Silent()  # type: ignore[assignment]
    tokens, start = 0, time.process_time()  # CPU time of every thread here: less noise than wall time on a shared machine
    for b in loader:
        tokens += b.numel()
    return tokens / (time.process_time() - start)


def _recording_cost_ns(calls: int = 1_000_000, repeats: int = 5) -> float:
    """CPU nanoseconds per batch that recording adds: the loader's added lines (a clock read, an append, a
    binning every FLUSH_EVERY batches, the tokens of each 64-batch chunk) timed in a loop, minus the same
    loop without them (best of `repeats`)."""
    from llm.data.ingest_stats import FLUSH_EVERY, IngestWindow

    window, clock = IngestWindow(), time.perf_counter_ns
    log_wait, cpu = window.pending_waits.append, time.process_time_ns

    sizes = [8] * 64

    def with_stats() -> int:
        start, asked = cpu(), clock()
        for i in range(calls):
            log_wait(clock() - asked)
            if not i % 64:  # per chunk
                window.close_chunk()
                if len(window.pending_waits) >= FLUSH_EVERY:
                    window.flush()
                window.open_chunk(sizes, 2049)
            asked = clock()
        return cpu() - start

    def without() -> int:
        start, asked = cpu(), clock()
        for i in range(calls):
            if not i % 64:
                pass
            asked = clock()
        return cpu() - start + 0 * asked

    return (min(with_stats() for _ in range(repeats)) - min(without() for _ in range(repeats))) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=40, help="text to stream (default 40 MB)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    from llm.data.shards.prepare.optimize_text import optimize_text

    root = Path(tempfile.mkdtemp(prefix="llm-ingest-"))
    dataset = root / "ds"
    optimize_text([str(_corpus(root, args.megabytes))], dataset, "simple", num_workers=2, progress=False)
    cost_ns = _recording_cost_ns()
    rows = []
    for block, batch, workers in CASES:
        on, off = [], []
        _epoch(dataset, block, batch, workers, False)  # warm the page cache
        for _ in range(args.repeats):  # alternating, so drift on a busy machine hits both alike
            off.append(_epoch(dataset, block, batch, workers, True))
            on.append(_epoch(dataset, block, batch, workers, False))
        on_tps, off_tps = statistics.median(on), statistics.median(off)
        paired = statistics.median(a / b for a, b in zip(on, off))  # neighbours in time: drift cancels
        batch_ns = block * batch / on_tps * 1e9
        rows.append({"block": block, "batch": batch, "workers": workers, "tokens_per_cpu_s_on": on_tps,
                     "tokens_per_cpu_s_off": off_tps, "ratio_on_off": paired,
                     "batch_ns": batch_ns, "recording_share": cost_ns / batch_ns})
    result = {"megabytes": args.megabytes, "repeats": args.repeats, "recording_ns_per_batch": cost_ns, "cases": rows}
    print(f"recording: {cost_ns:.0f} ns per batch")
    print("| block x batch, workers | tokens per CPU s, stats on | off | on / off | recording / batch time |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['block']} x {r['batch']}, {r['workers']} | {r['tokens_per_cpu_s_on']:,.0f} | {r['tokens_per_cpu_s_off']:,.0f} | "
              f"{r['ratio_on_off']:.3f} | {r['recording_share']:.3%} |")
    path = Path(args.results or f"bench/results/ingest-{time.strftime('%Y%m%d')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
