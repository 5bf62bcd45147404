"""The ledger used as a hostile user would: two writers on one folder, wrong `ledger=` values, a ledger
pointed into a dataset, and hand-edited ledger files; each ends in a named error or a named problem."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm.cli.data import main as llm_data
from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.ledger.format import LedgerError
from llm.data.ledger.writer import lock_name
from tests.data.shards.helpers import make_token_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_token_dataset(tmp_path_factory.mktemp("hostile-ds"), n_lines=600)


def loader(path: Path, ledger: object, batch: int = 4) -> StreamingDataLoader:
    ds = StreamingDataset(path, item_loader=TokensLoader(block_size=64), shuffle=True, seed=3)
    return StreamingDataLoader(ds, batch_size=batch, num_workers=0, ledger=ledger)


def train(path: Path, ledger: Path, n: int, state: dict | None = None) -> dict:
    one = loader(path, ledger)
    if state is not None:
        one.load_state_dict(state)
    it = iter(one)
    for _ in range(n):
        next(it)
    return one.state_dict()


def audit(ledger: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = llm_data(["audit", str(ledger)])
    out = capsys.readouterr()
    return code, out.out + out.err


def chain(path: Path, ledger: Path) -> None:
    """Three commits over two resumes: segments of generations 0, 1 and 2."""
    state = train(path, ledger, 3)
    state = train(path, ledger, 3, state)
    train(path, ledger, 3, state)


def test_two_loaders_of_one_process_on_one_folder_do_not_audit_ok(dataset: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    # before: both wrote r00000-g0000-1-5.seg, the second replaced the first, and audit said OK over 40 of 60 rows
    ledger = tmp_path / "ledger"
    first, second = loader(dataset, ledger, 4), loader(dataset, ledger, 8)
    a, b = iter(first), iter(second)
    for _ in range(5):
        next(a), next(b)
    with pytest.raises(LedgerError, match="opened by a later ledger writer of this process"):
        first.state_dict()
    assert second.state_dict()["ledger"]["step"] == 5
    code, out = audit(ledger, capsys)
    assert code == 0 and "40 samples trained exactly once" in out, out  # the later loader's 5 steps of 8, alone


def test_a_second_process_writing_the_same_rank_is_refused(dataset: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from llm.data.storage.lock import FolderLock; "
         f"FolderLock(sys.argv[1], name={lock_name(0)!r}).acquire(); print('held', flush=True); time.sleep(60)",
         str(ledger)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LedgerError, match=f"{ledger} is being written as rank 0 by pid {holder.pid}"):
            train(dataset, ledger, 2)
    finally:
        holder.kill()
        holder.wait()
    state = train(dataset, ledger, 2)  # its holder killed, the lock is free again
    assert state["ledger"]["step"] == 2


@pytest.mark.parametrize("bad", [123, 1.5, ["a"], "", None.__class__])
def test_a_ledger_argument_of_the_wrong_type_is_named(dataset: Path, bad: object) -> None:
    with pytest.raises(TypeError, match=r"^ledger= is .*pass the path of a folder"):
        loader(dataset, bad)


def test_a_ledger_in_a_dataset_folder_or_in_a_file_is_refused(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="is a dataset folder \\(it holds index.json\\)"):
        train(dataset, dataset, 1)
    assert not (dataset / "ledger.json").exists() and not list(dataset.glob("*.seg"))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").write_text("step_3\n")
    with pytest.raises(LedgerError, match="is an llm-train checkpoint folder"):
        train(dataset, tmp_path / "ckpt", 1)
    (tmp_path / "file").write_text("x")
    with pytest.raises(LedgerError, match="is a file, not a folder"):
        train(dataset, tmp_path / "file", 1)


def test_a_renamed_segment_is_named_not_counted_where_its_name_says(dataset: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    # before: a segment of rank 0 renamed to rank 1 audited OK, its steps filed under rank 1
    ledger = tmp_path / "ledger"
    chain(dataset, ledger)
    seg = sorted(ledger.glob("r00000-g0001-*.seg"))[0]
    seg.rename(ledger / ("r00001" + seg.name[6:]))
    code, out = audit(ledger, capsys)
    assert code == 1 and "holds rank 0 generation 1 steps 4-6 but is named otherwise" in out, out


@pytest.mark.parametrize("marker", ["[]", '{"resumed_from": {"generation": "x", "step": 3}}'])
def test_a_damaged_resume_marker_is_named(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                          marker: str) -> None:
    # before: a list was read as "no resume" (generation 0 called abandoned, the marker never named); a string
    # generation ended in "invalid literal for int()"
    ledger = tmp_path / "ledger"
    chain(dataset, ledger)
    (ledger / "g0001.json").write_text(marker)
    code, out = audit(ledger, capsys)
    assert code == 1 and f"{ledger / 'g0001.json'} is not a resume marker" in out, out


def test_a_ledger_header_that_is_a_folder_or_has_bad_sources_is_named(dataset: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    chain(dataset, ledger)
    header = ledger / "ledger.json"
    saved = json.loads(header.read_text())
    header.write_text(json.dumps({**saved, "sources": "x"}))
    code, out = audit(ledger, capsys)
    assert code == 2 and f"{header} key 'sources' is 'x'" in out, out  # before: AttributeError
    header.unlink()
    header.mkdir()
    code, out = audit(ledger, capsys)
    assert code == 2 and f"{header} is not a file" in out, out  # before: "ledger.json is missing"


def test_a_forked_child_dropping_its_copy_of_the_loader_leaves_the_lock_to_the_parent(dataset: Path,
                                                                                     tmp_path: Path) -> None:
    # before: the child's garbage-collected writer released the parent's lock: it unlinked the lock file
    import gc

    ledger = tmp_path / "ledger"
    parent = loader(dataset, ledger)
    next(iter(parent))
    pid = os.fork()
    if pid == 0:  # the child: drop every reference to the loader, as a worker exiting does
        code = 0
        try:
            del parent
            gc.collect()
        except BaseException:
            code = 1
        os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    assert (ledger / lock_name(0)).is_file()
    assert json.loads((ledger / lock_name(0)).read_text())["pid"] == os.getpid()
    assert parent.state_dict()["ledger"]["step"] == 1


def test_a_ledger_folder_whose_lock_cannot_be_written_is_named_before_training(dataset: Path,
                                                                              tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    (ledger / lock_name(0)).mkdir(parents=True)  # as unwritable as a read-only folder, even for root
    with pytest.raises(LedgerError, match=f"^cannot write the ledger folder {ledger} "):
        train(dataset, ledger, 1)


def test_a_source_entry_edited_out_of_the_header_is_named_not_a_traceback(dataset: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    train(dataset, ledger, 2)
    header = json.loads((ledger / "ledger.json").read_text())
    del header["sources"][0]["path"]
    header["sources"][0]["block_size"] = "64"
    (ledger / "ledger.json").write_text(json.dumps(header))
    code, out = audit(ledger, capsys)
    assert code == 1 and "the ledger header's entry of source 0" in out and "is damaged" in out, out
    assert "Traceback" not in out
