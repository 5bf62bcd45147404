"""DDP with torchrun, 2 CPU processes on gloo: disjoint data per rank, exact resume, another world size."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
import yaml

from llm.training.checkpoint import load_checkpoint
from llm.training.run_audit import run_audit
from tests.training.test_trainer import tiny_tree, write_corpus

REPO = Path(__file__).resolve().parents[2]
EOS = 256  # the `simple` tokenizer's end of text

# Trains like `llm-train`, and also records each rank's batches and can kill -9 itself.
_RUN = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np, torch
    torch.set_num_threads(1)
    from llm.training.core.loading import load_config
    from llm.training.trainer import Trainer

    cfg_path, ckpt_dir, out_dir, kill_step, resume = sys.argv[1:6]
    overrides = {"checkpoint.checkpoint_dir": ckpt_dir}
    if resume != "-":
        overrides["checkpoint.resume_from_checkpoint"] = resume
    rank = int(os.environ.get("RANK", 0))

    def record(trainer, batch, loss):
        np.save(f"{out_dir}/rank{rank}_step{trainer.step}.npy", batch["input_ids"].numpy())
        if trainer.step == int(kill_step):
            os.kill(os.getpid(), signal.SIGKILL)

    trainer = Trainer(load_config(cfg_path, overrides), "stream_lm", callbacks=[record])
    trainer.fit()
    trainer.close()
    """
)


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}


def _kill_tree(pid: int) -> None:
    """Kill a process and all its descendants (torchrun starts its workers in new sessions)."""
    try:
        parent = psutil.Process(pid)
        family = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _run(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Run with a time limit; a hang is cleaned up whole, torchrun's workers included."""
    with subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=int(os.environ.get("LLM_TEST_DDP_TIMEOUT", 240)))
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            out, err = proc.communicate(timeout=30)
            raise AssertionError(f"{' '.join(cmd)} hung\n{out}\n{err}") from None
    if check:
        assert proc.returncode == 0, out + err
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _torchrun(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args], cwd, check)


def _two_epochs(tmp_path: Path, documents: int, data: dict) -> Path:
    """cfg.yaml of a tiny run over `documents` documents: two epochs, a checkpoint every 2 steps, all kept."""
    tree = tiny_tree(write_corpus(tmp_path / "demo.txt", documents), data=data, training={"epochs": 2},
                     checkpoint={"save_interval_steps": 2, "keep_last_n": 10})
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tree))
    return cfg


def _documents(out_dir: Path, rank: int, steps: range) -> list[bytes]:
    """Whole documents (between two EOS in one block) that `rank` trained on at `steps`."""
    docs = []
    for step in steps:
        for row in np.load(out_dir / f"rank{rank}_step{step}.npy"):
            cuts = np.flatnonzero(row == EOS)
            for a, b in zip(cuts[:-1], cuts[1:]):
                if b > a + 1:
                    docs.append(bytes(row[a + 1 : b].astype(np.uint8)))
    return docs


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
@pytest.mark.timeout(560)
def test_two_ranks_disjoint_data_and_exact_resume_after_kill(tmp_path: Path) -> None:
    cfg = _two_epochs(tmp_path, 400, {"steps_per_epoch": 4, "max_seq_len": 64})  # ~2 whole documents per row
    script = tmp_path / "run.py"
    script.write_text(_RUN)
    out = tmp_path / "batches"
    out.mkdir()

    # the uninterrupted reference, through the real entry point under torchrun
    ref = _torchrun(["-m", "llm.training.train", "--task", "stream_lm", "--config-path", str(cfg),
                     "--set", f"checkpoint.checkpoint_dir={tmp_path / 'ref'}"], tmp_path)
    assert "2 process(es)" in ref.stdout and "step 8/8" in ref.stdout
    from llm.training.ingest_metrics import RATE_KEYS, SLOWEST_RANK_KEY, WAIT_KEYS
    from llm.training.metrics import read_metrics

    logged = [r for r in read_metrics(tmp_path / "ref") if "loss" in r]  # ingest figures gathered from both ranks
    assert logged and all(set(WAIT_KEYS + RATE_KEYS) | {SLOWEST_RANK_KEY} <= set(r) for r in logged)
    assert all(r["data_wait_p99_ms"] <= r[SLOWEST_RANK_KEY] * 1.0001 for r in logged)
    for r in logged:  # batches and tokens of both ranks: 4 x 64 tokens each
        assert r["data_tokens_per_s"] / r["data_batches_per_s"] == pytest.approx(4 * 64, rel=1e-3)

    # the same job, killed (-9) on both ranks after step 5, between the step 4 and step 6 checkpoints
    killed = _torchrun([str(script), str(cfg), str(tmp_path / "run"), str(out), "5", "-"], tmp_path, check=False)
    assert killed.returncode != 0
    assert load_checkpoint(tmp_path / "run" / "latest")["step"] == 4

    # ranks read disjoint data
    rank0, rank1 = _documents(out, 0, range(1, 6)), _documents(out, 1, range(1, 6))
    assert len(rank0) > 20 and len(rank1) > 20
    assert not set(rank0) & set(rank1)

    # resume with torchrun from `latest`: same weights and same cursors as the reference
    resumed = _torchrun(["-m", "llm.training.train", "--task", "stream_lm", "--config-path", str(cfg),
                         "--set", f"checkpoint.checkpoint_dir={tmp_path / 'run'}",
                         "--set", f"checkpoint.resume_from_checkpoint={tmp_path / 'run' / 'latest'}"], tmp_path)
    assert "resumed from" in resumed.stdout and "at step 4" in resumed.stdout
    a, b = load_checkpoint(tmp_path / "ref" / "latest"), load_checkpoint(tmp_path / "run" / "latest")
    assert a["step"] == b["step"] == 8
    for name, tensor in a["model_state_dict"].items():
        assert torch.equal(tensor, b["model_state_dict"][name]), name
    a["stream_data"].pop("ledger"), b["stream_data"].pop("ledger")  # each run has its own (run id, generation)
    assert a["stream_data"] == b["stream_data"]
    assert set(b["stream_data"]["line_index"]) == {"0", "1"}  # every rank's cursor
    report, _ = run_audit(tmp_path / "run")  # the resumed two-rank run's ledger: every document once
    assert report.ok, report.lines()
    assert b["world_size"] == 2 and len(b["rng_states"]) == 2

    # another world size: one process continues from the 2-rank step 4 checkpoint, partitions
    # reassigned, and trains on none of the documents the two ranks had already consumed
    single = tmp_path / "single"
    single.mkdir()
    proc = _run([sys.executable, str(script), str(cfg), str(tmp_path / "one"), str(single), "0",
                 str(tmp_path / "ref" / "step_4")], tmp_path)
    assert "resumed from" in proc.stdout
    seen = set(_documents(out, 0, range(1, 5))) | set(_documents(out, 1, range(1, 5)))
    after = _documents(single, 0, range(5, 9))
    assert len(after) > 20 and not seen & set(after)
    assert set(load_checkpoint(tmp_path / "one" / "latest")["stream_data"]["line_index"]) == {"0"}


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
@pytest.mark.timeout(400)
def test_lm_task_two_ranks_prepare_once_then_resume_on_one_process(tmp_path: Path) -> None:
    cfg = _two_epochs(tmp_path, 200, {"steps_per_epoch": 2})
    train = [sys.executable, "-m", "llm.training.train", "--task", "lm", "--config-path", str(cfg)]

    # rank 0 tokenizes the text once into <checkpoint_dir>/.data while rank 1 waits on the barrier
    ref = _torchrun(train[1:] + ["--set", f"checkpoint.checkpoint_dir={tmp_path / 'ref'}"], tmp_path)
    assert "2 process(es)" in ref.stdout and "step 4/4" in ref.stdout
    assert ref.stdout.count("prepared 1 file(s) once") == 1
    assert len(list((tmp_path / "ref" / ".data").iterdir())) == 1

    # one process with the same global batch continues from the 2-rank step 2 checkpoint, from its
    # own (another) preparation of the same text, at the same global sample position
    one = _run([*train, "--batch-size", "8", "--set", f"checkpoint.checkpoint_dir={tmp_path / 'one'}",
                "--set", f"checkpoint.resume_from_checkpoint={tmp_path / 'ref' / 'step_2'}"], tmp_path)
    assert "resumed from" in one.stdout and "at step 2" in one.stdout
    a, b = load_checkpoint(tmp_path / "ref" / "latest"), load_checkpoint(tmp_path / "one" / "latest")
    assert a["step"] == b["step"] == 4
    # the same data position; the ledger's position differs (b is a new generation of a's ledger, resumed elsewhere)
    assert a["stream_data"].pop("ledger")["run"] == b["stream_data"].pop("ledger")["run"]
    assert a["stream_source"] == b["stream_source"] and a["stream_data"] == b["stream_data"]
    assert (a["stream_data"]["epoch"], a["stream_data"]["samples_consumed"]) == (0, 4 * 8)  # 4 global batches of 8
    # both runs audit clean: ref's two ranks' segments, and one's branch of ref's ledger (from step 2 on)
    for run in ("ref", "one"):
        audit = _run([sys.executable, "-m", "llm.training.train", "audit", str(tmp_path / run)], tmp_path)
        assert "audit: OK" in audit.stdout, audit.stdout
