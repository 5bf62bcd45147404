"""The guide's sequence, exactly as a user types it, in a fresh directory: train, edit the YAML, resume."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llm.training.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def sh(command: str, cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def losses(out: str) -> list[float]:
    return [float(x) for x in re.findall(r"\| loss ([0-9.]+)", out)]


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
def test_guide_sequence(tmp_path: Path) -> None:
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    sh("mkdir -p data", tmp_path)
    sh("""python -c "print('\\n'.join(f'sample line {i}' for i in range(500)))" > data/demo.txt""", tmp_path)
    assert (tmp_path / "data" / "demo.txt").read_text().splitlines()[499] == "sample line 499"

    train = "llm-train --task stream_lm --config-path configs/streaming_local_demo.yaml --epochs 1 --steps-per-epoch 5"
    first = sh(train, tmp_path)
    assert "step 5/5" in first and "saved checkpoint checkpoints/demo/step_5" in first
    assert (tmp_path / "checkpoints" / "demo" / "latest").read_text().strip() == "step_5"

    # the user's edit: checkpoint.checkpoint_dir and checkpoint.resume_from_checkpoint
    cfg = tmp_path / "configs" / "streaming_local_demo.yaml"
    text = cfg.read_text()
    text = re.sub(r"checkpoint_dir: .*", "checkpoint_dir: checkpoints/demo", text)
    text = re.sub(r"resume_from_checkpoint: .*", "resume_from_checkpoint: checkpoints/demo/latest", text)
    cfg.write_text(text)

    second = sh(train, tmp_path)
    assert "resumed from checkpoints/demo/step_5 at step 5" in second
    assert "step 6/10" in second and "step 10/10" in second
    assert (tmp_path / "checkpoints" / "demo" / "latest").read_text().strip() == "step_10"
    before = load_checkpoint(tmp_path / "checkpoints" / "demo" / "step_5")
    after = load_checkpoint(tmp_path / "checkpoints" / "demo" / "latest")
    assert after["stream_data"]["line_index"]["0"] > before["stream_data"]["line_index"]["0"] > 0
    assert after["stream_source"] == before["stream_source"]
    assert losses(second)[-1] < losses(first)[0]

    # then a short run on optimized shards of the same text
    sh("llm-data optimize data/demo.txt --output data/demo_optimized --tokenizer simple --num-workers 1 --no-progress", tmp_path)
    third = sh("llm-train --task stream_lm --config-path configs/optimized_demo.yaml --epochs 1", tmp_path)
    assert "trained" in third and losses(third)[-1] < losses(third)[0]
    assert load_checkpoint(tmp_path / "checkpoints" / "optimized_demo" / "latest")["stream_source"]["type"] == "optimized"
