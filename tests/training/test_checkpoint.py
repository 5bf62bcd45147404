"""Atomic checkpoints: layout, `latest`, pruning, clear errors, and kill -9 in the middle of a save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from llm.training.checkpoint import (
    list_checkpoints,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)


def _payload(step: int, size: int = 8) -> dict:
    return {
        "model_state_dict": {"w": torch.full((size,), float(step))},
        "optimizer_state_dict": {},
        "scheduler_state_dict": {},
        "step": step,
        "epoch": 0,
        "stream_data": {"line_index": {"0": step}, "token_buffer": [1, 2, 3]},
        "stream_source": {"type": "local", "path": "x.txt"},
        "rng_states": [],
    }


def test_save_layout_latest_and_roundtrip(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 2, _payload(2))
    path = save_checkpoint(tmp_path, 4, _payload(4))
    assert path == tmp_path / "step_4"
    assert (tmp_path / "latest").read_text().strip() == "step_4"
    for spelling in (tmp_path / "latest", tmp_path, tmp_path / "step_4", tmp_path / "step_4" / "checkpoint.pt"):
        ckpt = load_checkpoint(spelling)
        assert ckpt["step"] == 4 and ckpt["stream_data"]["line_index"] == {"0": 4}
        assert torch.equal(ckpt["model_state_dict"]["w"], torch.full((8,), 4.0))
    assert load_checkpoint(tmp_path / "step_2")["step"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_kill_between_the_step_rename_and_latest_resumes_from_the_newest_step(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 2, _payload(2))
    save_checkpoint(tmp_path, 4, _payload(4))
    (tmp_path / "latest").unlink()  # killed after step_4 was renamed into place, before `latest` was written
    for spelling in (tmp_path / "latest", tmp_path):  # what the refusal of a fresh run over it tells the user
        assert resolve_checkpoint(spelling) == tmp_path / "step_4"
        assert load_checkpoint(spelling)["step"] == 4
    (tmp_path / "step_4" / "checkpoint.pt").unlink()  # a step folder without its file is not a checkpoint
    assert resolve_checkpoint(tmp_path / "latest") == tmp_path / "step_2"


def test_keep_last_n_prunes_oldest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 10, 11):
        save_checkpoint(tmp_path, step, _payload(step), keep_last_n=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [10, 11]
    assert load_checkpoint(tmp_path / "latest")["step"] == 11


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 3, _payload(3))
    payload = _payload(3)
    payload["epoch"] = 7
    save_checkpoint(tmp_path, 3, payload)
    assert load_checkpoint(tmp_path / "latest")["epoch"] == 7


def test_missing_and_broken_checkpoints_are_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*nope does not exist"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "latest").write_text("step_9\n")
    with pytest.raises(FileNotFoundError, match=r"names 'step_9', which is not a complete step_<N> checkpoint"):
        resolve_checkpoint(tmp_path / "latest")
    bad = tmp_path / "step_1"
    bad.mkdir()
    (bad / "checkpoint.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=r"step_1/checkpoint.pt cannot be read"):
        load_checkpoint(bad)


_SAVER = textwrap.dedent(
    """
    import sys, torch
    from llm.training.checkpoint import save_checkpoint
    root = sys.argv[1]
    step = 0
    while True:
        step += 1
        # ~4 MB per checkpoint so that a kill lands inside a save most of the time
        payload = {"model_state_dict": {"w": torch.full((1 << 20,), float(step))}, "step": step}
        save_checkpoint(root, step, payload, keep_last_n=2)
        print(step, flush=True)
    """
)


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
def test_kill_9_during_save_leaves_previous_checkpoint_loadable(tmp_path: Path) -> None:
    script = tmp_path / "saver.py"
    script.write_text(_SAVER)
    for attempt in range(3):
        root = tmp_path / f"run{attempt}"
        proc = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for _ in range(3 + attempt):  # wait until a few saves completed, then kill mid-stream
            assert proc.stdout.readline(), "the saver died before completing a checkpoint"
        time.sleep(0.01 * attempt)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        ckpt = load_checkpoint(root / "latest")
        step = ckpt["step"]
        assert step >= 3 + attempt
        # the payload is complete and belongs to the step `latest` names
        assert torch.equal(ckpt["model_state_dict"]["w"], torch.full((1 << 20,), float(step)))
        assert Path(ckpt["path"]).name == f"step_{step}"
        # a later save cleans up the killed save's temporary folder
        save_checkpoint(root, step + 100, _payload(step + 100))
        assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]


def test_a_key_newer_than_the_checkpoint_is_a_change_only_when_set_off_its_default() -> None:
    """A checkpoint written before a config key existed ran with that key's default."""
    from llm.training.checkpoint import config_changes
    from llm.training.core.config import TrainConfig

    defaults = TrainConfig().model_dump(mode="json")
    saved = TrainConfig().model_dump(mode="json")
    del saved["data"]["val_set_size"]  # an older checkpoint's config: the key did not exist yet
    current = TrainConfig().model_dump(mode="json")
    assert config_changes(saved, current, 1, 1, defaults) == []
    assert config_changes(saved, current, 1, 1) != []  # without the defaults it reads as a change
    current["data"]["val_set_size"] = 0.1
    assert config_changes(saved, current, 1, 1, defaults) == ["data.val_set_size: '(absent)' -> 0.1"]
