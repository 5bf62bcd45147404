"""With `write_seen_hashes`, the seen-hashes file holds each digest once: over passes, epochs, resumes and workers."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest
import torch

from llm.data.dedup import DedupTextSource, normalize
from llm.data.sources import LocalLineTextSource
from llm.training.core.loading import build_config
from llm.training.trainer import Trainer
from tests.training.test_trainer import tiny_tree


def _lines(seen: Path) -> Counter:
    return Counter(seen.read_text().splitlines())


def _sha(text: str) -> str:
    return hashlib.sha256(normalize(text).encode()).hexdigest()


def test_standalone_passes_a_stopped_pass_and_a_new_process_write_each_digest_once(tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    texts = [f"record {i % 40} of the corpus" for i in range(100)]  # 40 distinct records, repeated
    corpus.write_text("\n".join(texts) + "\n")
    seen = tmp_path / "seen.txt"
    source = DedupTextSource(LocalLineTextSource(corpus), seen_hashes_path=seen, write_seen_hashes=True)
    for _ in range(3):  # three epochs: each pass yields the corpus again (the baseline is the file as it was)
        assert len(list(source.iter_texts())) == 40
    stopped = source.iter_texts()
    assert len([next(stopped) for _ in range(10)]) == 10
    stopped.close()
    source.reset_cross_run_seen()  # earlier runs' records read again: still not written again
    assert len(list(source)) == 40
    assert _lines(seen) == Counter({_sha(t): 1 for t in texts})
    resumed = DedupTextSource(LocalLineTextSource(corpus), seen_hashes_path=seen, write_seen_hashes=True)
    assert list(resumed.iter_texts()) == [] and list(resumed.iter_texts()) == []
    corpus.write_text("\n".join([*texts, "a new record", "a new record"]) + "\n")
    grown = DedupTextSource(LocalLineTextSource(corpus), seen_hashes_path=seen, write_seen_hashes=True)
    assert list(grown.iter_texts()) == ["a new record"] and list(grown.iter_texts()) == ["a new record"]
    assert _lines(seen) == Counter({_sha(t): 1 for t in [*texts, "a new record"]})


def _train(tree: dict, steps: int, resume: str | None = None) -> None:
    torch.set_num_threads(1)
    if resume:
        tree = {**tree, "checkpoint": {**tree["checkpoint"], "resume_from_checkpoint": resume}}
    trainer = Trainer(build_config(tree), "stream_lm", log=lambda _: None)
    try:
        trainer.fit(stop_after=steps)
    finally:
        trainer.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_training_over_epochs_and_a_resume_writes_each_digest_once(tmp_path: Path, workers: int) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [f"sample record {i} says {'abc'[i % 3] * (1 + i % 4)}" for i in range(150)]
    for name in ("a.txt", "b.txt"):  # the same records in two files: two workers read a copy each at once
        (corpus / name).write_text("\n".join(texts) + "\n")
    ck = tmp_path / "ck"
    seen = ck / "seen_hashes.txt"
    tree = tiny_tree(corpus, data={"data_source": "dedup_local", "seen_hashes_path": str(seen),
                                   "write_seen_hashes": True, "steps_per_epoch": 4, "num_workers": workers},
                     training={"epochs": 3}, checkpoint={"checkpoint_dir": str(ck), "save_interval_steps": 2})
    _train(tree, 6)  # an epoch and a half
    _train(tree, 6, str(ck / "step_4"))  # resumed from a checkpoint before the last: its later digests are cut
    lines = _lines(seen)
    assert lines and max(lines.values()) == 1, [n for n in lines.values() if n > 1]
    assert set(lines) <= {_sha(t) for t in texts}
