"""Scenario `ledger`: what the run ledger costs, in bytes per sample and in loader throughput.

One token dataset (100,000 blocks of 256 tokens) read by `StreamingDataLoader` with 2 workers
(reader threads), global batch 32, shuffled, five passes (the last four timed: a long run's steady
state, not a fresh process's first segment), with a checkpoint (`state_dict()`,
which commits the ledger's segment) every 1,000 batches; without a ledger and with one, in a fresh
process per run, alternating which goes first, side by side in one run. Throughput is tokens per
CPU second of the loop (the ledger's work is CPU work; wall time is kept too), so other work on a
shared machine does not decide the ratio. Bytes per sample: the ledger folder's size over the
samples it holds (each sample's id and 32-bit checksum of its tokens; the per-row loss column, unset here,
is stored as one value).
Three more runs with a ledger time each of the ledger's parts in the thread that runs it (thread CPU
time per sample, their medians): where the overhead goes (the ids a reader adds to its chunk, the loader's per-chunk
bookkeeping, the rows handed over at a commit, the segment encoded, the segment written and fsynced), with a
no-op timed at each per-chunk site (what timing a part costs by itself: the verdict takes it off); and once more
with four times as many commits, which splits a commit's cost into a part per sample and a part per commit. The
checksum's share is timed apart: with the C kernel it is taken in the reader's pass that also widens the rows,
which the loader makes without a ledger too, so that run cannot split it off; `checksum_share` times both passes in a
process of its own, `paired_share` in the loader's reader threads, either pass first on each chunk in turns (the
verdict takes the latter).

Goals (issue 36): at most 16 bytes a sample, at most 1% of the loader's throughput; the verdict also says the
two sides apart: as batches are read, and at each commit (a checkpoint's cost, falling with the samples between
checkpoints).

`python -m bench.ledger [--repeat 5]`; results in bench/results/ledger-*.json, its section of
docs/benchmarks.md kept from the latest.
"""

from __future__ import annotations

import argparse
import json
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
BLOCK, BLOCKS, BATCH, WORKERS, EVERY = 256, 100_000, 32, 2, 1000
OFTEN = 4  # the breakdown is run again with a commit every EVERY // OFTEN batches (`commit_split`)
PARTS_RUNS = 3  # runs with parts at each cadence, their medians taken
# passes timed after the warm-up pass: one pass is ~0.2 s, too short to resolve a few percent between runs
TIMED = 4

PROBE = "timing probe, a no-op"
_CHILD = """
import collections, json, os, sys, threading, time
from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
path, ledger, BLOCK, BATCH, WORKERS, EVERY, TIMED, PARTS, PAIRED, PROBE = json.loads(sys.argv[1])
spent, lock = collections.Counter(), threading.Lock()
if PARTS:  # the breakdown run: each part's CPU time in the thread that runs it (not a timed run)
    from llm.data.ledger import format as F
    from llm.data.ledger import writer as W
    from llm.data.shards.read import ledger as L, loader as LD, source as S
    import functools
    def wrap(owner, name, label):
        f = owner[name] if isinstance(owner, dict) else getattr(owner, name)
        @functools.wraps(f)  # the rule stays recognisable (checksums.py `checksummed_widened` unwraps it)
        def timed(*a, **k):
            t = time.thread_time_ns()
            try:
                return f(*a, **k)
            finally:
                with lock:
                    spent[label] += time.thread_time_ns() - t
        if isinstance(owner, dict):
            owner[name] = timed
        else:
            setattr(owner, name, timed)
    wrap(F.RULES, F.CHECKSUM, "checksums (reader threads)")
    wrap(S, "chunk_identities", "a chunk's ids (reader threads)")
    wrap(LD.StreamingDataLoader, "_ledger_chunk", "a chunk's sources and rows kept (loader, per chunk)")
    wrap(L.LoaderLedger, "_flush", "rows built (at commit)")
    wrap(W, "segment_parts", "segment encoded (at commit)")
    wrap(W, "atomic_write", "segment written and fsynced (at commit)")
    # what timing a part costs by itself (two clock reads, each a system call, a lock, one more call), at the two
    # per-chunk sites: a no-op timed just before each, as often; the verdict takes it off the part beside it
    def probe():
        return None
    S._probe, LD._probe = probe, probe
    wrap(S, "_probe", PROBE + " (reader threads)")
    wrap(LD, "_probe", PROBE + " (loader, per chunk)")
    timed_ids, timed_chunk = S.chunk_identities, LD.StreamingDataLoader._ledger_chunk
    def ids_after_probe(*a, **k):
        S._probe()
        return timed_ids(*a, **k)
    def chunk_after_probe(self, *a, **k):
        LD._probe()
        return timed_chunk(self, *a, **k)
    S.chunk_identities, LD.StreamingDataLoader._ledger_chunk = ids_after_probe, chunk_after_probe
firsts = {}  # turn -> ns a sample of the pass made first on that turn's chunk (PAIRED)
if PAIRED:  # the checksum's share in the loader: per chunk, the reader's one pass (checksums and widening) or the
    # widening the loader makes without a ledger (pread.py `read_rows`: the chunk's rows, read into their places,
    # widened to int64 in one copy), in turns; only the pass made first on a chunk's rows is kept (the second finds
    # them in the cache)
    import itertools
    import numpy as np
    from llm.data.shards.read import abilities as AB
    one_pass, turns = AB.checksummed_widened, itertools.count()
    def widening(rows):
        out = np.empty(rows.shape, np.int64)
        out[0:len(rows)] = rows
    def paired(rule, rows):
        turn = next(turns)
        kernel_first = turn % 2 == 0
        t = time.thread_time_ns()
        if not kernel_first:
            widening(rows)
        else:
            both = one_pass(rule, rows)
        spent_ns = time.thread_time_ns() - t
        both = one_pass(rule, rows) if not kernel_first else (widening(rows), both)[1]
        with lock:
            firsts[turn] = spent_ns / max(len(rows), 1)
        return both
    AB.checksummed_widened = paired
ds = StreamingDataset(path, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=7)
loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS, ledger=ledger)
batches = 0
for epoch in range(1 + TIMED):  # the first pass warms up (imports, first segment, page cache); the rest are timed
    if epoch == 1:
        spent.clear()
        firsts.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
    for b in loader:
        if epoch:
            n += b.shape[0] * b.shape[1]
        batches += 1
        if batches % EVERY == 0:
            loader.state_dict()  # a checkpoint: commits the ledger's segment
out = {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "tokens": n,
       "samples": (1 + TIMED) * n // TIMED // BLOCK}  # the ledger holds every pass
loader.state_dict()
if ledger:
    out["ledger_bytes"] = sum(f.stat().st_size for f in os.scandir(ledger))
out["parts_ns"] = {k: v / (n // BLOCK) for k, v in spent.items()}  # per sample of the timed pass
if PAIRED:
    out["first_pass_ns"] = sorted(firsts.items())
print(json.dumps(out))
"""


def _block(i: int) -> np.ndarray:
    # varied ids, so that checksums and zstd see real token data, not runs of one value
    return (np.arange(BLOCK, dtype=np.int64) * 7919 + i * 104_729) % 50_000


def prepare(root: Path) -> str:
    from llm.data import TokensLoader, optimize

    out = root / "data"
    optimize(_block, list(range(BLOCKS)), str(out), chunk_bytes="4MB", num_workers=0, progress=False,
             item_loader=TokensLoader())
    return str(out)


def run_child(path: str, ledger: str | None, parts: bool = False, every: int = EVERY, paired: bool = False
              ) -> dict[str, Any]:
    args = json.dumps([path, ledger, BLOCK, BATCH, WORKERS, every, TIMED, parts, paired, PROBE])
    env = {"PYTHONPATH": str(REPO_ROOT / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", _CHILD, args], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


KERNEL, SHARE = "C kernel, one pass", "C kernel less the widening, pass by pass (the checksum's share)"


def checksum_share(repeat: int = 101) -> dict[str, float]:
    """The checksums' share of the reader threads' work, ns a sample, on a chunk of the loader's size (2,048 rows of
    BLOCK uint16 ids), each pass after the caches are evicted: by then a chunk's rows have left the cache (a megabyte,
    read while the other threads copy batches), so this is how the reader threads find them.

    With the C kernel the checksum is taken in the pass that widens the rows to int64, a copy the loader makes with or
    without a ledger; its share is that pass less the widening alone (NumPy's `astype`, what it replaces). Timed
    apart from the loader because that pass also holds the widening, which the run with parts cannot split off."""
    from llm.data.ledger import checksums

    rows = np.stack([_block(i) for i in range(2048)]).astype(np.uint16)
    evict = np.zeros(32 << 20, np.uint8)  # larger than this machine's caches per core

    rule = checksums.row_checksums
    passes = {"widening alone": lambda: rows.astype(np.int64),
              "NumPy checksum, then widening": lambda: (checksums._checksums_numpy(rows, len(rows), rows.shape[1] * 2),
                                                        rows.astype(np.int64))}
    if checksums.checksummed_widened(rule, rows) is not None:
        passes[KERNEL] = lambda: checksums.checksummed_widened(rule, rows)
    times: dict[str, list[int]] = {k: [] for k in passes}
    for _ in range(repeat):  # the passes in turn, so that a slower spell of a shared machine slows each alike
        for name, step in passes.items():
            evict[::64] += 1
            t = time.thread_time_ns()
            step()
            times[name].append(time.thread_time_ns() - t)
    out = {k: statistics.median(v) / len(rows) for k, v in times.items()}
    if KERNEL in times:  # each kernel pass less the widening timed just before it
        out[SHARE] = statistics.median(k - w for k, w in zip(times[KERNEL], times["widening alone"])) / len(rows)
    return out


def _parts(path: str, folder: Path, every: int) -> dict[str, float]:
    """Each part's ns a sample, the median of PARTS_RUNS runs with parts (one run's parts vary by a third)."""
    runs = [run_child(path, str(folder) + f"-{i}", parts=True, every=every)["parts_ns"] for i in range(PARTS_RUNS)]
    return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}


IN_LOADER = "in the loader: one pass less the widening it replaces, each the first pass on a chunk's rows, pair by pair"


def paired_share(path: str, folder: Path) -> dict[str, float]:
    """The checksum's share of the reader threads' work measured in the loader itself: runs whose reader threads make,
    chunk by chunk in turns, either their one pass (checksums and widening: even turns) or the widening the loader makes
    without a ledger (odd turns), then the other, timing only the first (`PAIRED` in the child). The share is the
    median, over every pair of turns 2k and 2k + 1 in PARTS_RUNS runs, of their difference in ns a sample: two chunks
    read one after the other meet the same load, where medians taken run by run moved by 20 ns between runs. Why
    beside `checksum_share`: that one times the passes in a process of its own, whose memory state moved the share
    between 3 and 27 ns a sample from one process to the next (2026-12-07); here the passes meet the loader's load."""
    runs = [dict(run_child(path, str(folder) + f"-{i}", paired=True)["first_pass_ns"]) for i in range(PARTS_RUNS)]
    pairs = [(r[t], r[t + 1]) for r in runs for t in r if t % 2 == 0 and t + 1 in r]
    return {"one pass, first on a chunk (in the loader)": statistics.median(k for k, _ in pairs),
            "widening without a ledger, first on a chunk (in the loader)": statistics.median(w for _, w in pairs),
            IN_LOADER: statistics.median(k - w for k, w in pairs)}


def commit_split(parts: dict[str, float], often: dict[str, float], samples: int, fewer: int) -> dict[str, dict]:
    """Each commit part's cost as `fixed` ms a commit plus `per_sample` ns a sample it holds, from its ns per sample
    at commits of `samples` and of `fewer` samples (a line through the two: a commit costs `fixed + per_sample * n`)."""
    out = {}
    for k in parts:
        if _at_commit(k) and k in often:
            a, b = parts[k] * samples, often[k] * fewer  # ns a commit
            per_sample = (a - b) / (samples - fewer)
            out[k] = {"per_sample_ns": per_sample, "fixed_ms": (a - per_sample * samples) / 1e6}
    return out


def _stat(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def run(repeat: int, say: Any = print) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-ledger-"))
    try:
        path = prepare(root)
        runs: dict[str, list[dict]] = {"no ledger": [], "ledger": []}
        for r in range(repeat):
            for name in (("no ledger", "ledger") if r % 2 == 0 else ("ledger", "no ledger")):
                folder = root / f"ledger-{r}" if name == "ledger" else None
                runs[name].append(run_child(path, str(folder) if folder else None))
                say(f"ledger {name} repeat {r}: {runs[name][-1]['tokens'] / runs[name][-1]['cpu_s'] / 1e6:.1f} "
                    "M tokens/CPU s")
        rows = [{"case": name, "tokens_per_s": _stat([x["tokens"] / x["cpu_s"] for x in rs]),
                 "wall_tokens_per_s": _stat([x["tokens"] / x["seconds"] for x in rs])} for name, rs in runs.items()]
        ratio = _stat([y["tokens"] / y["cpu_s"] / (x["tokens"] / x["cpu_s"])
                       for x, y in zip(runs["no ledger"], runs["ledger"])])
        per_sample = [x["ledger_bytes"] / x["samples"] for x in runs["ledger"]]
        # the ledger's parts, from more runs with each part's thread CPU time taken (their own overhead is
        # in those runs only, not in the ratio above)
        parts = {"parts_ns": _parts(path, root / "ledger-parts", EVERY)}
        # the same at four times as many commits: what a commit costs whatever it holds, and per sample it holds
        often = {"parts_ns": _parts(path, root / "ledger-parts-often", EVERY // OFTEN)}
        share = checksum_share()
        if SHARE in share:  # the reader threads' checksums are in their widening pass: its share, in the loader
            share.update(paired_share(path, root / "ledger-paired"))
            parts["parts_ns"] = {"checksums (reader threads: their share of the one pass that also widens, in the "
                                 "loader)": max(0.0, share[IN_LOADER]), **parts["parts_ns"]}
        say("ledger parts (ns per sample): " + ", ".join(f"{k} {v:.0f}" for k, v in parts["parts_ns"].items()))
        return {"repeat": repeat, "timed": TIMED, "block": BLOCK, "blocks": BLOCKS, "batch": BATCH, "workers": WORKERS,
                "every": EVERY, "throughput": rows, "ratio": ratio, "bytes_per_sample": _stat(per_sample),
                "parts_ns_per_sample": parts["parts_ns"], "checksum_pass_ns": share, "parts_runs": PARTS_RUNS,
                "commit_split": commit_split(parts["parts_ns"], often["parts_ns"], EVERY * BATCH,
                                             EVERY // OFTEN * BATCH)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _at_commit(part: str) -> bool:
    return "(at commit)" in part


def _probe(part: str) -> bool:
    return part.startswith(PROBE)


def verdict(res: dict[str, Any]) -> dict[str, Any]:
    """The 1% goal judged by the parts, each timed where it runs (two runs' throughputs differ by more than 1%: the
    ratio's range, so a median ratio at 0.99 or better can be chance), split into what the ledger costs as batches
    are read (every part but the commit's, less what timing them costs: the probes) and what each commit adds (a
    checkpoint, every `every` batches here), itself split (`commit_split`) into a cost per sample it holds and a cost
    per commit whatever it holds."""
    cost = {r["case"]: 1e9 * res["block"] / r["tokens_per_s"]["median"] for r in res["throughput"]}
    parts = res.get("parts_ns_per_sample") or {}
    loader = cost["no ledger"]
    probes = sum(v for k, v in parts.items() if _probe(k))
    streaming = sum(v for k, v in parts.items() if not _at_commit(k) and not _probe(k)) - probes
    commit = sum(v for k, v in parts.items() if _at_commit(k))
    per_commit = res["every"] * res["batch"]  # samples a commit holds
    split = res.get("commit_split") or {}
    return {"loader": loader, "streaming": streaming, "probes": probes, "commit": commit,
            "commit_ms": commit * per_commit / 1e6,
            "commit_per_sample": sum(x["per_sample_ns"] for x in split.values()) if split else None,
            "commit_fixed_ms": sum(x["fixed_ms"] for x in split.values()) if split else None,
            "cadence": _cadence(streaming, split, loader / 100),
            "met": (streaming + commit <= loader / 100) if parts else res["ratio"]["min"] >= 0.99,
            "streaming_met": bool(parts) and streaming <= loader / 100}


def _cadence(streaming: float, split: dict[str, dict], budget: float) -> float | None:
    """The samples between checkpoints from which the ledger's whole cost is within `budget` ns a sample: its cost
    per commit spread over them, on top of what it costs per sample (None: that alone is over the budget)."""
    if not split:
        return None
    per_sample = streaming + sum(x["per_sample_ns"] for x in split.values())
    fixed_ns = 1e6 * sum(x["fixed_ms"] for x in split.values())
    return max(fixed_ns, 0.0) / (budget - per_sample) if per_sample < budget else None


def markdown(res: dict[str, Any]) -> list[str]:
    """The section of docs/benchmarks.md."""
    md = ["", "## The run ledger: bytes per sample and loader overhead", "",
          f"`python -m bench.ledger`: {res['blocks']:,} shuffled blocks of {res['block']} tokens, "
          f"`StreamingDataLoader` with {res['workers']} workers, global batch {res['batch']}, "
          f"{res.get('timed', 1)} passes timed after one to warm up, "
          f"`state_dict()` (a checkpoint, which commits the ledger) every {res['every']} batches; a fresh "
          f"process per run, alternating; medians of {res['repeat']} [min-max]. Goals: at most 16 bytes a "
          "sample, at most 1% of the throughput.", "",
          "| case | M tokens / CPU s | M tokens / s (wall) |", "|---|---|---|"]
    for r in res["throughput"]:
        md.append(f"| {r['case']} | {_spread(r['tokens_per_s'], 1e6)} | {_spread(r['wall_tokens_per_s'], 1e6)} |")
    md += ["", f"ledger / no ledger: {_spread(res['ratio'])} of the throughput; the ledger holds "
           f"{_spread(res['bytes_per_sample'])} bytes a sample (its id and the checksum of its tokens; the loss "
           "column, not recorded here, is stored as one value)."]
    cost = {r["case"]: 1e9 * res["block"] / r["tokens_per_s"]["median"] for r in res["throughput"]}
    v = verdict(res)
    loader = v["loader"]
    md += ["", f"Per sample ({res['block']} tokens) the loader alone costs {loader:,.0f} ns of CPU; with the ledger "
           f"{cost['ledger']:,.0f} ns, {cost['ledger'] - loader:,.0f} ns more, where 1% would be {loader / 100:,.0f} ns."]
    parts = res.get("parts_ns_per_sample") or {}
    if parts:
        md += ["", f"Where the ledger's time goes, ns of thread CPU time per sample, the medians of "
               f"{res.get('parts_runs', 1)} more runs that time each part in the thread that runs it (one run's parts "
               "vary by about a third on this shared machine; a no-op timed beside each per-chunk part shows what "
               "timing it costs by itself):", "", "| part | ns / sample |", "|---|---|"]
        md += [f"| {k} | {x:,.1f} |" for k, x in parts.items()]
        md += [f"| as batches are read (all but the commit's, less the probes: what timing the part beside each "
               f"costs by itself) | {v['streaming']:,.1f} |",
               f"| at commits, every {res['every']:,} batches ({res['every'] * res['batch']:,} samples; "
               f"{v['commit_ms']:.2f} ms a commit) | {v['commit']:,.1f} |",
               f"| all (against 1% of the loader's {loader:,.0f} ns: {loader / 100:,.1f}) | "
               f"{v['streaming'] + v['commit']:,.1f} |"]
    share = res.get("checksum_pass_ns") or {}
    if share:
        md += ["", "The reader threads' pass over a chunk's rows (2,048 of them), ns a sample: first in a process of "
               "its own, each pass after the caches are evicted (the kernel's share there: each kernel pass less the "
               "widening timed just before it, which the loader does without a ledger too); then in the loader, "
               f"{res.get('parts_runs', 1)} runs whose reader threads make either pass first on each chunk's rows, in "
               "turns (the medians over every two chunks read one after the other). The checksum's part above is the "
               "last row, the share in the loader:",
               "", "| pass | ns / sample |", "|---|---|"]
        md += [f"| {k} | {x:,.1f} |" for k, x in share.items()]
    bytes_ok = res["bytes_per_sample"]["max"] <= 16
    md += ["", f"The goal of 16 bytes a sample is {'met' if bytes_ok else 'not met'}; the goal of 1% is "
           + ("met." if v["met"] else "not met" + (
               f": as batches are read the ledger costs {v['streaming']:,.1f} ns a sample "
               f"({100 * v['streaming'] / loader:.2f}% of the loader), and each commit adds {v['commit_ms']:.2f} ms "
               f"({100 * v['commit'] / loader:.2f}% at a commit every {res['every']:,} batches of {res['batch']})."
               if parts else "."))]
    split = res.get("commit_split") or {}
    if split:
        often = res["every"] // OFTEN
        md += ["", f"What a commit costs whatever it holds, and per sample it holds: the run with parts again with a "
               f"commit every {often:,} batches, a line through the two ({res['every']:,} and {often:,} batches; two noisy "
               "points, so a part whose cost hardly grows with the samples can come out a little below zero):", "",
               "| part | ns a sample it holds | ms a commit, whatever it holds |", "|---|---|---|"]
        md += [f"| {k} | {x['per_sample_ns']:,.1f} | {x['fixed_ms']:,.2f} |" for k, x in split.items()]
        per_sample = v["streaming"] + v["commit_per_sample"]
        md += [f"| all | {v['commit_per_sample']:,.1f} | {v['commit_fixed_ms']:,.2f} |", "",
               f"As batches are read and per sample committed, the ledger costs {per_sample:,.1f} ns a sample "
               f"({100 * per_sample / loader:.2f}% of the loader) before the {v['commit_fixed_ms']:,.2f} ms a "
               "checkpoint adds, so checkpointing less often "
               + (f"brings it within 1%: from about {v['cadence']:,.0f} samples between checkpoints "
                  f"({v['cadence'] / res['batch']:,.0f} batches of {res['batch']}, "
                  f"{v['cadence'] * res['block'] / 1e6:,.0f} M tokens)." if v["cadence"] else
                  "cannot bring it within 1%: the work per sample has to shrink.")]
    md += ["", "What the ledger does per sample (ledger version 3): the reader thread that reads a chunk checksums "
           "its rows once, on the ids as the shards store them (uint16 here: 512 bytes a sample, read as 64 "
           "little-endian uint64 words; format.py `row_checksums`, rule `wword64`), in the pass that widens them "
           "to the loader's int64: a C kernel (ledger/_rows.c, built by setup.py where a compiler is found; without "
           "it NumPy computes the same checksums in a pass of their own, the second row above). Per chunk the worker "
           "hands over its ids, checksums and batch sizes in one object and the loader keeps them (one dataset's "
           "source and epoch: one value each); per batch it only counts a step. At a commit the rows are handed to "
           "the segment as columns (a step and a row's place in it as runs, the constant columns as one value), so "
           "only the checksums and the ids' differences, narrowed to 4 bytes (by the C kernel, from each chunk's "
           "arrays in one call, without joining them first), take room, stored as they are in zstd's raw blocks "
           "(they do not shrink: zstd's level 1 took the ids to 2.7 bytes for 5 ns a sample), and the "
           "segment is written, in its parts with one writev, and fsynced with its folder.",
           "", "Before the kernel (same scenario, 2026-12-07, this machine): 0.933 [0.873-0.976] of the throughput; "
           "the checksums 85 ns a sample (NumPy's integer product after the chunk was read, its rows back from "
           "memory), the chunk's ids 8, the loader's per-chunk work 21 (turning the chunk's batch sizes back from a "
           "tensor: 17 us a chunk), rows built 16, segment encoded and written 53. Ledger version 2: 0.838 of the "
           "throughput, 578 ns a sample more (its checksum alone 371).",
           "", "Before the commit's columns skipped zstd (framed as its raw blocks instead: random checksums and "
           "shuffled ids do not shrink) and before the loader read a chunk's sizes ahead of the ledger (the first "
           "touch of a chunk from a reader thread costs ~20 us, whoever makes it), same scenario, 2026-12-07 17:29, "
           "one run with parts and no probes: the loader's per-chunk part 12.7 ns a sample, rows built 18.3, segment "
           "encoded 31.4 (zstd level 1), written and fsynced 21.7: 2.29 ms a commit.",
           "", "Before the commit's ids and checksums went to the C kernel chunk by chunk, and before the checksum's "
           "share was timed in the loader, same scenario, 2026-12-07 23:37, --repeat 7: the checksum's share 26.5 ns a "
           "sample (timed in a process of its own), the loader's per-chunk part 13, rows built 21, segment encoded 18, "
           "written and fsynced 24: 2.03 ms a commit; per sample as read and committed 52.5 ns, 1.29% of that run's "
           "loader (about 4,070 ns a sample), so no cadence brought it within 1%.",
           "", "A commit costs what writing a file durably costs (two fsyncs, a rename: its part whatever it holds) "
           "plus handing over and framing its rows (its part per sample); only the first falls with the samples "
           "between checkpoints (here a checkpoint every 1,000 batches of 32 samples of 256 tokens, 8 M tokens: a "
           "pretraining run checkpoints after billions)."]
    return md


def _spread(s: dict[str, float], scale: float = 1.0) -> str:
    return spread(s, scale, 3)


def latest() -> dict | None:
    return newest("ledger")


def scenario_ledger(ctx: Any) -> dict:
    return run(ctx.repeat, say=ctx.say)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    res = run(args.repeat)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    save("ledger", res, markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
