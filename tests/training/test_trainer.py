"""The trainer: loss goes down, resume is exact (same tokens, same weights), fingerprints are checked."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from llm.training.checkpoint import load_checkpoint
from llm.training.core.loading import build_config
from llm.training.trainer import Trainer
from tests.resume import check_resume

REPO = Path(__file__).resolve().parents[2]


def write_corpus(path: Path, lines: int = 400) -> Path:
    """The guide's demo corpus, with a little variety so there is something to learn."""
    path.write_text("\n".join(f"sample line {i} says {'abc'[i % 3] * (1 + i % 4)}" for i in range(lines)) + "\n")
    return path


def tiny_tree(dataset_path: Path | str, **sections: dict) -> dict:
    tree = {
        "data": {"data_source": "local", "dataset_path": str(dataset_path), "max_seq_len": 32},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2},
        "training": {"batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "seed": 1, "deterministic": True},
        "checkpoint": {"checkpoint_dir": None},
    }
    for name, values in sections.items():
        tree[name] = {**tree.get(name, {}), **values}
    return tree


def run_trainer(config: dict, state: dict | None, steps: int | None) -> tuple[list, dict]:
    """check_resume's `run`: train `steps` steps (None: to the end) and report each step."""
    torch.set_num_threads(1)  # the same reduction order in every process
    outputs: list[dict] = []

    def record(trainer: Trainer, batch: dict, loss: float) -> None:
        weights = sum(float(p.detach().double().sum()) for p in trainer.raw_model.parameters())
        outputs.append({
            "input_ids": batch["input_ids"].numpy().copy(),
            "labels": batch["labels"].numpy().copy(),
            "loss": np.float64(loss),
            "weights": np.float64(weights),
        })

    tree = config["tree"]
    if config.get("ledger"):  # llm-train writes RUN_DIR/ledger/<run>; a resume continues the one its state names
        folder = Path(config["ledger"]) / ("resumed" if state is not None else "")
        tree = {**tree, "checkpoint": {**tree.get("checkpoint", {}), "checkpoint_dir": str(folder)}}
    trainer = Trainer(build_config(tree), config["task"], callbacks=[record], log=lambda _: None)
    if state is not None:
        trainer.load_payload(state)
    trainer.fit(stop_after=steps)
    return outputs, trainer.state_payload()


def test_resume_is_exact_for_lm_task(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    # 200 lines ~ 6k tokens ~ 47 blocks of 33 ~ 11 batches per pass: 2 epochs of 7 steps wrap the data
    tree = tiny_tree(corpus, data={"steps_per_epoch": 7}, training={"epochs": 2})
    # in-process here (new Trainer objects, pickled state); the kill -9 test below uses fresh processes
    reference = check_resume(run_trainer, {"tree": tree, "task": "lm"}, stops=[3, 7, 12], fresh_process=False)
    assert len(reference) == 14
    assert len({r["weights"].item() for r in reference}) == 14  # the weights really change every step


@pytest.mark.slow  # fresh processes; in make test: test_skip_ranges.py[optimized shards] resumes a Trainer over them
def test_resume_is_exact_for_optimized_shards(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    subprocess.run(
        [sys.executable, "-m", "llm.cli.data", "optimize", str(corpus), "--output", str(tmp_path / "opt"),
         "--tokenizer", "simple", "--num-workers", "1", "--no-progress"],
        check=True, capture_output=True,
    )
    tree = tiny_tree(tmp_path / "opt", data={"data_source": "optimized", "steps_per_epoch": 6}, training={"epochs": 2})
    reference = check_resume(run_trainer, {"tree": tree, "task": "stream_lm"}, stops=[6])
    assert len(reference) == 12


def test_loss_decreases_on_the_demo(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    corpus = write_corpus(tmp_path / "demo.txt")
    tree = tiny_tree(corpus, data={"steps_per_epoch": 40}, training={"batch_size": 8})
    result = Trainer(build_config(tree), "lm", log=lambda _: None).fit()
    first, last = np.mean(result.losses[:3]), np.mean(result.losses[-3:])
    assert last < 0.6 * first, (first, last)
    assert first > 4.0  # ~ln(257) at the start: the model really starts from scratch


def test_fingerprint_mismatch_is_refused(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    tree = tiny_tree(corpus, data={"steps_per_epoch": 2}, checkpoint={"checkpoint_dir": str(tmp_path / "ck")})
    Trainer(build_config(tree), "lm", log=lambda _: None).fit()
    assert load_checkpoint(tmp_path / "ck" / "latest")["step"] == 2
    write_corpus(corpus, 201)  # one more record: another token stream
    resume = {**tree, "checkpoint": {**tree["checkpoint"], "resume_from_checkpoint": str(tmp_path / "ck" / "latest")}}
    with pytest.raises(ValueError, match=r"stream source fingerprint mismatch: checkpoint .*step_2 was written for other data: .*content.*'[0-9a-f]+' -> '[0-9a-f]+' \(checkpoint -> this config\)") as info:
        Trainer(build_config(resume), "lm", log=lambda _: None)
    assert "max_seq_len" not in str(info.value)  # only the keys that differ


_KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys, yaml, torch
    torch.set_num_threads(1)
    from llm.training.core.loading import load_config
    from llm.training.trainer import Trainer

    def kill_at(step):
        def callback(trainer, batch, loss):
            if trainer.step == step:
                os.kill(os.getpid(), signal.SIGKILL)  # no clean-up, no final checkpoint
        return callback

    cfg = load_config(sys.argv[1], dict(a.split("=", 1) for a in sys.argv[4:]))
    Trainer(cfg, sys.argv[2], callbacks=[kill_at(int(sys.argv[3]))]).fit()
    """
)


def train_cli(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "llm.training.train", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _run_overrides(tmp_path: Path, name: str, tree: dict) -> list[str]:
    """Per-run paths: its checkpoint_dir, and its own dedup seen-set when the config keeps one."""
    sets = [f"checkpoint.checkpoint_dir={tmp_path / name}"]
    if tree["data"].get("seen_hashes_path"):
        sets.append(f"data.seen_hashes_path={tmp_path / (name + '.seen')}")
    return sets


def kill9_then_resume_matches_uninterrupted(tmp_path: Path, task: str, tree: dict) -> None:
    """Shared by the task tests: kill -9 at step 5, resume from step_4, compare step_8."""
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tree))
    ref_sets = _run_overrides(tmp_path, "ref", tree)
    train_cli(["--task", task, "--config-path", str(cfg), *(x for s in ref_sets for x in ("--set", s))], tmp_path)
    script = tmp_path / "killed.py"
    script.write_text(_KILLED_RUN)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    run_sets = _run_overrides(tmp_path, "run", tree)
    # Its own session: DataLoader workers orphaned by the kill may linger holding our pipes,
    # so wait for the trainer process itself, then kill whatever is left of its group.
    with subprocess.Popen([sys.executable, str(script), str(cfg), task, "5", *run_sets], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        returncode = proc.wait(timeout=300)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    assert returncode == -signal.SIGKILL, err
    assert load_checkpoint(tmp_path / "run" / "latest")["step"] == 4
    resume_sets = [*run_sets, f"checkpoint.resume_from_checkpoint={tmp_path / 'run' / 'latest'}"]
    out = train_cli(["--task", task, "--config-path", str(cfg), *(x for s in resume_sets for x in ("--set", s))], tmp_path)
    assert "resumed from" in out and "at step 4" in out
    ref, resumed = load_checkpoint(tmp_path / "ref" / "latest"), load_checkpoint(tmp_path / "run" / "latest")
    assert ref["step"] == resumed["step"] == 8
    for name, tensor in ref["model_state_dict"].items():
        assert torch.equal(tensor, resumed["model_state_dict"][name]), name
    assert _without_paths(ref["stream_data"]) == _without_paths(resumed["stream_data"])
    assert ref["optimizer_state_dict"]["state"][0]["step"] == resumed["optimizer_state_dict"]["state"][0]["step"]


def _without_paths(state: dict) -> dict:
    """The data state minus where each run keeps its own seen-set file, and its own ledger (run id, generation)."""
    return {k: ({**v, "path": None} if k == "seen_hashes" else v) for k, v in state.items() if k != "ledger"}


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
def test_kill_9_between_checkpoints_then_resume_reaches_same_weights_lm(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 200)
    tree = tiny_tree(corpus, data={"steps_per_epoch": 4}, training={"epochs": 2}, checkpoint={"save_interval_steps": 2})
    kill9_then_resume_matches_uninterrupted(tmp_path, "lm", tree)
    from llm.training.train import main as llm_train

    # the killed run's ledger, resumed: every block of both epochs trained exactly once
    assert llm_train(["audit", str(tmp_path / "run")]) == 0


def test_validation_and_max_steps(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    corpus = write_corpus(tmp_path / "demo.txt")
    val = tmp_path / "val.txt"
    val.write_text("\n".join(f"sample line {i} says {'abc'[i % 3] * (1 + i % 4)}" for i in range(1000, 1100)) + "\n")
    logs: list[str] = []
    tree = tiny_tree(
        corpus,
        data={"steps_per_epoch": 10, "val_dataset_path": str(val)},
        training={"batch_size": 8, "epochs": 5, "max_steps": 30, "val_batches": 4},
    )
    trainer = Trainer(build_config(tree), "lm", log=logs.append)
    assert trainer.total_steps == 30  # max_steps caps epochs x steps_per_epoch (50)
    result = trainer.fit()
    assert result.steps == 30 and result.epochs == 3
    assert len(result.val_losses) == 3  # one validation per epoch end
    assert result.val_losses[-1] < result.val_losses[0] < 6.0
    assert any("val_loss" in line for line in logs)
    assert any(line.startswith("trained 30 steps") and "tokens/s" in line for line in logs)


def test_max_steps_is_the_total_when_the_python_trainer_resumes_a_finished_run(tmp_path: Path) -> None:
    """Trainer (not only llm-train) reads max_steps as the total: a finished run trains nothing more."""
    torch.set_num_threads(1)
    corpus = write_corpus(tmp_path / "demo.txt")
    run = tmp_path / "run"
    tree = tiny_tree(corpus, data={"steps_per_epoch": 4}, training={"epochs": 3, "max_steps": 6},
                     checkpoint={"checkpoint_dir": str(run)})
    first = Trainer(build_config(tree), "lm", log=lambda _: None)
    assert first.fit().steps == 6
    first.close()
    finished = str(first.last_checkpoint)

    logs: list[str] = []
    again = Trainer(build_config({**tree, "checkpoint": {"checkpoint_dir": str(run), "resume_from_checkpoint": finished}}),
                    "lm", log=logs.append)
    assert again.total_steps == 6 and again.fit().steps == 0  # before the fix: 6 more steps
    assert any("nothing to train" in line for line in logs)
    again.close()

    further = {**tree, "training": {**tree["training"], "max_steps": 9},
               "checkpoint": {"checkpoint_dir": str(run), "resume_from_checkpoint": finished}}
    more = Trainer(build_config(further), "lm", log=lambda _: None)
    assert more.total_steps == 9 and more.step == 6
    more.fit()
    assert more.step == 9
    more.close()
