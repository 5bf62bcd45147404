"""Training under faults: a full disk during a checkpoint save, and resuming under a config that changes the run."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
import yaml

from llm.training.checkpoint import RESUMABLE_KEYS, load_checkpoint
from llm.training.core.loading import ConfigError, build_config
from llm.training.train import main as llm_train
from llm.training.trainer import Trainer
from tests.training.test_trainer import tiny_tree, write_corpus


def _disk_full_after(monkeypatch, folder: Path, budget: list[int]) -> None:
    """os.write into `folder` fails with ENOSPC once `budget[0]` bytes are written (a negative budget: never)."""
    real = os.write

    def write(fd: int, data) -> int:
        if budget[0] >= 0 and str(folder) in os.readlink(f"/proc/self/fd/{fd}"):
            if budget[0] == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = memoryview(data)[: budget[0]]
            budget[0] -= len(data)
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("budget", [0, 5000, 200_000])  # nothing, inside checkpoint.pt, at its end / meta.json
def test_disk_full_during_a_save_is_one_sentence_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, budget) -> None:
    torch.set_num_threads(1)
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    ck = tmp_path / "ck"
    tree = tiny_tree(corpus, data={"steps_per_epoch": 6}, checkpoint={"checkpoint_dir": str(ck), "save_interval_steps": 2})
    left = [-1]
    _disk_full_after(monkeypatch, ck, left)

    def fill_disk_after_step_2(trainer, batch, loss):
        if trainer.step == 2:
            left[0] = budget

    trainer = Trainer(build_config(tree), "stream_lm", callbacks=[fill_disk_after_step_2], log=lambda _: None)
    with pytest.raises(OSError, match=rf"^cannot write checkpoint {ck / 'step_4'} \(No space left on device\); "
                                      rf"the previous checkpoint step_2 is intact: free space in {ck} and resume$"):
        trainer.fit()
    trainer.close()
    left[0] = -1
    assert load_checkpoint(ck / "latest")["step"] == 2
    # the failed save left nothing behind (metrics.jsonl is the run's log, not a checkpoint)
    assert sorted(p.name for p in ck.iterdir() if p.name != "metrics.jsonl") == ["latest", "step_2"]


def test_llm_train_exits_2_when_the_first_save_finds_the_disk_full(tmp_path, monkeypatch, capsys) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    ck = tmp_path / "ck"
    tree = tiny_tree(corpus, data={"steps_per_epoch": 2}, checkpoint={"checkpoint_dir": str(ck)})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tree))
    _disk_full_after(monkeypatch, ck, [0])
    assert llm_train(["--task", "stream_lm", "--config-path", str(tmp_path / "cfg.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llm-train: error: cannot write checkpoint") and "no earlier checkpoint exists" in err
    assert "\n" not in err and not list(ck.glob(".tmp-*"))


def _trained(tmp_path: Path) -> tuple[dict, Path]:
    torch.set_num_threads(1)
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    ck = tmp_path / "ck"
    tree = tiny_tree(corpus, data={"steps_per_epoch": 2}, checkpoint={"checkpoint_dir": str(ck)})
    Trainer(build_config(tree), "stream_lm", log=lambda _: None).fit()
    tree["checkpoint"]["resume_from_checkpoint"] = str(ck / "latest")
    return tree, ck


def test_resuming_under_a_changed_config_names_every_key_that_differs(tmp_path) -> None:
    tree, ck = _trained(tmp_path)
    changed = {**tree, "model": {**tree["model"], "n_heads": 4}, "training": {**tree["training"], "lr": 1e-2}}
    # n_heads keeps every weight's shape: without the check the checkpoint would load silently
    with pytest.raises(ConfigError, match=r"checkpoint .*step_2 was trained with another config: model.n_heads: 2 -> 4; "
                                          r"training.lr: 0.003 -> 0.01 \(checkpoint -> this config\)"):
        Trainer(build_config(changed), "stream_lm", log=lambda _: None)
    # the keys that may change on resume: more epochs, other logging, workers, checkpoint settings
    allowed = {**tree, "training": {**tree["training"], "epochs": 2, "log_interval_steps": 5, "max_steps": 3},
               "data": {**tree["data"], "num_workers": 0},
               "checkpoint": {**tree["checkpoint"], "keep_last_n": 7, "save_interval_steps": 1}}
    trainer = Trainer(build_config(allowed), "stream_lm", log=lambda _: None)
    assert trainer.step == 2 and trainer.fit().steps == 3  # a finished schedule: max_steps more
    assert "training.epochs" in RESUMABLE_KEYS and "model.n_heads" not in RESUMABLE_KEYS


def test_llm_train_exits_2_on_a_changed_model_key(tmp_path, capsys) -> None:
    tree, ck = _trained(tmp_path)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tree))
    assert llm_train(["--task", "stream_lm", "--config-path", str(tmp_path / "cfg.yaml"), "--set", "model.n_heads=4"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "was trained with another config: model.n_heads: 2 -> 4 (checkpoint -> this config)" in line
