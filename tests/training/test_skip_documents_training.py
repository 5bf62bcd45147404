"""`data.skip_documents` in llm-train: an id copied from `why`, kept by a resume that no longer lists it (the
checkpoint's union, said in the log), never trained again, and `llm-train audit` exits 0 counting it as skipped."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from llm.data.ledger.reader import read_ledger
from llm.data.skip_documents import SKIPPED
from llm.training.core.loading import build_config
from llm.training.ledger import LEDGER_DIR
from llm.training.trainer import Trainer
from tests.training.test_run_ledger import _cli, _corpus, _tree


def _train(tree: dict, task: str, stop_after: int | None = None) -> list[str]:
    lines: list[str] = []
    trainer = Trainer(build_config(tree), task, log=lines.append)
    try:
        trainer.fit(stop_after=stop_after)
    finally:
        trainer.close()
    return lines


def _pieces(run: Path) -> np.ndarray:
    (folder,) = sorted(p for p in (run / "ckpt" / LEDGER_DIR).iterdir() if p.is_dir())
    return read_ledger(folder).pieces


@pytest.mark.parametrize("task", ["lm", "stream_lm"])
def test_a_document_named_by_why_is_skipped_across_a_resume_and_audit_counts_it(
        tmp_path: Path, capsys: pytest.CaptureFixture, task: str) -> None:
    corpus = _corpus(tmp_path / "c.txt", 60 if task == "lm" else 200)
    extra = {"steps_per_epoch": 6} if task == "stream_lm" else {}

    def tree(run: Path, resume: str | None = None, **data: object) -> dict:
        t = _tree(corpus, run, resume=resume, **extra, **data)
        if task == "stream_lm":
            t["data"].pop("cache_dir")
        return t

    first = tmp_path / "first"
    _train(tree(first), task)
    code, out = _cli(capsys, "why", str(first / "ckpt"), "--step", "4")
    assert code == 0, out
    ids = re.findall(r" id (\S+)", out)
    assert ids and all(("@" in i) == (task == "lm") for i in ids), out
    doc = ids[-1]
    run = tmp_path / "run"
    _train(tree(run, skip_documents=[doc]), task, stop_after=4)
    lines = _train(tree(run, resume=str(run / "ckpt" / "latest")), task)  # the config no longer lists it
    assert any("data.skip_documents: 1 document(s)" in line and f"stay dropped (first: {doc})" in line
               for line in lines), lines
    code, out = _cli(capsys, "audit", str(run / "ckpt"))
    assert code == 0 and "audit: OK" in out and "skipped by id: " in out, out
    pieces = _pieces(run)
    marked = pieces[pieces["start"] == SKIPPED]
    trained = pieces[pieces["start"] != SKIPPED]
    assert len(marked)
    # nothing marked skipped was trained in this run (the same source, pass, file or block)
    key = ["source", "epoch", "name", "item"]
    assert not np.isin(marked[key], trained[key]).any()
