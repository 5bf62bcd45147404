"""llm-train's run ledger: `lm` runs straight, resumed at another batch size, killed between a ledger
segment and its checkpoint, with skipped batches, and with planted faults; `llm-train audit`, `why`, `spikes`."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import llm.training.trainer as trainer_module
from llm.data import StreamingDataLoader
from llm.data.ledger.reader import read_ledger
from llm.data.shards.read.source import SampleSource
from llm.training.core.loading import build_config
from llm.training.ledger import LEDGER_DIR
from llm.training.train import main as llm_train
from llm.training.trainer import Trainer


def _corpus(path: Path, n: int = 24) -> Path:
    path.write_text("\n".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)) + "\n")
    return path


def _tree(corpus: Path, out: Path, batch: int = 4, resume: str | None = None, epochs: int = 1, **data) -> dict:
    return {
        "data": {"data_source": "local", "dataset_path": str(corpus), "max_seq_len": 16,
                 "cache_dir": str(out / "cache"), **data},
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
        "training": {"batch_size": batch, "lr": 1e-3, "warmup_steps": 1, "seed": 1, "epochs": epochs},
        "checkpoint": {"checkpoint_dir": str(out / "ckpt"), "save_interval_steps": 3, "resume_from_checkpoint": resume,
                       "keep_last_n": None},
    }


def _train(tree: dict, stop_after: int | None = None, overwrite: bool = False, task: str = "lm") -> Trainer:
    trainer = Trainer(build_config(tree), task, log=lambda _: None, overwrite=overwrite)
    try:
        trainer.fit(stop_after=stop_after)
    finally:
        trainer.close()
    return trainer


def _cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = llm_train(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def _ledgers(run: Path) -> list[Path]:
    return sorted(p for p in (run / "ckpt" / LEDGER_DIR).iterdir() if p.is_dir())


def test_a_straight_run_and_a_resume_chain_with_a_kill_audit_clean(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = _corpus(tmp_path / "c.txt")
    _train(_tree(corpus, tmp_path / "a", epochs=2))
    code, out = _cli(capsys, "audit", str(tmp_path / "a" / "ckpt"))
    assert code == 0 and "audit: OK" in out, out

    run = tmp_path / "b"
    _train(_tree(corpus, run, batch=4, epochs=2), stop_after=4)  # checkpoint at step 3; step 4 lost
    # killed between the ledger segment of step 6 and its checkpoint: the segment is on disk, step_6 is not
    real_save = trainer_module.save_checkpoint

    def killed(root, step, payload, keep_last_n=None):  # noqa: ANN001
        if step == 6:
            raise KeyboardInterrupt("kill -9")
        return real_save(root, step, payload, keep_last_n)

    monkeypatch.setattr(trainer_module, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        _train(_tree(corpus, run, batch=2, resume=str(run / "ckpt" / "latest"), epochs=2))
    monkeypatch.setattr(trainer_module, "save_checkpoint", real_save)
    (ledger,) = _ledgers(run)
    assert any(p.name.endswith("-000000000006.seg") for p in ledger.iterdir())  # committed, then lost
    code, out = _cli(capsys, "audit", str(run / "ckpt"))
    assert code == 0 and "are not counted" in out, out  # the lost steps are set apart, not counted
    done = _train(_tree(corpus, run, batch=3, resume=str(run / "ckpt" / "latest"), epochs=2))
    assert done.epoch == 2
    code, out = _cli(capsys, "audit", str(run / "ckpt"))
    assert code == 0 and "audit: OK" in out, out
    read = read_ledger(ledger)
    assert sorted(read.markers) == [1, 2] and np.isfinite(read.rows["loss"]).all()  # every row's loss recorded


def test_skipped_batches_are_counted_as_skipped_and_steps_count_trained_batches(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = _corpus(tmp_path / "c.txt")
    run = tmp_path / "run"
    _train(_tree(corpus, run, skip_batches=[[2, 4]]))
    code, out = _cli(capsys, "audit", str(run / "ckpt"))
    assert code == 0 and "8 skipped (read, not trained" in out, out
    code, out = _cli(capsys, "why", str(run / "ckpt"), "--step", "3")
    assert code == 0 and "step 3 (batch 4 of the run" in out, out  # batches 2 and 3 were skipped


def test_why_names_every_document_of_a_step(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = _corpus(tmp_path / "c.txt")
    run = tmp_path / "run"
    _train(_tree(corpus, run))
    (folder,) = _ledgers(run)
    read = read_ledger(folder)
    samples = read.pieces["item"][read.rows["step"][read.pieces["row_ref"]] == 5].tolist()
    code, out = _cli(capsys, "why", str(run / "ckpt"), "--step", "5", "--preview", "100")
    assert code == 0, out
    lines = out.splitlines()
    for sample in samples:
        assert any(f"sample {sample}: shard " in line for line in lines), out
    docs = [line for line in lines if "tokens [" in line and ("): a document" in line or "): the rest" in line)]
    # each row's documents cover its 17 tokens, and the decoded text is the corpus's (hex digests)
    spans = [tuple(int(x) for x in line.split("tokens [")[1].split(")")[0].split(", ")) for line in docs]
    assert sum(b - a for a, b in spans) == 17 * len(samples)
    text = corpus.read_text()
    assert all(line.rsplit(" '", 1)[1].rstrip("'").strip() in text for line in docs if " '" in line)
    assert any("the rest of a document begun before the block" in line for line in docs)
    code, out = _cli(capsys, "why", str(run / "ckpt"), "--step", "500")
    assert code == 2 and "step 500 is not in ledger" in out and "training steps 1-" in out


def test_spikes_finds_a_planted_spike_with_its_documents(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import llm.training.ledger as ledger_module

    real = ledger_module.row_losses
    calls = []

    def planted(logits, labels):  # noqa: ANN001
        calls.append(1)
        losses = real(logits, labels)
        return losses + 50.0 if len(calls) == 9 else losses  # step 9's rows: garbage

    monkeypatch.setattr(ledger_module, "row_losses", planted)
    corpus = _corpus(tmp_path / "c.txt")
    run = tmp_path / "run"
    _train(_tree(corpus, run))
    code, out = _cli(capsys, "spikes", str(run / "ckpt"), "--top", "1")
    assert code == 0, out
    assert "step 9: loss" in out and "sample " in out and "shard " in out, out


def test_planted_faults_exit_1_and_are_named(tmp_path: Path, capsys: pytest.CaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    corpus = _corpus(tmp_path / "c.txt")

    def edited(name: str, delta: int) -> str:
        run = tmp_path / name
        _train(_tree(corpus, run), stop_after=3)
        path = run / "ckpt" / "step_3" / "checkpoint.pt"
        payload = torch.load(path, weights_only=False)
        payload["stream_data"]["samples_consumed"] += delta  # the state edited by hand
        torch.save(payload, path)
        _train(_tree(corpus, run, resume=str(run / "ckpt" / "latest")))
        return _cli(capsys, "audit", str(run / "ckpt"))[1]

    out = edited("skipped", 4)
    assert "missing: " in out and "was never trained" in out and "audit: FAILED" in out
    out = edited("replayed", -4)
    assert "trained 2 times" in out and "audit: FAILED" in out

    # a worker that skipped a chunk: its second chunk reads the batch one chunk further on
    real, calls = SampleSource.read_chunk, []

    def skipping(self, plan, order, lo, hi):  # noqa: ANN001
        calls.append(1)
        shift = (hi - lo) if len(calls) == 2 else 0
        return real(self, plan, order, lo + shift, hi + shift)

    monkeypatch.setattr(SampleSource, "read_chunk", skipping)
    monkeypatch.setattr(StreamingDataLoader, "_pick_chunk_batches", staticmethod(lambda ds, batch: 1))
    run = tmp_path / "chunk"
    _train({**_tree(corpus, run), "data": {**_tree(corpus, run)["data"], "num_workers": 2}}, stop_after=6)
    monkeypatch.setattr(SampleSource, "read_chunk", real)
    code, out = _cli(capsys, "audit", str(run / "ckpt"))
    assert code == 1 and "trained 2 times" in out and "was never trained" in out, out

    # a resume from an older checkpoint on top of a newer ledger
    run = tmp_path / "older"
    _train(_tree(corpus, run), stop_after=4)
    _train(_tree(corpus, run, resume=str(run / "ckpt" / "step_3")), stop_after=6)  # saves step 6 and 9
    _train(_tree(corpus, run, resume=str(run / "ckpt" / "step_3")), stop_after=3)
    code, out = _cli(capsys, "audit", str(run / "ckpt"))
    assert code == 1 and "abandoned by a resume from an older checkpoint" in out, out


def test_bad_ledgers_are_one_sentence_and_the_rest_is_audited(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = _corpus(tmp_path / "c.txt")
    a, b = tmp_path / "a", tmp_path / "b"
    _train(_tree(corpus, a))
    _train(_tree(corpus, b))
    (ledger_a,), (ledger_b,) = _ledgers(a), _ledgers(b)
    # a truncated segment: named, the rest still audited
    segment = sorted(ledger_a.glob("*.seg"))[1]
    segment.write_bytes(segment.read_bytes()[:-9])
    code, out = _cli(capsys, "audit", str(a / "ckpt"))
    assert code == 1 and f"{segment} is truncated or damaged" in out and "rows read" in out, out
    # a ledger of another run in its place: both runs named
    shutil.rmtree(ledger_b)
    shutil.copytree(ledger_a, ledger_b)
    code, out = _cli(capsys, "audit", str(b / "ckpt"))
    assert code == 2 and f"is the ledger of run {ledger_a.name}, not of run {ledger_b.name}" in out, out
    # a ledger from another version of the format
    header = json.loads((ledger_a / "ledger.json").read_text())
    (ledger_a / "ledger.json").write_text(json.dumps({**header, "version": 0}))
    code, out = _cli(capsys, "audit", str(a / "ckpt"))
    assert code == 2 and "written by ledger version 0" in out, out
    # a checkpoint without a ledger
    c = tmp_path / "c"
    tree = _tree(corpus, c)
    tree["checkpoint"]["ledger"] = False
    _train(tree)
    code, out = _cli(capsys, "audit", str(c / "ckpt"))
    assert code == 2 and "has no run ledger" in out, out


def test_a_fresh_run_over_another_never_mixes_ledgers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = _corpus(tmp_path / "c.txt")
    run = tmp_path / "run"
    _train(_tree(corpus, run), stop_after=2)  # killed before its first checkpoint: a stale ledger
    (stale,) = _ledgers(run)
    _train(_tree(corpus, run), stop_after=4)
    (first,) = _ledgers(run)
    assert first != stale and not stale.exists()
    _train(_tree(corpus, run), overwrite=True)
    (second,) = _ledgers(run)  # the replaced run's ledger went with its checkpoints
    assert second != first
    code, out = _cli(capsys, "audit", str(run / "ckpt"))
    assert code == 0 and "audit: OK" in out, out


def test_a_stream_lm_run_resumed_at_another_batch_audits_clean(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = _corpus(tmp_path / "c.txt", 200)
    run = tmp_path / "run"
    tree = _tree(corpus, run, steps_per_epoch=4)
    tree["data"].pop("cache_dir")
    _train(tree, stop_after=3, task="stream_lm")
    resumed = _tree(corpus, run, batch=2, resume=str(run / "ckpt" / "latest"), steps_per_epoch=4)
    resumed["data"].pop("cache_dir")
    _train(resumed, task="stream_lm")
    code, out = _cli(capsys, "audit", str(run / "ckpt"))
    assert code == 0 and "audit: OK" in out, out
    code, out = _cli(capsys, "why", str(run / "ckpt"), "--step", "2")
    assert code == 0 and re.search(r"c\.txt:\d+ tokens \[\d+, \d+\) id c:\S+ '", out), out  # FILE:LINE, preview


def test_a_ledger_of_another_dataset_names_both(tmp_path: Path) -> None:
    from llm.data.ledger.format import LedgerError
    from llm.training.run_audit import _check_dataset

    corpus = _corpus(tmp_path / "c.txt")
    _train(_tree(corpus, tmp_path / "run"))
    (folder,) = _ledgers(tmp_path / "run")
    ledger = read_ledger(folder)
    trained_on = ledger.sources[0]["fingerprint"]
    _check_dataset(ledger, {"fingerprint": trained_on}, tmp_path / "step_3")  # its own dataset: fine
    with pytest.raises(LedgerError, match=rf"was written for dataset {ledger.sources[0]['name']} "
                                          rf"\({trained_on[:12]}\), but checkpoint .* trained on dataset 0123456789ab"):
        _check_dataset(ledger, {"fingerprint": "0123456789abcdef"}, tmp_path / "step_3")


def test_spikes_reads_metrics_jsonl_when_the_ledger_has_no_loss(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = _corpus(tmp_path / "c.txt")
    run = tmp_path / "run"
    tree = _tree(corpus, run)
    tree["checkpoint"]["ledger_loss"] = False
    _train(tree)
    metrics = run / "ckpt" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    for r in records:
        if r.get("step") == 9 and "loss" in r:
            r["loss"] = 50.0  # a spike planted in the log
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out = _cli(capsys, "spikes", str(run / "ckpt"), "--top", "1")
    assert code == 0 and "(metrics.jsonl;" in out and "step 9: loss 50.0000" in out, out
    assert "loss not recorded" in out and "sample " in out  # its rows, named from the ledger


def test_an_sft_run_with_best_fit_resumed_at_another_batch_audits_clean(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "a.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"Echo {i}", "input": "", "output": f"{i} " * (i % 7 + 1)})
                            + "\n" for i in range(120)))

    def tree(batch: int, resume: str | None) -> dict:
        return {
            "datasets": [{"path": str(data), "type": "alpaca"}], "sequence_len": 512, "micro_batch_size": batch,
            "max_steps": 10, "learning_rate": 1e-3, "output_dir": str(tmp_path / "out"), "streaming": True,
            "sample_packing": True, "model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
            "training": {"warmup_steps": 1, "seed": 1},
            "checkpoint": {"save_interval_steps": 3, "resume_from_checkpoint": resume},
        }

    _train(tree(4, None), stop_after=3, task="sft")
    _train(tree(2, str(tmp_path / "out" / "latest")), task="sft")
    code, out = _cli(capsys, "audit", str(tmp_path / "out"))
    assert code == 0 and "audit: OK" in out, out
    code, out = _cli(capsys, "why", str(tmp_path / "out"), "--step", "5")
    assert code == 0 and re.search(r"a\.jsonl:\d+ tokens .* '\{", out), out  # FILE:LINE, the record's own text
