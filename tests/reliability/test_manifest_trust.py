"""The manifest is cross-checked against itself and the shard files: an edited index.json is a clear error or correct data."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm.cli.data import main as llm_data
from llm.data import ItemsLoader, StreamingDataset, TokensLoader, optimize
from llm.data.shards.format.manifest import INDEX_NAME, Manifest, ShardInfo
from llm.data.shards.format.reader import verify_dataset
from tests.data.shards.helpers import make_token_dataset

BLOCK = 61


def _read_all(folder: Path) -> list:
    kind = json.loads((folder / INDEX_NAME).read_text()).get("kind")
    if kind == "items":
        ds = StreamingDataset(folder, item_loader=ItemsLoader())
        return [ds[i] for i in range(len(ds))]
    ds = StreamingDataset(folder, item_loader=TokensLoader(block_size=BLOCK))
    return [ds[i].numpy() for i in range(len(ds))]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


@pytest.fixture(scope="module", params=["tokens", "tokens-zstd", "items"])
def dataset(request, tmp_path_factory) -> tuple[Path, dict, list]:
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "items":
        out = root / "ds"
        optimize(lambda i: {"i": i, "text": "x" * (i % 7)}, list(range(300)), out, num_workers=0, chunk_size=40,
                 progress=False)
    else:
        compression = "zstd" if request.param.endswith("zstd") else None
        out = make_token_dataset(root, n_lines=400, chunk_bytes="4KB", compression=compression)
    original = json.loads((out / INDEX_NAME).read_text())
    assert len(original["shards"]) >= 3
    return out, original, _read_all(out)


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-1100, 1100),
    st.sampled_from([10**15, 2**63, -1, 0, 1, "uint8", "uint16", "uint32", "int64", "zstd", "", "../x", [], {}]),
    st.text(max_size=6), st.floats(allow_nan=True),
)


@st.composite
def mutations(draw, original: dict) -> tuple[str, dict]:
    data = copy.deepcopy(original)
    shards = data["shards"]
    what = draw(st.sampled_from(["top", "shard", "shard", "shard", "structure"]))
    if what == "top":
        key = draw(st.sampled_from(sorted(data)))
        if draw(st.booleans()) and key != "shards":
            del data[key]
            return f"del {key}", data
        data[key] = draw(_VALUES)
        return f"{key}={data[key]!r}", data
    if what == "structure":
        i, j = draw(st.integers(0, len(shards) - 1)), draw(st.integers(0, len(shards) - 1))
        op = draw(st.sampled_from(["duplicate", "drop", "swap"]))
        if op == "duplicate":
            shards.insert(j, copy.deepcopy(shards[i]))
        elif op == "drop":
            del shards[i]
        else:
            shards[i], shards[j] = shards[j], shards[i]
        return f"{op} {i} {j}", data
    i = draw(st.integers(0, len(shards) - 1))
    key = draw(st.sampled_from(sorted(shards[i])))
    if draw(st.integers(0, 4)) == 0:
        del shards[i][key]
        return f"del shards[{i}].{key}", data
    old = shards[i][key]
    if isinstance(old, int) and draw(st.booleans()):
        shards[i][key] = old + draw(st.sampled_from([-1000, -8, -4, -2, -1, 1, 2, 4, 8, 1000]))
    else:
        shards[i][key] = draw(_VALUES)
    return f"shards[{i}].{key}={shards[i][key]!r}", data


@pytest.mark.timeout(600)
@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_single_edit_of_the_manifest_is_a_clear_error_or_correct_data(dataset, data) -> None:
    folder, original, expected = dataset
    label, mutated = data.draw(mutations(original))
    try:
        (folder / INDEX_NAME).write_text(json.dumps(mutated))
        try:
            got = _read_all(folder)
        except ValueError as e:  # ManifestError, ShardError: user-facing
            message = str(e)
            assert "\n" not in message and str(folder) in message, (label, message)
            return
        assert _same(got, expected), f"{label}: wrong data was read"
    finally:
        (folder / INDEX_NAME).write_text(json.dumps(original))


def _edit(folder: Path, fn) -> dict:
    data = json.loads((folder / INDEX_NAME).read_text())
    fn(data)
    (folder / INDEX_NAME).write_text(json.dumps(data))
    return data


@pytest.mark.parametrize(
    "edit, expect",
    [
        (lambda d: d["shards"].insert(1, dict(d["shards"][1])), "listed twice"),
        (lambda d: d["shards"].pop(1), "key 'fingerprint'"),
        (lambda d: d["shards"][1].update(tokens=d["shards"][1]["tokens"] + 1000), "key 'bytes'"),
        (lambda d: d["shards"][1].update(dtype="uint32"), "key 'bytes'"),
        (lambda d: d["shards"][1].update(dtype="int64"), "key 'dtype'"),
        (lambda d: d["shards"][1].update(tokens=10**15), "key 'tokens'"),
        (lambda d: d["shards"][1].update(tokens=-5), "key 'tokens'"),
        (lambda d: d.update(dtype=[]), "key 'dtype'"),  # unhashable: was a raw TypeError (found by the fuzz above)
        (lambda d: d["shards"][1].update(dtype={"a": 1}), "key 'dtype'"),
    ],
    ids=["duplicate", "dropped", "tokens+1000", "wrong-dtype", "bad-dtype", "tokens=1e15", "negative", "dtype-list",
         "shard-dtype-dict"],
)
def test_named_manifest_edits_are_refused_by_load_and_verify(tmp_path, capsys, edit, expect) -> None:
    folder = make_token_dataset(tmp_path, n_lines=400, chunk_bytes="4KB")
    _edit(folder, edit)
    with pytest.raises(ValueError, match=expect):
        StreamingDataset(folder, item_loader=TokensLoader(block_size=BLOCK))
    assert llm_data(["verify", str(folder)]) == 2
    err = capsys.readouterr().err
    assert expect in err and "OK" not in err and err.count("\n") == 1


def test_consistent_but_false_counts_are_caught_by_the_shard_itself(tmp_path) -> None:
    """tokens +4 and documents -1 keep the size (uint16) and a re-saved manifest keeps its fingerprint valid."""
    folder = make_token_dataset(tmp_path, n_lines=400, chunk_bytes="4KB")
    m = Manifest.load(folder)
    s = m.shards[1]
    m.shards[1] = ShardInfo(**{**s.__dict__, "tokens": s.tokens + 4, "documents": s.documents - 1})
    m.save(folder)
    with pytest.raises(ValueError, match="document ends do not match"):
        verify_dataset(folder)
    ds = StreamingDataset(folder, item_loader=TokensLoader(block_size=BLOCK))
    with pytest.raises(ValueError, match="document ends do not match"):
        [ds[i] for i in range(len(ds))]


def test_a_file_where_a_folder_is_expected_is_one_sentence(tmp_path, capsys) -> None:
    folder = make_token_dataset(tmp_path, n_lines=50)
    shard = next(folder.glob("shard-*.bin"))
    with pytest.raises(ValueError, match="is a file, not a dataset folder"):
        StreamingDataset(shard, item_loader=TokensLoader(block_size=BLOCK))
    for target in (shard, folder / INDEX_NAME):
        assert llm_data(["info", str(target)]) == 2
        assert "is a file, not a dataset folder" in capsys.readouterr().err
