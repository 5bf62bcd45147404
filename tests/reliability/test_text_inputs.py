"""Text inputs that cannot be trusted: cut or damaged compressed files and parquet, files that change while
read or between runs, lone surrogates, wrong JSON types, empty inputs, JSON arrays; for `llm-data optimize`
(API and exit 2) and `stream_lm` (`llm-train` exit 2) alike."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard

import llm.data.shards.prepare.optimize_text as optimize_text_module
from llm.data.inputs.readers import InputError
from llm.data.shards.prepare.optimize_text import optimize_text
from llm.data.sources import LocalLineTextSource
from llm.data.text.stream import StreamingTextDataModule
from llm.training.core.config import DataConfig
from tests.cli.helpers import run_here
from tests.data.shards.helpers import all_tokens
from tests.training.test_trainer import REPO, tiny_tree

RECORDS = [f"record {i} " + "word " * (i % 7) for i in range(3000)]


def _jsonl(records: list[str] = RECORDS) -> bytes:
    return "".join(json.dumps({"text": r}) + "\n" for r in records).encode()


def _cut(tmp: Path, kind: str, keep: float = 0.5) -> Path:
    """A real compressed (or parquet) file of RECORDS, cut to `keep` of its bytes."""
    raw = _jsonl()
    if kind == "parquet":
        path = tmp / "cut.parquet"
        pq.write_table(pa.table({"text": RECORDS}), path, row_group_size=500)
        data = path.read_bytes()
    else:
        path = tmp / f"cut.jsonl.{kind}"
        data = gzip.compress(raw) if kind == "gz" else zstandard.ZstdCompressor().compress(raw)
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def _optimize(paths: list[Path], out: Path, **kw):
    return optimize_text([str(p) for p in paths], out, "simple", num_workers=0, progress=False, **kw)


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kind", ["gz", "zst", "parquet"])
@pytest.mark.parametrize("keep", [0.33, 0.5, 0.999])
def test_a_cut_file_is_an_error_naming_it_not_a_shorter_dataset(tmp_path, kind, keep) -> None:
    path = _cut(tmp_path, kind, keep)
    with pytest.raises(InputError, match=rf"{path.name}: (truncated or corrupt|cannot read parquet)") as info:
        _optimize([path], tmp_path / "ds")
    assert "\n" not in str(info.value) and not (tmp_path / "ds" / "index.json").exists()
    with pytest.raises(InputError, match=path.name):
        list(LocalLineTextSource(path).iter_texts())


def test_damaged_bytes_inside_a_stream_name_the_file(tmp_path) -> None:
    raw = _jsonl()
    for kind, data in [("gz", gzip.compress(raw)), ("zst", zstandard.ZstdCompressor(write_checksum=True).compress(raw))]:
        bad = bytearray(data)
        bad[len(bad) // 2 : len(bad) // 2 + 8] = b"\xff" * 8
        path = tmp_path / f"bad.txt.{kind}"  # text: the garbage decodes, then the stream's own check fails
        path.write_bytes(bytes(bad))
        with pytest.raises(InputError, match=rf"bad.txt.{kind}: truncated or corrupt {'gzip' if kind == 'gz' else 'zstd'} stream"):
            _optimize([path], tmp_path / f"ds-{kind}")
    path = tmp_path / "pages.parquet"
    pq.write_table(pa.table({"text": RECORDS}), path, row_group_size=500, write_page_checksum=True, compression="none")
    data = bytearray(path.read_bytes())
    at = data.find(b"record 1700")
    data[at : at + 6] = b"XXXXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"pages.parquet: cannot read parquet row group \d"):
        list(LocalLineTextSource(path).iter_texts())


def test_llm_data_optimize_exits_2_on_a_cut_file(tmp_path) -> None:
    path = _cut(tmp_path, "zst")
    proc = run_here("llm-data", "optimize", str(path), "--output", str(tmp_path / "ds"), "--num-workers", "1", "--no-progress",
                    cwd=tmp_path)  # main() in process: an input check
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "cut.jsonl.zst: truncated or corrupt zstd stream at byte" in line and "Traceback" not in proc.stderr


@pytest.mark.slow  # llm-train end to end; the cut-file error itself is tested in-process above
@pytest.mark.parametrize("kind, workers", [("gz", 0), ("zst", 2)])
def test_llm_train_stream_lm_exits_2_on_a_cut_file(tmp_path, kind, workers) -> None:
    path = _cut(tmp_path, kind)
    tree = tiny_tree(path, data={"steps_per_epoch": 500, "num_workers": workers})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(tree))
    proc = _cli(["llm.training.train", "--task", "stream_lm", "--config-path", str(tmp_path / "cfg.yaml")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"cut.jsonl.{kind}: truncated or corrupt" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("change", ["truncate", "rewrite"])
def test_a_file_changed_while_optimize_reads_it(tmp_path, monkeypatch, change) -> None:
    path = tmp_path / "live.jsonl"
    path.write_bytes(_jsonl())
    real, calls = optimize_text_module.tokenize_documents, []

    def tokenize_then_change(tokenizer, texts):  # another program writes the file after the first batch
        if not calls:
            data = path.read_bytes()
            if change == "truncate":
                os.truncate(path, len(data) // 2)
            else:
                path.write_bytes(data.replace(b"record", b"RECORD"))  # same size, new content
        calls.append(1)
        return real(tokenizer, texts)

    monkeypatch.setattr(optimize_text_module, "tokenize_documents", tokenize_then_change)
    with pytest.raises(InputError, match=r"live.jsonl: input file changed while it was read") as info:
        _optimize([path], tmp_path / "ds")
    assert "mix old and new" in str(info.value) and not (tmp_path / "ds" / "index.json").exists()


def test_a_source_changed_while_read_and_between_runs(tmp_path) -> None:
    path = tmp_path / "live.txt"
    path.write_bytes("\n".join(RECORDS[:200]).encode() + b"\n")
    source = LocalLineTextSource(path, partition_bytes=1 << 20)
    [part] = source.partitions()
    records = source.iter_partition(part)
    next(records)
    path.write_bytes(path.read_bytes().replace(b"record", b"RECORD"))  # same size, rewritten under us
    with pytest.raises(InputError, match=r"live.txt: input file changed while it was read"):
        list(records)
    # a new run sees the new file; a state saved on the old one is refused, naming it
    stat = path.stat()
    path.write_bytes("\n".join(RECORDS[:200]).encode() + b"\n")
    module = StreamingTextDataModule(DataConfig(dataset_path=str(path), max_seq_len=16, steps_per_epoch=2), 2)
    list(module.train_dataloader())
    state = module.state_dict()
    path.write_bytes(path.read_bytes().replace(b"record 1", b"RECORD 1"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old mtime: the content hash differs
    again = StreamingTextDataModule(DataConfig(dataset_path=str(path), max_seq_len=16, steps_per_epoch=2), 2)
    with pytest.raises(ValueError, match=r"fingerprint mismatch: stamps.live.txt: "):
        again.load_state_dict(state)


def test_lone_surrogates_are_replaced_and_counted(tmp_path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "a\\ud800b"}\n{"text": "ok \\ud83d\\ude00"}\n{"text": "\\udfff"}\n')
    assert list(LocalLineTextSource(path).iter_texts()) == ["a\ufffdb", "ok \U0001f600", "\ufffd"]
    summary = _optimize([path], tmp_path / "ds")
    assert summary.documents == 3 and summary.stats["invalid_utf8_records"] == 2
    assert bytes(all_tokens(tmp_path / "ds")[:5].astype(np.uint8)) == "a\ufffdb".encode()


@pytest.mark.parametrize("value, named", [("null", "null"), ("5", "a number"), ("1.5", "a number"), ("true", "a boolean"),
                                          ('["x"]', "an array"), ('{"a": "x"}', "an object")])
def test_json_values_of_the_wrong_type_are_one_sentence(tmp_path, value, named) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "fine"}\n{"text": ' + value + "}\n")
    with pytest.raises(InputError, match=rf"^{path}:2: column 'text' is {named}, expected a string$"):
        _optimize([path], tmp_path / "ds")


# mtime=0: gzip's header otherwise carries the current time, and with it the test id, so that two pytest-xdist
# workers collected different tests (tests/test_collection.py). The ids name each case.
@pytest.mark.parametrize("content", [b"", b"\n  \n\t\n", b'\n{"text": "  "}\n', gzip.compress(b"", mtime=0), b"[]"],
                         ids=["empty", "blank-lines", "blank-text", "empty-gzip", "empty-array"])
def test_empty_input_is_an_error_unless_allowed(tmp_path, content) -> None:
    path = tmp_path / ("empty.jsonl.gz" if content.startswith(b"\x1f\x8b") else "empty.json")
    path.write_bytes(content)
    with pytest.raises(InputError, match=rf"no records in {path}: every input file is empty.*allow_empty=True"):
        _optimize([path], tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
    assert _optimize([path], tmp_path / "ds", allow_empty=True).documents == 0
    module = StreamingTextDataModule(DataConfig(dataset_path=str(path), max_seq_len=16, steps_per_epoch=2), 2)
    with pytest.raises(InputError, match=rf"no records in {path}"):
        list(module.train_dataloader())


def test_llm_data_optimize_exits_2_on_empty_input(tmp_path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("")
    (tmp_path / "in" / "b.txt").write_text("\n\n")
    proc = run_here("llm-data", "optimize", str(tmp_path / "in"), "--output", str(tmp_path / "ds"), "--no-progress",
                    cwd=tmp_path)  # main() in process: an input check
    assert proc.returncode == 2 and "a.txt, " in proc.stderr and "b.txt: every input file is empty" in proc.stderr


def test_a_json_array_is_read_as_records(tmp_path) -> None:
    records = RECORDS[:500]
    array = tmp_path / "a.json"
    array.write_text("[\n" + ",\n".join(json.dumps({"text": r, "id": i}) for i, r in enumerate(records)) + "\n]\n")
    lines = tmp_path / "b.jsonl"
    lines.write_bytes(_jsonl(records))
    _optimize([array], tmp_path / "from-array")
    _optimize([lines], tmp_path / "from-lines")
    assert np.array_equal(all_tokens(tmp_path / "from-array"), all_tokens(tmp_path / "from-lines"))
    source = LocalLineTextSource(array)
    [part] = source.partitions()  # one row-offset partition: a resume re-skips elements
    got = list(source.iter_partition(part))
    assert [t for t, _, _ in got] == [r.strip() for r in records]
    assert list(source.iter_partition(part, got[200][1])) == got[201:]
    gz = tmp_path / "c.json.gz"
    gz.write_bytes(gzip.compress(array.read_bytes()))
    assert list(LocalLineTextSource(gz).iter_texts()) == [r.strip() for r in records]


@pytest.mark.parametrize("text, error", [
    ('[{"text": "a"} {"text": "b"}]', r"element 1: the JSON array has '\{' where ',' or '\]' belongs"),
    ('[{"text": "a"}, {"text": "b"', r"element 2: invalid JSON"),
    ('[{"text": "a"},', r"element 2: the JSON array ends before its closing '\]'"),
    ('[{"text": "a"}, "b"]', r"element 2: expected a JSON object with a 'text' key, got a string"),
    ('[{"body": "a"}]', r"element 1: missing text column 'text' \(keys: body\)"),
    ('[{"text": "a"}] [', r"unexpected data after the JSON array's closing '\]'"),
])
def test_a_malformed_json_array_names_the_element(tmp_path, text, error) -> None:
    path = tmp_path / "a.json"
    path.write_text(text)
    with pytest.raises(InputError, match=rf"a.json: {error}"):
        list(LocalLineTextSource(path).iter_texts())
