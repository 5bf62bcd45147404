"""map() and the Ray engine writing to s3://: the same files and the same dataset as on a local disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm.data import StreamingDataset, TokensLoader, map, optimize
from llm.data.shards.format.manifest import Manifest
from llm.data.shards.prepare.map import MapError
from llm.data.storage.objects import open_objects

pytestmark = [pytest.mark.timeout(300)]


def _write_pair(name: str, folder: str) -> None:
    Path(folder, "sub").mkdir()
    Path(folder, f"{name}.txt").write_text(name)
    Path(folder, "sub", f"{name}.bin").write_bytes(name.encode() * 3)


def _fails_on_f3(name: str, folder: str) -> None:
    if name == "f3":
        raise ValueError("bad record")
    _write_pair(name, folder)


def _listing(url: str, options: dict) -> list[str]:
    """The objects map wrote: those directly under the prefix and under sub/ (list() is one level)."""
    top = [n for n in open_objects(url, options).list() if not n.startswith(".llm-map")]
    return sorted(top + [f"sub/{n}" for n in open_objects(f"{url}/sub", options).list()])


def test_map_to_s3_uploads_each_inputs_files_and_a_rerun_skips_done_inputs(store_server) -> None:
    url, options = store_server.url(), store_server.options()  # s3, az and gs
    names = [f"f{i}" for i in range(6)]
    with pytest.raises(MapError, match=r"input 3 \('f3'\) failed: ValueError: bad record"):
        map(_fails_on_f3, names, url, num_workers=0, progress=False, storage_options=options)
    before = _listing(url, options)
    assert "f3.txt" not in before and {"f0.txt", "sub/f0.bin"} <= set(before)  # done inputs stay done

    summary = map(_write_pair, names, url, num_workers=2, progress=False, storage_options=options)
    assert summary.done == 6 - len(before) // 2 and summary.skipped == len(before) // 2
    assert _listing(url, options) == sorted([f"{n}.txt" for n in names] + [f"sub/{n}.bin" for n in names])
    assert open_objects(url, options).get("sub/f4.bin") == b"f4f4f4"


def _doc(i: int) -> np.ndarray:
    return np.arange(i * 5, i * 5 + 40 + i % 11)


@pytest.mark.slow
def test_ray_engine_writes_to_s3_the_dataset_the_local_engine_writes(s3_server, ray_cluster, tmp_path) -> None:
    # storage_options, not the environment: Ray's workers started before this test's env vars
    url, options = s3_server.url(), s3_server.options()
    kwargs = dict(num_workers=2, chunk_bytes="2KB", item_loader=TokensLoader(), progress=False)
    optimize(_doc, list(range(80)), tmp_path / "local", **kwargs)
    optimize(_doc, list(range(80)), url, engine="ray", storage_options=options, **kwargs)
    local = Manifest.load(tmp_path / "local")
    remote = StreamingDataset(url, item_loader=TokensLoader(block_size=64), storage_options=options,
                              cache_dir=tmp_path / "cache")
    assert len(local.shards) > 4 and remote.manifest.fingerprint() == local.fingerprint()
    assert [s.checksum for s in remote.manifest.shards] == [s.checksum for s in local.shards]
    expected = np.concatenate([_doc(i) for i in range(80)])  # read back in order, every token
    got = np.concatenate([np.asarray(remote[i]).reshape(-1) for i in range(len(remote))])[: remote.reader.total]
    assert np.array_equal(got, expected)

    summary = map(_write_pair, ["a", "b", "c"], f"{url}-map", engine="ray", progress=False, storage_options=options)
    assert summary.done == 3 and _listing(f"{url}-map", options) == ["a.txt", "b.txt", "c.txt",
                                                                    "sub/a.bin", "sub/b.bin", "sub/c.bin"]
