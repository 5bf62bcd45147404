"""`llm-train`, `llm-train plot` and `llm-generate` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.cli.helpers import first_error, run, run_here
from tests.training.test_trainer import tiny_tree, write_corpus


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny `lm` run of 2 epochs x 3 steps with validation, in its own folder (shared by the tests below)."""
    work = tmp_path_factory.mktemp("run")
    corpus = write_corpus(work / "demo.txt", 200)
    val = work / "val.txt"
    val.write_text("\n".join(f"sample line {i} says c" for i in range(40)) + "\n")
    tree = tiny_tree(corpus, data={"steps_per_epoch": 3, "val_dataset_path": str(val)},
                     checkpoint={"checkpoint_dir": "ck"}, training={"epochs": 2, "val_batches": 1})
    (work / "cfg.yaml").write_text(yaml.safe_dump(tree))
    proc = run_here("llm-train", "--task", "lm", "--config-path", "cfg.yaml", cwd=work)
    assert proc.returncode == 0, proc.stderr
    (work / "stdout.txt").write_text(proc.stdout)
    return work


def _help(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What `main(argv + ["--help"])` prints, in-process (the console scripts call the same main)."""
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_help_names_tasks_examples_and_defaults(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from llm.training.generate import main as generate_main
    from llm.training.train import main as train_main

    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal's width; a pipe's is 80
    text = _help(train_main, [], capsys)
    for needle in ("stream_lm", "lm ", "sft", "Axolotl-style", "data_source: optimized", "examples:", "llm-train plot",
                   "llm-generate --checkpoint", "configs/sft_local_demo.yaml"):
        assert needle in text, needle
    assert "{stream_lm,lm,sft}" in text
    gen = _help(generate_main, [], capsys)
    assert "(default: 100)" in gen and "examples:" in gen
    assert "RUN_DIR" in _help(train_main, ["plot"], capsys)


@pytest.mark.parametrize("command", ["llm-train", "llm-generate"])
def test_version(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    from llm.training.generate import main as generate_main
    from llm.training.train import main as train_main

    with pytest.raises(SystemExit) as info:
        {"llm-train": train_main, "llm-generate": generate_main}[command](["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"{command} {version('llm-stream-data')}"


def test_config_path_of_the_wrong_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from llm.training.train import main as train_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    assert train_main(["--task", "lm", "--config-path", "configs"]) == 2
    assert capsys.readouterr().err == (
        "llm-train: error: --config-path configs is a folder, not a file; pass a YAML file such as "
        "configs/streaming_local_demo.yaml\n"
    )
    assert train_main(["--task", "lm", "--config-path", "nope.yaml"]) == 2
    assert capsys.readouterr().err.startswith("llm-train: error: config file nope.yaml does not exist")


def test_log_lines_and_metrics_file_agree(trained: Path) -> None:
    out = (trained / "stdout.txt").read_text().splitlines()
    steps = [line for line in out if line.startswith("step ") and "| loss" in line]
    assert len(steps) == 6
    for line in steps:
        assert "| data wait " in line and "| elapsed " in line and "| eta " in line
    summary = out[-1]
    assert summary.startswith("trained 6 steps to step 6") and summary.endswith("metrics ck/metrics.jsonl")
    records = [json.loads(line) for line in (trained / "ck" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "loss" in r]
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5, 6]
    for record, line in zip(logged, steps):
        assert f"loss {record['loss']:.4f}" in line
        assert f"tokens/s {record['tokens_per_s']:,.0f}" in line
        assert 0.0 <= record["data_wait"] <= 1.0 and record["lr"] > 0
    assert logged[-1]["tokens"] == 6 * 4 * 32
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]


def test_metrics_hold_the_ingest_figures_of_each_interval(trained: Path) -> None:
    from llm.training.ingest_metrics import RATE_KEYS, WAIT_KEYS

    records = [json.loads(line) for line in (trained / "ck" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "loss" in r]
    for record in logged:
        assert set(WAIT_KEYS + RATE_KEYS) <= set(record), record
        assert 0 <= record["data_wait_p50_ms"] <= record["data_wait_p95_ms"] <= record["data_wait_p99_ms"]
        # one batch per step per log interval here: 4 x 32 tokens each
        assert record["data_tokens_per_s"] / record["data_batches_per_s"] == pytest.approx(4 * 32, rel=1e-3)
        assert "remote_bytes" not in record, "local data: no remote keys"


def test_resume_rewrites_the_metrics_after_its_checkpoint(trained: Path, tmp_path: Path) -> None:
    import shutil

    work = tmp_path / "copy"
    shutil.copytree(trained, work)
    (work / "ck" / "latest").write_text("step_3\n")  # as if killed after step 6 was logged but before it was saved
    shutil.rmtree(work / "ck" / "step_6")
    proc = run_here("llm-train", "--task", "lm", "--config-path", "cfg.yaml", "--set",
               "checkpoint.resume_from_checkpoint=ck/latest", cwd=work)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (work / "ck" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]


def test_plot_writes_a_png(trained: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from llm.training.train import main as train_main

    monkeypatch.chdir(trained)
    assert train_main(["plot", "ck"]) == 0  # `llm-train plot`, in-process
    assert capsys.readouterr().out.strip() == "plot: wrote ck/metrics.png"
    assert (trained / "ck" / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert train_main(["plot", "cfg.yaml"]) == 2
    assert capsys.readouterr().err == (
        "llm-train plot: error: RUN_DIR cfg.yaml is a file, not a folder; pass the run's checkpoint_dir\n"
    )
    assert train_main(["plot", "."]) == 2
    assert capsys.readouterr().err == (
        "llm-train plot: error: . holds no metrics.jsonl; is it the checkpoint_dir of a run by llm-train?\n"
    )


@pytest.mark.slow  # end to end; `make test-all` and CI run it
def test_generate_from_the_checkpoint(trained: Path) -> None:
    args = ["--checkpoint", "ck/latest", "--prompt", "sample line", "--max-new-tokens", "12", "--seed", "3"]
    first, second = run("llm-generate", *args, cwd=trained), run("llm-generate", *args, cwd=trained)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout, "the same seed gives the same text"
    assert first.stdout.startswith("sample line")
    assert first.stderr.splitlines()[0].startswith("generate: ") and "(step 6)" in first.stderr
    greedy = run("llm-generate", "--checkpoint", "ck", "--prompt", "sample", "--greedy", "--max-new-tokens", "5", cwd=trained)
    assert greedy.returncode == 0 and greedy.stdout.startswith("sample")
    assert first_error(run("llm-generate", "--checkpoint", "nope", "--prompt", "x", cwd=trained)).startswith(
        "llm-generate: error: checkpoint nope does not exist"
    )
    assert first_error(run("llm-generate", *args, "--temperature", "0", cwd=trained)).startswith(
        "llm-generate: error: --temperature must be above 0"
    )


def test_generate_finds_a_relative_tokenizer_from_the_runs_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llm.training.generate import _tokenizer_spec

    step = tmp_path / "work" / "runs" / "a" / "step_4"
    step.mkdir(parents=True)
    (tmp_path / "work" / "tok.json").write_text("{}")
    config = {"data": {"tokenizer_type": "hf", "tokenizer_path": "tok.json"}, "checkpoint": {"checkpoint_dir": "runs/a"}}
    monkeypatch.chdir(tmp_path)  # not the folder the run was started in
    assert _tokenizer_spec(config, step) == str(tmp_path / "work" / "tok.json")
    assert _tokenizer_spec({"data": {"tokenizer_type": "simple"}}, step) == "simple"
