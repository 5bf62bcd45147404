"""llm-train's default checkpoint_dir follows the config file's name; a key, `--set` or a resume under the old default wins."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llm.training.checkpoint import list_checkpoints
from llm.training.core.loading import load_config
from llm.training.run_folder import with_run_folder
from llm.training.train import main as train_main
from tests.training.test_trainer import tiny_tree, write_corpus


def _config(tmp_path: Path, name: str, **checkpoint: object) -> Path:
    tree = tiny_tree(write_corpus(tmp_path / "demo.txt", 200), data={"steps_per_epoch": 2})
    del tree["checkpoint"]  # as the guide's sft and Axolotl examples: no checkpoint: section
    if checkpoint:
        tree["checkpoint"] = checkpoint
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree))
    return path


def test_two_configs_without_a_checkpoint_section_train_into_two_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("first.yaml", "second.yaml"):
        _config(tmp_path, name)
        assert train_main(["--task", "lm", "--config-path", name]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        stem = Path(name).stem
        assert out.splitlines()[0] == (f"llm-train: checkpoints go to checkpoints/{stem} (after the config file {name}; "
                                       "set checkpoint.checkpoint_dir, or --set checkpoint.checkpoint_dir=DIR, to choose)")
        assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints" / stem)] == [2]
    assert not (tmp_path / "checkpoints" / "latest").exists()  # nothing in the shared folder


def test_a_key_or_set_wins_and_a_resume_under_the_old_default_stays_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    plain = _config(tmp_path, "plain.yaml")
    assert with_run_folder(load_config(plain), "configs/plain.yaml").checkpoint.checkpoint_dir == "checkpoints/plain"
    for overrides, expected in (({"checkpoint.checkpoint_dir": "mine"}, "mine"),
                                ({"checkpoint.checkpoint_dir": None}, None)):  # --set ...=null: never save
        assert with_run_folder(load_config(plain, overrides), "plain.yaml").checkpoint.checkpoint_dir == expected
    named = _config(tmp_path, "named.yaml", checkpoint_dir="runs/a")
    assert with_run_folder(load_config(named), "named.yaml").checkpoint.checkpoint_dir == "runs/a"
    capsys.readouterr()

    # a run written to checkpoints/ before the default followed the config's name: its resume continues there
    old = tmp_path / "checkpoints" / "step_4"
    old.mkdir(parents=True)
    (old / "checkpoint.pt").write_bytes(b"")
    (tmp_path / "checkpoints" / "latest").write_text("step_4\n")
    config = with_run_folder(load_config(plain, {"checkpoint.resume_from_checkpoint": "checkpoints/latest"}), "plain.yaml")
    assert config.checkpoint.checkpoint_dir == "checkpoints"
    assert capsys.readouterr().out == (
        "llm-train: checkpoints go to checkpoints (where the run of checkpoints/latest is: the default before it became "
        "checkpoints/plain; set checkpoint.checkpoint_dir, or --set checkpoint.checkpoint_dir=DIR, to choose)\n")
