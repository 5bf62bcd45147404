"""The Ray engine: the same dataset as the local engine (content, order, fingerprint); a killed worker is retried."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from llm.data import StreamingDataset, TokensLoader, map, optimize
from llm.data.shards.format.manifest import Manifest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'llm-stream-data[ray]' (the dev extra has it)")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.usefixtures("ray_cluster")]


def _doc(i: int) -> np.ndarray:
    return np.arange(i * 7, i * 7 + 50 + i % 13)


def _item(i: int) -> dict:
    return {"x": np.full((4, 4), i, np.uint8), "label": i, "name": f"n{i}"}


def _node_of_a_task(_: int) -> str:
    import time

    time.sleep(1)  # long enough that the two tasks overlap and need both nodes' CPUs
    return ray.get_runtime_context().get_node_id()


def test_the_cluster_has_two_raylets_and_tasks_run_on_both() -> None:
    task = ray.remote(num_cpus=1)(_node_of_a_task)
    nodes = ray.get([task.remote(i) for i in range(4)])
    assert len(set(nodes)) == 2, "a task ran on each of the two raylets"


@pytest.mark.parametrize("kind", ["tokens", "items"])
def test_ray_writes_the_same_dataset_as_local(tmp_path: Path, kind: str, ray_cluster) -> None:
    fn, loader = (_doc, TokensLoader()) if kind == "tokens" else (_item, None)
    kwargs = dict(num_workers=2, chunk_bytes="1KB", item_loader=loader, progress=False)  # tasks not far below it: not joined
    ray.shutdown()  # the local engine forks its workers: not from a process holding Ray's gRPC threads
    optimize(fn, list(range(60)), tmp_path / "local", **kwargs)
    ray.init(address=ray_cluster.address, logging_level="ERROR", log_to_driver=False)
    optimize(fn, list(range(60)), tmp_path / "ray", engine="ray", **kwargs)
    a, b = Manifest.load(tmp_path / "local"), Manifest.load(tmp_path / "ray")
    assert len(a.shards) > 4 and a.fingerprint() == b.fingerprint()
    assert [s.checksum for s in a.shards] == [s.checksum for s in b.shards]
    assert [s.file for s in a.shards] != [s.file for s in b.shards]  # two runs, two run ids: content decides


def _dies_once(i: int) -> dict:
    marker = Path(os.environ["LLM_TEST_RAY_MARKER"])
    if i == 23 and not marker.exists():
        marker.write_text("killed")
        os._exit(1)  # the Ray worker process dies mid-task, after writing some of its shards
    return _item(i)


def test_a_killed_ray_worker_is_retried_and_every_item_is_there_once(tmp_path: Path, ray_cluster) -> None:
    marker = tmp_path / "marker"
    ray.shutdown()  # reconnect as a job whose workers get the marker's path
    ray.init(address=ray_cluster.address, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"LLM_TEST_RAY_MARKER": str(marker)}})
    optimize(_dies_once, list(range(40)), tmp_path / "ds", num_workers=2, chunk_size=3, engine="ray", progress=False)
    assert marker.read_text() == "killed"
    ds = StreamingDataset(tmp_path / "ds")
    assert [ds[i]["label"] for i in range(len(ds))] == list(range(40))
    listed = {s.file for s in Manifest.load(tmp_path / "ds").shards}
    assert {p.name for p in (tmp_path / "ds").glob("shard-*.bin")} == listed


def _touch(name: str, folder: str) -> None:
    Path(folder, f"{name}.txt").write_text(name)


def test_map_on_ray(tmp_path: Path) -> None:
    summary = map(_touch, [f"f{i}" for i in range(6)], tmp_path / "out", engine="ray", progress=False)
    assert summary.done == 6 and sorted(p.name for p in (tmp_path / "out").glob("*.txt")) == [f"f{i}.txt" for i in range(6)]


def _with_lock_at_4(i: int) -> dict:
    import threading

    return {"x": i, "meta": {"k": threading.Lock() if i == 4 else {i}}}  # a set: stored as a pickle


def test_an_unpicklable_item_on_ray_names_the_input_and_the_field(tmp_path: Path) -> None:
    from llm.data.shards.format.serializers import UnpicklableItem

    with pytest.raises(UnpicklableItem, match=r"^optimize: input 4 \(4\): field 'meta.k' \(lock\) cannot be pickled"):
        optimize(_with_lock_at_4, list(range(8)), tmp_path / "ds", num_workers=2, engine="ray", progress=False)
