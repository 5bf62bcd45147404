"""optimize(): inputs -> checksummed shards, in parallel processes, committed atomically.

Inputs are cut into contiguous tasks; workers (local processes, or Ray tasks with
engine='ray', see jobs/) take tasks as they free up and write each task's shards
under a name that sorts in input order, so the dataset's content (every token or
item, in input order) is the same for any number of workers and either engine. The
manifest is written last, by rename: until then the folder's previous dataset stays
the one readers see, even after a kill -9.
"""

from __future__ import annotations

import inspect
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from llm.data.inputs.errors import InputError
from llm.data.jobs import Tasks, check_engine, engine_session, run_tasks
from llm.data.shards.format.encryption import Encryption, record
from llm.data.shards.format.loaders import ItemsLoader, TokensLoader
from llm.data.shards.format.manifest import Manifest, ShardInfo
from llm.data.shards.format.pread import ShardError
from llm.data.shards.format.serializers import StructureError
from llm.data.shards.format.validate import ManifestError
from llm.data.shards.format.writer import (
    ItemShardWriter,
    TokenShardWriter,
    as_token_array,
    check_batch,
)
from llm.data.shards.prepare.item_layout import common_layout
from llm.data.shards.prepare.lightning_cloud import refuse_cloud_arguments
from llm.data.shards.prepare.output import SHARD_PREFIX, Incoming, Output, open_output
from llm.data.shards.prepare.tails import join_tails, tail_writer
from llm.data.storage.s3 import StorageError
from llm.data.storage.sizes import parse_bytes
from llm.data.tokenize.foreign import as_tokenizer
from llm.data.tokenize.tokenizers import token_dtype


class OptimizeError(RuntimeError):
    """fn raised on an input; the message names the input (the original error is its cause)."""


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
        parts += [f"{self.tokens:,} tokens"] if self.tokens else []
        parts += [f"{self.bytes / 1e6:,.1f} MB in {self.shards} shard{'' if self.shards == 1 else 's'}", f"{self.seconds:.1f} s"]
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
    folder: Path | None  # None: each task writes to a temp folder of its own and uploads (Ray to s3://)
    run_id: str
    kind: str
    dtype: str
    chunk_bytes: int | None
    chunk_size: int | None
    compression: str | None
    upload_to: tuple[str, dict | None] | None = None  # (s3:// url, storage_options) for folder None
    encryption: Any = None  # an Encryption: every shard is encrypted whole (format/encryption.py)


@dataclass
class _TaskResult:
    shards: list[ShardInfo]
    stats: dict
    layout: Any = None  # items: the layout of this task's first item
    tail: Any = None  # a small last shard, unwritten (records, or ids and lengths): the driver joins it (tails.py)

    @property
    def items(self) -> int:
        return sum(s.items for s in self.shards) + (len(self.tail) if isinstance(self.tail, list) else 0)


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


def _run_task(job: _Job, task_id: int, report: Callable[[int, int], None]) -> _TaskResult:
    """Write one task's shards (to job.folder, or to a temp folder then the object store)."""
    folder = job.folder if job.folder is not None else Path(tempfile.mkdtemp(prefix="llm-optimize-task-"))
    try:
        result = _write_task(job, task_id, folder, report)
        if job.upload_to is not None:
            _upload(job.upload_to, folder, result.shards)
        return result
    finally:
        if job.folder is None:
            shutil.rmtree(folder, ignore_errors=True)


def _write_task(job: _Job, task_id: int, folder: Path, report: Callable[[int, int], None]) -> _TaskResult:
    prefix = f"{SHARD_PREFIX}{job.run_id}-{task_id:05d}"
    if job.kind == "tokens":
        writer: Any = TokenShardWriter(folder, prefix, job.dtype, job.chunk_bytes, job.chunk_size, job.compression,
                                       job.encryption)
    else:
        writer = ItemShardWriter(folder, prefix, job.chunk_bytes, job.chunk_size, job.compression, job.encryption)
    first = sum(len(t) for t in job.tasks[:task_id])  # index of this task's first input
    for index, item in enumerate(job.tasks[task_id], first):
        prefix = f"optimize: input {index} ({item!r:.80})"
        for d, doc in enumerate(_outputs(job, item, prefix)):
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
                try:
                    writer.add(doc)
                except StructureError as e:  # and UnpicklableItem: the same class, with the input's name
                    raise type(e)(f"{prefix}{f', its item {d}' if d else ''}: {e}") from None
                report(1, 0)
    tail = writer.small_tail()
    writer.flush()
    pop_stats = getattr(job.fn, "pop_stats", None)
    return _TaskResult(writer.shards, pop_stats() if pop_stats else {}, getattr(writer, "layout", None), tail)


_END = object()  # the end of fn's documents
# Our own errors about files fn read (text inputs, shards and manifests of a converted
# folder, objects of a store): they name the file already, and the CLI reports them as such.
_NAMED = (InputError, ShardError, ManifestError, StorageError)


def _outputs(job: _Job, item: Any, prefix: str) -> Iterator[Any]:
    """fn's documents or items for one input; an error in fn (its call or its generator) names the input."""
    result = _named(prefix, job.fn, item)
    docs = iter(_documents(result) if job.kind == "tokens" else _items(result))
    while (doc := _named(prefix, next, docs, _END)) is not _END:
        yield doc


def _named(prefix: str, call: Callable[..., Any], *args: Any) -> Any:
    """call(*args): fn's work, its errors naming the input."""
    try:
        return call(*args)
    except _NAMED:
        raise
    except Exception as e:
        raise OptimizeError(f"{prefix} failed: {type(e).__name__}: {e}") from e


def _upload(target: tuple[str, dict | None], folder: Path, shards: list[ShardInfo]) -> None:
    """A task's shards to the object store, from the node that wrote them (the driver lists them at commit)."""
    from llm.data.storage.objects import open_objects

    objects = open_objects(target[0], target[1])
    for info in shards:
        objects.put(info.file, folder / info.file)


def _items(result: Any) -> Iterable[Any]:
    if result is None:
        return ()
    return result if inspect.isgenerator(result) else (result,)


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
    size = value if isinstance(value, int) else parse_bytes(value)
    if size is None:
        raise ValueError(f"chunk size {value!r} is not a size like 64MB, 512KB or 1GB")
    if not 1 <= size <= _MAX_CHUNK_BYTES:
        raise ValueError(f"chunk size {value!r} is out of range: give between 1 byte and 1TB, e.g. 64MB")
    return size


@refuse_cloud_arguments  # LitData's num_nodes= / machine=: one sentence naming engine='ray'
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
    tokenizer: Any = None,
    sources: list[dict] | None = None,
    progress: bool = True,
    wait: bool = False,
    storage_options: dict | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    encryption: Encryption | None = None,
) -> OptimizeSummary:
    """Run `fn` over `inputs` in `num_workers` processes and write the results as a dataset.

    With `item_loader=TokensLoader()`, `fn(input)` returns a document (1-D integer
    array, tensor or list) or yields many; otherwise it returns or yields items: dicts,
    lists and tuples of numbers, strings, bytes, None, numpy arrays, tensors, PIL images,
    or any picklable object (docs/items.md). `chunk_bytes` / `chunk_size` (tokens or items)
    bound each shard. `mode`: None (the folder must be empty), 'append' (refused, before anything is
    written, unless this run is made as the dataset there was: output.py) or 'overwrite'.
    `tokenizer` (ours, a spec, a Hugging Face/tokenizers/tiktoken object) is recorded in the manifest.
    One run at a time holds `output_dir`: another run fails at once naming the holder,
    or with `wait=True` waits for it to finish. `output_dir` may be `s3://bucket/prefix`
    (credentials from the AWS environment or `storage_options`, see docs/storage.md).
    `engine='ray'` runs the tasks as Ray tasks on the cluster at `ray_address` (or the
    running session, or a local one); `num_workers` tasks run at once (default: the
    cluster's CPUs). The same `num_workers` gives the same shards, and fingerprint, on
    either engine. `fn` raising stops the run with an OptimizeError naming the input.
    `encryption` (e.g. `FernetEncryption(password)`) encrypts every shard whole; the manifest
    records its class and public state, and readers need the key (format/encryption.py).
    """
    started = time.perf_counter()
    if not callable(fn):
        raise TypeError(f"optimize: fn must be callable as fn(input), got {type(fn).__name__}")
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
    check_engine(engine, ray_address)
    encrypted = record(encryption)  # checks the object before any worker starts
    chunk = parse_size(chunk_bytes)
    tokenizer = as_tokenizer(tokenizer, where="optimize: tokenizer=") if tokenizer is not None else None
    tok_fp = tokenizer.fingerprint() if tokenizer is not None else None
    # the token dtype a tokenizer fixes; without one it follows the ids (widened per shard)
    declared = token_dtype(tokenizer.vocab_size) if tokenizer is not None else None
    header = Manifest(kind=kind, shards=[], dtype=declared if kind == "tokens" else None, tokenizer=tok_fp,
                      eos_id=tokenizer.eos_id if tokenizer is not None else None,
                      vocab_size=tokenizer.vocab_size if tokenizer is not None else None, encryption=encrypted)
    with engine_session(engine, ray_address, num_workers) as workers:
        # under the output's lock: an append is checked against the dataset (fields, and that the key
        # opens its shards) before anything is written; appended shards take the dataset's salt
        output = open_output(output_dir, mode, Incoming(header, encryption), wait=wait, storage_options=storage_options)
        encryption = output.encryption
        encrypted = record(encryption)
        run_id = time.strftime("%Y%m%d%H%M%S") + "-" + uuid.uuid4().hex[:6]
        previous = output.previous  # an append without a tokenizer writes at least the dataset's width
        dtype = declared or (previous.dtype if previous is not None and previous.dtype else "uint16")
        # Ray tasks writing to object storage upload from their own node; everything else
        # writes to output.folder (a shared folder for a multi-node cluster).
        remote = engine == "ray" and output.is_remote
        job = _Job(
            fn, _split_tasks(inputs, 4 * max(workers, 1)), None if remote else output.folder, run_id, kind, dtype,
            chunk, chunk_size, compression, (output.display, storage_options) if remote else None, encryption,
        )
        results: dict[int, _TaskResult] = {}
        upload = None if remote else output.upload  # a store's output sends each task's shards now, from here

        def done(task_id: int, result: _TaskResult) -> None:
            results[task_id] = result
            if upload is not None:
                upload(result.shards)

        try:
            counters = ("docs", "tokens") if kind == "tokens" else ("items",)  # the bar shows these counts
            run_tasks(Tasks(partial(_run_task, job), len(job.tasks), done, counters=counters), engine=engine, workers=workers,
                      ray_address=ray_address, desc="optimize", progress=progress)
            shards = _join_tails(job, results, output, upload)
            layout = common_layout(len(job.tasks), results) if kind == "items" else None
            manifest = Manifest(
                kind=kind,
                shards=shards,
                dtype=_widest_dtype(shards, dtype) if kind == "tokens" else None,
                tokenizer=tok_fp,
                eos_id=tokenizer.eos_id if tokenizer is not None else None,
                vocab_size=tokenizer.vocab_size if tokenizer is not None else None,
                sources=sources or [],
                item_layout=layout,
                tokenizer_backend=tokenizer.backend if tokenizer is not None else None,
                encryption=encrypted,
            )
            output.commit(manifest)  # an append is checked again there, with the item layout and dtype
        except BaseException as e:
            output.abort(run_id)
            explained = output.explain(e)
            if explained is e:
                raise
            raise explained from e
        finally:
            output.release()
    summary = OptimizeSummary(
        output_dir=output.display,
        documents=sum(s.documents for s in shards),
        tokens=sum(s.tokens for s in shards),
        items=sum(s.items for s in shards),
        shards=len(shards),
        bytes=sum(s.bytes for s in shards),
        seconds=time.perf_counter() - started,
    )
    for result in results.values():
        for key, value in result.stats.items():
            summary.stats[key] = summary.stats.get(key, 0) + value
    if progress:
        print(summary.line(), file=sys.stderr)
    return summary


def _join_tails(job: _Job, results: dict[int, _TaskResult], output: Output, upload: Any) -> list[ShardInfo]:
    """Every shard in input order, the tasks' small tails joined and written here (then uploaded if remote)."""
    folder = job.folder if job.folder is not None else Path(tempfile.mkdtemp(prefix="llm-optimize-tails-"))
    try:
        def new_writer(task_id: int) -> Any:
            return tail_writer(job.kind, folder, f"{SHARD_PREFIX}{job.run_id}-{task_id:05d}-joined", job.dtype,
                               job.chunk_bytes, job.chunk_size, job.compression, job.encryption)

        shards = join_tails([(results[t].shards, results[t].tail) for t in range(len(job.tasks))], new_writer)
        written = {s.file for r in results.values() for s in r.shards}
        joined = [s for s in shards if s.file not in written]
        if joined and job.upload_to is not None:  # Ray to s3://: the tasks uploaded theirs, these go from here
            _upload(job.upload_to, folder, joined)
        elif joined and upload is not None:  # s3:// with local workers: staged in output.folder, sent by it
            upload(joined)
        return shards
    finally:
        if job.folder is None:
            shutil.rmtree(folder, ignore_errors=True)


def _widest_dtype(shards: list[ShardInfo], default: str) -> str:
    return "uint32" if any(s.dtype == "uint32" for s in shards) else default
