"""A shard mixture's shares are audited per schedule phase, from the schedule its ledger records: a scheduled run
resumed at another batch audits clean, and a ledger whose schedule or weights say otherwise fails, naming the phase."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llm.cli.data import main as llm_data
from llm.data import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.ledger.reader import read_ledger
from tests.data.shards.helpers import make_token_dataset

SWITCH = [{"step": 0, "weights": [0.9, 0.1]}, {"step": 10, "weights": [0.2, 0.8]}]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("mix-sources")
    (root / "a").mkdir(), (root / "b").mkdir()
    return [make_token_dataset(root / "a", n_lines=1500), make_token_dataset(root / "b", n_lines=600)]


def train(sources: list[Path], ledger: Path, **mixing: object) -> None:
    """7 steps of 8 rows with 2 workers, then a resume at batch 4 for 21 more; every state commits the ledger."""
    def mixture() -> CombinedStreamingDataset:
        return CombinedStreamingDataset([StreamingDataset(p, item_loader=TokensLoader(block_size=64), shuffle=True,
                                                          seed=3) for p in sources], seed=5, **mixing)

    state = None
    for batch, workers, steps in ((8, 2, 7), (4, 0, 21)):
        loader = StreamingDataLoader(mixture(), batch_size=batch, num_workers=workers, ledger=ledger)
        if state is not None:
            loader.load_state_dict(state)
        for i, _ in enumerate(loader):
            if i + 1 == steps:
                break
        state = loader.state_dict()


def audit_cli(ledger: Path, capsys: pytest.CaptureFixture, *more: str) -> tuple[int, str]:
    code = llm_data(["audit", str(ledger), *more])
    return code, capsys.readouterr().out


def edit_header(ledger: Path, change: object) -> None:
    header = json.loads((ledger / "ledger.json").read_text())
    for source in header["sources"]:
        change(source)
    (ledger / "ledger.json").write_text(json.dumps(header))


@pytest.mark.parametrize("unit", ["step", "samples"])
def test_a_scheduled_mixture_audits_clean_per_phase(sources: list[Path], tmp_path: Path, unit: str,
                                                    capsys: pytest.CaptureFixture) -> None:
    # by samples the switch falls inside a step of the resumed run (62 = 7 x 8 + 6): that step is split by position
    schedule = SWITCH if unit == "step" else [{"samples": 0, "weights": [0.9, 0.1]}, {"samples": 62, "weights": [0.2, 0.8]}]
    ledger = tmp_path / "ledger"
    train(sources, ledger, schedule=schedule)
    code, out = audit_cli(ledger, capsys)
    assert code == 0, out
    assert f"phase from {unit} 0 (steps 1-" in out and f"phase from {unit} {schedule[1][unit]} (steps " in out, out
    assert read_ledger(ledger).sources[0]["mixture"]["schedule"] == schedule
    assert read_ledger(ledger).markers[1]["topology"]["mixture"]["schedule"] == schedule  # the resume's own


def test_a_schedule_audited_against_the_wrong_phase_is_named(sources: list[Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    train(sources, ledger, schedule=SWITCH)

    def earlier(source: dict) -> None:  # the header says the switch came at step 4: the first run's steps 5-7 disagree
        source["mixture"]["schedule"][1]["step"] = 4

    edit_header(ledger, earlier)
    code, out = audit_cli(ledger, capsys, "--no-verify")
    assert code == 1, out
    assert "problem: ds in the phase from step 4 (steps 5-7) has share 0.9" in out and "weights give 0.2000" in out, out


def test_forged_shares_of_a_weighted_mixture_are_caught(sources: list[Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    ledger = tmp_path / "ledger"
    train(sources, ledger, weights=[0.7, 0.3])
    code, out = audit_cli(ledger, capsys)
    assert code == 0 and "(weight 0.7000)" in out, out
    # the rows' sources forged: every row of the first segment says it came from ds
    segment = sorted(p for p in ledger.iterdir() if p.name.startswith("r"))[0]
    from llm.data.ledger.format import decode_segment, encode_segment

    decoded = decode_segment(segment.read_bytes(), str(segment))
    decoded.pieces["source"] = 0
    segment.write_bytes(encode_segment({k: v for k, v in decoded.header.items() if k not in ("rows", "pieces")},
                                       decoded.rows, decoded.pieces))
    code, out = audit_cli(ledger, capsys, "--no-verify")
    assert code == 1 and "problem: ds in the phase from step 0 (steps 1-" in out and "weights give 0.7000" in out, out


TEXT_SCHEDULE = [{"step": 0, "weights": [0.8, 0.2]}, {"step": 15, "weights": [0.3, 0.7]},
                 {"step": 40, "weights": [0.5, 0.5]}]


def text_run(tmp_path: Path, ledger: Path, workers: int = 0) -> None:
    """A weighted text mixture of records on a schedule: 20 steps of 4 rows, resumed for 35 steps of 6."""
    from llm.data.text.stream import StreamingTextDataModule
    from llm.training.core.data_config import DataConfig

    paths = []
    for name in ("left", "right"):
        path = tmp_path / f"{name}.txt"
        path.write_text("".join(f"{name} {i} alpha beta {i * 7}\n" for i in range(600)))
        paths.append(str(path))
    config = DataConfig(datasets=[{"dataset_path": p} for p in paths], max_seq_len=16,
                        streaming_dataset_mixing_strategy="weighted", streaming_mixing_schedule=TEXT_SCHEDULE, num_workers=workers)
    state = None
    for batch, steps in ((4, 20), (6, 35)):
        module = StreamingTextDataModule(config, batch, loop=False, ledger=ledger)
        if state is not None:
            module.load_state_dict(state)
        for i, _ in enumerate(module.train_dataloader()):
            if i + 1 == steps:
                break
        state = module.state_dict()


def test_a_text_mixtures_schedule_is_audited_per_phase(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The text module's scheduled mixture (shares of records), resumed at another batch: each phase's records
    per source against its weights; the header's schedule moved earlier fails, naming the phase."""
    ledger = tmp_path / "ledger"
    text_run(tmp_path, ledger)
    code, out = audit_cli(ledger, capsys)
    assert code == 0, out
    for first, phase, share in (("step 0", "1-15", 0.8), ("step 15", "16-40", 0.3)):
        got = re.search(rf"phase from {first} \(steps {phase}\): left ([0-9.]+) \(expected ([0-9.]+)\)", out)
        assert got and abs(float(got[1]) - share) < 0.02 and float(got[2]) == pytest.approx(share, abs=1e-4), out
    assert read_ledger(ledger).markers[1]["topology"]["mixture"]["schedule"] == TEXT_SCHEDULE

    def earlier(source: dict) -> None:
        source["mixture"]["schedule"][1]["step"] = 8

    edit_header(ledger, earlier)
    code, out = audit_cli(ledger, capsys, "--no-verify")
    # the first run's steps 9-20 stand on the header (the resume's marker keeps its own schedule)
    assert code == 1 and "problem: left in the phase from step 8 (steps 9-20) has share 0." in out, out
    assert "weights give 0.3000" in out, out

