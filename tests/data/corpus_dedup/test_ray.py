"""`engine="ray"`: the same bytes as the local engine, on a cluster of two raylets (tests/ray_nodes.py); a killed task is retried."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm.data import dedup_corpus
from tests.data.corpus_dedup.helpers import tree, write_corpus

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
