"""`llm-train why|spikes` and `llm-data audit` given what a hostile user would type: counts below the range,
a run or checkpoint folder, the folder of all a run's ledgers, a path that does not exist."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm.cli.data import main as llm_data
from llm.training.train import main as llm_train


@pytest.mark.parametrize("argv, named", [
    (["spikes", "RUN", "--top", "-3"], "argument --top: -3 is below 1"),
    (["spikes", "RUN", "--top", "0"], "argument --top: 0 is below 1"),
    (["spikes", "RUN", "--window", "2"], "argument --window: 2 is below 3"),
    (["why", "RUN", "--step", "2", "--preview", "-1"], "argument --preview: -1 is below 0"),
    (["why", "RUN", "--step", "x"], "argument --step: invalid int value: 'x'"),
])
def test_counts_out_of_range_are_refused_before_anything_is_read(argv: list[str], named: str,
                                                                  capsys: pytest.CaptureFixture) -> None:
    # before: --top -3 or --window 2 printed "no spike" (exit 0), a guess
    with pytest.raises(SystemExit) as exit_:
        llm_train(argv)
    assert exit_.value.code == 2 and named in capsys.readouterr().err


def _audit(path: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = llm_data(["audit", str(path)])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_llm_data_audit_names_what_it_was_given_instead_of_a_ledger(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    code, out = _audit(tmp_path / "nope", capsys)
    assert code == 2 and f"ledger folder {tmp_path / 'nope'} does not exist" in out, out
    run = tmp_path / "ckpt"
    (run / "step_3").mkdir(parents=True)
    (run / "latest").write_text("step_3\n")
    (run / "step_3" / "meta.json").write_text("{}")
    for ledger in ("6d28c9318f405ab3", "7a7af54a33cc17fc"):
        (run / "ledger" / ledger).mkdir(parents=True)
        (run / "ledger" / ledger / "ledger.json").write_text(json.dumps({"version": 1, "run": ledger, "sources": []}))
    for folder in (run, run / "step_3"):
        code, out = _audit(folder, capsys)
        assert code == 2 and f"is an llm-train run or checkpoint folder, not a ledger; audit it with " \
                             f"`llm-train audit {folder}`" in out, out
    code, out = _audit(run / "ledger", capsys)
    assert code == 2 and "holds the ledgers of runs 6d28c9318f405ab3, 7a7af54a33cc17fc, not one ledger" in out, out
    code, out = _audit(tmp_path, capsys)  # a folder with nothing of a ledger: the reader's own sentence
    assert code == 2 and "holds no ledger (ledger.json is missing)" in out, out
