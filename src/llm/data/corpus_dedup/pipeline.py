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
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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
from llm.data.corpus_dedup.records import describe, output_names
from llm.data.corpus_dedup.scan import ScanTask
from llm.data.corpus_dedup.workdir import read_meta, scan_dir
from llm.data.inputs.listing import FileStamp, Input, expand_sources, refuse_inputs_in_output
from llm.data.jobs.tasks import Tasks, check_engine, progress_bar
from llm.data.storage.local import fsync_dir
from llm.data.storage.lock import LOCK_NAME, FolderLock
from llm.data.storage.object_files import RemoteObject

WORK_NAME = ".dedup-work"
DONE_NAME = ".dedup-plan.json"  # the plan of a finished run, moved out of the work folder
TRASH_NAME = ".dedup-work.deleting"  # the work folder of a finished run, renamed aside to be deleted
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
    local folder, empty unless `overwrite` (or holding this same run, killed: it resumes).
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
    out = Path(output)
    if "://" in str(output):
        raise ValueError(f"output {output}: dedup writes a local folder; optimize its result to object storage")
    if out.exists() and not out.is_dir():
        raise ValueError(f"output {out} is a file, not a folder")
    patterns = [inputs] if isinstance(inputs, (str, Path)) else [str(p) for p in inputs]
    # before the lock (which creates the folder) and before --overwrite empties it: an input inside the
    # output would be deleted, an output inside an input read back as input by a rerun
    refuse_inputs_in_output([str(p) for p in patterns], out, "dedup output")
    with FolderLock(out, wait=wait, what="a dedup"):
        run = _Run(out, params, engine, num_workers, ray_address, progress, keep_work)
        return run.start([str(p) for p in patterns], storage_options, overwrite)


class DedupRunMismatch(ValueError):
    """The output holds a dedup run (finished or not) of other inputs or parameters, or of inputs changed since."""


class _Run:
    """One dedup run over an output folder (the lock held by the caller)."""

    def __init__(self, out: Path, params: DedupParams, engine: str, workers: int | None, address: str | None,
                 progress: bool, keep_work: bool = False):
        self.out, self.work, self.params = out, out / WORK_NAME, params
        self.engine, self.workers, self.address, self.progress = engine, workers, address, progress
        self.resumed: list[str] = []
        self.keep_work = keep_work

    # -- the plan ------------------------------------------------------------------------------
    def start(self, patterns: list[str], storage_options: dict | None, overwrite: bool) -> dict:
        if overwrite:
            _clear(self.out)
        inputs = expand_sources(patterns, storage_options)
        names = output_names(inputs)
        for name, path in zip(names, inputs):
            if name in RESERVED:  # names end in .jsonl: only the removed list can be hit (not dedup.json, nor the plan)
                raise ValueError(f"{describe(path)}: its kept records would be written to {name}, the name of "
                                 "the dedup report; rename the input")
        plan = {"parameters": self.params.record(), "inputs": [describe(p) for p in inputs],
                "stamps": [_stamp(p) for p in inputs], "outputs": names}
        plan_path = self.work / "plan.json"
        _remove_tree(self.out / TRASH_NAME)  # a deletion killed part way: garbage by construction (_finish)
        if (self.out / DONE_NAME).is_file():
            return self._done(json.loads((self.out / DONE_NAME).read_text()), plan)
        if self.work.is_dir() and not plan_path.is_file():
            shutil.rmtree(self.work)  # killed before its plan was committed: nothing in it counts
        held = [e.name for e in sorted(self.out.iterdir()) if e.name != LOCK_NAME]
        if held and not plan_path.is_file():
            raise ValueError(f"output {self.out} is not empty (it holds {_listing(held)}); pass overwrite=True "
                             "(CLI: --overwrite) to replace its content")
        if held:
            self._check_same(json.loads(plan_path.read_text()), plan)
            self.resumed.append("plan")
        else:
            write_json(plan_path, plan)
            kill_point("plan")
        self.inputs, self.names = tuple(inputs), tuple(names)
        self.sources = [describe(p) for p in inputs]
        return self._stages()

    def _check_same(self, old: dict, new: dict, what: str = "an unfinished") -> None:
        if old.get("parameters") != new["parameters"] or old.get("inputs") != new["inputs"]:
            raise DedupRunMismatch(f"output {self.out} holds {what} dedup run of other inputs or parameters; "
                                   "rerun it as it was, or pass overwrite=True (CLI: --overwrite) to start over")
        for source, was, now in zip(new["inputs"], old.get("stamps", []), new["stamps"]):
            if was != now:
                raise DedupRunMismatch(f"{source}: input changed since the {what.split()[-1]} dedup run in {self.out} "
                                       "read it; pass overwrite=True (CLI: --overwrite) to start over")

    def _done(self, old: dict, plan: dict) -> dict:
        """A finished run of the same command: its report, once its files are checked to be there."""
        self._check_same(old, plan, "a finished")
        missing = [n for n in (*plan["outputs"], REMOVED_NAME, REPORT_NAME) if not (self.out / n).is_file()]
        if missing:
            raise ValueError(f"output {self.out} holds a finished dedup run but {_listing(missing)} is missing; "
                             "pass overwrite=True (CLI: --overwrite) to run it again")
        if self.work.is_dir():
            shutil.rmtree(self.work)  # killed after the plan moved out, before the work folder was renamed aside
        print(f"dedup: {self.out} already holds this run's result (its plan: {DONE_NAME})", file=sys.stderr)
        return json.loads((self.out / REPORT_NAME).read_text())

    # -- the stages ----------------------------------------------------------------------------
    def _stages(self) -> dict:
        p, n = self.params, len(self.inputs)
        if (self.out / REPORT_NAME).is_file():  # killed after the report, before the work folder went
            self.resumed.append("everything")
            self._say_resumed()
            return self._finish()
        with self._engine():
            todo = [i for i in range(n) if not scan_dir(self.work, i).is_dir()]
            self._note("scan", n - len(todo), n)
            self._run(ScanTask(self.work, self.inputs, p, tuple(todo), self._sync_each), len(todo), "dedup: scan",
                      "file", single=self._remote)
            self._sync_folders([self.work / "scan"], len(todo))
            runs = sum(len(read_meta(self.work, i)["chunks"]) for i in range(n))
            block = max(1024, MERGE_ROWS // max(1, runs))
            if not (self.work / "exact.pairs").is_file():
                self._run(ExactTask(self.work, n, block), 1, "dedup: exact", "stage", single=True)
            else:
                self.resumed.append("exact")
            if p.near is not None:
                todo = [b for b in range(p.bands) if not band_file(self.work, b).is_file()]
                self._note("bands", p.bands - len(todo), p.bands)
                self._run(BandTask(self.work, n, p.num_perm, block, tuple(todo), self._sync_each), len(todo),
                          "dedup: bands", "band")
                self._sync_folders([band_file(self.work, 0).parent], len(todo))
            if not (self.work / "removed.bin").is_file():
                task = ClusterTask(self.work, n, p.bands if p.near is not None else 0, p.num_perm, p.near)
                self._run(task, 1, "dedup: clusters", "stage", single=True)
            else:
                self.resumed.append("clusters")
            todo = [i for i in range(n) if not (self.out / self.names[i]).is_file()]
            self._note("write", n - len(todo), n)
            task = WriteTask(self.work, self.out, self.inputs, self.names, p.text_column, tuple(todo), self._sync_each)
            self._run(task, len(todo), "dedup: write", "file", single=self._remote)
            self._sync_folders(sorted({(self.out / self.names[i]).parent for i in todo}), len(todo))
        self._say_resumed()
        removed = open_removed(self.work, REMOVED_ROW)
        if not (self.out / REMOVED_NAME).is_file():
            write_removed_list(self.out / REMOVED_NAME, removed, Lines(self.work, n), self.sources)
        write_json(self.out / REPORT_NAME, self._report())
        kill_point("report")
        return self._finish()

    @property
    def _sync_each(self) -> bool:
        """Whether each task fsyncs the folder of what it commits (Ray: its nodes' own view of the folder).

        On the local engine the folders a stage commits into are fsynced once when it ends instead
        (~70 fsyncs fewer for 27 inputs), before any later stage or the report relies on them.
        """
        return self.engine == "ray"

    def _sync_folders(self, folders: list[Path], done: int) -> None:
        if done and not self._sync_each:
            for folder in folders:
                fsync_dir(folder)

    @property
    def _remote(self) -> bool:
        """Objects in storage are read by this process on the local engine: obstore's runtime does not survive a fork."""
        return self.engine == "local" and any(isinstance(p, RemoteObject) for p in self.inputs)

    def _say_resumed(self) -> None:
        if self.resumed:
            print(f"dedup: resumed {self.out}: already committed: {', '.join(self.resumed)}", file=sys.stderr)

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
        """Delete the work folder so that a kill at any moment leaves a run that a rerun finishes.

        The plan goes first, by one rename, to `DONE_NAME`: from then on the run is finished.
        The rest is renamed aside and deleted; what a kill leaves of it is removed by the rerun.
        """
        report = json.loads((self.out / REPORT_NAME).read_text())
        if not self.keep_work:
            os.replace(self.work / "plan.json", self.out / DONE_NAME)
            fsync_dir(self.out)
            kill_point("cleanup:plan")
            trash = self.out / TRASH_NAME
            _remove_tree(trash)
            os.rename(self.work, trash)
            fsync_dir(self.out)
            kill_point("cleanup:rename")
            _remove_tree(trash, "cleanup")
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

    def _run(self, work: Callable[[int, Any], Any], count: int, desc: str, unit: str, single: bool = False) -> None:
        """Run `count` tasks on the engine (`single`: in this process, on the local engine)."""
        if not count:
            return
        tasks = Tasks(work=work, count=count, on_done=lambda task_id, result: None, unit=unit, counters=("records",))
        bar = progress_bar(count, desc, unit, self.progress)  # without progress, no tqdm import
        try:
            if self.engine == "ray":
                from llm.data.jobs.ray import run_ray

                run_ray(tasks, self.pool, None, bar)
            else:
                from llm.data.jobs.local import run_local

                run_local(tasks, 0 if single else min(self.pool, count), bar)
        finally:
            bar.close()


def _stamp(path: Input) -> str:
    if isinstance(path, RemoteObject):
        return path.stamp()
    stamp = FileStamp.of(path)
    return f"{stamp.size}:{stamp.mtime_ns}:{stamp.edges}"


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _remove_tree(folder: Path, point: str | None = None) -> None:
    """Delete a folder; `point`: the kill point after its first entry went (a deletion cut short).

    The files go from threads at once (unlink releases the GIL, and on a journaling file system
    each one waits on the disk: ~2 ms here, so a work folder of a few hundred took ~0.5 s one by one).
    """
    if not folder.is_dir():
        return
    entries = sorted(folder.iterdir())
    for i, entry in enumerate(entries[:1]):
        _remove_entry(entry)
        if i == 0 and point:
            kill_point(point)
    files: list[str] = []
    dirs: list[str] = []
    for entry in entries[1:]:
        if entry.is_dir() and not entry.is_symlink():
            for root, subdirs, names in os.walk(entry):
                files += [os.path.join(root, n) for n in names]
                files += [os.path.join(root, d) for d in subdirs if os.path.islink(os.path.join(root, d))]
                dirs.append(root)
        else:
            files.append(str(entry))
    if files:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(os.unlink, files))
    for d in reversed(dirs):  # os.walk lists a folder before its subfolders
        os.rmdir(d)
    folder.rmdir()


def _remove_entry(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()


def _clear(folder: Path) -> None:
    """Empty an output folder for --overwrite (the lock file stays: we hold it)."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name == LOCK_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


