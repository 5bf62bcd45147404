"""`llm-train --import MODULE` / `import_modules:`: a custom source registered by the user's module, from the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from llm.data.inputs.registry import SOURCE_REGISTRY
from llm.training.train import main as llm_train
from tests.training.test_trainer import tiny_tree

SOURCES = '''
from llm.data.sources import SOURCE_REGISTRY, TextSource


class Upper(TextSource):
    """The guide's custom source shape: records of a file, upper-cased."""

    def __init__(self, path):
        self.path = path

    def iter_texts(self, skip=0):
        with open(self.path) as f:
            yield from (line.strip().upper() for line in list(f)[skip:])

    def source_fingerprint(self):
        return {"type": "upper", "path": self.path}


SOURCE_REGISTRY.register("upper_lines", lambda cfg: Upper(cfg.dataset_path))
'''


@pytest.fixture
def run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "corpus.txt").write_text("".join(f"line {i} of the corpus\n" for i in range(200)))
    (tmp_path / "my_sources_cli.py").write_text(SOURCES)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    SOURCE_REGISTRY.unregister("upper_lines")  # leave the registry and the import cache as they were
    sys.modules.pop("my_sources_cli", None)


def _config(folder: Path, **top) -> Path:
    tree = tiny_tree(folder / "corpus.txt", data={"data_source": "upper_lines", "steps_per_epoch": 3},
                     checkpoint={"checkpoint_dir": str(folder / "ck"), "save_interval_steps": 3})
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump({**tree, **top}))
    return path


@pytest.mark.parametrize("how", ["flag", "config key"])
def test_a_custom_source_registered_by_an_imported_module_trains(run_folder: Path, how: str) -> None:
    if how == "flag":
        argv = ["--task", "stream_lm", "--config-path", str(_config(run_folder)), "--import", "my_sources_cli"]
    else:
        argv = ["--task", "stream_lm", "--config-path", str(_config(run_folder, import_modules=["my_sources_cli"]))]
    assert llm_train([*argv, "--epochs", "1"]) == 0
    steps = [json.loads(line) for line in (run_folder / "ck" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "loss" in s][-1] == 3


def test_without_the_import_the_source_is_unknown_and_a_missing_module_is_one_sentence(run_folder, capsys) -> None:
    config = str(_config(run_folder))
    assert llm_train(["--task", "stream_lm", "--config-path", config]) == 2
    assert "upper_lines" in capsys.readouterr().err
    assert llm_train(["--task", "stream_lm", "--config-path", config, "--import", "no_such_mod"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("llm-train: error: module 'no_such_mod' (--import / import_modules) was not found")
    (run_folder / "broken_mod.py").write_text("raise RuntimeError('bad credentials')\n")
    assert llm_train(["--task", "stream_lm", "--config-path", config, "--import", "broken_mod"]) == 2
    assert "failed while importing: RuntimeError: bad credentials" in capsys.readouterr().err
    sys.modules.pop("broken_mod", None)
