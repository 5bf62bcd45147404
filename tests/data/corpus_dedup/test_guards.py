"""What `llm-data dedup` refuses before it touches anything: bad flags, and inputs and output inside each other."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llm.data import dedup_corpus
from tests.cli.helpers import run_here


def _one_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "usage:" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize("value", ["abc", "-inf", "-nan", "nan", "inf", "0", "-0.5", "1.5", ""])
def test_a_bad_near_threshold_is_one_sentence(tmp_path: Path, value: str) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    proc = run_here("llm-data", "dedup", "a.jsonl", "--output", "out", "--near", value, cwd=tmp_path)
    assert _one_line(proc) == ("llm-data: error: --near takes a Jaccard similarity threshold in (0, 1] "
                               f"(e.g. --near 0.8), got {value!r}")
    assert not (tmp_path / "out").exists()


def test_a_good_near_threshold_still_runs(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n{"text": "x"}\n')
    proc = run_here("llm-data", "dedup", "a.jsonl", "--output", "out", "--near", "1", "--num-workers", "0",
                    "--no-progress", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "2 records in, 1 kept" in proc.stderr


def _corpus(folder: Path) -> bytes:
    folder.mkdir(parents=True, exist_ok=True)
    data = b'{"text": "one"}\n{"text": "two"}\n{"text": "one"}\n'
    (folder / "a.jsonl").write_bytes(data)
    return data


@pytest.mark.parametrize("layout", ["same folder", "relative", "symlink", "glob", "file inside", "output inside input",
                                    "output inside a glob's reach", "output at a glob's depth"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_inputs_and_output_inside_each_other_are_refused_before_anything_is_deleted(
        tmp_path: Path, layout: str, overwrite: bool) -> None:
    corpus = tmp_path / "corpus"
    data = _corpus(corpus)
    (corpus / "notes.txt").write_text("kept as it is\n")
    inputs, output = {
        "same folder": ([str(corpus)], corpus),
        "relative": (["corpus"], Path("corpus/.")),
        "symlink": ([str(tmp_path / "link")], corpus),
        "glob": ([str(corpus / "*.jsonl")], corpus),
        "file inside": ([str(corpus / "a.jsonl")], corpus),
        "output inside input": ([str(corpus)], corpus / "clean"),
        "output inside a glob's reach": ([str(tmp_path / "**" / "*.jsonl")], corpus / "clean"),
        "output at a glob's depth": ([str(tmp_path / "*" / "*" / "*.jsonl")], corpus / "clean"),
    }[layout]
    (tmp_path / "link").symlink_to(corpus)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(ValueError) as info:
            dedup_corpus(inputs, output, overwrite=overwrite, num_workers=0, progress=False)
    finally:
        os.chdir(cwd)
    message = str(info.value)
    assert "\n" not in message and "the output folder" in message
    assert "write the dedup output elsewhere" in message
    assert (corpus / "a.jsonl").read_bytes() == data and (corpus / "notes.txt").is_file()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_the_cli_refuses_it_in_one_line_and_deletes_nothing(tmp_path: Path) -> None:
    data = _corpus(tmp_path / "corpus")
    proc = run_here("llm-data", "dedup", "corpus", "--output", "corpus", "--overwrite", "--no-progress", cwd=tmp_path)
    assert _one_line(proc) == ("llm-data: error: input corpus is inside the output folder corpus; write the dedup "
                               "output elsewhere or narrow the input")
    assert (tmp_path / "corpus" / "a.jsonl").read_bytes() == data


def test_optimize_dedup_refuses_inputs_inside_its_dataset(tmp_path: Path) -> None:
    data = _corpus(tmp_path / "ds")
    proc = run_here("llm-data", "optimize", "ds", "--output", "ds", "--dedup", "exact", "--no-progress", cwd=tmp_path)
    assert "is inside the output folder ds" in _one_line(proc)
    assert not (tmp_path / "ds.dedup").exists() and (tmp_path / "ds" / "a.jsonl").read_bytes() == data


def test_a_sibling_output_or_one_out_of_a_globs_reach_is_fine(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    _corpus(corpus)
    report = dedup_corpus([str(corpus)], tmp_path / "corpus-clean", num_workers=0, progress=False)
    assert report["removed"] == 1
    # the output inside the input folder, but deeper than the glob reads: a rerun finds the same inputs
    for _ in range(2):
        report = dedup_corpus([str(corpus / "*.jsonl")], corpus / "clean", num_workers=0, progress=False)
        assert report["removed"] == 1 and (corpus / "clean" / "a.jsonl").read_bytes() == b'{"text": "one"}\n{"text": "two"}\n'


@pytest.mark.parametrize("args", [["ds", "--output", "ds"], ["ds/a.jsonl", "--output", "ds"], ["data", "--output", "data/ds"],
                                  ["data/**/*.jsonl", "--output", "data/ds"]])
def test_optimize_uses_the_same_guard(tmp_path: Path, args: list[str]) -> None:
    _corpus(tmp_path / "ds")
    _corpus(tmp_path / "data")
    proc = run_here("llm-data", "optimize", *args, "--no-progress", cwd=tmp_path)
    assert "the output folder" in _one_line(proc) and "write the dataset elsewhere" in proc.stderr



def test_an_input_whose_output_would_take_the_removed_lists_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "dedup-removed.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="its kept records would be written to dedup-removed.jsonl, the name of the "
                                         "dedup report; rename the input$"):
        dedup_corpus(str(tmp_path / "in" / "dedup-removed.jsonl"), tmp_path / "out", num_workers=0, progress=False)
