"""An error in a DataLoader worker (process or reader thread, shards or text) reaches the caller as itself:
the same class, its one sentence as the message, the worker's traceback only as the cause."""

from __future__ import annotations

import gzip
import importlib
import json
import multiprocessing
import pickle
import pkgutil
from pathlib import Path

import numpy as np
import pytest

import llm
from llm.data import FernetEncryption, StreamingDataLoader, StreamingDataset, TokensLoader, optimize
from llm.data.inputs.errors import InputError
from llm.data.shards.format.pread import DatasetChanged, ShardError
from llm.data.worker_errors import WorkerTraceback, send

BACKENDS = ["threads", "processes"]


def _doc(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 60_000, size=40 + 7 * i)


def _item(i: int) -> dict:
    return {"x": i, "y": np.arange(i % 5)}


def _drain(loader: StreamingDataLoader) -> None:
    for _ in loader:
        pass


def _is_the_sentence(error: BaseException, start: str) -> None:
    """The error as raised in the worker: its sentence alone, the worker's traceback kept as the cause
    (reader threads raise the worker's exception object itself, with its own traceback)."""
    text = str(error)
    assert text.startswith(start) and "\n" not in text and "Caught" not in text, text
    if isinstance(error.__cause__, WorkerTraceback):
        assert "Traceback (most recent call last)" in str(error.__cause__)


@pytest.fixture(scope="module")
def fernet() -> FernetEncryption:
    return FernetEncryption("correct horse battery staple")  # one key derivation per module


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrong_password_is_the_shard_sentence(tmp_path: Path, fernet: FernetEncryption, backend: str) -> None:
    optimize(_doc, list(range(60)), str(tmp_path / "secret"), item_loader=TokensLoader(), chunk_bytes="4KB",
             num_workers=0, progress=False, encryption=fernet)
    ds = StreamingDataset(str(tmp_path / "secret"), item_loader=TokensLoader(block_size=32),
                          encryption=FernetEncryption("tr0ub4dor&3"))
    with pytest.raises(ShardError) as info:
        _drain(StreamingDataLoader(ds, batch_size=4, num_workers=2, worker_backend=backend))
    assert type(info.value) is ShardError
    _is_the_sentence(info.value, f"shard {tmp_path / 'secret'}/shard-")
    assert "does not decrypt with the fernet key given" in str(info.value)


@pytest.mark.parametrize("kind", ["tokens", "items"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_corrupt_shard_is_the_shard_sentence(tmp_path: Path, kind: str, backend: str) -> None:
    out = tmp_path / "ds"
    if kind == "tokens":
        optimize(_doc, list(range(60)), str(out), item_loader=TokensLoader(), chunk_bytes="4KB", num_workers=0, progress=False)
        ds = StreamingDataset(str(out), item_loader=TokensLoader(block_size=32))
    else:
        optimize(_item, list(range(200)), str(out), num_workers=0, chunk_size=20, progress=False)
        ds = StreamingDataset(str(out))
    shard = sorted(out.glob("shard-*.bin"))[2]
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF  # same size, other bytes: only the checksum can tell
    shard.write_bytes(bytes(data))
    loader = StreamingDataLoader(ds, batch_size=4, num_workers=2, worker_backend=backend,
                                 collate_fn=list if kind == "items" else None)
    with pytest.raises(ShardError) as info:
        _drain(loader)
    assert type(info.value) is ShardError
    _is_the_sentence(info.value, f"shard {shard}")


def test_a_dataset_changed_under_worker_processes_is_the_sentence(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    optimize(_item, list(range(2000)), out, num_workers=0, chunk_size=20, progress=False)
    # in order, so that the workers' read-ahead has not opened every shard yet
    loader = StreamingDataLoader(StreamingDataset(out), batch_size=4, num_workers=2, collate_fn=list)
    assert loader.worker_backend == "processes"
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    optimize(_item, list(range(2000)), out, num_workers=0, chunk_size=20, progress=False, mode="overwrite")
    with pytest.raises(DatasetChanged) as info:
        for _ in batches:
            pass
    assert type(info.value) is DatasetChanged and isinstance(info.value.__cause__, WorkerTraceback)
    _is_the_sentence(info.value, f"dataset {out} changed under this reader (shard shard-")


def test_a_user_error_in_a_worker_process_keeps_its_class_and_message(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    optimize(_item, list(range(100)), out, num_workers=0, chunk_size=20, progress=False)

    def refuse(batch: list) -> list:
        if any(item["x"] == 50 for item in batch):
            raise KeyError("no 50 here")
        return batch

    loader = StreamingDataLoader(StreamingDataset(out), batch_size=4, num_workers=2, collate_fn=refuse)
    with pytest.raises(KeyError) as info:
        _drain(loader)
    assert info.value.args == ("no 50 here",) and isinstance(info.value.__cause__, WorkerTraceback)
    assert "refuse" in str(info.value.__cause__)  # where it happened, for whoever debugs


def _text_workers() -> None:
    multiprocessing.set_start_method("fork", force=True)  # the suite's default may be another one


def test_a_text_stream_worker_error_is_the_sentence(tmp_path: Path) -> None:
    from llm.data.text.stream import StreamingTextDataModule
    from llm.training.core.config import DataConfig

    _text_workers()
    raw = gzip.compress("".join(json.dumps({"text": f"record {i} " + "word " * (i % 7)}) + "\n"
                                for i in range(3000)).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(raw[: len(raw) // 2])
    module = StreamingTextDataModule(DataConfig(dataset_path=str(path), max_seq_len=16, num_workers=2,
                                                 steps_per_epoch=10**6), 2)
    with pytest.raises(InputError) as info:
        list(module.train_dataloader())
    assert type(info.value) is InputError and isinstance(info.value.__cause__, WorkerTraceback)
    _is_the_sentence(info.value, f"{path}: truncated or corrupt")


def test_an_sft_worker_error_keeps_its_class(tmp_path: Path) -> None:
    from llm.data.sft.prompts import ChatTemplateError
    from llm.data.sft.stream import StreamingSFTDataModule
    from llm.data.tokenize.tokenizers import train_bpe_tokenizer
    from llm.training.core.data_config import DataConfig, DatasetEntry

    _text_workers()
    turns = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}\n{% endfor %}"
    folder = tmp_path / "tok"
    folder.mkdir()
    train_bpe_tokenizer([turns, "user assistant Hi? Hello."] * 30, 300, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages.append(1) }}" + turns}))
    data = tmp_path / "chat.jsonl"
    record = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}
    data.write_text(json.dumps(record) + "\n")
    cfg = DataConfig(datasets=[DatasetEntry(path=str(data), type="chat")], max_seq_len=256, tokenizer_type="hf",
                     tokenizer_path=str(folder), num_workers=2)
    with pytest.raises(ChatTemplateError) as info:  # was a plain InputError: the class was lost on the way
        list(StreamingSFTDataModule(cfg, batch_size=2, loop=False).train_dataloader())
    assert type(info.value) is ChatTemplateError and isinstance(info.value.__cause__, WorkerTraceback)
    _is_the_sentence(info.value, f"the chat template of {folder / 'tokenizer_config.json'} did something the sandbox forbids")


# ---- every error class of ours crosses a process boundary as itself ------------------------------

def _our_error_classes() -> list[type[BaseException]]:
    for module in pkgutil.walk_packages(llm.__path__, "llm."):
        try:
            importlib.import_module(module.name)
        except ImportError:  # an optional dependency (ray, ...) that is not installed
            continue
    found, todo = set(), [BaseException]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("llm."):
                found.add(sub)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


# classes whose constructor takes more than the sentence: the arguments they are made with
SPECIAL = {
    "BatchRecordError": (3, "chat", "record field 'messages' is missing"),
    "KeysError": ("config.yaml: unknown key 'x'", {"data": {}}),
    "HubUnreachable": ("allenai/c4", "HF_HUB_OFFLINE is set", "dedup_local"),
}


def test_every_error_class_of_ours_pickles_with_its_message_and_attributes() -> None:
    classes = _our_error_classes()
    names = {c.__name__ for c in classes}
    assert {"ShardError", "DatasetChanged", "StateError", "InputError", "EncryptionError", "OptimizeError",
            "ConfigError", "StorageError", "ManifestError", "BatchRecordError"} <= names, names
    for cls in classes:
        if not issubclass(cls, Exception):
            continue  # SystemExit and warnings are not sent from workers
        error = cls(*SPECIAL.get(cls.__name__, ("a sentence naming the file, what was expected and how to fix it",)))
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is cls and str(back) == str(error), cls
        assert vars(back) == vars(error), cls
        assert send(error, "a test") is not None, cls
