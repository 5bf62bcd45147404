"""Encrypted shards: optimize(..., encryption=) writes ciphertext, readers with the key get the same data, others one sentence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from llm.cli.data import main as data_main
from llm.data import Encryption, FernetEncryption, StreamingDataset, TokensLoader, optimize
from llm.data.shards.format.encryption import EncryptionError
from llm.data.shards.format.pread import ShardError
from llm.data.shards.format.reader import verify_dataset
from tests.data.shards.helpers import run_loader
from tests.resume import check_resume

DOCS = [np.random.default_rng(i).integers(0, 60_000, size=40 + 7 * i) for i in range(60)]


@pytest.fixture(scope="module")
def fernet() -> FernetEncryption:
    return FernetEncryption("correct horse battery staple")  # one key derivation (480k PBKDF2 rounds) per module


def write(out: Path, encryption: Encryption | None = None, docs: int = len(DOCS), **kw) -> Path:
    optimize(lambda i: DOCS[i], list(range(docs)), str(out), item_loader=TokensLoader(), chunk_bytes=kw.pop("chunk_bytes", "4KB"),
             num_workers=kw.pop("workers", 0), progress=False, encryption=encryption, **kw)
    return out


def blocks(path: Path, **kw) -> np.ndarray:
    ds = StreamingDataset(str(path), item_loader=TokensLoader(block_size=32), **kw)
    return np.stack([ds[i].numpy() for i in range(len(ds))])


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_encrypted_shards_read_back_as_the_plain_ones(tmp_path, fernet, compression):
    plain = write(tmp_path / "plain", compression=compression)
    secret = write(tmp_path / "secret", fernet, compression=compression, workers=2)
    assert np.array_equal(blocks(secret, encryption=fernet), blocks(plain))
    index = json.loads((secret / "index.json").read_text())
    assert index["encryption"]["class"] == "llm.data.FernetEncryption" and index["encryption"]["level"] == "chunk"
    assert "correct horse" not in (secret / "index.json").read_text()  # a salt, never the password or key
    needle = DOCS[0][:8].astype("<u2").tobytes()  # the first document's tokens as stored in a plain shard
    stored = b"".join((secret / s["file"]).read_bytes() for s in index["shards"])
    assert needle in (plain / json.loads((plain / "index.json").read_text())["shards"][0]["file"]).read_bytes() or compression
    assert needle not in stored and len(index["shards"]) > 3


def test_a_reader_without_the_key_or_with_a_wrong_one_gets_one_sentence(tmp_path, fernet):
    secret = write(tmp_path / "secret", fernet)
    with pytest.raises(EncryptionError, match=r"secret is encrypted \(llm.data.FernetEncryption\); pass encryption="):
        StreamingDataset(str(secret), item_loader=TokensLoader(block_size=32))
    wrong = FernetEncryption("tr0ub4dor&3")
    with pytest.raises(ShardError, match=r"shard .*secret/shard-.*\.bin does not decrypt with the fernet key given"):
        blocks(secret, encryption=wrong)

    class Other(Encryption):
        def encrypt(self, data: bytes) -> bytes:
            return data

        def decrypt(self, data: bytes) -> bytes:
            return data

    with pytest.raises(EncryptionError, match="was encrypted with llm.data.FernetEncryption, not .*Other"):
        blocks(secret, encryption=Other())
    with pytest.raises(EncryptionError, match="plain is not encrypted; drop encryption="):
        blocks(write(tmp_path / "plain"), encryption=fernet)


def test_the_key_comes_back_from_the_password_and_the_saved_or_recorded_salt(tmp_path, fernet):
    secret = write(tmp_path / "secret", fernet)
    fernet.save(tmp_path / "fernet.pem")
    assert "correct horse" not in (tmp_path / "fernet.pem").read_text()
    loaded = FernetEncryption.load(tmp_path / "fernet.pem", password="correct horse battery staple")
    expected = blocks(secret, encryption=fernet)
    assert np.array_equal(blocks(secret, encryption=loaded), expected)
    # a fresh instance (another salt) takes the manifest's salt: the password alone reads the dataset
    assert np.array_equal(blocks(secret, encryption=FernetEncryption("correct horse battery staple")), expected)


def test_verify_checks_the_ciphertext_on_disk_without_the_key(tmp_path, fernet, capsys):
    secret = write(tmp_path / "secret", fernet)
    assert verify_dataset(secret).encryption["class"] == "llm.data.FernetEncryption"  # no key needed
    data_main(["info", str(secret)])
    data_main(["verify", str(secret)])
    out = capsys.readouterr().out
    assert "encryption   llm.data.FernetEncryption (chunk level)" in out
    assert "OK in " in out and "(encrypted: sizes and checksums of the stored bytes; no key" in out
    shard = secret / json.loads((secret / "index.json").read_text())["shards"][2]["file"]
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"shard {shard} fails its checksum"):
        verify_dataset(secret)


def test_append_takes_the_dataset_key_and_refuses_mixing(tmp_path, fernet):
    secret = write(tmp_path / "secret", fernet)
    write(secret, FernetEncryption("correct horse battery staple"), mode="append")  # another salt: the dataset's is used
    tokens = StreamingDataset(str(secret), item_loader=TokensLoader(block_size=32), encryption=fernet).reader.total
    assert tokens == 2 * sum(len(d) for d in DOCS)
    with pytest.raises(ValueError, match=r"its encryption is llm.data.FernetEncryption, this run's is none \(plain "
                                         r"shards\); pass encryption= with its key"):
        write(secret, mode="append")
    with pytest.raises(ValueError, match=r"cannot append to .*plain: its encryption is none \(plain shards\), this "
                                         "run's is llm.data.FernetEncryption"):
        write(write(tmp_path / "plain"), fernet, mode="append")


def test_sample_level_is_refused_in_one_sentence(tmp_path):
    class PerSample(Encryption):
        level = "sample"

        def encrypt(self, data: bytes) -> bytes:
            return data

        def decrypt(self, data: bytes) -> bytes:
            return data

    with pytest.raises(ValueError, match=r"level 'sample' is not supported: llm.data encrypts whole shards"):
        write(tmp_path / "x", PerSample())
    assert not (tmp_path / "x").exists()


def test_resume_of_an_encrypted_dataset_is_exact(tmp_path, fernet):
    secret = write(tmp_path / "secret", fernet, docs=20, chunk_bytes="1KB")
    config = {"path": str(secret), "block": 64, "batch": 4, "epochs": 2, "encryption": fernet}
    check_resume(run_loader, config, stops=[3, 11],  # mid-epoch 1, into epoch 2
                 resume_configs=[{**config, "workers": 2, "backend": "processes"}],
                 verify=False)  # the audit cannot open an encrypted dataset (it takes no key): counts only


@pytest.mark.parametrize("salt", ["!!", "not$base64", "", "c2hvcnQ=", 7])
def test_a_damaged_salt_in_the_manifest_is_one_sentence_naming_the_field(tmp_path, fernet, salt):
    secret = write(tmp_path / "secret", fernet, docs=4)
    index = json.loads((secret / "index.json").read_text())
    index["encryption"]["salt"] = salt  # not in the fingerprint: the manifest still loads
    (secret / "index.json").write_text(json.dumps(index))
    with pytest.raises(EncryptionError, match=rf"^{secret}: the manifest's key 'encryption.salt' is {re.escape(repr(salt))}, not a salt: "
                                              "expected 16 bytes in URL-safe base64"):
        blocks(secret, encryption=fernet)
    saved = tmp_path / "fernet.pem"
    saved.write_text(json.dumps({"algorithm": "fernet", "level": "chunk", "salt": salt}))
    with pytest.raises(EncryptionError, match=rf"fernet.pem: key 'salt' is {re.escape(repr(salt))}, not a salt"):
        FernetEncryption.load(saved, password="correct horse battery staple")


def test_a_salt_of_the_wrong_length_is_refused_when_given(fernet):
    with pytest.raises(ValueError, match=r"FernetEncryption's salt must be 16 bytes, got b'short'"):
        FernetEncryption("pw", salt=b"short")
    assert FernetEncryption("correct horse battery staple", salt=fernet.salt).salt == fernet.salt
