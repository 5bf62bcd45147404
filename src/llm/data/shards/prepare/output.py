"""The output of `optimize` and `merge_datasets`: a local folder or an object-store prefix. One writer at a
time (a lock), mode checks at start, the one append check, the append merge and the atomic commit (the
manifest last), or clean-up."""

from __future__ import annotations

import errno
import json
import shutil
import tempfile
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm.data.shards.format.checksum import checksum_bytes, checksum_file
from llm.data.shards.format.encryption import Encryption, EncryptionError, for_reading, key_opens
from llm.data.shards.format.manifest import INDEX_NAME, Manifest, ShardInfo, merge_backends
from llm.data.shards.format.reader import ShardError
from llm.data.shards.format.serializers import first_difference
from llm.data.storage.lock import LOCK_NAME, FolderLock
from llm.data.storage.objects import open_objects
from llm.data.storage.paths import Location, parse_location
from llm.data.storage.remote_lock import RemoteLock
from llm.data.storage.s3 import BucketNotFound, ObjectNotFound, StorageError

MODES = ("append", "overwrite")
SHARD_PREFIX = "shard-"

# What every shard of one dataset must share for a reader to read them as one (manifest key, how
# messages name it). `merge_datasets` compares its inputs on the same list.
SAME = (("kind", "kind"), ("tokenizer", "tokenizer"), ("dtype", "token dtype"), ("eos_id", "EOS id"),
        ("vocab_size", "vocabulary size"), ("item_layout", "item layout"), ("encryption", "encryption"))


def _words(key: str, value: Any) -> str:
    if value is None:
        return "none (plain shards)" if key == "encryption" else "none"  # said once, whichever side
    if key == "encryption":
        return str(value.get("class"))
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _state(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("class", "algorithm", "level")}


def first_mismatch(have: Manifest, new: Manifest, exact: bool = True) -> tuple[str, str, str] | None:
    """(field, `have`'s value, `new`'s value) for the first field of SAME on which the two differ, in words.

    `exact`: `new` describes shards as they are stored, so its encryption record (the salt too)
    must be `have`'s, and an item layout of None is a value (format v1 pickles); otherwise
    (optimize's header, before its shards are written with the dataset's own salt) only the class
    must agree, and a dtype or item layout of None is not known yet. An item layout of None in
    `new` is also what a run of no items has: it takes the dataset's.
    """
    for key, name in SAME:
        a, b = getattr(have, key), getattr(new, key)
        if key == "item_layout":
            if a is not None and b is not None and (diff := first_difference(a, b)) is not None:
                path, got, want = diff
                return name, f"{f'field {path!r}' if path else 'items'} as {want}", got
            if a is not None and b is None and exact and new.total_items:
                return name, "format v2 records", "none (format v1 pickles)"
            if a is None and b is not None and have.total_items:
                return name, "none (format v1 pickles)", "format v2 records"
            continue
        if key == "dtype" and b is None and not exact:  # not known before the run (token ids without a tokenizer)
            continue
        if key == "encryption" and a is not None and b is not None:
            if (a == b) if exact else (a.get("class") == b.get("class")):
                continue
            if a.get("class") == b.get("class"):  # one class, another public state (a salt): name the states
                return name, f"{a.get('class')} with {_state(a)}", f"with {_state(b)}"
        if a != b:
            return name, _words(key, a), _words(key, b)
    return None


@dataclass(frozen=True)
class Incoming:
    """What a run adds to a dataset, as the append check compares it with the dataset.

    `header`: the run's kind, tokenizer, dtype (None: known at the commit), EOS id, vocabulary,
    item layout (None: known at the commit) and encryption record. `key`: the encryption given,
    checked to open one of the dataset's shards. `copies`: the shards are copied as they are
    (merge), not written by this run. `whose`: how messages name the run ("this run's").
    """

    header: Manifest
    key: Encryption | None = None
    copies: bool = False
    whose: str = "this run's"


class Output(ABC):
    """What the local and the remote output share: the mode checks at start, the append check, the commit.

    Subclasses give `_entries()` (names in the output, its lock left out), `_current()` (the
    committed manifest, or None) and `_read(name)` (a file's bytes).
    """

    mode: str | None
    incoming: Incoming
    display: str  # the folder or URL, as messages name it
    label: str  # "output folder X" or "output URL": what is not empty
    folder: Path  # where shards are written: the dataset folder, or a local staging folder for a store
    # The dataset this run appends to (read under the lock at start), and the encryption its new
    # shards are written with: the key given, made for the dataset's salt when it has one.
    previous: Manifest | None = None
    encryption: Encryption | None = None

    @property
    @abstractmethod
    def is_remote(self) -> bool:
        """Whether the shards go to an object store (staged in `folder`, sent by `upload`)."""

    @abstractmethod
    def upload(self, shards: list[ShardInfo]) -> None:
        """Send shards staged in `folder` to where the dataset lives (at once or queued until the commit)."""

    @property
    def kind(self) -> str:
        return self.incoming.header.kind

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
        self.encryption = self.incoming.key
        if self.mode == "append":
            self.previous = self._current()
            if self.previous is not None:
                self.encryption = self.check_append(self.previous, self.incoming.header)

    def check_append(self, have: Manifest, new: Manifest, final: bool = False) -> Encryption | None:
        """The one append check: `new` (the run's header, or at the commit (`final`) its manifest) against `have`.

        Refuses in one sentence naming the field and both values; for an encrypted dataset, the
        key given must open one of its shards. Returns the encryption appended shards are written
        with. Called under the lock, before anything is written and again at the commit.
        """
        if have.kind == "items" and have.item_layout is None and have.total_items:
            raise ValueError(f"cannot append to {self.display}: its items are format v{have.format_version} pickles; "
                             "rebuild it with mode='overwrite' to use the item layout of format v2")
        found = first_mismatch(have, new, exact=final or self.incoming.copies)
        if found is not None:
            name, a, b = found
            hint = ("pass encryption= with its key" if name == "encryption" and have.encryption and not new.encryption
                    else "append only data made the same way, or write it to a new dataset")
            whose = self.incoming.whose
            if name == "item layout":
                raise ValueError(f"cannot append to {self.display}: its item layout has {a}, {whose} has {b}; {hint}")
            raise ValueError(f"cannot append to {self.display}: its {name} is {a}, {whose} is {b}; {hint}")
        if have.encryption is None:
            return self.incoming.key
        key = for_reading(have.encryption, self.incoming.key, self.display)
        if not (final and self.previous is not None and self.previous.encryption == have.encryption):
            self._check_key(have, key)  # at the commit, only when the dataset changed since the start
        return key

    def _check_key(self, have: Manifest, key: Encryption | None) -> None:
        """The key opens the dataset's smallest shard: appended shards under another key would read with none."""
        if key is None or not have.num_shards:
            return
        sizes = have.column("bytes")
        info = have.entries[int(sizes.argmin())]
        stored = self._read(info.file)
        if len(stored) != info.bytes or checksum_bytes(stored) != info.checksum:
            raise ShardError(f"shard {info.file} of {self.display} fails its size or checksum: the dataset is corrupt; "
                             "nothing was appended")
        if not key_opens(key, stored, info, have.kind):
            raise EncryptionError(f"cannot append to {self.display}: the {key.algorithm} key given does not open its "
                                  f"shards ({info.file} does not decrypt); pass the key or password it was made with")

    def _add_previous(self, manifest: Manifest) -> None:
        """Re-read under the lock: what we append to is what is there now, checked again with the run's content."""
        previous = self._current()
        if self.mode == "append" and previous is not None:
            self.check_append(previous, manifest, final=True)
            if manifest.item_layout is None:  # a run of no items keeps the dataset's layout
                manifest.item_layout = previous.item_layout
            manifest.shards = previous.shards + manifest.shards
            manifest.sources = previous.sources + manifest.sources
            manifest.tokenizer_backend = merge_backends(previous.tokenizer_backend, manifest.tokenizer_backend)


class OutputFolder(Output):
    """Holds the folder's lock from the mode checks to the commit, so two runs never interleave.

    Without it, two runs appending to one folder both commit, and each commit deletes the
    other's shards as orphans; under the lock the only shards not in the manifest are those
    of runs that died, which are safe to delete.
    """

    def __init__(self, folder: Path, mode: str | None, incoming: Incoming, wait: bool = False):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"output {folder} exists and is not a folder")
        self.folder, self.mode, self.incoming = folder, mode, incoming
        self.display, self.label = str(folder), f"output folder {folder}"
        self.created = not folder.exists()
        self.committed = False
        self._take(FolderLock(folder, wait=wait, what="an optimize"))

    @property
    def is_remote(self) -> bool:
        return False

    def _entries(self) -> list[str]:
        return [p.name for p in self.folder.iterdir() if p.name != LOCK_NAME]

    def _current(self) -> Manifest | None:
        return Manifest.load(self.folder) if (self.folder / INDEX_NAME).exists() else None

    def _read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()

    def upload(self, shards: list[ShardInfo]) -> None:
        """Nothing to send: the shards were written into the dataset folder itself."""

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

    def __init__(self, location: Location, mode: str | None, incoming: Incoming,
                 wait: bool = False, storage_options: dict | None = None):
        self.location, self.mode, self.incoming = location, mode, incoming
        self.objects = open_objects(location, storage_options)
        self.display = location.url()
        self.label = f"output {self.display}"
        self.committed = False
        self.uploaded: list[str] = []
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="llm-upload")
        self._pending: list[Future] = []
        self._take(RemoteLock(self.objects, wait=wait))
        self.folder = Path(tempfile.mkdtemp(prefix="llm-optimize-staging-"))

    @property
    def is_remote(self) -> bool:
        return True

    def _entries(self) -> list[str]:
        return [n for n in self.objects.list() if n != LOCK_NAME]

    def _read(self, name: str) -> bytes:
        return self.objects.get(name)

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


def open_output(output_dir: str | Path, mode: str | None, incoming: Incoming,
                wait: bool = False, storage_options: dict | None = None) -> Output:
    """The output of optimize() or merge_datasets(): a local folder (also for local:) or an s3://, gs:// or az://
    prefix, locked, its mode checked and, for an append, `incoming` checked against the dataset there."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} or None, got {mode!r}")
    location = parse_location(output_dir)
    if location.is_object_store:
        return RemoteOutput(location, mode, incoming, wait=wait, storage_options=storage_options)
    if storage_options:
        raise ValueError(f"storage_options apply to object-store outputs (s3://, gs://, az://) only, not {output_dir}")
    return OutputFolder(location.local_path(), mode, incoming, wait=wait)
