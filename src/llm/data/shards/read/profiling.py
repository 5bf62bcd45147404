"""`StreamingDataLoader(profile_batches=N)`: a Chrome trace (Trace Event Format) of the first N batches.

Workers (reader threads or DataLoader worker processes) record complete spans ("X"
events: name, ts and dur in microseconds, pid, tid) while they read a chunk that holds
one of the first N batches; the spans ride back to the training process inside that
chunk, so no file or queue is shared with the workers. The loader adds one "wait" span
per batch (the consumer waiting for it) and writes `result.json` once N batches have been
handed out, or when the iteration ends first. Nothing is recorded afterwards.

Timestamps are `time.perf_counter_ns()` (a system-wide monotonic clock on Linux, macOS and
Windows) relative to the loader's start, so spans from several processes line up.
Open the file in chrome://tracing or https://ui.perfetto.dev.

Why not torch.profiler with `record_function` around the same stages (see `python -m
bench.torch_profiler`, bench/results/torch-profiler-20261202.json): it records only the thread
that started the session, so spans in reader threads and DataLoader worker processes, the
per-worker rows this trace exists for, would be lost; a second session started in a reader
thread kills the process (SIGSEGV); and it costs more per epoch. So the trace stays hand-built.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_local = threading.local()
log = logging.getLogger(__name__)


class Recorder:
    """The spans of one thread while it reads one chunk."""

    def __init__(self, t0: int, label: str):
        self.t0, self.pid, self.tid = t0, os.getpid(), threading.get_native_id()
        self.events: list[dict[str, Any]] = [
            {"name": "thread_name", "ph": "M", "pid": self.pid, "tid": self.tid, "args": {"name": label}},
        ]

    def add(self, name: str, start: int, end: int, **args: Any) -> None:
        """A complete span [start, end) in perf_counter_ns units."""
        self.events.append({"name": name, "cat": "data", "ph": "X", "pid": self.pid, "tid": self.tid,
                            "ts": (start - self.t0) / 1000, "dur": (end - start) / 1000, "args": args})


def current() -> Recorder | None:
    """This thread's recorder while it reads a profiled chunk, else None."""
    return getattr(_local, "recorder", None)


@contextmanager
def recording(t0: int, label: str) -> Iterator[Recorder]:
    """Record this thread's spans (see `span`) until the block ends."""
    _local.recorder = rec = Recorder(t0, label)
    try:
        yield rec
    finally:
        _local.recorder = None


@contextmanager
def span(name: str, **args: Any) -> Iterator[None]:
    """A span of this thread's recorder; nothing (one attribute read) when it is not recording."""
    rec = current()
    if rec is None:
        yield
        return
    start = time.perf_counter_ns()
    try:
        yield
    finally:
        rec.add(name, start, time.perf_counter_ns(), **args)


class LoaderProfile:
    """The training process's side: collects the workers' spans, adds the waits, writes the trace once."""

    def __init__(self, batches: int, folder: str | Path):
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
            raise ValueError(f"profile_batches must be a positive number of batches (or None), got {batches!r}")
        self.batches, self.path = batches, Path(folder) / "result.json"
        self.t0 = time.perf_counter_ns()
        self.done = False
        self.consumer = Recorder(self.t0, "consumer (training loop)")
        self.events: list[dict[str, Any]] = []

    def add(self, events: list[dict[str, Any]] | None) -> None:
        if events and not self.done:
            self.events.extend(events)

    def handed(self, batch: int, asked: int) -> None:
        """Batch `batch` of this iteration is handed out; the consumer asked for it at `asked`."""
        if self.done:
            return
        self.consumer.add("wait", asked, time.perf_counter_ns(), batch=batch)
        if batch + 1 >= self.batches:
            self.write()

    def write(self) -> Path:
        """Write result.json (once) and stop recording."""
        if self.done:
            return self.path
        self.done = True
        seen, events = set(), []
        for e in self.consumer.events + self.events:
            key = (e["pid"], e["tid"], e["name"]) if e["ph"] == "M" else None
            if key is None or key not in seen:
                seen.add(key)
                events.append(e)
        pids = {e["pid"] for e in events}
        events += [{"name": "process_name", "ph": "M", "pid": p, "tid": 0,
                    "args": {"name": "training process" if p == os.getpid() else f"DataLoader worker (pid {p})"}}
                   for p in sorted(pids)]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        os.replace(tmp, self.path)
        log.info("profile of the first %d batches written to %s (open it in chrome://tracing or ui.perfetto.dev)",
                 self.batches, self.path)
        self.events = []
        return self.path
