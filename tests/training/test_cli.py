"""`llm-train` as a user runs it (a subprocess): earlier runs are never lost silently; `--set key=null` sets None."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llm.training.checkpoint import list_checkpoints, load_checkpoint
from llm.training.core.loading import load_config, parse_override
from llm.training.train import main as train_main
from tests.training.test_trainer import tiny_tree, write_corpus

BIN = Path(sys.executable).parent


def llm_train(args: list[str], cwd: Path, module: bool = True) -> subprocess.CompletedProcess:
    """`python -m llm.training.train ARGS` (torchrun's spelling) or the `llm-train` console script."""
    command = [sys.executable, "-m", "llm.training.train"] if module else [str(BIN / "llm-train")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _setup(tmp_path: Path, **sections: dict) -> list[str]:
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    tree = tiny_tree(corpus, **{"data": {"steps_per_epoch": 2}, "checkpoint": {"checkpoint_dir": "ck"}, **sections})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tree))
    return ["--task", "lm", "--config-path", "cfg.yaml"]


def _first_error_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.splitlines()[0]


@pytest.mark.slow  # end to end; `make test-all` and CI run it
def test_fresh_run_into_a_folder_holding_a_run_is_refused_until_overwrite(tmp_path: Path) -> None:
    args = _setup(tmp_path)
    first = llm_train([*args, "--epochs", "3"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert [s for s, _ in list_checkpoints(tmp_path / "ck")] == [2, 4, 6]
    before = (tmp_path / "ck" / "step_6" / "checkpoint.pt").read_bytes()

    again = llm_train(args, tmp_path)
    assert again.returncode == 2
    assert _first_error_line(again) == (
        "llm-train: error: checkpoint.checkpoint_dir ck already holds a run at step 6; resume it with "
        "checkpoint.resume_from_checkpoint: ck/latest, pass --overwrite to replace it, or choose another checkpoint_dir"
    )
    assert (tmp_path / "ck" / "latest").read_text().strip() == "step_6"  # nothing moved
    assert (tmp_path / "ck" / "step_6" / "checkpoint.pt").read_bytes() == before

    # resuming the run in that folder is what the message proposes, and it is allowed
    resumed = llm_train([*args, "--set", "checkpoint.resume_from_checkpoint=ck/latest"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from ck/step_6 at step 6" in resumed.stdout
    assert load_checkpoint(tmp_path / "ck" / "latest")["step"] == 8

    # --overwrite: a new run from step 0 whose checkpoints replace the earlier run's
    fresh = llm_train([*args, "--overwrite"], tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert "resumed" not in fresh.stdout
    assert [s for s, _ in list_checkpoints(tmp_path / "ck")] == [2]
    assert load_checkpoint(tmp_path / "ck" / "latest")["step"] == 2
    assert list((tmp_path / "ck" / ".data").iterdir()), "the prepared text is kept for the next run"


@pytest.mark.slow  # end to end; `make test-all` and CI run it
def test_resuming_another_folder_into_a_folder_holding_a_run_is_refused(tmp_path: Path) -> None:
    args = _setup(tmp_path)
    assert llm_train(args, tmp_path).returncode == 0
    assert llm_train([*args, "--set", "checkpoint.checkpoint_dir=other"], tmp_path).returncode == 0
    proc = llm_train([*args, "--set", "checkpoint.resume_from_checkpoint=other/latest"], tmp_path)
    assert proc.returncode == 2
    assert _first_error_line(proc).startswith("llm-train: error: checkpoint.checkpoint_dir ck already holds a run at step 2;")


def test_set_null_sets_none_where_the_key_allows_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    val = tmp_path / "val.txt"
    val.write_text("sample line\n")
    args = _setup(tmp_path, data={"steps_per_epoch": 2, "val_dataset_path": str(val)})
    cfg = tmp_path / "cfg.yaml"
    assert load_config(cfg).checkpoint.checkpoint_dir == "ck" and load_config(cfg).data.val_dataset_path == str(val)
    nulls = dict(parse_override(item) for item in ("checkpoint.checkpoint_dir=null", "data.val_dataset_path=null"))
    config = load_config(cfg, nulls)
    assert config.checkpoint.checkpoint_dir is None and config.data.val_dataset_path is None

    monkeypatch.chdir(tmp_path)  # the CLI names the file as given on its command line
    assert train_main([*args, "--set", "training.batch_size=null"]) == 2
    assert capsys.readouterr().err == (
        "llm-train: error: cfg.yaml: training.batch_size cannot be null; give it a value or leave it out\n")


@pytest.mark.slow  # end to end (six llm-train processes, ~40 s of `make test`); `make test-all` and CI run it
def test_console_script_and_module_behave_alike(tmp_path: Path) -> None:
    args = _setup(tmp_path)
    for extra in (["--set", "training.lrr=1"], ["--set", "model.d_model=null"]):
        as_module, as_script = llm_train([*args, *extra], tmp_path), llm_train([*args, *extra], tmp_path, module=False)
        assert as_module.returncode == as_script.returncode == 2
        assert as_module.stderr == as_script.stderr and as_module.stderr.count("\n") == 1
    usage = llm_train(["--task", "lm"], tmp_path), llm_train(["--task", "lm"], tmp_path, module=False)
    assert usage[0].returncode == usage[1].returncode == 2 and usage[0].stderr == usage[1].stderr
    assert "the following arguments are required: --config-path" in usage[0].stderr
