"""optimize() into object storage: shards are written to a local staging folder, checked and
uploaded as their task completes, and the manifest is written last, so a reader sees the previous
dataset or the new one, never a half-written one. One writer at a time (a lock object)."""

from __future__ import annotations

import json
import shutil
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from llm.data.shards.format.checksum import checksum_file
from llm.data.shards.format.manifest import INDEX_NAME, Manifest, ShardInfo
from llm.data.shards.format.reader import ShardError
from llm.data.shards.prepare.output_base import SHARD_PREFIX, Output
from llm.data.storage.lock import LOCK_NAME
from llm.data.storage.objects import open_objects
from llm.data.storage.paths import Location
from llm.data.storage.remote_lock import RemoteLock
from llm.data.storage.s3 import BucketNotFound, ObjectNotFound, StorageError


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
        self.lock = RemoteLock(self.objects, wait=wait)
        self.lock.acquire()
        try:
            self._check_mode()
        except BaseException:
            self.lock.release()
            raise
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
