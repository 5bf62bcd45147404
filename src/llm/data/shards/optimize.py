"""optimize(): inputs -> checksummed shards, in parallel processes, committed atomically.

Inputs are cut into contiguous tasks; worker processes take tasks as they free
up and write each task's shards under a name that sorts in input order, so the
dataset's content (every token, in input order) is the same for any number of
workers. The manifest is written last, by rename: until then the folder's
previous dataset stays the one readers see, even after a kill -9.
"""

from __future__ import annotations

import inspect
import math
import multiprocessing
import os
import queue
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm.data.shards.format.loaders import ItemsLoader, TokensLoader
from llm.data.shards.format.manifest import Manifest, ShardInfo
from llm.data.shards.format.writer import (
    ItemShardWriter,
    TokenShardWriter,
    as_token_array,
    check_batch,
)
from llm.data.shards.output import SHARD_PREFIX, open_output
from llm.data.tokenizers import Tokenizer, token_dtype


@dataclass(frozen=True)
class DocumentBatch:
    """Many documents at once (flat ids + lengths): the fast path for text pipelines."""

    tokens: Any  # 1-D int64 numpy array
    lengths: Any  # 1-D int64 numpy array, sums to len(tokens)


@dataclass
class OptimizeSummary:
    output_dir: str
    documents: int = 0
    tokens: int = 0
    items: int = 0
    shards: int = 0
    bytes: int = 0
    seconds: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)  # from fn.pop_stats(): input_bytes, invalid_utf8_records...

    def line(self) -> str:
        secs = max(self.seconds, 1e-9)
        parts = [f"{self.documents:,} documents" if self.tokens else f"{self.items:,} items"]
        if self.tokens:
            parts.append(f"{self.tokens:,} tokens")
        parts.append(f"{self.bytes / 1e6:,.1f} MB in {self.shards} shards")
        parts.append(f"{self.seconds:.1f} s")
        rate = f"{self.tokens / secs / 1e6:,.2f} M tokens/s" if self.tokens else f"{self.items / secs:,.0f} items/s"
        if self.stats.get("input_bytes"):
            rate += f", {self.stats['input_bytes'] / secs / 1e6:,.1f} MB/s of text"
        parts.append(rate)
        if "invalid_utf8_records" in self.stats:
            parts.append(f"{self.stats['invalid_utf8_records']:,} records with invalid UTF-8 (replaced by U+FFFD)")
        return f"optimize: {', '.join(parts)} -> {self.output_dir}"


@dataclass(frozen=True)
class _Job:
    """Everything a worker needs, fixed before the workers start."""

    fn: Callable[[Any], Any]
    tasks: list[list[Any]]
    folder: Path
    run_id: str
    kind: str
    dtype: str
    chunk_bytes: int | None
    chunk_size: int | None
    compression: str | None


def _documents(result: Any) -> Iterable[Any]:
    """fn's return value as documents: a generator yields many, anything else is one."""
    if result is None:
        return ()
    if inspect.isgenerator(result) or isinstance(result, Iterable) and not _is_single(result):
        return result
    return (result,)


def _is_single(value: Any) -> bool:
    # A list of ints, a numpy array or a tensor is one document; a list of those is several.
    if hasattr(value, "shape") or isinstance(value, (str, bytes, dict)):
        return True
    if isinstance(value, (list, tuple)):
        return not value or not isinstance(value[0], (list, tuple)) and not hasattr(value[0], "shape")
    return False


def _run_task(job: _Job, task_id: int, report: Callable[[int, int], None]) -> tuple[list[ShardInfo], dict]:
    """Write one task's shards; returns their infos and fn's counters."""
    prefix = f"{SHARD_PREFIX}{job.run_id}-{task_id:05d}"
    if job.kind == "tokens":
        writer: Any = TokenShardWriter(job.folder, prefix, job.dtype, job.chunk_bytes, job.chunk_size, job.compression)
    else:
        writer = ItemShardWriter(job.folder, prefix, job.chunk_bytes, job.chunk_size, job.compression)
    first = sum(len(t) for t in job.tasks[:task_id])  # index of this task's first input
    for index, item in enumerate(job.tasks[task_id], first):
        result = job.fn(item)
        prefix = f"optimize: input {index} ({item!r:.80})"
        for d, doc in enumerate(_documents(result) if job.kind == "tokens" else _items(result)):
            where = f"{prefix}, document {d}"
            if isinstance(doc, DocumentBatch):
                tokens, lengths = check_batch(doc.tokens, doc.lengths, where)
                writer.add_batch(tokens, lengths)
                report(len(lengths), len(tokens))
            elif job.kind == "tokens":
                arr = as_token_array(doc, where)
                writer.add(arr)
                report(1, arr.size)
            else:
                writer.add(doc)
                report(1, 0)
    writer.flush()
    pop_stats = getattr(job.fn, "pop_stats", None)
    return writer.shards, (pop_stats() if pop_stats else {})


def _items(result: Any) -> Iterable[Any]:
    if result is None:
        return ()
    return result if inspect.isgenerator(result) else (result,)


def _worker(job: _Job, task_queue: Any, results: Any, parent_pid: int) -> None:
    # The worker processes are the parallelism: tokenizer thread pools would only contend for cores.
    os.environ["LLM_TOKENIZER_THREADS"] = "1"
    os.environ["RAYON_NUM_THREADS"] = "1"
    last = [time.monotonic(), 0, 0]

    def report(docs: int, tokens: int) -> None:
        last[1] += docs
        last[2] += tokens
        if time.monotonic() - last[0] > 0.5:
            if os.getppid() != parent_pid:  # the parent was killed: stop writing orphans
                os._exit(1)
            results.put(("progress", last[1], last[2]))
            last[:] = [time.monotonic(), 0, 0]

    while True:
        task_id = task_queue.get()
        if task_id is None:
            return
        try:
            shards, stats = _run_task(job, task_id, report)
            results.put(("progress", last[1], last[2]))
            last[1:] = [0, 0]
            results.put(("done", task_id, shards, stats))
        except BaseException as e:  # reported to the parent, which stops the run and cleans up
            results.put(("error", task_id, _picklable(e), traceback.format_exc()))
            return


def _picklable(e: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def _split_tasks(inputs: Sequence[Any], num_tasks: int) -> list[list[Any]]:
    """Contiguous groups of inputs, as even as possible, in input order."""
    num_tasks = max(1, min(num_tasks, len(inputs)))
    base, extra = divmod(len(inputs), num_tasks)
    tasks, start = [], 0
    for t in range(num_tasks):
        size = base + (t < extra)
        tasks.append(list(inputs[start : start + size]))
        start += size
    return tasks


_MAX_CHUNK_BYTES = 1 << 40  # a shard is built in memory before it is written: 1 TiB is already absurd


def parse_size(value: int | str | None) -> int | None:
    """64MB, 512kb, 1GiB or a plain number of bytes; between 1 byte and 1 TiB."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"chunk size {value!r} is not a size like 64MB, 512KB or 1GB")
    size = value if isinstance(value, int) else _parse_size_text(value)
    if not 1 <= size <= _MAX_CHUNK_BYTES:
        raise ValueError(f"chunk size {value!r} is out of range: give between 1 byte and 1TB, e.g. 64MB")
    return size


def _parse_size_text(value: str) -> int:
    text = value.strip().upper().replace("IB", "B")
    for suffix, scale in (("KB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30), ("TB", 1 << 40), ("B", 1)):
        if text.endswith(suffix):
            text, factor = text[: -len(suffix)], scale
            break
    else:
        factor = 1
    try:
        number = float(text)
        if not math.isfinite(number):
            raise ValueError
        return int(number * factor)
    except (ValueError, OverflowError):
        raise ValueError(f"chunk size {value!r} is not a size like 64MB, 512KB or 1GB") from None


def optimize(
    fn: Callable[[Any], Any],
    inputs: Sequence[Any],
    output_dir: str | Path,
    *,
    num_workers: int | None = None,
    chunk_bytes: int | str | None = None,
    chunk_size: int | None = None,
    item_loader: TokensLoader | ItemsLoader | None = None,
    mode: str | None = None,
    compression: str | None = None,
    tokenizer: Tokenizer | None = None,
    sources: list[dict] | None = None,
    progress: bool = True,
    wait: bool = False,
    storage_options: dict | None = None,
) -> OptimizeSummary:
    """Run `fn` over `inputs` in `num_workers` processes and write the results as a dataset.

    With `item_loader=TokensLoader()`, `fn(input)` returns a document (1-D integer
    array, tensor or list) or yields many; otherwise it returns or yields items
    (any picklable object). `chunk_bytes` / `chunk_size` (tokens or items) bound
    each shard. `mode`: None (the folder must be empty), 'append' or 'overwrite'.
    `tokenizer` is recorded in the manifest (its fingerprint, EOS id, vocabulary).
    One run at a time holds `output_dir`: another run fails at once naming the holder,
    or with `wait=True` waits for it to finish. `output_dir` may be `s3://bucket/prefix`
    (credentials from the AWS environment or `storage_options`, see docs/storage.md).
    """
    started = time.perf_counter()
    inputs = list(inputs)
    if not inputs:
        raise ValueError("optimize got no inputs")
    if compression not in (None, "zstd"):
        raise ValueError(f"unknown compression {compression!r}; expected 'zstd' or None")
    kind = "tokens" if isinstance(item_loader, TokensLoader) else "items"
    if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0):
        raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    workers = (os.cpu_count() or 1) if num_workers is None else num_workers
    chunk = parse_size(chunk_bytes)
    tok_fp = tokenizer.fingerprint() if tokenizer is not None else None
    output = open_output(output_dir, mode, kind, tok_fp, wait=wait, storage_options=storage_options)
    run_id = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
    dtype = token_dtype(tokenizer.vocab_size) if tokenizer is not None else "uint16"
    job = _Job(
        fn, _split_tasks(inputs, 4 * max(workers, 1)), output.folder, run_id, kind, dtype, chunk, chunk_size, compression,
    )
    try:
        results = _run(job, workers, progress, getattr(output, "upload", None))
        shards = [s for task_id in range(len(job.tasks)) for s in results[task_id][0]]
        manifest = Manifest(
            kind=kind,
            shards=shards,
            dtype=_widest_dtype(shards, dtype) if kind == "tokens" else None,
            tokenizer=tok_fp,
            eos_id=tokenizer.eos_id if tokenizer is not None else None,
            vocab_size=tokenizer.vocab_size if tokenizer is not None else None,
            sources=sources or [],
            tokenizer_backend=getattr(tokenizer, "backend", None) if tokenizer is not None else None,
        )
        output.commit(manifest)
    except BaseException as e:
        output.abort(run_id)
        explained = output.explain(e)
        if explained is e:
            raise
        raise explained from e
    finally:
        output.release()
    summary = OptimizeSummary(
        output_dir=getattr(output, "display", str(output.folder)),
        documents=sum(s.documents for s in shards),
        tokens=sum(s.tokens for s in shards),
        items=sum(s.items for s in shards),
        shards=len(shards),
        bytes=sum(s.bytes for s in shards),
        seconds=time.perf_counter() - started,
    )
    for _, stats in results.values():
        for key, value in stats.items():
            summary.stats[key] = summary.stats.get(key, 0) + value
    if progress:
        print(summary.line(), file=sys.stderr)
    return summary


def _widest_dtype(shards: list[ShardInfo], default: str) -> str:
    return "uint32" if any(s.dtype == "uint32" for s in shards) else default


def _progress_bar(total: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="task", desc="optimize", disable=not enabled, dynamic_ncols=True, file=sys.stderr)


def _run(job: _Job, workers: int, progress: bool, on_done: Callable | None = None) -> dict[int, tuple[list[ShardInfo], dict]]:
    bar = _progress_bar(len(job.tasks), progress)
    counts = [0, 0]

    def report(docs: int, tokens: int) -> None:
        counts[0] += docs
        counts[1] += tokens

    try:
        if workers == 0:
            results = {}
            for task_id in range(len(job.tasks)):
                results[task_id] = _run_task(job, task_id, report)
                if on_done is not None:  # remote output: upload the task's shards now
                    on_done(results[task_id][0])
                bar.update(1)
                bar.set_postfix(docs=counts[0], tokens=counts[1], refresh=False)
            return results
        return _run_parallel(job, workers, bar, on_done)
    finally:
        bar.close()


def _run_parallel(job: _Job, workers: int, bar: Any, on_done: Callable | None) -> dict[int, tuple[list[ShardInfo], dict]]:
    # fork where available: fn need not be picklable and workers start in milliseconds.
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    task_queue, result_queue = ctx.Queue(), ctx.Queue()
    for task_id in range(len(job.tasks)):
        task_queue.put(task_id)
    workers = min(workers, len(job.tasks))
    for _ in range(workers):
        task_queue.put(None)
    procs = [ctx.Process(target=_worker, args=(job, task_queue, result_queue, os.getpid()), daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    results: dict[int, tuple[list[ShardInfo], dict]] = {}
    docs = tokens = 0
    try:
        while len(results) < len(job.tasks):
            try:
                message = result_queue.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"optimize worker {dead[0].pid} died with exit code {dead[0].exitcode}") from None
                continue
            if message[0] == "progress":
                docs, tokens = docs + message[1], tokens + message[2]
                bar.set_postfix(docs=docs, tokens=tokens, refresh=False)
            elif message[0] == "done":
                results[message[1]] = (message[2], message[3])
                if on_done is not None:  # in this process: the object-store client does not survive fork
                    on_done(message[2])
                bar.update(1)
            else:
                _, task_id, error, trace = message
                raise error
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
