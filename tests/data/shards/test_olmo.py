"""OLMo-core numpy token files (`olmo:` specs) read in place, checked, resumed and converted both ways.

Files are written as OLMo-core's data guide does (`np.memmap(path, mode="w+", dtype=...)`, raw, no
header); blocks follow its fixed-length instances (each file's tail shorter than a block unused).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm.cli.data import main
from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.interop.olmo import spec
from tests.data.shards.helpers import run_loader
from tests.resume import check_resume

BLOCK, EOS = 16, 0


def write_olmo(path: Path, docs: list[np.ndarray], dtype: str) -> np.ndarray:
    tokens = np.concatenate([np.append(d, EOS) for d in docs]).astype(dtype)
    mm = np.memmap(path, mode="w+", dtype=dtype, shape=(len(tokens),))
    mm[:] = tokens
    mm.flush()
    del mm
    return tokens


def docs(n: int, seed: int, high: int = 1000) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, high, int(rng.integers(1, 40))) for _ in range(n)]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Document ends are kept in the user cache dir: a private one per test."""
    monkeypatch.setenv("LLM_CACHE_DIR", str(tmp_path / "user-cache"))


@pytest.fixture
def files(tmp_path) -> tuple[list[Path], list[np.ndarray]]:
    folder = tmp_path / "olmo"
    folder.mkdir()
    paths = [folder / "part-0.npy", folder / "part-1.npy"]
    arrays = [write_olmo(paths[0], docs(30, 1), "uint32"), write_olmo(paths[1], docs(25, 2), "uint32")]
    return paths, arrays


def fsl_instances(arrays: list[np.ndarray], block: int) -> np.ndarray:
    """OLMo-core's NumpyFSLDataset instances, unshuffled: each file cut into blocks, its short tail unused."""
    return np.concatenate([a[: len(a) // block * block].reshape(-1, block) for a in arrays]).astype(np.int64)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
def test_blocks_are_olmo_cores_instances_and_documents_end_at_eos(tmp_path, dtype):
    arrays = [write_olmo(tmp_path / f"{k}.npy", docs(20, k, high=200), dtype) for k in range(3)]
    ds = StreamingDataset(spec([tmp_path / f"{k}.npy" for k in range(3)], dtype, EOS),
                          item_loader=TokensLoader(block_size=BLOCK, document_boundaries=True))
    expected = fsl_instances(arrays, BLOCK)
    assert len(ds) == len(expected)
    assert np.array_equal(np.stack([ds[i]["input_ids"].numpy() for i in range(len(ds))]), expected)
    epoch = np.concatenate([b["input_ids"].numpy() for b in StreamingDataLoader(ds, batch_size=4)])
    assert np.array_equal(epoch, expected)  # the loader's batched reads too
    row = ds[0]
    first_eos = int(np.flatnonzero(expected[0] == EOS)[0]) if EOS in expected[0] else BLOCK
    if first_eos + 1 < BLOCK:  # a new document starts right after the EOS: its position is 0
        assert int(row["position_ids"][first_eos + 1]) == 0 and int(row["position_ids"][first_eos]) == first_eos
    assert ds.manifest.total_documents == sum(int(np.sum(a == EOS)) for a in arrays)


def test_a_folder_spec_reads_its_npy_files_in_name_order(files):
    paths, arrays = files
    by_folder = StreamingDataset(f"olmo:uint32:eos={EOS}:{paths[0].parent}", item_loader=TokensLoader(block_size=BLOCK))
    by_list = StreamingDataset(spec(paths, "uint32", EOS), item_loader=TokensLoader(block_size=BLOCK))
    assert by_folder.fingerprint == by_list.fingerprint and len(by_folder) == len(fsl_instances(arrays, BLOCK))


@pytest.mark.parametrize("value, message", [
    ("olmo:int7:/x.npy", "dtype 'int7' is not an OLMo token dtype"),
    ("olmo:uint16:eos=70000:/x.npy", "eos='70000' is not a token id of uint16"),
    ("olmo:uint16:", "names no files"),
    ("olmo:uint64:/x.npy", "uint64 token files are not read"),
])
def test_a_malformed_spec_is_one_sentence(value, message):
    with pytest.raises(ValueError, match=message):
        StreamingDataset(value, item_loader=TokensLoader(block_size=BLOCK))


def test_a_file_whose_length_is_not_a_multiple_of_its_dtype_is_named(files):
    paths, _ = files
    with open(paths[1], "ab") as f:
        f.write(b"\x01\x02")
    with pytest.raises(ValueError, match=r"part-1\.npy has \d+ bytes, not a multiple of uint32's 4") as info:
        StreamingDataset(spec(paths, "uint32", EOS), item_loader=TokensLoader(block_size=BLOCK))
    assert "\n" not in str(info.value)


def test_a_npy_file_with_a_header_and_a_missing_file_are_named(files, tmp_path):
    paths, arrays = files
    np.save(tmp_path / "with_header.npy", arrays[0][:100])
    with pytest.raises(ValueError, match="with_header.npy is a NumPy .npy file with a header"):
        StreamingDataset(spec([tmp_path / "with_header.npy"], "uint32", EOS), item_loader=TokensLoader(block_size=BLOCK))
    with pytest.raises(ValueError, match="gone.npy is missing"):
        StreamingDataset(spec([paths[0], tmp_path / "gone.npy"], "uint32", EOS), item_loader=TokensLoader(block_size=BLOCK))


def test_a_changed_file_changes_the_fingerprint_so_a_state_is_refused(files):
    paths, _ = files
    ds = StreamingDataset(spec(paths, "uint32", EOS), item_loader=TokensLoader(block_size=BLOCK))
    state = StreamingDataLoader(ds, batch_size=4).state_dict()
    mm = np.memmap(paths[0], dtype="uint32", mode="r+")
    mm[0] += 1
    mm.flush()
    del mm
    other = StreamingDataset(spec(paths, "uint32", EOS), item_loader=TokensLoader(block_size=BLOCK))
    with pytest.raises(ValueError, match="fingerprint"):
        StreamingDataLoader(other, batch_size=4).load_state_dict(state)


def test_resume_is_exact_on_another_topology(files):
    paths, _ = files
    config = {"path": spec(paths, "uint32", EOS), "block": BLOCK, "batch": 4, "workers": 0}
    check_resume(run_loader, config, stops=[2, 9], resume_configs=[
        {**config, "workers": 2, "backend": "processes"},
        {**config, "world": 2, "batch": 2},
    ])


def test_convert_to_ours_and_back_to_olmo(files, tmp_path):
    paths, arrays = files
    source = spec(paths, "uint32", EOS)
    assert main(["convert", source, "--output", str(tmp_path / "ours"), "--no-progress"]) == 0
    ours = StreamingDataset(tmp_path / "ours", item_loader=TokensLoader(block_size=1))
    every = np.concatenate(arrays).astype(np.int64)
    assert ours.reader.total == len(every)  # convert keeps each file's tail, which the FSL blocks skip
    assert np.array_equal(np.concatenate([ours[i].numpy() for i in range(len(ours))]), every)
    assert main(["convert", str(tmp_path / "ours"), "--output", str(tmp_path / "back"), "--format", "olmo",
                 "--eos-id", str(EOS)]) == 0
    written = sorted((tmp_path / "back").glob("part-*.npy"))
    back = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in written]).astype(np.int64)  # ids < 1000: uint16
    assert np.array_equal(back, every)  # every document already ends with EOS: none is added
    assert main(["convert", str(tmp_path / "ours"), "--output", str(tmp_path / "back"), "--format", "olmo",
                 "--eos-id", str(EOS)]) == 2  # refused: the folder already holds token files


def test_convert_megatron_to_olmo_adds_eos_between_documents(tmp_path):
    from tests.data.shards import megatron_ref

    documents = [[np.array([5, 6, 7])], [np.array([8])], [np.array([9, 10])]]
    megatron_ref.write(tmp_path / "m", documents, code=8)
    assert main(["convert", str(tmp_path / "m"), "--output", str(tmp_path / "o"), "--format", "olmo", "--eos-id", "1"]) == 0
    (written,) = sorted((tmp_path / "o").glob("part-*.npy"))
    assert np.fromfile(written, dtype=np.uint16).tolist() == [5, 6, 7, 1, 8, 1, 9, 10, 1]
    assert main(["convert", str(tmp_path / "m"), "--output", str(tmp_path / "o2"), "--format", "olmo"]) == 2  # no EOS id


def test_document_ends_are_kept_and_a_rewritten_file_is_scanned_again(tmp_path):
    path = tmp_path / "one.npy"
    write_olmo(path, [np.array([5, 6]), np.array([7])], "uint16")  # 5 6 EOS 7 EOS
    ds = StreamingDataset(spec([path], "uint16", EOS), item_loader=TokensLoader(block_size=5))
    assert ds.manifest.total_documents == 2
    assert len(list((tmp_path / "user-cache").rglob("*.npy"))) == 1
    write_olmo(path, [np.array([5]), np.array([6]), np.array([7])], "uint16")  # same size: 5 EOS 6 EOS 7 EOS is longer
    write_olmo(path, [np.array([5]), np.array([6, 7])], "uint16")  # 5 EOS 6 7 EOS: same size, other documents
    ds = StreamingDataset(spec([path], "uint16", EOS), item_loader=TokensLoader(block_size=5, document_boundaries=True))
    assert ds.manifest.total_documents == 2 and ds[0]["position_ids"].tolist() == [0, 1, 0, 1, 2]
