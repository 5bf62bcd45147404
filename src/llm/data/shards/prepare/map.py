"""map(): `fn(input, folder)` over inputs in parallel; each input's files land in the output at once, resumable.

Each input is one task. `fn` writes whatever it likes under the folder it is given (a
fresh staging folder); when it returns, the task moves those files into `output_dir`
(renames on a local disk, uploads for s3://), then writes the input's done-marker
(`output_dir/.llm-map/done/<key>`: `p-` and a hash of the pickled input, or `k-` and a
hash of the user's `key(input)`; markers of older runs, a hash of type and repr, still
count, see `_already_done`). A rerun skips the inputs with a marker, so a
crashed or failed run continues where it stopped, and an input's files appear only
after `fn` finished them.

For s3:// with the local engine the driver does the uploads: obstore's client runs on a
tokio runtime, which does not survive fork (a forked worker's upload would hang).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from llm.data.jobs import Tasks, check_engine, engine_session, run_tasks
from llm.data.shards.prepare.lightning_cloud import refuse_cloud_arguments
from llm.data.storage.paths import parse_location

STATE_DIR = ".llm-map"  # markers, staging folders and the lock, inside the output


class MapError(RuntimeError):
    """fn failed on an input; the message names the input."""


@dataclass
class MapSummary:
    output_dir: str
    inputs: int = 0
    done: int = 0  # inputs processed by this run
    skipped: int = 0  # inputs already done by an earlier run
    duplicates: int = 0  # inputs equal to (same key as) an earlier input of this run: done once
    files: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        dups = f", {self.duplicates:,} duplicates" if self.duplicates else ""
        return (f"map: {self.done:,} inputs done, {self.skipped:,} already done{dups}, {self.files:,} files "
                f"in {self.seconds:.1f} s -> {self.output_dir}")


KeyFn = Callable[[Any], "str | bytes"]


def input_key(value: Any, key: KeyFn | None = None) -> str:
    """The name of an input's done-marker: a hash of `key(value)`, else of the pickled value.

    Content, not repr: two arrays whose reprs are equal (numpy elides the middle) are two
    inputs, and an object whose repr holds its address keeps its key across runs. Raises
    TypeError when the value cannot be pickled (the caller names the input).
    """
    import xxhash

    if key is not None:
        given = key(value)
        if isinstance(given, str):
            given = given.encode("utf-8", "surrogatepass")
        if not isinstance(given, bytes):
            raise TypeError(f"key() returned {type(given).__name__}, expected str or bytes")
        return "k-" + xxhash.xxh3_128_hexdigest(given)
    # protocol 5 hands large buffers (numpy arrays) out of band: hashed in place, never copied
    buffers: list[pickle.PickleBuffer] = []
    digest = xxhash.xxh3_128(pickle.dumps(value, protocol=5, buffer_callback=buffers.append))
    for buffer in buffers:
        digest.update(buffer.raw())
    return "p-" + digest.hexdigest()


def legacy_key(value: Any) -> str:
    """The marker name of runs before content keys (a hash of type and repr), still honoured."""
    import xxhash

    return xxhash.xxh3_128_hexdigest(f"{type(value).__qualname__}:{value!r}".encode())


def _is_legacy(name: str) -> bool:
    return len(name) == 32 and "-" not in name


def _keys(inputs: list[Any], key: KeyFn | None) -> list[str]:
    """Every input's key, before any work starts: an input that cannot be keyed stops the run here."""
    keys = []
    for index, value in enumerate(inputs):
        try:
            keys.append(input_key(value, key))
        except Exception as e:  # pickling raises TypeError, PicklingError, AttributeError... by object
            if key is not None:
                raise MapError(f"map: key() failed on input {index} ({value!r:.80}): {type(e).__name__}: {e}") from e
            raise MapError(f"map: input {index} ({value!r:.80}) cannot be pickled to key its done-marker "
                           f"({type(e).__name__}: {e}); pass key=, a function giving each input a unique "
                           f"string, e.g. key=lambda x: x.name") from e
    return keys


def _already_done(inputs: list[Any], keys: list[str], done: set[str]) -> list[bool]:
    """Which inputs have a marker: their content key, or (folders from earlier versions) the
    repr key, taken only where that repr is unique among the inputs, so inputs it confused redo."""
    found = [k in done for k in keys]
    legacy = {name for name in done if _is_legacy(name)}
    if legacy:
        old = [legacy_key(v) for v in inputs]
        counts = Counter(old)
        found = [f or (k in legacy and counts[k] == 1) for f, k in zip(found, old)]
    return found


@dataclass(frozen=True)
class _MapJob:
    fn: Callable[[Any, str], Any]
    inputs: list[tuple[int, Any, str]]  # (index in the caller's list, input, key) of the inputs to do
    output: str  # a local folder or an s3:// URL
    storage_options: dict | None
    # s3:// with forked local workers: the object-store client (a tokio runtime) does not survive
    # fork, so tasks stage their files under this folder and the driver uploads them
    driver_uploads: str | None = None


@dataclass(frozen=True)
class _Staged:
    """An input's finished files, waiting in a staging folder for the driver to upload them."""

    folder: str
    files: list[str]
    key: str
    marker: bytes


def _files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def _run_input(job: _MapJob, task_id: int, report: Callable[[int, int], None]) -> int | _Staged:
    """One input: fn into a staging folder, then its files into the output, then the marker."""
    index, value, key = job.inputs[task_id]
    location = parse_location(job.output)
    local = not location.is_object_store
    if local:  # staging on the output's own filesystem: moving a file in is a rename
        root = location.local_path() / STATE_DIR / "tmp"
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{key[:12]}-", dir=root))
    else:
        staging = Path(tempfile.mkdtemp(prefix="llm-map-", dir=job.driver_uploads))
    handed_over = False
    try:
        try:
            job.fn(value, str(staging))
        except Exception as e:
            raise MapError(f"map: input {index} ({value!r:.80}) failed: {type(e).__name__}: {e}") from e
        files = _files_under(staging)
        marker = json.dumps({"input": f"{value!r:.200}", "index": index, "files": files}).encode()
        report(1, len(files))
        if local:
            _move_into(staging, location.local_path(), files, key, marker)
        elif job.driver_uploads:
            handed_over = True
            return _Staged(str(staging), files, key, marker)
        else:
            _upload(job, _Staged(str(staging), files, key, marker))
        return len(files)
    finally:
        if not handed_over:
            shutil.rmtree(staging, ignore_errors=True)


def _move_into(staging: Path, out: Path, files: list[str], key: str, marker: bytes) -> None:
    from llm.data.storage.local import atomic_write, fsync_dir

    for rel in files:
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, dest)  # a rerun after a crash here replaces these with the same files
    for parent in {(out / rel).parent for rel in files}:
        fsync_dir(parent)
    done = out / STATE_DIR / "done"
    done.mkdir(parents=True, exist_ok=True)
    atomic_write(done / key, marker)  # last: the input counts as done only once all its files are in place


def _upload(job: _MapJob, staged: _Staged) -> None:
    from llm.data.storage.objects import open_objects

    objects = open_objects(job.output, job.storage_options)
    for rel in staged.files:
        objects.put(rel, Path(staged.folder, rel))
    # last: the input counts as done only once all its files are uploaded
    open_objects(f"{job.output.rstrip('/')}/{STATE_DIR}/done", job.storage_options).put(staged.key, staged.marker)


def _done_keys(output: str, storage_options: dict | None) -> set[str]:
    location = parse_location(output)
    if location.is_object_store:
        from llm.data.storage.objects import open_objects

        return set(open_objects(f"{output.rstrip('/')}/{STATE_DIR}/done", storage_options).list())
    done = location.local_path() / STATE_DIR / "done"
    if not done.is_dir():
        return set()
    keys = set()
    for path in done.iterdir():
        if path.name.startswith("."):  # a marker's temporary file, left by a worker stopped mid-write
            path.unlink(missing_ok=True)
        else:
            keys.add(path.name)
    return keys


def _lock(output: str, storage_options: dict | None, wait: bool) -> Any:
    location = parse_location(output)
    if location.is_object_store:
        from llm.data.storage.objects import open_objects
        from llm.data.storage.remote_lock import RemoteLock

        lock: Any = RemoteLock(open_objects(f"{output.rstrip('/')}/{STATE_DIR}", storage_options), wait=wait,
                               what="a map")
    else:
        from llm.data.storage.lock import FolderLock

        lock = FolderLock(location.local_path() / STATE_DIR, wait=wait, what="a map")
    lock.acquire()
    return lock


@refuse_cloud_arguments  # LitData's num_nodes= / machine=: one sentence naming engine='ray'
def map(
    fn: Callable[[Any, str], Any],
    inputs: Sequence[Any],
    output_dir: str | Path,
    *,
    num_workers: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    progress: bool = True,
    storage_options: dict | None = None,
    wait: bool = False,
    key: KeyFn | None = None,
) -> MapSummary:
    """Call `fn(input, folder)` for every input, in `num_workers` processes (or Ray tasks).

    Files `fn` writes under `folder` end up at the same relative path in `output_dir` (a
    folder, or `s3://bucket/prefix`), all of an input's files once `fn` returned. A failure
    stops the run with a MapError naming the input; inputs finished before it stay done,
    and a rerun skips them. Inputs are told apart by content (a hash of the pickled value),
    or by `key(input)` (a str or bytes, unique per input) when given: an input that cannot
    be pickled, without `key=`, stops the run before any work with a MapError naming it.
    Equal inputs are one input (counted in `duplicates`). One run per output at a time:
    another one is refused, or waited for with `wait=True`. docs/items.md.
    """
    started = time.perf_counter()
    check_engine(engine, ray_address)
    if not callable(fn):
        raise TypeError(f"map: fn must be callable as fn(input, folder), got {type(fn).__name__}")
    if key is not None and not callable(key):
        raise TypeError(f"map: key must be callable as key(input) -> str, got {type(key).__name__}")
    if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0):
        raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
    inputs = list(inputs)
    keys = _keys(inputs, key)  # before anything is created or locked: an input that cannot be keyed stops here
    location = parse_location(output_dir)
    output = location.url() if location.is_object_store else str(location.local_path())
    if not location.is_object_store:
        if location.local_path().exists() and not location.local_path().is_dir():
            raise ValueError(f"output {output} exists and is not a folder")
        location.local_path().mkdir(parents=True, exist_ok=True)
    lock = _lock(output, storage_options, wait)
    uploads: str | None = None
    try:
        if not location.is_object_store:  # staging folders of an earlier run that died (we hold the lock)
            shutil.rmtree(location.local_path() / STATE_DIR / "tmp", ignore_errors=True)
        already = _already_done(inputs, keys, _done_keys(output, storage_options))
        todo, seen = [], set()
        summary = MapSummary(output, inputs=len(inputs))
        for index, (value, k, skip) in enumerate(zip(inputs, keys, already)):
            if skip:
                summary.skipped += 1
            elif k in seen:
                summary.duplicates += 1
            else:
                todo.append((index, value, k))
            seen.add(k)
        if location.is_object_store and engine == "local":
            uploads = tempfile.mkdtemp(prefix="llm-map-uploads-")
        job = _MapJob(fn, todo, output, storage_options, driver_uploads=uploads)

        def finished(task_id: int, result: int | _Staged) -> None:
            if isinstance(result, _Staged):
                try:
                    _upload(job, result)
                finally:
                    shutil.rmtree(result.folder, ignore_errors=True)
                result = len(result.files)
            summary.done += 1
            summary.files += result

        if todo:
            with engine_session(engine, ray_address, num_workers) as workers:
                run_tasks(Tasks(partial(_run_input, job), len(todo), finished, unit="input", counters=("inputs", "files")),
                          engine=engine, workers=min(workers, len(todo)), ray_address=ray_address, desc="map",
                          progress=progress)
    finally:
        if uploads:  # what a failed run staged but did not upload: its inputs have no marker and rerun
            shutil.rmtree(uploads, ignore_errors=True)
        lock.release()
    summary.seconds = time.perf_counter() - started
    if progress:
        print(summary.line(), file=sys.stderr)
    return summary
