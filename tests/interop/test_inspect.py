"""`llm-data inspect`: totals, sizes, dtype, tokenizer, fingerprint, length percentiles and the plot."""

from __future__ import annotations

import json

import numpy as np
import pytest

from llm.cli.data import main
from llm.data import ItemsLoader, TokensLoader, optimize
from llm.data.shards.format.manifest import Manifest


def _docs(i: int) -> np.ndarray:
    return np.arange(10 * (i % 9 + 1), dtype=np.int64) % 300


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect") / "ds"
    optimize(_docs, list(range(40)), out, num_workers=0, chunk_size=500, item_loader=TokensLoader(),
             compression="zstd", progress=False)
    return out


def _inspect(capsys, *args: str) -> dict:
    assert main(["inspect", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_inspect_our_tokens(ours, capsys):
    data = _inspect(capsys, str(ours))
    manifest = Manifest.load(ours)
    lengths = np.array([len(_docs(i)) for i in range(40)])
    assert data["totals"]["documents"] == 40 and data["totals"]["tokens"] == lengths.sum()
    assert data["totals"]["shards"] == len(manifest.shards) > 1
    assert data["fingerprint"] == manifest.fingerprint() and data["dtype"] == "uint16"
    assert data["compression"].startswith("zstd")
    got = data["lengths"]
    assert got["unit"] == "tokens" and got["shards_measured"] == len(manifest.shards)
    assert got["p50"] == np.percentile(lengths, 50) and got["p99"] == np.percentile(lengths, 99)
    assert got["max"] == lengths.max()


def test_inspect_text_and_plot(ours, tmp_path, capsys):
    png = tmp_path / "ds.png"
    assert main(["inspect", str(ours), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    for label in ("tokens", "documents", "on disk", "raw", "compression", "dtype", "tokenizer", "fingerprint",
                  "document length (tokens)", "p90"):
        assert label in out, label
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_through_the_remote_path_and_first_shards(ours, capsys):
    # `local:` goes through the same manifest + object reads as s3://
    data = _inspect(capsys, f"local:{ours}", "--shards", "1")
    assert data["lengths"]["shards_measured"] == 1
    assert data["totals"]["documents"] == 40


def test_inspect_items(tmp_path, capsys):
    optimize(lambda i: {"i": i, "pad": "x" * i}, list(range(30)), tmp_path / "items", num_workers=0,
             item_loader=ItemsLoader(), progress=False)
    data = _inspect(capsys, str(tmp_path / "items"))
    assert data["kind"] == "items" and data["totals"]["items"] == 30
    assert data["lengths"]["unit"] == "bytes" and data["lengths"]["max"] > data["lengths"]["p50"]


def test_inspect_foreign_folders(lit_tokens, mds_zstd, tmp_path, capsys):
    data = _inspect(capsys, str(lit_tokens))
    assert data["format"].startswith("litdata") and data["totals"]["documents"] == 120
    assert data["lengths"]["max"] <= 400 and data["dtype"] == "int32"
    data = _inspect(capsys, str(mds_zstd))
    assert data["format"].startswith("mds") and data["totals"]["items"] == 80
    assert main(["inspect", str(mds_zstd), "--plot", str(tmp_path / "m.png")]) == 0
    assert (tmp_path / "m.png").stat().st_size > 1000


def test_inspect_not_a_dataset(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 2
    assert "no index.json" in capsys.readouterr().err


def test_convert_cli(mds_raw, tmp_path, capsys):
    assert main(["convert", str(mds_raw), str(tmp_path / "ours"), "--num-workers", "0", "--no-progress"]) == 0
    from llm.data import StreamingDataset

    ours, theirs = StreamingDataset(tmp_path / "ours"), StreamingDataset(mds_raw)
    assert len(ours) == 80 and ours[5]["text"] == theirs[5]["text"] == "doc 5"
    assert main(["convert", str(tmp_path / "ours"), str(tmp_path / "again")]) == 2
    assert "not a LitData or MosaicML MDS folder" in capsys.readouterr().err


def test_info_describes_peer_folders(lit_tokens, mds_zstd, capsys):
    assert main(["info", str(lit_tokens)]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines()[1:] if "  " in line.strip())
    assert rows["format"].startswith("LitData folder") and rows["kind"] == "tokens" and rows["documents"] == "120"
    assert rows["chunks"] == str(len(json.loads((lit_tokens / "index.json").read_text())["chunks"]))
    assert main(["info", str(mds_zstd), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "mds" and data["totals"]["items"] == 80 and data["raw_bytes"] > data["totals"]["bytes"]
    assert data["details"]["columns"]["text"] == "str"


def test_inspect_json_gives_numbers_as_numbers(ours, capsys):
    data = _inspect(capsys, str(ours))
    manifest = Manifest.load(ours)
    assert data["shards"] == len(manifest.shards) and data["documents"] == 40 and data["tokens"] == data["totals"]["tokens"]
    assert data["bytes_on_disk"] == sum(s.bytes for s in manifest.shards) < data["bytes_raw"]
    assert data["compression"] == "zstd" and data["compression_ratio"] == pytest.approx(data["bytes_raw"] / data["bytes_on_disk"], rel=1e-3)
    assert data["format"] == "llm" and data["format_version"] == manifest.format_version
    numeric = {k: v for k, v in data.items() if isinstance(v, str) and v.replace(",", "").replace(".", "").isdigit()}
    assert not numeric, numeric  # no number spelled as a string


def test_plot_axis_suits_the_length_range(tmp_path, capsys):
    from llm.cli.inspect import label_heights, length_axis

    assert length_axis(np.full(100, 512))[0] == "linear" and len(length_axis(np.full(100, 512))[1]) == 2
    scale, bins = length_axis(np.arange(500, 530))
    assert scale == "linear" and list(bins) == [x - 0.5 for x in range(500, 531)]  # one bar per length
    assert length_axis(np.array([3, 40, 900]))[0] == "log"
    heights = label_heights([512.0, 512.0, 513.0])  # p50, p90, p99 nearly equal: still three rows
    assert len(set(heights)) == 3 and min(np.diff(sorted(heights))) >= 0.08
    optimize(lambda i: np.full(64, i % 300, dtype=np.int64), list(range(20)), tmp_path / "flat", num_workers=0,
             item_loader=TokensLoader(), progress=False)
    assert main(["inspect", str(tmp_path / "flat"), "--plot", str(tmp_path / "flat.png")]) == 0
    assert (tmp_path / "flat.png").stat().st_size > 1000


@pytest.mark.parametrize("progress", [True, False])
def test_convert_prints_its_summary_once(tmp_path, capsys, progress):
    from tests.interop import peers

    small = peers.mds_write(tmp_path / "mds", None, n=5)  # one MDS shard: one shard of ours
    args = ["convert", str(small), str(tmp_path / "ours"), "--num-workers", "0"]
    assert main(args + ([] if progress else ["--no-progress"])) == 0
    err = capsys.readouterr().err
    assert err.count("items/s") == 1, err
    assert "in 1 shard," in err and "1 shards" not in err


def test_info_says_what_the_manifest_knows_of_its_sources(mds_raw, tmp_path, capsys):
    import zstandard

    from llm.data.shards.prepare.optimize_text import optimize_text

    assert main(["convert", str(mds_raw), str(tmp_path / "ours"), "--num-workers", "0", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "ours")]) == 0
    out = capsys.readouterr().out
    assert f"converted from mds folder {mds_raw}" in out and "of text" not in out
    src = tmp_path / "a.jsonl.zst"
    src.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "hello there"}\n' * 200))
    optimize_text([str(src)], tmp_path / "text", "simple", progress=False)
    assert main(["info", str(tmp_path / "text")]) == 0
    out = capsys.readouterr().out
    assert f"1 file, {src.stat().st_size} B as stored (1 compressed" in out and "of text" not in out
    assert main(["verify", str(tmp_path / "text")]) == 0
    assert "verify: 1 shard OK" in capsys.readouterr().out
