"""An output in object storage (remote.py), on the local engine: the bytes of a local folder, and a local folder's guards.

The Ray engine on two raylets with separate disks is test_ray.py's; these run on one real S3-compatible
server on loopback (SeaweedFS, telemetry off: tests/storage/conftest.py), and on GCS and Azure's in CI.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from llm.data import dedup_corpus
from llm.data.corpus_dedup.pipeline import DedupRunMismatch
from llm.data.storage.lock import LOCK_NAME, LockHeld
from llm.data.storage.objects import open_objects
from tests.data.corpus_dedup.helpers import tree, write_corpus
from tests.storage.conftest import QUICK_ON_S3, az_server, gs_server, s3_server  # noqa: F401 - session servers


def remote_tree(url: str, options: dict) -> dict[str, bytes]:
    """Every object under a prefix by relative name (the lock left out), as helpers.tree gives a folder."""
    from llm.data.storage.object_files import list_objects

    objects = open_objects(url, options)
    prefix = objects.key("")
    return {o.key[len(prefix):]: objects.get(o.key[len(prefix):]) for o in list_objects(objects.config, prefix)
            if not o.key.endswith(LOCK_NAME)}


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch) -> Path:
    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setenv("LLM_DEDUP_SCRATCH", str(folder))
    return folder


@pytest.mark.parametrize("scheme", QUICK_ON_S3)
def test_an_object_store_output_holds_the_bytes_of_a_local_one(request, scheme: str, scratch: Path, tmp_path: Path) -> None:
    server = request.getfixturevalue(f"{scheme}_server")
    write_corpus(tmp_path / "in")
    local = dedup_corpus(str(tmp_path / "in"), tmp_path / "local", near=0.8, num_workers=0, progress=False, chunk_records=16)
    url = server.url()
    remote = dedup_corpus(str(tmp_path / "in"), url, near=0.8, progress=False, chunk_records=16,
                          storage_options=server.options())
    assert remote == local and remote["removed"] == 6
    assert remote_tree(url, server.options()) == tree(tmp_path / "local")  # the plan too; no work folder left
    assert list(scratch.iterdir()) == []  # the scratch copy is gone
    again = dedup_corpus(str(tmp_path / "in"), url, near=0.8, progress=False, chunk_records=16,
                         storage_options=server.options())
    assert again == local


def test_the_guards_of_a_local_folder_hold_for_a_prefix(s3_server, scratch: Path, tmp_path: Path) -> None:  # noqa: F811
    options = s3_server.options()
    write_corpus(tmp_path / "in")
    url = s3_server.url()
    objects = open_objects(url, options)
    objects.put("other.txt", b"not ours")
    with pytest.raises(ValueError, match=f"output {url} is not empty \\(it holds other.txt\\); pass overwrite=True"):
        dedup_corpus(str(tmp_path / "in"), url, progress=False, storage_options=options)
    first = dedup_corpus(str(tmp_path / "in"), url, progress=False, storage_options=options, overwrite=True)
    assert first["removed"] == 3 and not objects.list().get("other.txt")
    with pytest.raises(DedupRunMismatch, match="other inputs or parameters"):
        dedup_corpus(str(tmp_path / "in"), url, near=0.8, progress=False, storage_options=options)
    (tmp_path / "in" / "e.jsonl.gz").write_bytes((tmp_path / "in" / "e.jsonl.gz").read_bytes() + b"")
    os.utime(tmp_path / "in" / "e.jsonl.gz", ns=(1, 1))
    with pytest.raises(DedupRunMismatch, match="e.jsonl.gz: input changed since the finished dedup run"):
        dedup_corpus(str(tmp_path / "in"), url, progress=False, storage_options=options)
    # another writer (on another machine) holds the output
    objects.put(LOCK_NAME, json.dumps({"pid": 1, "host": "another-machine", "since": 0, "token": "x"}).encode())
    with pytest.raises(LockHeld, match=f"{url} is being written by a dedup run, pid 1 on host another-machine"):
        dedup_corpus(str(tmp_path / "in"), url, progress=False, storage_options=options, overwrite=True)
    objects.delete(LOCK_NAME)
    # inputs in the same bucket: inside the output, or holding it
    inside = f"{url}/in/a.jsonl"
    with pytest.raises(ValueError, match=f"input {inside} is inside the output {url}; write the dedup output elsewhere"):
        dedup_corpus(inside, url, progress=False, storage_options=options)
    with pytest.raises(ValueError, match=f"input s3://{s3_server.bucket}/ contains the output {url}"):
        dedup_corpus(f"s3://{s3_server.bucket}/", url, progress=False, storage_options=options)
    with pytest.raises(ValueError, match=f"output s3://{s3_server.bucket}: give a prefix inside"):
        dedup_corpus(str(tmp_path / "in"), f"s3://{s3_server.bucket}", progress=False, storage_options=options)


def test_a_killed_run_resumes_from_the_objects_committed(s3_server, scratch: Path, tmp_path: Path) -> None:  # noqa: F811
    """Killed for real (SIGKILL) in the clusters stage, its result made but not yet put, then run again: the
    local bytes, the stages committed before not redone; killed after the report: the rerun only cleans up."""
    import subprocess
    import sys

    write_corpus(tmp_path / "in")
    dedup_corpus(str(tmp_path / "in"), tmp_path / "local", near=0.8, num_workers=0, progress=False)
    url = f"s3://{s3_server.bucket}/{uuid.uuid4().hex[:12]}"
    cmd = [sys.executable, "-m", "llm.cli.data", "dedup", str(tmp_path / "in"), "--output", url, "--near", "0.8",
           "--no-progress"]
    env = {**os.environ, **s3_server.env(), "LLM_DEDUP_KILL_AT": "clusters"}
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == -9, first.stderr
    env.pop("LLM_DEDUP_KILL_AT")
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "already committed: plan, scan 5/5, exact, bands 14/14\n" in second.stderr
    assert remote_tree(url, s3_server.options()) == tree(tmp_path / "local")
    cmd[cmd.index(url)] = url = url + "-2"
    first = subprocess.run(cmd, env={**env, "LLM_DEDUP_KILL_AT": "report"}, capture_output=True, text=True, timeout=120)
    assert first.returncode == -9, first.stderr
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and "already committed: plan, everything" in second.stderr, second.stderr
    assert remote_tree(url, s3_server.options()) == tree(tmp_path / "local")
    assert list(scratch.iterdir()) == []  # the killed runs' scratch copies went with their reruns
    # killed after the report again, on a new prefix; a scan folder of the copy left here loses a file (as one a
    # later stage fetched only in part); the same command with --overwrite scans that input anew, not what is left
    cmd[cmd.index(url)] = url = url + "-3"
    first = subprocess.run(cmd, env={**env, "LLM_DEDUP_KILL_AT": "report"}, capture_output=True, text=True, timeout=120)
    assert first.returncode == -9, first.stderr
    [copy] = scratch.iterdir()
    (copy / ".dedup-work" / "scan" / "00000" / "exact-00000.run").unlink()
    third = subprocess.run([*cmd, "--overwrite"], env=env, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    assert remote_tree(url, s3_server.options()) == tree(tmp_path / "local")
