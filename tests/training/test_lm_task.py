"""The lm task's map-style TextDataset and its seeded, topology-free batch order."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from llm.data.text.readers import InputError
from llm.data.tokenizers import load_tokenizer, train_bpe_tokenizer
from llm.training.tasks.lm import MapStyleData, TextDataset
from tests.resume import check_resume


def _corpus(path: Path, n: int = 120) -> Path:
    path.write_text("\n".join(f"document {i} is about {'xyz'[i % 3]}" for i in range(n)) + "\n")
    return path


def test_blocks_cover_the_token_stream_with_shifted_labels(tmp_path: Path) -> None:
    tok = load_tokenizer("simple")
    ds = TextDataset(_corpus(tmp_path / "c.txt"), tok, max_seq_len=16)
    stream = np.concatenate([np.array(tok.encode(line) + [tok.eos_id]) for line in (tmp_path / "c.txt").read_text().splitlines()])
    assert len(ds) == (len(stream) - 1) // 16
    for i in (0, 1, len(ds) - 1):
        item = ds[i]
        assert item["input_ids"].tolist() == stream[i * 16 : i * 16 + 16].tolist()
        assert item["labels"].tolist() == stream[i * 16 + 1 : i * 16 + 17].tolist()
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_bpe_tokenizer_and_jsonl_input(tmp_path: Path) -> None:
    texts = [f"document {i} is about {'xyz'[i % 3]}" for i in range(200)]
    tok = load_tokenizer(str(train_bpe_tokenizer(texts, 300, tmp_path / "tok")))
    path = tmp_path / "c.jsonl"
    path.write_text("".join(f'{{"body": "{t}"}}\n' for t in texts))
    ds = TextDataset(path, tok, max_seq_len=8, text_column="body")
    assert ds.tokens.max() < tok.vocab_size and (ds.tokens == tok.eos_id).sum() == 200
    assert ds.fingerprint()["tokenizer"] == tok.fingerprint()
    other = TextDataset(path, load_tokenizer("simple"), max_seq_len=8, text_column="body")
    assert other.fingerprint() != ds.fingerprint()


def test_too_little_text_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "tiny.txt"
    path.write_text("hi\n")
    with pytest.raises(InputError, match=r"tiny.txt: holds 3 tokens, fewer than one block of max_seq_len \+ 1 = 17"):
        TextDataset(path, load_tokenizer("simple"), max_seq_len=16)


def run_order(config: dict, state: dict | None, steps: int | None) -> tuple[list, dict]:
    """check_resume's `run`: all ranks of one topology in one process, global batches out."""
    ds = TextDataset(config["path"], load_tokenizer("simple"), max_seq_len=8)
    world, batch = config["world"], config["global_batch"] // config["world"]
    ranks = [MapStyleData(ds, batch, r, world, seed=3) for r in range(world)]
    if state is not None:
        for r in ranks:
            r.load_state_dict(state)
    iters = [r.batches() for r in ranks]
    total = 2 * ranks[0].steps_per_pass  # two epochs
    done = ranks[0].epoch * ranks[0].steps_per_pass + ranks[0].samples_consumed // config["global_batch"]
    n = total - done if steps is None else steps
    out = [np.concatenate([next(it)["input_ids"].numpy() for it in iters]) for _ in range(n)]
    return out, ranks[0].state_dict()


def test_order_resumes_exactly_on_any_world_size(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"  # hex digests: every 8-token block of the stream is distinct
    path.write_text("\n".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(40)) + "\n")
    config = {"path": str(path), "world": 2, "global_batch": 4}
    others = [{**config, "world": 1}, {**config, "world": 4}]
    per_pass = len(TextDataset(path, load_tokenizer("simple"), max_seq_len=8)) // 4
    stops = [0, 5, per_pass, per_pass + 3]  # start, mid-epoch, the epoch end, just after it
    reference = check_resume(run_order, config, stops=stops, resume_configs=others, fresh_process=False)
    # one epoch is a permutation of the blocks; the next epoch is another one
    per_epoch = len(reference) // 2
    assert per_epoch == per_pass
    first = np.concatenate(reference[:per_epoch])
    second = np.concatenate(reference[per_epoch:])
    assert len({r.tobytes() for r in first}) == len(first)
    assert not np.array_equal(first, second)
    assert sorted(r.tobytes() for r in first) == sorted(r.tobytes() for r in second)
