"""The one append check (issue 34): `optimize` and `merge_datasets` refuse, in one sentence naming the field and
both values, a run whose shards the dataset cannot hold, and the dataset keeps every byte and still reads."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from llm.data import (
    Encryption,
    FernetEncryption,
    StreamingDataset,
    TokensLoader,
    merge_datasets,
    optimize,
)
from llm.data.shards.format.encryption import EncryptionError
from llm.data.storage.lock import LOCK_NAME
from llm.data.tokenize.protocol import BaseTokenizer

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def keys() -> dict[str, FernetEncryption]:
    """One key derivation each (480k PBKDF2 rounds): the dataset's key, and another password on the same salt."""
    fernet = FernetEncryption(PASSWORD)
    return {"right": fernet, "other": FernetEncryption("tr0ub4dor&3", salt=fernet.salt)}


class Tok(BaseTokenizer):
    """A tokenizer whose fingerprint, EOS id and vocabulary a test sets one at a time."""

    backend = "test"

    def __init__(self, name: str = "t", eos_id: int = 256, vocab_size: int = 257):
        self.name, self.spec, self.eos_id, self.vocab_size = name, name, eos_id, vocab_size

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids) -> str:  # noqa: ANN001 - the protocol's Iterable[int]
        return bytes(ids).decode()

    def fingerprint(self) -> dict:
        return {"type": self.name}


def tokens_of(seed: int, big: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(70_000 if big else 0, 70_100 if big else 250, size=20 + i) for i in range(12)]


# case: (the dataset's run, the appended run), each (kind, optimize keywords); "big" ids need uint32
BASE = ("tokens", {"tokenizer": Tok()})
CASES = {
    "kind": (BASE, ("items", {})),
    "tokenizer": (BASE, ("tokens", {"tokenizer": Tok("u")})),
    "no tokenizer": (BASE, ("tokens", {})),
    "dtype": (("tokens", {}), ("big", {})),
    "EOS id": (BASE, ("tokens", {"tokenizer": Tok(eos_id=255)})),
    "vocabulary size": (BASE, ("tokens", {"tokenizer": Tok(vocab_size=300)})),
    "item layout": (("items", {}), ("strings", {})),
    "plain dataset": (BASE, ("tokens", {"tokenizer": Tok(), "encryption": "right"})),
    "encrypted dataset": (("tokens", {"tokenizer": Tok(), "encryption": "right"}), BASE),
    "password": (("tokens", {"tokenizer": Tok(), "encryption": "right"}),
                 ("tokens", {"tokenizer": Tok(), "encryption": "other"})),
}
# how each refusal names the field and both values
EXPECTED = {
    "kind": "its kind is 'tokens', {whose} is 'items'",
    "tokenizer": "its tokenizer is {'type': 't'}, {whose} is {'type': 'u'}",
    "no tokenizer": "its tokenizer is {'type': 't'}, {whose} is none",
    "dtype": "its token dtype is 'uint16', {whose} is 'uint32'",
    "EOS id": "its EOS id is 256, {whose} is 255",
    "vocabulary size": "its vocabulary size is 257, {whose} is 300",
    "item layout": "its item layout has field 'x' as int, {whose} has str",
    "plain dataset": "its encryption is none (plain shards), {whose} is llm.data.FernetEncryption",
    "encrypted dataset": "its encryption is llm.data.FernetEncryption, {whose} is none (plain shards)",
    "password": "the fernet key given does not open its shards",
}


def write(out: Path | str, run: tuple[str, dict], keys: dict, seed: int = 0, **kw) -> None:
    kind, options = run
    options = {**options, **kw}
    if isinstance(options.get("encryption"), str):
        options["encryption"] = keys[options["encryption"]]
    if kind in ("tokens", "big"):
        docs = tokens_of(seed, big=kind == "big")
        optimize(lambda i: docs[i], list(range(len(docs))), out, item_loader=TokensLoader(), chunk_bytes="256B",
                 num_workers=0, progress=False, **options)
    else:
        value = (lambda i: {"x": f"s{i}"}) if kind == "strings" else (lambda i: {"x": i})
        optimize(value, list(range(seed, seed + 9)), out, chunk_size=4, num_workers=0, progress=False, **options)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every byte of a dataset folder (the lock file is the only thing a refused run may touch)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def reads(out: Path | str, run: tuple[str, dict], keys: dict) -> int:
    encryption = run[1].get("encryption")
    loader = TokensLoader(block_size=8) if run[0] in ("tokens", "big") else None
    ds = StreamingDataset(str(out), item_loader=loader, encryption=keys[encryption] if encryption else None)
    count = sum(1 for _ in (ds[i] for i in range(len(ds))))  # every sample decodes
    return ds.reader.total if loader is not None else count


def expected(case: str, out: Path | str, whose: str) -> str:
    return rf"^cannot append to {re.escape(str(out))}: " + re.escape(EXPECTED[case].replace("{whose}", whose)) + r"(;| \()"


@pytest.mark.parametrize("case", list(CASES))
def test_optimize_refuses_an_append_the_dataset_cannot_hold(tmp_path, keys, case):
    base, appended = CASES[case]
    out = tmp_path / "ds"
    write(out, base, keys)
    before, count = snapshot(out), reads(out, base, keys)
    with pytest.raises((ValueError, EncryptionError)) as info:
        write(out, appended, keys, seed=1, mode="append")
    assert re.match(expected(case, out, "this run's"), str(info.value)), str(info.value)
    assert "\n" not in str(info.value)
    assert snapshot(out) == before, "the dataset keeps every byte"
    assert reads(out, base, keys) == count


@pytest.mark.parametrize("case", list(CASES))
def test_merge_refuses_inputs_the_target_cannot_hold(tmp_path, keys, case):
    base, appended = CASES[case]
    out, a, b = tmp_path / "ds", tmp_path / "a", tmp_path / "b"
    write(out, base, keys)
    write(a, appended, keys, seed=1)
    write(b, appended, keys, seed=2)
    before, count = snapshot(out), reads(out, base, keys)
    key = appended[1].get("encryption")  # the inputs' key, as merge_datasets requires for encrypted inputs
    if case == "password":
        key = "right"  # opens the dataset; the inputs were made with another password on its salt
    with pytest.raises((ValueError, EncryptionError)) as info:
        merge_datasets([str(a), str(b)], str(out), mode="append", **({"encryption": keys[key]} if key else {}))
    message = str(info.value)
    if case == "password":
        assert message.startswith(f"merge_datasets: the fernet key given does not open the shards of {a}"), message
    else:
        assert re.match(expected(case, out, "the inputs'"), message), message
    assert "\n" not in message
    assert snapshot(out) == before, "the dataset keeps every byte"
    assert reads(out, base, keys) == count


def test_merge_with_a_key_that_does_not_open_the_target(tmp_path, keys):
    out, a, b = tmp_path / "ds", tmp_path / "a", tmp_path / "b"
    encrypted = ("tokens", {"encryption": "right"})
    write(out, encrypted, keys)
    write(a, ("tokens", {"encryption": "other"}), keys, seed=1)
    write(b, ("tokens", {"encryption": "other"}), keys, seed=2)
    before = snapshot(out)
    with pytest.raises(EncryptionError, match=rf"^cannot append to {re.escape(str(out))}: the fernet key given "
                                              "does not open its shards"):
        merge_datasets([str(a), str(b)], str(out), mode="append", encryption=keys["other"])
    with pytest.raises(EncryptionError, match=rf"merge_datasets: {re.escape(str(a))} is encrypted; pass encryption="):
        merge_datasets([str(a), str(b)], str(tmp_path / "fresh"))
    assert snapshot(out) == before and not (tmp_path / "fresh").exists()
    merge_datasets([str(a), str(b)], str(tmp_path / "fresh"), encryption=keys["other"])  # one key opens both
    assert reads(tmp_path / "fresh", ("tokens", {"encryption": "other"}), keys) > 0


def test_appends_the_dataset_can_hold_still_work(tmp_path, keys):
    out = tmp_path / "ds"
    write(out, ("big", {}), keys)  # uint32 without a tokenizer: small ids appended are written as uint32 too
    write(out, ("tokens", {}), keys, seed=1, mode="append")
    ds = StreamingDataset(str(out), item_loader=TokensLoader(block_size=8))
    assert ds.manifest.dtype == "uint32" and ds.reader.total == sum(len(d) for s in (0, 1) for d in tokens_of(s))
    secret = tmp_path / "secret"
    write(secret, ("tokens", {"encryption": "right"}), keys)
    write(secret, ("tokens", {"encryption": FernetEncryption(PASSWORD)}), keys, seed=1, mode="append")  # a new salt
    merge_datasets([str(secret), str(secret)], str(tmp_path / "twice"), encryption=keys["right"])
    assert reads(tmp_path / "twice", ("tokens", {"encryption": "right"}), keys) == 2 * reads(
        secret, ("tokens", {"encryption": "right"}), keys)


def test_an_append_of_no_items_keeps_the_item_layout(tmp_path, keys):
    out = tmp_path / "ds"
    write(out, ("items", {}), keys)
    optimize(lambda i: None, [0], out, mode="append", num_workers=0, progress=False)
    ds = StreamingDataset(str(out))
    assert [ds[i]["x"] for i in range(len(ds))] == list(range(9))


class Xor(Encryption):
    """A user's class that does not authenticate: a wrong key decrypts to bytes of the right size."""

    def __init__(self, key: int):
        self.key = key

    def encrypt(self, data: bytes) -> bytes:
        return (np.frombuffer(bytes(data), np.uint8) ^ self.key).tobytes()

    def decrypt(self, data: bytes) -> bytes:
        return self.encrypt(data)


@pytest.mark.parametrize("kind", ["tokens", "items"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_wrong_key_of_a_class_that_does_not_authenticate_is_refused(tmp_path, keys, kind, compression):
    out = tmp_path / "ds"
    write(out, (kind, {"encryption": Xor(1)}), keys, compression=compression)
    before = snapshot(out)
    with pytest.raises(EncryptionError, match=r"the Xor key given does not open its shards"):
        write(out, (kind, {"encryption": Xor(2)}), keys, seed=1, compression=compression, mode="append")
    assert snapshot(out) == before
    write(out, (kind, {"encryption": Xor(1)}), keys, seed=1, compression=compression, mode="append")
    ds = StreamingDataset(str(out), item_loader=TokensLoader(block_size=8) if kind == "tokens" else None,
                          encryption=Xor(1))
    assert len(ds) and all(ds[i] is not None for i in range(len(ds)))


def test_merge_refuses_inputs_encrypted_with_another_salt(tmp_path, keys):
    out, a, b = tmp_path / "ds", tmp_path / "a", tmp_path / "b"
    write(out, ("tokens", {"encryption": "right"}), keys)
    fresh = FernetEncryption(PASSWORD)  # the same password, another salt: another key for the copied ciphertext
    for where, seed in ((a, 1), (b, 2)):
        write(where, ("tokens", {"encryption": fresh}), keys, seed=seed)
    before = snapshot(out)
    salt = fresh.state_dict()["salt"]
    with pytest.raises(ValueError, match=rf"^cannot append to {re.escape(str(out))}: its encryption is "
                                         rf"llm.data.FernetEncryption with {{'salt': '.*'}}, the inputs' is with "
                                         rf"{{'salt': '{re.escape(salt)}'}}; "):
        merge_datasets([str(a), str(b)], str(out), mode="append", encryption=fresh)
    assert snapshot(out) == before


def test_optimize_refuses_a_tokenizer_that_is_not_one_in_one_sentence(tmp_path: Path) -> None:
    class Bare:  # an object with a fingerprint only: optimize could not record its backend
        eos_id, vocab_size = 256, 257

        def fingerprint(self) -> dict:
            return {"type": "bare"}

    with pytest.raises(TypeError, match=r"^optimize: tokenizer= must be a tokenizer of llm.data.load_tokenizer .*got Bare$"):
        optimize(lambda i: np.arange(5) + i, [0, 1], tmp_path / "ds", tokenizer=Bare())
    assert not (tmp_path / "ds" / "index.json").exists()
