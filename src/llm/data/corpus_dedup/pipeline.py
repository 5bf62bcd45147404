"""`dedup_corpus`: the stages in order, on the local or the Ray engine, resumed from what is committed.

Stages (each commits atomically under `OUTPUT/.dedup-work/`, see commit.py):
plan (inputs, their stamps, the parameters) -> scan per input -> exact merge ->
one band task per LSH band (near only) -> clusters -> write per input -> removed
list -> `dedup.json`, then the work folder goes. A rerun of a killed run finds the
plan, checks it asks for the same thing (same inputs, unchanged, same parameters)
and does only what was not committed yet; the result is byte for byte the same.

The plan outlives the work folder as `OUTPUT/.dedup-plan.json`: it is moved there first
(one rename), then the work folder is renamed aside and deleted. So a finished run is
known by its plan, and a rerun of the same command (`optimize --dedup` killed after this
stage, or a kill while the work folder was being deleted) finishes at once instead of
finding an output that is "not empty".

The output is a place (place.py): a local folder, or an s3://, gs:// or az:// prefix
(remote.py), where each task fetches what it reads to its node's disk and commits by PUT.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from llm.data.corpus_dedup.bands import BandTask, band_file
from llm.data.corpus_dedup.clusters import REMOVED_ROW, ClusterTask
from llm.data.corpus_dedup.commit import kill_point, write_json
from llm.data.corpus_dedup.exact import ExactTask
from llm.data.corpus_dedup.minhash import ENGINES, resolve_engine
from llm.data.corpus_dedup.output import (
    REMOVED_NAME,
    REPORT_NAME,
    RESERVED,
    Lines,
    WriteTask,
    open_removed,
    removed_in_file,
    write_removed_list,
)
from llm.data.corpus_dedup.params import DedupParams
from llm.data.corpus_dedup.place import DONE_NAME, TRASH_NAME, WORK_NAME, LocalPlace
from llm.data.corpus_dedup.records import describe, output_names
from llm.data.corpus_dedup.remote import (
    RemotePlace,
    refuse_remote_overlap,
    remote_lock,
    remote_output,
    sweep_nodes,
)
from llm.data.corpus_dedup.scan import ScanTask
from llm.data.corpus_dedup.workdir import read_meta
from llm.data.inputs.listing import FileStamp, Input, expand_sources, refuse_inputs_in_output
from llm.data.jobs.tasks import Tasks, check_engine, progress_bar
from llm.data.storage.local import fsync_dir
from llm.data.storage.lock import FolderLock
from llm.data.storage.object_files import RemoteObject
from llm.data.storage.paths import parse_location

__all__ = ["DONE_NAME", "TRASH_NAME", "WORK_NAME", "DedupRunMismatch", "dedup_corpus"]
MERGE_ROWS = 1 << 21  # rows of all runs' read blocks together in a merge (~32-48 MB)


def dedup_corpus(
    inputs: str | list[str],
    output: str | Path,
    *,
    near: float | None = None,
    text_column: str = "text",
    engine: str = "local",
    num_workers: int | None = None,
    overwrite: bool = False,
    wait: bool = False,
    hash_algo: str = "sha256",
    ngram: int = 5,
    num_perm: int = 128,
    seed: int = 1,
    chunk_records: int = 50_000,
    minhash: str = "auto",
    ray_address: str | None = None,
    storage_options: dict | None = None,
    progress: bool = True,
    keep_work: bool = False,
) -> dict:
    """Remove exact (and with `near`, near-) duplicate records of a corpus; returns the `dedup.json` report.

    `inputs`: files, globs, folders or `s3://` URLs (what `optimize` reads). `output`: a
    local folder or an `s3://`, `gs://` or `az://` prefix (`storage_options` reach it, as the inputs), empty
    unless `overwrite` (or holding this same run, killed: it resumes). With a prefix, each task works in its
    node's scratch folder (`$LLM_DEDUP_SCRATCH`, else the temp folder) and commits to the store (remote.py).
    `keep_work` leaves `OUTPUT/.dedup-work` (signatures, candidate pairs) for inspection.
    `minhash`: the signing engine, `auto` (rensa when installed), `rensa` or `numpy` (minhash.py); the
    one used is recorded in the plan and the report, and a rerun must use the same one.
    """
    # exact only: no signatures, so an engine that is not installed does not matter (a bad name still does)
    engine_name = resolve_engine(minhash) if near is not None or minhash not in ENGINES else "numpy"
    params = DedupParams(near=near, text_column=text_column, hash_algo=hash_algo, ngram=ngram,
                         num_perm=num_perm, seed=seed, chunk_records=chunk_records, minhash=engine_name)
    check_engine(engine, ray_address)
    if num_workers is not None and (isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0):
        raise ValueError(f"num_workers must be a whole number >= 0, got {num_workers!r}")
    patterns = [str(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    remote = remote_output(str(output), storage_options)
    place: LocalPlace | RemotePlace
    if remote is not None:
        refuse_remote_overlap(patterns, parse_location(str(output)))
        place, lock = remote, remote_lock(remote, wait)
    else:
        out = Path(output)
        if out.exists() and not out.is_dir():
            raise ValueError(f"output {out} is a file, not a folder")
        # before the lock (which creates the folder) and before --overwrite empties it: an input inside the
        # output would be deleted, an output inside an input read back as input by a rerun
        refuse_inputs_in_output(patterns, out, "dedup output")
        place, lock = LocalPlace(out), FolderLock(out, wait=wait, what="a dedup")
    with lock:
        run = _Run(place, params, engine, num_workers, ray_address, progress, keep_work)
        return run.start(patterns, storage_options, overwrite)


class DedupRunMismatch(ValueError):
    """The output holds a dedup run (finished or not) of other inputs or parameters, or of inputs changed since."""


class _Run:
    """One dedup run over an output folder (the lock held by the caller)."""

    def __init__(self, place: LocalPlace | RemotePlace, params: DedupParams, engine: str, workers: int | None,
                 address: str | None, progress: bool, keep_work: bool = False):
        self.place, self.params = place, params
        self.engine, self.workers, self.address, self.progress = engine, workers, address, progress
        self.resumed: list[str] = []
        self.keep_work = keep_work

    @property
    def out(self) -> Path:
        return self.place.root  # the folder this process reads and writes: the output, or its scratch copy

    @property
    def work(self) -> Path:
        return self.place.root / WORK_NAME

    # -- the plan ------------------------------------------------------------------------------
    def start(self, patterns: list[str], storage_options: dict | None, overwrite: bool) -> dict:
        if overwrite:
            self.place.clear()
        inputs = expand_sources(patterns, storage_options)
        names = output_names(inputs)
        for name, path in zip(names, inputs):
            if name in RESERVED:  # names end in .jsonl: only the removed list can be hit (not dedup.json, nor the plan)
                raise ValueError(f"{describe(path)}: its kept records would be written to {name}, the name of "
                                 "the dedup report; rename the input")
        plan = {"parameters": self.params.record(), "inputs": [describe(p) for p in inputs],
                "stamps": [_stamp(p) for p in inputs], "outputs": names}
        if isinstance(self.place, RemotePlace):
            self.place = self.place.for_plan(plan)
        plan_rel = f"{WORK_NAME}/plan.json"
        self.place.sweep()
        if self.place.has(DONE_NAME):
            return self._done(json.loads(self._read(DONE_NAME)), plan)
        has_plan = self.place.has(plan_rel)
        if not has_plan and self.place.has_any(WORK_NAME):
            self.place.drop(WORK_NAME)  # killed before its plan was committed: nothing in it counts
        held = self.place.entries()
        if held and not has_plan:
            raise ValueError(f"output {self.place} is not empty (it holds {_listing(held)}); pass overwrite=True "
                             "(CLI: --overwrite) to replace its content")
        if held:
            self._check_same(json.loads(self._read(plan_rel)), plan)
            self.resumed.append("plan")
        else:
            write_json(self.out / plan_rel, plan)
            self.place.publish(plan_rel)
            kill_point("plan")
        self.inputs, self.names = tuple(inputs), tuple(names)
        self.sources = [describe(p) for p in inputs]
        return self._stages()

    def _read(self, rel: str) -> bytes:
        return self.place.read_bytes(rel)

    def _check_same(self, old: dict, new: dict, what: str = "an unfinished") -> None:
        if old.get("parameters") != new["parameters"] or old.get("inputs") != new["inputs"]:
            raise DedupRunMismatch(f"output {self.place} holds {what} dedup run of other inputs or parameters; "
                                   "rerun it as it was, or pass overwrite=True (CLI: --overwrite) to start over")
        for source, was, now in zip(new["inputs"], old.get("stamps", []), new["stamps"]):
            if was != now:
                raise DedupRunMismatch(f"{source}: input changed since the {what.split()[-1]} dedup run in {self.place} "
                                       "read it; pass overwrite=True (CLI: --overwrite) to start over")

    def _done(self, old: dict, plan: dict) -> dict:
        """A finished run of the same command: its report, once its files are checked to be there."""
        self._check_same(old, plan, "a finished")
        missing = [n for n in (*plan["outputs"], REMOVED_NAME, REPORT_NAME) if not self.place.has(n)]
        if missing:
            raise ValueError(f"output {self.place} holds a finished dedup run but {_listing(missing)} is missing; "
                             "pass overwrite=True (CLI: --overwrite) to run it again")
        if self.place.has_any(WORK_NAME):
            self.place.drop(WORK_NAME)  # killed after the plan moved out, before the work folder was deleted
        print(f"dedup: {self.place} already holds this run's result (its plan: {DONE_NAME})", file=sys.stderr)
        return json.loads(self._read(REPORT_NAME))

    # -- the stages ----------------------------------------------------------------------------
    def _stages(self) -> dict:
        p, n, place, w = self.params, len(self.inputs), self.place, WORK_NAME
        if place.has(REPORT_NAME):  # killed after the report, before the work folder went
            self.resumed.append("everything")
            self._say_resumed()
            return self._finish()
        with self._engine():
            scans = [f"{w}/scan/{i:05d}" for i in range(n)]
            todo = [i for i in range(n) if not place.has(f"{scans[i]}/meta.json")]
            self._note("scan", n - len(todo), n)
            task = ScanTask(self.work, self.inputs, p, tuple(todo), self._sync_each)
            self._run(place.stage(task, makes=tuple((scans[i],) for i in todo)), len(todo), "dedup: scan", "file",
                      single=self._single)
            self._sync_folders([self.work / "scan"], len(todo))
            place.fetch(f"{s}/meta.json" for s in scans)
            metas_read = [read_meta(self.work, i) for i in range(n)]
            chunks = [m["chunks"] for m in metas_read]
            utf8 = tuple(m.get("utf8") is True for m in metas_read)  # absent (an older scan): checked
            block = max(1024, MERGE_ROWS // max(1, sum(map(len, chunks))))
            runs = lambda stem: tuple(f"{scans[i]}/{stem}-{c:05d}.run" for i in range(n) for c in range(len(chunks[i])))  # noqa: E731
            metas = tuple(f"{s}/meta.json" for s in scans)
            sigs = tuple(f"{s}/sig.u32" for s in scans)
            exact = None
            if not place.has(f"{w}/exact.pairs"):
                etask = place.stage(ExactTask(self.work, n, block), ((*metas, *runs("exact")),), ((f"{w}/exact.pairs",),))
                exact = lambda: self._run(etask, 1, "dedup: exact", "stage", single=True)  # noqa: E731
            else:
                self.resumed.append("exact")
            # the exact merge (in this process) needs no band: on the local engine it runs while the workers band
            if exact is not None and (self.engine != "local" or p.near is None):
                exact()
                exact = None
            bands = [f"{w}/bands/{band_file(self.work, b).name}" for b in range(p.bands if p.near is not None else 0)]
            if p.near is not None:
                todo = [b for b in range(p.bands) if not place.has(bands[b])]
                self._note("bands", p.bands - len(todo), p.bands)
                task = BandTask(self.work, n, p.num_perm, block, tuple(todo), self._sync_each, tuple(map(tuple, chunks)))
                self._run(place.stage(task, ((*metas, *sigs, *runs("bands")),), tuple((bands[b],) for b in todo)),
                          len(todo), "dedup: bands", "band", single=self._single, meanwhile=exact)
                self._sync_folders([band_file(self.work, 0).parent], len(todo))
            if not place.has(f"{w}/removed.bin"):
                task = ClusterTask(self.work, n, p.bands if p.near is not None else 0, p.num_perm, p.near)
                needs = (f"{w}/exact.pairs", *bands, *(sigs if p.near is not None else ()))
                task = place.stage(task, (needs,), ((f"{w}/clusters.json", f"{w}/removed.bin"),))
                self._run(task, 1, "dedup: clusters", "stage", single=True)
            else:
                self.resumed.append("clusters")
            todo = [i for i in range(n) if not place.has(self.names[i])]
            self._note("write", n - len(todo), n)
            task = WriteTask(self.work, self.out, self.inputs, self.names, p.text_column, tuple(todo), self._sync_each, utf8)
            needs = tuple((f"{w}/removed.bin", f"{scans[i]}/lines.u64") for i in todo)
            # on a local output, this process writes the removed list while the workers write the kept records
            overlap = self.engine == "local" and not place.remote
            removed_list = lambda: self._removed_list(scans)  # noqa: E731
            self._run(place.stage(task, needs, tuple((self.names[i],) for i in todo)), len(todo), "dedup: write",
                      "file", single=self._single, meanwhile=removed_list if overlap else None)
            self._sync_folders(sorted({(self.out / self.names[i]).parent for i in todo}), len(todo))
            self._say_resumed()
            if not overlap:
                removed_list()
            write_json(self.out / REPORT_NAME, self._report())
            place.publish(REPORT_NAME)
            kill_point("report")
            return self._finish()  # in the engine's session: the nodes' scratch copies go through it

    def _removed_list(self, scans: list[str]) -> None:
        place, w = self.place, WORK_NAME
        place.fetch((f"{w}/removed.bin", f"{w}/clusters.json", *(f"{s}/lines.u64" for s in scans)))
        if not place.has(REMOVED_NAME):
            removed = open_removed(self.work, REMOVED_ROW)
            write_removed_list(self.out / REMOVED_NAME, removed, Lines(self.work, len(scans)), self.sources)
            place.publish(REMOVED_NAME)
        if not self.keep_work and not place.remote:
            # the scans' sorted runs and signatures: read by no later stage, nor by a rerun (the exact, band and
            # cluster stages' commits are there), and most of the work folder's bytes: deleted here, while the
            # workers write, not by the cleanup after them
            for scan in scans:
                for entry in os.scandir(self.out / scan):
                    if entry.name.endswith(".run") or entry.name == "sig.u32":
                        os.unlink(entry.path)

    @property
    def _sync_each(self) -> bool:
        """Whether each task fsyncs the folder of what it commits (Ray: its nodes' own view of the folder).

        On the local engine the folders a stage commits into are fsynced once when it ends instead
        (~70 fsyncs fewer for 27 inputs), before any later stage or the report relies on them.
        """
        return self.engine == "ray" and not self.place.remote  # a node's scratch copy is no commit: the store is

    def _sync_folders(self, folders: list[Path], done: int) -> None:
        if done and not self._sync_each and not self.place.remote:
            for folder in folders:
                fsync_dir(folder)

    @property
    def _single(self) -> bool:
        """Objects in storage are read (or written) by this process on the local engine: obstore's runtime does not
        survive a fork."""
        return self.engine == "local" and (self.place.remote or any(isinstance(p, RemoteObject) for p in self.inputs))

    def _say_resumed(self) -> None:
        if self.resumed:
            print(f"dedup: resumed {self.place}: already committed: {', '.join(self.resumed)}", file=sys.stderr)

    def _note(self, stage: str, done: int, total: int) -> None:
        if done:
            self.resumed.append(f"{stage} {done}/{total}")

    def _report(self) -> dict:
        stats = json.loads((self.work / "clusters.json").read_text())
        removed = open_removed(self.work, REMOVED_ROW)
        files, total_in = [], 0
        for i, (source, name) in enumerate(zip(self.sources, self.names)):
            records = read_meta(self.work, i)["records"]
            gone = len(removed_in_file(removed, i))
            files.append({"input": source, "output": name, "records": records, "kept": records - gone})
            total_in += records
        return {
            "records_in": total_in,
            "exact_duplicates": stats["exact_duplicates"],
            "near_duplicates": stats["near_duplicates"],
            "near_duplicate_clusters": stats["near_duplicate_clusters"],
            "removed": len(removed),
            "kept": total_in - len(removed),
            "candidate_pairs": stats["candidate_pairs"],
            "verified_pairs": stats["verified_pairs"],
            "parameters": self.params.record(),
            "files": files,
            "removed_list": REMOVED_NAME,
        }

    def _finish(self) -> dict:
        """The work folder goes (place.py: a kill at any moment leaves a run that a rerun finishes)."""
        report = json.loads(self._read(REPORT_NAME))
        self.place.finish(self.keep_work)
        if isinstance(self.place, RemotePlace):
            # the stages' session; a rerun that found them done joins its cluster for this (a local one's nodes
            # are this machine: its scratch copy is the one here)
            join = self.engine == "ray" and self.address is not None
            with self._engine() if join else nullcontext():
                sweep_nodes(self.place)
        kill_point("done")
        return report

    # -- engines -------------------------------------------------------------------------------
    @contextmanager
    def _engine(self) -> Iterator[None]:
        if self.engine != "ray":
            self.pool = self.workers if self.workers is not None else (os.cpu_count() or 1)
            yield
            return
        from llm.data.jobs.ray import session

        with session(self.address, self.workers) as workers:
            self.pool = workers
            yield

    def _run(self, work: Callable[[int, Any], Any], count: int, desc: str, unit: str, single: bool = False,
             meanwhile: Callable[[], None] | None = None) -> None:
        """Run `count` tasks on the engine (`single`: in this process, on the local engine; `meanwhile`: this
        process's own work, done while the local engine's workers run)."""
        if not count:
            if meanwhile is not None:
                meanwhile()
            return
        tasks = Tasks(work=work, count=count, on_done=lambda task_id, result: None, unit=unit, counters=("records",),
                      keep_freed_memory=True)  # the scan's MinHash makes MBs of numpy temporaries per batch
        bar = progress_bar(count, desc, unit, self.progress)  # without progress, no tqdm import
        try:
            if self.engine == "ray":
                from llm.data.jobs.ray import run_ray

                run_ray(tasks, self.pool, None, bar)
            else:
                from llm.data.jobs.local import run_local

                run_local(tasks, 0 if single else min(self.pool, count), bar, meanwhile)
        finally:
            bar.close()
            self.place.refresh()  # what the tasks committed is listed again


def _stamp(path: Input) -> str:
    if isinstance(path, RemoteObject):
        return path.stamp()
    stamp = FileStamp.of(path)
    return f"{stamp.size}:{stamp.mtime_ns}:{stamp.edges}"


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")
