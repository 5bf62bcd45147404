"""map(): fn(input, folder) in parallel; files land in the output per input, failures name it, reruns resume."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from llm.data import MapError, map
from llm.data.shards.prepare.map import STATE_DIR


def _resize(name: str, folder: str) -> None:
    if name == "bad" and not os.environ.get("LLM_TEST_MAP_FIXED"):
        raise ValueError("cannot read bad")
    os.makedirs(os.path.join(folder, "sub"), exist_ok=True)
    Path(folder, f"{name}.txt").write_text(name.upper())
    Path(folder, "sub", f"{name}.bin").write_bytes(name.encode())


def test_map_writes_every_inputs_files(tmp_path: Path) -> None:
    names = [f"n{i}" for i in range(12)]
    summary = map(_resize, names, tmp_path / "out", num_workers=2, progress=False)
    assert summary.done == 12 and summary.files == 24
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


class Named:
    """A picklable object whose repr holds its address (object's default repr)."""

    def __init__(self, name: str) -> None:
        self.name = name


def _save_array(value, folder: str) -> None:
    import numpy as np

    np.save(os.path.join(folder, f"{int(value.sum())}.npy"), value)


def _save_named(value, folder: str) -> None:
    name = value.name if isinstance(value, Named) else value[0]
    Path(folder, f"{name}.txt").write_text(name)


def test_inputs_are_keyed_by_content_not_repr(tmp_path: Path) -> None:
    import numpy as np

    a = np.arange(5000)
    b = a.copy()
    b[2500] = -1  # repr(a) == repr(b): numpy elides the middle
    assert repr(a) == repr(b)
    out = tmp_path / "out"
    summary = map(_save_array, [a, b, a.copy()], out, num_workers=0, progress=False)
    assert sorted(p.name for p in out.glob("*.npy")) == sorted([f"{a.sum()}.npy", f"{b.sum()}.npy"])
    assert (summary.inputs, summary.done, summary.skipped, summary.duplicates) == (3, 2, 0, 1)
    again = map(_save_array, [a, b], out, num_workers=0, progress=False)
    assert (again.done, again.skipped) == (0, 2)


def test_an_input_with_an_address_in_its_repr_resumes(tmp_path: Path) -> None:
    first = [Named("a"), Named("b")]
    out = tmp_path / "out"
    assert map(_save_named, first, out, num_workers=2, progress=False).done == 2
    second = [Named("a"), Named("b"), Named("c")]  # new objects, new addresses, same content
    assert repr(second[0]) != repr(first[0])
    summary = map(_save_named, second, out, num_workers=2, progress=False)
    assert (summary.done, summary.skipped) == (1, 2)


def test_an_unpicklable_input_is_refused_up_front_and_key_keys_it(tmp_path: Path) -> None:
    import threading

    out = tmp_path / "out"
    inputs = [("a", threading.Lock()), ("b", threading.Lock())]
    with pytest.raises(MapError, match=r"^map: input 0 \(\('a', <unlocked _thread.lock .*\) cannot be pickled .*; pass key=") as info:
        map(_save_named, inputs, out, num_workers=0, progress=False)
    assert "\n" not in str(info.value) and not out.exists()  # refused before anything was created
    summary = map(_save_named, inputs, out, num_workers=2, progress=False, key=lambda x: x[0])
    assert summary.done == 2 and sorted(p.name for p in out.glob("*.txt")) == ["a.txt", "b.txt"]
    again = map(_save_named, [("b", threading.Lock())], out, num_workers=0, progress=False, key=lambda x: x[0])
    assert (again.done, again.skipped) == (0, 1)
    with pytest.raises(MapError, match=r"^map: key\(\) failed on input 0 .*: TypeError: key\(\) returned int"):
        map(_save_named, inputs, out, num_workers=0, progress=False, key=lambda x: 3)


def test_markers_of_repr_keyed_runs_still_count_where_the_repr_is_unique(tmp_path: Path) -> None:
    import numpy as np

    from llm.data.shards.prepare.map import legacy_key

    a = np.arange(5000)
    b = a.copy()
    b[2500] = -1
    out = tmp_path / "out"
    done = out / STATE_DIR / "done"
    done.mkdir(parents=True)
    for value in ("x", "y", a):  # an older version's markers: x and y done, and one of the arrays
        (done / legacy_key(value)).write_text("{}")
    summary = map(_resize, ["x", "y", "z"], out, num_workers=0, progress=False)
    assert (summary.done, summary.skipped) == (1, 2)
    both = map(_save_array, [a, b], out, num_workers=0, progress=False)  # the old key could not tell them apart
    assert (both.done, both.skipped) == (2, 0)
