"""What `llm-data optimize` pays before its first batch: the tokenizer once (forked workers inherit
it), and no progress-bar library when no bar is shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llm.data.shards.format.manifest import Manifest
from llm.data.shards.prepare import optimize_text as module


def _corpus(tmp_path: Path, files: int = 4) -> list[str]:
    paths = []
    for i in range(files):
        p = tmp_path / f"part-{i}.jsonl"
        p.write_text("".join(json.dumps({"text": f"document {i}.{j} " * (j + 1)}) + "\n" for j in range(50)))
        paths.append(str(p))
    return paths


def test_forked_workers_use_the_tokenizer_the_parent_loaded(tmp_path, monkeypatch):
    def no_reload(*args, **kwargs):  # inherited by the forked workers: loading again there fails the run
        raise AssertionError("a worker loaded the tokenizer again")

    monkeypatch.setattr(module, "load_tokenizer", no_reload)
    summary = module.optimize_text(_corpus(tmp_path), tmp_path / "out", "simple", num_workers=2, progress=False)
    assert summary.documents == 200
    assert Manifest.load(tmp_path / "out").total_documents == 200


@pytest.mark.parametrize("progress", [False, True])
def test_tqdm_is_imported_only_for_a_progress_bar(tmp_path, progress):
    inputs = _corpus(tmp_path, 1)
    code = ("import sys; from llm.data.shards.prepare.optimize_text import optimize_text; "
            f"optimize_text({inputs!r}, {str(tmp_path / 'out')!r}, 'simple', num_workers=0, progress={progress}); "
            "print('tqdm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[-1] == str(progress)
