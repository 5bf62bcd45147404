"""Megatron indexed datasets (.bin/.idx) read in place, cross-checked, resumed, mixed and converted both ways.

Fixtures are written by `megatron_ref.py` (Megatron's format description, not our writer), and
what `llm-data convert --format megatron` writes is read back by its reader, byte for byte.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from llm.cli.data import main
from llm.data import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset, TokensLoader
from tests.data.shards import megatron_ref
from tests.data.shards.helpers import run_loader
from tests.resume import check_resume

BLOCK = 16


def documents(n: int, seed: int, high: int = 120, sentences: bool = False) -> list[list[np.ndarray]]:
    """n documents, each one sequence (preprocess_data.py) or 1-3 sentences (--split-sentences)."""
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, high, int(rng.integers(1, 30))) for _ in range(int(rng.integers(1, 4)) if sentences else 1)]
            for _ in range(n)]


def flat(docs: list[list[np.ndarray]]) -> np.ndarray:
    return np.concatenate([s for d in docs for s in d]).astype(np.int64)


def doc_lengths(docs: list[list[np.ndarray]]) -> list[int]:
    return [sum(len(s) for s in d) for d in docs]


@pytest.fixture
def prefix(tmp_path) -> Path:
    p = tmp_path / "mega" / "corpus_text_document"
    p.parent.mkdir()
    megatron_ref.write(p, documents(60, seed=1, sentences=True), code=8)
    return p


def positions_from(lengths: list[int], block: int = BLOCK) -> np.ndarray:
    """Our position ids: counting from each document's start, or from the block's when the document began earlier."""
    t = np.arange(sum(lengths))
    doc_start = np.repeat(np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return t - np.maximum(doc_start, t // block * block)


@pytest.mark.parametrize("code", [1, 2, 3, 4, 5, 8])
def test_every_token_dtype_reads_as_written_with_document_boundaries(tmp_path, code):
    docs = documents(50, seed=code, high=100, sentences=True)  # ids < 100 fit int8 too
    megatron_ref.write(tmp_path / "p", docs, code)
    ds = StreamingDataset(str(tmp_path / "p"), item_loader=TokensLoader(block_size=BLOCK, document_boundaries=True))
    tokens = flat(docs)
    assert len(ds) == -(-len(tokens) // BLOCK)  # never fewer or more blocks
    got = np.concatenate([ds[i]["input_ids"].numpy() for i in range(len(ds))])[: len(tokens)]
    assert np.array_equal(got, tokens)
    positions = np.concatenate([ds[i]["position_ids"].numpy() for i in range(len(ds))])[: len(tokens)]
    # a document of several sentences is one document: positions restart only at the document index's bounds
    assert np.array_equal(positions, positions_from(doc_lengths(docs)))
    assert ds.manifest.total_documents == len(docs) and ds.manifest.foreign_format == "megatron"


def test_a_folder_of_prefixes_is_read_in_name_order_with_mixed_dtypes(tmp_path):
    a, b = documents(20, seed=2), documents(30, seed=3, high=70_000)
    megatron_ref.write(tmp_path / "b_part", b, code=4)
    megatron_ref.write(tmp_path / "a_part", a, code=8)
    ds = StreamingDataset(tmp_path, item_loader=TokensLoader(block_size=BLOCK))
    tokens = np.concatenate([flat(a), flat(b)])
    got = np.concatenate([ds[i].numpy() for i in range(len(ds))])
    assert len(ds) == -(-len(tokens) // BLOCK) and np.array_equal(got[: len(tokens)], tokens)
    assert ds[0].dtype.itemsize >= 4  # int32 ids above 65535 are kept
    for workers in (0, 2):  # the loader's batched reads (pread of each file) give the same tokens
        epoch = np.concatenate([b.numpy() for b in StreamingDataLoader(ds, batch_size=4, num_workers=workers)])
        assert np.array_equal(epoch.reshape(-1)[: len(tokens)], tokens)


def _damage(prefix: Path, what: str) -> None:
    idx, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
    data = bytearray(idx.read_bytes())
    seqs = struct.unpack_from("<Q", data, 18)[0]
    if what == "truncated bin":
        bin_path.write_bytes(bin_path.read_bytes()[:-3])
    elif what == "version":
        struct.pack_into("<Q", data, 9, 2)
    elif what == "dtype code":
        data[17] = 9
    elif what == "float dtype":
        data[17] = 7
    elif what == "pointer":
        struct.pack_into("<q", data, 34 + 4 * seqs + 8 * 5, 2)
    elif what == "length":
        struct.pack_into("<i", data, 34 + 4 * 3, 10_000)
    elif what == "document count":
        struct.pack_into("<Q", data, 26, struct.unpack_from("<Q", data, 26)[0] + 1)
    elif what == "document index":
        struct.pack_into("<q", data, len(data) - 8, seqs - 1)
    elif what == "missing bin":
        bin_path.unlink()
    if what not in ("truncated bin", "missing bin"):
        idx.write_bytes(bytes(data))


@pytest.mark.parametrize("what, field", [
    ("truncated bin", "truncated"),
    ("version", "version 2"),
    ("dtype code", "dtype code 9, which Megatron does not define"),
    ("float dtype", "float32"),
    ("pointer", r"sequence_pointers\[5\]"),
    ("length", "sequence_pointers"),  # a changed length moves every pointer after it
    ("document count", "document count"),
    ("document index", "document_indices"),
    ("missing bin", "missing"),
])
def test_an_index_that_disagrees_with_its_bin_is_one_sentence_naming_the_file_and_field(prefix, what, field):
    _damage(prefix, what)
    with pytest.raises(ValueError, match=field) as info:
        StreamingDataset(str(prefix), item_loader=TokensLoader(block_size=BLOCK))
    message = str(info.value)
    assert "\n" not in message and prefix.name in message


def test_verify_and_info_describe_a_prefix(prefix, capsys):
    assert main(["verify", str(prefix)]) == 0
    assert "OK" in capsys.readouterr().out
    _damage(prefix, "truncated bin")
    with pytest.raises(SystemExit) as e:
        main(["verify", str(prefix)])
    assert e.value.code == 1 and "truncated" in capsys.readouterr().err


def test_resume_is_exact_on_another_topology(prefix):
    config = {"path": str(prefix), "block": BLOCK, "batch": 4, "workers": 0}
    check_resume(run_loader, config, stops=[3, 11], resume_configs=[
        {**config, "workers": 2, "backend": "processes"},
        {**config, "world": 2, "batch": 2},  # the same global batch over two ranks
    ])


def test_a_megatron_prefix_mixes_with_olmo_files_and_our_dataset(prefix, tmp_path):
    from llm.data.shards.interop.olmo import spec

    rng = np.random.default_rng(9)
    rng.integers(1000, 2000, 700).astype(np.uint16).tofile(tmp_path / "olmo.npy")  # ids no Megatron block holds
    megatron_ref.write(tmp_path / "third", documents(30, seed=5, high=100), code=8)
    main(["convert", str(tmp_path / "third"), "--output", str(tmp_path / "ours"), "--no-progress"])
    sources = [StreamingDataset(str(prefix), item_loader=TokensLoader(block_size=BLOCK)),
               StreamingDataset(spec([tmp_path / "olmo.npy"], "uint16", 0), item_loader=TokensLoader(block_size=BLOCK)),
               StreamingDataset(tmp_path / "ours", item_loader=TokensLoader(block_size=BLOCK))]
    blocks = [{ds[i].numpy().astype(np.int64).tobytes() for i in range(len(ds))} for ds in sources]
    mix = CombinedStreamingDataset(sources, weights=[0.5, 0.3, 0.2], seed=1)
    rows = np.concatenate([b.numpy() for b in StreamingDataLoader(mix, batch_size=4)]).astype(np.int64)
    owners = [[k for k, b in enumerate(blocks) if row.tobytes() in b] for row in rows]
    assert all(len(o) >= 1 for o in owners), "every mixed row is a block of one of its sources"
    assert {o[0] for o in owners if len(o) == 1} == {0, 1, 2}, "each source is drawn"


def test_convert_to_ours_keeps_every_document_and_token(prefix, tmp_path):
    dtype, seqs, doc_index = megatron_ref.read(prefix)
    assert main(["convert", str(prefix), "--output", str(tmp_path / "ours"), "--no-progress"]) == 0
    ours = StreamingDataset(tmp_path / "ours", item_loader=TokensLoader(block_size=1))
    tokens = np.concatenate(seqs).astype(np.int64)
    assert ours.reader.total == len(tokens) and ours.manifest.total_documents == len(doc_index) - 1
    assert np.array_equal(np.concatenate([ours[i].numpy() for i in range(len(ours))]), tokens)


def test_convert_to_megatron_is_read_back_by_megatrons_format_byte_for_byte(prefix, tmp_path):
    ours = tmp_path / "ours"
    assert main(["convert", str(prefix), "--output", str(ours), "--no-progress"]) == 0
    out = tmp_path / "out" / "corpus"
    assert main(["convert", str(ours), "--output", str(out), "--format", "megatron"]) == 0
    dtype, seqs, doc_index = megatron_ref.read(out)
    _, source_seqs, source_docs = megatron_ref.read(prefix)
    # one sequence per document (preprocess_data.py's layout): each document's sentences joined
    expected = [np.concatenate(source_seqs[a:b]) for a, b in zip(source_docs[:-1], source_docs[1:])]
    assert dtype == np.uint16 and doc_index == list(range(len(expected) + 1))
    assert all(np.array_equal(s, e) for s, e in zip(seqs, expected)) and len(seqs) == len(expected)
    again = tmp_path / "again"
    megatron_ref.write(again, [[e] for e in expected], code=8)  # Megatron's own layout of the same documents
    assert Path(f"{out}.idx").read_bytes() == Path(f"{again}.idx").read_bytes()
    assert Path(f"{out}.bin").read_bytes() == Path(f"{again}.bin").read_bytes()
    # an existing prefix is refused (exit 2, nothing replaced) unless --mode overwrite
    before = Path(f"{out}.idx").read_bytes()
    assert main(["convert", str(ours), "--output", str(out), "--format", "megatron"]) == 2
    assert Path(f"{out}.idx").read_bytes() == before
    assert main(["convert", str(ours), "--output", str(out), "--format", "megatron", "--mode", "overwrite"]) == 0


def test_wide_ids_are_written_as_int32(tmp_path):
    megatron_ref.write(tmp_path / "wide", documents(10, seed=4, high=100_000), code=4)
    assert main(["convert", str(tmp_path / "wide"), "--output", str(tmp_path / "back"), "--format", "megatron"]) == 0
    dtype, seqs, _ = megatron_ref.read(tmp_path / "back")
    assert dtype == np.int32 and np.array_equal(np.concatenate(seqs), flat(documents(10, seed=4, high=100_000)))


def test_text_sequence_modes_are_read_and_other_modes_refused(tmp_path):
    docs = documents(10, seed=6)
    megatron_ref.write(tmp_path / "mm", docs, code=8)
    idx = Path(f"{tmp_path / 'mm'}.idx")
    idx.write_bytes(idx.read_bytes() + bytes(10))  # newer Megatron's multimodal index: one int8 mode per sequence, 0 = text
    ds = StreamingDataset(str(tmp_path / "mm"), item_loader=TokensLoader(block_size=BLOCK))
    assert np.array_equal(np.concatenate([ds[i].numpy() for i in range(len(ds))])[: len(flat(docs))], flat(docs))
    idx.write_bytes(idx.read_bytes()[:-1] + b"\x01")
    with pytest.raises(ValueError, match=r"sequence_modes\[9\] is 1"):
        StreamingDataset(str(tmp_path / "mm"), item_loader=TokensLoader(block_size=BLOCK))
