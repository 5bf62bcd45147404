"""StreamingTextDataModule: blocks, exact resume (0 and 2 workers), other topologies, odd inputs."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import zstandard

from llm.data.pack.window import IGNORE_INDEX
from llm.data.sources import SOURCE_REGISTRY, LocalLineTextSource, TextSource
from llm.data.text.stream import FINGERPRINT_MISMATCH, StreamingTextDataModule, merge_stream_states
from llm.data.tokenize.tokenizers import SimpleTokenizer
from llm.training.core.config import DataConfig
from tests.resume import assert_same_steps, attach, check_resume, loaded, step_ranks, take_steps

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    # mostly short records, some spanning several blocks, each unique (an id in front)
    return [f"{i} " + " ".join(rng.choices(WORDS, k=rng.choice([1, 3, 8, 40]))) for i in range(n)]


def write_corpus(folder: Path, kind: str, n: int = 600) -> Path:
    docs = _docs(n)
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "txt":
        path = folder / "corpus.txt"
        lines = []
        for i, d in enumerate(docs):
            lines.append(d.encode())
            if i % 50 == 7:
                lines.append(b"   ")  # blank records are skipped
        path.write_bytes(b"\n".join(lines) + b"\n")
    elif kind == "jsonl.zst":
        path = folder / "corpus.jsonl.zst"
        raw = "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()
        path.write_bytes(zstandard.ZstdCompressor().compress(raw))
    elif kind == "parquet":
        path = folder / "corpus.parquet"
        pq.write_table(pa.table({"text": docs}), path, row_group_size=97)
    elif kind == "hf":  # four json files -> four HF shards
        for k in range(4):
            with open(folder / f"part{k}.jsonl", "w") as f:
                for d in docs[k::4]:
                    f.write(json.dumps({"text": d}) + "\n")
        path = folder
    else:
        raise ValueError(kind)
    return path


def make_module(config: dict, rank: int | None = None, world: int | None = None) -> StreamingTextDataModule:
    if config["kind"] == "hf":
        # dataset_path with an HF source is its data_files: local json files, nothing downloads
        data = DataConfig(data_source="hf", dataset_name="json", dataset_path=f"{config['path']}/part*.jsonl",
                          max_seq_len=config["L"], num_workers=config["workers"])
        return StreamingTextDataModule(data, config["batch"], rank=rank, world_size=world, loop=False)
    data = DataConfig(dataset_path=config["path"], max_seq_len=config["L"], num_workers=config["workers"])
    return StreamingTextDataModule(data, config["batch"], rank=rank, world_size=world, loop=False)


def _fork_workers() -> None:
    # A process made by the spawn start method (the resume helper's fresh processes, mp.spawn)
    # inherits "spawn" for its DataLoader workers too; torchrun / plain python use "fork" on Linux.
    multiprocessing.set_start_method("fork", force=True)


def run_stream(config: dict, state: dict | None, steps: int | None):
    """`tests/resume.py` protocol: global steps = the batches of every rank at that step, stacked."""
    world = config.get("world", 1)
    modules = loaded([make_module(config, r, world) for r in range(world)], state, config.get("ledger"))
    return step_ranks(modules, steps), merge_stream_states([m.state_dict() for m in modules])


def rows(step: dict) -> list[bytes]:
    return [a.tobytes() + b.tobytes() for a, b in zip(step["input_ids"], step["labels"])]


def expected_rows(path: Path, L: int, partition_bytes: int, eos: int = 256) -> list[bytes]:
    """The blocks of a .txt file computed from first principles (simple tokenizer, one consumer)."""
    data = path.read_bytes()
    parts: dict[int, list[int]] = {}
    pos = 0
    for line in data.split(b"\n")[:-1]:
        text = line.decode("utf-8", errors="replace").strip()
        if text:
            parts.setdefault(pos // partition_bytes, []).extend([*text.encode(), eos])
        pos += len(line) + 1
    out = []
    for k in sorted(parts):
        toks = parts[k]
        n_full = (len(toks) - 1) // L
        windows = [toks[i * L : i * L + L + 1] for i in range(n_full)]
        if len(toks) - n_full * L >= 2:
            windows.append(toks[n_full * L :])
        for w in windows:
            ids = np.full(L, eos, dtype=np.int64)
            labels = np.full(L, IGNORE_INDEX, dtype=np.int64)
            ids[: len(w) - 1], labels[: len(w) - 1] = w[:-1], w[1:]
            out.append(ids.tobytes() + labels.tobytes())
    return out


def test_blocks_match_first_principles(tmp_path):
    path = write_corpus(tmp_path, "txt")
    config = {"kind": "txt", "path": str(path), "L": 24, "batch": 3, "workers": 0}
    steps, state = run_stream(config, None, None)
    got = [r for s in steps for r in rows(s)]
    module = make_module(config)
    assert len(module.partitions()) > 8  # the file really is split into byte ranges
    assert got == expected_rows(path, 24, module.source.partition_bytes)
    assert all(c["done"] for c in state["partitions"].values())
    assert state["line_index"] == {"0": 600}  # the guide's view: records read per rank


@pytest.mark.slow  # fresh processes; in process with the same 2 workers: test_exact_resume_txt[2]
def test_exact_resume_txt_two_workers_fresh_process(tmp_path):
    path = write_corpus(tmp_path, "txt")
    config = {"kind": "txt", "path": str(path), "L": 32, "batch": 4, "workers": 2}
    ref = check_resume(run_stream, config, stops=[37])
    assert len(ref) > 150


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_txt(tmp_path, workers):
    path = write_corpus(tmp_path, "txt")
    config = {"kind": "txt", "path": str(path), "L": 32, "batch": 4, "workers": workers}
    ref = check_resume(run_stream, config, stops=[0, 1, 150], fresh_process=False)
    # independent of the code under test: the blocks are those computed from first principles
    # (with workers in another order: each worker serves its own partitions)
    want = expected_rows(path, 32, make_module(config).source.partition_bytes)
    got = [r for s in ref for r in rows(s)]
    assert (got if workers == 0 else sorted(got)) == (want if workers == 0 else sorted(want))
    # at the very end too: nothing is left, nothing is repeated
    _, state = run_stream(config, None, len(ref))
    assert run_stream(config, state, None)[0] == []


@pytest.mark.parametrize(
    "kind, workers",
    # With 2 workers in CI only: each reader is the 0-worker case, worker resume is test_exact_resume_txt[2], and
    # these kinds with workers are test_other_topologies_hf_and_parquet and test_one_compressed_file_feeds_several_ranks.
    [(kind, workers) if workers == 0 else pytest.param(kind, workers, marks=pytest.mark.slow)
     for kind in ("jsonl.zst", "parquet", "hf") for workers in (0, 2)],
)
def test_exact_resume_other_sources(tmp_path, kind, workers):
    path = write_corpus(tmp_path, kind, n=300)
    config = {"kind": kind, "path": str(path), "L": 16, "batch": 4, "workers": workers}
    ref = check_resume(run_stream, config, stops=[5, 61], fresh_process=False)
    # the whole corpus came through: every document's EOS is a label exactly once
    assert sum(int((s["labels"] == 256).sum()) for s in ref) == 300
    # and every token of it is a label once, but the first token of each stripe (no token before it)
    corpus = Counter(t for d in _docs(300) for t in [*d.encode(), 256])
    labels = Counter(int(t) for s in ref for t in s["labels"].ravel() if t >= 0)
    stripes = len(make_module(config).partitions())
    assert not labels - corpus and sum(corpus.values()) - sum(labels.values()) == stripes


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine
def test_other_topologies_lose_and_repeat_nothing(tmp_path):
    path = write_corpus(tmp_path, "txt")
    config = {"kind": "txt", "path": str(path), "L": 32, "batch": 4, "workers": 2, "world": 1}
    others = [
        {**config, "workers": 0},
        {**config, "workers": 3},
        {**config, "workers": 1, "world": 2},
        {**config, "workers": 2, "world": 3},
    ]
    check_resume(run_stream, config, stops=[11, 90], resume_configs=others, exact=False,
                 split_records=rows, fresh_process=False)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_one_compressed_file_feeds_several_ranks(tmp_path):
    path = write_corpus(tmp_path, "jsonl.zst", n=300)  # one partition, cut into stripes
    config = {"kind": "jsonl.zst", "path": str(path), "L": 16, "batch": 4, "workers": 0, "world": 1}
    others = [{**config, "world": 2}, {**config, "world": 3, "workers": 2}]
    check_resume(run_stream, config, stops=[9, 40], resume_configs=others, exact=False,
                 split_records=rows, fresh_process=False)
    single = run_stream(config, None, None)[0]
    two = [make_module(config, r, 2) for r in range(2)]
    halves = [[r for b in m.train_dataloader() for r in rows({k: v.numpy() for k, v in b.items()})] for m in two]
    assert halves[0] and halves[1]
    assert sorted(halves[0] + halves[1]) == sorted(r for s in single for r in rows(s))


@pytest.mark.parametrize("kind", ["hf", "parquet"])
def test_other_topologies_hf_and_parquet(tmp_path, kind):
    path = write_corpus(tmp_path, kind, n=300)
    config = {"kind": kind, "path": str(path), "L": 16, "batch": 4, "workers": 2, "world": 1}
    others = [{**config, "workers": 0, "world": 2}, {**config, "workers": 1, "world": 3}]
    check_resume(run_stream, config, stops=[17], resume_configs=others, exact=False,
                 split_records=rows, fresh_process=False)


def test_two_ranks_read_disjoint_partitions(tmp_path):
    path = write_corpus(tmp_path, "txt")
    config = {"kind": "txt", "path": str(path), "L": 32, "batch": 4, "workers": 2}
    per_rank = []
    for rank in range(2):
        m = make_module(config, rank, 2)
        per_rank.append([r for b in m.train_dataloader() for r in rows({k: v.numpy() for k, v in b.items()})])
        assert set(m.state_dict()["line_index"]) == {str(rank)}
    whole = [r for s in run_stream({**config, "workers": 0}, None, None)[0] for r in rows(s)]
    assert per_rank[0] and per_rank[1]
    assert sorted(per_rank[0] + per_rank[1]) == sorted(whole)


def test_resume_seeks_instead_of_rereading(tmp_path):
    """After the state is saved, garbage in the already-read lines must not be read again."""
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in _docs(400)))
    config = {"kind": "txt", "path": str(path), "L": 16, "batch": 2, "workers": 0}
    ref, _ = run_stream(config, None, None)
    head, state = run_stream(config, None, 300)
    offsets = [c["offset"] for c in state["partitions"].values() if not c["done"] and c["offset"]]
    assert offsets
    raw = bytearray(path.read_bytes())
    for key, c in state["partitions"].items():  # corrupt every line the cursors have passed
        start = int(key.split("[")[1].split(":")[0])
        lo = 0 if start == 0 else raw.find(b"\n", start - 1) + 1  # the partition's first line
        if c["offset"] > lo:
            raw[lo : c["offset"] - 1] = b"#" * (c["offset"] - 1 - lo)
    stat = path.stat()
    path.write_bytes(bytes(raw))  # same size, yet another file: a resume is refused, naming it
    with pytest.raises(ValueError, match=r"fingerprint mismatch: .*stamps.big.jsonl: "):
        run_stream(config, state, None)
    # a change the stamp cannot see (same size and mtime, the state's stamp forged): the resume
    # must still never read the lines before its cursors
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    state["fingerprint"] = make_module(config).source_fingerprint()
    tail, _ = run_stream(config, state, None)
    assert_same_steps(head + tail, ref, "resume after the read lines were overwritten")


def test_fingerprint_mismatch(tmp_path):
    path = write_corpus(tmp_path, "txt")
    config = {"kind": "txt", "path": str(path), "L": 32, "batch": 4, "workers": 0}
    _, state = run_stream(config, None, 3)
    other = make_module({**config, "L": 48})
    with pytest.raises(ValueError, match=FINGERPRINT_MISMATCH) as info:
        other.load_state_dict(state)
    # only the keys that differ, saved -> current
    assert str(info.value).startswith(f"{FINGERPRINT_MISMATCH}: max_seq_len: 32 -> 48 (saved -> current)")


def test_steps_per_epoch_and_passes(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("\n".join(f"sample line {i}" for i in range(20)) + "\n")
    data = DataConfig(dataset_path=str(path), max_seq_len=16, steps_per_epoch=7)
    module = StreamingTextDataModule(data, batch_size=4)
    loader = module.train_dataloader()
    assert len(loader) == 7
    epochs = [[b["input_ids"].clone() for b in loader] for _ in range(3)]
    assert [len(e) for e in epochs] == [7, 7, 7]  # the stream is looped to fill every epoch
    for b in epochs[0]:
        assert b.dtype == torch.int64 and b.shape[1] == 16
    with pytest.raises(ValueError, match="steps_per_epoch is required"):
        StreamingTextDataModule(DataConfig(dataset_path=str(path)), batch_size=4)


def test_rank_without_partitions_is_a_clear_error(tmp_path):
    path = write_corpus(tmp_path, "jsonl.zst", n=20)  # one compressed file: 8 stripes
    module = make_module({"kind": "jsonl.zst", "path": str(path), "L": 16, "batch": 2, "workers": 0}, 8, 9)
    with pytest.raises(ValueError, match="rank 8 of 9 owns none of the 8 partitions"):
        next(iter(module.train_dataloader()))


def test_invalid_utf8_nul_bytes_and_a_50mb_line(tmp_path):
    path = tmp_path / "odd.txt"
    big = b"y" * (50 * 1024 * 1024)
    path.write_bytes(b"ok \xff\xfe bad\nnul\x00inside\n" + big + b"\nlast\n")
    data = DataConfig(dataset_path=str(path), max_seq_len=4096)  # loop=False: one pass, no epoch size
    module = StreamingTextDataModule(data, batch_size=256, loop=False)
    n_labels, first = 0, None
    for batch in module.train_dataloader():
        first = batch["input_ids"][0] if first is None else first
        n_labels += int((batch["labels"] != IGNORE_INDEX).sum())
    expected = len("ok \ufffd\ufffd bad".encode()) + len("nul\x00inside") + len(big) + len("last") + 4
    # every token is a label exactly once, except the first token of each of the two byte-range
    # partitions that hold a line start (the 50 MB line spans all the others)
    assert n_labels == expected - 2
    assert module.tokenizer.decode(first[:18].tolist()).startswith("ok \ufffd\ufffd bad")


class ListSource(TextSource):
    """The guide's custom source shape: only iter_texts and source_fingerprint."""

    def __init__(self, bucket: str, key: str):
        self.bucket, self.key = bucket, key
        self.lines = [f"{bucket}/{key} record {i}" for i in range(120)]

    def iter_texts(self, skip: int = 0):
        yield from self.lines[skip:]

    def source_fingerprint(self) -> dict:
        return {"type": "list", "bucket": self.bucket, "key": self.key}


def run_custom(config: dict, state: dict | None, steps: int | None):
    import yaml

    SOURCE_REGISTRY.register("s3", lambda cfg: ListSource(cfg.dataset_bucket, cfg.dataset_key))
    data = DataConfig(**yaml.safe_load(config["yaml"]))
    module = attach(StreamingTextDataModule(data, 2, loop=False), config)
    if state is not None:
        module.load_state_dict(state)
    return take_steps(module.train_dataloader(), steps), module.state_dict()


def test_custom_source_on_two_ranks():
    SOURCE_REGISTRY.register("s3", lambda cfg: ListSource(cfg.dataset_bucket, cfg.dataset_key))
    data = DataConfig(data_source="s3", dataset_bucket="b", dataset_key="k", max_seq_len=16)
    eos = [sum(int((b["labels"] == 256).sum()) for b in StreamingTextDataModule(
        data, 2, rank=r, world_size=2, loop=False).train_dataloader()) for r in range(2)]
    assert eos[0] > 0 and eos[1] > 0 and sum(eos) == 120  # each record on exactly one rank


def test_custom_registered_source_end_to_end():
    text = "data_source: s3\ndataset_bucket: corpus\ndataset_key: a.txt\nmax_seq_len: 16\nsteps_per_epoch: 1000\n"
    ref = check_resume(run_custom, {"yaml": text}, stops=[0, 9, 30], fresh_process=False)
    assert sum(int((s["labels"] == 256).sum()) for s in ref) == 120  # every record, once
    decoded = bytes(t for s in ref for row in s["labels"] for t in row.tolist() if 0 <= t < 256).decode()
    assert "corpus/a.txt record 1" in decoded
    _, state = run_custom({"yaml": text}, None, 3)
    assert state["fingerprint"]["type"] == "list" and state["fingerprint"]["bucket"] == "corpus"


def _gloo_rank(rank: int, world: int, init_file: str, path: str, out_dir: str) -> None:
    import pickle

    import torch.distributed as dist

    _fork_workers()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        config = {"kind": "txt", "path": path, "L": 32, "batch": 4, "workers": 2}
        # ranks come from torch.distributed here (no explicit rank/world_size)
        whole = [r for b in make_module(config).train_dataloader() for r in rows({k: v.numpy() for k, v in b.items()})]
        first = make_module(config)
        it = iter(first.train_dataloader())
        head = [r for _ in range(20) for r in rows({k: v.numpy() for k, v in next(it).items()})]
        state = first.checkpoint_state()  # a collective: every rank gets every rank's cursors
        second = make_module(config)
        second.load_state_dict(pickle.loads(pickle.dumps(state)))
        tail = [r for b in second.train_dataloader() for r in rows({k: v.numpy() for k, v in b.items()})]
        with open(f"{out_dir}/rank{rank}.pkl", "wb") as f:
            pickle.dump({"whole": whole, "head": head, "tail": tail, "state": state}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes (~20 s); other world sizes: test_other_topologies_lose_and_repeat_nothing
def test_two_gloo_processes(tmp_path):
    import pickle

    import torch.multiprocessing as mp

    path = write_corpus(tmp_path / "data", "txt", n=250)
    mp.spawn(_gloo_rank, args=(2, str(tmp_path / "init"), str(path), str(tmp_path)), nprocs=2)
    results = [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(2)]
    for r in results:
        assert r["head"] + r["tail"] == r["whole"]  # each rank continues token for token
        assert set(r["state"]["line_index"]) == {"0", "1"}
    assert results[0]["state"]["partitions"] == results[1]["state"]["partitions"]
    single = run_stream({"kind": "txt", "path": str(path), "L": 32, "batch": 4, "workers": 0}, None, None)[0]
    assert sorted(results[0]["whole"] + results[1]["whole"]) == sorted(r for s in single for r in rows(s))


def run_bpe(config: dict, state: dict | None, steps: int | None):
    data = DataConfig(data_source="dedup_local", dataset_path=config["path"], max_seq_len=16, num_workers=2,
                      tokenizer_type="hf", tokenizer_path=config["tokenizer"], hash_algo="xxh3_128")
    module = attach(StreamingTextDataModule(data, batch_size=3, loop=False), config)
    if state is not None:
        module.load_state_dict(state)
    return take_steps(module.train_dataloader(), steps), module.state_dict()


@pytest.mark.filterwarnings("ignore:DedupTextSource is running with in-memory only state")
def test_trained_bpe_tokenizer_with_workers(tmp_path):
    from llm.data.tokenize.tokenizers import train_bpe_tokenizer

    path = write_corpus(tmp_path, "txt", n=300)
    (tmp_path / "tok").mkdir()
    tok = train_bpe_tokenizer(_docs(300), 300, tmp_path / "tok" / "tokenizer.json")
    config = {"path": str(path), "tokenizer": str(tok)}
    ref = check_resume(run_bpe, config, stops=[7, 30], fresh_process=False)
    module = StreamingTextDataModule(
        DataConfig(dataset_path=str(path), tokenizer_type="hf", tokenizer_path=str(tok), max_seq_len=16),
        batch_size=3, loop=False,
    )
    eos = module.tokenizer.eos_id
    assert eos >= 0 and any((s["input_ids"] == eos).any() for s in ref)  # EOS between documents
    assert max(int(s["input_ids"].max()) for s in ref) < module.tokenizer.vocab_size
    # another tokenizer is another stream
    _, state = run_bpe(config, None, 2)
    with pytest.raises(ValueError, match=FINGERPRINT_MISMATCH):
        module.load_state_dict(state)


def test_ranks_from_environment(tmp_path, monkeypatch):
    path = write_corpus(tmp_path, "txt", n=200)
    config = {"kind": "txt", "path": str(path), "L": 32, "batch": 4, "workers": 0}
    module = make_module(config)  # built before the variables are set: read at iteration time
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = [r for b in module.train_dataloader() for r in rows({k: v.numpy() for k, v in b.items()})]
    explicit = make_module(config, 1, 2)
    assert got == [r for b in explicit.train_dataloader() for r in rows({k: v.numpy() for k, v in b.items()})]
    assert set(module.state_dict()["line_index"]) == {"1"}


@pytest.mark.parametrize("workers", [0, 2])
def test_bad_record_is_one_sentence_from_workers_too(tmp_path, workers):
    from llm.data.inputs.readers import InputError

    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"body": "no text key"}\n')
    module = make_module({"kind": "txt", "path": str(path), "L": 8, "batch": 2, "workers": workers})
    with pytest.raises(InputError) as info:
        list(module.train_dataloader())
    assert "bad.jsonl:2: missing text column 'text' (keys: body)" in str(info.value)
    assert "Traceback" not in str(info.value)


def test_val_dataloader(tmp_path):
    (tmp_path / "val.txt").write_text("held out one\nheld out two\n")
    data = DataConfig(dataset_path=str(write_corpus(tmp_path / "train", "txt", n=50)), max_seq_len=8,
                      steps_per_epoch=2, val_dataset_path=str(tmp_path / "val.txt"))
    module = StreamingTextDataModule(data, batch_size=2)
    val = module.val_dataloader()
    first, again = list(val), list(val)
    assert len(first) == len(again) == 2, "26 tokens: 3 full windows of 9 overlapping by one, 1 short"
    assert all(torch.equal(a[k], b[k]) for a, b in zip(first, again) for k in a), "each pass is the same"
    assert all(set(b) == {"input_ids", "labels"} and b["input_ids"].shape == b["labels"].shape == (2, 8)
               for b in first)
    eos = SimpleTokenizer.eos_id
    stream = [*b"held out one", eos, *b"held out two", eos]  # the validation file, not the training corpus
    inputs, labels = (torch.cat([b[k] for b in first]) for k in ("input_ids", "labels"))
    real = labels != IGNORE_INDEX
    assert labels[real].tolist() == stream[1:] and inputs[0, 0].item() == stream[0]
    assert torch.equal(inputs[:, 1:][real[:, :-1]], labels[:, :-1][real[:, :-1]]), "labels are inputs shifted by one"
    assert StreamingTextDataModule(data.model_copy(update={"val_dataset_path": None}), 4).val_dataloader() is None


def run_epochs(config: dict, state: dict | None, steps: int | None):
    """Epochs of `steps_per_epoch` batches over a tiny file: the stream wraps into new passes."""
    _fork_workers()
    data = DataConfig(dataset_path=config["path"], max_seq_len=16, steps_per_epoch=7, num_workers=config["workers"])
    module = attach(StreamingTextDataModule(data, batch_size=3), config)
    done = 0
    if state is not None:
        module.load_state_dict(state)
        done = state["test_steps_done"]  # the stream is endless: the run ends at global step 30
    total = 30 - done if steps is None else steps
    out: list[dict] = []
    while len(out) < total:
        for batch in module.train_dataloader():
            out.append({k: v.numpy() for k, v in batch.items()})
            if len(out) == total:
                break
    return out, {**module.state_dict(), "test_steps_done": done + len(out)}


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_across_epochs_and_passes(tmp_path, workers):
    path = tmp_path / "tiny.txt"
    path.write_text("\n".join(f"sample line {i}" for i in range(60)) + "\n")
    config = {"path": str(path), "workers": workers}
    ref = check_resume(run_epochs, config, stops=[7, 12, 23], fresh_process=False)
    # a second pass replays the same records: the first pass is the file's blocks from first
    # principles, and what follows it is those blocks again (in order without workers)
    one_pass = expected_rows(path, 16, LocalLineTextSource(path).partition_bytes)
    got = [r for s in ref for r in rows(s)]
    assert len(one_pass) < len(got) < 2 * len(one_pass)
    first, second = got[: len(one_pass)], got[len(one_pass) :]
    if workers == 0:
        assert first == one_pass and second == one_pass[: len(second)]
    else:
        assert sorted(first) == sorted(one_pass) and not Counter(second) - Counter(one_pass)
