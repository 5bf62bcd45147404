"""`llm-data` as a user runs it: help, version, info, train-tokenizer, and the mistakes it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.helpers import first_error, run, run_here


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("".join(f"note {i}: the quick brown fox jumps over the lazy dog\n" for i in range(60)))
    return path


@pytest.mark.parametrize("sub", [[], ["optimize"], ["info"], ["verify"], ["train-tokenizer"]])
def test_help_shows_examples_and_defaults(tmp_path: Path, sub: list[str]) -> None:
    proc = run_here("llm-data", *sub, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "example" in proc.stdout and "llm-data " in proc.stdout.split("example", 1)[1]
    if sub == ["optimize"]:
        assert "(default: simple)" in proc.stdout and "(default: 64MB)" in proc.stdout
        assert "data_source: optimized" in proc.stdout
    if sub == ["train-tokenizer"]:
        assert "(default: 8192)" in proc.stdout and ".tiktoken" in proc.stdout
    if not sub:
        assert "train-tokenizer" in proc.stdout and "data_source: optimized" in proc.stdout


def test_version_comes_from_the_package_metadata(tmp_path: Path) -> None:
    from importlib.metadata import version

    proc = run_here("llm-data", "--version", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"llm-data {version('llm-stream-data')}"


def test_optimize_names_the_default_tokenizer_then_info_summarizes(tmp_path: Path, text: Path) -> None:
    proc = run("llm-data", "optimize", "notes.txt", "--output", "ds", "--no-progress", "--num-workers", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "optimize: tokenizer simple (byte-level, the default" in proc.stderr

    given = run("llm-data", "optimize", "notes.txt", "--output", "ds2", "--no-progress", "--num-workers", "1",
                "--tokenizer", "simple", cwd=tmp_path)
    assert given.returncode == 0 and "the default" not in given.stderr

    info = run("llm-data", "info", "ds", cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    lines = info.stdout.splitlines()
    assert lines[0] == "dataset ds"
    fields = dict(line.split(None, 1) for line in lines[1:] if not line.strip().startswith(("on disk",)))
    assert fields["kind"] == "tokens (format v2)"
    assert fields["documents"] == "60"
    tokens = sum(len(line.encode()) for line in text.read_text().splitlines()) + 60  # bytes + one EOS each
    assert fields["tokens"] == f"{tokens:,}"
    assert fields["compression"] == "none" and fields["dtype"] == "uint16"
    assert fields["tokenizer"].startswith("simple")
    assert any(line.split() == ["on", "disk", *line.split()[2:]] for line in lines)

    as_json = json.loads(run("llm-data", "info", "ds", "--json", cwd=tmp_path).stdout)
    assert as_json["totals"]["tokens"] == tokens and "shards" not in as_json
    assert fields["fingerprint"] == as_json["fingerprint"]


def test_append_of_an_input_already_in_the_dataset_warns(tmp_path: Path, text: Path) -> None:
    args = ["--no-progress", "--num-workers", "1"]
    assert run("llm-data", "optimize", "notes.txt", "--output", "ds", *args, cwd=tmp_path).returncode == 0
    other = tmp_path / "more.txt"
    other.write_text("something else entirely\n")
    fresh = run("llm-data", "optimize", "more.txt", "--output", "ds", "--mode", "append", *args, cwd=tmp_path)
    assert fresh.returncode == 0 and "warning" not in fresh.stderr
    again = run("llm-data", "optimize", "notes.txt", "--output", "ds", "--mode", "append", *args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines()[-1] == (
        f"llm-data: warning: {text} was already in ds (same name and size): its documents are now there twice; "
        "rebuild with --mode overwrite if that is not what you meant"
    )
    info = run("llm-data", "info", "ds", cwd=tmp_path).stdout
    assert "documents    121" in info  # 60 + 1 + 60: appended as asked, and said


def test_missing_tokenizer_file_and_wrong_kinds_of_paths(tmp_path: Path, text: Path) -> None:
    (tmp_path / "folder").mkdir()
    cases = {
        ("optimize", "notes.txt", "-o", "ds", "--tokenizer", "tok/tokenizer.json"):
            "llm-data: error: tokenizer file not found: tok/tokenizer.json",
        ("optimize", "notes.txt", "-o", "ds", "--tokenizer", "folder"):
            "llm-data: error: tokenizer folder folder holds no tokenizer.json; pass the tokenizer.json or .tiktoken file itself",
        ("optimize", "notes.txt", "-o", "ds", "--tokenizer", "notes.txt"):
            "llm-data: error: tokenizer file notes.txt is neither a tokenizer.json (.json) nor a .tiktoken file",
        ("optimize", "notes.txt", "-o", "notes.txt"): "llm-data: error: --output notes.txt is a file, not a folder",
        ("info", "notes.txt"): "llm-data: error: notes.txt is a file, not a dataset folder (a folder holding index.json)",
        ("verify", "notes.txt"): "llm-data: error: notes.txt is a file, not a dataset folder (a folder holding index.json)",
        ("info", "nothing"): "llm-data: error: nothing: dataset folder does not exist",
        ("train-tokenizer", "notes.txt", "-o", "folder.json"): None,  # filled below: a folder named *.json
    }
    (tmp_path / "folder.json").mkdir()
    cases[("train-tokenizer", "notes.txt", "-o", "folder.json")] = "llm-data: error: --output folder.json is a folder, not a file"
    for args, expected in cases.items():
        proc = run_here("llm-data", *args, cwd=tmp_path)
        assert first_error(proc) == expected, args
    assert not (tmp_path / "ds").exists()


def test_train_tokenizer_then_optimize_with_it(tmp_path: Path, text: Path) -> None:
    proc = run("llm-data", "train-tokenizer", "notes.txt", "--vocab-size", "300", "--output", "tok/tokenizer.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.replace("\r", "\n").splitlines()  # the progress bar redraws its line with \r
    assert "train-tokenizer: reading 1/1 notes.txt: 60 documents" in proc.stderr  # the bar, at its end
    assert "train-tokenizer: 60 documents read; computing the merges" in lines
    assert any(line.startswith("train-tokenizer: 300 tokens learned from 60 documents") for line in lines), lines
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    # Every one of the 256 byte symbols, even those no UTF-8 text holds (0xC0, 0xC1, 0xF5-0xFF):
    # without them tokenizers drops unseen bytes and no fast engine could serve the file as it is.
    from llm.data.tokenize.bpe_vocab import read_byte_level_bpe
    assert read_byte_level_bpe(tmp_path / "tok" / "tokenizer.json").missing_bytes == []

    again = run("llm-data", "train-tokenizer", "notes.txt", "--vocab-size", "300", "--output", "tok/tokenizer.json", cwd=tmp_path)
    assert first_error(again).startswith("llm-data: error: tok/tokenizer.json already exists; pass --overwrite")
    small = run("llm-data", "train-tokenizer", "notes.txt", "--vocab-size", "100", "--output", "t.json", cwd=tmp_path)
    assert first_error(small).startswith("llm-data: error: --vocab-size 100 is too small")

    opt = run("llm-data", "optimize", "notes.txt", "-o", "ds", "--tokenizer", "tok/tokenizer.json", "--no-progress",
              "--num-workers", "1", cwd=tmp_path)
    assert opt.returncode == 0, opt.stderr
    info = run("llm-data", "info", "ds", cwd=tmp_path).stdout
    assert "tokenizer    hf (" in info and "documents    60" in info


def test_train_tokenizer_checks_every_inputs_text_column_before_training(tmp_path: Path, text: Path) -> None:
    import json as _json

    for name, key in (("good.jsonl", "text"), ("web.jsonl", "content"), ("code.jsonl", "body")):  # in name order
        (tmp_path / name).write_text("".join(_json.dumps({key: f"record {i}"}) + "\n" for i in range(20)))
    proc = run_here("llm-data", "train-tokenizer", "notes.txt", "good.jsonl", "web.jsonl", "code.jsonl",
                    "--vocab-size", "300", "-o", "tok.json", cwd=tmp_path)
    assert first_error(proc) == (
        f"llm-data: error: {tmp_path / 'code.jsonl'}:1: missing text column 'text' (keys: body); set text_column "
        f"(CLI: --text-column); 1 more input(s) fail this check too ({tmp_path / 'web.jsonl'}); nothing was trained")
    assert "reading" not in proc.stderr and not (tmp_path / "tok.json").exists()  # checked before any text was read
    quiet = run_here("llm-data", "train-tokenizer", "good.jsonl", "--vocab-size", "300", "-o", "tok.json",
                     "--no-progress", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr.splitlines()[0].startswith("train-tokenizer: "), quiet.stderr
    assert "from 20 documents" in quiet.stderr.splitlines()[0]  # no progress lines before the summary
