"""The stream_lm task on text streams: exact resume (also with workers and dropout), fingerprints."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm.training.checkpoint import load_checkpoint
from llm.training.core.loading import build_config
from llm.training.trainer import Trainer
from tests.resume import check_resume
from tests.training.test_trainer import (
    kill9_then_resume_matches_uninterrupted,
    run_trainer,
    tiny_tree,
    write_corpus,
)


def test_resume_is_exact_with_dropout_across_epochs(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 300)
    tree = tiny_tree(
        corpus,
        data={"steps_per_epoch": 5},
        model={"dropout": 0.1},  # the RNG state must travel with the checkpoint too
        training={"epochs": 2},
    )
    reference = check_resume(run_trainer, {"tree": tree, "task": "stream_lm"}, stops=[3, 5, 8], fresh_process=False)
    assert len(reference) == 10


def test_kill_9_between_checkpoints_with_two_workers(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 300)
    tree = tiny_tree(
        corpus,
        data={"steps_per_epoch": 4, "num_workers": 2},
        training={"epochs": 2},
        checkpoint={"save_interval_steps": 2},
    )
    kill9_then_resume_matches_uninterrupted(tmp_path, "stream_lm", tree)
    ckpt = load_checkpoint(tmp_path / "run" / "latest")
    assert ckpt["stream_data"]["line_index"]["0"] > 0 and "token_buffer" in ckpt["stream_data"]
    assert ckpt["stream_source"]["type"] == "local"


def test_stream_fingerprint_mismatch_names_both(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 300)
    ck = tmp_path / "ck"
    tree = tiny_tree(corpus, data={"steps_per_epoch": 2}, checkpoint={"checkpoint_dir": str(ck)})
    Trainer(build_config(tree), "stream_lm", log=lambda _: None).fit()
    resume = {**tree, "checkpoint": {"checkpoint_dir": str(ck), "resume_from_checkpoint": str(ck / "latest")}}
    other = tmp_path / "other.txt"
    write_corpus(other, 300)
    resume["data"] = {**tree["data"], "dataset_path": str(other)}
    with pytest.raises(ValueError, match=r"stream source fingerprint mismatch: checkpoint .*step_2 was written for .*demo.txt.* but this config streams .*other.txt"):
        Trainer(build_config(resume), "stream_lm", log=lambda _: None)
