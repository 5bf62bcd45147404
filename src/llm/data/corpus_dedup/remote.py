"""An output in object storage (s3://, gs://, az://): nodes that share no disk run one dedup through the store.

Every file of the work folder and the output is an object under the output prefix, with the
local layout (`.dedup-work/scan/00003/sig.u32`, `dedup.json`, ...). A task runs on a node's own
disk: it fetches the committed objects it reads into a scratch copy of the output
(`$LLM_DEDUP_SCRATCH`, else the temp folder, `/llm-dedup-<output>-<plan>/`), runs the stage's usual
code there, and commits what it made by PUTs. Object stores have no rename, but a PUT is whole
or absent: a file is one object, and a scan folder's files go first and its `meta.json` last,
so a present `meta.json` means a complete folder. Committed objects never change within a run
(`<run>` hashes the output and the plan), so a node keeps what it fetched for its later tasks:
the band tasks of a node read each scan file once; each work object's sha256 is put before it and
checked when fetched (DIGEST). Those scratch copies are deleted on every node when the run finishes,
here by a rerun that finds it finished, and by --overwrite (a run killed and never run again leaves its copies).

A killed task is retried (Ray) and writes the same objects again; a killed driver's rerun
lists what is committed and goes on. One writer at a time: the lock object `.llm-data.lock`
created only if absent (storage/remote_lock.py), as datasets in object storage are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm.data.corpus_dedup.commit import kill_point
from llm.data.corpus_dedup.place import DONE_NAME, WORK_NAME
from llm.data.storage.lock import LOCK_NAME
from llm.data.storage.object_files import list_objects
from llm.data.storage.objects import download, open_objects
from llm.data.storage.paths import Location, parse_location
from llm.data.storage.s3 import ObjectNotFound, S3Objects

SCRATCH_VARIABLE = "LLM_DEDUP_SCRATCH"
MARKER = "meta.json"  # a scan folder's file committed last
# Each work object's sha256, put before it: an object changed or damaged in the store after its commit (a later
# stage reads it, maybe on a rerun days later) is a named error, never wrong output. Only the work folder's: the
# output's files are read by nothing here, and it holds what a local run's does.
DIGEST = ".sha256"


class CommittedObjectChanged(ValueError):
    """A committed work object is not the bytes its digest says: changed or damaged in the store."""
_THREADS = 8  # objects moved at once (each a request: the store's latency, not the bandwidth, bounds one)


def scratch_root() -> Path:
    """The node's folder for scratch copies (read on the node: each node may set its own)."""
    return Path(os.environ.get(SCRATCH_VARIABLE) or tempfile.gettempdir())


@dataclass
class RemotePlace:
    """The output prefix in an object store; picklable, so a Ray task rebuilds its client on its node."""

    objects: S3Objects
    run: str = ""  # the scratch copies' name: a hash of the output and the plan (set once the plan is known)
    listing: dict[str, int] | None = field(default=None, repr=False, compare=False)  # the driver's, until refresh()
    remote = True

    def __getstate__(self) -> dict:
        return {**self.__dict__, "listing": None}  # a task lists for itself; the driver's may be long

    def __str__(self) -> str:
        return self.objects.url()

    @property
    def out(self) -> Path:
        return self.root

    @property
    def root(self) -> Path:
        """This node's scratch copy of the output."""
        return scratch_root() / f"llm-dedup-{self.run or self._output_hash}"

    @property
    def _output_hash(self) -> str:
        return hashlib.sha256(self.objects.url().encode()).hexdigest()[:16]

    def for_plan(self, plan: dict) -> RemotePlace:
        # `<output>-<plan>`: --overwrite finds the copies of this output's earlier runs (of any plan) by the first part
        digest = hashlib.sha256((self.objects.url() + json.dumps(plan, sort_keys=True)).encode()).hexdigest()[:16]
        return dataclasses.replace(self, run=f"{self._output_hash}-{digest}", listing=None)

    # -- the driver's view ----------------------------------------------------------------------
    def names(self) -> dict[str, int]:
        """Every object under the prefix, relative name -> size (one listing, kept until `refresh`)."""
        if self.listing is None:
            prefix = self.objects.key("")
            self.listing = {o.key[len(prefix):]: o.size for o in list_objects(self.objects.config, prefix)}
        return self.listing

    def refresh(self) -> None:
        """Forget the listing: tasks (or the driver) committed since."""
        self.listing = None

    def has(self, rel: str) -> bool:
        return rel in self.names()

    def has_any(self, rel: str) -> bool:
        return any(n.startswith(rel + "/") for n in self.names())

    def entries(self) -> list[str]:
        return sorted({n.split("/", 1)[0] for n in self.names() if n != LOCK_NAME})

    def read_bytes(self, rel: str) -> bytes:
        data = self.objects.get(rel)
        if rel.startswith(WORK_NAME + "/"):  # the plan: checked as a task checks what it fetches
            self._check(rel, hashlib.sha256(data).hexdigest())
        return data

    def clear(self) -> None:
        """Empty the prefix for --overwrite (the lock stays: we hold it); a kill part way: the rerun clears the rest."""
        self._delete([n for n in self.names() if n != LOCK_NAME], "overwrite")
        # and this node's copies of the runs replaced: a killed one (of this plan or another) would go stale here
        for copy in scratch_root().glob(f"llm-dedup-{self._output_hash}-*"):
            shutil.rmtree(copy, ignore_errors=True)

    def drop(self, rel: str, point: str | None = None) -> None:
        self._delete([n for n in self.names() if n == rel or n.startswith(rel + "/")], point)

    def sweep(self) -> None:
        """A finished run found at the start: its scratch copy here is garbage (a kill before `sweep_nodes` left it)."""
        if self.has(DONE_NAME):
            _drop_scratch(self.run)

    def finish(self, keep_work: bool) -> None:
        """The plan is copied out of the work folder first (then the run is finished), then the work objects go."""
        if keep_work:
            return
        self.objects.put(DONE_NAME, self.read_bytes(f"{WORK_NAME}/plan.json"))
        self.refresh()
        kill_point("cleanup:plan")
        self.drop(WORK_NAME, "cleanup")

    def _delete(self, rels: list[str], point: str | None = None) -> None:
        """Delete objects; `point`: the kill point after the first went (a deletion cut short)."""
        if rels and point:
            self.objects.delete(rels[0])
            kill_point(point)
            rels = rels[1:]
        with ThreadPoolExecutor(_THREADS) as pool:
            list(pool.map(self.objects.delete, rels))
        self.refresh()

    # -- a node's copy --------------------------------------------------------------------------
    def fetch(self, rels: Iterable[str]) -> None:
        """Bring committed objects into this node's copy (those already there were fetched or made whole here)."""
        todo = [rel for rel in rels if not (self.root / rel).is_file()]
        with ThreadPoolExecutor(_THREADS) as pool:
            list(pool.map(self._fetch_one, todo))

    def _fetch_one(self, rel: str) -> None:
        """Download a committed work object, checked against the digest put before it (DIGEST's comment)."""
        final = self.root / rel
        final.parent.mkdir(parents=True, exist_ok=True)
        # other tasks of this node see it whole or not at all, and only once its digest is checked
        download(self.objects, rel, final, final.with_name(f".{final.name}.part-{os.getpid()}-{id(final)}"),
                 verify=lambda sha256: self._check(rel, sha256))

    def _check(self, rel: str, sha256: str) -> None:
        """Refuse a work object whose bytes are not those its digest object names."""
        try:
            committed = self.objects.get(rel + DIGEST).decode()
        except ObjectNotFound:
            committed = None
        if committed != sha256:
            raise CommittedObjectChanged(
                f"{self.objects.url(rel)} is not the object this dedup run committed (its sha256 "
                f"{'is not there' if committed is None else 'differs'}: changed or damaged in the store); "
                "pass overwrite=True (CLI: --overwrite) to start over")

    def publish(self, rel: str) -> None:
        """Commit a file or folder of this node's copy: a folder's files first, its `meta.json` last."""
        path = self.root / rel
        self.refresh()
        if not path.is_dir():
            self._put(path)
            return
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        first = [p for p in files if p.name != MARKER]
        with ThreadPoolExecutor(_THREADS) as pool:
            list(pool.map(self._put, first))
        kill_point("upload")  # the folder's files are there, its marker not yet: the folder does not count
        for p in files:
            if p.name == MARKER:
                self._put(p)

    def _put(self, path: Path) -> None:
        """A file of this node's copy to its object; a work file's digest first (a later fetch checks it)."""
        rel = path.relative_to(self.root).as_posix()
        if rel.startswith(WORK_NAME + "/"):
            digest = hashlib.sha256()
            with open(path, "rb") as f:  # hashlib.file_digest: Python 3.11
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            self.objects.put(rel + DIGEST, digest.hexdigest().encode())
        self.objects.put(rel, path)

    def stage(self, task: Any, needs: tuple[tuple[str, ...], ...] = ((),),
              makes: tuple[tuple[str, ...], ...] = ((),)) -> Staged:
        return Staged(task, self, needs, makes)


@dataclass(frozen=True)
class Staged:
    """A stage's task run against the store: fetch what task `i` reads (`needs[i]`), run it in this node's
    copy, commit what it made (`makes[i]`). One entry in `needs`/`makes` serves every task."""

    task: Any
    place: RemotePlace
    needs: tuple[tuple[str, ...], ...]
    makes: tuple[tuple[str, ...], ...]

    def __call__(self, task_id: int, report: Any) -> Any:
        root = self.place.root
        makes = self.makes[task_id if len(self.makes) > 1 else 0]
        for rel in makes:  # made anew: a copy here may hold only the files a later stage's task fetched (a rerun)
            if (root / rel).is_dir():
                shutil.rmtree(root / rel, ignore_errors=True)
            else:
                (root / rel).unlink(missing_ok=True)
        self.place.fetch(self.needs[task_id if len(self.needs) > 1 else 0])
        fields = {f.name for f in dataclasses.fields(self.task)}
        moved = {"work": root / WORK_NAME, **({"output": root} if "output" in fields else {})}
        result = dataclasses.replace(self.task, **moved)(task_id, report)
        for rel in makes:
            self.place.publish(rel)
            if not rel.startswith(WORK_NAME):  # a kept-records file: no later task reads it here
                (root / rel).unlink(missing_ok=True)
        return result


def remote_output(output: str, storage_options: dict | None) -> RemotePlace | None:
    """The place of an object-store output URL, or None for a local folder (a `local:` folder is refused)."""
    if "://" not in output and not output.startswith("local:"):
        return None
    location = parse_location(output)
    if not location.is_object_store:
        if location.kind == "local":
            raise ValueError(f"output {output}: dedup writes a folder (give its path) or s3://, gs://, az://")
        return None
    if not location.path:
        raise ValueError(f"output {output}: give a prefix inside the {location.bucket} bucket (e.g. {output.rstrip('/')}/clean)")
    objects = open_objects(location, storage_options)
    assert isinstance(objects, S3Objects)
    return RemotePlace(objects)


def refuse_remote_overlap(inputs: list[str], output: Location, what: str = "dedup output") -> None:
    """An input URL inside the output prefix, or an input prefix holding the output, refused in one sentence."""
    for pattern in inputs:
        if "://" not in pattern:
            continue
        try:
            loc = parse_location(pattern.split("*")[0].split("?")[0].split("[")[0].rstrip("/") or pattern)
        except ValueError:
            continue
        if (loc.kind, loc.bucket) != (output.kind, output.bucket):
            continue
        magic = any(c in pattern for c in "*?[")  # a glob may reach below its fixed part: its bare prefix counts
        inside = loc.path == output.path or loc.path.startswith(output.path + "/")
        holds = not loc.path or output.path.startswith(loc.path + ("" if magic else "/"))
        if inside:
            raise ValueError(f"input {pattern} is inside the output {output}; write the {what} elsewhere or narrow the input")
        if holds:
            raise ValueError(f"input {pattern} contains the output {output}; write the {what} elsewhere")


@contextmanager
def remote_lock(place: RemotePlace, wait: bool) -> Iterator[None]:
    from llm.data.storage.remote_lock import RemoteLock

    lock = RemoteLock(place.objects, wait=wait, what="a dedup")
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def sweep_nodes(place: RemotePlace) -> None:
    """Delete the run's scratch copies: on every node of the Ray cluster this process is connected to, and here."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        from llm.data.jobs.ray import on_every_node

        try:
            on_every_node(_drop_scratch, place.run)
        except Exception as e:  # the run is finished and committed: a node lost meanwhile keeps its copy, nothing worse
            print(f"dedup: the scratch copies llm-dedup-{place.run} of some Ray node were not deleted "
                  f"({type(e).__name__}); delete them from its temp folder", file=sys.stderr)
    _drop_scratch(place.run)


def _drop_scratch(run: str) -> None:
    copy = scratch_root() / f"llm-dedup-{run}"
    if not copy.is_dir():
        return
    first = next(iter(sorted(copy.iterdir())), None)
    if first is not None:  # the kill point of a sweep cut short (its rerun sweeps the rest)
        shutil.rmtree(first, ignore_errors=True) if first.is_dir() else first.unlink(missing_ok=True)
        kill_point("sweep")
    shutil.rmtree(copy, ignore_errors=True)
