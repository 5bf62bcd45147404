"""The output of `optimize`: a local folder or an object-store prefix. One writer at a time (a lock),
mode checks at start, the append merge and the atomic commit (the manifest last), or clean-up."""

from __future__ import annotations

import errno
import json
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from llm.data.shards.format.checksum import checksum_file
from llm.data.shards.format.manifest import INDEX_NAME, Manifest, ShardInfo, merge_backends
from llm.data.shards.format.reader import ShardError
from llm.data.storage.lock import LOCK_NAME, FolderLock
from llm.data.storage.objects import open_objects
from llm.data.storage.paths import Location, parse_location
from llm.data.storage.remote_lock import RemoteLock
from llm.data.storage.s3 import BucketNotFound, ObjectNotFound, StorageError

MODES = ("append", "overwrite")
SHARD_PREFIX = "shard-"


class Output:
    """What the local and the remote output share: the mode checks at start, the append merge at commit.

    Subclasses give `_entries()` (names in the output, its lock left out) and `_current()` (the
    committed manifest, or None).
    """

    mode: str | None
    kind: str
    tokenizer: dict | None
    display: str  # the folder or URL, as messages name it
    label: str  # "output folder X" or "output URL": what is not empty

    def _take(self, lock: FolderLock | RemoteLock) -> None:
        """Hold the output's lock, then check the mode (the lock goes if the check fails)."""
        self.lock = lock
        lock.acquire()
        try:
            self._check_mode()
        except BaseException:
            lock.release()
            raise

    def _check_mode(self) -> None:
        if self._entries() and self.mode is None:
            raise ValueError(f"{self.label} is not empty; pass mode='append' or mode='overwrite' (CLI: --mode)")
        previous = self._current()
        if self.mode == "append" and previous is not None:
            self._check_append(previous)

    def _check_append(self, prev: Manifest) -> None:
        if prev.kind != self.kind:
            raise ValueError(f"cannot append {self.kind} to {self.display}, which holds {prev.kind}")
        if prev.tokenizer and self.tokenizer and prev.tokenizer != self.tokenizer:
            raise ValueError(
                f"cannot append to {self.display}: it was tokenized with {prev.tokenizer}, this run uses {self.tokenizer}"
            )

    def _add_previous(self, manifest: Manifest) -> None:
        """Re-read under the lock: what we append to is what is there now, not what we saw at start."""
        previous = self._current()
        if self.mode == "append" and previous is not None:
            self._check_append(previous)
            manifest.shards = previous.shards + manifest.shards
            manifest.sources = previous.sources + manifest.sources
            manifest.tokenizer_backend = merge_backends(previous.tokenizer_backend, manifest.tokenizer_backend)


class OutputFolder(Output):
    """Holds the folder's lock from the mode checks to the commit, so two runs never interleave.

    Without it, two runs appending to one folder both commit, and each commit deletes the
    other's shards as orphans; under the lock the only shards not in the manifest are those
    of runs that died, which are safe to delete.
    """

    def __init__(self, folder: Path, mode: str | None, kind: str, tokenizer: dict | None, wait: bool = False):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"output {folder} exists and is not a folder")
        self.folder, self.mode, self.kind, self.tokenizer = folder, mode, kind, tokenizer
        self.display, self.label = str(folder), f"output folder {folder}"
        self.created = not folder.exists()
        self.committed = False
        self._take(FolderLock(folder, wait=wait, what="an optimize"))

    def _entries(self) -> list[str]:
        return [p.name for p in self.folder.iterdir() if p.name != LOCK_NAME]

    def _current(self) -> Manifest | None:
        return Manifest.load(self.folder) if (self.folder / INDEX_NAME).exists() else None

    def commit(self, manifest: Manifest) -> None:
        self._add_previous(manifest)
        manifest.save(self.folder)
        self.committed = True
        self._remove_unlisted(manifest)

    def _remove_unlisted(self, manifest: Manifest) -> None:
        """Old shards after an overwrite, and orphans of runs that died before their commit.

        Safe only because we hold the lock: no other live run can be writing shards here.
        """
        listed = {s.file for s in manifest.shards}
        for path in self.folder.glob(f"{SHARD_PREFIX}*.bin"):
            if path.name not in listed:
                path.unlink(missing_ok=True)

    def abort(self, run_id: str) -> None:
        """Remove this run's shards (never after its manifest was committed): the previous dataset stays."""
        if self.committed:
            return
        for path in self.folder.glob(f"{SHARD_PREFIX}{run_id}-*"):
            path.unlink(missing_ok=True)
        if self.created:
            shutil.rmtree(self.folder, ignore_errors=True)

    def explain(self, error: BaseException) -> BaseException:
        """A disk-full error as one sentence naming the output; other errors as they are."""
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            state = "is unchanged" if not self.created else "was not created"
            return OSError(error.errno, f"no space left on the device of {self.folder} while writing shards; "
                                        f"optimize stopped and the dataset there {state}")
        return error

    def release(self) -> None:
        self.lock.release()


class RemoteOutput(Output):
    """Same interface as OutputFolder; `folder` is the local staging folder the workers write to."""

    def __init__(self, location: Location, mode: str | None, kind: str, tokenizer: dict | None,
                 wait: bool = False, storage_options: dict | None = None):
        self.location, self.mode, self.kind, self.tokenizer = location, mode, kind, tokenizer
        self.objects = open_objects(location, storage_options)
        self.display = location.url()
        self.label = f"output {self.display}"
        self.committed = False
        self.uploaded: list[str] = []
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="llm-upload")
        self._pending: list[Future] = []
        self._take(RemoteLock(self.objects, wait=wait))
        self.folder = Path(tempfile.mkdtemp(prefix="llm-optimize-staging-"))

    def _entries(self) -> list[str]:
        return [n for n in self.objects.list() if n != LOCK_NAME]

    def _current(self) -> Manifest | None:
        try:
            raw = self.objects.get(INDEX_NAME)
        except BucketNotFound:
            raise
        except ObjectNotFound:
            return None
        return Manifest.from_json(json.loads(raw), self.objects.url(INDEX_NAME))  # type: ignore[arg-type]

    def upload(self, shards: list[ShardInfo]) -> None:
        """Queue a finished task's shards: each is checked against its ShardInfo, sent, then removed locally."""
        for info in shards:
            self._pending.append(self._pool.submit(self._send, info))

    def _send(self, info: ShardInfo) -> None:
        path = self.folder / info.file
        size = path.stat().st_size
        actual = checksum_file(path)
        if size != info.bytes or actual != info.checksum:
            raise ShardError(f"staged shard {path} changed before upload ({size} bytes, {actual}); optimize stopped")
        self.objects.put(info.file, path)
        self.uploaded.append(info.file)
        path.unlink()

    def _drain(self) -> None:
        for future in self._pending:
            future.result()
        self._pending = []

    def commit(self, manifest: Manifest) -> None:
        self._drain()
        self._add_previous(manifest)
        present = self.objects.list()
        for info in manifest.shards:  # every listed shard is in the store, whole, before the manifest names it
            if present.get(info.file) != info.bytes:
                raise StorageError(f"shard {self.objects.url(info.file)} is missing or has {present.get(info.file)} bytes "
                                   f"instead of {info.bytes} after upload; the dataset at {self.display} is unchanged")
        self.objects.put(INDEX_NAME, json.dumps(manifest.to_json(), indent=1).encode())
        self.committed = True
        listed = {s.file for s in manifest.shards}
        for name in present:  # old shards after an overwrite; orphans of runs that died (we hold the lock)
            if name.startswith(SHARD_PREFIX) and name.endswith(".bin") and name not in listed:
                self.objects.delete(name)

    def abort(self, run_id: str) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.committed:
            return
        for name in self.objects.list():
            if name.startswith(f"{SHARD_PREFIX}{run_id}-"):
                self.objects.delete(name)

    def explain(self, error: BaseException) -> BaseException:
        return error

    def release(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.lock.release()


def open_output(output_dir: str | Path, mode: str | None, kind: str, tokenizer: dict | None,
                wait: bool = False, storage_options: dict | None = None):
    """The output of optimize(): a local folder (also for local:) or an s3://, gs:// or az:// prefix."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} or None, got {mode!r}")
    location = parse_location(output_dir)
    if location.is_object_store:
        return RemoteOutput(location, mode, kind, tokenizer, wait=wait, storage_options=storage_options)
    if storage_options:
        raise ValueError(f"storage_options apply to object-store outputs (s3://, gs://, az://) only, not {output_dir}")
    return OutputFolder(location.local_path(), mode, kind, tokenizer, wait=wait)
