"""Issue 36's founding fault: a scheduled mixture resumed with another global batch size, on a build that
still has the bug (the resume forgets the step clock), serves samples twice and never; the audit says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm.data import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.mix.resume import MixHistory
from tests.data.ledger.test_shard_ledger import audit_cli
from tests.data.shards.helpers import make_token_dataset

SCHEDULE = [{"step": 0, "weights": [0.8, 0.2]}, {"step": 6, "weights": [0.2, 0.8]}]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("mix-bug")
    out = []
    for name, lines in (("a", 900), ("b", 700)):
        (root / name).mkdir()
        out.append(make_token_dataset(root / name, n_lines=lines))
    return out


def _run(sources: list[Path], ledger: Path, monkeypatch: pytest.MonkeyPatch, forget_clock: bool) -> None:
    def mixture() -> CombinedStreamingDataset:
        return CombinedStreamingDataset(
            [StreamingDataset(p, item_loader=TokensLoader(block_size=64), shuffle=True, seed=3) for p in sources],
            schedule=SCHEDULE, seed=5)

    loader = StreamingDataLoader(mixture(), batch_size=8, ledger=ledger)
    for i, _ in enumerate(loader):
        if i == 9:  # past the schedule's change at step 6, at 8 samples a step
            break
    state = loader.state_dict()
    if forget_clock:  # the old build: the resumed plan puts the schedule's past at the new batch size
        resolve = CombinedStreamingDataset.resolve

        def without_clock(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            resume = resolve(self, *args, **kwargs)
            history = resume.history
            return resume if history is None else type(resume)(**{**resume.__dict__, "history": MixHistory(
                slots=history.slots, base=history.base, retired=history.retired)})

        monkeypatch.setattr(CombinedStreamingDataset, "resolve", without_clock)
    loader = StreamingDataLoader(mixture(), batch_size=3, ledger=ledger)
    loader.load_state_dict(state)
    for i, _ in enumerate(loader):
        if i == 40:
            break
    loader.state_dict()


def test_the_fixed_build_audits_clean(sources: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture) -> None:
    _run(sources, tmp_path / "ledger", monkeypatch, forget_clock=False)
    code, out = audit_cli(tmp_path / "ledger", capsys)
    assert code == 0 and "audit: OK" in out, out


def test_a_build_that_still_has_the_bug_is_caught(sources: list[Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    _run(sources, tmp_path / "ledger", monkeypatch, forget_clock=True)
    code, out = audit_cli(tmp_path / "ledger", capsys)
    assert code == 1, out
    # the bug's signature: the past re-planned at the new batch serves some samples again, never others
    assert "trained 2 times" in out and "was never trained" in out, out
    assert "audit: FAILED" in out
