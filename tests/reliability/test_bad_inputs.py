"""Every bad input in one table: the call that feeds it, the error type (or exit code) and the name it must say.

Each row asserts the message is one line (no newline) and names the file/key/record/value it is about; a CLI
row calls the tool's main() in-process and expects exactly one stderr line starting with the tool's name.
"""

from __future__ import annotations

import gzip
import json
import shutil
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from llm.cli.data import main as data_main
from llm.data import (
    CombinedStreamingDataset,
    FernetEncryption,
    ItemsLoader,
    StreamingDataLoader,
    StreamingDataset,
    TokensLoader,
    dedup_corpus,
    merge_datasets,
    optimize,
    train_test_split,
)
from llm.data.inputs.errors import InputError
from llm.data.metrics_export import MetricsPortError
from llm.data.sft.prompts import ChatTemplateError
from llm.data.sft.stream import StreamingSFTDataModule
from llm.data.shards.format.encryption import EncryptionError
from llm.data.shards.format.manifest import INDEX_NAME
from llm.data.shards.format.pread import ShardError
from llm.data.shards.format.serializers import StructureError, UnpicklableItem
from llm.data.shards.format.validate import ManifestError
from llm.data.shards.prepare.map import map as map_items
from llm.data.shards.prepare.optimize import OptimizeError
from llm.data.shards.prepare.optimize_text import optimize_text
from llm.data.stage import StateError
from llm.data.storage.lock import FolderLock, LockHeld
from llm.data.storage.s3 import resolve_config
from llm.data.text.stream import StreamingTextDataModule
from llm.data.tokenize.tokenizers import train_bpe_tokenizer
from llm.training.core.data_config import DataConfig, DatasetEntry
from llm.training.core.errors import ConfigError
from llm.training.core.loading import load_config
from llm.training.generate import main as generate_main
from llm.training.train import main as train_main
from tests.data.shards.helpers import make_token_dataset

BLOCK = 16
BROKEN_JINJA = "{% for m in messages %}{{ m }}"  # no endfor
CHAT = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}


class Exit(NamedTuple):
    """A CLI row's expectation: the tool's exit code, and the tool whose name opens its one stderr line."""

    tool: str
    code: int = 2


@dataclass
class Ctx:
    """What the rows feed on: tiny files and datasets made once per module, and this test's monkeypatch."""

    root: Path
    ds: Path
    other: Path
    monkeypatch: pytest.MonkeyPatch

    def fresh(self, name: str) -> Path:
        """A path under root that no earlier row used."""
        path = self.root / "fresh" / name
        shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(exist_ok=True)
        return path

    def dataset(self, **kw: Any) -> StreamingDataset:
        return StreamingDataset(self.ds, item_loader=TokensLoader(block_size=BLOCK), **kw)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("bad")
    for name in ("a", "b"):
        (root / name).mkdir()
    ds = make_token_dataset(root / "a", n_lines=200, chunk_bytes="4KB")
    other = make_token_dataset(root / "b", n_lines=120, chunk_bytes="4KB")
    (root / "afile").write_text("not a folder\n")
    (root / "empty").mkdir()
    (root / "text.txt").write_text("one line\nanother line\n")
    raw = gzip.compress("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(2000)).encode())
    (root / "cut.jsonl.gz").write_bytes(raw[: len(raw) // 2])
    alpaca = {"instruction": "Say hi.", "input": "", "output": "hi"}
    (root / "sft.jsonl").write_text(json.dumps(alpaca) + "\n" + json.dumps({"instruction": "x"}) + "\n")
    (root / "chat.jsonl").write_text(json.dumps(CHAT) + "\n")
    (root / "cache" / "notes").mkdir(parents=True)
    return root, ds, other


@pytest.fixture
def ctx(files: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> Ctx:
    monkeypatch.chdir(files[0])
    return Ctx(*files, monkeypatch)


# --- the feeders: each feeds one bad input -----------------------------------------------------------------


def _yaml(c: Ctx, name: str, tree: dict) -> str:
    path = c.root / name
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def _text_yaml(c: Ctx, name: str, **data: Any) -> str:
    return _yaml(c, name, {"data": {"dataset_path": str(c.root / "text.txt"), **data}})


def _axolotl(c: Ctx, name: str, entry: dict | None = None, **extra: Any) -> str:
    tree = {"datasets": [{"path": str(c.root / "sft.jsonl"), "type": "alpaca", **(entry or {})}],
            "sequence_len": 64, "micro_batch_size": 2, "max_steps": 1, "learning_rate": 3e-3,
            "output_dir": str(c.root / "sft-out"), "streaming": True, **extra}
    return _yaml(c, name, tree)


def _loader(c: Ctx, dataset: StreamingDataset | None = None, **kw: Any) -> StreamingDataLoader:
    return StreamingDataLoader(dataset or c.dataset(), **{"batch_size": 2, **kw})


def _metrics_port_in_use(c: Ctx) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        _loader(c, metrics_port=taken.getsockname()[1], metrics_host="127.0.0.1")
    finally:
        taken.close()


def _mixture_state(c: Ctx, **kw: Any) -> dict:
    loader = _loader(c, _combined(c, None, schedule=_schedule((0, [1.0, 1.0]), (3, [1.0, 2.0])), **kw), batch_size=4)
    next(iter(loader))
    return loader.state_dict()


def _mixture_v1_without_batch(c: Ctx) -> None:
    """A version-1 mixture state given to the dataset itself: no clock, no step_samples, no global batch."""
    state = _mixture_state(c)
    state.pop("global_batch_size")
    state["mixture"] = {k: v for k, v in state["mixture"].items()
                        if k in ("weights", "anchor", "counts", "batching", "unit", "schedule")}
    _combined(c, None, schedule=_schedule((0, [1.0, 1.0]), (3, [1.0, 2.0]))).load_state_dict(state)


def _mixture_other_sources(c: Ctx) -> None:
    state = _mixture_state(c)
    three = CombinedStreamingDataset([c.dataset(), c.dataset(seed=3), StreamingDataset(c.other, item_loader=TokensLoader(
        block_size=BLOCK))], schedule=_schedule((0, [1.0, 1.0, 1.0]), (3, [1.0, 2.0, 1.0])))
    _loader(c, three, batch_size=4).load_state_dict(state)


def _dedup_bad_record(c: Ctx) -> None:
    (c.root / "bad-record.jsonl").write_text('{"text": "fine"}\n{"text": "cut off\n')
    dedup_corpus(str(c.root / "bad-record.jsonl"), c.fresh("dd1"), num_workers=0, progress=False)


def _dedup_not_empty(c: Ctx) -> None:
    out = c.fresh("dd2")
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    dedup_corpus(str(c.root / "text.txt"), out, num_workers=0, progress=False)


def _dedup_locked(c: Ctx) -> None:
    out = c.fresh("dd3")
    with FolderLock(out, what="a dedup"):  # another run holds the output (flock: per open file, so this process too)
        dedup_corpus(str(c.root / "text.txt"), out, num_workers=0, progress=False)


def _state_of_other(c: Ctx) -> None:
    other = StreamingDataLoader(StreamingDataset(c.other, item_loader=TokensLoader(block_size=BLOCK)), batch_size=2)
    _loader(c).load_state_dict(other.state_dict())


def _state_edited(c: Ctx, **edit: Any) -> None:
    """A loader's own state with keys changed (value None: the key removed), loaded back."""
    loader = _loader(c)
    state = {**loader.state_dict(), **edit}
    loader.load_state_dict({k: v for k, v in state.items() if v is not None})


def _combined(c: Ctx, weights: Any, **kw: Any) -> CombinedStreamingDataset:
    return CombinedStreamingDataset([c.dataset(), c.dataset(seed=3)], weights=weights, **kw)


def _schedule(*points: tuple[int, list[float]]) -> list[dict]:
    return [{"step": step, "weights": weights} for step, weights in points]


def _text_mix(c: Ctx, name: str, **data: Any) -> Any:
    """A two-entry text mixture's YAML with these mixing keys, loaded."""
    return load_config(_yaml(c, name, {"data": {"datasets": [{"dataset_path": "a.txt"}, {"dataset_path": "b.txt"}],
                                                "streaming_dataset_mixing_strategy": "weighted", **data}}))


def _merge_kinds(c: Ctx) -> None:
    items = c.fresh("items")
    optimize(lambda i: {"i": i}, [1, 2], items, num_workers=0, progress=False)
    merge_datasets([c.ds, items], c.fresh("merged"))


def _encrypted(c: Ctx, password: str | None) -> Any:
    """A dataset encrypted with one password, read with `password` (None: no key)."""
    folder = c.fresh("secret")
    optimize(lambda i: {"i": i}, [1, 2], folder, num_workers=0, progress=False, encryption=FernetEncryption("one"))
    return StreamingDataset(folder, encryption=FernetEncryption(password) if password else None)[0]


def _edited_manifest(c: Ctx) -> StreamingDataset:
    folder = c.fresh("edited")
    shutil.copytree(c.ds, folder)
    data = json.loads((folder / INDEX_NAME).read_text())
    data["dtype"] = []
    (folder / INDEX_NAME).write_text(json.dumps(data))
    return StreamingDataset(folder, item_loader=TokensLoader(block_size=BLOCK))


def _malformed_endpoint(c: Ctx) -> None:
    c.monkeypatch.setenv("HOME", str(c.root / "empty"))
    c.monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333 x")
    resolve_config("b")


def _sft(c: Ctx, entry: DatasetEntry, **kw: Any) -> None:
    cfg = DataConfig(datasets=[entry], max_seq_len=256, **kw)
    list(StreamingSFTDataModule(cfg, batch_size=2, loop=False).train_dataloader())


def _fn_raises(i: int) -> int:
    raise ZeroDivisionError(f"no item {i}")


def _lock(i: int) -> dict:
    return {"k": threading.Lock()}


def _changing(i: int) -> dict:
    return {"label": i if i < 3 else str(i)}


def _tokenizer_with_template(c: Ctx, template: str) -> str:
    """A tokenizer folder whose tokenizer_config.json holds `template` as its chat_template."""
    folder = c.fresh("tok")
    folder.mkdir()
    train_bpe_tokenizer(["user assistant Hi? Hello. Say hi."] * 30, 300, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return str(folder)


def _text_stream(c: Ctx, path: Path) -> None:
    """Reads the whole stream: a cut file is found at its end, not at the first batch."""
    cfg = DataConfig(dataset_path=str(path), max_seq_len=16)
    for _ in StreamingTextDataModule(cfg, batch_size=64, loop=False).train_dataloader():
        pass


# --- the table: (id, feed, expected type or Exit, what the one line must name) -------------------------------
# The names are formatted with root= and ds=; a tuple names several things (a key and its value), all required.

# Rows whose message does not say what the row expects today (src/ is not this file's to fix): strict, so a fix
# turns them into failures that ask for the mark to go.
GAPS = {
}

Named = str | tuple[str, ...]
CASES: list[tuple[str, Callable[[Ctx], Any], type[BaseException] | Exit, Named]] = [
    # optimize
    ("optimize-missing-input", lambda c: optimize_text([str(c.root / "nope.jsonl")], c.fresh("o1"), progress=False),
     InputError, "{root}/nope.jsonl"),
    ("optimize-glob-matches-nothing", lambda c: optimize_text([str(c.root / "*.nothing")], c.fresh("o2"),
                                                              progress=False), InputError, "{root}/*.nothing"),
    ("optimize-output-is-a-file", lambda c: optimize(str, [1, 2], c.root / "afile", num_workers=0), ValueError,
     "output {root}/afile"),
    ("optimize-bad-chunk-bytes", lambda c: optimize(str, [1, 2], c.fresh("o3"), chunk_bytes="12 parsecs", num_workers=0),
     ValueError, "chunk size '12 parsecs'"),
    ("optimize-unpicklable-item", lambda c: optimize(_lock, range(3), c.fresh("o4"), num_workers=0), UnpicklableItem,
     "input 0 (0): field 'k'"),
    ("optimize-fn-raises", lambda c: optimize(_fn_raises, range(3), c.fresh("o5"), num_workers=0), OptimizeError,
     "input 0 (0) failed: ZeroDivisionError"),
    ("optimize-structure-changes", lambda c: optimize(_changing, range(6), c.fresh("o6"), num_workers=0),
     StructureError, "input 3 (3): field 'label' is str"),
    ("optimize-fn-not-callable", lambda c: optimize(None, [1], c.fresh("o8"), num_workers=0), TypeError, "fn"),
    ("optimize-mode-typo", lambda c: optimize(str, [1], c.fresh("o9"), mode="apend"), ValueError,
     ("mode", "'apend'")),
    ("optimize-unknown-compression", lambda c: optimize(str, [1], c.fresh("o10"), compression="zip"), ValueError,
     "compression 'zip'"),
    # llm-data dedup (corpus dedup before tokenizing)
    ("dedup-malformed-record", _dedup_bad_record, InputError, "{root}/bad-record.jsonl:2: invalid JSON"),
    ("dedup-output-not-empty", _dedup_not_empty, ValueError, ("{root}/fresh/dd2 is not empty", "notes.txt", "--overwrite")),
    ("dedup-output-locked", _dedup_locked, LockHeld, ("{root}/fresh/dd3 is being written by a dedup run", "pid")),
    ("dedup-threshold-above-1", lambda c: data_main(["dedup", "text.txt", "--output", "dd4", "--near", "1.5"]),
     Exit("llm-data"), "--near takes a Jaccard similarity threshold in (0, 1] (e.g. --near 0.8), got '1.5'"),
    ("dedup-threshold-not-a-number", lambda c: data_main(["dedup", "text.txt", "--output", "dd6", "--near", "-inf"]),
     Exit("llm-data"), "--near takes a Jaccard similarity threshold in (0, 1] (e.g. --near 0.8), got '-inf'"),
    ("dedup-threshold-0", lambda c: dedup_corpus("text.txt", c.fresh("dd5"), near=0), ValueError, "(0, 1], got 0"),
    ("optimize-dedup-typo", lambda c: data_main(["optimize", "text.txt", "--output", "o11", "--dedup", "near:0.8"]),
     Exit("llm-data"), "--dedup takes 'exact' or 'near=THRESHOLD' (e.g. near=0.8), got 'near:0.8'"),
    ("llm-data-optimize-missing-input", lambda c: data_main(["optimize", "nope.jsonl", "--output", "o7"]),
     Exit("llm-data"), "nope.jsonl"),
    # StreamingDataset, CombinedStreamingDataset
    ("dataset-missing-folder", lambda c: StreamingDataset(c.root / "nope"), ManifestError, "{root}/nope"),
    ("dataset-no-index-json", lambda c: StreamingDataset(c.root / "empty"), ManifestError, "{root}/empty: no index.json"),
    ("dataset-wrong-item-loader", lambda c: StreamingDataset(c.ds, item_loader=ItemsLoader()), ValueError,
     "{ds} holds tokens, but item_loader is ItemsLoader"),
    ("dataset-item-loader-a-string", lambda c: StreamingDataset(c.ds, item_loader="tokens"), TypeError,
     ("item_loader", "'tokens'")),
    ("dataset-block-size-0", lambda c: StreamingDataset(c.ds, item_loader=TokensLoader(block_size=0)), ValueError,
     ("block_size", "got 0")),
    ("dataset-unknown-shuffle-algorithm", lambda c: list(_loader(c, dataset=c.dataset(
        shuffle=True, shuffle_algorithm="fisher"))), ValueError, ("'fisher'", "feistel")),
    ("dataset-bad-shuffle-window", lambda c: c.dataset(shuffle=True, shuffle_window=-3), ValueError, ("shuffle_window", "got -3")),
    ("dataset-subsample-zero", lambda c: c.dataset(subsample=0), ValueError, ("subsample", "got 0")),
    ("dataset-subsample-nan", lambda c: c.dataset(subsample=float("nan")), ValueError, ("subsample", "got nan")),
    ("split-fractions-over-1", lambda c: train_test_split(c.dataset(), [0.5, 0.7]), ValueError,
     "got [0.5, 0.7] (sum 1.2)"),
    ("combined-string-dataset", lambda c: CombinedStreamingDataset([str(c.ds)]), TypeError, "datasets[0] is a str"),
    ("combined-weights-nan", lambda c: _combined(c, [float("nan"), 1.0]), ValueError, "weights[0] (datasets[0], ds) is nan; expected a finite number >= 0"),
    ("combined-weights-inf", lambda c: _combined(c, [1.0, float("inf")]), ValueError, "weights[1] (datasets[1], ds#1) is inf"),
    ("combined-weights-negative", lambda c: _combined(c, [1.5, -0.5]), ValueError, "weights[1] (datasets[1], ds#1) is -0.5"),
    ("combined-weights-wrong-length", lambda c: _combined(c, [1.0]), ValueError, "weights has 1 weight but there are 2 datasets; give one weight per dataset"),
    ("combined-weights-a-string", lambda c: _combined(c, "0.5"), ValueError, "weights is '0.5'; give a list of 2 numbers >= 0, one per dataset"),
    ("combined-weights-all-zero", lambda c: _combined(c, [0.0, 0.0]), ValueError, "weights are all zero ([0.0, 0.0])"),
    ("manifest-dtype-list", _edited_manifest, ManifestError, "{root}/fresh/edited/index.json: key 'dtype' is []"),
    ("llm-data-verify-missing-folder", lambda c: data_main(["verify", "nope"]), Exit("llm-data"), "nope"),
    ("llm-data-info-of-a-file", lambda c: data_main(["info", "afile"]), Exit("llm-data"), "afile is a file"),
    # StreamingDataLoader
    ("loader-batch-size-0", lambda c: _loader(c, batch_size=0), ValueError, "batch_size must be a positive integer, got 0"),
    ("loader-num-workers-minus-1", lambda c: _loader(c, num_workers=-1), ValueError, "num_workers must be an integer >= 0, got -1"),
    ("loader-state-of-another-dataset", _state_of_other, StateError, "does not match {ds}: fingerprint"),
    ("loader-state-key-missing", lambda c: _state_edited(c, epoch=None), StateError, "no key 'epoch'"),
    ("loader-state-key-bad-value", lambda c: _state_edited(c, samples_consumed="x"), StateError,
     "key 'samples_consumed' is 'x'"),
    ("loader-state-not-a-dict", lambda c: _loader(c).load_state_dict([1]), StateError, "loader state is a list"),
    ("loader-state-unknown-key", lambda c: _state_edited(c, bogus=1), StateError, "'bogus'"),
    ("loader-watchdog-negative", lambda c: _loader(c, watchdog_s=-1), ValueError,
     "watchdog_s must be a number of seconds >= 0 (0 turns the watchdog off), got -1"),
    ("loader-watchdog-unknown-action", lambda c: _loader(c, watchdog="loud"), ValueError,
     "watchdog must be 'log' or 'raise', got 'loud'"),
    ("loader-metrics-port-in-use", _metrics_port_in_use, MetricsPortError,
     ("metrics_port ", " is in use on 127.0.0.1 (something already listens there); pick another port")),
    # map
    ("map-fn-not-callable", lambda c: map_items("upper", [1], c.fresh("m1"), progress=False), TypeError,
     "fn must be callable as fn(input, folder), got str"),
    ("map-output-is-a-file", lambda c: map_items(lambda x, out: None, [1], c.root / "afile", progress=False),
     ValueError, "output {root}/afile"),
    # on-the-fly text
    ("text-config-unknown-key", lambda c: load_config(_text_yaml(c, "t1.yaml", datset_split="train")), ConfigError,
     "{root}/t1.yaml: unknown data key 'datset_split'"),
    ("text-weights-nan", lambda c: load_config(_yaml(c, "t2.yaml", {"data": {
        "datasets": [{"dataset_path": "a.txt"}, {"dataset_path": "b.txt"}],
        "streaming_mixing_weights": [float("nan"), 1.0]}})), ConfigError,
     "{root}/t2.yaml: streaming_mixing_weights[0] (datasets[0]) is nan"),
    ("text-watchdog-negative", lambda c: load_config(_text_yaml(c, "tw.yaml", watchdog_s=-1)), ConfigError,
     "{root}/tw.yaml: data.watchdog_s = -1 is invalid (Input should be greater than or equal to 0)"),
    ("text-unknown-packing-mode", lambda c: load_config(_text_yaml(c, "t3.yaml", packing="bestfit")), ConfigError,
     "{root}/t3.yaml: data: packing 'bestfit' is not a packing mode"),
    ("train-skip-range-reversed", lambda c: train_main(["--task", "stream_lm", "--config-path", _text_yaml(
        c, "t4.yaml", steps_per_epoch=2, skip_batches=[[5, 3]])]), Exit("llm-train"),
     "data.skip_batches[0] [5, 3] is reversed"),
    ("train-skip-range-empty", lambda c: train_main(["--task", "stream_lm", "--config-path", _text_yaml(
        c, "t5.yaml", steps_per_epoch=2, skip_batches=[[0, 1], [7, 7]])]), Exit("llm-train"),
     "data.skip_batches[1] [7, 7] is empty"),
    ("text-schedule-wrong-length", lambda c: _text_mix(c, "s1.yaml", streaming_mixing_schedule=_schedule(
        (0, [1.0]))), ConfigError, "{root}/s1.yaml: streaming_mixing_schedule[0].weights has 1 weight but there are 2 datasets"),
    ("text-schedule-nan", lambda c: _text_mix(c, "s2.yaml", streaming_mixing_schedule=_schedule(
        (0, [0.5, 0.5]), (9, [float("nan"), 1.0]))), ConfigError,
     "streaming_mixing_schedule[1].weights[0] (datasets[0]) is nan; expected a finite number >= 0"),
    ("text-schedule-inf", lambda c: _text_mix(c, "s3.yaml", streaming_mixing_schedule=_schedule(
        (0, [float("inf"), 1.0]))), ConfigError, "streaming_mixing_schedule[0].weights[0] (datasets[0]) is inf"),
    ("text-schedule-negative", lambda c: _text_mix(c, "s4.yaml", streaming_mixing_schedule=_schedule(
        (0, [1.5, -0.5]))), ConfigError, "streaming_mixing_schedule[0].weights[1] (datasets[1]) is -0.5"),
    ("text-schedule-steps-out-of-order", lambda c: _text_mix(c, "s5.yaml", streaming_mixing_schedule=_schedule(
        (0, [0.5, 0.5]), (500, [0.2, 0.8]), (100, [0.9, 0.1]))), ConfigError,
     "streaming_mixing_schedule[2].step is 100 but streaming_mixing_schedule[1] is at step 500"),
    ("text-mixing-unit-unknown", lambda c: _text_mix(c, "s6.yaml", streaming_mixing_weights=[0.5, 0.5],
                                                     streaming_mixing_unit="bytes"), ConfigError,
     "streaming_mixing_unit 'bytes' is not known"),
    ("combined-schedule-wrong-length", lambda c: _combined(c, None, schedule=_schedule((0, [1.0, 1.0, 1.0]))),
     ValueError, "schedule[0].weights has 3 weights but there are 2 datasets"),
    ("combined-schedule-nan", lambda c: _combined(c, None, schedule=_schedule((0, [1.0, float("nan")]))),
     ValueError, "schedule[0].weights[1] (datasets[1]) is nan"),
    ("combined-schedule-steps-out-of-order", lambda c: _combined(c, None, schedule=_schedule(
        (0, [1, 1]), (10, [1, 2]), (10, [2, 1]))), ValueError, "schedule[2].step is 10 but schedule[1] is at step 10"),
    ("combined-unit-unknown", lambda c: _combined(c, None, unit="bytes"), ValueError, "unit='bytes' is not known"),
    ("combined-schedule-point-two-keys", lambda c: _combined(c, None, schedule=[
        {"step": 0, "samples": 0, "weights": [1, 1]}]), ValueError,
     "schedule[0] gives step and samples; a point gives exactly one of step, samples and tokens"),
    ("combined-schedule-two-kinds", lambda c: _combined(c, None, schedule=[
        {"step": 0, "weights": [1, 1]}, {"tokens": 70, "weights": [1, 2]}]), ValueError,
     "schedule[1] is by tokens but schedule[0] is by step"),
    ("combined-schedule-bool-position", lambda c: _combined(c, None, schedule=[
        {"samples": 0, "weights": [1, 1]}, {"samples": True, "weights": [1, 2]}]), ValueError,
     "schedule[1].samples is True; expected a whole number of samples >= 0"),
    ("combined-state-v1-without-batch", _mixture_v1_without_batch, StateError,
     "loader state key 'mixture' (version 1) records no global batch"),
    ("combined-sources-changed", _mixture_other_sources, StateError,
     "allow_source_changes=True"),
    ("text-missing-local-file", lambda c: _text_stream(c, c.root / "nope.txt"), InputError, "{root}/nope.txt"),
    ("text-cut-gz", lambda c: _text_stream(c, c.root / "cut.jsonl.gz"), InputError,
     "{root}/cut.jsonl.gz: truncated or corrupt gzip stream"),
    # SFT
    ("sft-record-missing-field", lambda c: _sft(c, DatasetEntry(path=str(c.root / "sft.jsonl"), type="alpaca")),
     InputError, "{root}/sft.jsonl line 2 does not fit type alpaca: record field 'output' is missing"),
    ("sft-bad-jinja-in-tokenizer-config", lambda c: _sft(
        c, DatasetEntry(path=str(c.root / "chat.jsonl"), type="chat"), tokenizer_type="hf",
        tokenizer_path=_tokenizer_with_template(c, BROKEN_JINJA)), ChatTemplateError,
     "the chat template of {root}/fresh/tok/tokenizer_config.json has a Jinja syntax error at line 1"),
    ("sft-bad-jinja-in-a-datasets-entry", lambda c: _sft(
        c, DatasetEntry(path=str(c.root / "chat.jsonl"), type="chat_template", chat_template=BROKEN_JINJA)),
     ChatTemplateError, "datasets[0]"),
    # llm-train
    ("train-config-path-is-a-folder", lambda c: train_main(["--task", "lm", "--config-path", "empty"]),
     Exit("llm-train"), "--config-path empty is a folder"),
    ("train-unknown-axolotl-key", lambda c: train_main(["--task", "sft", "--config-path", _axolotl(
        c, "ax1.yaml", learning_rat=1e-3)]), Exit("llm-train"), "{root}/ax1.yaml: unknown key 'learning_rat'"),
    ("train-typo-in-datasets-entry", lambda c: train_main(["--task", "sft", "--config-path", _axolotl(
        c, "ax2.yaml", {"field_instructoin": "q"})]), Exit("llm-train"),
     "{root}/ax2.yaml: unknown key 'data.datasets[0].field_instructoin'"),
    # storage, cache, generation
    ("s3-malformed-endpoint", _malformed_endpoint, ValueError, "AWS_ENDPOINT_URL is 'http://127.0.0.1:8333 x'"),
    ("cache-clear-non-cache-folder", lambda c: data_main(["cache", "clear", "notes", "--cache-dir", "cache"]),
     Exit("llm-data"), "cache/notes is not a shard cache"),
    ("generate-missing-checkpoint", lambda c: generate_main(["--checkpoint", "no-such-run"]), Exit("llm-generate"),
     "checkpoint no-such-run does not exist"),
    ("generate-folder-without-checkpoint", lambda c: generate_main(["--checkpoint", "empty"]), Exit("llm-generate"),
     ("empty", "--checkpoint")),
    # merge_datasets, encryption, val_set_size
    ("merge-different-kinds", _merge_kinds, ValueError, ("cannot merge {ds} and {root}/fresh/items", "kind differs")),
    ("encrypted-read-without-key", lambda c: _encrypted(c, None), EncryptionError,
     "{root}/fresh/secret is encrypted (llm.data.FernetEncryption); pass encryption="),
    ("encrypted-read-with-wrong-key", lambda c: _encrypted(c, "two"), ShardError,
     ("{root}/fresh/secret/shard-", "does not decrypt with the fernet key given")),
    ("train-val-set-size-holds-out-everything", lambda c: train_main(["--task", "sft", "--config-path", _axolotl(
        c, "ax3.yaml", streaming=False, val_set_size=2)]), Exit("llm-train"),
     "val_set_size=2 holds out 2 of the 2 records of datasets {root}/sft.jsonl"),
]


def _row(case: tuple) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=GAPS[case[0]])] if case[0] in GAPS else []
    return pytest.param(*case, id=case[0], marks=marks)


@pytest.mark.parametrize("case, feed, expected, named", [_row(c) for c in CASES])
def test_a_bad_input_is_one_sentence_naming_it(ctx: Ctx, capsys: pytest.CaptureFixture[str], case: str,
                                                feed: Callable[[Ctx], Any], expected: type | Exit, named: Named) -> None:
    names = [n.format(root=ctx.root, ds=ctx.ds) for n in ((named,) if isinstance(named, str) else named)]
    if isinstance(expected, Exit):
        try:
            code = feed(ctx)
        except SystemExit as exit:  # argparse's own refusals
            code = exit.code
        err = capsys.readouterr().err
        assert code == expected.code, err
        assert err.count("\n") == 1 and err.endswith("\n"), err
        assert err.startswith(f"{expected.tool}: ") and all(n in err for n in names), err
        return
    with pytest.raises(BaseException) as info:
        feed(ctx)
    message = str(info.value)
    assert isinstance(info.value, expected), f"{type(info.value).__name__}: {message}"
    assert "\n" not in message and all(n in message for n in names), message
