"""The shard loader's ledger, end to end: resume chains that change batch, ranks and workers audit clean
through `llm-data audit`, and planted faults (a replay, a skipped chunk, a hand-edited state, a resume
from an older checkpoint, changed data) are caught and named."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from llm.cli.data import main as llm_data
from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.ledger.audit import audit
from llm.data.ledger.reader import read_ledger
from llm.data.shards.read.ledger_audit import ShardAuditor
from tests.data.shards.helpers import make_token_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_token_dataset(tmp_path_factory.mktemp("ledger-ds"), n_lines=1500)


def steps(path: Path, ledger: Path, state: dict | None, n: int | None, batch: int = 4, world: int = 1,
          workers: int = 0) -> tuple[int, dict]:
    """Train `n` global steps (None: to the end of the epoch) on `world` simulated ranks; every rank's
    state_dict() commits its ledger, as each rank does at a checkpoint. Returns (rows read, state)."""
    ds = StreamingDataset(path, item_loader=TokensLoader(block_size=64), shuffle=True, seed=3)
    loaders = [StreamingDataLoader(ds, batch_size=batch, num_workers=workers, ledger=ledger) for _ in range(world)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    iters = []
    for rank, loader in enumerate(loaders):
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
        iters.append(iter(loader))
    rows = done = 0
    try:
        while n is None or done < n:
            got = [next(it, None) for it in iters]
            if got[0] is None:
                break
            rows += sum(len(b) for b in got if b is not None)
            done += 1
    finally:
        os.environ.pop("RANK"), os.environ.pop("WORLD_SIZE")
    states = [loader.state_dict() for loader in loaders]
    return rows, states[0]


def audit_cli(ledger: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = llm_data(["audit", str(ledger)])
    return code, capsys.readouterr().out


def test_a_resume_chain_over_batch_ranks_and_workers_audits_clean(dataset: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    n = len(StreamingDataset(dataset, item_loader=TokensLoader(block_size=64)))
    total, state = steps(dataset, ledger, None, 5, batch=8, workers=2)
    for kw in ({"batch": 4, "world": 2}, {"batch": 4, "world": 3, "workers": 0}):
        rows, state = steps(dataset, ledger, state, 7, **kw)
        total += rows
    rows, state = steps(dataset, ledger, state, None, batch=12)
    total += rows
    assert total == n and state["epoch"] == 1
    code, out = audit_cli(ledger, capsys)
    assert code == 0, out
    assert f"{n:,} samples trained exactly once" in out and "audit: OK" in out
    assert sorted(read_ledger(ledger).markers) == [1, 2, 3]


def test_planted_faults_are_caught_and_named(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # a hand-edited state: 8 samples skipped
    ledger = tmp_path / "edited"
    _, state = steps(dataset, ledger, None, 3)
    state = {**state, "samples_consumed": state["samples_consumed"] + 8}
    steps(dataset, ledger, state, None)
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "8 missing" in out and "was never trained (its epoch is complete)" not in out
    assert "missing: " in out

    # a resume from an older checkpoint on top of a newer ledger
    ledger = tmp_path / "older"
    _, old = steps(dataset, ledger, None, 3)
    _, new = steps(dataset, ledger, old, 3)
    steps(dataset, ledger, new, 2)
    steps(dataset, ledger, old, None)
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "abandoned by a resume from an older checkpoint" in out

    # a replayed batch: the same state resumed twice into one generation's ledger, by hand
    ledger = tmp_path / "replay"
    _, state = steps(dataset, ledger, None, 3)
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=64), shuffle=True, seed=3)
    loader = StreamingDataLoader(ds, batch_size=4, ledger=ledger)
    loader.load_state_dict(state)
    it = iter(loader)
    next(it)
    loader.load_state_dict({**loader.state(), "samples_consumed": state["samples_consumed"]})  # the cursor goes back
    loader._ledger.opened = True  # noqa: SLF001 - the fault: the ledger keeps going as if nothing happened
    it = iter(loader)
    next(it)
    loader.state_dict()
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "trained 2 times" in out

    # the data changed since the run
    ledger = tmp_path / "changed"
    steps(dataset, ledger, None, 2)
    header = json.loads((ledger / "ledger.json").read_text())
    header["sources"][0]["fingerprint"] = "0" * 64
    (ledger / "ledger.json").write_text(json.dumps(header))
    code, out = audit_cli(ledger, capsys)
    assert code == 1 and "changed since the run" in out


def test_checksums_are_compared_with_the_data_as_stored(dataset: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    steps(dataset, ledger, None, 6)
    read = read_ledger(ledger)
    auditor = ShardAuditor(read.sources)
    assert audit(read, auditor.expected_items, auditor.verify).ok
    read.rows["crc"][3] ^= 1  # one row's tokens differ from what is stored
    report = audit(read, auditor.expected_items, auditor.verify)
    assert not report.ok and "1 trained samples no longer match the data on disk" in report.problems[0]
    assert np.all(read.pieces["end"] == 64)


def test_a_mixture_resumed_at_another_batch_audits_clean_per_source(dataset: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    from llm.data import CombinedStreamingDataset

    (tmp_path / "other").mkdir()
    other = make_token_dataset(tmp_path / "other", n_lines=600)
    ledger = tmp_path / "ledger"

    def mixture() -> CombinedStreamingDataset:
        return CombinedStreamingDataset(
            [StreamingDataset(p, item_loader=TokensLoader(block_size=64), shuffle=True, seed=3) for p in (dataset, other)],
            weights=[0.7, 0.3], seed=5)

    loader = StreamingDataLoader(mixture(), batch_size=8, num_workers=2, ledger=ledger)
    for i, _ in enumerate(loader):
        if i == 9:
            break
    state = loader.state_dict()
    loader = StreamingDataLoader(mixture(), batch_size=4, ledger=ledger)
    loader.load_state_dict(state)
    for _ in loader:
        pass
    loader.state_dict()
    code, out = audit_cli(ledger, capsys)
    assert code == 0, out
    ledger_read = read_ledger(ledger)
    assert [s["order"] for s in ledger_read.sources] == ["mixture/source0", "mixture/source1"]
    assert set(np.unique(ledger_read.pieces["source"]).tolist()) == {0, 1}
    assert "source ds: " in out and "audit: OK" in out
