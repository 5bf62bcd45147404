"""merge_datasets and encrypted shards on s3://: the same results as on a local folder, through the real S3 server."""

from __future__ import annotations

import numpy as np
import pytest

from llm.data import FernetEncryption, merge_datasets
from llm.data.shards.format.encryption import EncryptionError
from tests.storage.helpers import docs, stream_tokens, write


def test_merge_local_and_s3_datasets_into_s3(s3_env, tmp_path):
    a, b = str(tmp_path / "a"), s3_env.url()
    write(a, docs(60, seed=1))
    write(b, docs(50, seed=2))
    merged = s3_env.url()
    manifest = merge_datasets([a, b], merged)
    assert np.array_equal(stream_tokens(merged), np.concatenate([stream_tokens(a), stream_tokens(b)]))
    local = tmp_path / "from-s3"
    again = merge_datasets([b, merged], str(local))  # and out of s3:// into a folder
    assert np.array_equal(stream_tokens(str(local)), np.concatenate([stream_tokens(b), stream_tokens(merged)]))
    assert [s.checksum for s in again.shards[-len(manifest.shards):]] == [s.checksum for s in manifest.shards]


def test_encrypted_shards_on_s3(s3_env, tmp_path):
    fernet = FernetEncryption("s3 password")
    plain, secret = s3_env.url(), s3_env.url()
    write(plain, docs(40, seed=3))
    write(secret, docs(40, seed=3), encryption=fernet)
    assert np.array_equal(stream_tokens(secret, encryption=fernet), stream_tokens(plain))
    with pytest.raises(EncryptionError, match=rf"^{secret} is encrypted \(llm.data.FernetEncryption\); pass encryption="):
        stream_tokens(secret)
