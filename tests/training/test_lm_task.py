"""The lm task: local text prepared once into a cached token dataset, then the shards' order and resume."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from llm.data.inputs.readers import InputError
from llm.data.tokenize.tokenizers import load_tokenizer, train_bpe_tokenizer
from llm.training.core.loading import build_config
from llm.training.tasks.lm import LocalTextData, build_lm_data
from llm.training.text_cache import cache_root, prepare_text
from tests.resume import check_resume


def _corpus(path: Path, n: int = 120) -> Path:
    path.write_text("\n".join(f"document {i} is about {'xyz'[i % 3]}" for i in range(n)) + "\n")
    return path


def _hex_corpus(path: Path, n: int = 40) -> Path:
    # hex digests: every 9-token block of the stream is distinct, so blocks can be told apart
    path.write_text("\n".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)) + "\n")
    return path


def _config(path: Path, **data: object) -> object:
    tree = {
        "data": {"data_source": "local", "dataset_path": str(path), "max_seq_len": 8, **data},
        "training": {"batch_size": 2, "seed": 3},
        "checkpoint": {"checkpoint_dir": None},
    }
    return build_config(tree)


def test_blocks_are_the_token_stream_with_shifted_labels(tmp_path: Path) -> None:
    tok = load_tokenizer("simple")
    corpus = _corpus(tmp_path / "c.txt")
    data = LocalTextData(_config(corpus, max_seq_len=16), 0, 1)
    lines = corpus.read_text().splitlines()
    stream = np.concatenate([np.array(tok.encode(line) + [tok.eos_id]) for line in lines])
    ds = data.dataset
    assert len(ds) == len(stream) // 17  # blocks of max_seq_len + 1, the short tail dropped
    for i in (0, 1, len(ds) - 1):
        assert ds[i].tolist() == stream[i * 17 : i * 17 + 17].tolist()
    batch = next(data.batches())
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 16)
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])


def test_prepared_once_then_reused_and_keyed_by_inputs_tokenizer_and_column(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.txt")
    logs: list[str] = []
    root = tmp_path / "cache"
    first = prepare_text(str(corpus), "simple", "text", root, log=logs.append)
    again = prepare_text(str(corpus), "simple", "text", root, log=logs.append)
    assert first == again and len(logs) == 1 and "prepared 1 file(s) once" in logs[0]
    assert [p.name for p in root.iterdir()] == [first.path.name]  # no temporary folder left
    # the block length is applied when reading: another max_seq_len reuses the entry
    assert LocalTextData(_config(corpus, max_seq_len=4, cache_dir=str(root)), 0, 1).prepared == first
    # a changed mtime, column or tokenizer is another entry; the same text keeps its content digest
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 10**9))
    touched = prepare_text(str(corpus), "simple", "text", root, log=logs.append)
    assert touched.path != first.path and touched.content_xxh3_128 == first.content_xxh3_128
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"text": "a", "body": "b"}\n')
    assert prepare_text(str(jsonl), "simple", "body", root).path != prepare_text(str(jsonl), "simple", "text", root).path
    tok = train_bpe_tokenizer(corpus.read_text().splitlines(), 300, tmp_path / "tok")
    assert prepare_text(str(corpus), str(tok), "text", root).path != touched.path
    corpus.write_text("other text\n")
    assert prepare_text(str(corpus), "simple", "text", root).content_xxh3_128 != first.content_xxh3_128


def test_cache_location(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.txt")
    assert cache_root(_config(corpus)) == tmp_path / "xdg-cache" / "llm" / "data"  # no checkpoint_dir
    cfg = build_config({"data": {"dataset_path": str(corpus)}, "checkpoint": {"checkpoint_dir": str(tmp_path / "ck")}})
    assert cache_root(cfg) == tmp_path / "ck" / ".data"
    assert cache_root(_config(corpus, cache_dir=str(tmp_path / "mine"))) == tmp_path / "mine"


def test_bpe_tokenizer_and_jsonl_input(tmp_path: Path) -> None:
    texts = [f"document {i} is about {'xyz'[i % 3]}" for i in range(200)]
    tok_path = train_bpe_tokenizer(texts, 300, tmp_path / "tok")
    tok = load_tokenizer(str(tok_path))
    path = tmp_path / "c.jsonl"
    path.write_text("".join(f'{{"body": "{t}"}}\n' for t in texts))
    data = LocalTextData(_config(path, text_column="body", tokenizer_type="hf", tokenizer_path=str(tok_path)), 0, 1)
    tokens = torch.cat([data.dataset[i] for i in range(len(data.dataset))])
    assert int(tokens.max()) < tok.vocab_size and data.dataset.manifest.total_documents == 200
    assert data.fingerprint()["tokenizer"] == tok.fingerprint()
    other = LocalTextData(_config(path, text_column="body"), 0, 1)
    assert other.fingerprint() != data.fingerprint()
    assert other.fingerprint()["content_xxh3_128"] == data.fingerprint()["content_xxh3_128"]


def test_too_little_text_and_wrong_source_are_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "tiny.txt"
    path.write_text("hi\n")
    with pytest.raises(ValueError, match=r"^data.dataset_path .*tiny.txt holds 0 blocks of 17 tokens, fewer than one global batch of 2; lower training.batch_size"):
        LocalTextData(_config(path, max_seq_len=16), 0, 1)
    with pytest.raises(InputError, match=r"nope.txt: no such input file"):
        LocalTextData(_config(tmp_path / "nope.txt"), 0, 1)
    cfg = build_config({"data": {"data_source": "hf", "dataset_name": "x"}})
    with pytest.raises(ValueError, match=r"--task lm reads local files .* not data_source 'hf'"):
        build_lm_data(cfg, 0, 1)


def _next_as(rank: int, world: int, it: object) -> dict:
    """Next batch of one simulated rank: the loader reads RANK/WORLD_SIZE when a pass starts."""
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    try:
        return next(it)  # type: ignore[call-overload]
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]


def run_order(config: dict, state: dict | None, steps: int | None) -> tuple[list, dict]:
    """check_resume's `run`: all ranks of one topology in one process, global batches out."""
    world, batch = config["world"], config["global_batch"] // config["world"]
    cfg = build_config({
        "data": {"dataset_path": config["path"], "max_seq_len": 8},
        "training": {"batch_size": batch, "seed": 3},
        "checkpoint": {"checkpoint_dir": None},
    })
    ranks = [LocalTextData(cfg, r, world) for r in range(world)]
    for r in ranks:
        if config.get("ledger"):  # as llm-train does: one run id on every rank, attached before the state
            r.attach_ledger(config["ledger"], "lm-order")
        if state is not None:
            r.load_state_dict(state)
    iters = [r.batches() for r in ranks]
    per_pass = ranks[0].steps_per_pass
    done = ranks[0].state_dict()
    n = 2 * per_pass - (done["epoch"] * per_pass + done["samples_consumed"] // config["global_batch"])
    n = n if steps is None else steps
    out = [np.concatenate([_next_as(r, world, it)["input_ids"].numpy() for r, it in enumerate(iters)]) for _ in range(n)]
    return out, [r.state_dict() for r in ranks][0]  # every rank commits its ledger


def test_order_resumes_exactly_on_any_world_size(tmp_path: Path) -> None:
    path = _hex_corpus(tmp_path / "c.txt")
    config = {"path": str(path), "world": 2, "global_batch": 4}
    others = [{**config, "world": 1}, {**config, "world": 4}]
    per_pass = LocalTextData(_config(path), 0, 1).steps_per_pass // 2  # batch 2 there, 4 here
    stops = [0, 5, per_pass, per_pass + 3]  # start, mid-epoch, the epoch end, just after it
    reference = check_resume(run_order, config, stops=stops, resume_configs=others, fresh_process=False)
    # one epoch is a permutation of (all but the dropped tail of) the blocks; the next is another one
    assert len(reference) == 2 * per_pass
    first = np.concatenate(reference[:per_pass])
    second = np.concatenate(reference[per_pass:])
    assert len({r.tobytes() for r in first}) == len(first) == len({r.tobytes() for r in second})
    assert not np.array_equal(first, second)


def test_resume_state_names_the_text_not_the_cache_entry(tmp_path: Path) -> None:
    path = _hex_corpus(tmp_path / "c.txt")
    a = LocalTextData(_config(path, cache_dir=str(tmp_path / "a")), 0, 1)
    it = a.batches()
    taken = [next(it) for _ in range(3)]
    state = a.checkpoint_state()
    # another cache folder: another preparation, other shard names, the same text
    b = LocalTextData(_config(path, cache_dir=str(tmp_path / "b")), 0, 1)
    # (format v2 fingerprints the shards' content, not their run-specific names: those agree too)
    names = [{s.file for s in d.dataset.manifest.shards} for d in (a, b)]
    assert names[0] != names[1] and b.fingerprint() == a.fingerprint()
    b.load_state_dict(state)
    assert torch.equal(next(b.batches())["input_ids"], next(it)["input_ids"])
    assert len(taken) == 3
    path.write_text(path.read_text() + "one more line\n")
    changed = LocalTextData(_config(path, cache_dir=str(tmp_path / "a")), 0, 1)
    with pytest.raises(ValueError, match=r"the data state was saved for other text .*; resume with the data config it was trained on"):
        changed.load_state_dict(state)
