"""Every hub example has a local twin: offline, llm-train fails at once naming it, and the twin config trains."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("datasets")

import huggingface_hub.constants  # noqa: E402

from llm.cli.train import main  # noqa: E402
from tests.hub import closed_port, watch_hub  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SMALL = ["--set", "model.d_model=32", "--set", "model.n_layers=1", "--set", "model.n_heads=2"]
AXOLOTL_C4 = {"pretraining_dataset": [{"path": "allenai/c4", "name": "en", "type": "pretrain"}], "max_steps": 3,
              "micro_batch_size": 2, "sequence_len": 32, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2}}
TWIN_KEYS = {  # the keys each hub example's sentence tells the user to set, and the twin config it names
    "streaming_c4.yaml": ["set data_source: dedup_local with dataset_path:", "keep data_source: dedup_hf with "
                          "dataset_name: json and dataset_path:", "configs/streaming_c4_local.yaml"],
    "axolotl": ["set pretraining_dataset: - path: a local .jsonl, .txt or .parquet file or folder",
                "configs/axolotl_pretrain_demo.yaml"],
}


def _argv(example: str, tmp_path: Path) -> list[str]:
    if example == "axolotl":
        path = tmp_path / "axolotl_c4.yaml"
        path.write_text(yaml.safe_dump({**AXOLOTL_C4, "output_dir": str(tmp_path / "ax")}))
        return ["--config-path", str(path)]
    return ["--task", "stream_lm", "--config-path", str(REPO / "configs" / example), *SMALL,
            "--set", f"checkpoint.checkpoint_dir={tmp_path / 'ck'}", "--set", f"data.seen_hashes_path={tmp_path / 's'}",
            "--set", "data.num_workers=0"]


@pytest.mark.parametrize("cut", ["offline", "refused"])
@pytest.mark.parametrize("example", list(TWIN_KEYS))
def test_a_hub_example_fails_at_once_naming_its_twin(tmp_path, monkeypatch, capsys, cut, example):
    calls = watch_hub(monkeypatch, offline=cut == "offline")
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.chdir(tmp_path)
    assert main(_argv(example, tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llm-train: error: allenai/c4 is a Hugging Face hub dataset and the hub cannot be reached")
    assert "\n" not in err
    assert ("HF_HUB_OFFLINE is set" if cut == "offline" else "Connection refused") in err
    for words in TWIN_KEYS[example]:
        assert words in err
    assert calls == {"probe": int(cut == "refused"), "load_dataset": 0}  # no retry loop: one request at most


def sh(command: str, cwd: Path, env: dict[str, str] | None = None, code: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           **(env or {})}
    proc = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == code, f"{command}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow  # a subprocess, as a user runs it: HF_ENDPOINT set in the environment
def test_a_refused_endpoint_in_the_environment_is_one_line_without_retries(tmp_path):
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"}
    proc = sh(f"llm-train {' '.join(_argv('axolotl', tmp_path))}", tmp_path, env, code=2)
    assert "Retry" not in proc.stderr and "Traceback" not in proc.stderr  # huggingface_hub's back-off never ran
    assert proc.stderr.strip().splitlines()[-1].startswith("llm-train: error: allenai/c4 is a Hugging Face hub")
    assert "Connection refused" in proc.stderr and TWIN_KEYS["axolotl"][0] in proc.stderr


# Each twin, run as its header says (its data made by the commands there), for a few steps, offline.
TWINS = {
    "streaming_c4_local.yaml": [*SMALL, "--set", "training.batch_size=4", "--set", "data.max_seq_len=64"],
    "axolotl_pretrain_demo.yaml": [],
    "sft_local_demo.yaml": [],
}


def documented_commands(config: Path) -> tuple[list[str], str]:
    """The header's commands that make the data, and its llm-train command."""
    lines = [m.group(1).split("  #")[0].strip() for m in re.finditer(r"^#   (\S.*)$", config.read_text(), re.M)]
    data = [c for c in lines if c.startswith(("mkdir", "python"))]
    train = next(c for c in lines if c.startswith("llm-train"))
    return data, train


@pytest.mark.slow  # llm-train subprocesses, tens of seconds on 2 cores: `make test-all` / CI
@pytest.mark.parametrize("name", list(TWINS))
def test_each_twin_config_trains_offline_as_documented(tmp_path, name):
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    data, train = documented_commands(tmp_path / "configs" / name)
    assert data, f"{name} documents no command that makes its data"
    for command in data:
        sh(command, tmp_path)
    offline = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    proc = sh(f"{train} --set training.max_steps=3 {' '.join(TWINS[name])}", tmp_path, offline)
    assert "step 3/3" in proc.stdout and "trained 3 steps" in proc.stdout, proc.stdout
    tree = yaml.safe_load((tmp_path / "configs" / name).read_text())
    run = tmp_path / (tree.get("output_dir") or tree["checkpoint"]["checkpoint_dir"])
    assert (run / "latest").read_text().strip() == "step_3"
    if name == "streaming_c4_local.yaml":  # the twin keeps C4's pipeline: the seen-set is written
        assert tree["data"]["data_source"] == "dedup_hf" and tree["data"]["dataset_name"] == "json"
        digests = (tmp_path / tree["data"]["seen_hashes_path"]).read_text().split()
        assert digests and all(re.fullmatch("[0-9a-f]{32}", d) for d in digests)  # xxh3_128, the guide's hex lines
