"""A text stream left open when the interpreter exits ends quietly: no "Exception ignored" traceback.

At exit, CPython may clear a module's globals before it closes a generator that is still open; an
`except SomeError:` around a `yield` then evaluates None. Importing `llm.data.text.stream` first gives
the order in which that happened (found by hand with a script that broke out of its loop)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
import llm.data.text.stream  # noqa: F401  (this import order made the generators outlive the module globals)
from llm.data import StreamingTextDataModule
from llm.training.core.config import DataConfig

data = DataConfig(data_source="local", dataset_path=sys.argv[1], text_column="text", max_seq_len=16,
                  num_workers=int(sys.argv[2]))
it = iter(StreamingTextDataModule(data, 2, loop=False).train_dataloader())
next(it)  # a user who breaks out of the loop and lets the script end
print("batch taken")
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_an_open_text_stream_at_exit_leaves_no_traceback(tmp_path: Path, workers: int):
    for f in range(4):
        lines = (json.dumps({"text": f"record {i} of file {f} " * 10}) + "\n" for i in range(200))
        (tmp_path / f"part-{f}.jsonl").write_text("".join(lines))
    script = tmp_path / "leave_open.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "*.jsonl"), str(workers)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "batch taken" in proc.stdout, proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
