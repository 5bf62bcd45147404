"""The output folder of `optimize`: one writer at a time (a lock), mode checks, commit or clean-up."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from llm.data.shards.format.manifest import INDEX_NAME, Manifest
from llm.data.shards.prepare.output_base import MODES, SHARD_PREFIX, Output
from llm.data.storage.lock import LOCK_NAME, FolderLock
from llm.data.storage.paths import parse_location


class OutputFolder(Output):
    """Holds the folder's lock from the mode checks to the commit, so two runs never interleave.

    Without it, two runs appending to one folder both commit, and each commit deletes the
    other's shards as orphans; under the lock the only shards not in the manifest are those
    of runs that died, which are safe to delete.
    """

    def __init__(self, folder: Path, mode: str | None, kind: str, tokenizer: dict | None, wait: bool = False):
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)} or None, got {mode!r}")
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"output {folder} exists and is not a folder")
        self.folder, self.mode, self.kind, self.tokenizer = folder, mode, kind, tokenizer
        self.display, self.label = str(folder), f"output folder {folder}"
        self.created = not folder.exists()
        self.committed = False
        self.lock = FolderLock(folder, wait=wait, what="an optimize")
        self.lock.acquire()
        try:
            self._check_mode()
        except BaseException:
            self.release()
            raise

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


def open_output(output_dir: str | Path, mode: str | None, kind: str, tokenizer: dict | None,
                wait: bool = False, storage_options: dict | None = None):
    """The output of optimize(): a local folder (also for local:) or an s3://, gs:// or az:// prefix."""
    location = parse_location(output_dir)
    if location.is_object_store:
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)} or None, got {mode!r}")
        from llm.data.shards.prepare.remote_output import RemoteOutput

        return RemoteOutput(location, mode, kind, tokenizer, wait=wait, storage_options=storage_options)
    if storage_options:
        raise ValueError(f"storage_options apply to object-store outputs (s3://, gs://, az://) only, not {output_dir}")
    return OutputFolder(location.local_path(), mode, kind, tokenizer, wait=wait)
