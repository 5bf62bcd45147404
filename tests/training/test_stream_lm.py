"""The stream_lm task on text streams: exact resume (also with workers and dropout), fingerprints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llm.training.checkpoint import load_checkpoint
from llm.training.core.loading import build_config
from llm.training.trainer import Trainer
from tests.resume import check_resume
from tests.training.test_trainer import (
    REPO,
    kill9_then_resume_matches_uninterrupted,
    run_trainer,
    tiny_tree,
    write_corpus,
)


def test_resume_is_exact_with_dropout_across_epochs(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 300)
    tree = tiny_tree(
        corpus,
        data={"steps_per_epoch": 5},
        model={"dropout": 0.1},  # the RNG state must travel with the checkpoint too
        training={"epochs": 2},
    )
    reference = check_resume(run_trainer, {"tree": tree, "task": "stream_lm"}, stops=[3, 5, 8], fresh_process=False)
    assert len(reference) == 10


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
def test_kill_9_between_checkpoints_with_two_workers(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 300)
    tree = tiny_tree(
        corpus,
        data={"steps_per_epoch": 4, "num_workers": 2},
        training={"epochs": 2},
        checkpoint={"save_interval_steps": 2},
    )
    kill9_then_resume_matches_uninterrupted(tmp_path, "stream_lm", tree)
    ckpt = load_checkpoint(tmp_path / "run" / "latest")
    assert ckpt["stream_data"]["line_index"]["0"] > 0 and "token_buffer" in ckpt["stream_data"]
    assert ckpt["stream_source"]["type"] == "local"


def test_stream_fingerprint_mismatch_names_both(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "demo.txt", 300)
    ck = tmp_path / "ck"
    tree = tiny_tree(corpus, data={"steps_per_epoch": 2}, checkpoint={"checkpoint_dir": str(ck)})
    Trainer(build_config(tree), "stream_lm", log=lambda _: None).fit()
    resume = {**tree, "checkpoint": {"checkpoint_dir": str(ck), "resume_from_checkpoint": str(ck / "latest")}}
    other = tmp_path / "other.txt"
    write_corpus(other, 300)
    resume["data"] = {**tree["data"], "dataset_path": str(other)}
    with pytest.raises(ValueError, match=r"stream source fingerprint mismatch: checkpoint .*step_2 was written for other data: dataset_path: '.*demo.txt' -> '.*other.txt'.*files: \['demo.txt'\] -> \['other.txt'\]") as info:
        Trainer(build_config(resume), "stream_lm", log=lambda _: None)
    assert "max_seq_len" not in str(info.value) and "tokenizer" not in str(info.value)


@pytest.mark.slow  # end to end, tens of seconds on 2 cores: `make test-all` / CI
def test_c4_shaped_config_dedup_hf_on_local_files_resumes_exactly(tmp_path: Path, monkeypatch) -> None:
    """configs/streaming_c4.yaml's pipeline (dedup_hf, persisted seen-set) on local JSON shards."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # nothing may come from the hub
    for shard in range(2):
        rows = [f"shard {shard} record {i} {'xyz'[i % 3] * (i % 5)}" for i in range(150)]
        rows += [f"a duplicate shared by every shard {i}" for i in range(0, 150, 10)]
        (tmp_path / f"part-{shard}.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in rows))
    tree = yaml.safe_load((REPO / "configs" / "streaming_c4.yaml").read_text())
    assert tree["data"]["data_source"] == "dedup_hf" and tree["data"]["write_seen_hashes"]
    tree["data"].update(
        dataset_name="json", dataset_config=None, dataset_path=str(tmp_path / "part-*.jsonl"),
        max_seq_len=32, steps_per_epoch=4, num_workers=0,
    )
    tree["model"] = {"d_model": 32, "n_layers": 2, "n_heads": 2}
    tree["training"].update(batch_size=4, epochs=2, warmup_steps=2, deterministic=True)
    tree["checkpoint"].update(save_interval_steps=2)
    kill9_then_resume_matches_uninterrupted(tmp_path, "stream_lm", tree)
    ckpt = load_checkpoint(tmp_path / "run" / "latest")
    source = ckpt["stream_source"]
    assert source["type"] == "dedup" and source["inner"]["type"] == "hf" and source["hash_algo"] == "xxh3_128"
    assert ckpt["stream_data"]["seen_hashes"]["count"] > 0


def test_model_vocabulary_comes_from_a_trained_bpe_tokenizer(tmp_path: Path) -> None:
    from llm.data.tokenize.tokenizers import train_bpe_tokenizer

    corpus = write_corpus(tmp_path / "demo.txt", 300)
    tok = train_bpe_tokenizer(corpus.read_text().splitlines(), 320, tmp_path / "tok")
    tree = tiny_tree(corpus, data={"steps_per_epoch": 3, "tokenizer_type": "hf", "tokenizer_path": str(tok)})
    trainer = Trainer(build_config(tree), "stream_lm", log=lambda _: None)
    assert trainer.raw_model.vocab_size == trainer.tokenizer.vocab_size <= 320
    assert trainer.raw_model.tok_emb.weight.shape[0] == trainer.tokenizer.vocab_size
    result = trainer.fit()
    assert result.steps == 3 and all(loss < 7.0 for loss in result.losses)
    assert trainer.data.fingerprint()["tokenizer"]["type"] == "hf"
