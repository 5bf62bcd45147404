"""`engine="ray"`: the same bytes as the local engine, on a cluster of two raylets (tests/ray_nodes.py); a killed task is
retried. With the output in S3 the raylets share no folder: each has its own scratch folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm.data import dedup_corpus
from llm.data.storage.objects import open_objects
from tests.data.corpus_dedup.helpers import tree, write_corpus
from tests.data.corpus_dedup.test_remote_output import remote_tree
from tests.storage.conftest import s3_server  # noqa: F401 - the session's SeaweedFS server

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'llm-stream-data[ray]' (the dev extra has it)")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_ray_gives_the_local_bytes_and_a_killed_task_is_retried(tmp_path: Path, ray_cluster) -> None:
    write_corpus(tmp_path / "in")
    dedup_corpus(str(tmp_path / "in"), tmp_path / "local", near=0.8, num_workers=0, progress=False, chunk_records=16)
    expected = tree(tmp_path / "local")
    # every band task's worker process would die by SIGKILL right after committing band 3; only the first does
    marker = tmp_path / "killed-once"
    kill = {"LLM_DEDUP_KILL_AT": "band:3", "LLM_DEDUP_KILL_ONCE": str(marker)}
    ray.shutdown()  # reconnect to the two raylets as a job whose workers get the kill switch
    ray.init(address=ray_cluster.address, logging_level="ERROR", log_to_driver=False, runtime_env={"env_vars": kill})
    report = dedup_corpus(str(tmp_path / "in"), tmp_path / "ray", near=0.8, engine="ray", num_workers=2,
                          progress=False, chunk_records=16)
    assert marker.exists()  # the kill happened, on a Ray worker, and the run still finished
    assert tree(tmp_path / "ray") == expected
    assert report["removed"] == 6
    ray.shutdown()
    ray.init(address=ray_cluster.address, logging_level="ERROR", log_to_driver=False)
    exact = dedup_corpus(str(tmp_path / "in"), tmp_path / "ray-exact", engine="ray", progress=False)
    assert exact["removed"] == 3


def test_ray_with_the_output_in_s3_runs_on_nodes_that_share_no_disk(tmp_path: Path, ray_cluster, s3_server,  # noqa: F811
                                                                     monkeypatch) -> None:
    """Each raylet has its own scratch folder and the driver a third: every file between the stages goes through
    the store. A task killed before its commit is retried; a killed driver's rerun finishes; a finished run, rerun,
    returns its report; every node's scratch copy is deleted at the end."""
    write_corpus(tmp_path / "in")
    local = dedup_corpus(str(tmp_path / "in"), tmp_path / "local", near=0.8, num_workers=0, progress=False, chunk_records=16)
    driver = tmp_path / "driver-scratch"
    driver.mkdir()
    monkeypatch.setenv("LLM_DEDUP_SCRATCH", str(driver))
    marker = tmp_path / "killed-once"
    kill = {"LLM_DEDUP_KILL_AT": "band:3", "LLM_DEDUP_KILL_ONCE": str(marker)}
    ray.shutdown()
    ray.init(address=ray_cluster.address, logging_level="ERROR", log_to_driver=False, runtime_env={"env_vars": kill})
    url, options = s3_server.url(), s3_server.options()
    report = dedup_corpus(str(tmp_path / "in"), url, near=0.8, engine="ray", num_workers=2, progress=False,
                          chunk_records=16, storage_options=options)
    assert marker.exists()  # a band task was killed (after its work, before its PUT) and retried
    assert report == local and report["removed"] == 6
    assert remote_tree(url, options) == tree(tmp_path / "local")  # records, report, removed list and plan
    assert [list(p.iterdir()) for p in (*ray_cluster.scratch, driver)] == [[], [], []]
    assert dedup_corpus(str(tmp_path / "in"), url, near=0.8, engine="ray", num_workers=2, progress=False,
                        chunk_records=16, storage_options=options) == report  # finished: nothing redone
    ray.shutdown()
    # inputs in S3 too (nothing on a node's disk but its scratch), and the driver killed (SIGKILL) once the report
    # is put: the nodes' copies are still there, and its rerun removes them
    inputs = s3_server.url()
    objects = open_objects(inputs, options)
    for path in sorted(p for p in (tmp_path / "in").rglob("*") if p.is_file()):
        objects.put(path.relative_to(tmp_path / "in").as_posix(), path)
    dedup_corpus(inputs, tmp_path / "local-cli", near=0.8, num_workers=0, progress=False, storage_options=options)
    url = s3_server.url()
    cmd = [sys.executable, "-m", "llm.cli.data", "dedup", inputs, "--output", url, "--near", "0.8",
           "--engine", "ray", "--ray-address", ray_cluster.address, "--num-workers", "2", "--no-progress"]
    env = {**os.environ, **s3_server.env()}
    first = subprocess.run(cmd, env={**env, "LLM_DEDUP_KILL_AT": "report"}, capture_output=True, text=True, timeout=180)
    assert first.returncode == -9, first.stderr
    assert all(any(p.iterdir()) for p in ray_cluster.scratch)  # both raylets worked, each on its own disk
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert second.returncode == 0 and "already committed: plan, everything" in second.stderr, second.stderr
    assert remote_tree(url, options) == tree(tmp_path / "local-cli")
    assert [list(p.iterdir()) for p in (*ray_cluster.scratch, driver)] == [[], [], []]
