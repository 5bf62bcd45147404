"""map(): fn(input, folder) in parallel; files land in the output per input, failures name it, reruns resume."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from llm.data import MapError, map, map_fn
from llm.data.shards.jobs.map import STATE_DIR


def _resize(name: str, folder: str) -> None:
    if name == "bad" and not os.environ.get("LLM_TEST_MAP_FIXED"):
        raise ValueError("cannot read bad")
    os.makedirs(os.path.join(folder, "sub"), exist_ok=True)
    Path(folder, f"{name}.txt").write_text(name.upper())
    Path(folder, "sub", f"{name}.bin").write_bytes(name.encode())


def test_map_writes_every_inputs_files(tmp_path: Path) -> None:
    names = [f"n{i}" for i in range(12)]
    summary = map(_resize, names, tmp_path / "out", num_workers=2, progress=False)
    assert summary.done == 12 and summary.files == 24 and map_fn is map
    assert sorted(p.name for p in (tmp_path / "out").glob("*.txt")) == sorted(f"{n}.txt" for n in names)
    assert (tmp_path / "out" / "sub" / "n3.bin").read_bytes() == b"n3"
    assert not list((tmp_path / "out" / STATE_DIR / "tmp").iterdir())  # no staging folder left


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_input_is_named_and_a_rerun_does_only_what_is_left(tmp_path: Path, monkeypatch, workers: int) -> None:
    names = ["a", "b", "bad", "c", "d", "e"]
    out = tmp_path / "out"
    with pytest.raises(MapError, match=r"map: input 2 \('bad'\) failed: ValueError: cannot read bad"):
        map(_resize, names, out, num_workers=workers, progress=False)
    assert not (out / "bad.txt").exists()
    # a worker stopped mid-write may leave a marker's temporary (dot) file: not a marker
    markers = len([p for p in (out / STATE_DIR / "done").iterdir() if not p.name.startswith(".")])
    # an input counts as done once all its files are in place (a worker stopped in between redoes it)
    assert (out / "a.txt").exists() and markers <= len(list(out.glob("*.txt"))) and (workers or markers == 2)
    monkeypatch.setenv("LLM_TEST_MAP_FIXED", "1")
    summary = map(_resize, names, out, num_workers=workers, progress=False)
    assert summary.skipped == markers and summary.done == len(names) - markers
    assert sorted(p.name for p in out.glob("*.txt")) == sorted(f"{n}.txt" for n in names)
    again = map(_resize, names, out, num_workers=workers, progress=False)
    assert again.done == 0 and again.skipped == len(names)


def test_a_second_run_on_the_same_output_is_refused_or_waits(tmp_path: Path) -> None:
    import threading

    from llm.data.storage.lock import LockHeld

    out = tmp_path / "out"
    gate = threading.Event()

    def held(name: str, folder: str) -> None:
        gate.wait(10)
        _resize(name, folder)

    first = threading.Thread(target=map, args=(held, ["a"], out), kwargs={"num_workers": 0, "progress": False})
    first.start()
    try:
        deadline = time.monotonic() + 10
        while not (out / STATE_DIR / ".llm-data.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(LockHeld, match=r"being written by a map run"):
            map(_resize, ["b"], out, num_workers=0, progress=False)
        threading.Timer(0.3, gate.set).start()
        summary = map(_resize, ["b"], out, num_workers=0, progress=False, wait=True)  # waits for the first
    finally:
        gate.set()
        first.join()
    assert summary.done == 1 and sorted(p.name for p in out.glob("*.txt")) == ["a.txt", "b.txt"]


def test_fn_must_be_callable(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="map: fn must be callable as fn\\(input, folder\\), got int"):
        map(42, ["a"], tmp_path / "out", progress=False)
