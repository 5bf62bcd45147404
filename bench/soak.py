"""`python -m bench.soak`: kill -9 `llm-train --task stream_lm` at seeded random steps, resume, compare.

One *chain* trains a tiny model on a text corpus, is killed with SIGKILL at each
of its kill steps (every rank kills itself right after that step, so checkpoints
of the steps before are on disk and the step itself may be lost), and is resumed
from `latest` each time until it finishes. It must equal an uninterrupted run:
for every step, the batch that the last run reaching that step trained on equals
the reference's (token for token), every step redone after a kill repeats the
killed run's batch, no whole document is trained on twice within the data pass,
and the final weights and data cursors are equal. `mode="save"` kills inside the
checkpoint write instead (the half-written step must never be loaded).

The tests (`tests/reliability/test_training_kill9.py`) run a few points; this
module runs many and writes the figures (`--out`, default bench/results/soak.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
EOS = 256  # the `simple` tokenizer's end of text

# Trains like `llm-train`, saves every step's batch per rank, and kills itself (-9) at `kill`
# (after that step; mode "save": inside the next checkpoint write, half the file on disk; mode
# "publish": once that checkpoint is in place, before its dedup digests reach the seen-hashes file).
_RUN = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np, torch
    torch.set_num_threads(1)
    import llm.training.checkpoint as ckpt
    from llm.training.core.loading import load_config
    from llm.training.trainer import Trainer

    cfg_path, ckpt_dir, out_dir, kill, mode, resume = sys.argv[1:7]
    kill = int(kill)
    overrides = {"checkpoint.checkpoint_dir": ckpt_dir}
    if resume != "-":
        overrides["checkpoint.resume_from_checkpoint"] = resume
    rank = int(os.environ.get("RANK", 0))
    real_write = ckpt._write_payload

    real_publish = ckpt.publish_seen_hashes
    saving = {}

    def write_half(path, payload):
        saving["step"] = payload["step"]
        if kill and mode == "save" and payload["step"] > kill:
            real_write(path, payload)
            os.truncate(path, os.path.getsize(path) // 2)
            os.kill(os.getpid(), signal.SIGKILL)
        real_write(path, payload)

    def publish_never(state):  # mode "publish": the checkpoint is in place, its dedup digests not yet appended
        if kill and mode == "publish" and saving["step"] > kill:
            # the step was trained (its checkpoint holds it), but `record` runs after the save: record it here
            np.save(f"{out_dir}/rank{rank}_step{saving['step']}.npy", saving["batch"].numpy())
            os.kill(os.getpid(), signal.SIGKILL)
        real_publish(state)

    ckpt._write_payload = write_half
    ckpt.publish_seen_hashes = publish_never

    def record(trainer, batch, loss):
        np.save(f"{out_dir}/rank{rank}_step{trainer.step}.npy", batch["input_ids"].numpy())
        if kill and mode == "step" and trainer.step == kill:
            os.kill(os.getpid(), signal.SIGKILL)

    trainer = Trainer(load_config(cfg_path, overrides), "stream_lm", callbacks=[record])
    trainer.raw_model.register_forward_pre_hook(lambda module, args: saving.__setitem__("batch", args[0]))
    trainer.fit()
    trainer.close()
    """
)


@dataclass
class ChainResult:
    """What one chain did and found (figures for docs/reliability.md)."""

    ranks: int
    workers: int
    mode: str
    kills: list[int]
    resumed_at: list[int] = field(default_factory=list)
    steps: int = 0
    steps_redone: int = 0
    tokens: int = 0
    documents: int = 0
    documents_lost: int = 0
    documents_repeated: int = 0
    documents_foreign: int = 0
    seconds: float = 0.0


def write_corpus(path: Path, lines: int = 600) -> Path:
    """Unique documents (an id in front) of varied length."""
    rng = random.Random(7)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    path.write_text("".join(f"doc {i} " + " ".join(rng.choices(words, k=rng.choice([1, 2, 4]))) + "\n" for i in range(lines)))
    return path


def write_config(
    folder: Path, corpus: Path, workers: int, steps_per_epoch: int = 4, epochs: int = 3, dedup: bool = False
) -> Path:
    """The run's YAML; `dedup`: a deduplicated source whose seen-hashes file lies in each run's folder."""
    import yaml

    data = {"data_source": "local", "dataset_path": str(corpus), "max_seq_len": 64,
            "steps_per_epoch": steps_per_epoch, "num_workers": workers}
    if dedup:  # a relative path: the reference and the chain (run in their own folders) each have theirs
        data |= {"data_source": "dedup_local", "seen_hashes_path": "seen_hashes.txt", "write_seen_hashes": True}
    tree = {
        "data": data,
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2},
        "training": {"batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "seed": 1, "deterministic": True,
                     "epochs": epochs},
        "checkpoint": {"save_interval_steps": 2, "keep_last_n": 100},
    }
    path = folder / "cfg.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}


def _kill_group(pid: int) -> None:
    """kill -9 whatever is left of a run's session (orphaned DataLoader workers, torchrun's ranks)."""
    import psutil

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(psutil.NoSuchProcess):
        for p in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def run_once(folder: Path, cfg: Path, ranks: int, out: Path, kill: int, mode: str, resume: str, timeout: int = 300) -> int:
    """One training process (or torchrun job); returns its exit code (negative: a signal)."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "run.py"
    script.write_text(_RUN)
    out.mkdir(parents=True, exist_ok=True)
    args = [str(script), str(cfg), str(folder / "ckpt"), str(out), str(kill), mode, resume]
    if ranks > 1:
        args = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *args]
    log = out / "log.txt"
    # output to a file, not a pipe: DataLoader workers orphaned by the kill would hold a pipe open
    with open(log, "w") as sink, subprocess.Popen([sys.executable, *args], cwd=folder, env=_env(), stdout=sink,
                                                  stderr=subprocess.STDOUT, start_new_session=True) as proc:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"run {out.name} hung (kill at {kill}, resume {resume})") from None
        finally:
            _kill_group(proc.pid)
    if kill == 0 and proc.returncode != 0:
        raise AssertionError(f"run {out.name} failed:\n{log.read_text()[-3000:]}")
    return proc.returncode


def documents(rows: np.ndarray) -> list[bytes]:
    """Whole documents (between two EOS in one row) of a batch."""
    docs = []
    for row in rows:
        cuts = np.flatnonzero(row == EOS)
        docs.extend(bytes(row[a + 1 : b].astype(np.uint8)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a + 1)
    return docs


def kill_chain(
    folder: Path, kills: list[int], ranks: int = 1, workers: int = 2, modes: list[str] | None = None,
    dedup: bool = False,
) -> ChainResult:
    """Reference run, then one run per kill step resumed from `latest`, then the last run; compare.

    `modes[i]` is "step" (kill right after step kills[i]), "save" (kill inside the first
    checkpoint write after it) or "publish" (kill once that checkpoint is in place, before
    its dedup digests are appended to the seen-hashes file). `dedup`: a deduplicated source.
    """
    import torch

    from llm.training.checkpoint import load_checkpoint
    from llm.training.run_audit import run_audit

    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    corpus = write_corpus(folder / "corpus.txt")
    cfg = write_config(folder, corpus, workers, dedup=dedup)
    ref_dir = folder / "ref"
    modes = modes or ["step"] * len(kills)
    run_once(ref_dir, cfg, ranks, ref_dir / "batches", 0, "step", "-")
    result = ChainResult(ranks, workers, ",".join(modes), list(kills))
    chain = folder / "chain"
    chain.mkdir(parents=True, exist_ok=True)
    latest = chain / "ckpt" / "latest"
    owner: dict[tuple[int, int], Path] = {}  # (rank, step) -> the batch file of the last run that took it
    for k, (kill, mode) in enumerate(zip([*kills, 0], [*modes, "step"])):
        resume = str(latest) if latest.exists() else "-"
        if resume != "-":
            result.resumed_at.append(int(load_checkpoint(latest)["step"]))
        out = chain / f"run{k}"
        code = run_once(chain, cfg, ranks, out, kill, mode, resume)
        if kill and code == 0:
            raise AssertionError(f"run {k} was to be killed at step {kill} but finished")
        if kill and mode == "save":  # the half-written save is never `latest`; the previous one loads
            assert list((chain / "ckpt").glob(".tmp-step_*")), "the kill missed the checkpoint write"
            if kill >= 2:  # the first checkpoint is at step 2: before it there is nothing to load
                assert load_checkpoint(latest)["step"] <= kill
            else:
                assert not latest.exists()
        if kill and mode == "publish":  # the checkpoint after the kill step landed
            assert load_checkpoint(latest)["step"] > kill
        for f in sorted(out.glob("rank*_step*.npy")):
            rank, step = (int(x) for x in f.stem[4:].split("_step"))
            before = owner.get((rank, step))
            if before is not None:  # a step redone after a kill: the same batch as the first time
                assert np.array_equal(np.load(before), np.load(f)), f"step {step} of rank {rank} differs when redone"
                result.steps_redone += 1
            owner[(rank, step)] = f
    ref_files = {(int(a), int(b)): f for f in (ref_dir / "batches").glob("rank*_step*.npy")
                 for a, b in [f.stem[4:].split("_step")]}
    assert set(owner) == set(ref_files), "the chain took other steps than the uninterrupted run"
    seen: list[bytes] = []
    expected: list[bytes] = []
    for key in sorted(ref_files, key=lambda rs: (rs[1], rs[0])):
        ref, got = np.load(ref_files[key]), np.load(owner[key])
        assert np.array_equal(ref, got), f"rank {key[0]} step {key[1]}: another batch than the uninterrupted run"
        result.tokens += int(got.size)
        seen.extend(documents(got))
        expected.extend(documents(ref))
    a, b = load_checkpoint(ref_dir / "ckpt" / "latest"), load_checkpoint(latest)
    assert a["step"] == b["step"], (a["step"], b["step"])
    for name, tensor in a["model_state_dict"].items():
        assert torch.equal(tensor, b["model_state_dict"][name]), f"final weights differ: {name}"
    def cursors(state: dict) -> dict:  # each run keeps its own ledger (run id, generation): not a cursor
        return {k: v for k, v in state.items() if k != "ledger"}

    assert cursors(a["stream_data"]) == cursors(b["stream_data"]), "final data cursors differ"
    report, _ = run_audit(Path(latest).parent)  # and the chain's own ledger proves it: every sample once
    assert report.ok, "the chain's ledger audit failed: " + "; ".join(report.lines())
    corpus_docs = {line.encode() for line in corpus.read_text().splitlines()}
    result.steps = int(b["step"])
    result.documents = len(seen)
    result.documents_repeated = len(seen) - len(set(seen))
    result.documents_lost = sum((Counter(expected) - Counter(seen)).values())
    result.documents_foreign = len([d for d in seen if d not in corpus_docs])  # nothing torn or invented
    assert result.documents_repeated == result.documents_lost == result.documents_foreign == 0, asdict(result)
    result.seconds = round(time.perf_counter() - started, 1)
    return result


def _kind(r: ChainResult) -> str:
    return f"{r.ranks} rank(s) x {r.workers} worker(s), kill {r.mode.split(',')[0]}"


def seeded_kills(seed: int, steps: int, count: int) -> list[int]:
    """`count` distinct kill steps in [1, steps - 1], from `seed`."""
    return sorted(random.Random(seed).sample(range(1, steps), count))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=20, help="kill points with DataLoader workers")
    parser.add_argument("--rank-points", type=int, default=6, help="kill points with 2 ranks (torchrun)")
    parser.add_argument("--save-points", type=int, default=4, help="kills inside a checkpoint write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=str(REPO / ".bench_cache" / "soak"))
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "soak.json"))
    args = parser.parse_args(argv)
    work, total = Path(args.work), 12  # 3 epochs x 4 steps
    results: list[ChainResult] = []
    plans = []
    for chain in range(0, args.points, 3):  # chains of up to 3 kills each
        kills = seeded_kills(args.seed + chain, total, min(3, args.points - chain))
        plans.append((1, 2, kills, ["step"] * len(kills)))
    for chain in range(0, args.rank_points, 2):
        kills = seeded_kills(args.seed + 100 + chain, total, min(2, args.rank_points - chain))
        plans.append((2, 0, kills, ["step"] * len(kills)))
    for chain in range(args.save_points):
        plans.append((1, 2, [1 + seeded_kills(args.seed + 200 + chain, total - 2, 1)[0]], ["save"]))  # in [2, 10]
    for i, (ranks, workers, kills, modes) in enumerate(plans):
        folder = work / f"chain{i}"
        shutil.rmtree(folder, ignore_errors=True)
        r = kill_chain(folder, kills, ranks=ranks, workers=workers, modes=modes)
        mode = ",".join(modes)
        results.append(r)
        print(f"chain {i}: ranks={ranks} workers={workers} mode={mode} kills={kills} resumed_at={r.resumed_at} "
              f"redone={r.steps_redone} docs={r.documents} lost={r.documents_lost} repeated={r.documents_repeated} "
              f"{r.seconds}s", flush=True)
    summary = {
        "chains": len(results),
        "kills": sum(len(r.kills) for r in results),
        "kills_by_kind": {k: sum(len(r.kills) for r in results if _kind(r) == k) for k in sorted({_kind(r) for r in results})},
        "steps_redone": sum(r.steps_redone for r in results),
        "tokens_compared": sum(r.tokens for r in results),
        "documents_compared": sum(r.documents for r in results),
        "documents_lost": sum(r.documents_lost for r in results),
        "documents_repeated": sum(r.documents_repeated for r in results),
        "seconds": round(sum(r.seconds for r in results), 1),
        "results": [asdict(r) for r in results],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
