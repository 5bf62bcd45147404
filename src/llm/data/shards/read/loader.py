"""StreamingDataLoader: batches in plan order, one iterator at a time, the exact resume state, and `stats()`."""

from __future__ import annotations

import os
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from llm.data.ingest_stats import (
    FLUSH_EVERY,
    PROCESS_REMOTE,
    IngestWindow,
    RemoteCounters,
    figures,
    remote_sum,
)
from llm.data.ledger.writer import ledger_path
from llm.data.metrics_export import DEFAULT_HOST, LoaderMetrics
from llm.data.shards.plan.schedule import BatchSchedule
from llm.data.shards.read.handoff import SendsErrors, split_chunk
from llm.data.shards.read.ledger import LoaderLedger, add_chunk_rows, run_id
from llm.data.shards.read.profiling import LoaderProfile
from llm.data.shards.read.skips import LoaderSkips
from llm.data.shards.read.source import ReadPlan, Resume, SampleSource, renamed
from llm.data.shards.read.state import OPTIONAL_KEYS, STATE_KEYS, check_header, check_int
from llm.data.stage import Stage, StateError
from llm.data.topology import current_topology
from llm.data.waiting import WorkerSlots
from llm.data.watchdog import DEFAULT_WATCHDOG_S, Watchdog
from llm.data.worker_errors import SentError, reraise

_CHUNK_TOKENS = 1 << 20  # tokens per worker hand-off: big enough to amortise IPC, small enough to start fast


class StreamingDataLoader(LoaderSkips, LoaderMetrics, DataLoader, Stage):
    """A DataLoader over a StreamingDataset or a mixture with an exact, tiny, topology-free `state_dict()`.

    Iterating it again starts the next epoch (reshuffled by a seed derived from the epoch); iterating
    after a `break` or a `load_state_dict` continues where the consumed batches end.
    The epoch boundary is defined once (`_cursor`): when every batch of epoch e has been
    handed out, the loader is at epoch e + 1, position 0, however the loop was left.
    One iterator at a time: a new `iter(loader)` (or `load_state_dict`) supersedes the
    previous iterator, which raises if used again instead of sharing the position.
    """

    def __init__(
        self,
        dataset: SampleSource,
        batch_size: int = 1,
        num_workers: int = 0,
        collate_fn: Callable[[list], Any] | None = None,
        drop_short_batch: bool = False,
        worker_backend: str = "auto",
        profile_batches: int | None = None,
        profile_dir: str | Path = ".",
        drop_last: bool | None = None,
        ledger: str | os.PathLike | None = None,
        skip_documents: list[str] | str | os.PathLike | None = None,
        watchdog_s: float = DEFAULT_WATCHDOG_S,
        watchdog: str = "log",
        metrics_port: int | None = None, metrics_host: str = DEFAULT_HOST, **kwargs: Any,
    ):
        """`drop_short_batch`: drop an epoch's short final global batch (`drop_last`, torch's name, is
        accepted; the dataset's `drop_partial_block` is the other meaning). `profile_batches=N`: write a Chrome trace of the first N batches to `profile_dir/result.json`
        (profiling.py). `ledger`: a folder where this rank records what every batch held, committed by
        each `state_dict()` (docs/proving-a-run.md; `llm-data audit FOLDER` checks it). `skip_documents`: ids
        `SOURCE@TOKEN` (a list or a file) whose blocks leave their batches (read/skips.py). `watchdog_s`: after that many
        seconds without a batch, name the worker, shard and request it waits for (0: off); `watchdog="raise"` raises
        DataStallError then instead of only logging (llm/data/watchdog.py). `metrics_port`: `stats()` served for
        Prometheus (metrics_export.py). Other kwargs: torch's."""
        if not isinstance(dataset, SampleSource):
            raise TypeError(f"StreamingDataLoader needs a StreamingDataset or CombinedStreamingDataset (a SampleSource), "
                            f"got {type(dataset).__name__}")
        for key in ("sampler", "batch_sampler", "shuffle"):
            if kwargs.get(key) not in (None, False):
                raise ValueError(f"StreamingDataLoader does not take {key}=; order is set by StreamingDataset(shuffle=, seed=)")
            kwargs.pop(key, None)
        if kwargs.get("persistent_workers"):
            raise ValueError("StreamingDataLoader does not support persistent_workers=True: each epoch's plan is sent to fresh workers")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if collate_fn is not None and dataset.manifest.kind == "tokens" and not dataset.reads_per_sample():
            raise ValueError("collate_fn is only used for item datasets and datasets with a transform or their own "
                             "__getitem__; plain token batches are stacked arrays already")
        if worker_backend not in ("auto", "threads", "processes"):
            raise ValueError(f"worker_backend must be 'auto', 'threads' or 'processes', got {worker_backend!r}")
        if worker_backend == "auto":
            # Token blocks are memory copies that release the GIL, and items of fixed-layout fields
            # are decoded with one NumPy view each: reader threads beat worker processes (no pickling
            # of every batch back to the parent, no extra memory). A transform on token blocks stays
            # on threads (typical ones are tensor ops; docs/benchmarks.md has the numbers); items with a
            # transform or collate_fn run user Python code per sample: processes. Pass
            # worker_backend="processes" for heavy Python code of any kind.
            custom = kwargs.get("worker_init_fn") or kwargs.get("multiprocessing_context")
            user_code = dataset.manifest.kind == "items" and (dataset.reads_per_sample() or collate_fn is not None)
            worker_backend = "processes" if custom or user_code else "threads"
        self.worker_backend = worker_backend
        if worker_backend == "processes" and num_workers and dataset.reads_remote():
            # The object-store client's runtime does not survive fork(): remote datasets start
            # their worker processes from a fresh forkserver instead.
            kwargs.setdefault("multiprocessing_context", "forkserver")
        processes = worker_backend == "processes" and num_workers > 0  # each worker reports into its slot (waiting.py)
        slots = WorkerSlots(num_workers) if processes else None
        self._watch = Watchdog(f"StreamingDataLoader({dataset.input_dir})", watchdog_s, watchdog, slots)
        if slots is not None:
            kwargs["worker_init_fn"] = slots.hook(kwargs.get("worker_init_fn"))
            self._watch.loader_kwargs(kwargs, processes)
        prefetch = kwargs.get("prefetch_factor")
        if worker_backend == "threads":
            kwargs.pop("prefetch_factor", None)  # DataLoader refuses it without worker processes
        super().__init__(
            dataset, batch_size=None, num_workers=0 if worker_backend == "threads" else num_workers, **kwargs
        )
        self.reader_threads = num_workers if worker_backend == "threads" else 0
        # Reader threads pin chunks themselves; without a GPU that only warns, as torch's DataLoader does.
        self._pin = bool(self.pin_memory) and self.reader_threads > 0 and torch.cuda.is_available()
        if self.pin_memory and self.reader_threads and not self._pin:
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                          "then device pinned memory won't be used.", UserWarning, stacklevel=2)
        self.read_ahead = self.reader_threads * (prefetch or 2)
        # DataLoader forbids setting these after __init__; ours describe the batches we yield.
        object.__setattr__(self, "batch_size", batch_size)
        self.drop_short_batch = renamed(drop_short_batch, drop_last, "drop_short_batch", "drop_last")
        object.__setattr__(self, "drop_last", self.drop_short_batch)  # torch's name, for code that reads it
        self._collate = collate_fn
        dataset.set_global_batch(batch_size * current_topology()[1])  # a per_batch mixture: one source per global batch
        self._chunk_batches = self._pick_chunk_batches(dataset, batch_size)
        self._epoch = 0
        self._start = 0
        self._schedule: BatchSchedule | None = None
        self._yielded = 0
        self._active: object | None = None  # the one live iterator's token
        self._profile = LoaderProfile(profile_batches, profile_dir) if profile_batches else None
        self._window = IngestWindow()  # stats(): waits, batches and tokens since the last reset
        self._worker_remote = RemoteCounters()  # counts that worker processes sent with their chunks
        self._ledger: LoaderLedger | None = None
        self._set_skips(skip_documents)
        if ledger is not None:
            self.attach_ledger(ledger)
        self.serve_metrics(metrics_port, metrics_host)  # last: a port in use fails before anything is served

    @staticmethod
    def _pick_chunk_batches(dataset: SampleSource, batch_size: int) -> int:
        tokens = dataset.manifest.kind == "tokens"
        return max(1, min(64, _CHUNK_TOKENS // (batch_size * dataset.block_size))) if tokens else 4

    # ---- the run ledger (read/ledger.py) ---------------------------------------------------------

    def attach_ledger(self, folder: str | os.PathLike, run: str | None = None) -> None:
        """Record what every batch held in `folder`, like `ledger=` (llm-train attaches its run's ledger).

        `run`: the run id, the same on every rank (None: one derived from the dataset and folder). Call it
        before `load_state_dict` and before iterating, so a resumed state's ledger position is taken.
        """
        if self._active is not None:
            raise RuntimeError("attach_ledger() after iteration started; attach the ledger before the first batch")
        folder = ledger_path(folder)  # a wrong type is named here, not deep in os.path
        # the loader's drop of an epoch's short last batch: audit must not call those samples missing
        sources = [{**s, "drop_short_batch": self.drop_short_batch} for s in self.dataset.ledger_sources()]
        self._ledger = LoaderLedger(folder, sources,
                                    run or run_id(self.dataset.fingerprint, self.dataset.seed, folder))

    def ledger_set_loss(self, losses: Any) -> None:
        """Per-row losses of the batch handed over last, written with it (`checkpoint.ledger_loss`)."""
        if self._ledger is not None:
            self._ledger.set_loss(np.asarray(losses, np.float32))

    def ledger_skip(self) -> None:
        """The batch handed over last was read and dropped, not trained (`data.skip_batches`)."""
        if self._ledger is not None:
            self._ledger.skip()

    def _schedule_from(self, start: int) -> BatchSchedule:
        rank, world = current_topology()
        return BatchSchedule(self.dataset.num_samples, start, self.batch_size, rank, world, self.drop_short_batch)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self._schedule_from(0))

    def batches_left(self) -> int:
        """Batches this rank still gets in the current epoch, from the position a loaded state gave."""
        return len(self._schedule_from(self._cursor()[1]))

    def _cursor(self) -> tuple[int, int]:
        """(epoch, samples consumed in it): the only place that decides where an epoch ends.

        A finished epoch (all its batches handed out, even if the loop was left by a break or
        islice right after the last one) reads as the next epoch at position 0, so the next
        pass is a full epoch and a state saved at the boundary resumes exactly there.
        """
        if self._schedule is None:
            consumed, end = self._start, self._schedule_from(self._start).end
        else:
            consumed, end = self._schedule.consumed_after(self._yielded), self._schedule.end
        if consumed >= end and consumed > 0:
            return self._epoch + 1, 0
        return self._epoch, consumed

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self._cursor()
        schedule = self._schedule_from(start)
        self._epoch, self._start, self._schedule, self._yielded = epoch, start, schedule, 0
        token = self._active = object()  # supersedes any earlier iterator of this loader
        profile = self._profile if self._profile is not None and not self._profile.done else None
        if self._ledger is not None:
            # a resume may change a mixture's weights or later schedule: each generation records its own
            self._ledger.open(schedule.rank, {"world_size": schedule.world_size, "batch_size": self.batch_size,
                               "num_workers": self.reader_threads or self.num_workers,
                               **({"mixture": mix} if (mix := self.dataset.ledger_mixture()) else {})})
        it = ReadPlan(epoch, schedule, self._chunk_batches, self._collate,
                      profile=profile.batches if profile else 0, t0=profile.t0 if profile else 0,
                      ledger=self._ledger.writer.checksum if self._ledger is not None else "")
        return self._batches(token, it, profile)

    def _batches(self, token: object, it: ReadPlan, profile: LoaderProfile | None) -> Iterator[Any]:
        self._check_live(token)
        if self.reader_threads:
            chunks: Iterator[Any] = self._threaded_chunks(it)
        else:
            ds = self.dataset
            ds._plan = it
            # the workers iterate the wrapper (torch's attribute, set only while they start)
            object.__setattr__(self, "dataset", SendsErrors(ds) if self.num_workers else ds)
            self._watch.clear()  # before the workers start and take their slots
            try:
                chunks = super().__iter__()
            finally:
                object.__setattr__(self, "dataset", ds)
                ds._plan = None
        ds = self.dataset
        boundaries = ds.manifest.kind == "tokens" and ds.item_loader.document_boundaries  # ItemsLoader has none
        block = ds.block_size if ds.manifest.kind == "tokens" else 0
        window, clock = self._window, time.perf_counter_ns
        window.resume_clock()
        # stats(): per batch, one clock read and one append (binned every few thousand batches);
        # tokens are counted per chunk, for the batches of it that were handed out
        log_wait = window.pending_waits.append
        watch = self._watch.start()  # `since`: when the caller asked (0 while it holds a batch)
        asked = watch.since
        try:
            for chunk in chunks:
                if isinstance(chunk.get("error"), SentError):
                    reraise(chunk["error"])
                trace = chunk.pop("trace", None)
                if profile is not None:
                    profile.add(trace)
                counted = chunk.pop("ingest", None)  # a worker process's remote counts since its previous chunk
                if counted is not None:
                    self._worker_remote.merge(counted)
                    PROCESS_REMOTE.merge(counted)
                if len(window.pending_waits) >= FLUSH_EVERY:
                    window.flush()
                # read first: the first touch of a chunk handed over from a reader thread costs ~20 us whichever
                # code makes it (measured in the loader), and the ledger's part (bench/ledger.py) is not that
                sizes = chunk["sizes"].tolist()
                left_out = self._left_out(chunk)  # blocks of documents skipped by id (read/skips.py)
                ledger = self._ledger_chunk(chunk, len(sizes), it, left_out)
                window.open_chunk(sizes, block)
                try:
                    for batch in split_chunk(chunk, sizes, boundaries):
                        self._check_live(token)
                        self._yielded += 1  # counted before the caller sees it: a state saved now includes it
                        if ledger is not None:  # counted like it: a state saved now includes this batch's rows
                            ledger.step += 1
                        log_wait(clock() - asked)
                        if profile is not None:
                            profile.handed(self._yielded - 1, asked)  # the consumer waited since `asked`
                        watch.since = 0
                        yield batch
                        asked = watch.since = clock()
                finally:
                    window.close_chunk()
        except Exception as e:
            stall = watch.failed(e)  # a hang in raise mode, or notes on workers that exited (watchdog.py)
            if stall is None:
                raise
            raise stall from e
        finally:
            watch.stop()
            if profile is not None:
                profile.write()  # an iteration shorter than profile_batches, or left early
        if self._active is token and self._yielded == len(it.schedule):
            self._epoch, self._start, self._schedule, self._yielded = self._epoch + 1, 0, None, 0

    def _ledger_chunk(self, chunk: dict[str, Any], n: int, it: Any, left_out: tuple[np.ndarray, ...] | None
                      ) -> LoaderLedger | None:
        """The ledger given this chunk's rows (its `n` batches) once (read/ledger.py `add_chunk_rows`); None without a
        ledger."""
        if self._ledger is None:
            return None
        schedule = it.schedule
        # only an epoch's last batch can pad, and only with several ranks (a rank without a sample of its own)
        pads = bool(n) and schedule.world_size > 1 and schedule.pads(self._yielded + n - 1)
        return add_chunk_rows(self._ledger, self.dataset, chunk, it.epoch, pads, left_out)

    def _remote_now(self) -> dict[str, int]:
        return remote_sum([self.dataset.remote_counters(), self._worker_remote.snapshot()])

    def stats(self, reset: bool = False) -> dict[str, float | int | None]:
        """What this loader handed out since it was made (or since `stats(reset=True)`), also with worker processes.

        `batches`, `tokens` (token datasets; None for items), `seconds` (wall time of the window),
        `batches_per_s`, `tokens_per_s`, `wait_s` (total time callers waited inside `next()`),
        `wait_p50_ms`, `wait_p95_ms`, `wait_p99_ms` (per batch, within 6%; None before the first
        batch), and for remote data `remote_bytes`, `remote_requests` (shard GETs), `cache_hits`,
        `cache_misses`, `cache_evictions` (0 for local data). `reset=True` starts the next window
        after reading this one. docs/optimized-shards.md has the details.
        """
        out = figures([self._window.summary(self._remote_now())], count_tokens=self.dataset.manifest.kind == "tokens")
        if reset:
            self._window.reset(self._remote_now())
        return out

    def _check_live(self, token: object) -> None:
        if self._active is not token:
            raise RuntimeError(
                "this StreamingDataLoader iterator was superseded by a newer iter(loader) or load_state_dict(); "
                "a loader has one position, so use the newest iterator only"
            )

    def _threaded_chunks(self, it: ReadPlan) -> Iterator[Any]:
        """Chunks read ahead by `reader_threads` threads, yielded in plan order."""
        ds = self.dataset
        bounds, order = ds.chunk_plan(it, self.reader_threads)
        pool = ThreadPoolExecutor(self.reader_threads, thread_name_prefix="llm-reader")
        pending: deque = deque()
        try:
            for c in range(len(bounds) - 1):
                pending.append(pool.submit(ds.read_chunk, it, order, bounds[c], bounds[c + 1]))
                if len(pending) >= self.read_ahead:
                    yield self._to_tensors(self._watch.result(pending.popleft()))
            while pending:
                yield self._to_tensors(self._watch.result(pending.popleft()))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _to_tensors(self, chunk: dict[str, Any]) -> dict[str, Any]:
        out = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in chunk.items()}
        if self._pin:
            out = {k: v.pin_memory() if isinstance(v, torch.Tensor) and k != "sizes" else v for k, v in out.items()}
        return out

    # ---- the stage contract (llm.data.stage): state_dict / load_state_dict are Stage's ----------

    def source_counts(self) -> dict[str, dict[str, int]]:
        """Samples and tokens handed out so far per source, all ranks together: {name: {tokens, samples}}."""
        return self.dataset.source_counts(*self._cursor())

    def state(self) -> dict[str, Any]:
        """{version, fingerprint, seed, shuffle, shuffle_window, epoch, samples_consumed, ...}: a few hundred bytes."""
        epoch, consumed = self._cursor()
        world = self._schedule.world_size if self._schedule else current_topology()[1]
        return {**self.dataset.state_at(epoch, consumed), "global_batch_size": self.batch_size * world}

    def state_dict(self) -> dict[str, Any]:
        """The resume state; with a ledger, also commits the batches handed out since the last one."""
        state = self._skip_state(self.state())
        if self._ledger is not None:
            state["ledger"] = self._ledger.commit()
        return state

    def _resolve(self, state: Any) -> Resume:
        """Where `state` resumes, the dataset's (or mixture's) part included; changes nothing."""
        check_int(check_header(state, STATE_KEYS), "global_batch_size", 1, 1 << 62,
                  "batch_size x world size when it was saved")
        resume = self.dataset.resolve(state)  # first: another dataset's state is named as such
        unknown = sorted(set(state) - set(self.state()) - set(OPTIONAL_KEYS))
        if unknown:  # an edited or foreign state: resuming it would ignore what the key says
            raise StateError(f"loader state has an unknown key {unknown[0]!r}; pass the dict returned by "
                             "StreamingDataLoader.state_dict() unchanged")
        return resume

    def check(self, state: Any) -> None:
        self._resolve(state)
        self._check_skips(state)

    def restore(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batches counted in `state`, on any num_workers or world size."""
        resume = self._resolve(state)
        self.dataset.apply(resume)
        self._restore_skips(state)
        if self._ledger is not None:
            self._ledger.resume_from(state.get("ledger"))
        self._epoch, self._start = resume.epoch, resume.consumed
        self._schedule, self._yielded, self._active = None, 0, None
