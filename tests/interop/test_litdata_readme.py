"""LitData's README, snippet by snippet: every Python block runs on llm.data with only its import changed, or says why not.

The README is Lightning-AI/litdata@bef28be (2025-04-18), 42 ```python blocks, numbered in order. The runnable ones
live in tests/interop/litdata_readme/readme_NN.py exactly as written, `import litdata as ld` -> `import llm.data as ld`
and `from litdata[.sub] import X` -> `from llm.data import X`. Each runs in a fresh interpreter in tmp_path (its
output folders land there). The others are listed with the reason they cannot run on a machine without cloud
accounts or internet, so passed + xfailed + skipped always adds up to the README's count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = Path(__file__).with_name("litdata_readme")
README_BLOCKS = 42


def _images(cwd: Path) -> None:
    """The folder snippet 03 resizes ("use a local or S3 folder"): the README assumes it exists."""
    from PIL import Image

    (cwd / "my_large_images").mkdir()
    for i in range(3):
        Image.fromarray(np.zeros((240, 260, 3), np.uint8)).save(cwd / "my_large_images" / f"{i}.JPEG", format="JPEG")


def _network_drive(cwd: Path) -> None:
    """Snippet 33's network drive, mounted here as a local folder holding a 10-item dataset."""
    from llm.data import optimize

    optimize(fn=_identity, inputs=list(range(10)), output_dir=str(cwd / "some-data"), chunk_bytes="1MB")


def _identity(i: int) -> int:
    return i


def _fast_data(cwd: Path, out: str) -> None:
    from llm.data import StreamingDataset

    ds = StreamingDataset(str(cwd / "fast_data"))
    samples = [ds[i] for i in range(len(ds))]
    assert sorted(s["index"] for s in samples) == list(range(1000))
    assert {s["image"].size for s in samples} == {(32, 32)} and all(0 <= s["class"] < 10 for s in samples)


def _resized(cwd: Path, out: str) -> None:
    from PIL import Image

    # map's resume journal (.llm-map) sits beside the outputs, hidden
    resized = sorted(p for p in (cwd / "output_dir").iterdir() if not p.name.startswith("."))
    assert [p.name for p in resized] == ["0.JPEG", "1.JPEG", "2.JPEG"]
    assert {Image.open(p).size for p in resized} == {(224, 224)}


def _zstd_squares(cwd: Path, out: str) -> None:
    from llm.data import StreamingDataset

    index = json.loads((cwd / "my_optimized_dataset" / "index.json").read_text())
    assert {s["compression"] for s in index["shards"]} == {"zstd"}
    assert StreamingDataset(str(cwd / "my_optimized_dataset"))[:] == [(i, i**2) for i in range(100)]


def _merged(cwd: Path, out: str) -> None:
    from llm.data import StreamingDataset

    assert out.strip().splitlines()[-1] == "1000"
    index = json.loads((cwd / "merged_fast_data" / "index.json").read_text())
    parts = [json.loads((cwd / f"fast_data_{k}" / "index.json").read_text()) for k in range(1, 5)]
    assert [s["checksum"] for s in index["shards"]] == [s["checksum"] for p in parts for s in p["shards"]]
    assert sorted(s["index"] for s in StreamingDataset(str(cwd / "merged_fast_data"))) == sorted(list(range(250)) * 4)


_USE_CUSTOM_ENCRYPTION = """
if __name__ == "__main__":
    from llm.data import StreamingDataset, optimize

    optimize(fn=lambda i: {"i": i}, inputs=list(range(20)), output_dir="custom_encrypted", num_workers=0,
             encryption=CustomEncryption(), progress=False)
    print(StreamingDataset("custom_encrypted", encryption=CustomEncryption())[:][-1])
"""


def _custom_encryption(cwd: Path, out: str) -> None:
    assert out.strip().splitlines()[-1] == "{'i': 19}"
    index = json.loads((cwd / "custom_encrypted" / "index.json").read_text())
    assert index["encryption"] == {"class": "__main__.CustomEncryption", "algorithm": "CustomEncryption",
                                   "level": "chunk"}


def _prints(expected: str) -> Callable[[Path, str], None]:
    def check(cwd: Path, out: str) -> None:
        assert out.strip().splitlines()[-1] == expected

    return check


@dataclass
class Snippet:
    """One runnable block: its setup (what the README assumes exists), README fixes, and the check of its result."""

    number: str
    setup: Callable[[Path], None] | None = None
    prefix: str = ""  # a line the README forgot (counted apart: not "only the import changed")
    replace: dict[str, str] = field(default_factory=dict)  # local paths pointed at tmp_path
    suffix: str = ""  # a line after the snippet that prints what it built, for the check
    check: Callable[[Path, str], None] | None = None
    xfail: str = ""


RUNNABLE = [
    Snippet("01", check=_fast_data),
    Snippet("03", setup=_images, prefix="import os\n", check=_resized),
    Snippet("16", check=_prints(str(list(range(0, 1000, 2))))),
    Snippet("17", check=_prints("[1.0, 0.5, 0.25]")),
    Snippet("19", check=_merged),
    Snippet("23"),  # the snippet asserts its own result: 200 items, (i, i**2) in order
    Snippet("26", check=_zstd_squares),
    Snippet("33", setup=_network_drive, replace={"/data/shared-drive/some-data": "{cwd}/some-data"},
            suffix="print(len(dataset), dataset[3])\n", check=_prints("10 3")),
    # the block only defines the class; the suffix writes and reads a dataset with it (index.json names it)
    Snippet("38", suffix=_USE_CUSTOM_ENCRYPTION, check=_custom_encryption),
]

_CLOUD = "needs an S3 bucket and credentials (s3:// input)"
_HUB = "downloads from the Hugging Face hub (hf:// input); no internet here"
_PLACEHOLDER = "not runnable as written: `...` stands for the user's arguments"
_STUDIO = "needs a Lightning AI account (Machine / num_nodes run jobs on their cloud)"
NOT_RUNNABLE = {
    "02": _CLOUD, "04": _CLOUD + "; also calls an undefined process()", "05": _CLOUD + " (placeholder endpoint)",
    "06": _CLOUD, "07": _HUB, "08": _HUB + " (index_hf_dataset)", "09": _HUB + " (index_parquet_dataset)",
    "10": _HUB + " (ParquetLoader)", "11": _CLOUD + "; also calls an undefined process()",
    "12": "needs S3, GCS and Azure accounts (and is a SyntaxError as written: a comma is missing)",
    "13": _CLOUD + " (stateful StreamingDataLoader)",
    "14": "needs the downloaded SlimPajama-627B and lit-gpt's `tokenizer` module with Llama-2 weights",
    "15": "reads ./slimpajama-optimized/train, the output of snippet 14",
    "18": _CLOUD + " (tinyllama-template bucket)", "20": _CLOUD + " (train_test_split)",
    "21": _CLOUD + " (subsample)", "22": _CLOUD + " (subsample > 1)", "24": _CLOUD + " (index_parquet_dataset)",
    "25": _CLOUD + " (ParquetLoader)", "27": _CLOUD + " (random access)",
    "28": _PLACEHOLDER + " (ImagenetStreamingDataset(...)); also needs torchvision",
    "29": _PLACEHOLDER + " (StreamingDataLoader(..., profile_batches=5))",
    "30": "needs /teamspace paths (a Lightning Studio) and lit-gpt's `tokenizer` module",
    "31": _PLACEHOLDER + " (StreamingDataset(..., max_cache_size=...))", "32": _CLOUD + " (Dir(path, url))",
    "34": _STUDIO, "35": "reads /teamspace/jobs/..., the output of snippet 34 on a Lightning Studio",
    "36": _CLOUD + " (writes encrypted shards to s3://my-bucket)",
    "37": "reads snippet 36's S3 output; data_dir is undefined as written",
    "39": _CLOUD + " (with litdata.debugger.enable_tracer)",
    "40": "writes to s3://my-bucket (and, as written, lacks `import os`)",
    "41": _PLACEHOLDER + "; " + _STUDIO, "42": _PLACEHOLDER + "; " + _STUDIO,
}


def _run(snippet: Snippet, cwd: Path) -> subprocess.CompletedProcess:
    code = (SNIPPETS / f"readme_{snippet.number}.py").read_text()
    for old, new in snippet.replace.items():
        code = code.replace(old, new.format(cwd=cwd))
    script = cwd / f"readme_{snippet.number}.py"
    script.write_text(snippet.prefix + code + snippet.suffix)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "TMPDIR": str(cwd)}
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _param(s: Snippet):
    marks = [pytest.mark.xfail(strict=True, reason=s.xfail)] if s.xfail else []
    return pytest.param(s, id=f"readme_{s.number}", marks=marks)


@pytest.mark.parametrize("snippet", [_param(s) for s in RUNNABLE])
def test_readme_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    if snippet.setup:
        snippet.setup(tmp_path)
    done = _run(snippet, tmp_path)
    assert done.returncode == 0, f"readme_{snippet.number} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    if snippet.check:
        snippet.check(tmp_path, done.stdout)


@pytest.mark.parametrize("number", sorted(NOT_RUNNABLE))
def test_readme_snippet_not_runnable_here(number: str) -> None:
    pytest.skip(f"README block {number}: {NOT_RUNNABLE[number]}")


def test_every_readme_block_is_accounted_for() -> None:
    numbers = sorted([s.number for s in RUNNABLE] + list(NOT_RUNNABLE))
    assert numbers == [f"{i:02d}" for i in range(1, README_BLOCKS + 1)]
    assert sorted(p.stem for p in SNIPPETS.glob("readme_*.py")) == [f"readme_{s.number}" for s in RUNNABLE]
