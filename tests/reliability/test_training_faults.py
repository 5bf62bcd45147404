"""Training under faults: a full disk during a checkpoint save, and resuming under a config that changes the run."""

from __future__ import annotations

import errno
import os
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from llm.training.checkpoint import RESUMABLE_KEYS, load_checkpoint, run_step
from llm.training.core.loading import ConfigError, build_config
from llm.training.train import main as llm_train
from llm.training.trainer import Trainer
from tests.training.test_trainer import tiny_tree, write_corpus


def _disk_full_after(monkeypatch, folder: Path, budget: list[int]) -> None:
    """os.write (and os.writev) into `folder` fails with ENOSPC once `budget[0]` bytes are written (a negative budget:
    never)."""
    real = os.write

    def write(fd: int, data) -> int:
        if budget[0] >= 0 and str(folder) in os.readlink(f"/proc/self/fd/{fd}"):
            if budget[0] == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = memoryview(data)[: budget[0]]
            budget[0] -= len(data)
        return real(fd, data)

    def writev(fd: int, views) -> int:  # as a kernel does on a full disk: what fits, then ENOSPC
        return write(fd, b"".join(bytes(v) for v in views))

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "writev", writev)


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
    # the failed save left nothing behind (metrics.jsonl and the ledger are the run's logs, not a checkpoint)
    assert sorted(p.name for p in ck.iterdir() if p.name not in ("metrics.jsonl", "ledger")) == ["latest", "step_2"]


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
    assert trainer.step == 2 and trainer.fit().steps == 1  # max_steps is the total: one more step, to 3
    assert "training.epochs" in RESUMABLE_KEYS and "model.n_heads" not in RESUMABLE_KEYS


def test_llm_train_exits_2_on_a_changed_model_key(tmp_path, capsys) -> None:
    tree, ck = _trained(tmp_path)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tree))
    assert llm_train(["--task", "stream_lm", "--config-path", str(tmp_path / "cfg.yaml"), "--set", "model.n_heads=4"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "was trained with another config: model.n_heads: 2 -> 4 (checkpoint -> this config)" in line


class Killed(BaseException):
    """A crash at a chosen point: like kill -9, no `except Exception` / `except OSError` sees it."""


# the steps of one checkpoint save, in order (`checkpoint.save_checkpoint`, then the publication of the
# dedup digests it carries); "torn": the step half done (half the file written) and then the crash
SAVE_STEPS = ["payload", "payload torn", "meta", "fsync folder", "rename folder", "pointer", "rename pointer",
              "fsync root", "publish digests", "publish digests torn", "after the save"]


def _crash_inside_save(monkeypatch, ck: Path, save: int, point: str, fired: list[str]) -> None:
    """Crash at `point` of the `save`-th checkpoint save of the run (events are counted per save)."""
    import llm.training.checkpoint as ckpt

    seen: list[str] = []  # the events of the save in progress
    saves = [0]

    def at(name: str, torn=None):
        if name == "payload":
            saves[0] += 1
            seen.clear()
        seen.append(name)
        if saves[0] == save and (point == name or point == f"{name} torn"):
            fired.append(point)
            if point.endswith("torn") and torn:
                torn()
            raise Killed(point)

    real = {name: getattr(ckpt, name) for name in ("_write_payload", "write_file", "fsync_dir", "publish_seen_hashes")}
    real_replace = os.replace

    def payload(path, data):
        at("payload", lambda: (real["_write_payload"](path, data), os.truncate(path, os.path.getsize(path) // 2)))
        real["_write_payload"](path, data)

    def write_file(path, data):
        at("meta" if Path(path).name == ckpt.META_FILE else "pointer")
        return real["write_file"](path, data)

    def fsync_dir(path):
        at("fsync root" if Path(path) == ck else "fsync folder")
        real["fsync_dir"](path)

    def replace(src, dst):
        if Path(dst).parent == ck:
            at("rename pointer" if Path(dst).name == ckpt.LATEST else "rename folder")
        real_replace(src, dst)

    def publish(state):
        def torn():
            path = Path(state["seen_hashes"]["path"])
            before = path.stat().st_size if path.exists() else 0
            real["publish_seen_hashes"](state)
            os.truncate(path, before + (path.stat().st_size - before) // 2 + 1)

        at("publish digests", torn)
        real["publish_seen_hashes"](state)

    monkeypatch.setattr(ckpt, "_write_payload", payload)
    monkeypatch.setattr(ckpt, "write_file", write_file)
    monkeypatch.setattr(ckpt, "fsync_dir", fsync_dir)
    monkeypatch.setattr(ckpt, "publish_seen_hashes", publish)
    monkeypatch.setattr(ckpt.os, "replace", replace)


def _dedup_run(tmp_path: Path) -> tuple[dict, Path]:
    corpus = write_corpus(tmp_path / "demo.txt", 300)
    ck = tmp_path / "ck"
    tree = tiny_tree(corpus, data={"data_source": "dedup_local", "seen_hashes_path": str(ck / "seen_hashes.txt"),
                                   "write_seen_hashes": True, "steps_per_epoch": 7},
                     checkpoint={"checkpoint_dir": str(ck), "save_interval_steps": 3})
    return tree, ck


def _train(tree: dict, callback=None, batches: list | None = None) -> list:
    """Train `tree` to the end (resuming the run in its checkpoint_dir if it has one); the batches, step by step.

    Recorded as the model reads them, so a step whose checkpoint save is then killed counts too.
    """
    torch.set_num_threads(1)
    ck = Path(tree["checkpoint"]["checkpoint_dir"])
    step = run_step(ck)
    if step is not None:
        tree = {**tree, "checkpoint": {**tree["checkpoint"], "resume_from_checkpoint": str(ck / f"step_{step}")}}
    trainer = Trainer(build_config(tree), "stream_lm", callbacks=[callback] if callback else [], log=lambda _: None)
    batches = [] if batches is None else batches
    forward = trainer.raw_model.forward

    def record(input_ids, *args, **kwargs):
        batches.append(input_ids.numpy().copy())
        return forward(input_ids, *args, **kwargs)

    trainer.raw_model.forward = record
    trainer.fit()
    return batches


@pytest.fixture(scope="module")
def dedup_reference(tmp_path_factory) -> list:
    tree, _ = _dedup_run(tmp_path_factory.mktemp("reference"))
    return _train(tree)


def _records(batches: list) -> Counter:
    from bench.soak import documents

    return Counter(doc for batch in batches for doc in documents(batch))


@pytest.mark.parametrize("save", [1, 2])
@pytest.mark.parametrize("point", SAVE_STEPS)
def test_a_crash_anywhere_in_a_dedup_checkpoint_save_loses_and_repeats_no_record(
    tmp_path, monkeypatch, dedup_reference, save, point
) -> None:
    """The seen-hashes file commits with the checkpoint: a digest counts once the checkpoint carrying it exists.

    The run is killed at one step of its first (or second) checkpoint save, then restarted the plain way:
    resumed from the newest complete checkpoint if there is one, from scratch if not.
    """
    tree, ck = _dedup_run(tmp_path)
    fired: list[str] = []
    killed: list = []

    def after_the_save(trainer, batch, loss):
        if point == "after the save" and trainer.step == 3 * save:
            fired.append(point)
            raise Killed(point)

    with monkeypatch.context() as patch:
        _crash_inside_save(patch, ck, save, point, fired)
        with pytest.raises(Killed):
            _train(tree, after_the_save, killed)
    assert fired == [point]
    landed = run_step(ck) or 0
    trained = killed[:landed] + _train(tree)  # the steps that the last run to reach them trained
    assert len(dedup_reference) == len(trained) == 7
    assert _records(trained) == _records(dedup_reference)  # no record lost, none repeated
    for step, (got, want) in enumerate(zip(trained, dedup_reference), 1):
        assert (got == want).all(), f"step {step} trained another batch than the uninterrupted run"
